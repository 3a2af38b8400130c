//! What removals keep: a removed worktree's copy, restorable until it is
//! purged. The copy itself is `<state>/removed/<id>`; its row says when it was kept, how
//! large it is, and the commit kept under a ref of worktreefs's own.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::steps::event;
use super::*;
use crate::ids::WorktreeId;

/// A removed worktree whose copy is kept.
#[derive(Debug, Clone, Serialize)]
pub struct KeptRow {
    pub worktree_id: WorktreeId,
    pub repo: String,
    pub worktree: String,
    pub branch: Option<String>,
    pub base_commit: String,
    /// git's `HEAD` of the worktree when it was removed (`ref: refs/heads/…` or a commit).
    pub head: String,
    /// The commit HEAD named, kept under `tip_ref` so that `git gc` keeps it.
    pub tip: Option<String>,
    pub tip_ref: Option<String>,
    /// Disk used by the kept copy.
    pub bytes: i64,
    pub kept_at: i64,
    /// Which removal it was (the reason its move to `deleting` recorded).
    pub how: String,
}

impl KeptRow {
    /// Its name under `.control/removed`: the worktree's and its id (a name may have been
    /// removed more than once).
    pub fn entry_name(&self) -> String {
        format!("{}:{}#{}", self.repo, self.worktree, self.worktree_id)
    }
}

/// What a removal keeps, as recorded with the move to `removed`.
#[derive(Debug, Clone)]
pub struct NewKept {
    pub bytes: i64,
    pub head: String,
    pub tip: Option<String>,
    pub tip_ref: Option<String>,
    pub how: String,
}

const KEPT_SELECT: &str = "SELECT k.worktree_id, r.name, w.name, w.branch, w.base_commit, k.head,
            k.tip, k.tip_ref, k.bytes, k.kept_at, k.how
     FROM kept k JOIN worktrees w ON w.id = k.worktree_id JOIN repos r ON r.id = w.repo_id";

fn kept_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeptRow> {
    Ok(KeptRow {
        worktree_id: r.get(0)?,
        repo: r.get(1)?,
        worktree: r.get(2)?,
        branch: r.get(3)?,
        base_commit: r.get(4)?,
        head: r.get(5)?,
        tip: r.get(6)?,
        tip_ref: r.get(7)?,
        bytes: r.get(8)?,
        kept_at: r.get(9)?,
        how: r.get(10)?,
    })
}

impl Store {
    /// The worktree is gone and its copy kept: state `removed` (as [`Store::mark_removed`])
    /// and the kept row, in one transaction.
    pub fn mark_removed_kept(
        &mut self,
        worktree_id: WorktreeId,
        reason: &str,
        kept: &NewKept,
    ) -> StoreResult<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        super::cleanup::removed_in(&tx, worktree_id, reason)?;
        tx.execute(
            "INSERT INTO kept(worktree_id, kept_at, bytes, head, tip, tip_ref, how)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(worktree_id) DO UPDATE SET kept_at = excluded.kept_at,
                bytes = excluded.bytes, head = excluded.head, tip = excluded.tip,
                tip_ref = excluded.tip_ref, how = excluded.how",
            params![
                worktree_id,
                now_secs(),
                kept.bytes,
                kept.head,
                kept.tip,
                kept.tip_ref,
                kept.how
            ],
        )?;
        Ok(tx.commit()?)
    }

    /// Every kept copy, oldest first.
    pub fn kept(&self) -> StoreResult<Vec<KeptRow>> {
        let mut stmt = self
            .conn
            .prepare(&format!("{KEPT_SELECT} ORDER BY k.kept_at, k.worktree_id"))?;
        let rows = stmt.query_map([], kept_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn kept_by_id(&self, worktree_id: WorktreeId) -> StoreResult<Option<KeptRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("{KEPT_SELECT} WHERE k.worktree_id = ?1"),
                [worktree_id],
                kept_row,
            )
            .optional()?)
    }

    /// A kept copy purged (its files are gone already): its row goes, with an event that
    /// says why. False when there was none.
    pub fn drop_kept(&mut self, worktree_id: WorktreeId, reason: &str) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let n = tx.execute("DELETE FROM kept WHERE worktree_id = ?1", [worktree_id])?;
        if n == 1 {
            event(&tx, worktree_id, PURGED, None, reason)?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// The reason the newest event of `kind` of a worktree gave.
    pub fn last_event_reason(
        &self,
        worktree_id: WorktreeId,
        kind: &str,
    ) -> StoreResult<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT reason FROM events WHERE worktree_id = ?1 AND kind = ?2
                 ORDER BY id DESC LIMIT 1",
                params![worktree_id, kind],
                |r| r.get(0),
            )
            .optional()
            .map(Option::flatten)?)
    }
}

/// The event of a kept copy purged.
pub const PURGED: &str = "purged";
/// The event of a kept copy brought back (on the removed worktree's row).
pub const RESTORED: &str = "restored";

/// Inside a restore's last transaction: the kept row of `from` goes (refused,
/// `ErrorKind::NotFound`, when it is gone: purged meanwhile), with an event on it.
pub(super) fn take_kept_in(
    tx: &rusqlite::Transaction<'_>,
    from: WorktreeId,
    to: WorktreeId,
    place: &str,
) -> StoreResult<()> {
    let n = tx.execute("DELETE FROM kept WHERE worktree_id = ?1", [from])?;
    if n != 1 {
        return Err(rusqlite::Error::QueryReturnedNoRows.into());
    }
    event(
        tx,
        from,
        RESTORED,
        None,
        &format!("as {place} (worktree {to})"),
    )?;
    Ok(())
}
