//! The gate: what the live daemon knows, in memory, of the leases and removals of its
//! worktrees, so that a request never waits on SQLite and the move to `deleting` still
//! sees every lease.
//!
//! A process lease is recorded in SQLite with a short busy timeout; when that fails (the
//! database is locked by another process, its disk is full) the lease is kept here,
//! `pending`, until the tracker's writer records it. The move to `deleting` is made only by
//! this daemon (its sweeper, `rmdir`, and `reclaim` asked of it through its socket), and
//! only through [`Gate::close`]: it is refused while a lease is pending, and from then
//! until the worktree is open again (the move did not happen, or its cleanup retained it;
//! a removed worktree stays closed) no new lease is let in. So the one transaction that marks a
//! worktree deleting, run while the gate is closed, sees every lease: those in SQLite by
//! its own reading, those in memory because none can exist.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::lease::Conflict;

#[derive(Debug, Default)]
struct Entry {
    /// Process leases taken but not yet recorded in SQLite.
    pending: usize,
    /// A move to `deleting` is being decided or carried out.
    closing: bool,
}

#[derive(Debug, Default)]
pub struct Gate {
    worktrees: Mutex<HashMap<i64, Entry>>,
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// A lease is being taken on worktree `id`: counted as pending until [`Gate::recorded`].
    /// Refused (as deleting) while the worktree is closing.
    pub fn enter(&self, id: i64) -> Result<(), Conflict> {
        let mut w = self.worktrees.lock();
        let e = w.entry(id).or_default();
        if e.closing {
            return Err(Conflict::Deleting);
        }
        e.pending += 1;
        Ok(())
    }

    /// A lease counted by [`Gate::enter`] is in SQLite now, or was refused there.
    pub fn recorded(&self, id: i64) {
        let mut w = self.worktrees.lock();
        if let Some(e) = w.get_mut(&id) {
            e.pending = e.pending.saturating_sub(1);
            if e.pending == 0 && !e.closing {
                w.remove(&id);
            }
        }
    }

    /// Leases of worktree `id` held in memory only.
    pub fn pending(&self, id: i64) -> usize {
        self.worktrees.lock().get(&id).map_or(0, |e| e.pending)
    }

    /// Closes worktree `id` to new leases, for a move to `deleting` and for as long as it
    /// is deleting: false (and nothing changes) while a lease is pending. Closing a closed
    /// worktree again is allowed (a cleanup carried on).
    pub fn close(&self, id: i64) -> bool {
        let mut w = self.worktrees.lock();
        let e = w.entry(id).or_default();
        if e.pending > 0 {
            return false;
        }
        e.closing = true;
        true
    }

    /// Leases may come in again: the move to `deleting` did not happen, or its cleanup
    /// kept the worktree (retained, or back in the state it had).
    pub fn open(&self, id: i64) {
        let mut w = self.worktrees.lock();
        if let Some(e) = w.get_mut(&id) {
            e.closing = false;
            if e.pending == 0 {
                w.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_lease_keeps_the_gate_open_and_a_closed_gate_refuses_leases() {
        let g = Gate::new();
        g.enter(1).unwrap();
        assert!(!g.close(1), "closed over a pending lease");
        assert!(g.close(2), "another worktree is not held");
        g.recorded(1);
        assert!(g.close(1), "no lease pending");
        assert_eq!(g.enter(1), Err(Conflict::Deleting));
        assert!(g.close(1), "a cleanup carried on closes again");
        assert_eq!(g.pending(1), 0);
        g.open(1);
        g.enter(1).unwrap();
        assert_eq!(g.pending(1), 1);
        g.recorded(1);
        g.open(2);
        assert!(g.worktrees.lock().is_empty(), "nothing left behind");
    }
}
