//! The worktree lifecycle: creation, the processes that hold leases, cleanup after the
//! last release, and the sweeper that moves worktrees through their states. Leases and
//! states themselves are `crate::lease` (the pure state machine) and `crate::store` (their
//! transactions).
//!
//! The lifecycle never imports `crate::fs`: where it must reach the mounted filesystem, it
//! calls [`Mounted`], which the filesystem implements.

pub mod admin_entries;
pub mod cleanup;
pub mod create;
pub mod error;
pub mod fork;
pub mod gate;
pub mod glance;
pub mod holders;
pub mod layer_copy;
pub mod occupancy;
pub mod ports;
pub mod restore;
pub mod setup;
pub mod submodules;
pub mod sweeper;
pub mod turns;
pub mod warm;

pub use sweeper::Mounted;
