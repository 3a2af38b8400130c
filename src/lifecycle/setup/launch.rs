//! Starting runners: a setup runner for each queued run, reaped and watched by a thread
//! of its own; a teardown runner, waited for, with the worktree's HEAD read before and
//! after; and the end of what a runner's session left.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ids::WorktreeId;
use crate::state::StateDir;
use crate::store::{SetupRow, Store, WorktreeRow};

use super::limits::{teardown_limit, HEAD_LIMIT, MAX_RUNNING, RUNNER_GRACE, SETUP_GRACE};
use super::log::log_path;
use super::runners::Runners;

/// What the daemon starts runners with.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program to run as `PROGRAM --state-dir S setup --runner REPO/WT` (the daemon's
    /// own: `/proc/self/exe`, which stays the running program even when its file was
    /// replaced since).
    pub program: PathBuf,
    pub state: StateDir,
    /// Where each runner started is registered while it runs.
    pub runners: Runners,
}

impl Launcher {
    /// Starts a runner for each queued run. Each writes to its worktree's log (owned by
    /// the worktree's owner, readable by them alone), in a session of its own, and is
    /// reaped by a thread here. Returns how many were started.
    pub fn start_pending(&self, store: &mut Store) -> usize {
        let taken = match store.take_pending_setups(MAX_RUNNING) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("reading the queued setups: {e}");
                return 0;
            }
        };
        let mut started = 0;
        for run in taken {
            match self.start(store, &run) {
                Ok(()) => started += 1,
                Err(why) => {
                    tracing::warn!(
                        "the setup of worktree {} did not start: {why}",
                        run.worktree_id
                    );
                    let _ = store.end_setup(
                        run.worktree_id,
                        None,
                        &crate::store::SetupEnd {
                            ok: false,
                            exit_code: None,
                            detail: Some(format!("not started: {why}")),
                        },
                    );
                }
            }
        }
        started
    }

    fn start(&self, store: &Store, run: &SetupRow) -> Result<(), String> {
        let row = store
            .worktree_by_id(run.worktree_id)
            .map_err(|e| e.to_string())?
            .ok_or("its worktree is gone")?;
        // A log left by an earlier run is replaced.
        let mut child = self
            .command(&row, "--runner", true)?
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
        let pid = child.id() as i32;
        tracing::info!(
            "{}/{}: setup started (runner {pid}): {}",
            row.repo,
            row.name,
            run.command
        );
        // While it runs its lease is passed on to nobody when it exits: its end is
        // `end_setup`'s, written by it, or by `watch_runner` when it dies first.
        let registered = self.runners.setup(row.id, pid);
        let state = self.state.clone();
        let limit = Duration::from_secs(run.timeout) + SETUP_GRACE;
        let _ = std::thread::Builder::new()
            .name("setup-reaper".into())
            .spawn(move || {
                watch_runner(&state, &row, &mut child, limit);
                drop(registered);
            });
        Ok(())
    }

    /// The runner's command for worktree `row` (`mode`: `--runner`, `--teardown`), in a
    /// session of its own, its output going to the worktree's log (made anew when
    /// `fresh`, else appended to; owned by the worktree's owner, readable by them alone,
    /// never written through a link).
    fn command(&self, row: &WorktreeRow, mode: &str, fresh: bool) -> Result<Command, String> {
        let path = log_path(&self.state, row);
        let dir = path.parent().expect("a log has a directory");
        fs::create_dir_all(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        if fresh {
            let _ = fs::remove_file(&path);
        }
        let log = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        let _ = std::os::unix::fs::fchown(&log, Some(row.uid), Some(row.gid));
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.program);
        cmd.arg("--state-dir")
            .arg(&self.state.root)
            .arg("setup")
            .arg(mode)
            .arg(format!("{}/{}", row.repo, row.name))
            .current_dir("/")
            .stdout(log)
            .stderr(err)
            .env_remove("RUST_LOG");
        // SAFETY: setsid(2) and close_range(2) are async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::setsid();
                // Nothing of the daemon's but the log and the runner's pipe reaches it: a
                // descriptor the daemon holds without close-on-exec (its own, or one it
                // was started with) would be the owner's command's to use. Marked
                // close-on-exec, not closed: the pipe that reports a failed exec stays.
                const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Runs worktree `row`'s teardown command, if its repository has one, and waits for
    /// it: its runner's processes (and theirs) are let into the worktree while it is
    /// deleting ([`Runners::teardown_covers`]), nobody else is. Bounded by the command's limit
    /// (and `until`, when given) plus the runner's grace; a failure is logged and said in
    /// the worktree's log, never stops the removal. Err: the command moved the worktree's
    /// HEAD or its branch (a commit made then was never inspected): the removal must not
    /// go on; why.
    pub fn tear_down(
        &self,
        store: &Store,
        row: &WorktreeRow,
        until: Option<Instant>,
    ) -> Result<(), String> {
        let Some(command) = store.hooks_of(row.repo_id).ok().and_then(|h| h.on_remove) else {
            return Ok(());
        };
        let gitdir = store
            .repo_by_id(row.repo_id)
            .ok()
            .flatten()
            .map(|r| r.gitdir);
        let before = head_bounded(row, gitdir.clone())?;
        self.run_teardown(store, row, &command, until);
        let after = head_bounded(row, gitdir)?;
        if before != after {
            let why = format!(
                "its teardown command moved HEAD or its branch ({} -> {}): what it did there was never inspected",
                before.map_or_else(|| "unknown".into(), |h| h.to_string()),
                after.map_or_else(|| "unknown".into(), |h| h.to_string())
            );
            tracing::warn!("{}/{}: kept: {why}", row.repo, row.name);
            return Err(why);
        }
        Ok(())
    }

    /// Runs `command`, worktree `row`'s teardown, and waits for it (see `tear_down`).
    fn run_teardown(
        &self,
        store: &Store,
        row: &WorktreeRow,
        command: &str,
        until: Option<Instant>,
    ) -> Option<String> {
        let hooks = store.hooks_of(row.repo_id).ok()?;
        let label = format!("{}/{}", row.repo, row.name);
        let mut limit = teardown_limit(&hooks);
        if let Some(until) = until {
            limit = limit.min(until.saturating_duration_since(Instant::now()));
        }
        let spawned = self.command(row, "--teardown", false).and_then(|mut cmd| {
            cmd.arg("--limit")
                .arg(limit.as_secs().max(1).to_string())
                .stdin(Stdio::piped())
                .spawn()
                .map_err(|e| format!("starting {}: {e}", self.program.display()))
        });
        let mut child = match spawned {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!("{label}: its teardown `{command}` did not start: {why}");
                return Some(format!("not started: {why}"));
            }
        };
        let pid = child.id() as i32;
        let registered = self.runners.teardown(row.id, pid);
        // Let in before it goes: the runner waits for this word before it enters.
        if let Some(mut go) = child.stdin.take() {
            let _ = go.write_all(b"go\n");
        }
        tracing::info!("{label}: teardown started (runner {pid}): {command}");
        let (status, in_time) = wait_runner(&mut child, limit + RUNNER_GRACE);
        drop(registered);
        let said = match status.filter(|_| in_time).and_then(|s| s.code()) {
            Some(0) => "ok".to_string(),
            Some(code) => format!("failed (exit {code})"),
            None => format!(
                "failed (its runner was ended after {} s)",
                (limit + RUNNER_GRACE).as_secs()
            ),
        };
        if said == "ok" {
            tracing::info!("{label}: teardown ok");
        } else {
            tracing::warn!(
                "{label}: teardown `{command}` {said}; the removal goes on (its output: {})",
                log_path(&self.state, row).display()
            );
        }
        Some(said)
    }
}

/// The commit worktree `row`'s HEAD is at, read on a thread of its own for at most
/// [`HEAD_LIMIT`] (libgit2 waits for good on a FIFO where a ref was, which the teardown,
/// run as the repository's owner, may have put there; one blocked read per worktree at
/// most). Err when it could not be read in time: the removal must not go on.
fn head_bounded(row: &WorktreeRow, gitdir: Option<PathBuf>) -> Result<Option<git2::Oid>, String> {
    use crate::bounded::{Bounded, Gate};
    static GATE: Gate<WorktreeId> = Gate::new();
    let admin = row.admin_name.clone();
    match GATE.run(row.id, format!("head-{}", row.id), HEAD_LIMIT, move || {
        gitdir
            .as_deref()
            .and_then(|g| crate::git::admin::head_and_tip(g, &admin))
    }) {
        Bounded::Done(head) => Ok(head),
        _ => Err(format!(
            "its HEAD could not be read within {} s around its teardown (a FIFO where a ref was, or a filesystem that hangs?): what the teardown did was never inspected",
            HEAD_LIMIT.as_secs()
        )),
    }
}

/// Waits for setup runner `child` of worktree `row`; past `limit` (its command's limit and
/// a grace) its session is killed. What is left of its session is killed when it ends;
/// when it ended without recording its end (killed, or the store refused it), its run is
/// failed here and its lease released as its own end would have.
fn watch_runner(
    state: &StateDir,
    row: &WorktreeRow,
    child: &mut std::process::Child,
    limit: Duration,
) {
    let pid = child.id() as i32;
    let (status, in_time) = wait_runner(child, limit);
    if !in_time {
        tracing::warn!(
            "{}/{}: setup runner {pid} was still there {} s past its limit: its session was ended",
            row.repo,
            row.name,
            SETUP_GRACE.as_secs()
        );
    }
    let Ok(mut store) = Store::open(&state.root) else {
        return;
    };
    let Some(run) = store.setup_of(row.id).ok().flatten() else {
        return;
    };
    if run.state != crate::store::SetupState::Running || run.pid != Some(pid) {
        return;
    }
    let why = match status {
        Some(s) => format!("its runner ended ({s}) before it could say"),
        None => "its runner could not be waited for".to_string(),
    };
    tracing::warn!("{}/{}: setup failed: {why}", row.repo, row.name);
    let holder = run.pid_start.map(|start| format!("pid:{pid}:{start}"));
    let _ = store.end_setup(
        row.id,
        holder.as_deref(),
        &crate::store::SetupEnd {
            ok: false,
            exit_code: None,
            detail: Some(why),
        },
    );
}

/// Waits for runner `child` for at most `limit`, unreaped until what is left of its
/// session has been killed (its session's id, its own pid, cannot be given to another
/// process before it is reaped); past the limit its session is killed first. Returns how
/// it ended, and whether it ended within the limit.
fn wait_runner(
    child: &mut std::process::Child,
    limit: Duration,
) -> (Option<std::process::ExitStatus>, bool) {
    let pid = child.id() as i32;
    let until = Instant::now() + limit;
    let mut in_time = true;
    loop {
        if crate::process::unreaped::has_exited(pid) {
            break;
        }
        if Instant::now() >= until {
            in_time = false;
            kill_session(pid);
            crate::process::unreaped::until_exited(pid);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_session(pid);
    (child.wait().ok(), in_time)
}

/// SIGKILL to every process of session `sid` (a runner's: its id is the runner's pid,
/// kept from reuse while the runner is unreaped): its process group, and each process of
/// the session in another group (found in `/proc`, each signalled through a pidfd opened
/// before its session is checked again). A process that left the session (`setsid`)
/// is not found: as with a turn whose command was killed outright.
fn kill_session(sid: i32) {
    // SAFETY: kill(2) of the process group a runner of this daemon made.
    unsafe { libc::kill(-sid, libc::SIGKILL) };
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let session_of = |pid: i32| crate::process::info::proc_info(pid).map(|p| p.session);
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid == sid || session_of(pid) != Some(sid) {
            continue;
        }
        if let Some(fd) = crate::process::pidfd::pidfd_open(pid) {
            if session_of(pid) == Some(sid) {
                let _ = crate::process::pidfd::pidfd_signal(&fd, libc::SIGKILL);
            }
        }
    }
}
