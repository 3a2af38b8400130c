//! `worktreefs unmount`: leases released, cleanup, then the mount goes (or is refused
//! while a process is inside).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::lifecycle::create;
use crate::state::StateDir;
use crate::store::Store;

use super::*;

pub enum Unmounted {
    /// Unmounted, and the daemon finished its cleanup and exited.
    Done(PathBuf),
    /// `--lazy` with processes inside: detached; these are still inside ("pid (command)").
    Detached(PathBuf, Vec<String>),
}

/// Unmount's typed refusal (exit 1): `not-mounted`, or `in-use` naming the processes
/// inside (`--json` gives them as `inside`).
fn refused(error: &str, mountpoint: &Path, inside: &[String], message: String) -> anyhow::Error {
    crate::report::Refusal {
        message,
        json: serde_json::json!({
            "error": error,
            "mountpoint": mountpoint,
            "inside": inside,
        }),
        json_to: None,
        code: 1,
    }
    .into()
}

/// Unmounts the filesystem served for `state` and waits for its daemon to finish (it
/// releases every lease and runs the cleanup first). With processes inside: refused,
/// naming them, or with `lazy`, detached and left to finish in the background.
pub fn unmount(
    state: &StateDir,
    lazy: bool,
    at: AtUnmount,
    timeout: Duration,
) -> anyhow::Result<Unmounted> {
    let holder = running_daemon(state);
    let mountpoint = match &holder {
        Some(h) => h.mountpoint.clone(),
        None => {
            let store = Store::open(&state.root)?;
            let m = create::mountpoint_of(state, &store);
            // A daemon that died left its mount behind: detach it; a live mount there
            // (another state dir's daemon took the mountpoint since) is refused.
            if mountpoint::detach_if_stale(&m)? {
                return Ok(Unmounted::Done(m));
            }
            return Err(refused(
                "not-mounted",
                &m,
                &[],
                format!(
                    "nothing is mounted for state dir {}: no worktreefs daemon is running; start one with `worktreefs mount`",
                    state.root.display()
                ),
            ));
        }
    };
    // Unmounted already, its daemon still finishing: a second unmount would change what
    // the first asked (and, failing, take back the first one's word).
    if let Some(h) = holder.as_ref().filter(|h| detached(state, h)) {
        return Err(refused(
            "in-progress",
            &mountpoint,
            &[],
            format!(
                "{} is being unmounted already: {}; wait for it to finish (`worktreefs status` says when)",
                mountpoint.display(),
                detached_message(h)
            ),
        ));
    }
    // Each named with where it is: `1234 (bash) in repo/task-1 (working directory)`, and
    // whether it is the shell (or another ancestor) of the command asking.
    use crate::process;
    let ours = process::info::liveness_for(std::process::id() as i32);
    let mut yours = false;
    let inside: Vec<String> = process::inside::processes_in_worktrees(&mountpoint)
        .into_iter()
        .map(|(pid, place, how)| {
            let mine = process::info::proc_info(pid).is_some_and(|p| {
                ours(pid as i64, p.start as i64) == crate::process::info::Liveness::Ours
            });
            yours |= mine;
            let command = crate::process::info::command_line(pid).unwrap_or_default();
            let place = match place.as_str() {
                "/" => "the mount's top".to_string(),
                "?" => "a worktree".to_string(),
                p if p.ends_with('/') => {
                    format!("repository {}'s directory", p.trim_end_matches('/'))
                }
                p => p.to_string(),
            };
            let mine = if mine {
                " — yours: this command's own shell, or another of its ancestors"
            } else {
                ""
            };
            format!("{pid} ({command}) in {place} ({how}){mine}")
        })
        .collect();
    if !inside.is_empty() {
        if !lazy {
            return Err(refused(
                "in-use",
                &mountpoint,
                &inside,
                format!(
                    "{} is in use by {} process(es): {}; they must leave it (cd out, close files, or end them) before `worktreefs unmount`{}, or detach now with `worktreefs unmount --lazy` and cleanup runs once they have left",
                    mountpoint.display(),
                    inside.len(),
                    inside.join(", "),
                    if yours {
                        " (your own shell is inside: `cd` out of the mount and run it again)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let told = at
            .tell(state)
            .with_context(|| format!("writing {}", state.unmount_mode_file().display()))?;
        let told = TakenBackUnlessDone(state.unmount_mode_file(), told, false);
        nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("detaching {}", mountpoint.display()))?;
        told.done();
        return Ok(Unmounted::Detached(mountpoint, inside));
    }
    // The daemon reads what this unmount is to do once its session ends; a failed
    // unmount takes it back (only its own word: another unmount's is left).
    let told = at
        .tell(state)
        .with_context(|| format!("writing {}", state.unmount_mode_file().display()))?;
    let told = TakenBackUnlessDone(state.unmount_mode_file(), told, false);
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(&mountpoint, flags) {
        Ok(()) => {}
        Err(nix::errno::Errno::EBUSY) => bail!(
            "{} is busy (something the process scan could not name holds it, such as a mount below it or a mapped file); leave it and run `worktreefs unmount` again, or `worktreefs unmount --lazy`",
            mountpoint.display()
        ),
        Err(nix::errno::Errno::EPERM) => {
            let status = Command::new("fusermount3")
                .arg("-u")
                .arg(&mountpoint)
                .status()
                .context("running fusermount3 -u")?;
            if !status.success() {
                bail!("fusermount3 -u {} failed", mountpoint.display());
            }
        }
        Err(e) => bail!("unmounting {} failed: {e}", mountpoint.display()),
    }
    told.done();
    let deadline = Instant::now() + timeout;
    while running_daemon(state).is_some() {
        if Instant::now() > deadline {
            bail!(
                "{} was unmounted but the daemon (pid {}) has not exited after {:?}; see {}",
                mountpoint.display(),
                holder.map(|h| h.pid).unwrap_or(0),
                timeout,
                state.log_file().display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Unmounted::Done(mountpoint))
}

/// The `unmount-mode` file of an unmount that may still fail (its path and the inode this
/// command wrote): removed when dropped before `done` (nothing was unmounted, so a later
/// unmount by other means is not told), unless another unmount has written it since.
struct TakenBackUnlessDone(PathBuf, u64, bool);

impl TakenBackUnlessDone {
    fn done(mut self) {
        self.2 = true;
    }
}

impl Drop for TakenBackUnlessDone {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if !self.2 && std::fs::symlink_metadata(&self.0).is_ok_and(|m| m.ino() == self.1) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
