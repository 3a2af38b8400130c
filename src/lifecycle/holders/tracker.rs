//! The tracker's state: who holds each worktree (watched holders, processes known
//! covered), the lease changes waiting to be written; made here, read by the files beside.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::lifecycle::error::LifecycleResult;
use crate::process::info::ProcInfo;
use crate::state::StateDir;
use crate::store::{NewLease, Store};

use crate::ids::WorktreeId;
use crate::lifecycle::gate::Gate;

/// A lease held by a live process, watched through its pidfd.
pub(super) struct Watched {
    pub(super) worktree_id: WorktreeId,
    pub(super) worktree_path: PathBuf,
    pub(super) info: ProcInfo,
    pub(super) pidfd: OwnedFd,
    /// The time (unix seconds) of the last request seen from a process it covers; 0: none
    /// since it was watched.
    pub(super) active: Active,
    /// When it was watched (a holder is never let go in its first second: `run` records
    /// its lease just before it enters).
    pub(super) since: std::time::Instant,
}

/// A holder's last activity (unix milliseconds), shared by every process it covers (set
/// on each request).
pub(super) type Active = Arc<std::sync::atomic::AtomicI64>;

/// Unix time in milliseconds.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(super) fn active_now() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(now_ms()))
}

pub(super) fn active_none() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(0))
}

/// A lease change the tracker could not write to SQLite at once, written by its writer in
/// the order it was made.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Counted in the gate as pending until written.
    Acquire {
        worktree_id: WorktreeId,
        lease: NewLease,
        reason: String,
        /// When it was taken (unix seconds).
        since: i64,
    },
    Release {
        worktree_id: WorktreeId,
        holder: String,
        kind: &'static str,
        reason: String,
    },
}

/// How long a request may wait for SQLite to record a new holder's lease before the lease
/// is kept in memory instead (and written by the writer when it can be).
pub(super) const REQUEST_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

/// The daemon's process leases: one per mount, shared by the FUSE workers (each request
/// `touch`es it), the watcher thread and the sweeper.
pub struct Tracker {
    /// The connection requests record leases with (short busy timeout).
    pub(super) fast: Mutex<Store>,
    /// The connection of the watcher, the writer and exits (the usual busy timeout).
    pub(super) store: Mutex<Store>,
    /// What the live daemon knows of leases and removals in memory (shared with the
    /// sweeper and the filesystem's rmdir).
    pub(super) gate: Arc<Gate>,
    /// Lease changes waiting to be written, oldest first.
    pub(super) queue: Mutex<std::collections::VecDeque<Op>>,
    /// One writer drains the queue at a time.
    pub(super) draining: Mutex<()>,
    /// Unmounted: nothing more is written.
    pub(super) stopped: std::sync::atomic::AtomicBool,
    /// Processes known covered, per worktree, each with the activity of the holder that
    /// covers it: the fast path of every request.
    pub(super) covered: RwLock<HashMap<WorktreeId, HashMap<i32, Active>>>,
    /// How many times a worktree's covered set was dropped (a holder exited); bumped
    /// under `covered`'s write lock, so a request that began its walk before a drop
    /// cannot put back what the drop removed.
    pub(super) drops: AtomicU64,
    pub(super) watched: Mutex<Vec<Watched>>,
    /// Holders whose exit is being handled (no longer watched, lease not yet passed on or
    /// released): (worktree, pid, start).
    pub(super) exiting: Mutex<HashSet<(WorktreeId, i32, u64)>>,
    /// Written to wake the watcher when a holder is added.
    pub(super) wake: (OwnedFd, OwnedFd),
    /// Called when the store changed (so the view re-reads states).
    pub(super) on_change: Box<dyn Fn() + Send + Sync>,
    /// The setup and teardown runners running now: a setup runner's lease is never
    /// passed on, a teardown runner's processes enter without one.
    pub(super) runners: crate::lifecycle::setup::Runners,
}

impl Tracker {
    pub fn new(
        state: &StateDir,
        gate: Arc<Gate>,
        runners: crate::lifecycle::setup::Runners,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> LifecycleResult<Arc<Tracker>> {
        let store = Store::open(&state.root)?;
        let fast = Store::open(&state.root)?;
        fast.set_busy_timeout(REQUEST_BUSY_TIMEOUT)?;
        // Never inherited (a command the daemon starts would hold the wake-ups), and its
        // write end never blocks a request (a full pipe means a wake-up is pending).
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&w),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        let tracker = Arc::new(Tracker {
            fast: Mutex::new(fast),
            store: Mutex::new(store),
            gate,
            queue: Mutex::new(std::collections::VecDeque::new()),
            draining: Mutex::new(()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            covered: RwLock::new(HashMap::new()),
            drops: AtomicU64::new(0),
            watched: Mutex::new(Vec::new()),
            exiting: Mutex::new(HashSet::new()),
            wake: (r, w),
            on_change,
            runners,
        });
        Ok(tracker)
    }

    /// Each watched holder's last activity: (worktree, holder key, unix seconds), for those
    /// a request was seen from since it was watched.
    pub fn activity(&self) -> Vec<(WorktreeId, String, i64)> {
        self.watched
            .lock()
            .iter()
            .filter_map(|w| {
                let at = w.active.load(Ordering::Relaxed) / 1000;
                (at > 0).then(|| {
                    let holder = NewLease::Process {
                        pid: w.info.pid,
                        start: w.info.start,
                        command: String::new(),
                    }
                    .holder();
                    (w.worktree_id, holder, at)
                })
            })
            .collect()
    }

    /// Remembers `pids` as covered in a worktree, unless a covered set was dropped since
    /// `seen` (read before the walk that found them covered): that walk may have seen a
    /// holder that has exited since, and a covered process also covers its descendants.
    /// Not remembered, the next request walks again.
    pub(super) fn mark_covered(
        &self,
        worktree_id: WorktreeId,
        seen: u64,
        pids: &[i32],
        active: &Active,
    ) {
        let mut covered = self.covered.write();
        if self.drops.load(Ordering::Acquire) != seen {
            return;
        }
        covered
            .entry(worktree_id)
            .or_default()
            .extend(pids.iter().map(|p| (*p, active.clone())));
    }

    /// A holder of `worktree_id` exited: nobody is known covered there any more.
    pub(super) fn drop_covered(&self, worktree_id: WorktreeId) {
        let mut covered = self.covered.write();
        self.drops.fetch_add(1, Ordering::AcqRel);
        covered.remove(&worktree_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_that_began_before_a_holder_exited_marks_nobody_covered() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let t = Tracker::new(
            &state,
            Arc::new(crate::lifecycle::gate::Gate::new()),
            Default::default(),
            Box::new(|| {}),
        )
        .unwrap();
        let covered = |pid| {
            t.covered
                .read()
                .get(&WorktreeId(7))
                .is_some_and(|s| s.contains_key(&pid))
        };
        let a = active_none();
        let seen = t.drops.load(Ordering::Acquire);
        t.mark_covered(WorktreeId(7), seen, &[100, 101], &a);
        assert!(covered(100) && covered(101));
        // A walk starts, then a holder of the worktree exits: what the walk found must not
        // come back after the drop (a covered process covers its descendants too).
        let seen = t.drops.load(Ordering::Acquire);
        t.drop_covered(WorktreeId(7));
        assert!(!covered(100));
        t.mark_covered(WorktreeId(7), seen, &[200], &a);
        assert!(!covered(200));
        // A walk that starts after the drop is remembered again.
        t.mark_covered(WorktreeId(7), t.drops.load(Ordering::Acquire), &[200], &a);
        assert!(covered(200));
    }
}
