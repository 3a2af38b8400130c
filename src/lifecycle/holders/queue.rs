//! Lease changes SQLite could not take at once (busy, disk full): kept in memory, counted
//! by the gate, and written by one writer in the order they were made.

use std::sync::atomic::Ordering;

use crate::store::{LeaseError, NewLease};

use super::tracker::{Op, Tracker};
use crate::ids::WorktreeId;

impl Tracker {
    /// The leases kept in memory, not yet in SQLite: (worktree, lease, since), for
    /// `.control/leases` (who holds what, whether or not the database could say so).
    pub fn pending_leases(&self) -> Vec<(WorktreeId, NewLease, i64)> {
        let mut out: Vec<(WorktreeId, NewLease, i64)> = Vec::new();
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

    pub(super) fn enqueue(&self, op: Op) {
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
                            worktree_id = %worktree_id,
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
            if result.as_ref().is_ok() || result.as_ref().is_err_and(|e| !e.is_transient()) {
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
                Err(e) if e.is_transient() => {
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
}
