//! The one daemon of a state directory: its lock file, who holds it, and the poke that
//! makes it re-read the store.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::state::StateDir;

/// Who holds a state directory's lock, as written in the lock file.
#[derive(Debug, Clone)]
pub struct Holder {
    pub pid: i32,
    pub mountpoint: PathBuf,
    /// The daemon's pid namespace (`pid:[N]`, from /proc/self/ns/pid), when it wrote one.
    pub pid_ns: Option<String>,
    /// The device of the mount it made (`MAJOR:MINOR`, as mountinfo says), once mounted.
    pub device: Option<String>,
}

/// Whether the process leases recorded in `state` were taken in this process's pid
/// namespace, as far as can be told: the last daemon's, from its lock file (a state dir
/// no daemon ever served has only this machine's). A pid seen from another namespace
/// names another process, so a lease's liveness is only told from the same one.
pub fn leases_in_this_pid_namespace(state: &StateDir) -> bool {
    let ours = fs::read_link("/proc/self/ns/pid").map(|l| l.to_string_lossy().into_owned());
    match read_holder(&state.lock_file()).and_then(|h| h.pid_ns) {
        Some(theirs) => ours.is_ok_and(|o| o == theirs),
        None => true,
    }
}

pub(super) fn read_holder(path: &Path) -> Option<Holder> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse().ok()?;
    let mountpoint = PathBuf::from(lines.next()?.trim());
    let pid_ns = lines
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty());
    let device = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("device ").map(str::to_string));
    Some(Holder {
        pid,
        mountpoint,
        pid_ns,
        device,
    })
}

/// The daemon serving `state`, if one is running (its lock is held).
pub fn running_daemon(state: &StateDir) -> Option<Holder> {
    let file = OpenOptions::new().read(true).open(state.lock_file()).ok()?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return None;
    }
    Some(read_holder(&state.lock_file()).unwrap_or(Holder {
        pid: 0,
        mountpoint: PathBuf::new(),
        pid_ns: None,
        device: None,
    }))
}

/// Whether the running daemon `h` serves nothing any more: its mount was detached (a
/// lazy unmount, whose cleanup waits for the processes still inside; or an unmount
/// whose cleanup is running) while the daemon lives on. Told from the mount table of the
/// daemon's own mount namespace (this process's when that cannot be read), and only
/// once the daemon has mounted (its socket is there), so a daemon starting is not taken
/// for one ending.
pub fn detached(state: &StateDir, h: &Holder) -> bool {
    if h.pid <= 0 || h.mountpoint.as_os_str().is_empty() {
        return false;
    }
    if fs::symlink_metadata(state.socket()).is_err() {
        return false;
    }
    let Ok(mounts) = fs::read_to_string(format!("/proc/{}/mounts", h.pid))
        .or_else(|_| fs::read_to_string("/proc/self/mounts"))
    else {
        return false;
    };
    let want = h.mountpoint.to_string_lossy();
    !mounts.lines().any(|l| {
        l.split_whitespace()
            .nth(1)
            .is_some_and(|t| crate::mounttable::unescape_mount_path(t) == want)
    })
}

/// What a daemon whose mount was detached is doing, for `status` and a refused `mount`.
pub fn detached_message(h: &Holder) -> String {
    format!(
        "{} was unmounted (lazily, or its cleanup is running): nothing is served there; the daemon (pid {}) finishes the cleanup once the processes still inside have left, then exits",
        h.mountpoint.display(),
        h.pid
    )
}

/// Takes the state directory's exclusive lock, or says who has it.
pub(super) fn acquire_lock(state: &StateDir) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(state.lock_file())
        .with_context(|| format!("opening {}", state.lock_file().display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let who = read_holder(&state.lock_file());
        bail!(
            "another worktreefs daemon{} is already serving state dir {}{}; unmount it first with `worktreefs unmount --state-dir {}`, or use another --state-dir",
            who.as_ref().map(|h| format!(" (pid {})", h.pid)).unwrap_or_default(),
            state.root.display(),
            who.as_ref()
                .map(|h| format!(" at {}", h.mountpoint.display()))
                .unwrap_or_default(),
            state.root.display()
        );
    }
    Ok(file)
}

/// Asks the running daemon, if any, to re-read the store now (after the CLI changed
/// repositories or worktrees), so its listings are current when the command returns.
pub fn poke(state: &StateDir) {
    if let Some(h) = running_daemon(state) {
        let _ = fs::symlink_metadata(
            h.mountpoint
                .join(crate::fs::CONTROL_NAME)
                .join(crate::fs::REFRESH_NAME),
        );
    }
}

/// Whether daemon `h` answers a request on its mount (its `.control/stats`) within
/// `within`; the question is asked by a child process (`asked`), so a daemon that is
/// stopped or hung never holds the command. Err: what is known of why not, and the way
/// out.
pub fn answers(h: &Holder, within: std::time::Duration) -> Result<(), String> {
    let stats = h.mountpoint.join(".control").join("stats");
    match crate::asked::statx_sync(&stats, within) {
        Some(_) => Ok(()),
        None => {
            let stopped = std::fs::read_to_string(format!("/proc/{}/stat", h.pid))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                })
                .is_some_and(|st| st == "T" || st == "t");
            Err(if stopped {
                format!(
                    "daemon pid {} serving {} is stopped (SIGSTOP, or a debugger) and does not answer; let it go on with `kill -CONT {}`, or end it with `kill -9 {}` and then `worktreefs unmount` detaches its mount",
                    h.pid,
                    h.mountpoint.display(),
                    h.pid,
                    h.pid
                )
            } else {
                format!(
                    "daemon pid {} serving {} does not answer within {} s; see its log, and if it is hung, end it with `kill -9 {}`, then `worktreefs unmount` detaches its mount",
                    h.pid,
                    h.mountpoint.display(),
                    within.as_secs(),
                    h.pid
                )
            })
        }
    }
}
