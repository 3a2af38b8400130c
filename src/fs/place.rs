//! Nodes are files, not path strings: where a worktree node's upper file is,
//! reached from the worktree's upper directory by descriptor (see `crate::beneath`), and
//! checked to be the file the node is.
//!
//! * A node in the upper layer records its file's inode number (`Overlay::upper_ino`).
//!   Its name is resolved from the worktree's upper directory, never through a symlink,
//!   and the file found there must carry that number: a name that now holds another file
//!   (a rename over it that the node table has not learned yet) answers ESTALE, and a
//!   request made without `mutate` looks again once the change in flight is done.
//! * A node whose last name is gone keeps an `O_PATH` descriptor of its file while the
//!   kernel knows it (the deleted-but-open set, as fuse-backend-rs keeps one), so fstat,
//!   fchmod, ftruncate and opens through `/proc/self/fd` reach that file. It is never
//!   reached by a name again.
//! * An ancestor whose name is gone makes every name below it unreachable (ENOENT), as on
//!   ext4 in a removed directory.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::beneath::{self, Stat};

use super::error::{FsError, FsResult};
use super::nodes::NodeTable;
use super::worktree::WtCtx;
use crate::ids::WorktreeId;
use crate::ino::Ino;

/// What the node table says about where a node's file is (computed under its lock,
/// resolved on disk after it).
pub(super) enum Spec {
    /// The entry `name` of the directory at `dir_rel` (relative to the upper directory).
    Named {
        dir_rel: Vec<u8>,
        name: OsString,
        expect: u64,
    },
    /// The worktree's own directory.
    Root,
    /// The node's last name is gone: its file, held open.
    Orphan(Arc<OwnedFd>),
}

/// A node's upper file, found.
pub(super) enum Place {
    Named {
        dir: OwnedFd,
        name: OsString,
        expect: u64,
    },
    /// The worktree's upper directory (its own file).
    Root(Arc<WtCtx>),
    Orphan(Arc<OwnedFd>),
}

/// The error that says "this name holds another file now": looked up again by the kernel,
/// or retried by the daemon once the change in flight is done.
pub(super) fn stale_io() -> io::Error {
    io::Error::from_raw_os_error(libc::ESTALE)
}

/// Whether an error may come from a namespace change in flight (the name holds another
/// file, or the directory on the way moved or is being replaced): a request that does not
/// hold `mutate` looks once more holding it, when the change is done.
pub(super) fn is_changing(errno: Option<i32>) -> bool {
    matches!(
        errno,
        Some(libc::ESTALE) | Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

/// An `O_PATH` descriptor of a place's file: owned, or the one an orphan keeps.
pub(super) enum Fd<'a> {
    Owned(OwnedFd),
    Borrowed(BorrowedFd<'a>),
}

impl Fd<'_> {
    pub(super) fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Fd::Owned(f) => f.as_fd(),
            Fd::Borrowed(b) => *b,
        }
    }
}

impl Place {
    /// The place `spec` names in worktree `wt`, found on disk.
    pub(super) fn find(wt: Arc<WtCtx>, spec: Spec) -> FsResult<Place> {
        Ok(match spec {
            Spec::Root => Place::Root(wt),
            Spec::Orphan(fd) => Place::Orphan(fd),
            Spec::Named {
                dir_rel,
                name,
                expect,
            } => Place::Named {
                dir: beneath::dir(wt.upper.fd.as_fd(), &dir_rel)
                    .map_err(|e| upper_error(&wt, &dir_rel, e))?,
                name,
                expect,
            },
        })
    }

    /// The file itself, as an `O_PATH` descriptor checked to be the node's.
    pub(super) fn fd(&self) -> io::Result<Fd<'_>> {
        match self {
            Place::Named { dir, name, expect } => {
                let fd = beneath::entry(dir.as_fd(), name)?;
                if *expect != 0 && beneath::fstat(fd.as_fd())?.st_ino != *expect {
                    return Err(stale_io());
                }
                Ok(Fd::Owned(fd))
            }
            Place::Root(wt) => Ok(Fd::Borrowed(wt.upper.fd.as_fd())),
            Place::Orphan(fd) => Ok(Fd::Borrowed(fd.as_fd())),
        }
    }

    pub(super) fn stat(&self) -> io::Result<Stat> {
        match self {
            Place::Named { dir, name, expect } => {
                let st = beneath::stat_at(dir.as_fd(), name)?;
                if *expect != 0 && st.st_ino != *expect {
                    return Err(stale_io());
                }
                Ok(st)
            }
            Place::Root(wt) => beneath::fstat(wt.upper.fd.as_fd()),
            Place::Orphan(fd) => beneath::fstat(fd.as_fd()),
        }
    }

    /// Opens the file with `flags`, checked to be the node's before it is opened: found as
    /// an `O_PATH` descriptor (which opens nothing: a FIFO or a device put at the name
    /// meanwhile is never opened), its identity checked, then reopened through it.
    pub(super) fn open(&self, flags: i32) -> io::Result<File> {
        let fd = self.fd()?;
        beneath::reopen(fd.as_fd(), flags)
    }

    /// The directory holding the name and the name, for a change that must not follow a
    /// symlink at the name itself (utimens and chown of a symlink); None for a file that
    /// is reached by descriptor only.
    pub(super) fn named(&self) -> Option<(BorrowedFd<'_>, &OsStr)> {
        match self {
            Place::Named { dir, name, .. } => Some((dir.as_fd(), name)),
            _ => None,
        }
    }
}

/// The `mutate` locks: one namespace change at a time in each worktree, the submodule
/// views nested in it included (one lock for the worktree a lease covers, `lease_id`).
/// Changes in different worktrees go on side by side: a large file's copy, or a take
/// waiting on its repository's refs, holds up only its own worktree. A change never spans
/// two worktrees (a rename or link across them is refused first), so no thread takes two.
/// Knows whether this thread holds one, so a request that finds a name changing under it
/// waits for the change only when it is not the one making it.
pub(super) struct Mutate {
    /// Each worktree's lock (`None`: the top of the mount and `.control`, which hold no
    /// worktree's files). An entry no guard holds goes when the map grows past `PRUNE_AT`.
    locks: parking_lot::Mutex<HashMap<Option<WorktreeId>, Arc<parking_lot::Mutex<()>>>>,
}

/// How many worktrees' locks the map keeps before those no one holds are let go.
const PRUNE_AT: usize = 256;

thread_local! {
    static HOLDS_MUTATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub(super) struct MutateGuard {
    _g: parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>,
}

impl Drop for MutateGuard {
    fn drop(&mut self) {
        HOLDS_MUTATE.with(|h| h.set(false));
    }
}

impl Mutate {
    pub(super) fn new() -> Mutate {
        Mutate {
            locks: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Holds worktree `of`'s lock (`None`: the one of what is outside every worktree).
    pub(super) fn lock(&self, of: Option<WorktreeId>) -> MutateGuard {
        debug_assert!(!held(), "mutate taken twice by one thread");
        let lock = {
            let mut locks = self.locks.lock();
            if locks.len() >= PRUNE_AT && !locks.contains_key(&of) {
                locks.retain(|_, l| Arc::strong_count(l) > 1);
            }
            locks.entry(of).or_default().clone()
        };
        let g = lock.lock_arc();
        HOLDS_MUTATE.with(|h| h.set(true));
        MutateGuard { _g: g }
    }
}

pub(super) fn held() -> bool {
    HOLDS_MUTATE.with(|h| h.get())
}

fn upper_error(wt: &WtCtx, rel: &[u8], e: io::Error) -> FsError {
    FsError::io(
        format!(
            "{}/{}: upper directory {:?} in {}",
            wt.ident.repo,
            wt.ident.name,
            String::from_utf8_lossy(rel),
            wt.upper.path.display()
        ),
        e,
    )
}

impl NodeTable {
    /// Where node `ino`'s upper file is: by name in its parent, or its kept descriptor.
    /// ENOENT when its name, or an ancestor's, is gone and nothing keeps the file.
    pub(super) fn place_spec(&self, ino: Ino) -> FsResult<(Arc<WtCtx>, Spec)> {
        let (wt, ov, is_root) = self.wt_of(ino)?;
        let node = self.get(ino).ok_or_else(|| FsError::stale(ino))?;
        if node.is_unlinked() {
            return match self.orphan(ino) {
                Some(fd) => Ok((wt, Spec::Orphan(fd))),
                None => Err(FsError::not_found(format!("inode {ino} was removed"))),
            };
        }
        if is_root {
            return Ok((wt, Spec::Root));
        }
        let (_, dir_rel, _) = self.dir_spec(node.parent())?;
        Ok((
            wt,
            Spec::Named {
                dir_rel,
                name: node.name().to_os_string(),
                expect: ov.upper_ino,
            },
        ))
    }

    /// The path of directory node `ino` relative to its worktree's upper directory, and
    /// the inode number its file must have (0: not known). ENOENT when it, or an
    /// ancestor, was removed.
    pub(super) fn dir_spec(&self, ino: Ino) -> FsResult<(Arc<WtCtx>, Vec<u8>, u64)> {
        let (wt, ov, _) = self.wt_of(ino)?;
        let rel = self.live_rel_path(ino)?;
        Ok((wt, rel, ov.upper_ino))
    }
}
