//! The filesystem core: the copy-on-write view of every worktree and the namespace of a
//! mount, callable without a mount (`adapter` and `mount` alone speak the FUSE protocol).
//!
//! A worktree entry is the merge of a **base** (the tree of the base commit, read lazily
//! through `ObjectCache`) and an **upper** layer (real files under
//! `<state>/worktrees/<id>/upper`, in the format `crate::layout` describes).
//!
//! Every change is ordered so a crash between its steps leaves either the old or the new
//! view: a whiteout is written before the upper entry it replaces is removed, an upper
//! entry is created before its whiteout is dropped, copy-up and opaque directories are
//! built in the work directory and renamed into place.

pub mod adapter;
mod base;
mod base_layer;
mod bases;
mod catalog;
mod checkpoint_submodules;
mod checkpoints;
mod control;
mod control_files;
mod converted;
mod copyup;
pub mod error;
mod file_io;
mod fsmonitor;
mod handles;
mod inodes;
mod inomap;
mod journal;
mod keep;
mod listing;
pub mod mount;
mod namespace;
mod nodes;
mod ops;
mod overlay;
mod passthrough;
mod place;
mod ranges;
mod remove;
mod submodule;
mod ttl;
mod types;
mod upper_access;
mod view;
mod worktree;
pub(crate) mod xattr;

pub use control::{CONTROL_NAME, REFRESH_NAME};
pub use inodes::ROOT_INO;
pub use types::{
    Attr, Backing, Caller, DirEntry, Entry, FType, Fh, Inval, Invalidator, LeaseActivity,
    PendingLeases, SetAttr, Statfs,
};
pub use view::{Stats, View};
