//! worktreefs: a FUSE filesystem that gives every agent its own copy-on-write git worktree.
//!
//! Layers, each testable without a mount:
//! * [`store`]: the SQLite schema and its migrations.
//! * [`gitlayer`]: reading trees and blobs, writing what git needs (admin entry, index).
//! * [`worktree`]: creating a managed worktree, all or nothing.
//! * [`view`]: the copy-on-write view and the namespace of a mount.
//! * [`fsmonitor`]: git's fsmonitor hook answered from each worktree's change journal.
//! * [`fuse`]: the thin adapter from fuser's callbacks to [`view`].
//! * [`daemon`]: locking the state directory, mounting, serving, unmounting.

pub mod daemon;
pub mod durable;
pub mod fs;
pub mod git;
pub mod ino;
pub mod layout;
pub mod lease;
pub mod lifecycle;
pub mod names;
pub mod report;
pub mod state;
pub mod store;
