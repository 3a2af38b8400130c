//! What is open: the handle table and what each handle holds (an upper file, a base
//! blob, a converted file, a `.control` file), and the listings handle-less readdir is
//! reading. Opening, reading and writing through them is `file_io.rs`.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use git2::Oid;
use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};

use super::error::{FsError, FsResult};
use super::types::DirEntry;
use super::types::Fh;
use super::worktree::WtCtx;
use crate::ids::WorktreeId;
use crate::ino::Ino;

pub(super) const MAX_RECORDED_PATHS: usize = 64;

pub(super) enum HandleKind {
    File {
        ino: Ino,
        /// The worktree, and the fsmonitor query epoch in which this handle last recorded
        /// its path as changed (writable handles only).
        wt: Option<Arc<WtCtx>>,
        noted_epoch: AtomicU64,
        /// The copy-up epoch when this handle last checked its node (base handles only).
        seen_copy_ups: AtomicU64,
        /// Whether this handle's first read was recorded in `Stats::content_paths`.
        read_seen: std::sync::atomic::AtomicBool,
        /// None for a base file until its first read (`blob` says which one): a warm open
        /// never reads, the kernel keeps the file's pages.
        file: RwLock<Option<File>>,
        /// Opened on the blob cache; reopened on the upper file once the entry is copied up.
        on_base: std::sync::atomic::AtomicBool,
        /// The blob a base handle reads.
        blob: Option<BaseBlob>,
    },
    Memory(Vec<u8>),
    Dir(Vec<DirEntry>),
    /// A submodule's view's `.git`, opened for writing (`git mv` writes it anew at the
    /// new path): what is written must name the view's own git entry, as the file does.
    GitFileWrite(Arc<WtCtx>),
}

/// A base file's blob, as a handle opens it at its first read: the worktree whose
/// repository holds it, and its size, checked at open.
pub(super) struct BaseBlob {
    pub(super) wt: Arc<WtCtx>,
    pub(super) oid: Oid,
    pub(super) size: u64,
    /// What a checkout makes of it, when it converts it.
    pub(super) converted: Option<super::base_layer::Converted>,
}

/// A duplicate of `file` when it is opened for reading and writing and with no flag that
/// changes how I/O on it behaves (append, sync, no-atime, direct). Registered as an inode's
/// backing file, it names the file the kernel opens for each passthrough open (with that
/// open's own flags, in the kernels seen here); a plain one is also right for a kernel that
/// would do I/O on it directly.
pub(super) fn plain_read_write(file: &File) -> Option<File> {
    // SAFETY: F_GETFL on a file descriptor this File owns.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    let behaviour =
        libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME | libc::O_DIRECT;
    if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR || flags & behaviour != 0 {
        return None;
    }
    file.try_clone().ok()
}

/// The file a handle holds: an upper file always, a base file once its first read has
/// opened the blob (`View::read_file`).
pub(super) fn opened(file: &RwLock<Option<File>>) -> FsResult<MappedRwLockReadGuard<'_, File>> {
    RwLockReadGuard::try_map(file.read(), Option::as_ref)
        .map_err(|_| FsError::bad_handle("handle has no file"))
}

/// The flags an upper file is opened with for an open with `flags`: its access mode
/// (both ways for the special mode 3, which ext4 lets open a file for neither reads nor
/// writes: the kernel's own descriptor allows neither) and the flags that change the file
/// (`O_TRUNC`) or how I/O on it behaves.
pub(super) fn upper_flags(flags: i32) -> i32 {
    let acc = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => libc::O_RDONLY,
        libc::O_WRONLY => libc::O_WRONLY,
        _ => libc::O_RDWR,
    };
    acc | (flags
        & (libc::O_APPEND | libc::O_TRUNC | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC))
}

/// The open handles, files and directories, by handle number, and the copy-up epoch
/// their reads check. Lock order: after the node table.
pub(super) struct Handles {
    open: Mutex<HashMap<Fh, Arc<HandleKind>>>,
    next_fh: AtomicU64,
    /// Bumped by every copy-up: a read on a handle opened on a base blob checks whether its
    /// file was copied up only when this moved since the handle last looked.
    copy_ups: AtomicU64,
}

impl Handles {
    pub(super) fn new() -> Handles {
        Handles {
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            copy_ups: AtomicU64::new(0),
        }
    }

    pub(super) fn add(&self, kind: HandleKind) -> Fh {
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        self.open.lock().insert(fh, Arc::new(kind));
        fh
    }

    pub(super) fn get(&self, fh: Fh) -> Option<Arc<HandleKind>> {
        self.open.lock().get(&fh).cloned()
    }

    pub(super) fn remove(&self, fh: Fh) -> Option<Arc<HandleKind>> {
        self.open.lock().remove(&fh)
    }

    /// The inodes of the handles open for writing in worktree `worktree` (a submodule's
    /// view counts as its worktree's).
    pub(super) fn writable_in(&self, worktree: WorktreeId) -> Vec<Ino> {
        self.open
            .lock()
            .values()
            .filter_map(|h| match &**h {
                HandleKind::File {
                    ino, wt: Some(w), ..
                } if w.ident.lease_id == worktree => Some(*ino),
                HandleKind::GitFileWrite(w) if w.ident.lease_id == worktree => Some(Ino(0)),
                _ => None,
            })
            .collect()
    }

    /// The upper files open for writing in worktree `wt` itself (not its submodules'
    /// views): each node's inode and a descriptor of its file.
    pub(super) fn writable_files_in(&self, wt: &Arc<WtCtx>) -> Vec<(Ino, std::os::fd::OwnedFd)> {
        let open: Vec<Arc<HandleKind>> = self.open.lock().values().cloned().collect();
        open.iter()
            .filter_map(|h| match &**h {
                HandleKind::File {
                    ino,
                    wt: Some(w),
                    file,
                    ..
                } if Arc::ptr_eq(w, wt) => {
                    let f = file.read();
                    let fd = f.as_ref()?.try_clone().ok()?;
                    Some((*ino, fd.into()))
                }
                _ => None,
            })
            .collect()
    }

    /// A copy-up is done: handles reading the base look again.
    pub(super) fn copied_up(&self) {
        self.copy_ups.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn copy_up_epoch(&self) -> u64 {
        self.copy_ups.load(Ordering::Acquire)
    }
}

/// Listings being read by handle-less readdir (see `View::readdir_ino`), by directory.
pub(super) struct Listings(Mutex<HashMap<Ino, Arc<Vec<DirEntry>>>>);

impl Listings {
    pub(super) fn new() -> Listings {
        Listings(Mutex::new(HashMap::new()))
    }

    /// The listing of `ino` a pass is reading.
    pub(super) fn continued(&self, ino: Ino) -> Option<Arc<Vec<DirEntry>>> {
        self.0.lock().get(&ino).cloned()
    }

    pub(super) fn started(&self, ino: Ino, listing: Arc<Vec<DirEntry>>) {
        self.0.lock().insert(ino, listing);
    }

    pub(super) fn finished(&self, ino: Ino) {
        self.0.lock().remove(&ino);
    }
}
