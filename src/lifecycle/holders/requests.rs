//! What a request inside a worktree does to leases: a process not yet covered takes one
//! (its outermost ancestor inside does), recorded in SQLite or queued; leases others
//! recorded are watched from the sweeper's round.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::lifecycle::error::LifecycleResult;
use crate::process::info::{command_line, proc_info, tgid_of, ProcInfo};
use crate::process::inside::{is_inside, processes_inside};
use crate::process::pidfd::pidfd_open;
use crate::store::{LeaseError, NewLease};

use super::tracker::{active_none, active_now, now_ms, Active, Op, Tracker, Watched};
use crate::ids::WorktreeId;

impl Tracker {
    /// Boot reconcile: process leases whose process is gone (or whose pid now names
    /// another process) are swept; live ones are watched again.
    pub fn reconcile(&self, mountpoint: &Path) -> LifecycleResult<()> {
        self.watch_recorded(mountpoint, "process gone at boot")?;
        (self.on_change)();
        Ok(())
    }

    /// Process leases recorded by someone else (`run --exclusive` records its own, which
    /// the daemon never took when an ancestor inside covered it): watched from now on, or
    /// swept (`reason`) when their process is gone. Run by the sweeper every second, so
    /// such a lease ends within about a second of its process, however it ends. Returns
    /// how many were swept.
    pub fn watch_recorded(&self, mountpoint: &Path, reason: &str) -> LifecycleResult<usize> {
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
            // A setup's runner: its lease ends as its setup does (`lifecycle::setup`).
            let runner = self.runners.is_setup_runner(l.worktree_id, pid);
            if known || releasing || runner {
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
        worktree_id: WorktreeId,
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
        // git run by the daemon for a checkout conversion, and the filters it starts; a
        // teardown command the daemon runs before the worktree goes.
        if crate::git::filters::is_ours(pid) || self.runners.teardown_covers(worktree_id, pid) {
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

    pub(super) fn take(
        &self,
        worktree_id: WorktreeId,
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
    pub(super) fn record(
        &self,
        worktree_id: WorktreeId,
        lease: NewLease,
        reason: &str,
    ) -> Result<(), LeaseError> {
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
                        worktree_id = %worktree_id,
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

    /// Before a worktree may start deleting: a process inside it that never made a request
    /// the kernel could not answer from its caches gets its lease now.
    pub fn adopt_processes_inside(&self, worktree_id: WorktreeId, worktree_path: &Path) -> bool {
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
