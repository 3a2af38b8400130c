//! Running in the background: the child that serves and tells its parent when it is
//! ready, and the signals that unmount.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use super::request::{AtUnmount, MountRequest, READY_FD_ENV};

pub(super) fn signal_set() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set
}

pub(super) fn block_signals() {
    let _ = signal_set().thread_block();
}

/// SIGTERM, SIGINT or SIGHUP unmount the filesystem, which ends the session cleanly;
/// `before` runs first, while the mount still serves.
pub(super) fn spawn_signal_thread(mountpoint: PathBuf, before: Box<dyn FnOnce() + Send>) {
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = signal_set().wait() {
                tracing::info!("{sig:?}: unmounting {}", mountpoint.display());
                before();
                if let Err(e) = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH) {
                    tracing::error!("unmount of {} failed: {e}", mountpoint.display());
                }
            }
        });
}

/// Starts the daemon in the background and returns once the mount is ready (or failed).
pub fn spawn_background(req: &MountRequest, log_level: Option<&str>) -> anyhow::Result<i32> {
    let state = &req.state;
    let mountpoint = req.mountpoint.as_deref();
    let (read_end, write_end) = nix::unistd::pipe()?;
    let exe = std::env::current_exe()?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(state.log_file())?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount");
    if let Some(m) = mountpoint {
        cmd.arg(m);
    }
    cmd.arg("--state-dir")
        .arg(&state.root)
        .arg("--foreground")
        .arg("--linger")
        .arg(req.linger.to_string())
        .arg("--threads")
        .arg(req.threads.to_string());
    if !req.track_leases {
        cmd.arg("--no-lease-tracking");
    }
    if !req.passthrough {
        cmd.arg("--no-passthrough");
    }
    if !req.readdirplus {
        cmd.arg("--no-readdirplus");
    }
    cmd.arg("--uring").arg(req.uring.to_string());
    cmd.arg("--yield-cpu").arg(req.yield_cpu.to_string());
    if req.xattrs {
        cmd.arg("--xattr");
    }
    if req.allow_other {
        cmd.arg("--allow-other");
    }
    cmd.arg("--cache-nodes").arg(req.cache_nodes.to_string());
    cmd.arg("--filter-timeout")
        .arg(req.filter_timeout.as_secs_f64().to_string());
    cmd.arg("--inspect-timeout")
        .arg(req.inspect_timeout.as_secs_f64().to_string());
    cmd.arg("--keep-removed")
        .arg((req.keep.keep_secs as f64 / 3600.0).to_string())
        .arg("--keep-min-free-percent")
        .arg(req.keep.min_free_percent.to_string())
        .arg("--keep-min-free-gib")
        .arg((req.keep.min_free_bytes as f64 / (1u64 << 30) as f64).to_string());
    if req.on_umount == AtUnmount::KeepSessions {
        cmd.arg("--umount-keeps-sessions");
    }
    if let Some(l) = log_level {
        cmd.arg("--log-level").arg(l);
    }
    cmd.env(READY_FD_ENV, write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let fd = write_end.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let flags = libc::fcntl(fd, libc::F_GETFD);
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the daemon")?;
    drop(write_end);
    let mut answer = String::new();
    File::from(read_end).read_to_string(&mut answer)?;
    let answer = answer.trim();
    if answer == "ready" {
        return Ok(child.id() as i32);
    }
    if let Some(msg) = answer.strip_prefix("error: ") {
        bail!("{msg}");
    }
    bail!(
        "the daemon exited before the mount was ready; see {}",
        state.log_file().display()
    )
}
