//! What cleanup writes: the `deleting` mark and its removal plan, the removed state, and
//! the retained store.

use rusqlite::params;
use serde::Serialize;

use super::steps::{event, lease_count, set_state, state_of};
use super::*;
use crate::ids::WorktreeId;

/// A worktree cleanup kept because removing it would lose work (docs/contract.md, "Cleanup").
#[derive(Debug, Clone, Serialize)]
pub struct RetainedRow {
    pub worktree_id: WorktreeId,
    pub repo: String,
    pub worktree: String,
    pub path: String,
    pub branch: Option<String>,
    pub base_commit: String,
    pub reason: String,
    pub entered_at: i64,
    /// What the last session said when it released its lease (`lease release --reason`):
    /// `session <id>: <reason>`.
    pub holder_reason: Option<String>,
}

impl RetainedRow {
    /// Its name under `.control/retained`.
    pub fn entry_name(&self) -> String {
        format!("{}:{}", self.repo, self.worktree)
    }
}

/// Why a removal cannot begin.
#[derive(Debug)]
pub enum BeginError {
    /// Someone holds it: (number of leases, its state).
    Leased(usize, crate::lease::State),
    /// Its state does not allow it (deleting: someone else is at it; removed: gone).
    State(crate::lease::State),
    Db(StoreError),
}

impl From<rusqlite::Error> for BeginError {
    fn from(e: rusqlite::Error) -> Self {
        BeginError::Db(e.into())
    }
}

impl From<StoreError> for BeginError {
    fn from(e: StoreError) -> Self {
        BeginError::Db(e)
    }
}

/// The move to `removed`, inside `tx`.
pub(super) fn removed_in(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    reason: &str,
) -> StoreResult<()> {
    tx.execute("DELETE FROM retained WHERE worktree_id = ?1", [worktree_id])?;
    tx.execute("DELETE FROM leases WHERE worktree_id = ?1", [worktree_id])?;
    tx.execute("DELETE FROM turns WHERE worktree_id = ?1", [worktree_id])?;
    set_state(tx, worktree_id, crate::lease::State::Removed)?;
    tx.execute(
        "UPDATE worktrees SET removal = NULL WHERE id = ?1",
        [worktree_id],
    )?;
    Ok(event(tx, worktree_id, REMOVED, None, reason)?)
}

impl Store {
    /// Marks a worktree `deleting` for a removal someone asked for (reclaim, rmdir), in the
    /// transaction that finds it without a lease and in one of `from`. Returns the state it
    /// had, to go back to when the removal is refused.
    pub fn begin_deleting(
        &mut self,
        worktree_id: WorktreeId,
        from: &[crate::lease::State],
        reason: &str,
    ) -> Result<crate::lease::State, BeginError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let state = state_of(&tx, worktree_id)?;
        let leases = lease_count(&tx, worktree_id)?;
        if leases > 0 {
            return Err(BeginError::Leased(leases, state));
        }
        if !from.contains(&state) {
            return Err(BeginError::State(state));
        }
        set_state(&tx, worktree_id, crate::lease::State::Deleting)?;
        event(&tx, worktree_id, DELETING, None, reason)?;
        tx.commit()?;
        Ok(state)
    }

    /// A removal that was refused: the worktree goes back to the state it had.
    pub fn end_deleting(
        &mut self,
        worktree_id: WorktreeId,
        back_to: crate::lease::State,
        reason: &str,
    ) -> StoreResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if state_of(&tx, worktree_id)? == crate::lease::State::Deleting {
            set_state(&tx, worktree_id, back_to)?;
            tx.execute(
                "UPDATE worktrees SET removal = NULL WHERE id = ?1",
                [worktree_id],
            )?;
            event(&tx, worktree_id, back_to.as_str(), None, reason)?;
        }
        Ok(tx.commit()?)
    }

    /// Records that the removal of a deleting worktree has begun (what it will do), so a
    /// daemon that dies in the middle finishes it at the next mount.
    pub fn set_removal(&self, worktree_id: WorktreeId, removal: &str) -> StoreResult<()> {
        self.conn.execute(
            &format!("UPDATE worktrees SET removal = ?1 WHERE id = ?2 AND state = '{DELETING}'"),
            params![removal, worktree_id],
        )?;
        Ok(())
    }

    /// The worktree is gone: state `removed`, out of the retained store, its leases (if any
    /// were left) released. One transaction.
    pub fn mark_removed(&mut self, worktree_id: WorktreeId, reason: &str) -> StoreResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        removed_in(&tx, worktree_id, reason)?;
        Ok(tx.commit()?)
    }

    /// The worktree holds work (or its cleanup failed): state `retained` and an entry in the
    /// retained store saying why. One transaction.
    pub fn retain(&mut self, worktree_id: WorktreeId, path: &str, reason: &str) -> StoreResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        retain_in(&tx, worktree_id, path, reason)?;
        Ok(tx.commit()?)
    }

    pub fn retained(&self) -> StoreResult<Vec<RetainedRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT t.worktree_id, t.repo, w.name, t.path, t.branch, t.base_commit, t.reason,
                    t.entered_at, w.holder_reason
             FROM retained t JOIN worktrees w ON w.id = t.worktree_id
             ORDER BY t.repo, w.name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(RetainedRow {
                worktree_id: r.get(0)?,
                repo: r.get(1)?,
                worktree: r.get(2)?,
                path: r.get(3)?,
                branch: r.get(4)?,
                base_commit: r.get(5)?,
                reason: r.get(6)?,
                entered_at: r.get(7)?,
                holder_reason: r.get(8)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// Worktree `worktree_id` retained at `path` for `reason` (its entry in the retained
/// store, its state, the event), in the caller's transaction.
pub(super) fn retain_in(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
    path: &str,
    reason: &str,
) -> rusqlite::Result<()> {
    let now = now_secs();
    tx.execute(
        "INSERT INTO retained(worktree_id, path, repo, branch, base_commit, reason, entered_at)
         SELECT w.id, ?2, r.name, w.branch, w.base_commit, ?3, ?4
         FROM worktrees w JOIN repos r ON r.id = w.repo_id WHERE w.id = ?1
         ON CONFLICT(worktree_id) DO UPDATE SET reason = excluded.reason, path = excluded.path",
        params![worktree_id, path, reason, now],
    )?;
    set_state(tx, worktree_id, crate::lease::State::Retained)?;
    tx.execute(
        "UPDATE worktrees SET removal = NULL WHERE id = ?1",
        [worktree_id],
    )?;
    event(tx, worktree_id, State::Retained.as_str(), None, reason)?;
    Ok(())
}
