//! The sweeper: four times a second, moves worktrees whose grace period is over from
//! `lingering` to `deleting`, runs their cleanup, and keeps the filesystem's inode table
//! near its budget.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ids::WorktreeId;
use crate::lease::State;
use crate::lifecycle::cleanup;
use crate::lifecycle::gate::Gate;
use crate::lifecycle::holders::Tracker;
use crate::state::StateDir;
use crate::store::Store;

/// The mounted filesystem, as the lifecycle reaches it (implemented by `fs::View`): the
/// arrows run from the filesystem to the lifecycle, never back.
pub trait Mounted: Send + Sync {
    /// Where the worktrees are served.
    fn mountpoint(&self) -> &Path;
    /// The store changed (a state moved, a worktree went): the filesystem re-reads it.
    fn catalog_changed(&self);
    /// Keeps the filesystem's inode table near `budget` nodes by asking the kernel to drop
    /// its caches of idle worktrees; one shed is not asked again for `again` (`recently`
    /// remembers when each was). Returns how many were asked.
    fn shed_idle(
        &self,
        budget: usize,
        recently: &mut HashMap<WorktreeId, Instant>,
        again: Duration,
    ) -> usize;
    /// The running turns the filesystem knows (its gate's table).
    fn running_turns(&self) -> Vec<crate::store::TurnRow>;
    /// While the state directory's disk is low: worktrees' checkpoints dropped, oldest
    /// first across them, each keeping its newest. Returns how many went.
    fn drop_checkpoints_for_disk(&self, policy: &cleanup::keep::KeepPolicy) -> usize;
}

/// What the sweeper is set to do, from the mount's options.
pub struct Settings {
    /// The grace period, in seconds.
    pub linger: u64,
    /// The inode table's budget.
    pub cache_nodes: usize,
    pub inspection: cleanup::Inspection,
    /// What starts queued setup runs.
    pub setups: crate::lifecycle::setup::Launcher,
}

/// Free memory the allocator may keep before the sweeper has it given back.
const HEAP_SLACK: u64 = 2 << 20;

/// Moves worktrees whose grace period is over from `lingering` to `deleting` and runs
/// their cleanup (removed or retained). Four times a second: a worktree is marked within a
/// quarter second of its grace period ending.
pub fn spawn(
    state: StateDir,
    settings: Settings,
    view: Arc<dyn Mounted>,
    tracker: Arc<Tracker>,
    gate: Arc<Gate>,
) -> Sweeper {
    let Settings {
        linger,
        cache_nodes,
        inspection,
        setups,
    } = settings;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    // The cleanups of deleting worktrees run on a thread of their own, one round at a
    // time: a teardown command may take minutes, and the sweeper's other work (setups
    // starting, grace periods ending, dead turns and leases swept) must not wait for it.
    let cleaning: Arc<parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>> =
        Arc::new(parking_lot::Mutex::new(None));
    let cleaner = cleaning.clone();
    let thread = std::thread::Builder::new()
        .name("sweeper".into())
        .spawn(move || {
            let mut store = match Store::open(&state.root) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("lifecycle sweeper cannot open the store: {e}");
                    return;
                }
            };
            let mut shed = HashMap::new();
            let mut tick: u64 = 0;
            // Warm snapshots nothing needs, and manifests a take that died left: at the
            // start, then whenever one is prunable (a newer one taken, its last worktree
            // gone). One that finds a snapshot being taken tries again at the next sweep.
            let mut prune_due = true;
            // The journals of failed takes the last prune left (one it could not read, or
            // with contents it could not tell about): pruned again only once that changes.
            let mut journals_left = Vec::new();
            let mut refs_sweep: Option<std::thread::JoinHandle<()>> = None;
            loop {
                std::thread::sleep(Duration::from_millis(250));
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                tick += 1;
                // Every 5 s: kept removals whose time is over, or that the disk needs; warm
                // snapshots nothing needs; the allocator's free pages.
                if tick.is_multiple_of(20) {
                    let policy = cleanup::keep::KeepPolicy::of(&store);
                    if cleanup::keep::purge_due(&state, &mut store, &policy) > 0 {
                        view.catalog_changed();
                    }
                    // Checkpoints give way after kept removals, as long as the disk is low.
                    if policy.low_disk(&state.root).is_some() {
                        view.drop_checkpoints_for_disk(&policy);
                    }
                    // Every minute: the refs of checkpoints gone, on a thread of its own
                    // (a repository's owner can make its refs slow to read: nothing
                    // else here waits for that), one sweep at a time.
                    if tick.is_multiple_of(240)
                        && refs_sweep.as_ref().is_none_or(|t| t.is_finished())
                    {
                        let root = state.root.clone();
                        refs_sweep = std::thread::Builder::new()
                            .name("checkpoint-refs".into())
                            .spawn(move || {
                                if let Ok(store) = Store::open(&root) {
                                    cleanup::keep::sweep_checkpoint_refs(&store, &policy);
                                }
                            })
                            .ok();
                    }
                    let journals = crate::lifecycle::warm::journals(&state);
                    prune_due = prune_due
                        || store.has_prunable_warm().unwrap_or(false)
                        || journals != journals_left;
                    if prune_due {
                        match crate::lifecycle::warm::prune(&state, &mut store) {
                            Ok(done) => prune_due = done.is_none(),
                            Err(e) => {
                                tracing::warn!("pruning warm snapshots: {e:#}");
                                prune_due = false;
                            }
                        }
                        journals_left = crate::lifecycle::warm::journals(&state);
                    }
                    // Memory: what bursts of requests freed goes back to the system (the
                    // resident size then shows what the daemon holds).
                    crate::heap::trim_beyond(HEAP_SLACK);
                }
                // Every tick: queued setup runs start (within a quarter second of
                // `new`); every second, runs whose runner died are failed.
                if setups.start_pending(&mut store) > 0 {
                    view.catalog_changed();
                }
                if tick.is_multiple_of(4) && crate::lifecycle::setup::fail_orphaned(&mut store) > 0
                {
                    view.catalog_changed();
                }
                // Every second: process leases recorded by someone else (`run --exclusive`)
                // are watched, or swept when their process is gone.
                if tick.is_multiple_of(4) {
                    match tracker.watch_recorded(view.mountpoint(), "process gone") {
                        Ok(0) => {}
                        Ok(_) => view.catalog_changed(),
                        Err(e) => tracing::warn!("watching recorded process leases: {e:#}"),
                    }
                    // Last close: a holder none of whose process tree is inside lets go
                    // (a shell that left with `cd`), within two seconds.
                    tracker.release_departed();
                }
                // Every tick: a turn whose process is gone ends (its gate opens within a
                // second of the death, however it died).
                let running = view.running_turns();
                if running.iter().any(|t| {
                    crate::process::info::liveness(t.pid, t.pid_start)
                        == crate::process::info::Liveness::Gone
                }) {
                    match store.end_dead_turns(&crate::process::info::liveness) {
                        Ok(ended) => {
                            for t in &ended {
                                tracing::info!(
                                    "the turn of session {} on {}/{} ended: its process {} is gone",
                                    t.session,
                                    t.repo,
                                    t.worktree,
                                    t.pid
                                );
                            }
                            view.catalog_changed();
                        }
                        Err(e) => tracing::warn!("ending turns of dead processes: {e}"),
                    }
                }
                // Memory: idle worktrees' inodes go when the table is over its budget.
                view.shed_idle(cache_nodes, &mut shed, Duration::from_secs(10));
                // A process inside (working directory, open file) that the kernel's caches
                // kept from ever asking us gets its lease before the worktree may go.
                for (id, repo, name) in store.lingering_past(linger as i64).unwrap_or_default() {
                    let path = view.mountpoint().join(repo).join(name);
                    if tracker.adopt_processes_inside(id, &path) {
                        tracing::info!("{} is still in use: leased again", path.display());
                    }
                }
                // The move to deleting, each through the gate: not while a lease is kept
                // in memory, and no lease is let in while the transaction decides.
                let mut marked = Vec::new();
                for (id, _, _) in store.lingering_past(linger as i64).unwrap_or_default() {
                    let Some(closed) = gate.close(id) else {
                        continue;
                    };
                    // The gate is closed while this waits: not for long.
                    let r = store
                        .with_busy_timeout(crate::lifecycle::cleanup::DECIDE_BUSY_TIMEOUT, |s| {
                            s.mark_deleting_if_grace_over(id, linger as i64)
                        });
                    match r {
                        Ok(true) => {
                            closed.deleting();
                            marked.push(id);
                            // Read back before the guard goes: from now on the catalog's
                            // `deleting` keeps leases out.
                            view.catalog_changed();
                        }
                        Ok(false) => {}
                        Err(e) => tracing::warn!("lifecycle sweep of worktree {id} failed: {e}"),
                    }
                }
                if !marked.is_empty() {
                    tracing::info!(
                        "worktrees {} have no lease after {linger} s: deleting",
                        marked
                            .iter()
                            .map(|id| format!("#{id}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                // Cleanup of every deleting worktree nobody else is at (those marked just
                // now, and any whose cleanup someone else left unfinished), on the cleanup
                // thread when the last round there has ended.
                // While the mount is detached (a lazy unmount with processes still inside)
                // a worktree with a teardown waits for the next mount (its teardown could
                // not get into it): a round starts only for one without.
                let idle = cleaner.lock().as_ref().is_none_or(|t| t.is_finished());
                let deleting = if idle {
                    store.worktrees_in(State::Deleting).unwrap_or_default()
                } else {
                    Vec::new()
                };
                let due = !deleting.is_empty()
                    && (!inspection.own_mount_gone(view.mountpoint())
                        || deleting.iter().any(|w| {
                            store
                                .hooks_of(w.repo_id)
                                .is_ok_and(|h| h.on_remove.is_none())
                        }));
                if due {
                    let (state, view, inspection, gate) = (
                        state.clone(),
                        view.clone(),
                        inspection.clone(),
                        gate.clone(),
                    );
                    let round =
                        std::thread::Builder::new()
                            .name("cleanup".into())
                            .spawn(move || {
                                let Ok(mut store) = Store::open(&state.root) else {
                                    return;
                                };
                                let done = cleanup::finish_all_deleting(
                                    &state,
                                    &mut store,
                                    view.mountpoint(),
                                    &inspection,
                                    Some(&gate),
                                );
                                if !done.is_empty() {
                                    view.catalog_changed();
                                }
                            });
                    match round {
                        Ok(t) => *cleaner.lock() = Some(t),
                        Err(e) => tracing::warn!("starting a cleanup round: {e}"),
                    }
                }
            }
        })
        .ok();
    Sweeper {
        stop,
        thread,
        cleaning,
    }
}

/// The running sweeper.
pub struct Sweeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Its cleanup round under way, if any.
    cleaning: Arc<parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl Sweeper {
    /// Stops it and waits for the sweep under way to end (a cleanup it started finishes:
    /// the unmount's own cleanup must not find a worktree the sweeper is at and skip it,
    /// then exit and cut that cleanup off, leaving the worktree `deleting`).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread {
            let _ = t.join();
        }
        if let Some(t) = self.cleaning.lock().take() {
            let _ = t.join();
        }
    }
}
