//! Repositories and worktrees: their rows and how they are added, read and removed.

use std::path::{Path, PathBuf};

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use crate::lease::State;

use super::steps::parse_state;
use super::*;
use crate::ids::{RepoId, WorktreeId};

#[derive(Debug, Clone, Serialize)]
pub struct RepoRow {
    pub id: RepoId,
    pub name: String,
    pub path: PathBuf,
    pub gitdir: PathBuf,
    pub added_at: i64,
    /// Patterns (gitignore syntax) of what new worktrees inherit from the source checkout,
    /// besides its `.worktreeinclude` (`repo add|set --include`).
    pub include: Vec<String>,
    /// Whether `new` makes warm worktrees without `--warm`.
    pub warm_default: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorktreeRow {
    pub id: WorktreeId,
    pub repo_id: RepoId,
    pub repo: String,
    pub name: String,
    pub branch: Option<String>,
    pub branch_created: bool,
    pub base_commit: String,
    pub base_tree: String,
    pub base_mtime: i64,
    pub uid: u32,
    pub gid: u32,
    pub admin_name: String,
    pub state: State,
    pub created_at: i64,
    pub state_changed_at: i64,
    /// Set while a removal is under way: "remove", with "+branch" (the branch goes too),
    /// "+keep" (it keeps what it removes), "+discard" (`reclaim --discard`).
    pub removal: Option<String>,
    /// The warm snapshot it shows (`new --warm`), if any.
    pub warm: Option<i64>,
    /// That snapshot's manifest's file name in `<state>/warm/`.
    #[serde(skip)]
    pub warm_manifest: Option<String>,
}

pub struct NewWorktree<'a> {
    pub repo_id: RepoId,
    pub name: &'a str,
    pub branch: Option<&'a str>,
    pub branch_created: bool,
    pub base_commit: &'a str,
    pub base_tree: &'a str,
    pub base_mtime: i64,
    pub uid: u32,
    pub gid: u32,
    pub admin_name: &'a str,
    pub warm: Option<i64>,
}

pub(super) const WORKTREE_COLUMNS: &str =
    "w.id, w.repo_id, r.name, w.name, w.branch, w.branch_created, \
     w.base_commit, w.base_tree, w.base_mtime, w.uid, w.gid, w.admin_name, w.state, \
     w.created_at, w.state_changed_at, w.removal, w.warm, \
     (SELECT s.manifest FROM warm_snapshots s WHERE s.id = w.warm)";

pub(super) fn worktree_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorktreeRow> {
    Ok(WorktreeRow {
        id: row.get(0)?,
        repo_id: row.get(1)?,
        repo: row.get(2)?,
        name: row.get(3)?,
        branch: row.get(4)?,
        branch_created: row.get(5)?,
        base_commit: row.get(6)?,
        base_tree: row.get(7)?,
        base_mtime: row.get(8)?,
        uid: row.get(9)?,
        gid: row.get(10)?,
        admin_name: row.get(11)?,
        state: parse_state(row.get(12)?)?,
        created_at: row.get(13)?,
        state_changed_at: row.get(14)?,
        removal: row.get(15)?,
        warm: row.get(16)?,
        warm_manifest: row.get(17)?,
    })
}

pub(super) fn repo_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RepoRow> {
    Ok(RepoRow {
        id: row.get(0)?,
        name: row.get(1)?,
        path: PathBuf::from(row.get::<_, String>(2)?),
        gitdir: PathBuf::from(row.get::<_, String>(3)?),
        added_at: row.get(4)?,
        include: row
            .get::<_, String>(5)?
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
        warm_default: row.get(6)?,
    })
}

impl Store {
    pub fn add_repo(&self, name: &str, path: &Path, gitdir: &Path) -> StoreResult<RepoRow> {
        self.conn.execute(
            "INSERT INTO repos(name, path, gitdir, added_at) VALUES (?1, ?2, ?3, ?4)",
            params![
                name,
                path.to_string_lossy(),
                gitdir.to_string_lossy(),
                now_secs()
            ],
        )?;
        let id = RepoId(self.conn.last_insert_rowid());
        self.repo_by_id(id)?
            .ok_or(rusqlite::Error::QueryReturnedNoRows.into())
    }

    /// Unregisters a repository that has no live worktree; the rows of its removed
    /// worktrees go with it (their events stay, without names).
    pub fn remove_repo(&mut self, id: RepoId) -> StoreResult<Vec<(WorktreeId, i64)>> {
        let tx = self.conn.transaction()?;
        // The rows that go, by id and creation time (what names their files elsewhere).
        let gone: Vec<(WorktreeId, i64)> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT id, created_at FROM worktrees WHERE repo_id = ?1 AND state = '{REMOVED}'"
            ))?;
            let rows = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        tx.execute(
            &format!(
                "DELETE FROM ports WHERE worktree_id IN
                 (SELECT id FROM worktrees WHERE repo_id = ?1 AND state = '{REMOVED}')"
            ),
            [id],
        )?;
        tx.execute(
            &format!(
                "DELETE FROM setups WHERE worktree_id IN
                 (SELECT id FROM worktrees WHERE repo_id = ?1 AND state = '{REMOVED}')"
            ),
            [id],
        )?;
        tx.execute(
            &format!("DELETE FROM worktrees WHERE repo_id = ?1 AND state = '{REMOVED}'"),
            [id],
        )?;
        tx.execute("DELETE FROM repo_hooks WHERE repo_id = ?1", [id])?;
        tx.execute("DELETE FROM warm_snapshots WHERE repo_id = ?1", [id])?;
        tx.execute("DELETE FROM repos WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(gone)
    }

    /// Records that worktree `id` is on branch `branch` now (git renamed the one it had).
    pub fn set_worktree_branch(&self, id: WorktreeId, branch: &str) -> StoreResult<()> {
        self.conn.execute(
            "UPDATE worktrees SET branch = ?1 WHERE id = ?2",
            rusqlite::params![branch, id],
        )?;
        Ok(())
    }

    pub fn repos(&self) -> StoreResult<Vec<RepoRow>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, name, path, gitdir, added_at, include, warm_default FROM repos ORDER BY name")?;
        let rows = stmt.query_map([], repo_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn repo_by_name(&self, name: &str) -> StoreResult<Option<RepoRow>> {
        Ok(self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at, include, warm_default FROM repos WHERE name = ?1",
                [name],
                repo_from_row,
            )
            .optional()?)
    }

    pub fn repo_by_id(&self, id: RepoId) -> StoreResult<Option<RepoRow>> {
        Ok(self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at, include, warm_default FROM repos WHERE id = ?1",
                [id],
                repo_from_row,
            )
            .optional()?)
    }

    pub fn repo_by_gitdir(&self, gitdir: &Path) -> StoreResult<Option<RepoRow>> {
        Ok(self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at, include, warm_default FROM repos WHERE gitdir = ?1",
                [gitdir.to_string_lossy()],
                repo_from_row,
            )
            .optional()?)
    }

    /// Inserts a worktree in state `ready` and records the creation as an event, in one
    /// transaction. Fails on a duplicate (repo, name).
    pub fn insert_worktree(&mut self, w: &NewWorktree<'_>) -> StoreResult<WorktreeId> {
        self.insert_worktree_as(None, w)
    }

    /// The last step of a recorded creation: the worktree's row, with the id the creation
    /// reserved, and the creation's record gone, in one transaction; refused
    /// (`ErrorKind::NotFound`) when the record is no longer this creator's (a rollback
    /// took it over).
    pub fn finish_creation(
        &mut self,
        record: &super::CreationRow,
        w: &NewWorktree<'_>,
    ) -> StoreResult<()> {
        self.insert_worktree_as(Some(record), w).map(|_| ())
    }

    fn insert_worktree_as(
        &mut self,
        record: Option<&super::CreationRow>,
        w: &NewWorktree<'_>,
    ) -> StoreResult<WorktreeId> {
        let id = record.map(|r| r.worktree_id);
        let now = now_secs();
        let tx = self.conn.transaction()?;
        tx.execute(
            &format!(
                "INSERT INTO worktrees(id, repo_id, name, branch, branch_created, base_commit, base_tree,
                 base_mtime, uid, gid, admin_name, state, created_at, state_changed_at, warm)
             VALUES (?12, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, '{READY}', ?11, ?11, ?13)"
            ),
            params![
                w.repo_id,
                w.name,
                w.branch,
                w.branch_created,
                w.base_commit,
                w.base_tree,
                w.base_mtime,
                w.uid,
                w.gid,
                w.admin_name,
                now,
                id,
                w.warm
            ],
        )?;
        let id = WorktreeId(tx.last_insert_rowid());
        // Its snapshot still there: a prune ([`Store::prune_warm`]) is a transaction too,
        // so either it saw this worktree or this sees the snapshot gone.
        if let Some(warm) = w.warm {
            let there: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM warm_snapshots WHERE id = ?1)",
                [warm],
                |r| r.get(0),
            )?;
            if !there {
                return Err(rusqlite::Error::QueryReturnedNoRows.into());
            }
        }
        if let Some(r) = record {
            let n = tx.execute(
                "DELETE FROM creations WHERE worktree_id = ?1 AND pid = ?2 AND pid_start = ?3",
                params![r.worktree_id, r.pid, r.pid_start as i64],
            )?;
            if n != 1 {
                return Err(rusqlite::Error::QueryReturnedNoRows.into());
            }
        }
        let restored_from = record.and_then(|r| r.restored_from);
        let how = match restored_from {
            Some(from) => {
                let repo: String =
                    tx.query_row("SELECT name FROM repos WHERE id = ?1", [w.repo_id], |r| {
                        r.get(0)
                    })?;
                super::kept::take_kept_in(&tx, from, id, &format!("{repo}/{}", w.name))?;
                format!("restored from worktree {from} (base {})", w.base_commit)
            }
            None => format!("base {}", w.base_commit),
        };
        tx.execute(
            "INSERT INTO events(at, worktree_id, kind, reason) VALUES (?1, ?2, 'created', ?3)",
            params![now, id, how],
        )?;
        tx.commit()?;
        Ok(id)
    }

    pub fn worktrees(&self) -> StoreResult<Vec<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state != '{REMOVED}' ORDER BY r.name, w.name"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], worktree_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn worktree(&self, repo: &str, name: &str) -> StoreResult<Option<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE r.name = ?1 AND w.name = ?2
             ORDER BY w.state = '{REMOVED}', w.id DESC LIMIT 1"
        );
        Ok(self
            .conn
            .query_row(&sql, params![repo, name], worktree_from_row)
            .optional()?)
    }

    /// The ids of repository `repo_id`'s removed worktrees.
    pub fn removed_ids(&self, repo_id: RepoId) -> StoreResult<Vec<WorktreeId>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id FROM worktrees WHERE repo_id = ?1 AND state = '{REMOVED}'"
        ))?;
        let rows = stmt.query_map([repo_id], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Removes a row that never became a usable worktree (creation failed after the insert).
    pub fn delete_worktree_row(&self, id: WorktreeId) -> StoreResult<()> {
        self.conn
            .execute("DELETE FROM events WHERE worktree_id = ?1", [id])?;
        self.conn
            .execute("DELETE FROM ports WHERE worktree_id = ?1", [id])?;
        self.conn
            .execute("DELETE FROM setups WHERE worktree_id = ?1", [id])?;
        self.conn
            .execute("DELETE FROM worktrees WHERE id = ?1", [id])?;
        Ok(())
    }

    pub fn worktree_count(&self, repo_id: RepoId) -> StoreResult<i64> {
        Ok(self.conn.query_row(
            &format!("SELECT count(*) FROM worktrees WHERE repo_id = ?1 AND state != '{REMOVED}'"),
            [repo_id],
            |r| r.get(0),
        )?)
    }
    pub fn worktree_by_id(&self, id: WorktreeId) -> StoreResult<Option<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.id = ?1"
        );
        Ok(self
            .conn
            .query_row(&sql, [id], worktree_from_row)
            .optional()?)
    }

    /// Worktrees in one state.
    pub fn worktrees_in(&self, state: crate::lease::State) -> StoreResult<Vec<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state = ?1 ORDER BY w.id"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([state.as_str()], worktree_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
