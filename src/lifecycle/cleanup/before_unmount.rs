//! The unmount's cleanup of the worktrees whose repository has a teardown command, run
//! while the mount still serves them (a teardown runs inside its worktree, which is gone
//! once the mount is): each one the unmount would clean up that nobody is in and no live
//! process holds has its leases released as the unmount releases them and is marked
//! `deleting`; they are inspected a few at a time, the removable ones' teardowns run side
//! by side under one deadline (the longest of their limits), then each is removed or
//! retained, one after another. What the unmount cleans up after the mount has gone is
//! everything else (where a removal with a teardown waits for the next mount).
//!
//! One such cleanup runs at a time (two unmounts, or an unmount and a signal); once the
//! mount has gone the daemon waits for one under way and lets none start after
//! ([`end_cleanups_before_unmount`]), so that it never exits in the middle of one.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::deleting::{judge, remove_judged, Judged, DECIDE_BUSY_TIMEOUT};
use super::inspection::Inspection;
use super::lock::try_lock;
use super::target::Outcome;
use crate::lease::State;
use crate::lifecycle::error::LifecycleResult;
use crate::lifecycle::gate::Gate;
use crate::state::StateDir;
use crate::store::{Store, WorktreeRow};

/// What [`tear_down_before_unmount`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BeforeUnmount {
    /// Worktrees removed.
    pub removed: usize,
    /// Worktrees retained (they hold work, or their teardown moved HEAD).
    pub retained: usize,
    /// Worktrees left for the cleanup after the mount has gone: someone inside, a live
    /// process's or a kept named lease, or a cleanup of them already under way.
    pub left: usize,
}

/// Held for as long as a cleanup before an unmount runs, and by the daemon once its
/// mount has gone.
static RUNNING: Mutex<()> = Mutex::new(());

/// The mount has gone: no cleanup before an unmount starts any more.
static ENDED: AtomicBool = AtomicBool::new(false);

/// How many worktrees are inspected at once.
const INSPECTING: usize = 4;

/// No cleanup before an unmount runs while this lives, nor starts after it.
pub struct Ended(#[allow(dead_code)] parking_lot::MutexGuard<'static, ()>);

/// The mount has gone: waits for a cleanup before an unmount under way, if any, to end,
/// and lets none start after (the daemon holds this until it exits).
pub fn end_cleanups_before_unmount() -> Ended {
    let held = RUNNING.lock();
    ENDED.store(true, Ordering::SeqCst);
    Ended(held)
}

/// Cleans up, while the mount at `mountpoint` serves them, the worktrees an unmount
/// would clean up whose repository has a teardown command (see the module's comment):
/// the process leases of processes that are gone released, and the named leases too
/// unless `keep_sessions`. Their teardowns run at once, together for at most the longest
/// of their limits. `changed` is called whenever the catalog the filesystem serves has
/// changed.
pub fn tear_down_before_unmount(
    state: &StateDir,
    mountpoint: &Path,
    how: &Inspection,
    gate: &Gate,
    keep_sessions: bool,
    changed: &dyn Fn(),
) -> LifecycleResult<BeforeUnmount> {
    let _running = RUNNING.lock();
    let mut done = BeforeUnmount::default();
    // Nothing after the mount has gone, nor once it is detached (a lazy unmount with
    // processes inside): a teardown could not get into its worktree.
    if ENDED.load(Ordering::SeqCst) || how.own_mount_gone(mountpoint) {
        return Ok(done);
    }
    let mut store = Store::open(&state.root)?;
    let candidates: Vec<WorktreeRow> = store
        .worktrees()?
        .into_iter()
        .filter(|w| matches!(w.state, State::Active | State::Lingering | State::Deleting))
        .filter(|w| how.tears_down(&store, w))
        .collect();
    if candidates.is_empty() {
        return Ok(done);
    }
    let reason = if keep_sessions {
        "unmount (named leases kept for the next mount)"
    } else {
        "unmount"
    };
    let gone = |pid: i64, start: i64| {
        crate::process::info::liveness(pid, start) == crate::process::info::Liveness::Gone
    };
    // Each one marked `deleting`, holding its gate closed (no lease comes in) and its
    // cleanup lock until it is removed or retained.
    let mut marked = Vec::new();
    for row in candidates {
        let label = format!("{}/{}", row.repo, row.name);
        let path = mountpoint.join(&row.repo).join(&row.name);
        let inside = || crate::process::inside::describe_processes_inside(&path);
        // Once before the gate closes (an entry waits while it is closed), and again
        // after: nobody comes in from then on.
        let mut occupied = inside();
        let mut guards = None;
        if occupied.is_empty() {
            let (Some(closed), Some(lock)) = (gate.close(row.id), try_lock(state, row.id)) else {
                done.left += 1;
                continue;
            };
            occupied = inside();
            guards = Some((closed, lock));
        }
        if !occupied.is_empty() {
            tracing::info!(
                "unmount: {label} has processes inside ({}): left for after the unmount (its removal then waits for the next mount, which runs its teardown first)",
                occupied.join(", ")
            );
            done.left += 1;
            continue;
        }
        let Some((closed, lock)) = guards else {
            continue;
        };
        // A removal a daemon that died had begun: carried on here, one at a time.
        if row.removal.is_some() {
            let r = match judge(state, &mut store, &row, mountpoint, how) {
                Ok(Judged::Done(o)) => Ok(o),
                // Never for a removal begun before (judge carries it on).
                Ok(Judged::Removable(_)) => continue,
                Err(e) => Err(e),
            };
            count(&mut done, &label, r);
            continue;
        }
        if row.state != State::Deleting {
            // Not while the database is busy for long: the gate is closed meanwhile. An
            // error (busy, a full disk) leaves it to the cleanup after the mount.
            let r = store.with_busy_timeout(DECIDE_BUSY_TIMEOUT, |s| {
                match s.release_leases_of(row.id, !keep_sessions, &gone, reason)? {
                    0 => s.mark_deleting_if_grace_over(row.id, 0),
                    _ => Ok(false),
                }
            });
            match r {
                Ok(true) => {}
                // A live process's lease (one about to enter, or that left a moment
                // ago), or a named one kept.
                Ok(false) => {
                    tracing::info!("unmount: {label} is still held: left for after the unmount (its removal then waits for the next mount, which runs its teardown first)");
                    done.left += 1;
                    continue;
                }
                Err(e) => {
                    tracing::warn!("unmount: {label}: not cleaned up before the unmount: {e}");
                    done.left += 1;
                    continue;
                }
            }
            closed.deleting();
            changed();
        }
        match store.worktree_by_id(row.id) {
            Ok(Some(row)) => marked.push((row, closed, lock)),
            _ => done.left += 1,
        }
    }
    // Inspected a few at a time, each on a connection of its own.
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<LifecycleResult<Judged>>>> =
        marked.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..INSPECTING.min(marked.len()) {
            s.spawn(|| {
                let Ok(mut store) = Store::open(&state.root) else {
                    return;
                };
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((row, ..)) = marked.get(i) else {
                        return;
                    };
                    *slots[i].lock() = Some(judge(state, &mut store, row, mountpoint, how));
                }
            });
        }
    });
    let mut judged = Vec::new();
    for ((row, closed, lock), slot) in marked.into_iter().zip(slots) {
        let label = format!("{}/{}", row.repo, row.name);
        match slot.into_inner() {
            Some(Ok(Judged::Done(o))) => count(&mut done, &label, Ok(o)),
            Some(Ok(Judged::Removable(r))) => judged.push((row, r, closed, lock)),
            Some(Err(e)) => count(&mut done, &label, Err(e)),
            // The store could not be opened: left `deleting`, for the cleanup after.
            None => done.left += 1,
        }
    }
    // The teardowns, side by side: together no longer than the longest limit.
    let longest = judged
        .iter()
        .map(|(row, ..)| match store.hooks_of(row.repo_id) {
            Ok(h) => crate::lifecycle::setup::teardown_limit(&h),
            Err(_) => crate::lifecycle::setup::TEARDOWN_TIMEOUT,
        })
        .max()
        .unwrap_or_default();
    let until = Instant::now() + longest;
    if !judged.is_empty() {
        tracing::info!(
            "unmount: {} teardown(s) run together, for at most {} s",
            judged.len(),
            longest.as_secs()
        );
    }
    let torn: Vec<Result<(), String>> = std::thread::scope(|s| {
        let runs: Vec<_> = judged
            .iter()
            .map(|(row, ..)| {
                s.spawn(move || match Store::open(&state.root) {
                    Ok(store) => how.tear_down(&store, row, Some(until)),
                    Err(e) => {
                        tracing::warn!(
                            "{}/{}: its teardown is not run: the store cannot be opened ({e})",
                            row.repo,
                            row.name
                        );
                        Ok(())
                    }
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| {
                r.join().unwrap_or_else(|_| {
                    Err(
                        "what its teardown did could not be told (the thread that ran it failed)"
                            .into(),
                    )
                })
            })
            .collect()
    });
    // The removals, one at a time (each changes its repository's refs and admin files).
    for ((row, r, _closed, _lock), torn_down) in judged.into_iter().zip(torn) {
        let label = format!("{}/{}", row.repo, row.name);
        count(
            &mut done,
            &label,
            remove_judged(state, &mut store, r, torn_down),
        );
    }
    changed();
    Ok(done)
}

fn count(done: &mut BeforeUnmount, label: &str, r: LifecycleResult<Outcome>) {
    match r {
        Ok(o) => {
            tracing::info!("unmount: {label}: {o}");
            match o {
                Outcome::Removed(_) => done.removed += 1,
                Outcome::Retained(_) => done.retained += 1,
                Outcome::Waiting(_) => done.left += 1,
            }
        }
        Err(e) => {
            tracing::error!("unmount: {label}: {e:#}");
            done.left += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The end of the cleanups before an unmount waits for one under way, and none runs
    /// after it.
    #[test]
    fn the_end_waits_for_a_cleanup_before_an_unmount_and_none_starts_after() {
        // Its store cannot be opened (a directory where the database goes): a cleanup
        // that starts fails.
        let d = tempfile::tempdir().unwrap();
        let state = StateDir::open(&d.path().join("state")).unwrap();
        std::fs::create_dir(state.root.join("worktreefs.db")).unwrap();
        let run = || {
            tear_down_before_unmount(
                &state,
                Path::new("/"),
                &Inspection::default(),
                &Gate::new(),
                false,
                &|| {},
            )
        };
        assert!(run().is_err());
        let held = RUNNING.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, gone) = std::sync::mpsc::channel::<()>();
        let ender = std::thread::spawn(move || {
            let ended = end_cleanups_before_unmount();
            tx.send(()).unwrap();
            let _ = gone.recv();
            drop(ended);
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(held);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(RUNNING.try_lock().is_none(), "held until the daemon exits");
        go.send(()).unwrap();
        ender.join().unwrap();
        let done = run().unwrap();
        assert_eq!(done, BeforeUnmount::default());
        ENDED.store(false, Ordering::SeqCst);
    }
}
