//! A node's place in a worktree's layers (`Overlay`: its base entry, whether it is in
//! the upper layer). Resolving a name through the layers is `base.rs`.

use std::os::fd::OwnedFd;

use git2::Oid;

use crate::git::{self};

use super::types::FType;

/// A directory's upper directory as a lookup found it: its descriptor once opened, and
/// whether a whiteout holds the name looked up (a removed base entry's; a new entry goes
/// over it in one rename).
#[derive(Default)]
pub(super) struct UpperDir {
    pub(super) fd: Option<OwnedFd>,
    pub(super) whiteout_at_name: bool,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct BaseRef {
    pub(super) oid: Oid,
    pub(super) mode: u32,
    /// An entry of the worktree's warm snapshot: its number plus one (`git::warm`); 0
    /// for git's. A directory's can be both (a tracked directory the snapshot adds to).
    pub(super) warm: u32,
}

impl BaseRef {
    pub(super) fn of(e: &git::TreeEntry) -> BaseRef {
        BaseRef {
            oid: e.oid,
            mode: e.mode,
            warm: e.warm,
        }
    }
}

/// A worktree entry's place in the overlay.
#[derive(Debug, Clone, Copy)]
pub(super) struct Overlay {
    pub(super) ftype: FType,
    /// Directories: the base tree merged underneath (None when new or opaque).
    /// Files and symlinks: the base object, used while the entry is not in the upper layer.
    pub(super) base: Option<BaseRef>,
    pub(super) in_upper: bool,
    /// The upper file's inode number, which the file found at the node's name must have
    /// (0: not in the upper layer, or not known).
    pub(super) upper_ino: u64,
}

impl Overlay {
    /// A new entry of the upper layer, whose file has inode number `upper_ino`.
    pub(super) fn upper(ftype: FType, upper_ino: u64) -> Overlay {
        Overlay {
            ftype,
            base: None,
            in_upper: true,
            upper_ino,
        }
    }
}
