//! How long the kernel may keep what it learned of a node (its entry and attributes),
//! by what the node is.

use std::time::Duration;

use super::nodes::{NodeKind, NodeTable};
use super::types::FType;
use crate::ino::Ino;

/// Worktree entries (the worktree's own directory included) change only through this
/// daemon, and every such change is a request the kernel makes and so accounts for: the
/// kernel may cache them, names (present or absent) and attributes, for long. Without
/// that, every path walk inside a worktree would cost a GETATTR of the worktree's
/// directory for the permission check, and every file looked up again after a short TTL
/// a LOOKUP.
pub(super) const WT_STABLE_TTL: Duration = Duration::from_secs(3600);
/// Upper-layer regular files: with passthrough, writes through a shared mapping of the
/// backing file do not reach the FUSE inode's attributes (the kernel re-reads them when
/// the file is mapped, written or read, not after each write through a mapping): their
/// cached mtime is re-read after this long.
pub(super) const WT_TTL: Duration = Duration::from_secs(60);
/// Repositories come and go through the CLI, another process: cached briefly.
pub(super) const TOP_TTL: Duration = Duration::from_secs(1);
/// `.control` files change with every lease and state change: never cached.
pub(super) const CONTROL_TTL: Duration = Duration::ZERO;

/// How long the kernel may keep what it learned of `ino`.
pub(super) fn ttl_of(t: &NodeTable, ino: Ino) -> Duration {
    match t.kind(ino) {
        // A worktree's own directory goes away through cleanup, which another process
        // may run: its entry gets the shorter `WT_TTL`, not the stable one.
        Some(NodeKind::Wt { is_root: true, .. }) => WT_TTL,
        Some(NodeKind::Wt { ov, .. }) if ov.in_upper && ov.ftype == FType::File => WT_TTL,
        Some(NodeKind::Wt { .. }) | Some(NodeKind::GitFile(_)) => WT_STABLE_TTL,
        // Listings under .control change with every lease: the kernel must look at the
        // directory's (always new) mtime before using a listing it kept.
        Some(NodeKind::ControlFile(..)) | Some(NodeKind::ControlDir(_)) => CONTROL_TTL,
        _ => TOP_TTL,
    }
}
