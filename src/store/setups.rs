//! Setup commands: a repository's (`repo add|set --on-create`), and each worktree's run of
//! it, from queued to its end (`lifecycle::setup` starts and watches the runs).

use rusqlite::{params, OptionalExtension};

use super::steps::{event, lease_count, release_in, set_state, state_of};
use super::{now_secs, Store, StoreResult};
use crate::ids::{RepoId, WorktreeId};
use crate::lease::State;

/// The commands a repository's worktrees run when made and before they are removed, as
/// whoever registered it gave them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoHooks {
    /// Run by `/bin/sh -c` in each new worktree, as its owner.
    pub on_create: Option<String>,
    /// Its time limit in seconds (None: the default).
    pub create_timeout: Option<u64>,
    /// Run by `/bin/sh -c` in a worktree found removable, before it goes, as its owner.
    pub on_remove: Option<String>,
    /// Its time limit in seconds (None: the default).
    pub remove_timeout: Option<u64>,
}

/// Where a worktree's run of its setup command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetupState {
    /// Queued: the daemon starts it (at once when mounted, else at the next mount).
    Pending,
    Running,
    Ok,
    Failed,
}

impl SetupState {
    pub const fn as_str(self) -> &'static str {
        match self {
            SetupState::Pending => "pending",
            SetupState::Running => "running",
            SetupState::Ok => "ok",
            SetupState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> SetupState {
        match s {
            "pending" => SetupState::Pending,
            "running" => SetupState::Running,
            "ok" => SetupState::Ok,
            // Anything else was written by no version of this code: a failure, shown.
            _ => SetupState::Failed,
        }
    }

    /// Not over yet: something waiting for the setup waits on.
    pub fn in_progress(self) -> bool {
        matches!(self, SetupState::Pending | SetupState::Running)
    }
}

/// A worktree's run of its setup command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupRow {
    pub worktree_id: WorktreeId,
    pub command: String,
    /// Its time limit in seconds.
    pub timeout: u64,
    pub state: SetupState,
    /// The command's exit code, once it exited.
    pub exit_code: Option<i32>,
    /// Why it failed when there is no exit code to say it (a signal, a timeout, a
    /// runner that died), or what it left.
    pub detail: Option<String>,
    /// The runner's process, while running.
    pub pid: Option<i32>,
    pub pid_start: Option<i64>,
    pub queued_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
}

impl SetupRow {
    /// One word or a few: `pending`, `running`, `ok`, `failed (exit 3)`, `failed (timed
    /// out after 30 s)`.
    pub fn summary(&self) -> String {
        match (self.state, self.exit_code, &self.detail) {
            (SetupState::Failed, Some(code), _) => format!("failed (exit {code})"),
            (SetupState::Failed, None, Some(why)) => format!("failed ({why})"),
            (state, _, _) => state.as_str().to_string(),
        }
    }
}

/// How a run of a setup command ended, as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupEnd {
    pub ok: bool,
    pub exit_code: Option<i32>,
    pub detail: Option<String>,
}

const SETUP_COLUMNS: &str = "worktree_id, command, timeout, state, exit_code, detail, pid, \
     pid_start, queued_at, started_at, ended_at";

fn setup_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SetupRow> {
    Ok(SetupRow {
        worktree_id: r.get(0)?,
        command: r.get(1)?,
        timeout: r.get::<_, i64>(2)?.max(0) as u64,
        state: SetupState::parse(&r.get::<_, String>(3)?),
        exit_code: r.get(4)?,
        detail: r.get(5)?,
        pid: r.get(6)?,
        pid_start: r.get(7)?,
        queued_at: r.get(8)?,
        started_at: r.get(9)?,
        ended_at: r.get(10)?,
    })
}

impl Store {
    /// Repository `id`'s setup command and its limit (none set: the default).
    pub fn hooks_of(&self, id: RepoId) -> StoreResult<RepoHooks> {
        Ok(self
            .conn
            .query_row(
                "SELECT on_create, create_timeout, on_remove, remove_timeout FROM repo_hooks
                 WHERE repo_id = ?1",
                [id],
                |r| {
                    let secs = |i| -> rusqlite::Result<Option<u64>> {
                        Ok(r.get::<_, Option<i64>>(i)?.map(|t| t.max(0) as u64))
                    };
                    Ok(RepoHooks {
                        on_create: r.get(0)?,
                        create_timeout: secs(1)?,
                        on_remove: r.get(2)?,
                        remove_timeout: secs(3)?,
                    })
                },
            )
            .optional()?
            .unwrap_or_default())
    }

    /// Replaces repository `id`'s setup command and its limit.
    pub fn set_hooks(&self, id: RepoId, hooks: &RepoHooks) -> StoreResult<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO repo_hooks(repo_id, on_create, create_timeout, on_remove,
                 remove_timeout)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                id,
                hooks.on_create,
                hooks.create_timeout.map(|t| t as i64),
                hooks.on_remove,
                hooks.remove_timeout.map(|t| t as i64)
            ],
        )?;
        Ok(())
    }

    /// Queues a run of `command` in worktree `id`, unless one is queued or running
    /// already (false then: that one stands).
    pub fn queue_setup(&self, id: WorktreeId, command: &str, timeout: u64) -> StoreResult<bool> {
        let n = self.conn.execute(
            "INSERT INTO setups(worktree_id, command, timeout, state, queued_at)
             VALUES (?1, ?2, ?3, 'pending', ?4)
             ON CONFLICT(worktree_id) DO UPDATE SET command = ?2, timeout = ?3,
                 state = 'pending', exit_code = NULL, detail = NULL, pid = NULL,
                 pid_start = NULL, after_event = NULL, queued_at = ?4, started_at = NULL,
                 ended_at = NULL
             WHERE setups.state NOT IN ('pending', 'running')",
            params![id, command, timeout as i64, now_secs()],
        )?;
        Ok(n == 1)
    }

    /// Worktree `id`'s run of its setup command, if it has had one.
    pub fn setup_of(&self, id: WorktreeId) -> StoreResult<Option<SetupRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {SETUP_COLUMNS} FROM setups WHERE worktree_id = ?1"),
                [id],
                setup_from_row,
            )
            .optional()?)
    }

    /// Every worktree's run, for a listing.
    pub fn setups(&self) -> StoreResult<Vec<SetupRow>> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {SETUP_COLUMNS} FROM setups"))?;
        let rows = stmt.query_map([], setup_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The queued runs, each marked running (its runner not yet known) as it is taken, at
    /// most so many that `most` run at once: the caller starts a runner for each. A run
    /// queued for a worktree that is going or gone fails instead, saying so. Reads only,
    /// when nothing is queued.
    pub fn take_pending_setups(&mut self, most: usize) -> StoreResult<Vec<SetupRow>> {
        let (queued, running): (i64, i64) = self.conn.query_row(
            "SELECT count(*) FILTER (WHERE state = 'pending'),
                    count(*) FILTER (WHERE state = 'running') FROM setups",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if queued == 0 || running as usize >= most {
            return Ok(Vec::new());
        }
        let room = most - running as usize;
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let pending: Vec<(SetupRow, String)> = {
            let mut stmt = tx.prepare(&format!(
                "SELECT {}, w.state FROM setups s JOIN worktrees w ON w.id = s.worktree_id
                 WHERE s.state = 'pending' ORDER BY s.queued_at",
                SETUP_COLUMNS
                    .split(", ")
                    .map(|c| format!("s.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))?;
            let rows = stmt.query_map([], |r| Ok((setup_from_row(r)?, r.get(11)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let now = now_secs();
        let mut taken = Vec::new();
        for (mut row, state) in pending {
            if matches!(State::parse(&state), Some(State::Deleting | State::Removed)) {
                tx.execute(
                    "UPDATE setups SET state = 'failed', detail = ?2, ended_at = ?3
                     WHERE worktree_id = ?1",
                    params![
                        row.worktree_id,
                        format!("not run: the worktree is {state}"),
                        now
                    ],
                )?;
                continue;
            }
            if taken.len() >= room {
                continue;
            }
            tx.execute(
                "UPDATE setups SET state = 'running', started_at = ?2 WHERE worktree_id = ?1",
                params![row.worktree_id, now],
            )?;
            row.state = SetupState::Running;
            row.started_at = Some(now);
            taken.push(row);
        }
        tx.commit()?;
        Ok(taken)
    }

    /// The runner of worktree `id`'s setup is process `pid` (started at `start`); told
    /// before it takes its lease, so what came before it (the worktree's state, its
    /// leases, the last event) is what its end compares with. False: the run has a
    /// runner already, or is not running (failed meanwhile): this one must not run it.
    pub fn setup_runner(&mut self, id: WorktreeId, pid: i32, start: u64) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let after: Option<i64> = tx.query_row("SELECT max(id) FROM events", [], |r| r.get(0))?;
        let state = state_of(&tx, id)?;
        let leases = lease_count(&tx, id)?;
        let recorded = tx.execute(
            "UPDATE setups SET pid = ?2, pid_start = ?3, after_event = ?4, prior_state = ?5,
                 prior_leases = ?6
             WHERE worktree_id = ?1 AND state = 'running' AND pid IS NULL",
            params![
                id,
                pid,
                start as i64,
                after.unwrap_or(0),
                state.as_str(),
                leases as i64
            ],
        )?;
        tx.commit()?;
        Ok(recorded == 1)
    }

    /// Worktree `id`'s setup ended as `end`; its runner's lease (`holder`) goes in the
    /// same transaction. Setup starts no cleanup of its own: when that lease was the last,
    /// the worktree was `ready` with no lease before the runner came, and nobody else took
    /// one while it ran, the worktree is `ready` again; otherwise the release is an
    /// ordinary one (the last lease of someone who came and went: `lingering`, as their
    /// leaving would have made it). Returns the worktree's state after.
    pub fn end_setup(
        &mut self,
        id: WorktreeId,
        holder: Option<&str>,
        end: &SetupEnd,
    ) -> StoreResult<State> {
        self.end_setup_leaving(id, holder, end, None)
    }

    /// [`Store::end_setup`], where the setup command left work cleanup would keep
    /// (`left`: the worktree's path and the reason): a worktree that would be `ready`
    /// again is `retained` with that reason instead.
    pub fn end_setup_leaving(
        &mut self,
        id: WorktreeId,
        holder: Option<&str>,
        end: &SetupEnd,
        left: Option<(&str, &str)>,
    ) -> StoreResult<State> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if let Some(holder) = holder {
            release_setup_lease(&tx, id, holder, "its setup ended", left)?;
        }
        tx.execute(
            "UPDATE setups SET state = ?2, exit_code = ?3, detail = ?4, ended_at = ?5,
                 pid = NULL, pid_start = NULL
             WHERE worktree_id = ?1",
            params![
                id,
                if end.ok { "ok" } else { "failed" },
                end.exit_code,
                end.detail,
                now_secs()
            ],
        )?;
        let state = state_of(&tx, id)?;
        tx.commit()?;
        Ok(state)
    }

    /// Runs marked running whose runner is gone (`gone` says of a pid and start time), or
    /// never came within `start_within` seconds: failed, saying so; a lease the runner
    /// left goes as an ordinary release. Returns the worktrees whose run ended.
    pub fn fail_orphaned_setups(
        &mut self,
        gone: &dyn Fn(i32, i64) -> bool,
        start_within: i64,
    ) -> StoreResult<Vec<WorktreeId>> {
        let running: Vec<SetupRow> = {
            let mut stmt = self.conn.prepare(&format!(
                "SELECT {SETUP_COLUMNS} FROM setups WHERE state = 'running'"
            ))?;
            let rows = stmt.query_map([], setup_from_row)?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let now = now_secs();
        let mut ended = Vec::new();
        for row in running {
            let why = match (row.pid, row.pid_start) {
                (Some(pid), Some(start)) if gone(pid, start) => {
                    format!("its runner, process {pid}, ended before it could say")
                }
                (None, _) if now - row.started_at.unwrap_or(now) > start_within => {
                    "its runner never started".to_string()
                }
                _ => continue,
            };
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            if let (Some(pid), Some(start)) = (row.pid, row.pid_start) {
                let holder = format!("pid:{pid}:{start}");
                release_setup_lease(&tx, row.worktree_id, &holder, &why, None)?;
            }
            tx.execute(
                "UPDATE setups SET state = 'failed', detail = ?2, ended_at = ?3, pid = NULL,
                     pid_start = NULL
                 WHERE worktree_id = ?1 AND state = 'running'",
                params![row.worktree_id, why, now],
            )?;
            tx.commit()?;
            ended.push(row.worktree_id);
        }
        Ok(ended)
    }
}

/// Releases the setup runner `holder`'s lease of worktree `id` (if it still has one) as
/// [`Store::end_setup_leaving`] says, in the caller's transaction.
fn release_setup_lease(
    tx: &rusqlite::Transaction<'_>,
    id: WorktreeId,
    holder: &str,
    reason: &str,
    left: Option<(&str, &str)>,
) -> rusqlite::Result<()> {
    let (after, prior_state, prior_leases): (Option<i64>, Option<String>, Option<i64>) = tx
        .query_row(
            "SELECT after_event, prior_state, prior_leases FROM setups WHERE worktree_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?
        .unwrap_or((None, None, None));
    let was_idle = prior_state.as_deref() == Some(State::Ready.as_str()) && prior_leases == Some(0);
    let others_came = match after {
        Some(after) => {
            tx.query_row(
                "SELECT count(*) FROM events WHERE worktree_id = ?1 AND kind = 'acquired'
                 AND holder != ?2 AND id > ?3",
                params![id, holder, after],
                |r| r.get::<_, i64>(0),
            )? > 0
        }
        None => true,
    };
    if !was_idle || others_came {
        release_in(tx, id, holder, "released", reason)?;
        return Ok(());
    }
    let was = state_of(tx, id)?;
    let gone = tx.execute(
        "DELETE FROM leases WHERE worktree_id = ?1 AND holder = ?2",
        params![id, holder],
    )? == 1;
    if gone {
        event(tx, id, "released", Some(holder), reason)?;
        if was == State::Active && lease_count(tx, id)? == 0 {
            match left {
                None => {
                    set_state(tx, id, State::Ready)?;
                    event(tx, id, "ready", None, "its setup's lease was the only one")?;
                }
                Some((path, why)) => super::cleanup::retain_in(
                    tx,
                    id,
                    path,
                    &format!("its setup command left work: {why}"),
                )?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewLease;

    fn setup() -> (tempfile::TempDir, Store, WorktreeId) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut store = store;
        let repo = store.add_repo("r", dir.path(), dir.path()).unwrap().id;
        let id = store
            .insert_worktree(&crate::store::NewWorktree {
                repo_id: repo,
                name: "w",
                branch: None,
                branch_created: false,
                base_commit: "c",
                base_tree: "t",
                base_mtime: 0,
                uid: 0,
                gid: 0,
                admin_name: "w",
                warm: None,
            })
            .unwrap();
        (dir, store, id)
    }

    fn lease(pid: i32) -> NewLease {
        NewLease::Process {
            pid,
            start: 7,
            command: "worktreefs setup".into(),
        }
    }

    /// A run queued, taken, held and ended leaves the worktree ready, not lingering; a
    /// second queue while one runs is refused, and one after it ended is taken.
    #[test]
    fn a_setup_leaves_its_worktree_ready_and_runs_one_at_a_time() {
        let (_d, mut store, id) = setup();
        assert!(store.queue_setup(id, "make deps", 60).unwrap());
        assert!(!store.queue_setup(id, "other", 60).unwrap());
        let taken = store.take_pending_setups(8).unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].command, "make deps");
        assert!(store.take_pending_setups(8).unwrap().is_empty());
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        assert!(!store.queue_setup(id, "other", 60).unwrap());
        let end = SetupEnd {
            ok: false,
            exit_code: Some(3),
            detail: None,
        };
        let after = store
            .end_setup(id, Some(&lease(10).holder()), &end)
            .unwrap();
        assert_eq!(after, State::Ready);
        let row = store.setup_of(id).unwrap().unwrap();
        assert_eq!(row.summary(), "failed (exit 3)");
        assert!(store.queue_setup(id, "again", 60).unwrap());
    }

    /// A setup that left work cleanup would keep: the worktree that would be ready again
    /// is retained with the reason instead; where someone came meanwhile, their leaving
    /// decides as before (the work is looked at when cleanup runs).
    #[test]
    fn a_setup_that_left_work_retains_the_worktree_it_would_make_ready() {
        let end = SetupEnd {
            ok: true,
            exit_code: Some(0),
            detail: None,
        };
        let left = Some(("/m/r/w", "uncommitted changes: README.md"));
        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        let after = store
            .end_setup_leaving(id, Some(&lease(10).holder()), &end, left)
            .unwrap();
        assert_eq!(after, State::Retained);
        let kept = store.retained().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].path, "/m/r/w");
        assert_eq!(
            kept[0].reason,
            "its setup command left work: uncommitted changes: README.md"
        );
        // Leasing it again makes it active, as any retained worktree.
        store.acquire_lease(id, &lease(12), "agent").unwrap();
        assert_eq!(
            store.worktree_by_id(id).unwrap().unwrap().state,
            State::Active
        );

        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        store.acquire_lease(id, &lease(11), "agent").unwrap();
        store
            .release_lease(id, &lease(11).holder(), "exited", "gone")
            .unwrap();
        let after = store
            .end_setup_leaving(id, Some(&lease(10).holder()), &end, left)
            .unwrap();
        assert_eq!(after, State::Lingering);
        assert!(store.retained().unwrap().is_empty());
    }

    /// Somebody who came and went while the setup ran: the worktree lingers after it, as
    /// their leaving would have made it.
    #[test]
    fn a_holder_that_came_during_the_setup_leaves_it_lingering() {
        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        store.acquire_lease(id, &lease(11), "agent").unwrap();
        store
            .release_lease(id, &lease(11).holder(), "exited", "gone")
            .unwrap();
        let end = SetupEnd {
            ok: true,
            exit_code: Some(0),
            detail: None,
        };
        let after = store
            .end_setup(id, Some(&lease(10).holder()), &end)
            .unwrap();
        assert_eq!(after, State::Lingering);
    }

    /// Somebody inside before the setup came (a shell that `cd`-ed in at once), or a
    /// worktree lingering or retained when its setup is run again: the setup's end is an
    /// ordinary release, and cleanup comes as it would have.
    #[test]
    fn a_worktree_that_was_not_idle_before_the_setup_is_not_made_ready_by_it() {
        let end = SetupEnd {
            ok: true,
            exit_code: Some(0),
            detail: None,
        };
        // A holder before the runner, gone while it ran.
        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.acquire_lease(id, &lease(11), "agent").unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        store
            .release_lease(id, &lease(11).holder(), "exited", "gone")
            .unwrap();
        let after = store
            .end_setup(id, Some(&lease(10).holder()), &end)
            .unwrap();
        assert_eq!(after, State::Lingering);
        // Run again on a lingering worktree.
        let (_d, mut store, id) = setup();
        store.acquire_lease(id, &lease(11), "agent").unwrap();
        store
            .release_lease(id, &lease(11).holder(), "exited", "gone")
            .unwrap();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        let after = store
            .end_setup(id, Some(&lease(10).holder()), &end)
            .unwrap();
        assert_eq!(after, State::Lingering);
    }

    /// No more runs start than may run at once; the rest wait their turn.
    #[test]
    fn runs_start_no_more_than_may_run_at_once() {
        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        assert!(store.take_pending_setups(0).unwrap().is_empty());
        assert_eq!(
            store.setup_of(id).unwrap().unwrap().state,
            SetupState::Pending
        );
        assert_eq!(store.take_pending_setups(1).unwrap().len(), 1);
    }

    /// A runner that died: its run fails saying so, and its lease goes.
    #[test]
    fn a_run_whose_runner_died_fails_and_its_lease_goes() {
        let (_d, mut store, id) = setup();
        store.queue_setup(id, "x", 60).unwrap();
        store.take_pending_setups(8).unwrap();
        store.setup_runner(id, 10, 7).unwrap();
        store.acquire_lease(id, &lease(10), "setup").unwrap();
        assert!(store
            .fail_orphaned_setups(&|_, _| false, 60)
            .unwrap()
            .is_empty());
        assert_eq!(
            store.fail_orphaned_setups(&|_, _| true, 60).unwrap(),
            vec![id]
        );
        let row = store.setup_of(id).unwrap().unwrap();
        assert_eq!(row.state, SetupState::Failed);
        assert!(
            row.summary().contains("ended before it could say"),
            "{}",
            row.summary()
        );
        assert!(store.leases().unwrap().is_empty());
    }
}
