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

/// How long past its command's limit a teardown's runner may take to end it and what it
/// left, before it is killed.
const RUNNER_GRACE: Duration = Duration::from_secs(15);

/// How long a queued run may wait for its runner to say who it is before it is failed.
const RUNNER_START_WITHIN: i64 = 60;

/// Queues worktree `row`'s run of its repository's setup command, if the repository has
/// one. Returns the run queued.
pub fn queue_for_new(store: &Store, row: &WorktreeRow) -> Option<SetupRow> {
    let hooks = store.hooks_of(row.repo_id).ok()?;
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

/// Where worktree `id`'s setup log is: `<state>/setup/<id>.log`.
pub fn log_path(state: &StateDir, id: WorktreeId) -> PathBuf {
    state.root.join("setup").join(format!("{id}.log"))
}

/// Reads worktree `id`'s setup log (empty when there is none yet).
pub fn read_log(state: &StateDir, id: WorktreeId) -> std::io::Result<Vec<u8>> {
    match fs::read(log_path(state, id)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        r => r,
    }
}

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
        let taken = match store.take_pending_setups() {
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
        tracing::info!(
            "{}/{}: setup started (runner {}): {}",
            row.repo,
            row.name,
            child.id(),
            run.command
        );
        let _ = std::thread::Builder::new()
            .name("setup-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            });
        Ok(())
    }

    /// The runner's command for worktree `row` (`mode`: `--runner`, `--teardown`), in a
    /// session of its own, its output going to the worktree's log (made anew when
    /// `fresh`, else appended to; owned by the worktree's owner, readable by them alone,
    /// never written through a link).
    fn command(&self, row: &WorktreeRow, mode: &str, fresh: bool) -> Result<Command, String> {
        let path = log_path(&self.state, row.id);
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
        // SAFETY: setsid(2) is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::setsid();
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Runs worktree `row`'s teardown command, if its repository has one, and waits for
    /// it: its runner's processes (and theirs) are let into the worktree while it is
    /// deleting ([`teardown_covers`]), nobody else is. Bounded by the command's limit
    /// (and `until`, when given) plus the runner's grace; a failure is logged and said in
    /// the worktree's log, never stops the removal. Returns how it ended, if it ran.
    pub fn tear_down(
        &self,
        store: &Store,
        row: &WorktreeRow,
        until: Option<Instant>,
    ) -> Option<String> {
        let hooks = store.hooks_of(row.repo_id).ok()?;
        let command = hooks.on_remove?;
        let label = format!("{}/{}", row.repo, row.name);
        let mut limit = Duration::from_secs(
            hooks
                .remove_timeout
                .unwrap_or(TEARDOWN_TIMEOUT.as_secs())
                .max(1),
        );
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
        let end = Instant::now() + limit + RUNNER_GRACE;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        drop(registered);
        let said = match status.and_then(|s| s.code()) {
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
                log_path(&self.state, row.id).display()
            );
        }
        Some(said)
    }
}

/// The teardowns running, by worktree: their runners' pids.
static TEARDOWNS: Mutex<Vec<(WorktreeId, i32)>> = Mutex::new(Vec::new());
/// How many are running: while none is, nothing is looked up.
static TEARDOWN_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A teardown's runner, registered for as long as this lives.
struct Registered(WorktreeId, i32);

impl Registered {
    fn new(id: WorktreeId, pid: i32) -> Registered {
        TEARDOWNS.lock().push((id, pid));
        TEARDOWN_COUNT.fetch_add(1, Ordering::SeqCst);
        Registered(id, pid)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        TEARDOWNS
            .lock()
            .retain(|&(id, pid)| (id, pid) != (self.0, self.1));
        TEARDOWN_COUNT.fetch_sub(1, Ordering::SeqCst);
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
