//! Process leases: which process holds which worktree, and noticing when it exits.
//!
//! The first request inside a worktree from a process that is not covered (neither it nor
//! an ancestor holds a lease there) takes a lease for it, identified by pid and start time.
//! Covered processes are remembered per worktree, so a covered process costs one hash
//! lookup per request. A pidfd per holder tells a watcher thread the moment the holder
//! exits; the lease then passes to a process still inside the worktree (working directory
//! or an open file below it), or is released.
//!
//! - `tracker.rs`: the tracker's state (holders, covered processes, the queue).
//! - `requests.rs`: a request inside a worktree: covered, or a lease taken.
//! - `watcher.rs`: holders' exits, and the leases passed on or released.
//! - `queue.rs`: lease changes written later when SQLite is busy.

mod queue;
mod requests;
mod tracker;
mod watcher;

pub use tracker::Tracker;
