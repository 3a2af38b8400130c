//! The runners running now, by worktree: setup runners (whose lease is never passed on
//! when they exit: their end is their setup's) and teardown runners (whose processes are
//! let into a worktree that is deleting). One registry per daemon: it makes it, gives it
//! to its [`Launcher`](super::Launcher), which registers each runner it starts, and
//! asks it through the lease tracker and the view.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ids::WorktreeId;

/// The runners running now; clones share one registry.
#[derive(Debug, Clone, Default)]
pub struct Runners(Arc<Registry>);

#[derive(Debug, Default)]
struct Registry {
    /// The teardowns running, by worktree: their runners' pids.
    teardowns: Mutex<Vec<(WorktreeId, i32)>>,
    /// How many are running: while none is, nothing is looked up.
    teardown_count: AtomicUsize,
    /// The setup runners running, by worktree.
    setups: Mutex<Vec<(WorktreeId, i32)>>,
}

/// A runner, registered for as long as this lives: a teardown's, or a setup's.
pub(super) struct Registered {
    runners: Runners,
    key: (WorktreeId, i32),
    teardown: bool,
}

impl Runners {
    /// Registers `pid` as worktree `id`'s teardown runner.
    pub(super) fn teardown(&self, id: WorktreeId, pid: i32) -> Registered {
        self.0.teardowns.lock().push((id, pid));
        self.0.teardown_count.fetch_add(1, Ordering::SeqCst);
        Registered {
            runners: self.clone(),
            key: (id, pid),
            teardown: true,
        }
    }

    /// Registers `pid` as worktree `id`'s setup runner.
    pub(super) fn setup(&self, id: WorktreeId, pid: i32) -> Registered {
        self.0.setups.lock().push((id, pid));
        Registered {
            runners: self.clone(),
            key: (id, pid),
            teardown: false,
        }
    }

    /// Whether process `pid` is worktree `id`'s setup runner: its lease is never passed
    /// on to a process still inside when it exits (what it left there is its setup's,
    /// ended with it), and its end is the setup's.
    pub fn is_setup_runner(&self, id: WorktreeId, pid: i32) -> bool {
        self.0.setups.lock().contains(&(id, pid))
    }

    /// Whether worktree `id` is running its teardown now (its directory is then served
    /// to the teardown's processes though it is deleting).
    pub fn tearing_down(&self, id: WorktreeId) -> bool {
        self.0.teardown_count.load(Ordering::SeqCst) > 0
            && self.0.teardowns.lock().iter().any(|&(w, _)| w == id)
    }

    /// Whether process `pid` is worktree `id`'s teardown runner or below it (looked up
    /// through `/proc`, at most 32 parents up): such a process works in the worktree
    /// without a lease.
    pub fn teardown_covers(&self, id: WorktreeId, pid: i32) -> bool {
        if self.0.teardown_count.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let runners: Vec<i32> = self
            .0
            .teardowns
            .lock()
            .iter()
            .filter(|&&(w, _)| w == id)
            .map(|&(_, p)| p)
            .collect();
        let mut p = pid;
        for _ in 0..32 {
            if runners.contains(&p) {
                return true;
            }
            match crate::process::info::proc_info(p) {
                Some(info) if info.ppid > 1 => p = info.ppid,
                _ => return false,
            }
        }
        false
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let key = self.key;
        let registry = &self.runners.0;
        if self.teardown {
            registry.teardowns.lock().retain(|&k| k != key);
            registry.teardown_count.fetch_sub(1, Ordering::SeqCst);
        } else {
            registry.setups.lock().retain(|&k| k != key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner counts while it is registered, for its own worktree, in its own role;
    /// two registries (two daemons) know nothing of each other's.
    #[test]
    fn a_runner_counts_while_registered_for_its_worktree_alone() {
        let runners = Runners::default();
        let other = Runners::default();
        let (a, b) = (WorktreeId(1), WorktreeId(2));
        let me = std::process::id() as i32;
        assert!(!runners.tearing_down(a));
        let setup = runners.setup(a, 41);
        assert!(runners.is_setup_runner(a, 41));
        assert!(!runners.is_setup_runner(b, 41));
        assert!(!runners.tearing_down(a), "a setup is no teardown");
        let teardown = runners.clone().teardown(a, me);
        assert!(runners.tearing_down(a) && !runners.tearing_down(b));
        assert!(!other.tearing_down(a) && !other.is_setup_runner(a, 41));
        assert!(runners.teardown_covers(a, me));
        assert!(!runners.teardown_covers(b, me));
        drop(teardown);
        drop(setup);
        assert!(!runners.tearing_down(a));
        assert!(!runners.teardown_covers(a, me));
        assert!(!runners.is_setup_runner(a, 41));
    }

    /// A process below a teardown runner is covered by it: this test's child, below
    /// this process registered as the runner.
    #[test]
    fn a_process_below_a_teardown_runner_is_covered() {
        let runners = Runners::default();
        let id = WorktreeId(3);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!runners.teardown_covers(id, pid));
        let registered = runners.teardown(id, std::process::id() as i32);
        assert!(runners.teardown_covers(id, pid));
        drop(registered);
        assert!(!runners.teardown_covers(id, pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
