//! What every removal keeps, and for how long (docs/contract.md, "Cleanup"): the worktree's
//! directory (upper layer, work directory) is parked under `<state>/removed/<id>` and
//! stays there; before it is parked, git's `HEAD` and `index` of the worktree are copied
//! into it (`kept/`) and the commit HEAD names is kept under a ref of worktreefs's own,
//! `refs/worktreefs/removed/<name>-<id>-<secs>`, so that `git gc` cannot prune it. A kept
//! copy goes after `--keep-removed` hours, or earlier, oldest first, while the state
//! directory's disk is low; `worktreefs restore` brings one back (`lifecycle/restore.rs`).
//!
//! `kept.rs` keeps a removal and undoes that; `purge.rs` deletes kept copies; `policy.rs`
//! says how long they stay. The refs of checkpoints gone are kept for the same period
//! (`purge.rs`, `git::checkpoint_refs`). A worktree's `HEAD` and `index` are read through
//! `cleanup/git_files.rs`, which a fork reads them through too.

mod kept;
mod policy;
mod purge;

pub use kept::{delete_ref, KEPT_DIR, REMOVED_REF_PREFIX};
pub(super) use kept::{drop_unkept, keep, kept_record, unkeep};
pub use policy::{disk_usage, KeepPolicy};
pub use purge::{purge_due, purge_kept, purge_repo, sweep_checkpoint_refs, PURGING};
