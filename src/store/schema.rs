//! The schema: every migration, in order, keyed by `PRAGMA user_version`.

/// Each entry moves the schema one version forward. Never edit a released entry; append.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // 3: a creation records what it is about to make before its first step, so one that
    // was killed half-way is rolled back. `worktree_id` is reserved for it.
    r#"
    CREATE TABLE creations (
        worktree_id INTEGER PRIMARY KEY,
        repo_id     INTEGER NOT NULL REFERENCES repos(id),
        name        TEXT NOT NULL,
        branch      TEXT,
        base_commit TEXT NOT NULL,
        admin_name  TEXT NOT NULL,
        pid         INTEGER NOT NULL,
        pid_start   INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        UNIQUE (repo_id, name),
        UNIQUE (repo_id, admin_name)
    );
    "#,
    // 4: every removal keeps what it removed for a while: the worktree's
    // directory under `<state>/removed/<id>` (upper layer, index, HEAD), its tip under a
    // ref of worktreefs's own; a restore is a creation that brings one back.
    r#"
    CREATE TABLE kept (
        worktree_id INTEGER PRIMARY KEY REFERENCES worktrees(id),
        kept_at     INTEGER NOT NULL,
        bytes       INTEGER NOT NULL,
        head        TEXT NOT NULL,
        tip         TEXT,
        tip_ref     TEXT,
        how         TEXT NOT NULL
    );
    ALTER TABLE creations ADD COLUMN restored_from INTEGER;
    "#,
    // 5: warm snapshots: what a repository's new worktrees inherit of its
    // source checkout's ignored and untracked files, the patterns that say which, and the
    // snapshot each worktree shows.
    r#"
    CREATE TABLE warm_snapshots (
        id        INTEGER PRIMARY KEY,
        repo_id   INTEGER NOT NULL REFERENCES repos(id),
        uid       INTEGER NOT NULL,
        taken_at  INTEGER NOT NULL,
        manifest  TEXT NOT NULL,
        files     INTEGER NOT NULL,
        bytes     INTEGER NOT NULL,
        took_ms   INTEGER NOT NULL,
        skipped   INTEGER NOT NULL
    );
    ALTER TABLE repos ADD COLUMN include TEXT NOT NULL DEFAULT '';
    ALTER TABLE repos ADD COLUMN warm_default INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE worktrees ADD COLUMN warm INTEGER;
    "#,
    // 6: exclusive leases: granted only while nobody else holds the worktree,
    // and refusing every other named lease while held; and each lease's last activity
    // (the last request the daemon saw from a process it covers).
    r#"
    ALTER TABLE leases ADD COLUMN exclusive INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE leases ADD COLUMN active_at INTEGER;
    "#,
    // 7: turns: at most one running turn per worktree among all its holders,
    // the session it is for, its process (pid and start time), its command, and whether
    // the filesystem refuses writes from outside its process tree, and whether it took its
    // session's lease (given back when it ends, however it ends).
    r#"
    CREATE TABLE turns (
        worktree_id INTEGER PRIMARY KEY REFERENCES worktrees(id),
        session     TEXT NOT NULL,
        pid         INTEGER NOT NULL,
        pid_start   INTEGER NOT NULL,
        command     TEXT NOT NULL,
        guard       INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        took_lease  INTEGER NOT NULL
    );
    "#,
    // 8: the reason the last session gave when it released its lease (`lease release
    // --reason`), shown with the retained entry.
    r#"
    ALTER TABLE worktrees ADD COLUMN holder_reason TEXT;
    "#,
    // 9: each worktree's block of ports (its first port and how many), given to what
    // runs inside; kept while the worktree lives, free again once it is removed.
    r#"
    CREATE TABLE ports (
        worktree_id INTEGER PRIMARY KEY REFERENCES worktrees(id),
        first       INTEGER NOT NULL,
        size        INTEGER NOT NULL
    );
    "#,
    // 10: a repository's setup command (run in each new worktree) and its teardown
    // command (run before each removal), with their time limits, as whoever registered it
    // gave them; and each worktree's run of its setup: pending until the daemon starts
    // it, running (the runner's pid and start time; the last event, the worktree's state
    // and its lease count before the runner's lease), then ok or failed (its exit code,
    // or why).
    r#"
    CREATE TABLE repo_hooks (
        repo_id         INTEGER PRIMARY KEY REFERENCES repos(id),
        on_create       TEXT,
        create_timeout  INTEGER,
        on_remove       TEXT,
        remove_timeout  INTEGER
    );
    CREATE TABLE setups (
        worktree_id INTEGER PRIMARY KEY REFERENCES worktrees(id),
        command     TEXT NOT NULL,
        timeout     INTEGER NOT NULL,
        state       TEXT NOT NULL,
        exit_code   INTEGER,
        detail      TEXT,
        pid         INTEGER,
        pid_start   INTEGER,
        after_event INTEGER,
        prior_state TEXT,
        prior_leases INTEGER,
        queued_at   INTEGER NOT NULL,
        started_at  INTEGER,
        ended_at    INTEGER
    );
    "#,
];
