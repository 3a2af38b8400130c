//! The unmount's cleanup of the worktrees whose repository has a teardown command, run
//! while the mount still serves them (a teardown runs inside its worktree, which is gone
//! once the mount is): each one the unmount would clean up (its leases released as the
//! unmount releases them, nobody inside) is inspected, the removable ones' teardowns run
//! side by side under one deadline (the longest of their limits), then each is removed
//! or retained. What the unmount cleans up after the mount has gone is everything else.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{judge, remove_judged, try_lock, Inspection, Judged, Outcome};
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
    /// Worktrees left for the cleanup after the mount has gone: someone inside, a lease
    /// kept, or a cleanup of them already under way.
    pub left: usize,
}

/// Cleans up, while the mount at `mountpoint` serves them, the worktrees an unmount
/// would clean up whose repository has a teardown command (see the module's comment):
/// their named leases released too unless `keep_sessions`. Their teardowns run at once,
/// together for at most the longest of their limits. `changed` is called whenever the
/// catalog the filesystem serves has changed.
pub fn tear_down_before_unmount(
    state: &StateDir,
    mountpoint: &Path,
    how: &Inspection,
    gate: &Gate,
    keep_sessions: bool,
    changed: &dyn Fn(),
) -> LifecycleResult<BeforeUnmount> {
    let mut store = Store::open(&state.root)?;
    let mut done = BeforeUnmount::default();
    let candidates: Vec<WorktreeRow> = store
        .worktrees()?
        .into_iter()
        .filter(|w| matches!(w.state, State::Active | State::Lingering))
        .filter(|w| how.tears_down(&store, w))
        .collect();
    if candidates.is_empty() {
        return Ok(done);
    }
    let inside = Occupied::scan(mountpoint);
    let reason = if keep_sessions {
        "unmount (named leases kept for the next mount)"
    } else {
        "unmount"
    };
    // Each one judged, holding its gate closed and its cleanup lock until it is removed.
    let mut judged = Vec::new();
    for row in candidates {
        let label = format!("{}/{}", row.repo, row.name);
        if inside.holds(mountpoint, &row) {
            tracing::info!("unmount: {label} has processes inside: cleaned up once they leave, without its teardown");
            done.left += 1;
            continue;
        }
        let (Some(closed), Some(lock)) = (gate.close(row.id), try_lock(state, row.id)) else {
            done.left += 1;
            continue;
        };
        // Errors (the database busy or its disk full) leave the worktree to the cleanup
        // after the mount, as the rest.
        let marked = store
            .release_leases_of(row.id, !keep_sessions, reason)
            .and_then(|_| {
                store.with_busy_timeout(super::DECIDE_BUSY_TIMEOUT, |s| {
                    s.mark_deleting_if_grace_over(row.id, 0)
                })
            });
        match marked {
            Ok(true) => {}
            // A named lease kept, or one taken meanwhile.
            Ok(false) => {
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
        let Ok(Some(row)) = store.worktree_by_id(row.id) else {
            done.left += 1;
            continue;
        };
        match judge(state, &mut store, &row, mountpoint, how) {
            Ok(Judged::Done(o)) => count(&mut done, &label, Ok(o)),
            Ok(Judged::Removable(r)) => judged.push((row, r, closed, lock)),
            Err(e) => count(&mut done, &label, Err(e)),
        }
    }
    // The teardowns, side by side: together no longer than the longest limit.
    let longest = judged
        .iter()
        .filter_map(|(row, ..)| store.hooks_of(row.repo_id).ok())
        .map(|h| crate::lifecycle::setup::teardown_limit(&h))
        .max()
        .unwrap_or(Duration::ZERO);
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
            .map(|r| r.join().unwrap_or(Ok(())))
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
            }
        }
        Err(e) => {
            tracing::error!("unmount: {label}: {e:#}");
            done.left += 1;
        }
    }
}

/// Where processes are inside the mount, from one pass over `/proc`.
struct Occupied {
    /// `REPO/WT` of every worktree with a process inside.
    places: HashSet<String>,
    /// A process is inside by a path too long to read back: every worktree is asked on
    /// its own.
    unknown: bool,
}

impl Occupied {
    fn scan(mountpoint: &Path) -> Occupied {
        let mut places = HashSet::new();
        let mut unknown = false;
        for (_, place, _) in crate::process::inside::processes_in_worktrees(mountpoint) {
            unknown |= place == "?";
            places.insert(place);
        }
        Occupied { places, unknown }
    }

    fn holds(&self, mountpoint: &Path, row: &WorktreeRow) -> bool {
        self.places.contains(&format!("{}/{}", row.repo, row.name))
            || (self.unknown
                && !crate::process::inside::describe_processes_inside(
                    &mountpoint.join(&row.repo).join(&row.name),
                )
                .is_empty())
    }
}
