//! Mountpoints: whether a path can take a mount, and whether the mount there answers.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};

use crate::mounttable::{is_mountpoint, mount_type, unescape_mount_path};
use crate::state::StateDir;

/// What answers at a mountpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its connection is gone (ENOTCONN or ECONNABORTED), or it is the mount the prober's
    /// own last daemon left and nothing answers there: a daemon that died left it.
    Dead,
    /// It answered, or it did not answer within the probe's time and may be served by a
    /// daemon that is busy or stopped.
    Alive,
}

/// How long a mountpoint may take to answer the probe before it counts as served by a
/// daemon that is busy (a hang is a live daemon, never a dead one).
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Tells a dead connection from a live one with a `statx` that the kernel must ask the
/// filesystem (`AT_STATX_FORCE_SYNC`: a dead FUSE mount cannot answer it from its
/// caches), asked by a child process under a timeout (`asked`: a daemon that is stopped
/// never holds this process).
///
/// No answer is a busy or stopped daemon, except at the mount the state directory `own`
/// (the one about to mount or unmount there) left: a connection can outlive its daemon
/// (the kernel ends a killed daemon's io_uring queues after it is gone; a `/dev/fuse`
/// descriptor left in another process holds it), and then nothing ever answers, or (seen
/// on Linux 6.18 while a killed daemon's io_uring queues were torn down) a request is
/// answered ECANCELED, taken as no answer. Only that mount is taken for dead, and only
/// when `own`'s lock is free and names this mountpoint and this very mount (its device,
/// which the daemon records once mounted and erases when its mount has ended cleanly),
/// and no running daemon names it either: evidence that holds across pid and mount
/// namespaces, where a search of `/proc` alone can miss a live daemon.
pub fn probe(path: &Path, own: Option<&StateDir>) -> Liveness {
    match crate::asked::statx_sync(path, PROBE_TIMEOUT) {
        Some(libc::ENOTCONN | libc::ECONNABORTED) => Liveness::Dead,
        // ECANCELED: what a request to a killed daemon's io_uring queues answered here
        // (Linux 6.18), seen while they were torn down; none of ours answers it
        // otherwise.
        None | Some(libc::ECANCELED) => match own.map(|s| (s, left_by_own_daemon(path, s))) {
            Some((s, Ok(()))) => {
                tracing::info!(
                    "the worktreefs mount at {} does not answer, and the daemon of {} that made it is gone",
                    path.display(),
                    s.root.display()
                );
                Liveness::Dead
            }
            Some((_, Err(why))) => {
                tracing::info!(
                    "the mount at {} does not answer within {PROBE_TIMEOUT:?} (or its request was cancelled): taken for a busy or stopped daemon's, since {why}",
                    path.display()
                );
                Liveness::Alive
            }
            None => Liveness::Alive,
        },
        Some(0) => Liveness::Alive,
        Some(errno) => {
            tracing::info!(
                "the mount at {} answered ({}): live",
                path.display(),
                std::io::Error::from_raw_os_error(errno)
            );
            Liveness::Alive
        }
    }
}

/// Whether the worktreefs mount at `path` is the one `own`'s last daemon made and left:
/// nobody holds `own`'s lock, the lock names `path` as that daemon's mountpoint and the
/// mount there now as its own (its device, which each connection has of its own: not a
/// mount another daemon made there since), and no running daemon serves `path`.
/// Err says which does not hold.
fn left_by_own_daemon(path: &Path, own: &StateDir) -> Result<(), String> {
    if !mount_type(path)
        .is_some_and(|(source, fstype)| source == "worktreefs" && fstype.starts_with("fuse"))
    {
        return Err("it is not a worktreefs mount".into());
    }
    if let Some(h) = super::instance::running_daemon(own) {
        return Err(match h.pid {
            0 => format!("{} is locked", own.lock_file().display()),
            pid => format!("{} is locked (by pid {pid})", own.lock_file().display()),
        });
    }
    let Some(h) = super::instance::read_holder(&own.lock_file()) else {
        return Err(format!("{} names no daemon", own.lock_file().display()));
    };
    let here = crate::mounttable::mount_device(path);
    match &h.device {
        None => {
            return Err(format!(
                "{}'s last daemon ended its mount cleanly or never finished it: this one is not known to be its",
                own.root.display()
            ))
        }
        Some(d) if h.mountpoint != path || Some(d) != here.as_ref() => {
            return Err(format!(
                "{}'s last daemon made another mount ({}, device {d}; this one's {})",
                own.root.display(),
                h.mountpoint.display(),
                here.as_deref().unwrap_or("unknown")
            ))
        }
        Some(_) => {}
    }
    if let Some((pid, _)) = daemon_serving(path) {
        return Err(format!("daemon {pid} serves it"));
    }
    Ok(())
}

/// The worktreefs daemon serving `mountpoint`, found from the descriptors of running
/// processes (by readlink only: nothing under the mount is touched): a daemon holds its
/// state directory's `daemon.lock` open, and that file names its mountpoint.
pub fn daemon_serving(mountpoint: &Path) -> Option<(i32, PathBuf)> {
    let want = unescape_mount_path(&mountpoint.to_string_lossy());
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            if target.file_name() != Some(std::ffi::OsStr::new("daemon.lock")) {
                continue;
            }
            if let Some(h) = super::instance::read_holder(&target) {
                if h.pid == pid && h.mountpoint.to_string_lossy() == want {
                    return target.parent().map(|state| (pid, state.to_path_buf()));
                }
            }
        }
    }
    None
}

/// Why a live mount at `path` cannot be taken: what is mounted there, and the daemon
/// that serves it when it is worktreefs's.
fn live_mount_message(path: &Path, source: &str, fstype: &str) -> String {
    let who = match daemon_serving(path) {
        Some((pid, state)) => format!(
            ", served by worktreefs daemon pid {pid} for state dir {} (unmount it with `worktreefs unmount --state-dir {}`)",
            state.display(),
            state.display()
        ),
        None => String::new(),
    };
    format!(
        "mountpoint {} is in use: {source} ({fstype}) is mounted there and live{who}; pick another directory, or unmount that first",
        path.display()
    )
}

/// Detaches the mount at `path` only when it is a worktreefs mount whose connection is
/// dead; a live mount of any kind (or a dead one of another filesystem) is refused with
/// what is there. `own` is the state directory about to mount or unmount there (see
/// [`probe`]). Ok(false): nothing is mounted at `path`.
pub fn detach_if_stale(path: &Path, own: &StateDir) -> anyhow::Result<bool> {
    let Some((source, fstype)) = mount_type(path) else {
        return Ok(false);
    };
    match probe(path, Some(own)) {
        Liveness::Alive => bail!("{}", live_mount_message(path, &source, &fstype)),
        Liveness::Dead if source == "worktreefs" && fstype.starts_with("fuse") => {
            tracing::warn!(
                "detaching the stale worktreefs mount at {} left by a daemon that is gone",
                path.display()
            );
            match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
                Ok(()) => Ok(true),
                // Not root: the mount was made through fusermount3, which undoes it.
                Err(nix::errno::Errno::EPERM) => {
                    let ok = std::process::Command::new("fusermount3")
                        .arg("-uz")
                        .arg(path)
                        .status()
                        .map(|s| s.success())
                        .unwrap_or(false);
                    if !ok {
                        bail!(
                            "the stale mount at {} (its daemon is gone) cannot be detached by this user; run `fusermount3 -uz {}` or, as root, `umount -l {}`",
                            path.display(),
                            path.display(),
                            path.display()
                        );
                    }
                    Ok(true)
                }
                Err(e) => Err(anyhow!("detaching the stale mount at {}: {e}", path.display())),
            }
        }
        Liveness::Dead => bail!(
            "mountpoint {} holds a dead {fstype} mount of {source} (not worktreefs's); detach it with `umount -l {}` or pick another directory",
            path.display(),
            path.display()
        ),
    }
}

pub(super) fn check_mountpoint(path: &Path, own: &StateDir) -> anyhow::Result<()> {
    // A mount whose daemon died answers ENOTCONN to everything: a worktreefs one is
    // detached; anything that answers is someone's and is refused.
    let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if detach_if_stale(&canonical, own)? {
        eprintln_lossy(&format!(
            "worktreefs: detached the stale mount at {} (its daemon is gone)",
            canonical.display()
        ));
    }
    let meta = fs::metadata(path).map_err(|e| {
        anyhow!(
            "mountpoint {} cannot be used: {e}; create an empty directory there first",
            path.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "mountpoint {} is not a directory; pass an empty directory",
            path.display()
        );
    }
    if is_mountpoint(path) {
        bail!(
            "mountpoint {} is already a mount; unmount it first or pick another directory",
            path.display()
        );
    }
    if fs::read_dir(path)?.next().is_some() {
        bail!(
            "mountpoint {} is not empty; worktreefs mounts only on an empty directory",
            path.display()
        );
    }
    Ok(())
}

/// A line on standard error that is dropped when it cannot be written.
fn eprintln_lossy(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
