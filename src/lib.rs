//! worktreefs: a FUSE filesystem that gives every agent its own copy-on-write git worktree.
//!
//! ## Layering (imports run downward only, never in a circle)
//!
//! ```text
//! 5  daemon/            composition root with the binary (main.rs, cli/): builds the
//!                       pieces and wires them
//! 4  fs/                the filesystem; only fs/ names fuse/ (adapter.rs, mount.rs)
//! 3  lifecycle/         create, holders, cleanup, sweeper; reaches fs/ only through
//!                       its own trait `lifecycle::Mounted`, which `fs::View` implements
//! 2  report, checkpoint the status table, from store rows; a worktree's checkpoints
//!                       (an undo store of its upper layer)
//! 1  git/, store/,      the repository; the SQLite store;
//!    layout, filecopy,  the on-disk formats of the upper layer and of submodule views
//!    state              (read through `beneath`); copying a file's data by reflink or
//!                       copy_file_range; the state directory's layout
//! 0  beneath, bounded, lease, names, ids, ino, durable,  leaves: name nothing of the crate
//!    failure (an error with a kind and a chain),
//!    heap, target, table, fuse (the FUSE protocol), asked, mounttable, process (/proc, pidfds,
//!    the tree below a command)
//! ```
//!
//! A module names only modules on a lower floor (`tests/layering.rs` checks it).
//! `docs/architecture.md` has the table "Where is …?".

pub mod asked;
pub mod beneath;
pub mod bounded;
pub mod checkpoint;
pub mod daemon;
pub mod durable;
pub mod failure;
pub mod filecopy;
pub mod fs;
pub mod fuse;
pub mod git;
pub mod heap;
pub mod ids;
pub mod ino;
pub mod layout;
pub mod lease;
pub mod lifecycle;
pub mod mounttable;
pub mod names;
pub mod process;
pub mod report;
pub mod state;
pub mod store;
pub mod table;
pub mod target;
