//! Steps inside the caller's transaction that several tables' operations share: an
//! event written, a worktree's state read and set, a lease released (the last one moves
//! the worktree to `lingering`), a session's turn ended with its lease.

use rusqlite::params;

use crate::lease::State;

use super::now_secs;
use crate::ids::WorktreeId;

pub(super) fn event(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    kind: &str,
    holder: Option<&str>,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO events(at, worktree_id, kind, holder, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![now_secs(), worktree_id, kind, holder, reason],
    )?;
    Ok(())
}

pub(super) fn state_of(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
) -> rusqlite::Result<State> {
    let s: String = tx.query_row(
        "SELECT state FROM worktrees WHERE id = ?1",
        [worktree_id],
        |r| r.get(0),
    )?;
    parse_state(s)
}

pub(super) fn lease_count(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
) -> rusqlite::Result<usize> {
    tx.query_row(
        "SELECT count(*) FROM leases WHERE worktree_id = ?1",
        [worktree_id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as usize)
}

pub(super) fn set_state(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    state: State,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE worktrees SET state = ?1, state_changed_at = ?2 WHERE id = ?3",
        params![state.as_str(), now_secs(), worktree_id],
    )?;
    Ok(())
}

/// Releases one holder's lease in the caller's transaction; the last release moves the
/// worktree to `lingering`. False when there was no such lease.
pub(super) fn release_in(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    holder: &str,
    kind: &str,
    reason: &str,
) -> rusqlite::Result<bool> {
    let removed = tx.execute(
        "DELETE FROM leases WHERE worktree_id = ?1 AND holder = ?2",
        params![worktree_id, holder],
    )? == 1;
    if removed {
        event(tx, worktree_id, kind, Some(holder), reason)?;
        let state = state_of(tx, worktree_id)?;
        let next = crate::lease::on_release(state, lease_count(tx, worktree_id)?);
        if next != state {
            set_state(tx, worktree_id, next)?;
            event(tx, worktree_id, next.as_str(), None, "last lease released")?;
        }
    }
    Ok(removed)
}

/// A state as the store spells it; one it does not know is an error, not a guess.
pub(super) fn parse_state(s: String) -> rusqlite::Result<State> {
    State::parse(&s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            12,
            rusqlite::types::Type::Text,
            format!("unknown worktree state {s:?}").into(),
        )
    })
}

/// Ends the turn of `session` on the worktree, if it has one (its lease is going), in the
/// caller's transaction.
pub(super) fn end_turn_of_session(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    holder: &str,
    reason: &str,
) -> rusqlite::Result<bool> {
    let Some(session) = holder.strip_prefix("session:") else {
        return Ok(false);
    };
    let ended = tx.execute(
        "DELETE FROM turns WHERE worktree_id = ?1 AND session = ?2",
        params![worktree_id, session],
    )? == 1;
    if ended {
        event(tx, worktree_id, "turn-ended", Some(holder), reason)?;
    }
    Ok(ended)
}
