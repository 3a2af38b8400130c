//! `worktreefs unmount`: every lease released, cleanup, the mount ended; its progress
//! read from the events the daemon writes meanwhile.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::Args;
use worktreefs::daemon::{self, detached, detached_message, mountpoint, running_daemon, AtUnmount};
use worktreefs::lease::State;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes::{self, CleanedJson, UnmountJson, UnmountRefusedJson};
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct UnmountArgs {
    /// Detach now even with processes inside; the daemon finishes the cleanup in the
    /// background once they have left (a removal with a teardown command then waits
    /// for the next mount).
    #[arg(long)]
    pub lazy: bool,
    /// A planned restart, not a reclaim: named leases and their worktrees are kept for
    /// the next mount; only process leases are released (and what nobody then holds
    /// is cleaned up). The systemd units stop this way.
    #[arg(long)]
    pub keep_sessions: bool,
    /// The outcome as one JSON object on stdout, with each worktree's cleanup (see
    /// docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: UnmountArgs) -> Result<(), Failed> {
    cmd_unmount(state, args.lazy, args.keep_sessions, args.json)
}

/// From how many worktrees to clean up unmount numbers its lines (`[3/14] …`).
const PROGRESS_FROM: usize = 4;

fn cmd_unmount(
    state: &StateDir,
    lazy: bool,
    keep_sessions: bool,
    json: bool,
) -> Result<(), Failed> {
    let store = open_store(state)?;
    let since = store.last_event_id()?;
    drop(store);
    // What cleanup does, a line per worktree as it goes (read from the events the daemon
    // writes meanwhile), numbered when there are many; with --json, kept for the outcome.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = {
        let stop = stop.clone();
        let root = state.root.clone();
        std::thread::spawn(move || {
            let mut cleaned = Vec::new();
            let Ok(store) = Store::open(&root) else {
                return cleaned;
            };
            let (mut after, mut to_clean, mut done) = (since, 0usize, 0usize);
            loop {
                let last = stop.load(std::sync::atomic::Ordering::SeqCst);
                for e in store.events(after, 10_000).unwrap_or_default() {
                    after = e.id;
                    let target = format!(
                        "{}/{}",
                        e.repo.as_deref().unwrap_or("-"),
                        e.worktree.as_deref().unwrap_or("-")
                    );
                    if e.kind == State::Deleting.as_str() {
                        to_clean += 1;
                    } else if json
                        && (e.kind == State::Removed.as_str() || e.kind == State::Retained.as_str())
                    {
                        cleaned.push(CleanedJson {
                            worktree: target,
                            repo: e.repo,
                            name: e.worktree,
                            state: e.kind,
                            reason: e.reason,
                            at: report::rfc3339(e.at),
                        });
                    } else if e.kind == State::Removed.as_str()
                        || e.kind == State::Retained.as_str()
                    {
                        if done == 0 && to_clean >= PROGRESS_FROM {
                            println!("cleaning up {to_clean} worktrees left without a lease");
                        }
                        done += 1;
                        let count = if to_clean >= PROGRESS_FROM {
                            format!("[{done}/{}] ", to_clean.max(done))
                        } else {
                            String::new()
                        };
                        println!(
                            "  {count}{target}: {} ({})",
                            e.kind,
                            e.reason.as_deref().unwrap_or("")
                        );
                    }
                }
                if last {
                    return cleaned;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Its refusals (`not-mounted`, `in-use`) are typed: JSON on stdout with --json.
    let outcome = unmount(
        state,
        lazy,
        daemon::AtUnmount::from_keep_sessions(keep_sessions),
        Duration::from_secs(300),
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let cleaned = progress.join().unwrap_or_default();
    if json {
        let (outcome, mountpoint, inside) = match outcome? {
            Unmounted::Done(m) => ("unmounted", m, Vec::new()),
            Unmounted::Detached(m, inside) => ("detached", m, inside),
        };
        print_json(UnmountJson {
            outcome: outcome.into(),
            mountpoint,
            inside,
            cleaned,
        });
        return Ok(());
    }
    match outcome? {
        Unmounted::Done(m) => println!("unmounted {}", m.display()),
        Unmounted::Detached(m, inside) => {
            println!(
                "detached {}; {} process(es) still inside: {}",
                m.display(),
                inside.len(),
                inside.join(", ")
            );
            println!("  cleanup runs in the background once they leave (see `worktreefs events`)");
        }
    }
    Ok(())
}

pub enum Unmounted {
    /// Unmounted, and the daemon finished its cleanup and exited.
    Done(PathBuf),
    /// `--lazy` with processes inside: detached; these are still inside ("pid (command)").
    Detached(PathBuf, Vec<String>),
}

/// Unmount's typed refusal (exit 1): `not-mounted`, or `in-use` naming the processes
/// inside (`--json` gives them as `inside`).
fn refused(error: &str, mountpoint: &Path, inside: &[String], message: String) -> Failed {
    worktreefs::report::Refusal {
        message,
        json: shapes::value(UnmountRefusedJson {
            error: error.to_string(),
            mountpoint: mountpoint.to_path_buf(),
            inside: inside.to_vec(),
        }),
        code: report::EXIT_FAILED,
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
) -> Result<Unmounted, Failed> {
    let holder = running_daemon(state);
    let mountpoint = match &holder {
        Some(h) => h.mountpoint.clone(),
        None => {
            let store = Store::open(&state.root)?;
            let m = create::mountpoint_of(state, &store);
            // A daemon that died left its mount behind: detach it; a live mount there
            // (another state dir's daemon took the mountpoint since) is refused.
            if mountpoint::detach_if_stale(&m, state)? {
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
    use worktreefs::process;
    let ours = process::info::liveness_for(std::process::id() as i32);
    let mut yours = false;
    let inside: Vec<String> = process::inside::processes_in_worktrees(&mountpoint)
        .into_iter()
        .map(|(pid, place, how)| {
            let mine = process::info::proc_info(pid).is_some_and(|p| {
                ours(pid as i64, p.start as i64) == worktreefs::process::info::Liveness::Ours
            });
            yours |= mine;
            let command = worktreefs::process::info::command_line(pid).unwrap_or_default();
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
    if !inside.is_empty() && !lazy {
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
    // (The daemon keeps what it was asked in memory meanwhile: a signal's unmount during
    // it does as this one would.)
    clean_up_before_unmounting(state, at);
    // The daemon reads what this unmount is to do once its session ends; a failed
    // unmount takes it back (only its own word: another unmount's is left).
    let told = at
        .tell(state)
        .with_context(|| format!("writing {}", state.unmount_mode_file().display()))?;
    let told = TakenBackUnlessDone(state.unmount_mode_file(), told, false);
    if !inside.is_empty() {
        nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("detaching {}", mountpoint.display()))?;
        told.done();
        return Ok(Unmounted::Detached(mountpoint, inside));
    }
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(&mountpoint, flags) {
        Ok(()) => {}
        // Unmounted meanwhile (a signal to the daemon during the cleanup before it).
        Err(nix::errno::Errno::EINVAL) if !worktreefs::daemon::is_mountpoint(&mountpoint) => {}
        Err(nix::errno::Errno::EBUSY) => return Err(anyhow!(
            "{} is busy (something the process scan could not name holds it, such as a mount below it or a mapped file); leave it and run `worktreefs unmount` again, or `worktreefs unmount --lazy`",
            mountpoint.display()
        )
        .into()),
        Err(nix::errno::Errno::EPERM) => {
            let status = Command::new("fusermount3")
                .arg("-u")
                .arg(&mountpoint)
                .status()
                .context("running fusermount3 -u")?;
            if !status.success() {
                return Err(anyhow!("fusermount3 -u {} failed", mountpoint.display()).into());
            }
        }
        Err(e) => return Err(anyhow!("unmounting {} failed: {e}", mountpoint.display()).into()),
    }
    told.done();
    let deadline = Instant::now() + timeout;
    while running_daemon(state).is_some() {
        if Instant::now() > deadline {
            return Err(anyhow!(
                "{} was unmounted but the daemon (pid {}) has not exited after {:?}; see {}",
                mountpoint.display(),
                holder.map(|h| h.pid).unwrap_or(0),
                timeout,
                state.log_file().display()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Unmounted::Done(mountpoint))
}

/// While the mount still serves them: the worktrees this unmount cleans up whose
/// repository has a teardown command are cleaned up now by the daemon, their teardowns
/// side by side (each runs inside its worktree, which is gone with the mount). One it
/// cannot ask is said: their removals then wait for the next mount, which runs the
/// teardowns first.
fn clean_up_before_unmounting(state: &StateDir, at: AtUnmount) {
    // Nothing to ask when no repository has a teardown command (an older daemon, which
    // does not know the request, is not bothered then).
    let any = Store::open(&state.root)
        .ok()
        .and_then(|s| {
            let repos = s.repos().ok()?;
            Some(
                repos
                    .iter()
                    .any(|r| s.hooks_of(r.id).map_or(true, |h| h.on_remove.is_some())),
            )
        })
        .unwrap_or(true);
    if !any {
        return;
    }
    if let Err(e) = daemon::socket::before_unmount(state, at == AtUnmount::KeepSessions) {
        eprintln!(
            "warning: the daemon did not clean up the worktrees with a teardown command before the unmount ({e:#}); their removals wait for the next mount, which runs the teardowns first (see {})",
            state.log_file().display()
        );
    }
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
