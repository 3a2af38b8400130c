//! The SQLite store: the one place that owns the schema and its migrations.
//!
//! Repositories, worktrees and their lifecycle state, and the lease, retained and event
//! tables that the lease and cleanup work fills. WAL mode, a busy timeout so the CLI and
//! the daemon can share the file, and versioned migrations keyed by `PRAGMA user_version`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

/// Each entry moves the schema one version forward. Never edit a released entry; append.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE repos (
        id       INTEGER PRIMARY KEY,
        name     TEXT NOT NULL UNIQUE,
        path     TEXT NOT NULL,
        gitdir   TEXT NOT NULL,
        added_at INTEGER NOT NULL
    );
    CREATE TABLE worktrees (
        id               INTEGER PRIMARY KEY,
        repo_id          INTEGER NOT NULL REFERENCES repos(id),
        name             TEXT NOT NULL,
        branch           TEXT,
        branch_created   INTEGER NOT NULL,
        base_commit      TEXT NOT NULL,
        base_tree        TEXT NOT NULL,
        base_mtime       INTEGER NOT NULL,
        uid              INTEGER NOT NULL,
        gid              INTEGER NOT NULL,
        admin_name       TEXT NOT NULL,
        state            TEXT NOT NULL DEFAULT 'ready'
                         CHECK (state IN ('ready','active','lingering','deleting','removed','retained')),
        created_at       INTEGER NOT NULL,
        state_changed_at INTEGER NOT NULL,
        UNIQUE (repo_id, name)
    );
    CREATE TABLE leases (
        id          INTEGER PRIMARY KEY,
        worktree_id INTEGER NOT NULL REFERENCES worktrees(id),
        holder_kind TEXT NOT NULL CHECK (holder_kind IN ('process','session')),
        holder      TEXT NOT NULL,
        pid         INTEGER,
        pid_start   INTEGER,
        command     TEXT,
        session     TEXT,
        acquired_at INTEGER NOT NULL,
        UNIQUE (worktree_id, holder)
    );
    CREATE TABLE retained (
        worktree_id INTEGER PRIMARY KEY REFERENCES worktrees(id),
        path        TEXT NOT NULL,
        repo        TEXT NOT NULL,
        branch      TEXT,
        base_commit TEXT NOT NULL,
        reason      TEXT NOT NULL,
        entered_at  INTEGER NOT NULL
    );
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY,
        at          INTEGER NOT NULL,
        worktree_id INTEGER,
        kind        TEXT NOT NULL,
        holder      TEXT,
        reason      TEXT
    );
    CREATE INDEX events_by_worktree ON events(worktree_id, at);
    "#,
    // 2: a removed worktree's name can be used again (its row stays for the event
    // history), and a removal in progress is recorded so a daemon that died can finish it.
    r#"
    CREATE TABLE worktrees_v2 (
        id               INTEGER PRIMARY KEY,
        repo_id          INTEGER NOT NULL REFERENCES repos(id),
        name             TEXT NOT NULL,
        branch           TEXT,
        branch_created   INTEGER NOT NULL,
        base_commit      TEXT NOT NULL,
        base_tree        TEXT NOT NULL,
        base_mtime       INTEGER NOT NULL,
        uid              INTEGER NOT NULL,
        gid              INTEGER NOT NULL,
        admin_name       TEXT NOT NULL,
        state            TEXT NOT NULL DEFAULT 'ready'
                         CHECK (state IN ('ready','active','lingering','deleting','removed','retained')),
        created_at       INTEGER NOT NULL,
        state_changed_at INTEGER NOT NULL,
        removal          TEXT
    );
    INSERT INTO worktrees_v2 SELECT *, NULL FROM worktrees;
    DROP TABLE worktrees;
    ALTER TABLE worktrees_v2 RENAME TO worktrees;
    CREATE UNIQUE INDEX worktrees_live_name ON worktrees(repo_id, name) WHERE state != 'removed';
    "#,
];

pub const DB_FILE: &str = "worktreefs.db";

#[derive(Debug, Clone, Serialize)]
pub struct RepoRow {
    pub id: i64,
    pub name: String,
    pub path: PathBuf,
    pub gitdir: PathBuf,
    pub added_at: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorktreeRow {
    pub id: i64,
    pub repo_id: i64,
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
    pub state: String,
    pub created_at: i64,
    pub state_changed_at: i64,
    /// Set while a removal is under way: "remove" or "remove+branch" (the branch goes too).
    pub removal: Option<String>,
}

pub struct NewWorktree<'a> {
    pub repo_id: i64,
    pub name: &'a str,
    pub branch: Option<&'a str>,
    pub branch_created: bool,
    pub base_commit: &'a str,
    pub base_tree: &'a str,
    pub base_mtime: i64,
    pub uid: u32,
    pub gid: u32,
    pub admin_name: &'a str,
}

pub struct Store {
    conn: Connection,
}

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

const WORKTREE_COLUMNS: &str = "w.id, w.repo_id, r.name, w.name, w.branch, w.branch_created, \
     w.base_commit, w.base_tree, w.base_mtime, w.uid, w.gid, w.admin_name, w.state, \
     w.created_at, w.state_changed_at, w.removal";

fn worktree_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorktreeRow> {
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
        state: row.get(12)?,
        created_at: row.get(13)?,
        state_changed_at: row.get(14)?,
        removal: row.get(15)?,
    })
}

fn repo_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RepoRow> {
    Ok(RepoRow {
        id: row.get(0)?,
        name: row.get(1)?,
        path: PathBuf::from(row.get::<_, String>(2)?),
        gitdir: PathBuf::from(row.get::<_, String>(3)?),
        added_at: row.get(4)?,
    })
}

impl Store {
    /// Opens (creating if needed) the database in `state_dir` and brings the schema up to date.
    pub fn open(state_dir: &Path) -> rusqlite::Result<Store> {
        let conn = Connection::open(state_dir.join(DB_FILE))?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let mut store = Store { conn };
        store.migrate()?;
        Ok(store)
    }

    pub fn schema_version(&self) -> rusqlite::Result<i64> {
        self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))
    }

    fn migrate(&mut self) -> rusqlite::Result<()> {
        // Rebuilding a table needs foreign keys off, and that can only change outside a
        // transaction; they are checked again after.
        self.conn.pragma_update(None, "foreign_keys", "OFF")?;
        let result = self.migrate_inner();
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        result
    }

    fn migrate_inner(&mut self) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let current: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let version = i as i64 + 1;
            if version > current {
                tx.execute_batch(sql)?;
                tx.pragma_update(None, "user_version", version)?;
            }
        }
        let broken: Option<String> = tx
            .query_row("PRAGMA foreign_key_check", [], |r| r.get(0))
            .optional()?;
        if let Some(table) = broken {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT),
                Some(format!("migration left a dangling reference in {table}")),
            ));
        }
        tx.commit()
    }

    /// Changes whenever another connection commits; cheap enough to ask on every directory
    /// lookup at the top of the mount.
    pub fn data_version(&self) -> rusqlite::Result<i64> {
        self.conn.query_row("PRAGMA data_version", [], |r| r.get(0))
    }

    pub fn meta_get(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
    }

    pub fn meta_set(&self, key: &str, value: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }

    pub fn add_repo(&self, name: &str, path: &Path, gitdir: &Path) -> rusqlite::Result<RepoRow> {
        self.conn.execute(
            "INSERT INTO repos(name, path, gitdir, added_at) VALUES (?1, ?2, ?3, ?4)",
            params![
                name,
                path.to_string_lossy(),
                gitdir.to_string_lossy(),
                now_secs()
            ],
        )?;
        let id = self.conn.last_insert_rowid();
        self.repo_by_id(id)?
            .ok_or(rusqlite::Error::QueryReturnedNoRows)
    }

    /// Unregisters a repository that has no live worktree; the rows of its removed
    /// worktrees go with it (their events stay, without names).
    pub fn remove_repo(&mut self, id: i64) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "DELETE FROM worktrees WHERE repo_id = ?1 AND state = 'removed'",
            [id],
        )?;
        tx.execute("DELETE FROM repos WHERE id = ?1", [id])?;
        tx.commit()
    }

    pub fn repos(&self) -> rusqlite::Result<Vec<RepoRow>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, name, path, gitdir, added_at FROM repos ORDER BY name")?;
        let rows = stmt.query_map([], repo_from_row)?;
        rows.collect()
    }

    pub fn repo_by_name(&self, name: &str) -> rusqlite::Result<Option<RepoRow>> {
        self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at FROM repos WHERE name = ?1",
                [name],
                repo_from_row,
            )
            .optional()
    }

    pub fn repo_by_id(&self, id: i64) -> rusqlite::Result<Option<RepoRow>> {
        self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at FROM repos WHERE id = ?1",
                [id],
                repo_from_row,
            )
            .optional()
    }

    pub fn repo_by_gitdir(&self, gitdir: &Path) -> rusqlite::Result<Option<RepoRow>> {
        self.conn
            .query_row(
                "SELECT id, name, path, gitdir, added_at FROM repos WHERE gitdir = ?1",
                [gitdir.to_string_lossy()],
                repo_from_row,
            )
            .optional()
    }

    /// Inserts a worktree in state `ready` and records the creation as an event, in one
    /// transaction. Fails on a duplicate (repo, name).
    pub fn insert_worktree(&mut self, w: &NewWorktree<'_>) -> rusqlite::Result<i64> {
        let now = now_secs();
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO worktrees(repo_id, name, branch, branch_created, base_commit, base_tree,
                 base_mtime, uid, gid, admin_name, state, created_at, state_changed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'ready', ?11, ?11)",
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
                now
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "INSERT INTO events(at, worktree_id, kind, reason) VALUES (?1, ?2, 'created', ?3)",
            params![now, id, format!("base {}", w.base_commit)],
        )?;
        tx.commit()?;
        Ok(id)
    }

    pub fn worktrees(&self) -> rusqlite::Result<Vec<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state != 'removed' ORDER BY r.name, w.name"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], worktree_from_row)?;
        rows.collect()
    }

    pub fn worktree(&self, repo: &str, name: &str) -> rusqlite::Result<Option<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE r.name = ?1 AND w.name = ?2
             ORDER BY w.state = 'removed', w.id DESC LIMIT 1"
        );
        self.conn
            .query_row(&sql, params![repo, name], worktree_from_row)
            .optional()
    }

    /// Removes a row that never became a usable worktree (creation failed after the insert).
    pub fn delete_worktree_row(&self, id: i64) -> rusqlite::Result<()> {
        self.conn
            .execute("DELETE FROM events WHERE worktree_id = ?1", [id])?;
        self.conn
            .execute("DELETE FROM worktrees WHERE id = ?1", [id])?;
        Ok(())
    }

    pub fn worktree_count(&self, repo_id: i64) -> rusqlite::Result<i64> {
        self.conn.query_row(
            "SELECT count(*) FROM worktrees WHERE repo_id = ?1 AND state != 'removed'",
            [repo_id],
            |r| r.get(0),
        )
    }
}

/// A lease to record: who holds it.
#[derive(Debug, Clone)]
pub enum NewLease {
    /// A process, identified by pid and start time (so a reused pid is never the holder).
    Process {
        pid: i32,
        start: u64,
        command: String,
    },
    /// A named lease of an orchestrator's session.
    Session { id: String },
}

impl NewLease {
    /// The holder's key, unique per worktree: `pid:<pid>:<start>` or `session:<id>`.
    pub fn holder(&self) -> String {
        match self {
            NewLease::Process { pid, start, .. } => format!("pid:{pid}:{start}"),
            NewLease::Session { id } => format!("session:{id}"),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaseRow {
    pub repo: String,
    pub worktree: String,
    pub worktree_id: i64,
    pub holder_kind: String,
    pub holder: String,
    pub pid: Option<i64>,
    pub pid_start: Option<i64>,
    pub command: Option<String>,
    pub session: Option<String>,
    pub acquired_at: i64,
}

impl LeaseRow {
    /// The entry name under `.control/leases`.
    pub fn entry_name(&self) -> String {
        format!("{}:{}@{}", self.repo, self.worktree, self.holder)
    }

    /// Who holds it, for a person: the command line or the session id.
    pub fn holder_label(&self) -> &str {
        self.command
            .as_deref()
            .or(self.session.as_deref())
            .unwrap_or("")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    pub id: i64,
    pub at: i64,
    pub repo: Option<String>,
    pub worktree: Option<String>,
    pub kind: String,
    pub holder: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug)]
pub enum LeaseError {
    /// The worktree is deleting or removed; `state` names it.
    Conflict(crate::lease::Conflict, String),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for LeaseError {
    fn from(e: rusqlite::Error) -> Self {
        LeaseError::Db(e)
    }
}

const LEASE_COLUMNS: &str = "r.name, w.name, l.worktree_id, l.holder_kind, l.holder, l.pid, \
     l.pid_start, l.command, l.session, l.acquired_at";

fn lease_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok(LeaseRow {
        repo: row.get(0)?,
        worktree: row.get(1)?,
        worktree_id: row.get(2)?,
        holder_kind: row.get(3)?,
        holder: row.get(4)?,
        pid: row.get(5)?,
        pid_start: row.get(6)?,
        command: row.get(7)?,
        session: row.get(8)?,
        acquired_at: row.get(9)?,
    })
}

fn event(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: i64,
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

fn state_of(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: i64,
) -> rusqlite::Result<crate::lease::State> {
    let s: String = tx.query_row(
        "SELECT state FROM worktrees WHERE id = ?1",
        [worktree_id],
        |r| r.get(0),
    )?;
    Ok(crate::lease::State::parse(&s).unwrap_or(crate::lease::State::Ready))
}

fn lease_count(tx: &rusqlite::Transaction<'_>, worktree_id: i64) -> rusqlite::Result<usize> {
    tx.query_row(
        "SELECT count(*) FROM leases WHERE worktree_id = ?1",
        [worktree_id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as usize)
}

fn set_state(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: i64,
    state: crate::lease::State,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE worktrees SET state = ?1, state_changed_at = ?2 WHERE id = ?3",
        params![state.as_str(), now_secs(), worktree_id],
    )?;
    Ok(())
}

impl Store {
    /// Takes a lease on a worktree: refused while it is deleting or removed; a retained
    /// worktree leaves the retained store. One transaction. Returns false when the holder
    /// already had it.
    pub fn acquire_lease(
        &mut self,
        worktree_id: i64,
        lease: &NewLease,
        reason: &str,
    ) -> Result<bool, LeaseError> {
        use crate::lease::{on_acquire, State};
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let state = state_of(&tx, worktree_id)?;
        let next = on_acquire(state).map_err(|c| LeaseError::Conflict(c, state.to_string()))?;
        let holder = lease.holder();
        let (kind, pid, start, command, session) = match lease {
            NewLease::Process {
                pid,
                start,
                command,
            } => (
                "process",
                Some(*pid as i64),
                Some(*start as i64),
                Some(command.clone()),
                None,
            ),
            NewLease::Session { id } => ("session", None, None, None, Some(id.clone())),
        };
        let inserted = tx.execute(
            "INSERT OR IGNORE INTO leases(worktree_id, holder_kind, holder, pid, pid_start, command, session, acquired_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![worktree_id, kind, holder, pid, start, command, session, now_secs()],
        )? == 1;
        if state != next {
            set_state(&tx, worktree_id, next)?;
        }
        if state == State::Retained {
            tx.execute("DELETE FROM retained WHERE worktree_id = ?1", [worktree_id])?;
        }
        if inserted {
            event(&tx, worktree_id, "acquired", Some(&holder), reason)?;
        }
        tx.commit()?;
        Ok(inserted)
    }

    /// Releases one holder's lease; the last release moves the worktree to `lingering`, in
    /// the same transaction. Returns false when there was no such lease.
    pub fn release_lease(
        &mut self,
        worktree_id: i64,
        holder: &str,
        kind: &str,
        reason: &str,
    ) -> rusqlite::Result<bool> {
        use crate::lease::on_release;
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let removed = tx.execute(
            "DELETE FROM leases WHERE worktree_id = ?1 AND holder = ?2",
            params![worktree_id, holder],
        )? == 1;
        if removed {
            event(&tx, worktree_id, kind, Some(holder), reason)?;
            let state = state_of(&tx, worktree_id)?;
            let next = on_release(state, lease_count(&tx, worktree_id)?);
            if next != state {
                set_state(&tx, worktree_id, next)?;
                event(&tx, worktree_id, next.as_str(), None, "last lease released")?;
            }
        }
        tx.commit()?;
        Ok(removed)
    }

    /// For every lingering worktree whose grace period is over and which has no lease:
    /// the `deleting` mark, written in the same transaction that finds no lease. Returns
    /// the ids marked.
    pub fn mark_deleting_after_grace(&mut self, linger: i64) -> rusqlite::Result<Vec<i64>> {
        let ids: Vec<i64> = {
            let mut stmt = self
                .conn
                .prepare("SELECT id FROM worktrees WHERE state = 'lingering'")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut marked = Vec::new();
        for id in ids {
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let state = state_of(&tx, id)?;
            let since: i64 = tx.query_row(
                "SELECT state_changed_at FROM worktrees WHERE id = ?1",
                [id],
                |r| r.get(0),
            )?;
            if crate::lease::grace_over(state, lease_count(&tx, id)?, since, now_secs(), linger) {
                set_state(&tx, id, crate::lease::State::Deleting)?;
                event(
                    &tx,
                    id,
                    "deleting",
                    None,
                    &format!("no lease for {linger} s"),
                )?;
                marked.push(id);
            }
            tx.commit()?;
        }
        Ok(marked)
    }

    /// Lingering worktrees whose grace period is over: (id, repo, name).
    pub fn lingering_past(&self, linger: i64) -> rusqlite::Result<Vec<(i64, String, String)>> {
        let mut stmt = self.conn.prepare(
            "SELECT w.id, r.name, w.name FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state = 'lingering' AND ?1 - w.state_changed_at >= ?2",
        )?;
        let rows = stmt.query_map(params![now_secs(), linger], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        rows.collect()
    }

    pub fn leases(&self) -> rusqlite::Result<Vec<LeaseRow>> {
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM leases l JOIN worktrees w ON w.id = l.worktree_id
             JOIN repos r ON r.id = w.repo_id ORDER BY r.name, w.name, l.holder"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], lease_from_row)?;
        rows.collect()
    }

    /// The newest `limit` events, oldest first, after event id `after`.
    pub fn events(&self, after: i64, limit: i64) -> rusqlite::Result<Vec<EventRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT * FROM (
                SELECT e.id, e.at, r.name, w.name, e.kind, e.holder, e.reason
                FROM events e LEFT JOIN worktrees w ON w.id = e.worktree_id
                LEFT JOIN repos r ON r.id = w.repo_id
                WHERE e.id > ?1 ORDER BY e.id DESC LIMIT ?2
             ) ORDER BY 1",
        )?;
        let rows = stmt.query_map(params![after, limit], |row| {
            Ok(EventRow {
                id: row.get(0)?,
                at: row.get(1)?,
                repo: row.get(2)?,
                worktree: row.get(3)?,
                kind: row.get(4)?,
                holder: row.get(5)?,
                reason: row.get(6)?,
            })
        })?;
        rows.collect()
    }
}

/// A worktree cleanup kept because removing it would lose work (SPEC "Cleanup").
#[derive(Debug, Clone, Serialize)]
pub struct RetainedRow {
    pub worktree_id: i64,
    pub repo: String,
    pub worktree: String,
    pub path: String,
    pub branch: Option<String>,
    pub base_commit: String,
    pub reason: String,
    pub entered_at: i64,
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
    Leased(usize, String),
    /// Its state does not allow it (deleting: someone else is at it; removed: gone).
    State(String),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for BeginError {
    fn from(e: rusqlite::Error) -> Self {
        BeginError::Db(e)
    }
}

impl Store {
    pub fn worktree_by_id(&self, id: i64) -> rusqlite::Result<Option<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.id = ?1"
        );
        self.conn
            .query_row(&sql, [id], worktree_from_row)
            .optional()
    }

    /// Worktrees in one state.
    pub fn worktrees_in(&self, state: crate::lease::State) -> rusqlite::Result<Vec<WorktreeRow>> {
        let sql = format!(
            "SELECT {WORKTREE_COLUMNS} FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state = ?1 ORDER BY w.id"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([state.as_str()], worktree_from_row)?;
        rows.collect()
    }

    /// Marks a worktree `deleting` for a removal someone asked for (reclaim, rmdir), in the
    /// transaction that finds it without a lease and in one of `from`. Returns the state it
    /// had, to go back to when the removal is refused.
    pub fn begin_deleting(
        &mut self,
        worktree_id: i64,
        from: &[crate::lease::State],
        reason: &str,
    ) -> Result<crate::lease::State, BeginError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let state = state_of(&tx, worktree_id)?;
        let leases = lease_count(&tx, worktree_id)?;
        if leases > 0 {
            return Err(BeginError::Leased(leases, state.to_string()));
        }
        if !from.contains(&state) {
            return Err(BeginError::State(state.to_string()));
        }
        set_state(&tx, worktree_id, crate::lease::State::Deleting)?;
        event(&tx, worktree_id, "deleting", None, reason)?;
        tx.commit()?;
        Ok(state)
    }

    /// A removal that was refused: the worktree goes back to the state it had.
    pub fn end_deleting(
        &mut self,
        worktree_id: i64,
        back_to: crate::lease::State,
        reason: &str,
    ) -> rusqlite::Result<()> {
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
        tx.commit()
    }

    /// Records that the removal of a deleting worktree has begun (what it will do), so a
    /// daemon that dies in the middle finishes it at the next mount.
    pub fn set_removal(&self, worktree_id: i64, removal: &str) -> rusqlite::Result<()> {
        self.conn.execute(
            "UPDATE worktrees SET removal = ?1 WHERE id = ?2 AND state = 'deleting'",
            params![removal, worktree_id],
        )?;
        Ok(())
    }

    /// The worktree is gone: state `removed`, out of the retained store, its leases (if any
    /// were left) released. One transaction.
    pub fn mark_removed(&mut self, worktree_id: i64, reason: &str) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM retained WHERE worktree_id = ?1", [worktree_id])?;
        tx.execute("DELETE FROM leases WHERE worktree_id = ?1", [worktree_id])?;
        set_state(&tx, worktree_id, crate::lease::State::Removed)?;
        tx.execute(
            "UPDATE worktrees SET removal = NULL WHERE id = ?1",
            [worktree_id],
        )?;
        event(&tx, worktree_id, "removed", None, reason)?;
        tx.commit()
    }

    /// The worktree holds work (or its cleanup failed): state `retained` and an entry in the
    /// retained store saying why. One transaction.
    pub fn retain(&mut self, worktree_id: i64, path: &str, reason: &str) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let now = now_secs();
        tx.execute(
            "INSERT INTO retained(worktree_id, path, repo, branch, base_commit, reason, entered_at)
             SELECT w.id, ?2, r.name, w.branch, w.base_commit, ?3, ?4
             FROM worktrees w JOIN repos r ON r.id = w.repo_id WHERE w.id = ?1
             ON CONFLICT(worktree_id) DO UPDATE SET reason = excluded.reason, path = excluded.path",
            params![worktree_id, path, reason, now],
        )?;
        set_state(&tx, worktree_id, crate::lease::State::Retained)?;
        tx.execute(
            "UPDATE worktrees SET removal = NULL WHERE id = ?1",
            [worktree_id],
        )?;
        event(&tx, worktree_id, "retained", None, reason)?;
        tx.commit()
    }

    pub fn retained(&self) -> rusqlite::Result<Vec<RetainedRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT t.worktree_id, t.repo, w.name, t.path, t.branch, t.base_commit, t.reason,
                    t.entered_at
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
            })
        })?;
        rows.collect()
    }

    /// Releases every lease (unmount): each release is its own transaction and event.
    /// Returns how many were released.
    pub fn release_all_leases(&mut self, reason: &str) -> rusqlite::Result<usize> {
        let mut n = 0;
        for l in self.leases()? {
            if self.release_lease(l.worktree_id, &l.holder, "released", reason)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The id of the newest event (0 when there is none).
    pub fn last_event_id(&self) -> rusqlite::Result<i64> {
        self.conn
            .query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| r.get(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_run_once_and_reopen_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn worktree_names_are_unique_per_repo() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let repo = store
            .add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        let w = NewWorktree {
            repo_id: repo.id,
            name: "a",
            branch: Some("a"),
            branch_created: true,
            base_commit: "c",
            base_tree: "t",
            base_mtime: 1,
            uid: 0,
            gid: 0,
            admin_name: "a",
        };
        store.insert_worktree(&w).unwrap();
        assert!(store.insert_worktree(&w).is_err());
        let rows = store.worktrees().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].state, "ready");
        assert_eq!(rows[0].repo, "r");
        assert!(store.worktree("r", "a").unwrap().is_some());
        assert!(store.worktree("r", "b").unwrap().is_none());
    }

    fn store_with_worktree() -> (tempfile::TempDir, Store, i64) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let repo = store
            .add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        let id = store
            .insert_worktree(&NewWorktree {
                repo_id: repo.id,
                name: "w",
                branch: Some("w"),
                branch_created: true,
                base_commit: "c",
                base_tree: "t",
                base_mtime: 1,
                uid: 0,
                gid: 0,
                admin_name: "w",
            })
            .unwrap();
        (dir, store, id)
    }

    fn state(store: &Store) -> String {
        store.worktree("r", "w").unwrap().unwrap().state
    }

    #[test]
    fn leases_move_the_lifecycle() {
        let (_d, mut store, id) = store_with_worktree();
        let a = NewLease::Session { id: "a".into() };
        let b = NewLease::Session { id: "b".into() };
        assert!(store.acquire_lease(id, &a, "test").unwrap());
        assert!(
            !store.acquire_lease(id, &a, "test").unwrap(),
            "same holder twice is one lease"
        );
        assert!(store.acquire_lease(id, &b, "test").unwrap());
        assert_eq!(state(&store), "active");
        assert_eq!(store.leases().unwrap().len(), 2);
        assert!(store
            .release_lease(id, &a.holder(), "released", "test")
            .unwrap());
        assert_eq!(state(&store), "active", "one holder remains");
        assert!(store
            .release_lease(id, &b.holder(), "released", "test")
            .unwrap());
        assert_eq!(state(&store), "lingering");
        assert!(!store
            .release_lease(id, &b.holder(), "released", "test")
            .unwrap());
        // Grace of 0: marked deleting at the next sweep; then leases are refused.
        assert_eq!(store.mark_deleting_after_grace(0).unwrap(), vec![id]);
        assert_eq!(state(&store), "deleting");
        match store.acquire_lease(id, &a, "test") {
            Err(LeaseError::Conflict(crate::lease::Conflict::Deleting, s)) => {
                assert_eq!(s, "deleting")
            }
            other => panic!("{other:?}"),
        }
        let kinds: Vec<String> = store
            .events(0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                "created",
                "acquired",
                "acquired",
                "released",
                "released",
                "lingering",
                "deleting"
            ]
        );
    }

    #[test]
    fn a_lease_during_the_grace_period_keeps_the_worktree() {
        let (_d, mut store, id) = store_with_worktree();
        let a = NewLease::Session { id: "a".into() };
        store.acquire_lease(id, &a, "t").unwrap();
        store
            .release_lease(id, &a.holder(), "released", "t")
            .unwrap();
        assert!(store.mark_deleting_after_grace(3600).unwrap().is_empty());
        store.acquire_lease(id, &a, "t").unwrap();
        assert_eq!(state(&store), "active");
        assert!(store.mark_deleting_after_grace(0).unwrap().is_empty());
    }

    #[test]
    fn data_version_moves_when_another_connection_commits() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let b = Store::open(dir.path()).unwrap();
        let before = a.data_version().unwrap();
        b.add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        assert_ne!(a.data_version().unwrap(), before);
    }
}
