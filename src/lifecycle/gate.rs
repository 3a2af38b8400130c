//! The gate: what the live daemon knows, in memory, of the leases and removals of its
//! worktrees, so that a request never waits on SQLite and the move to `deleting` still
//! sees every lease.
//!
//! A process lease is recorded in SQLite with a short busy timeout; when that fails (the
//! database is locked by another process, its disk is full) the lease is kept here,
//! `pending`, until the tracker's writer records it. The move to `deleting` is made only by
//! this daemon (its sweeper, `rmdir`, and `reclaim` asked of it through its socket), each
//! holding a [`Closed`] guard from [`Gate::close`] around the transaction that makes it:
//! the guard is refused while a lease is pending, and while any guard lives no new lease
//! is let in. So the one transaction that marks a worktree deleting sees every lease:
//! those in SQLite by its own reading, those in memory because none can exist. Once
//! deleting, the worktree takes no lease because the catalog says so
//! ([`Gate::set_deleting`], from every re-read of the store), which the closer re-reads
//! before its guard goes.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use crate::lease::Conflict;

#[derive(Debug, Default)]
struct Entry {
    /// Process leases taken but not yet recorded in SQLite.
    pending: usize,
    /// Guards alive: moves to `deleting` being decided or carried out.
    closers: usize,
}

#[derive(Debug, Default)]
pub struct Gate {
    worktrees: Mutex<HashMap<i64, Entry>>,
    /// Worktrees the store says are deleting, as last read.
    deleting: Mutex<HashSet<i64>>,
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// A new lease is being taken on worktree `id`: counted as pending until
    /// [`Gate::recorded`]. Refused (as deleting) while the worktree is closed or deleting.
    pub fn enter(&self, id: i64) -> Result<(), Conflict> {
        if self.deleting.lock().contains(&id) {
            return Err(Conflict::Deleting);
        }
        let mut w = self.worktrees.lock();
        let e = w.entry(id).or_default();
        if e.closers > 0 {
            return Err(Conflict::Deleting);
        }
        e.pending += 1;
        Ok(())
    }

    /// A lease passed on from a holder that exited to a process still inside: it
    /// continues a lease that exists, so a closed gate does not refuse it (the closer's
    /// transaction sees the old lease or this one); a deleting worktree does.
    pub fn enter_continuing(&self, id: i64) -> Result<(), Conflict> {
        if self.deleting.lock().contains(&id) {
            return Err(Conflict::Deleting);
        }
        self.worktrees.lock().entry(id).or_default().pending += 1;
        Ok(())
    }

    /// A lease counted by [`Gate::enter`] is in SQLite now, or was refused there.
    pub fn recorded(&self, id: i64) {
        let mut w = self.worktrees.lock();
        if let Some(e) = w.get_mut(&id) {
            e.pending = e.pending.saturating_sub(1);
            if e.pending == 0 && e.closers == 0 {
                w.remove(&id);
            }
        }
    }

    /// Leases of worktree `id` held in memory only.
    pub fn pending(&self, id: i64) -> usize {
        self.worktrees.lock().get(&id).map_or(0, |e| e.pending)
    }

    /// Closes worktree `id` to new leases while the guard lives: None while a lease is
    /// pending. Guards nest (the sweeper and an rmdir at once each hold their own).
    pub fn close(&self, id: i64) -> Option<Closed<'_>> {
        let mut w = self.worktrees.lock();
        let e = w.entry(id).or_default();
        if e.pending > 0 {
            return None;
        }
        e.closers += 1;
        Some(Closed { gate: self, id })
    }

    /// The worktrees the store says are deleting (from each re-read of the store).
    pub fn set_deleting(&self, ids: impl IntoIterator<Item = i64>) {
        *self.deleting.lock() = ids.into_iter().collect();
    }
}

/// Worktree `id` takes no new lease while this lives.
#[derive(Debug)]
pub struct Closed<'a> {
    gate: &'a Gate,
    id: i64,
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        let mut w = self.gate.worktrees.lock();
        if let Some(e) = w.get_mut(&self.id) {
            e.closers = e.closers.saturating_sub(1);
            if e.pending == 0 && e.closers == 0 {
                w.remove(&self.id);
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
        assert!(g.close(1).is_none(), "closed over a pending lease");
        assert!(g.close(2).is_some(), "another worktree is not held");
        g.recorded(1);
        let first = g.close(1).expect("no lease pending");
        assert_eq!(g.enter(1), Err(Conflict::Deleting));
        let second = g.close(1).expect("guards nest");
        drop(first);
        assert_eq!(
            g.enter(1),
            Err(Conflict::Deleting),
            "one closer opened the other's gate"
        );
        // An heir continues a lease that exists: let in, and counted.
        g.enter_continuing(1).unwrap();
        assert_eq!(g.pending(1), 1);
        g.recorded(1);
        drop(second);
        g.enter(1).unwrap();
        g.recorded(1);
        assert!(g.worktrees.lock().is_empty(), "nothing left behind");
    }

    #[test]
    fn a_deleting_worktree_takes_no_lease_and_the_set_is_replaced_on_each_read() {
        let g = Gate::new();
        g.set_deleting([3]);
        assert_eq!(g.enter(3), Err(Conflict::Deleting));
        assert_eq!(g.enter_continuing(3), Err(Conflict::Deleting));
        g.set_deleting([]);
        g.enter(3).unwrap();
        g.recorded(3);
        assert!(g.worktrees.lock().is_empty());
    }
}
