//! Creations in progress: what a creation is about to make, recorded before its first
//! step (a branch, git's admin entry, the upper layer's directory), so that one killed
//! half-way is rolled back by the next mount or the next creation of that name, and
//! nothing it did not record is touched.

use rusqlite::{params, OptionalExtension};

use super::{now_secs, Store, StoreError, StoreResult, REMOVED};
use crate::ids::{RepoId, WorktreeId};

/// A creation in progress, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreationRow {
    /// The id reserved for the worktree: its directory is `<state>/worktrees/<id>`.
    pub worktree_id: WorktreeId,
    pub repo_id: RepoId,
    pub name: String,
    /// A branch this creation makes (None: it uses one that exists).
    pub branch: Option<String>,
    pub base_commit: String,
    /// git's admin entry it makes: `<gitdir>/worktrees/<admin_name>`.
    pub admin_name: String,
    /// The creating process, by pid and start time.
    pub pid: i32,
    pub pid_start: u64,
    pub started_at: i64,
    /// A restore (`worktreefs restore`): the removed worktree whose kept copy it brings
    /// back. Its rollback puts the copy back where it was kept, never deletes it.
    pub restored_from: Option<WorktreeId>,
}

/// Why a creation could not be recorded.
#[derive(Debug)]
pub enum BeginCreation {
    /// A worktree of that name exists (its state).
    Exists(String),
    /// Another creation of that name is recorded.
    InProgress(Box<CreationRow>),
    Db(StoreError),
}

impl From<rusqlite::Error> for BeginCreation {
    fn from(e: rusqlite::Error) -> Self {
        BeginCreation::Db(e.into())
    }
}

impl From<StoreError> for BeginCreation {
    fn from(e: StoreError) -> Self {
        BeginCreation::Db(e)
    }
}

const COLUMNS: &str = "worktree_id, repo_id, name, branch, base_commit, admin_name, pid, pid_start, started_at, restored_from";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CreationRow> {
    Ok(CreationRow {
        worktree_id: r.get(0)?,
        repo_id: r.get(1)?,
        name: r.get(2)?,
        branch: r.get(3)?,
        base_commit: r.get(4)?,
        admin_name: r.get(5)?,
        pid: r.get(6)?,
        pid_start: r.get::<_, i64>(7)? as u64,
        started_at: r.get(8)?,
        restored_from: r.get(9)?,
    })
}

impl Store {
    /// Records a creation before its first step, in one transaction that finds no live
    /// worktree and no other creation of that name; reserves and returns the worktree's
    /// id (above every worktree's and every recorded creation's).
    pub fn begin_creation(&mut self, c: &CreationRow) -> Result<WorktreeId, BeginCreation> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let live: Option<String> = tx
            .query_row(
                &format!(
                    "SELECT state FROM worktrees WHERE repo_id = ?1 AND name = ?2 AND state != '{REMOVED}'"
                ),
                params![c.repo_id, c.name],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(state) = live {
            return Err(BeginCreation::Exists(state));
        }
        let other = tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM creations WHERE repo_id = ?1 AND name = ?2"),
                params![c.repo_id, c.name],
                from_row,
            )
            .optional()?;
        if let Some(other) = other {
            return Err(BeginCreation::InProgress(Box::new(other)));
        }
        // Never an id used before, by a worktree or a creation (one rolled back included):
        // a rollback working from an old record must not find a newer creation's files.
        let id: WorktreeId = tx.query_row(
            "SELECT 1 + MAX(COALESCE((SELECT MAX(id) FROM worktrees), 0),
                            COALESCE((SELECT MAX(worktree_id) FROM creations), 0),
                            COALESCE((SELECT CAST(value AS INTEGER) FROM meta
                                      WHERE key = 'last_reserved_worktree_id'), 0))",
            [],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO meta(key, value) VALUES ('last_reserved_worktree_id', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [id.to_string()],
        )?;
        tx.execute(
            &format!(
                "INSERT INTO creations({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ),
            params![
                id,
                c.repo_id,
                c.name,
                c.branch,
                c.base_commit,
                c.admin_name,
                c.pid,
                c.pid_start as i64,
                now_secs(),
                c.restored_from
            ],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Every creation recorded (in progress, or left by a creator that died).
    pub fn creations(&self) -> StoreResult<Vec<CreationRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM creations ORDER BY worktree_id"
        ))?;
        let rows = stmt.query_map([], from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Admin entry names recorded by creations of repository `repo_id`.
    pub fn creation_admin_names(&self, repo_id: RepoId) -> StoreResult<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare("SELECT admin_name FROM creations WHERE repo_id = ?1")?;
        let rows = stmt.query_map([repo_id], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Takes over the record of a creation whose creator is gone, for `pid` (started at
    /// `start`) to roll it back: false when the record is no longer the one read (someone
    /// else took it over, rolled it back, or the creation finished).
    pub fn claim_creation(&mut self, c: &CreationRow, pid: i32, start: u64) -> StoreResult<bool> {
        let n = self.conn.execute(
            "UPDATE creations SET pid = ?1, pid_start = ?2
             WHERE worktree_id = ?3 AND pid = ?4 AND pid_start = ?5",
            params![pid, start as i64, c.worktree_id, c.pid, c.pid_start as i64],
        )?;
        Ok(n == 1)
    }

    /// The commit creation `c` makes its branch at, decided after it was recorded (a
    /// fork reads its parent's HEAD last): what a rollback compares the branch with.
    pub fn set_creation_base(&self, c: &CreationRow) -> StoreResult<()> {
        let n = self.conn.execute(
            "UPDATE creations SET base_commit = ?1
             WHERE worktree_id = ?2 AND pid = ?3 AND pid_start = ?4",
            params![c.base_commit, c.worktree_id, c.pid, c.pid_start as i64],
        )?;
        if n != 1 {
            return Err(rusqlite::Error::QueryReturnedNoRows.into());
        }
        Ok(())
    }

    /// An event of worktree `id` of a kind only one part of the lifecycle records (a
    /// fork's "forked").
    pub fn add_event(&self, id: WorktreeId, kind: &str, reason: &str) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO events(at, worktree_id, kind, reason) VALUES (?1, ?2, ?3, ?4)",
            params![crate::store::now_secs(), id, kind, reason],
        )?;
        Ok(())
    }

    /// A creation rolled back: its record goes, if it is still the one given.
    pub fn end_creation(&self, c: &CreationRow) -> StoreResult<()> {
        self.conn.execute(
            "DELETE FROM creations WHERE worktree_id = ?1 AND pid = ?2 AND pid_start = ?3",
            params![c.worktree_id, c.pid, c.pid_start as i64],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewWorktree;

    fn record(repo_id: RepoId, name: &str, pid: i32) -> CreationRow {
        CreationRow {
            worktree_id: WorktreeId(0),
            repo_id,
            name: name.into(),
            branch: Some(name.into()),
            base_commit: "c0ffee".into(),
            admin_name: format!("wtfs-{name}"),
            pid,
            pid_start: 7,
            started_at: 0,
            restored_from: None,
        }
    }

    fn worktree<'a>(repo_id: RepoId, name: &'a str) -> NewWorktree<'a> {
        NewWorktree {
            repo_id,
            name,
            branch: Some(name),
            branch_created: true,
            base_commit: "c0ffee",
            base_tree: "7ree",
            base_mtime: 1,
            uid: 0,
            gid: 0,
            admin_name: name,
            warm: None,
        }
    }

    #[test]
    fn a_reserved_id_is_never_given_again_and_a_stale_record_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let repo = store
            .add_repo(
                "r",
                std::path::Path::new("/x"),
                std::path::Path::new("/x/.git"),
            )
            .unwrap();
        let mut dead = record(repo.id, "a", 1);
        dead.worktree_id = store.begin_creation(&dead).unwrap();
        assert!(matches!(
            store.begin_creation(&record(repo.id, "a", 2)),
            Err(BeginCreation::InProgress(_))
        ));
        // Two processes read the dead record; the first takes it over, the second cannot.
        let stale = store.creations().unwrap().remove(0);
        assert!(store.claim_creation(&stale, 3, 9).unwrap());
        assert!(!store.claim_creation(&stale, 4, 9).unwrap());
        let mine = CreationRow {
            pid: 3,
            pid_start: 9,
            ..stale.clone()
        };
        // A stale copy neither ends nor finishes it.
        store.end_creation(&stale).unwrap();
        assert_eq!(store.creations().unwrap().len(), 1);
        assert!(store
            .finish_creation(&stale, &worktree(repo.id, "a"))
            .is_err());
        assert!(store.worktree("r", "a").unwrap().is_none());
        store.end_creation(&mine).unwrap();
        assert!(store.creations().unwrap().is_empty());
        // The next creation of the name gets a new id, not the one rolled back.
        let mut next = record(repo.id, "a", 5);
        next.worktree_id = store.begin_creation(&next).unwrap();
        assert!(next.worktree_id > dead.worktree_id);
        store
            .finish_creation(&next, &worktree(repo.id, "a"))
            .unwrap();
        let row = store.worktree("r", "a").unwrap().unwrap();
        assert_eq!(row.id, next.worktree_id);
        assert!(store.creations().unwrap().is_empty());
        assert!(matches!(
            store.begin_creation(&record(repo.id, "a", 6)),
            Err(BeginCreation::Exists(_))
        ));
    }
}
