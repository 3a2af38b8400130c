//! The plain values the core answers with: attributes, entries, what a caller asked; the
//! name of a worktree's `.git` file.
//! The FUSE adapter copies them into the protocol's structures (`crate::fuse`); nothing
//! here names the protocol.

use std::ffi::OsString;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::git::{MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::ids::WorktreeId;
use crate::ino::Ino;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FType {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FType {
    pub(super) fn from_mode(mode: u32) -> FType {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FType::Dir,
            libc::S_IFLNK => FType::Symlink,
            libc::S_IFIFO => FType::Fifo,
            libc::S_IFSOCK => FType::Socket,
            libc::S_IFCHR => FType::CharDev,
            libc::S_IFBLK => FType::BlockDev,
            _ => FType::File,
        }
    }
    pub(super) fn from_git_mode(mode: u32) -> FType {
        match mode {
            MODE_TREE | MODE_GITLINK => FType::Dir,
            MODE_LINK => FType::Symlink,
            _ => FType::File,
        }
    }
}

/// A handle's number: what `open`, `opendir` and `create` answer and every later request
/// on the handle names (`fh` in the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fh(pub u64);

impl std::fmt::Display for Fh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What `stat` reports; the FUSE adapter copies it into the protocol's attributes.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: Ino,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FType,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Attr,
    pub ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FType,
    pub name: OsString,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Option<SystemTime>>,
    pub mtime: Option<Option<SystemTime>>,
    pub fh: Option<Fh>,
}

pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Who asks: used for the owner of what a request creates.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// A file the kernel reads and writes directly for an open handle (FUSE passthrough), and
/// its identity (device, inode).
pub struct Backing {
    pub file: File,
    pub key: (u64, u64),
}

/// What the kernel should forget.
pub enum Inval {
    /// An inode's attributes and listing.
    Inode(Ino),
    /// The name `name` in directory `parent`.
    Entry(Ino, OsString),
    /// Nothing to forget: answered once every invalidation sent before it was delivered.
    Delivered(std::sync::mpsc::SyncSender<()>),
}

/// Tells the kernel to drop what it cached. Set by the daemon once the FUSE session exists;
/// absent in direct-call tests.
pub type Invalidator = Box<dyn Fn(Inval) + Send + Sync>;

/// The leases kept in memory, (worktree id, lease, since), as the tracker lists them.
pub type PendingLeases =
    Box<dyn Fn() -> Vec<(WorktreeId, crate::store::NewLease, i64)> + Send + Sync>;

/// The last activity of process holders, (worktree id, holder key, unix seconds), as the
/// tracker keeps it in memory.
pub type LeaseActivity = Box<dyn Fn() -> Vec<(WorktreeId, String, i64)> + Send + Sync>;

pub(super) fn systime(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl Attr {
    /// A generated file (`.git`, `.control`): read-only, `len` bytes.
    pub fn memory(ino: Ino, len: usize, mtime: SystemTime, uid: u32, gid: u32) -> Attr {
        Attr {
            ino,
            size: len as u64,
            blocks: (len as u64).div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            kind: FType::File,
            perm: 0o444,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
        }
    }

    pub fn from_stat(ino: Ino, st: &crate::beneath::Stat) -> Attr {
        Attr {
            ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: systime(st.st_atime, st.st_atime_nsec),
            mtime: systime(st.st_mtime, st.st_mtime_nsec),
            ctime: systime(st.st_ctime, st.st_ctime_nsec),
            kind: FType::from_mode(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
        }
    }

    pub fn from_meta(ino: Ino, m: &fs::Metadata) -> Attr {
        Attr {
            ino,
            size: m.len(),
            blocks: m.blocks(),
            atime: systime(m.atime(), m.atime_nsec()),
            mtime: systime(m.mtime(), m.mtime_nsec()),
            ctime: systime(m.ctime(), m.ctime_nsec()),
            kind: FType::from_mode(m.mode()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
        }
    }
}

/// The name of a worktree's virtual `.git` file.
pub const GITFILE_NAME: &str = ".git";
