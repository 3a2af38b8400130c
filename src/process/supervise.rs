//! Running a command below this process, as system(3) does, for `run` and `turn`: it
//! runs in a directory this process enters first, signals meant for it reach it, and a
//! turn's command ends with its turn (a timeout, a parent that dies, what it left
//! running).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use super::tree;

/// Why a command could not be run or waited for.
#[derive(Debug)]
pub enum RunError {
    /// `dir` could not be entered.
    Enter(PathBuf, std::io::Error),
    /// The thread that keeps a turn's timeout could not be started; nothing was started.
    Timer(std::io::Error),
    /// The command could not be started: not found, or not executable.
    Spawn {
        program: String,
        error: std::io::Error,
    },
    /// Waiting for it failed.
    Wait {
        program: String,
        error: std::io::Error,
    },
}

impl RunError {
    /// What a shell exits with for a command it could not start: 127 not found, 126
    /// not executable; None for the other failures.
    pub fn shell_code(&self) -> Option<u8> {
        match self {
            RunError::Spawn { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                Some(127)
            }
            RunError::Spawn { .. } => Some(126),
            _ => None,
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Enter(dir, e) => write!(f, "entering {}: {e}", dir.display()),
            RunError::Timer(e) => {
                write!(f, "starting the timeout's thread: {e}; nothing was started")
            }
            RunError::Spawn { program, error } => write!(
                f,
                "starting {program}: {error}: exit {}",
                self.shell_code().unwrap_or(126)
            ),
            RunError::Wait { program, error } => write!(f, "waiting for {program}: {error}"),
        }
    }
}

impl std::error::Error for RunError {}

/// How [`run_below`] runs its command.
#[derive(Debug, Clone, Copy)]
pub enum Below {
    /// `run`: the command is this process's child, and nothing more.
    Run,
    /// `turn`: the command dies with this process, what it leaves running is ended after
    /// it, and with a limit it is ended once it has run that long.
    Turn { limit: Option<Duration> },
}

/// Runs `command` in `dir` and waits for it, as system(3) does: a Ctrl-C at the terminal
/// reaches the command and this process lives to release what it took; a SIGTERM or
/// SIGHUP sent to this process is passed on to the command (unless this process was
/// started ignoring it, as under `nohup`: then the command ignores it too). `turn`: the
/// command is killed if this process dies first (a turn's command never outlives its
/// turn), and what it leaves running stays in this process's tree (a subreaper) while it
/// runs; with a limit, the command and what runs below it get SIGTERM once it has run
/// that long and SIGKILL [`tree::KILL_AFTER`] later if it is still there. A command that
/// cannot be started is [`RunError::Spawn`] (a shell's 127 or 126).
///
/// This process enters `dir` (its working directory stays there) and reads its `.git`:
/// inside a worktree of the mount, that makes it a lease holder for as long as it lives.
pub fn run_below(
    dir: &Path,
    command: &[String],
    env: &[(String, String)],
    how: Below,
) -> Result<Ended, RunError> {
    run_below_as(dir, command, env, how, None)
}

/// Who a command run by [`run_below_as`] runs as.
#[derive(Debug, Clone)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

impl RunAs {
    /// User `uid` with primary group `gid` and the groups the group database gives them
    /// (none when it does not know them).
    pub fn user(uid: u32, gid: u32) -> RunAs {
        let groups = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .and_then(|u| {
                let name = std::ffi::CString::new(u.name).ok()?;
                nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid)).ok()
            })
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![gid]);
        RunAs { uid, gid, groups }
    }
}

/// As [`run_below`]; with `who`, the command runs as that user with `env` as its whole
/// environment (nothing of this process's), and this process stays who it is.
pub fn run_below_as(
    dir: &Path,
    command: &[String],
    env: &[(String, String)],
    how: Below,
    who: Option<&RunAs>,
) -> Result<Ended, RunError> {
    let (turn, limit) = match how {
        Below::Run => (false, None),
        Below::Turn { limit } => (true, limit),
    };
    std::env::set_current_dir(dir).map_err(|e| RunError::Enter(dir.to_path_buf(), e))?;
    let _ = fs::metadata(".git").and_then(|_| fs::read(".git"));
    // SAFETY: signal(2) and sigaction queries; the handler only loads an atomic and calls
    // kill(2), and the pre_exec closure only calls setgroups(2), setgid(2), setuid(2),
    // signal(2), prctl(2) and getppid(2), all async-signal-safe.
    let ignored = |sig| unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    };
    let forward: Vec<libc::c_int> = [libc::SIGTERM, libc::SIGHUP]
        .into_iter()
        .filter(|s| !ignored(*s))
        .collect();
    let old = unsafe {
        (
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        )
    };
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    if who.is_some() {
        cmd.env_clear();
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let restore = forward.clone();
    // Another user's identity, taken in the child before it runs the command (groups
    // first: once the user is not root, it cannot change them). None when it is this
    // process's own.
    let identity = who
        .filter(|w| w.uid != nix::unistd::geteuid().as_raw())
        .map(|w| {
            (
                w.uid,
                w.gid,
                w.groups
                    .iter()
                    .map(|g| *g as libc::gid_t)
                    .collect::<Vec<_>>(),
            )
        });
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if let Some((uid, gid, groups)) = &identity {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(*gid) != 0
                    || libc::setuid(*uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::signal(libc::SIGINT, old.0);
            libc::signal(libc::SIGQUIT, old.1);
            for s in &restore {
                libc::signal(*s, libc::SIG_DFL);
            }
            if turn {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
    if turn {
        // SAFETY: plain prctl on this process.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    }
    let restore_all = || unsafe {
        libc::signal(libc::SIGINT, old.0);
        libc::signal(libc::SIGQUIT, old.1);
    };
    // The timeout's thread before the command: a timeout that could not be kept (no
    // thread to be had) starts nothing.
    let timer = match turn.then(|| tree::Timer::new(limit)).transpose() {
        Ok(t) => t,
        Err(e) => {
            restore_all();
            return Err(RunError::Timer(e));
        }
    };
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            if let Some(t) = timer {
                t.stop();
            }
            restore_all();
            return Err(RunError::Spawn {
                program: command[0].clone(),
                error: e,
            });
        }
    };
    let pid = child.id() as libc::pid_t;
    FORWARD_TO.store(pid, Ordering::SeqCst);
    if turn {
        // A pidfd for each process of a large tree at its end: this process's own
        // descriptor limit raised to its hard one (the command kept the limit it had).
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            if soft < hard {
                let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            }
        }
    }
    if let Some(t) = &timer {
        t.started(pid, &FORWARD_TO);
    }
    let mut before = Vec::new();
    for s in &forward {
        // SAFETY: installing a handler that is async-signal-safe (see above).
        before.push((*s, unsafe {
            libc::signal(*s, forward_signal as *const () as libc::sighandler_t)
        }));
    }
    let status = wait_for(pid, turn);
    let ended_with = timer.and_then(tree::Timer::stop);
    if turn {
        // What the command left running (adopted here) ends with the turn.
        let left = tree::end_all(Duration::from_secs(2), Duration::from_secs(5));
        if !left.is_empty() {
            eprintln!(
                "worktreefs: processes the turn's command left running could not all be ended: {}",
                left.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    for (s, h) in before {
        // SAFETY: putting back the disposition found.
        unsafe { libc::signal(s, h) };
    }
    restore_all();
    drop(child);
    let status = status.map_err(|error| RunError::Wait {
        program: command[0].clone(),
        error,
    })?;
    Ok(Ended { status, ended_with })
}

/// How a command run by [`run_below`] ended.
#[derive(Debug)]
pub struct Ended {
    pub status: std::process::ExitStatus,
    /// The signal its timeout sent last (SIGTERM, or SIGKILL after it), if it ran past it.
    pub ended_with: Option<libc::c_int>,
}

/// Waits for child `pid` to exit; stops passing signals on to it before it is reaped (so
/// none reaches a process that reused its pid); with `reap_others`, reaps every other
/// child that ends meanwhile (a subreaper adopts orphans: they must not pile up as
/// zombies).
fn wait_for(pid: libc::pid_t, reap_others: bool) -> std::io::Result<std::process::ExitStatus> {
    loop {
        // SAFETY: waitid writes only `info`.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let (idtype, id) = match reap_others {
            true => (libc::P_ALL, 0),
            false => (libc::P_PID, pid as libc::id_t),
        };
        let r = unsafe { libc::waitid(idtype, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: waitid filled in a child's siginfo.
        let who = unsafe { info.si_pid() };
        if who == pid {
            FORWARD_TO.store(0, Ordering::SeqCst);
        }
        let mut status = 0;
        // SAFETY: waitpid writes only `status`; `who` has exited (not yet reaped).
        let r = unsafe { libc::waitpid(who, &mut status, 0) };
        if who == pid && r == pid {
            return Ok(std::os::unix::process::ExitStatusExt::from_raw(status));
        }
    }
}

/// The command a SIGTERM or SIGHUP to this process is passed on to (0: none).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
        // A turn's command that ignores it is killed a little later (`turn` only).
        tree::on_signal();
    }
}

/// A command's status as a shell gives it: its code, or 128 + the signal that ended it.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    })
}

/// SIGTERM, SIGKILL: the names `turn --timeout` reports.
pub fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Runs test `name` of this module in a process of its own (see
    /// `crate::process::alone`): a run enters its directory, changes signal dispositions
    /// and may make this process a subreaper.
    fn alone(name: &str) -> bool {
        crate::process::alone(&format!("process::supervise::tests::{name}"))
    }

    fn sh(script: &str) -> Vec<String> {
        ["sh", "-c", script].map(String::from).to_vec()
    }

    /// SIGINT and SIGQUIT at their default, whatever this test process was started with
    /// (a background job starts with them ignored), so a test can tell they are put back.
    fn default_signals() {
        // SAFETY: signal(2) in a test process of its own (see `alone`).
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
        }
    }

    fn ignored(sig: libc::c_int) -> bool {
        // SAFETY: a query of the disposition only.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            old.sa_sigaction == libc::SIG_IGN
        }
    }

    #[test]
    fn a_run_enters_the_directory_and_gives_the_commands_status() {
        if !alone("a_run_enters_the_directory_and_gives_the_commands_status") {
            return;
        }
        default_signals();
        let dir = tempfile::tempdir().unwrap();
        let dir = fs::canonicalize(dir.path()).unwrap();
        let env = [("WORKTREEFS_PORT".to_string(), "20010".to_string())];
        let ended = run_below(
            &dir,
            &sh("pwd > seen; echo $WORKTREEFS_PORT > port; exit 3"),
            &env,
            Below::Run,
        )
        .unwrap();
        assert_eq!(exit_code(ended.status), 3);
        assert_eq!(ended.ended_with, None);
        assert_eq!(
            fs::read_to_string(dir.join("seen")).unwrap().trim(),
            dir.to_str().unwrap()
        );
        assert_eq!(fs::read_to_string(dir.join("port")).unwrap(), "20010\n");
        assert!(
            std::env::var_os("WORKTREEFS_PORT").is_none(),
            "for the command only"
        );
        assert_eq!(
            std::env::current_dir().unwrap(),
            dir,
            "this process stays there"
        );
        // A Ctrl-C was for the command while it ran; this process takes it again after.
        assert!(!ignored(libc::SIGINT) && !ignored(libc::SIGQUIT));
    }

    #[test]
    fn a_command_that_cannot_start_is_a_shells_127_or_126() {
        if !alone("a_command_that_cannot_start_is_a_shells_127_or_126") {
            return;
        }
        default_signals();
        let dir = tempfile::tempdir().unwrap();
        let missing = vec!["/nonexistent/cmd".to_string()];
        let e = run_below(dir.path(), &missing, &[], Below::Turn { limit: None }).unwrap_err();
        assert_eq!(e.shell_code(), Some(127), "{e}");
        assert!(
            e.to_string().starts_with("starting /nonexistent/cmd: "),
            "{e}"
        );
        let plain = dir.path().join("not-a-program");
        fs::write(&plain, "data").unwrap();
        fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).unwrap();
        let e = run_below(dir.path(), &[plain.display().to_string()], &[], Below::Run).unwrap_err();
        assert_eq!(e.shell_code(), Some(126), "{e}");
        assert!(!ignored(libc::SIGINT), "the disposition is put back");
        let e = run_below(&dir.path().join("gone"), &sh("true"), &[], Below::Run).unwrap_err();
        assert!(matches!(e, RunError::Enter(..)) && e.shell_code().is_none());
    }

    #[test]
    fn a_turn_past_its_limit_is_ended_and_so_is_what_it_left_running() {
        if !alone("a_turn_past_its_limit_is_ended_and_so_is_what_it_left_running") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let ended = run_below(
            dir.path(),
            &sh("sleep 60 & echo $! > left; sleep 60"),
            &[],
            Below::Turn {
                limit: Some(Duration::from_millis(500)),
            },
        )
        .unwrap();
        assert_eq!(ended.ended_with, Some(libc::SIGTERM));
        assert_eq!(exit_code(ended.status), 128 + libc::SIGTERM);
        assert!(started.elapsed() < Duration::from_secs(20));
        let left: i32 = fs::read_to_string(dir.path().join("left"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Ended and reaped here (this process is its subreaper): no such process now.
        // SAFETY: signal 0 only checks that the process exists.
        let there = unsafe { libc::kill(left, 0) } == 0;
        assert!(
            !there,
            "pid {left}, left running by the command, is still there"
        );
    }

    #[test]
    fn a_sigterm_to_this_process_reaches_the_command() {
        if !alone("a_sigterm_to_this_process_reaches_the_command") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as libc::pid_t;
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: a signal to this very process, whose handler passes it on.
            unsafe { libc::kill(me, libc::SIGTERM) };
        });
        let ended = run_below(dir.path(), &sh("exec sleep 60"), &[], Below::Run).unwrap();
        sender.join().unwrap();
        assert_eq!(exit_code(ended.status), 128 + libc::SIGTERM);
        assert_eq!(ended.ended_with, None, "no timeout ended it");
    }
}
