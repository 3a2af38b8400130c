//! The SQLite store: the one place that owns the schema and its migrations.
//!
//! Repositories, worktrees and their lifecycle state, and the lease, retained and event
//! tables that the lease and cleanup work fills. WAL mode, a busy timeout so the CLI and
//! the daemon can share the file, and versioned migrations keyed by `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use crate::lease::State;

/// The states as the `state` column spells them, for SQL text (`lease::State` is the
/// one spelling; literals stay in the SQL so partial indexes still apply).
const READY: &str = State::Ready.as_str();
const LINGERING: &str = State::Lingering.as_str();
const DELETING: &str = State::Deleting.as_str();
const REMOVED: &str = State::Removed.as_str();

mod catalog;
mod cleanup;
mod creations;
mod error;
mod events;
mod ids;
mod kept;
mod leases;
mod ports;
mod schema;
mod setups;
mod steps;
mod turns;
mod warm;

pub use catalog::{NewWorktree, RepoRow, WorktreeRow};
pub use cleanup::{BeginError, RetainedRow};
pub use creations::{BeginCreation, CreationRow};
pub use error::{ErrorKind, OpenError, StoreError, StoreResult};
pub use events::EventQueue;
pub use kept::{KeptRow, NewKept, PURGED, RESTORED};
pub use leases::{Ask, EventRow, LeaseColumns, LeaseError, LeaseRow, NewLease, Occupant};
pub use ports::PortBlock;
use schema::MIGRATIONS;
pub use setups::{RepoHooks, SetupEnd, SetupRow, SetupState};
pub use turns::{NewTurn, TurnError, TurnRow};
pub use warm::{NewWarm, WarmRow};

pub const DB_FILE: &str = "worktreefs.db";

/// How long a statement waits for another connection's lock, unless told otherwise.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Store {
    conn: Connection,
}

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the database in `state_dir` and brings the schema up to date.
    pub fn open(state_dir: &Path) -> StoreResult<Store> {
        let path = state_dir.join(DB_FILE);
        make_owner_only(&path);
        let conn = Connection::open(&path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let mut store = Store { conn };
        store.migrate()?;
        Ok(store)
    }

    /// `open`, with an error that names the file, what is wrong with it and the way out
    /// (a database this user cannot write, one that is not a database or is damaged).
    pub fn open_described(state_dir: &Path) -> Result<Store, OpenError> {
        Store::open(state_dir).map_err(|e| OpenError::new(&e, describe_open_error(state_dir, &e)))
    }

    /// How long a statement waits for another connection's lock before it fails busy.
    pub fn set_busy_timeout(&self, d: Duration) -> StoreResult<()> {
        Ok(self.conn.busy_timeout(d)?)
    }

    /// Runs `f` with busy timeout `d`, then the usual one again.
    pub fn with_busy_timeout<T>(
        &mut self,
        d: Duration,
        f: impl FnOnce(&mut Store) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.conn.busy_timeout(d)?;
        let r = f(self);
        self.conn.busy_timeout(BUSY_TIMEOUT)?;
        r
    }

    pub fn schema_version(&self) -> StoreResult<i64> {
        Ok(self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    fn migrate(&mut self) -> StoreResult<()> {
        // Up to date (every open but the first after an upgrade): nothing to write, so no
        // write lock is taken (another process holding the database must not make every
        // open wait for it).
        if self.schema_version()? >= MIGRATIONS.len() as i64 {
            return Ok(());
        }
        // Rebuilding a table needs foreign keys off, and that can only change outside a
        // transaction; they are checked again after.
        self.conn.pragma_update(None, "foreign_keys", "OFF")?;
        let result = self.migrate_inner();
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        result
    }

    fn migrate_inner(&mut self) -> StoreResult<()> {
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
            )
            .into());
        }
        Ok(tx.commit()?)
    }

    /// Changes whenever another connection commits; cheap enough to ask on every directory
    /// lookup at the top of the mount.
    pub fn data_version(&self) -> StoreResult<i64> {
        Ok(self
            .conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))?)
    }

    pub fn meta_get(&self, key: &str) -> StoreResult<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    /// A name of this state directory of its own, made at its first use: what tells its
    /// refs in a repository from another state directory's (worktree ids are each
    /// store's own, and one repository may be registered in two).
    pub fn refs_key(&self) -> StoreResult<String> {
        const KEY: &str = "refs_key";
        if let Some(k) = self.meta_get(KEY)? {
            return Ok(k);
        }
        let mut bytes = [0u8; 6];
        let made = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
        if made.is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()) as u64
                ^ u64::from(std::process::id()) << 40;
            bytes.copy_from_slice(&t.to_le_bytes()[..6]);
        }
        // A letter first: never all digits, as the ids beside it in a ref's name are.
        let k: String = std::iter::once("s".to_string())
            .chain(bytes.iter().map(|b| format!("{b:02x}")))
            .collect();
        // Two first uses at once: the one written first is kept.
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO NOTHING",
            params![KEY, k],
        )?;
        Ok(self.meta_get(KEY)?.unwrap_or(k))
    }

    pub fn meta_set(&self, key: &str, value: &str) -> StoreResult<()> {
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }
}

/// The database and its WAL files are the owner's only (they hold every lease and event,
/// with command lines): a new database is created 0600 (SQLite gives its WAL files the
/// database's mode), and one an older version left readable to others is made 0600.
fn make_owner_only(db: &Path) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db);
    let me = nix::unistd::geteuid().as_raw();
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_os_string();
        p.push(suffix);
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            if m.is_file() && m.uid() == me && m.mode() & 0o077 != 0 {
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
            }
        }
    }
}

/// What went wrong opening the database in `state_dir`, for a person: the file, why, and
/// what to do.
pub fn describe_open_error(state_dir: &Path, e: &StoreError) -> String {
    use rusqlite::ErrorCode;
    let db = state_dir.join(DB_FILE);
    let code = e.code();
    let writable = nix::unistd::access(state_dir, nix::unistd::AccessFlags::W_OK).is_ok()
        && (!db.exists() || nix::unistd::access(&db, nix::unistd::AccessFlags::W_OK).is_ok());
    match code {
        Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied)
            if !writable =>
        {
            let owner = std::fs::metadata(state_dir)
                .map(|m| std::os::unix::fs::MetadataExt::uid(&m).to_string())
                .unwrap_or_else(|_| "?".into());
            format!(
                "state dir {} is not writable by this user (uid {}; it belongs to uid {owner}): run as its owner, or use a state dir of your own with --state-dir",
                state_dir.display(),
                nix::unistd::geteuid()
            )
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => format!(
            "the database {} is damaged or is not a worktreefs database ({e}); move it aside (`mv {} {}.broken`) and run the command again to start an empty one (worktrees and leases recorded there are forgotten, their files stay in {}), or put a backup in its place",
            db.display(),
            db.display(),
            db.display(),
            state_dir.join("worktrees").display()
        ),
        _ => format!("opening the database {}: {e}", db.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::info::Liveness;

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
            warm: None,
        };
        store.insert_worktree(&w).unwrap();
        assert!(store.insert_worktree(&w).is_err());
        let rows = store.worktrees().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].state.as_str(), "ready");
        assert_eq!(rows[0].repo, "r");
        assert!(store.worktree("r", "a").unwrap().is_some());
        assert!(store.worktree("r", "b").unwrap().is_none());
    }

    pub(super) fn store_with_worktree() -> (tempfile::TempDir, Store, crate::ids::WorktreeId) {
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
                warm: None,
            })
            .unwrap();
        (dir, store, id)
    }

    fn state(store: &Store) -> String {
        store.worktree("r", "w").unwrap().unwrap().state.to_string()
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
                assert_eq!(s.as_str(), "deleting")
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

    /// An unmount's release of one worktree's leases before the mount goes: a live
    /// process's lease keeps all of them (none released); with only the leases of gone
    /// processes and named ones it may release, all go and the worktree lingers; a named
    /// one kept keeps it.
    #[test]
    fn an_unmount_releases_a_worktrees_leases_all_or_none() {
        let (_d, mut store, id) = store_with_worktree();
        let process = |pid| NewLease::Process {
            pid,
            start: 7,
            command: "x".into(),
        };
        let named = NewLease::Session { id: "s".into() };
        store.acquire_lease(id, &process(10), "t").unwrap();
        store.acquire_lease(id, &process(11), "t").unwrap();
        store.acquire_lease(id, &named, "t").unwrap();
        let gone = |pid: i64, _start: i64| pid == 10;
        assert_eq!(
            store.release_leases_of(id, true, &gone, "unmount").unwrap(),
            1
        );
        assert_eq!(store.leases().unwrap().len(), 3, "none released");
        let all_gone = |_: i64, _: i64| true;
        assert_eq!(
            store
                .release_leases_of(id, false, &all_gone, "unmount")
                .unwrap(),
            1,
            "the named lease is kept"
        );
        assert_eq!(store.leases().unwrap().len(), 3);
        assert_eq!(
            store
                .release_leases_of(id, true, &all_gone, "unmount")
                .unwrap(),
            0
        );
        assert!(store.leases().unwrap().is_empty());
        assert_eq!(state(&store), "lingering");
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

    /// The holders an Occupied refusal names.
    fn refused(r: Result<bool, LeaseError>) -> Vec<(String, Option<String>)> {
        match r {
            Err(LeaseError::Occupied(o)) => o
                .into_iter()
                .map(|o| (o.lease.holder, o.unchecked))
                .collect(),
            other => panic!("not refused for occupancy: {other:?}"),
        }
    }

    #[test]
    fn an_exclusive_lease_is_granted_only_while_nobody_else_holds_the_worktree() {
        let (_d, mut store, id) = store_with_worktree();
        let alive = |_: i64, _: i64| Liveness::Alive;
        let ask = |exclusive| Ask {
            exclusive,
            liveness: &alive,
        };
        let s = |n: &str| NewLease::Session { id: n.into() };
        let p = |pid: i32| NewLease::Process {
            pid,
            start: 7,
            command: format!("cmd {pid}"),
        };
        // A process lease (never refused) and a session's: an exclusive ask is refused,
        // naming both, oldest first.
        store.acquire_lease(id, &p(100), "t").unwrap();
        store.acquire_named(id, &s("a"), "t", &ask(false)).unwrap();
        assert_eq!(
            refused(store.acquire_named(id, &s("x"), "t", &ask(true))),
            vec![("pid:100:7".into(), None), ("session:a".into(), None)]
        );
        // The process gone (its lease not yet swept), or the asker's own ancestor: not
        // somebody else; `a` still is.
        let gone = |pid: i64, _: i64| {
            if pid == 100 {
                Liveness::Gone
            } else {
                Liveness::Alive
            }
        };
        let ours = |_: i64, _: i64| Liveness::Ours;
        for liveness in [&gone as &dyn Fn(i64, i64) -> Liveness, &ours] {
            let r = store.acquire_named(
                id,
                &s("x"),
                "t",
                &Ask {
                    exclusive: true,
                    liveness,
                },
            );
            assert_eq!(refused(r), vec![("session:a".into(), None)]);
        }
        // Liveness that cannot be told fails closed, saying why.
        let unknown = |_: i64, _: i64| Liveness::Unknown("EACCES".into());
        store
            .release_lease(id, &s("a").holder(), "released", "t")
            .unwrap();
        let r = store.acquire_named(
            id,
            &s("x"),
            "t",
            &Ask {
                exclusive: true,
                liveness: &unknown,
            },
        );
        assert_eq!(
            refused(r),
            vec![("pid:100:7".into(), Some("EACCES".into()))]
        );
        assert_eq!(store.leases().unwrap().len(), 1, "nothing recorded");
        // Granted once only the asker's own process holds it; then every other named
        // ask is refused, exclusive or not, and a process still enters.
        let r = store.acquire_named(
            id,
            &s("x"),
            "t",
            &Ask {
                exclusive: true,
                liveness: &ours,
            },
        );
        assert!(r.unwrap());
        assert_eq!(
            refused(store.acquire_named(id, &s("b"), "t", &ask(false))),
            vec![("session:x".into(), None)]
        );
        assert!(store.acquire_lease(id, &p(200), "t").unwrap());
        // Asking again is no change; the holder's own plain ask keeps it exclusive.
        assert!(!store.acquire_named(id, &s("x"), "t", &ask(true)).unwrap());
        assert!(!store.acquire_named(id, &s("x"), "t", &ask(false)).unwrap());
        let x = store
            .leases()
            .unwrap()
            .into_iter()
            .find(|l| l.holder == "session:x")
            .unwrap();
        assert!(x.exclusive);
        assert_eq!(x.last_active(), x.acquired_at);
        // Released, others may come again; a plain holder asking exclusive upgrades only
        // when alone.
        store
            .release_lease(id, &s("x").holder(), "released", "t")
            .unwrap();
        assert!(store.acquire_named(id, &s("b"), "t", &ask(false)).unwrap());
        let only_b = |_: i64, _: i64| Liveness::Gone;
        let r = store.acquire_named(
            id,
            &s("b"),
            "t",
            &Ask {
                exclusive: true,
                liveness: &only_b,
            },
        );
        assert!(!r.unwrap());
        assert!(store
            .leases()
            .unwrap()
            .into_iter()
            .any(|l| l.holder == "session:b" && l.exclusive));
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
