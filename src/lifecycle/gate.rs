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
//! deleting, the worktree takes no lease: its closer marks it so ([`Closed::deleting`])
//! before its guard goes, and every re-read of the store says so
//! ([`Gate::set_deleting`]); a mark goes only with a read begun after it. A new lease that
//! finds the gate closed waits briefly for the decision rather than being refused.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::ids::WorktreeId;
use crate::lease::Conflict;

/// How long a new lease waits for a closed gate to open (a move to `deleting` being
/// decided takes at most `cleanup::DECIDE_BUSY_TIMEOUT`) before it is refused.
const WAIT_FOR_DECISION: Duration = Duration::from_millis(300);

#[derive(Debug, Default)]
struct Entry {
    /// Process leases taken but not yet recorded in SQLite.
    pending: usize,
    /// Guards alive: moves to `deleting` being decided or carried out.
    closers: usize,
}

#[derive(Debug, Default)]
struct Inner {
    worktrees: HashMap<WorktreeId, Entry>,
    /// Worktrees the store said were deleting, as last read.
    from_store: HashSet<WorktreeId>,
    /// Worktrees a closer marked deleting, with the number of store reads begun by then:
    /// kept until a read begun later shows otherwise (an older read cannot undo a mark).
    marked: HashMap<WorktreeId, u64>,
    /// Store reads begun.
    reads: u64,
}

impl Inner {
    fn deleting(&self, id: WorktreeId) -> bool {
        self.from_store.contains(&id) || self.marked.contains_key(&id)
    }

    fn tidy(&mut self, id: WorktreeId) {
        if self
            .worktrees
            .get(&id)
            .is_some_and(|e| e.pending == 0 && e.closers == 0)
        {
            self.worktrees.remove(&id);
        }
    }
}

#[derive(Debug, Default)]
pub struct Gate {
    inner: Mutex<Inner>,
    /// Signalled when a guard goes.
    opened: Condvar,
}

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    /// A new lease is being taken on worktree `id`: counted as pending until
    /// [`Gate::recorded`]. Refused (as deleting) when the worktree is deleting, or still
    /// closed after a brief wait for the decision under way.
    pub fn enter(&self, id: WorktreeId) -> Result<(), Conflict> {
        let mut g = self.inner.lock();
        let deadline = std::time::Instant::now() + WAIT_FOR_DECISION;
        loop {
            if g.deleting(id) {
                return Err(Conflict::Deleting);
            }
            let closed = g.worktrees.get(&id).is_some_and(|e| e.closers > 0);
            if !closed {
                break;
            }
            if self.opened.wait_until(&mut g, deadline).timed_out() {
                let still = g.worktrees.get(&id).is_some_and(|e| e.closers > 0);
                if still || g.deleting(id) {
                    return Err(Conflict::Deleting);
                }
                break;
            }
        }
        g.worktrees.entry(id).or_default().pending += 1;
        Ok(())
    }

    /// A lease passed on from a holder that exited to a process still inside: it
    /// continues a lease that exists, so a closed gate does not refuse it (the closer's
    /// transaction sees the old lease or this one); a deleting worktree does.
    pub fn enter_continuing(&self, id: WorktreeId) -> Result<(), Conflict> {
        let mut g = self.inner.lock();
        if g.deleting(id) {
            return Err(Conflict::Deleting);
        }
        g.worktrees.entry(id).or_default().pending += 1;
        Ok(())
    }

    /// A lease counted by [`Gate::enter`] is in SQLite now, or was refused there.
    pub fn recorded(&self, id: WorktreeId) {
        let mut g = self.inner.lock();
        if let Some(e) = g.worktrees.get_mut(&id) {
            e.pending = e.pending.saturating_sub(1);
        }
        g.tidy(id);
    }

    /// Leases of worktree `id` held in memory only.
    pub fn pending(&self, id: WorktreeId) -> usize {
        self.inner
            .lock()
            .worktrees
            .get(&id)
            .map_or(0, |e| e.pending)
    }

    /// Closes worktree `id` to new leases while the guard lives: None while a lease is
    /// pending. Guards nest (the sweeper and an rmdir at once each hold their own).
    pub fn close(&self, id: WorktreeId) -> Option<Closed<'_>> {
        let mut g = self.inner.lock();
        let e = g.worktrees.entry(id).or_default();
        if e.pending > 0 {
            return None;
        }
        e.closers += 1;
        Some(Closed { gate: self, id })
    }

    /// A re-read of the store begins; returns its number, for [`Gate::set_deleting`].
    pub fn begin_read(&self) -> u64 {
        let mut g = self.inner.lock();
        g.reads += 1;
        g.reads
    }

    /// The worktrees read `read` (from [`Gate::begin_read`]) found deleting. A closer's
    /// mark goes only when a read begun after it no longer shows the worktree deleting.
    pub fn set_deleting(&self, read: u64, ids: impl IntoIterator<Item = WorktreeId>) {
        let mut g = self.inner.lock();
        g.from_store = ids.into_iter().collect();
        let Inner {
            from_store, marked, ..
        } = &mut *g;
        marked.retain(|id, at| *at >= read || from_store.contains(id));
    }
}

/// Worktree `id` takes no new lease while this lives.
#[derive(Debug)]
pub struct Closed<'a> {
    gate: &'a Gate,
    id: WorktreeId,
}

impl Closed<'_> {
    /// The move this guard covers was made: the worktree is deleting, and takes no lease
    /// from now on, whether or not the store can be read back.
    pub fn deleting(&self) {
        let mut g = self.gate.inner.lock();
        let at = g.reads;
        g.marked.insert(self.id, at);
    }
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        let mut g = self.gate.inner.lock();
        if let Some(e) = g.worktrees.get_mut(&self.id) {
            e.closers = e.closers.saturating_sub(1);
        }
        g.tidy(self.id);
        self.gate.opened.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(g: &Gate) -> bool {
        g.inner.lock().worktrees.is_empty()
    }

    #[test]
    fn a_pending_lease_keeps_the_gate_open_and_a_closed_gate_refuses_leases() {
        let g = Gate::new();
        g.enter(WorktreeId(1)).unwrap();
        assert!(
            g.close(WorktreeId(1)).is_none(),
            "closed over a pending lease"
        );
        assert!(
            g.close(WorktreeId(2)).is_some(),
            "another worktree is not held"
        );
        g.recorded(WorktreeId(1));
        let first = g.close(WorktreeId(1)).expect("no lease pending");
        assert_eq!(g.enter(WorktreeId(1)), Err(Conflict::Deleting));
        let second = g.close(WorktreeId(1)).expect("guards nest");
        drop(first);
        assert_eq!(
            g.enter(WorktreeId(1)),
            Err(Conflict::Deleting),
            "one closer opened the other's gate"
        );
        // An heir continues a lease that exists: let in, and counted.
        g.enter_continuing(WorktreeId(1)).unwrap();
        assert_eq!(g.pending(WorktreeId(1)), 1);
        g.recorded(WorktreeId(1));
        drop(second);
        g.enter(WorktreeId(1)).unwrap();
        g.recorded(WorktreeId(1));
        assert!(empty(&g), "nothing left behind");
    }

    #[test]
    fn a_lease_waits_for_a_decision_that_keeps_the_worktree() {
        let g = std::sync::Arc::new(Gate::new());
        let closed = g.close(WorktreeId(1)).unwrap();
        let g2 = g.clone();
        let t = std::thread::spawn(move || g2.enter(WorktreeId(1)));
        std::thread::sleep(Duration::from_millis(50));
        drop(closed);
        assert_eq!(t.join().unwrap(), Ok(()), "refused after the gate opened");
        g.recorded(WorktreeId(1));
        assert!(empty(&g));
    }

    #[test]
    fn a_mark_outlives_reads_begun_before_it_and_goes_with_a_later_one() {
        let g = Gate::new();
        let stale = g.begin_read();
        let closed = g.close(WorktreeId(3)).unwrap();
        closed.deleting();
        drop(closed);
        assert_eq!(g.enter(WorktreeId(3)), Err(Conflict::Deleting));
        // A read begun before the mark, applied after it, does not undo it.
        g.set_deleting(stale, []);
        assert_eq!(g.enter(WorktreeId(3)), Err(Conflict::Deleting));
        // A read begun later that shows it deleting keeps it so; one that does not
        // (the cleanup retained it) lets leases in again.
        let r = g.begin_read();
        g.set_deleting(r, [WorktreeId(3)]);
        assert_eq!(g.enter_continuing(WorktreeId(3)), Err(Conflict::Deleting));
        let r = g.begin_read();
        g.set_deleting(r, []);
        g.enter(WorktreeId(3)).unwrap();
        g.recorded(WorktreeId(3));
        assert!(empty(&g));
    }
}
