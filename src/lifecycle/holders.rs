//! Process leases: which process holds which worktree, and noticing when it exits.
//!
//! The first request inside a worktree from a process that is not covered (neither it nor
//! an ancestor holds a lease there) takes a lease for it, identified by pid and start time.
//! Covered processes are remembered per worktree, so a covered process costs one hash
//! lookup per request. A pidfd per holder tells a watcher thread the moment the holder
//! exits; the lease then passes to a process still inside the worktree (working directory
//! or an open file below it), or is released.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::process::info::{command_line, is_zombie_pid, proc_info, tgid_of, ProcInfo};
use crate::process::inside::{is_inside, processes_inside, tree_inside};
use crate::process::pidfd::pidfd_open;
use crate::state::StateDir;
use crate::store::{LeaseError, NewLease, Store};

/// A lease held by a live process, watched through its pidfd.
struct Watched {
    worktree_id: i64,
    worktree_path: PathBuf,
    info: ProcInfo,
    pidfd: OwnedFd,
    /// The time (unix seconds) of the last request seen from a process it covers; 0: none
    /// since it was watched.
    active: Active,
    /// When it was watched (a holder is never let go in its first second: `run` records
    /// its lease just before it enters).
    since: std::time::Instant,
}

/// A holder's last activity (unix milliseconds), shared by every process it covers (set
/// on each request).
type Active = Arc<std::sync::atomic::AtomicI64>;

/// Unix time in milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn active_now() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(now_ms()))
}

fn active_none() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(0))
}

/// A lease change the tracker could not write to SQLite at once, written by its writer in
/// the order it was made.
#[derive(Debug, Clone)]
enum Op {
    /// Counted in the gate as pending until written.
    Acquire {
        worktree_id: i64,
        lease: NewLease,
        reason: String,
        /// When it was taken (unix seconds).
        since: i64,
    },
    Release {
        worktree_id: i64,
        holder: String,
        kind: &'static str,
        reason: String,
    },
}

/// A failure that waiting may cure: the database busy or locked, its disk full, an I/O
/// error.
fn is_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    crate::store::is_busy(e)
        || matches!(
            e,
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    ErrorCode::DiskFull
                        | ErrorCode::SystemIoFailure
                        | ErrorCode::CannotOpen
                        | ErrorCode::ReadOnly
                )
        )
}

/// How long a request may wait for SQLite to record a new holder's lease before the lease
/// is kept in memory instead (and written by the writer when it can be).
const REQUEST_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

pub struct Tracker {
    /// The connection requests record leases with (short busy timeout).
    fast: Mutex<Store>,
    /// The connection of the watcher, the writer and exits (the usual busy timeout).
    store: Mutex<Store>,
    /// What the live daemon knows of leases and removals in memory (shared with the
    /// sweeper and the filesystem's rmdir).
    gate: Arc<super::gate::Gate>,
    /// Lease changes waiting to be written, oldest first.
    queue: Mutex<std::collections::VecDeque<Op>>,
    /// One writer drains the queue at a time.
    draining: Mutex<()>,
    /// Unmounted: nothing more is written.
    stopped: std::sync::atomic::AtomicBool,
    /// Processes known covered, per worktree, each with the activity of the holder that
    /// covers it: the fast path of every request.
    covered: RwLock<HashMap<i64, HashMap<i32, Active>>>,
    /// How many times a worktree's covered set was dropped (a holder exited); bumped
    /// under `covered`'s write lock, so a request that began its walk before a drop
    /// cannot put back what the drop removed.
    drops: AtomicU64,
    watched: Mutex<Vec<Watched>>,
    /// Holders whose exit is being handled (no longer watched, lease not yet passed on or
    /// released): (worktree, pid, start).
    exiting: Mutex<HashSet<(i64, i32, u64)>>,
    /// Written to wake the watcher when a holder is added.
    wake: (OwnedFd, OwnedFd),
    /// Called when the store changed (so the view re-reads states).
    on_change: Box<dyn Fn() + Send + Sync>,
}

impl Tracker {
    pub fn new(
        state: &StateDir,
        gate: Arc<super::gate::Gate>,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> anyhow::Result<Arc<Tracker>> {
        let store = Store::open(&state.root)?;
        let fast = Store::open(&state.root)?;
        fast.set_busy_timeout(REQUEST_BUSY_TIMEOUT)?;
        let (r, w) = nix::unistd::pipe()?;
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
        });
        Ok(tracker)
    }

    /// Boot reconcile: process leases whose process is gone (or whose pid now names
    /// another process) are swept; live ones are watched again.
    pub fn reconcile(&self, mountpoint: &Path) -> anyhow::Result<()> {
        self.watch_recorded(mountpoint, "process gone at boot")?;
        (self.on_change)();
        Ok(())
    }

    /// Process leases recorded by someone else (`run --exclusive` records its own, which
    /// the daemon never took when an ancestor inside covered it): watched from now on, or
    /// swept (`reason`) when their process is gone. Run by the sweeper every second, so
    /// such a lease ends within about a second of its process, however it ends. Returns
    /// how many were swept.
    pub fn watch_recorded(&self, mountpoint: &Path, reason: &str) -> anyhow::Result<usize> {
        if self.stopped.load(Ordering::Acquire) {
            return Ok(0);
        }
        let leases = self.store.lock().leases()?;
        let mut swept = 0;
        for l in leases.into_iter().filter(|l| l.holder_kind == "process") {
            let pid = l.pid.unwrap_or(0) as i32;
            let start = l.pid_start.unwrap_or(-1);
            let known = self.watched.lock().iter().any(|w| {
                w.worktree_id == l.worktree_id && w.info.pid == pid && w.info.start as i64 == start
            }) || self
                .exiting
                .lock()
                .contains(&(l.worktree_id, pid, start as u64));
            // A holder that let go whose release is still queued (the database busy) is
            // not watched again: once written, its requests would find it covered with
            // no lease.
            let releasing = self.queue.lock().iter().any(|op| {
                matches!(op, Op::Release { worktree_id, holder, .. }
                    if *worktree_id == l.worktree_id && *holder == l.holder)
            });
            if known || releasing {
                continue;
            }
            let alive = proc_info(pid).filter(|p| Some(p.start as i64) == l.pid_start);
            let path = mountpoint.join(&l.repo).join(&l.worktree);
            match alive {
                Some(info) => {
                    // Alive but no pidfd (out of descriptors): left as it is, looked at
                    // again next time; never released under a live process.
                    let Some(pidfd) = pidfd_open(pid) else {
                        tracing::warn!(
                            "cannot watch process {pid} (pidfd_open failed): its lease stays"
                        );
                        continue;
                    };
                    // Covered before it is watched: an exit handled in between then drops
                    // the mark with the rest.
                    let active = active_none();
                    self.covered
                        .write()
                        .entry(l.worktree_id)
                        .or_default()
                        .insert(pid, active.clone());
                    self.watch(Watched {
                        worktree_id: l.worktree_id,
                        worktree_path: path,
                        info,
                        pidfd,
                        active,
                        since: std::time::Instant::now(),
                    });
                    let _ = nix::unistd::write(&self.wake.1, b"w");
                }
                None => {
                    if self
                        .store
                        .lock()
                        .release_lease(l.worktree_id, &l.holder, "swept", reason)?
                    {
                        swept += 1;
                    }
                }
            }
        }
        Ok(swept)
    }

    /// Called on every request inside a worktree. Cheap when the process is covered.
    /// Err when the worktree cannot be leased (deleting, removed) or the lease not recorded.
    pub fn touch(
        &self,
        worktree_id: i64,
        worktree_path: impl FnOnce() -> Option<PathBuf>,
        tid: u32,
    ) -> Result<(), LeaseError> {
        let tid = tid as i32;
        if tid <= 0 {
            return Ok(());
        }
        if let Some(set) = self.covered.read().get(&worktree_id) {
            if let Some(active) = set.get(&tid) {
                // Stored only when 100 ms went by: the cell is shared by every process the
                // holder covers.
                let now = now_ms();
                if now - active.load(Ordering::Relaxed) >= 100 {
                    active.store(now, Ordering::Relaxed);
                }
                return Ok(());
            }
        }
        let Some(worktree_path) = worktree_path() else {
            return Ok(());
        };
        let worktree_path = worktree_path.as_path();
        let seen = self.drops.load(Ordering::Acquire);
        let Some(pid) = tgid_of(tid) else {
            return Ok(()); // gone already
        };
        // git run by the daemon for a checkout conversion, and the filters it starts.
        if crate::git::filters::is_ours(pid) {
            return Ok(());
        }
        // Covered by itself or an ancestor?
        let holders: HashMap<i32, Active> = self
            .watched
            .lock()
            .iter()
            .filter(|w| w.worktree_id == worktree_id)
            .map(|w| (w.info.pid, w.active.clone()))
            .collect();
        // A process already known covered covers its descendants too: the set is
        // emptied whenever a holder of this worktree exits.
        let known = |p: i32| {
            self.covered
                .read()
                .get(&worktree_id)
                .and_then(|set| set.get(&p).cloned())
        };
        let covered_by = |active: Active| {
            active.store(now_ms(), Ordering::Relaxed);
            self.mark_covered(worktree_id, seen, &[pid, tid], &active);
        };
        let mut cur = pid;
        let mut depth = 0;
        while cur > 1 && depth < 64 {
            if let Some(active) = holders.get(&cur).cloned().or_else(|| known(cur)) {
                covered_by(active);
                return Ok(());
            }
            cur = match proc_info(cur) {
                Some(p) => p.ppid,
                None => break,
            };
            depth += 1;
        }
        // The holder is the outermost of this process and its ancestors that are inside the
        // worktree: for `cd <worktree> && make`, the shell, whose lease then covers make
        // and everything it starts (the shell's `cd` alone rarely reaches the daemon: the
        // kernel answers it from its caches).
        let Some(mut info) = proc_info(pid) else {
            return Ok(());
        };
        let mut depth = 0;
        while depth < 64 && info.ppid > 1 && is_inside(info.ppid, worktree_path) {
            match proc_info(info.ppid) {
                Some(parent) => info = parent,
                None => break,
            }
            depth += 1;
        }
        if let Some(active) = holders.get(&info.pid) {
            covered_by(active.clone());
            return Ok(());
        }
        // No store re-read here: this runs inside a FUSE request, and the state it moved
        // (ready or lingering to active) is re-read by the next lookup anyway.
        if let Some(active) = self.take(
            worktree_id,
            worktree_path,
            info,
            "first request inside",
            false,
        )? {
            self.mark_covered(worktree_id, seen, &[pid, tid], &active);
        }
        Ok(())
    }

    /// Each watched holder's last activity: (worktree, holder key, unix seconds), for those
    /// a request was seen from since it was watched.
    pub fn activity(&self) -> Vec<(i64, String, i64)> {
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
    fn mark_covered(&self, worktree_id: i64, seen: u64, pids: &[i32], active: &Active) {
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
    fn drop_covered(&self, worktree_id: i64) {
        let mut covered = self.covered.write();
        self.drops.fetch_add(1, Ordering::AcqRel);
        covered.remove(&worktree_id);
    }

    fn take(
        &self,
        worktree_id: i64,
        worktree_path: &Path,
        info: ProcInfo,
        reason: &str,
        notify: bool,
    ) -> Result<Option<Active>, LeaseError> {
        let Some(pidfd) = pidfd_open(info.pid) else {
            return Ok(None); // exited meanwhile
        };
        let command = command_line(info.pid).unwrap_or_else(|| info.command.clone());
        let lease = NewLease::Process {
            pid: info.pid,
            start: info.start,
            command,
        };
        self.record(worktree_id, lease, reason)?;
        let active = self.watch(Watched {
            worktree_id,
            worktree_path: worktree_path.to_path_buf(),
            info,
            pidfd,
            active: if notify { active_none() } else { active_now() },
            since: std::time::Instant::now(),
        });
        let _ = nix::unistd::write(&self.wake.1, b"w");
        if notify {
            (self.on_change)();
        }
        Ok(Some(active))
    }

    /// Records a new process lease: in SQLite when it answers within the request's busy
    /// timeout and nothing is waiting to be written before it, else in memory (the gate
    /// counts it, the writer records it later). Refused only by the lifecycle: the
    /// worktree is deleting (in memory or in SQLite) or removed; a database that cannot be
    /// written never fails the request.
    fn record(&self, worktree_id: i64, lease: NewLease, reason: &str) -> Result<(), LeaseError> {
        use crate::lease::State;
        self.gate
            .enter(worktree_id)
            .map_err(|c| LeaseError::Conflict(c, State::Deleting))?;
        let holder = lease.holder();
        let (queued, again) = {
            let q = self.queue.lock();
            let again = q.iter().any(|op| {
                matches!(op, Op::Acquire { worktree_id: w, lease: l, .. }
                    if *w == worktree_id && l.holder() == holder)
            });
            (!q.is_empty(), again)
        };
        if again {
            // Already waiting to be written (the sweeper adopts a process inside each
            // round while the database is locked): counted once.
            self.gate.recorded(worktree_id);
            return Ok(());
        }
        // Straight to SQLite when nothing waits before it; else, or when SQLite does not
        // take it within the request's timeout, into the queue.
        let late = if queued {
            "recorded after earlier changes waiting".to_string()
        } else {
            match self.fast.lock().acquire_lease(worktree_id, &lease, reason) {
                Ok(_) => {
                    self.gate.recorded(worktree_id);
                    return Ok(());
                }
                Err(e @ (LeaseError::Conflict(..) | LeaseError::Occupied(_))) => {
                    self.gate.recorded(worktree_id);
                    return Err(e);
                }
                Err(LeaseError::Db(e)) => {
                    tracing::warn!(
                        worktree_id,
                        "the lease of {holder} is kept in memory until the database can be written: {e}"
                    );
                    format!("recorded late: {e}")
                }
            }
        };
        self.enqueue(Op::Acquire {
            worktree_id,
            lease,
            reason: format!("{reason} ({late})"),
            since: crate::store::now_secs(),
        });
        Ok(())
    }

    /// The leases kept in memory, not yet in SQLite: (worktree, lease, since), for
    /// `.control/leases` (who holds what, whether or not the database could say so).
    pub fn pending_leases(&self) -> Vec<(i64, NewLease, i64)> {
        let mut out: Vec<(i64, NewLease, i64)> = Vec::new();
        for op in self.queue.lock().iter() {
            match op {
                Op::Acquire {
                    worktree_id,
                    lease,
                    since,
                    ..
                } => out.push((*worktree_id, lease.clone(), *since)),
                Op::Release {
                    worktree_id,
                    holder,
                    ..
                } => out.retain(|(w, l, _)| !(w == worktree_id && l.holder() == *holder)),
            }
        }
        out
    }

    fn enqueue(&self, op: Op) {
        self.queue.lock().push_back(op);
    }

    /// Writes what is waiting, oldest first, until the queue is empty or the database
    /// refuses (busy, full: tried again later). Returns how many are left.
    pub fn drain(&self) -> usize {
        let _one = self.draining.lock();
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return 0;
            }
            // Left in the queue while it is written: `.control/leases` still shows it, and
            // a repeat of it is still counted once.
            let Some(op) = self.queue.lock().front().cloned() else {
                return 0;
            };
            let result = match &op {
                Op::Acquire {
                    worktree_id,
                    lease,
                    reason,
                    ..
                } => match self.store.lock().acquire_lease(*worktree_id, lease, reason) {
                    Ok(_) => Ok(()),
                    Err(LeaseError::Conflict(c, state)) => {
                        // Only this daemon moves a worktree to deleting, and never over a
                        // pending lease: this means someone else did.
                        tracing::error!(
                            worktree_id,
                            "a lease kept in memory could not be recorded: the worktree is {state} ({c:?})"
                        );
                        Ok(())
                    }
                    // A process lease is never refused for occupancy.
                    Err(LeaseError::Occupied(_)) => Ok(()),
                    Err(LeaseError::Db(e)) => Err(e),
                },
                Op::Release {
                    worktree_id,
                    holder,
                    kind,
                    reason,
                } => self
                    .store
                    .lock()
                    .release_lease(*worktree_id, holder, kind, reason)
                    .map(|_| ()),
            };
            if result.as_ref().is_ok() || result.as_ref().is_err_and(|e| !is_transient(e)) {
                // Only the writer takes from the front (under `draining`): still this one.
                self.queue.lock().pop_front();
            }
            match result {
                Ok(()) => {
                    if let Op::Acquire { worktree_id, .. } = &op {
                        self.gate.recorded(*worktree_id);
                    }
                    (self.on_change)();
                }
                Err(e) if is_transient(&e) => {
                    tracing::debug!("lease changes wait for the database: {e}");
                    return self.queue.lock().len();
                }
                Err(e) => {
                    // Not a matter of waiting (the worktree's row is gone, say): dropped,
                    // so it does not hold up every change behind it.
                    tracing::error!(
                        "a lease change kept in memory cannot be written, dropped: {op:?}: {e}"
                    );
                    if let Op::Acquire { worktree_id, .. } = &op {
                        self.gate.recorded(*worktree_id);
                    }
                }
            }
        }
    }

    /// At unmount, once no request can come: what is still waiting is dropped (every
    /// lease is released with reason `unmount` right after) and nothing more is written.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _one = self.draining.lock();
        let dropped = std::mem::take(&mut *self.queue.lock());
        if !dropped.is_empty() {
            tracing::info!(
                "unmount: {} lease change(s) kept in memory are superseded by the release of every lease",
                dropped.len()
            );
        }
    }

    /// Watches a holder's exit, once per (worktree, process); its activity cell (the one
    /// already watched, if it was).
    fn watch(&self, w: Watched) -> Active {
        let mut watched = self.watched.lock();
        match watched
            .iter()
            .find(|x| x.worktree_id == w.worktree_id && x.info == w.info)
        {
            Some(x) => x.active.clone(),
            None => {
                let active = w.active.clone();
                watched.push(w);
                active
            }
        }
    }

    /// A holder exited: pass its lease to a process still inside, else release it.
    /// Its key is in `exiting` from the moment it left `watched` (the watcher puts it
    /// there under the same lock) until its lease is passed on or released.
    fn holder_exited(&self, w: Watched) {
        let key = (w.worktree_id, w.info.pid, w.info.start);
        self.pass_on_or_release(w, "exited");
        self.exiting.lock().remove(&key);
    }

    /// Last close: a watched holder neither of whose process tree is inside its worktree
    /// any more (working directory, root, program, open file, mapping) lets go as if it had
    /// exited (its lease passed to a process still inside, else released). Run by the
    /// sweeper every second; it reads only the holders' own trees. A holder whose tree
    /// cannot be read (no `/proc/<pid>/task/*/children`) keeps its lease until it exits.
    /// Returns how many let go.
    pub fn release_departed(self: &Arc<Self>) -> usize {
        if self.stopped.load(Ordering::Acquire) {
            return 0;
        }
        // Only a holder idle for a second (no request from a process it covers), watched
        // for a second: one at work, whatever its working directory (a program writing
        // through absolute paths), is not let go between its requests.
        let now = now_ms();
        let holders: Vec<(i64, ProcInfo, PathBuf)> = self
            .watched
            .lock()
            .iter()
            .filter(|w| {
                w.since.elapsed() >= std::time::Duration::from_secs(1)
                    && now - w.active.load(Ordering::Relaxed) >= 1000
            })
            .map(|w| (w.worktree_id, w.info.clone(), w.worktree_path.clone()))
            .collect();
        let mut n = 0;
        for (worktree_id, info, path) in holders {
            if tree_inside(info.pid, &path) != Some(false) {
                continue;
            }
            // Still the same process (not exited and reused meanwhile), still watched.
            if proc_info(info.pid).is_none_or(|p| p.start != info.start) {
                continue;
            }
            let w = {
                let mut watched = self.watched.lock();
                let Some(i) = watched
                    .iter()
                    .position(|w| w.worktree_id == worktree_id && w.info == info)
                else {
                    continue;
                };
                let w = watched.remove(i);
                self.exiting
                    .lock()
                    .insert((worktree_id, info.pid, info.start));
                w
            };
            tracing::info!(
                "process {} ({}) left {}: nothing of its process tree is inside",
                info.pid,
                info.command,
                path.display()
            );
            // On a thread of its own, as an exit is (its scans for an heir take a
            // while): the sweeper goes on.
            let me = self.clone();
            let _ = std::thread::Builder::new()
                .name("lease-left".into())
                .spawn(move || {
                    let key = (w.worktree_id, w.info.pid, w.info.start);
                    me.pass_on_or_release(w, "left (nothing of its process tree is inside)");
                    me.exiting.lock().remove(&key);
                });
            n += 1;
        }
        n
    }

    fn pass_on_or_release(&self, w: Watched, how: &str) {
        let holder = NewLease::Process {
            pid: w.info.pid,
            start: w.info.start,
            command: String::new(),
        }
        .holder();
        self.drop_covered(w.worktree_id);
        // A process that is forking or exiting right now may be missing from one scan (a
        // zombie has no working directory; a child not yet forked is not there): look
        // again twice before concluding nobody is inside. Still well within a second.
        // The heir is watched (pidfd open, start time checked) before its lease is taken,
        // so no lease is ever recorded for a process nobody watches.
        let mut heir: Option<(ProcInfo, OwnedFd)> = None;
        'scan: for wait_ms in [0, 50, 200] {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            // Processes that hold a lease here already keep their own; the exited holder's
            // parent (a shell whose command ended) comes first, then the rest by pid.
            let holders: HashSet<i32> = self
                .watched
                .lock()
                .iter()
                .filter(|x| x.worktree_id == w.worktree_id)
                .map(|x| x.info.pid)
                .collect();
            let mut inside: Vec<i32> = processes_inside(&w.worktree_path, w.info.pid)
                .into_iter()
                .filter(|p| !holders.contains(p))
                .collect();
            inside.sort_by_key(|p| (*p != w.info.ppid, *p));
            tracing::debug!(
                "holder {} of {} exited; inside without a lease: {inside:?}",
                w.info.pid,
                w.worktree_path.display()
            );
            for pid in inside {
                let Some(pidfd) = pidfd_open(pid) else {
                    continue;
                };
                let Some(info) = proc_info(pid) else { continue };
                heir = Some((info, pidfd));
                break 'scan;
            }
        }
        // Through the queue, in order behind anything not yet written (the exited
        // holder's own lease, if it was kept in memory).
        match heir {
            Some((info, pidfd)) => {
                // The heir's lease first, so the worktree never looks unheld.
                let heir_lease = NewLease::Process {
                    pid: info.pid,
                    start: info.start,
                    command: command_line(info.pid).unwrap_or_else(|| info.command.clone()),
                };
                let reason = format!("holder {} {how}; {} is still inside", w.info.pid, info.pid);
                if self.gate.enter_continuing(w.worktree_id).is_ok() {
                    self.enqueue(Op::Acquire {
                        worktree_id: w.worktree_id,
                        lease: heir_lease,
                        reason: reason.clone(),
                        since: crate::store::now_secs(),
                    });
                    self.watch(Watched {
                        worktree_id: w.worktree_id,
                        worktree_path: w.worktree_path.clone(),
                        info,
                        pidfd,
                        active: active_none(),
                        since: std::time::Instant::now(),
                    });
                    // The watcher polls the heir's pidfd from now on, not a second later.
                    let _ = nix::unistd::write(&self.wake.1, b"w");
                }
                self.enqueue(Op::Release {
                    worktree_id: w.worktree_id,
                    holder,
                    kind: "passed",
                    reason,
                });
            }
            None => self.enqueue(Op::Release {
                worktree_id: w.worktree_id,
                holder,
                kind: "released",
                reason: format!("holder {how}"),
            }),
        }
        let left = self.drain();
        if left > 0 {
            tracing::warn!(
                "the lease of process {} ({how}) is released once the database can be written ({left} change(s) waiting)",
                w.info.pid
            );
        }
        (self.on_change)();
    }

    /// The watcher: waits on every holder's pidfd and the wake pipe; and the writer, which
    /// records the lease changes kept in memory as soon as the database takes them (on a
    /// thread of its own: a database locked for long must not delay noticing exits).
    pub fn spawn_watcher(self: &Arc<Self>) {
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-writer".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                if !me.queue.lock().is_empty() {
                    me.drain();
                }
            });
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-watcher".into())
            .spawn(move || loop {
                let mut fds: Vec<libc::pollfd> = vec![libc::pollfd {
                    fd: me.wake.0.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // Who each descriptor polled is: another thread (a holder that left) may
                // close one meanwhile and a new holder get its number, so what fired is
                // told by who was polled, not by the number.
                let polled: Vec<(i64, ProcInfo)> = {
                    let watched = me.watched.lock();
                    fds.extend(watched.iter().map(|w| libc::pollfd {
                        fd: w.pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                    watched
                        .iter()
                        .map(|w| (w.worktree_id, w.info.clone()))
                        .collect()
                };
                // SAFETY: fds is a valid array of pollfd for its length.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
                if n <= 0 {
                    continue;
                }
                if fds[0].revents != 0 {
                    let mut buf = [0u8; 64];
                    let _ = nix::unistd::read(me.wake.0.as_raw_fd(), &mut buf);
                }
                let fired: Vec<&(i64, ProcInfo)> = fds[1..]
                    .iter()
                    .zip(&polled)
                    .filter(|(p, _)| p.revents != 0)
                    .map(|(_, who)| who)
                    .collect();
                if fired.is_empty() {
                    continue;
                }
                let gone: Vec<Watched> = {
                    let mut watched = me.watched.lock();
                    // Exited for sure (a descriptor closed under the poll fires too): its
                    // process no longer runs with that start time.
                    let (gone, keep): (Vec<Watched>, Vec<Watched>) =
                        watched.drain(..).partition(|w| {
                            fired
                                .iter()
                                .any(|(id, info)| *id == w.worktree_id && *info == w.info)
                                && proc_info(w.info.pid)
                                    .is_none_or(|p| p.start != w.info.start || is_zombie_pid(p.pid))
                        });
                    *watched = keep;
                    me.exiting.lock().extend(
                        gone.iter()
                            .map(|w| (w.worktree_id, w.info.pid, w.info.start)),
                    );
                    gone
                };
                // Each on its own thread: one exit's rescans must not delay another's.
                for w in gone {
                    let me = me.clone();
                    let _ = std::thread::Builder::new()
                        .name("lease-exit".into())
                        .spawn(move || me.holder_exited(w));
                }
            });
    }

    /// Before a worktree may start deleting: a process inside it that never made a request
    /// the kernel could not answer from its caches gets its lease now.
    pub fn adopt_processes_inside(&self, worktree_id: i64, worktree_path: &Path) -> bool {
        let mut any = false;
        for pid in processes_inside(worktree_path, 0) {
            if let Some(info) = proc_info(pid) {
                if self
                    .take(
                        worktree_id,
                        worktree_path,
                        info,
                        "inside at the end of the grace period",
                        true,
                    )
                    .is_ok()
                {
                    any = true;
                }
            }
        }
        any
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
            Box::new(|| {}),
        )
        .unwrap();
        let covered = |pid| {
            t.covered
                .read()
                .get(&7)
                .is_some_and(|s| s.contains_key(&pid))
        };
        let a = active_none();
        let seen = t.drops.load(Ordering::Acquire);
        t.mark_covered(7, seen, &[100, 101], &a);
        assert!(covered(100) && covered(101));
        // A walk starts, then a holder of the worktree exits: what the walk found must not
        // come back after the drop (a covered process covers its descendants too).
        let seen = t.drops.load(Ordering::Acquire);
        t.drop_covered(7);
        assert!(!covered(100));
        t.mark_covered(7, seen, &[200], &a);
        assert!(!covered(200));
        // A walk that starts after the drop is remembered again.
        t.mark_covered(7, t.drops.load(Ordering::Acquire), &[200], &a);
        assert!(covered(200));
    }
}
