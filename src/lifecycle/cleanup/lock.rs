//! The lock one worktree's cleanup holds (`<state>/locks/<id>`): the sweeper, a reclaim
//! and the boot reconcile never work on the same worktree, and a fork holds it shared.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use crate::ids::WorktreeId;
use crate::state::StateDir;

/// Held by whoever runs one worktree's cleanup (the daemon's sweeper, a reclaim, the boot
/// reconcile), so two never work on the same worktree.
pub struct CleanupLock(#[allow(dead_code)] File);

pub fn try_lock(state: &StateDir, id: WorktreeId) -> Option<CleanupLock> {
    flock_nb(state, id, libc::LOCK_EX)
}

/// `<state>/locks/<id>` flock'd with `how` (`LOCK_EX`, `LOCK_SH`), not waiting.
fn flock_nb(state: &StateDir, id: WorktreeId, how: i32) -> Option<CleanupLock> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state.cleanup_lock(id))
        .ok()?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), how | libc::LOCK_NB) };
    (rc == 0).then_some(CleanupLock(f))
}

/// `try_lock`, shared: what a fork of the worktree holds (forks of one parent run at
/// once; its removal, which takes the lock exclusively, waits for them all).
pub fn try_lock_shared(state: &StateDir, id: WorktreeId) -> Option<CleanupLock> {
    flock_nb(state, id, libc::LOCK_SH)
}
