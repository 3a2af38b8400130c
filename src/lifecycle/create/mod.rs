//! Creating a worktree, and what a fork and a restore share with a creation.
//!
//! - `worktree.rs`: `create_worktree`, the creation `worktreefs new` and `mkdir` ask for.
//! - `preconditions.rs`: what every creation checks first; `error.rs`: what it fails with.
//! - `steps.rs`: the undoable steps (record, branch, admin entry, staging directory);
//!   `rollback.rs`: undoing them, for a failure here or a creation killed half-way.
//! - `index_cache.rs`: the index of a tree, built once and copied into each worktree.
//! - `mountpoint.rs`: where the mount is recorded and where a worktree's `.git` is.

pub mod error;
pub mod index_cache;
pub mod mountpoint;
pub mod preconditions;
pub mod rollback;
pub mod steps;
pub mod worktree;

pub use error::CreateError;
pub use mountpoint::{gitfile_path, mountpoint_of, META_MOUNTPOINT};
pub use rollback::{roll_back_creation, roll_back_dead_creations};
pub use worktree::{create_worktree, CreateRequest};
