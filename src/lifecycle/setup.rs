//! Setup and teardown commands: the repository's `on-create` command run in each new
//! worktree and its `on-remove` command run before each removal, as the worktree's owner,
//! by a runner process the daemon starts (`worktreefs setup --runner` or `--teardown`,
//! which runs it as a turn's command is run: bounded in time, its process tree ended).
//! Here: queuing a run, starting runners for queued runs, failing runs whose runner
//! died, a teardown run and waited for (its processes let into a worktree that is
//! deleting, nobody else's), the owner's environment, and where each run's log is.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ids::WorktreeId;
use crate::state::StateDir;
use crate::store::{SetupRow, Store, WorktreeRow};

/// How long a setup command may run when its repository sets no limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long a teardown command may run when its repository sets no limit.
pub const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a repository's teardown command may run: its own limit, else
/// [`TEARDOWN_TIMEOUT`].
pub fn teardown_limit(hooks: &crate::store::RepoHooks) -> Duration {
    Duration::from_secs(
        hooks
            .remove_timeout
            .unwrap_or(TEARDOWN_TIMEOUT.as_secs())
            .max(1),
    )
}

/// How long past its command's limit a teardown's runner may take to end it and what it
/// left, before it is killed.
const RUNNER_GRACE: Duration = Duration::from_secs(15);

/// How long a queued run may wait for its runner to say who it is before it is failed.
const RUNNER_START_WITHIN: i64 = 60;

/// Queues worktree `row`'s run of its repository's setup command, if the repository has
/// one. Returns the run queued.
pub fn queue_for_new(store: &Store, row: &WorktreeRow) -> Option<SetupRow> {
    let hooks = match store.hooks_of(row.repo_id) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                "{}/{}: its repository's setup command could not be read, so none runs: {e}",
                row.repo,
                row.name
            );
            return None;
        }
    };
    let command = hooks.on_create?;
    let timeout = hooks.create_timeout.unwrap_or(DEFAULT_TIMEOUT.as_secs());
    match store.queue_setup(row.id, &command, timeout) {
        Ok(_) => store.setup_of(row.id).ok().flatten(),
        Err(e) => {
            tracing::warn!(
                "{}/{}: its setup could not be queued: {e}",
                row.repo,
                row.name
            );
            None
        }
    }
}

/// Where worktree `row`'s setup log is: `<state>/setup/<id>-<made at>.log` (an id a
/// worktree made later may be given again; its time is its own).
pub fn log_path(state: &StateDir, row: &WorktreeRow) -> PathBuf {
    log_at(state, row.id, row.created_at)
}

fn log_at(state: &StateDir, id: WorktreeId, created_at: i64) -> PathBuf {
    state
        .root
        .join("setup")
        .join(format!("{id}-{created_at}.log"))
}

/// The most of a setup log kept: past it, what the command prints is counted, not kept.
pub const LOG_LIMIT: u64 = 16 << 20;

/// The most of a log read at once (`.control/setup-log`, `setup-log`): its end.
pub const READ_LIMIT: u64 = 1 << 20;

/// Reads the end of worktree `row`'s setup log, at most [`READ_LIMIT`] bytes of it (a line
/// before them says how much comes before, and where); empty when there is none yet.
pub fn read_log(state: &StateDir, row: &WorktreeRow) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let path = log_path(state, row);
    let mut f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r?,
    };
    let len = f.metadata()?.len();
    let mut out = Vec::new();
    if len > READ_LIMIT {
        out.extend_from_slice(
            format!(
                "[worktreefs: the first {} bytes of this log are only in {}]\n",
                len - READ_LIMIT,
                path.display()
            )
            .as_bytes(),
        );
        f.seek(SeekFrom::Start(len - READ_LIMIT))?;
    }
    f.take(READ_LIMIT).read_to_end(&mut out)?;
    Ok(out)
}

/// Removes the setup log of worktree `id` made at `created_at` (its row goes).
pub fn remove_log(state: &StateDir, id: WorktreeId, created_at: i64) {
    let _ = fs::remove_file(log_at(state, id, created_at));
}

/// How many setup runs may run at once; the rest wait their turn, queued.
const MAX_RUNNING: usize = 8;

/// How long past its limit a setup runner may take to end its command (and to inspect
/// the worktree before and after it, [`LEFT_WORK_LIMIT`] each) before the daemon ends
/// its session.
const SETUP_GRACE: Duration = Duration::from_secs(60);

/// How long each of a setup runner's inspections of what the worktree holds may take
/// (twice this and the time to end the command stay within [`SETUP_GRACE`]).
pub const LEFT_WORK_LIMIT: Duration = Duration::from_secs(20);

/// What the daemon starts runners with.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program to run as `PROGRAM --state-dir S setup --runner REPO/WT` (the daemon's
    /// own: `/proc/self/exe`, which stays the running program even when its file was
    /// replaced since).
    pub program: PathBuf,
    pub state: StateDir,
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
        let registered = Registered::runner(row.id, pid);
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
    /// deleting ([`teardown_covers`]), nobody else is. Bounded by the command's limit
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
        let registered = Registered::new(row.id, pid);
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

/// How long reading a worktree's HEAD may take around its teardown.
const HEAD_LIMIT: Duration = Duration::from_secs(5);

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

/// The teardowns running, by worktree: their runners' pids.
static TEARDOWNS: Mutex<Vec<(WorktreeId, i32)>> = Mutex::new(Vec::new());
/// How many are running: while none is, nothing is looked up.
static TEARDOWN_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The setup runners running, by worktree.
static RUNNERS: Mutex<Vec<(WorktreeId, i32)>> = Mutex::new(Vec::new());

/// A runner, registered for as long as this lives: a teardown's, or a setup's.
struct Registered {
    key: (WorktreeId, i32),
    teardown: bool,
}

impl Registered {
    fn new(id: WorktreeId, pid: i32) -> Registered {
        TEARDOWNS.lock().push((id, pid));
        TEARDOWN_COUNT.fetch_add(1, Ordering::SeqCst);
        Registered {
            key: (id, pid),
            teardown: true,
        }
    }

    fn runner(id: WorktreeId, pid: i32) -> Registered {
        RUNNERS.lock().push((id, pid));
        Registered {
            key: (id, pid),
            teardown: false,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let key = self.key;
        if self.teardown {
            TEARDOWNS.lock().retain(|&k| k != key);
            TEARDOWN_COUNT.fetch_sub(1, Ordering::SeqCst);
        } else {
            RUNNERS.lock().retain(|&k| k != key);
        }
    }
}

/// Whether process `pid` is worktree `id`'s setup runner: its lease is never passed on to
/// a process still inside when it exits (what it left there is its setup's, ended with
/// it), and its end is the setup's.
pub fn is_setup_runner(id: WorktreeId, pid: i32) -> bool {
    RUNNERS.lock().contains(&(id, pid))
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
    let session_of = |pid: i32| -> Option<i32> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's `)`: state, ppid, pgrp, session.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(3)?
            .parse()
            .ok()
    };
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

/// Whether worktree `id` is running its teardown now (its directory is then served to
/// the teardown's processes though it is deleting).
pub fn tearing_down(id: WorktreeId) -> bool {
    TEARDOWN_COUNT.load(Ordering::SeqCst) > 0 && TEARDOWNS.lock().iter().any(|&(w, _)| w == id)
}

/// Whether process `pid` is worktree `id`'s teardown runner or below it (looked up through
/// `/proc`, at most 32 parents up): such a process works in the worktree without a lease.
pub fn teardown_covers(id: WorktreeId, pid: i32) -> bool {
    if TEARDOWN_COUNT.load(Ordering::SeqCst) == 0 {
        return false;
    }
    let runners: Vec<i32> = TEARDOWNS
        .lock()
        .iter()
        .filter(|&&(w, _)| w == id)
        .map(|&(_, p)| p)
        .collect();
    let mut p = pid;
    for _ in 0..32 {
        if runners.contains(&p) {
            return true;
        }
        match crate::process::info::proc_info(p) {
            Some(info) if info.ppid > 1 => p = info.ppid,
            _ => return false,
        }
    }
    false
}

/// Fails the runs whose runner died without ending them (killed, the machine restarted)
/// or never came. Returns how many.
pub fn fail_orphaned(store: &mut Store) -> usize {
    let gone = |pid: i32, start: i64| {
        crate::process::info::liveness(pid as i64, start) == crate::process::info::Liveness::Gone
    };
    match store.fail_orphaned_setups(&gone, RUNNER_START_WITHIN) {
        Ok(ended) => {
            for id in &ended {
                tracing::warn!("the setup of worktree {id} failed: its runner is gone");
            }
            ended.len()
        }
        Err(e) => {
            tracing::warn!("looking for setups whose runner is gone: {e}");
            0
        }
    }
}

/// The environment a setup command starts with: the owner's, not the daemon's. `HOME`,
/// `SHELL`, `USER` and `LOGNAME` from the password database, the plain assignments of
/// `/etc/environment` (as pam_env reads them at a login; `PATH` from there, else the
/// usual one), and nothing else of this process's.
pub fn owner_environment(uid: u32) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: &str, v: String| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    };
    if let Ok(text) = fs::read_to_string("/etc/environment") {
        for (k, v) in parse_environment(&text) {
            set(&mut env, &k, v);
        }
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        set(
            &mut env,
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        );
    }
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => {
            set(&mut env, "HOME", u.dir.display().to_string());
            set(&mut env, "SHELL", u.shell.display().to_string());
            set(&mut env, "USER", u.name.clone());
            set(&mut env, "LOGNAME", u.name);
        }
        _ => set(&mut env, "HOME", "/".into()),
    }
    env
}

/// `/etc/environment`'s assignments: `KEY=VALUE` lines, a value optionally in quotes;
/// comments, blank lines and anything else (no shell runs it) skipped.
fn parse_environment(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("export ").unwrap_or(line);
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            let valid = !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return None;
            }
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_environment_is_read_as_pam_env_reads_it() {
        let text = "# a comment\nPATH=\"/opt/bin:/usr/bin\"\nLANG=C.UTF-8\nexport EDITOR='vi'\n1BAD=x\nnot a line\nA-B=c\n";
        assert_eq!(
            parse_environment(text),
            vec![
                ("PATH".to_string(), "/opt/bin:/usr/bin".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("EDITOR".to_string(), "vi".to_string()),
            ]
        );
    }

    #[test]
    fn the_owners_environment_names_their_home_and_nothing_of_ours() {
        let env = owner_environment(0);
        assert!(
            env.iter().any(|(k, v)| k == "HOME" && v == "/root"),
            "{env:?}"
        );
        assert!(env.iter().any(|(k, _)| k == "PATH"));
        // This process's own variables are not passed on.
        assert!(!env.iter().any(|(k, _)| k == "CARGO_PKG_NAME"), "{env:?}");
    }
}
