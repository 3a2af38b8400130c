//! The FUSE adapter: each method is one call into `View` and one `match` that turns the
//! result into a reply or an errno. Every operation runs in a tracing span with the
//! request's unique id, inode and pid; failures are logged (expected ones at debug).

use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::lifecycle::holders::Tracker;

use super::error::{FsError, Level};
use super::passthrough::{self, Backings, Decision};
use super::{Attr, Caller, DirEntry, FType, SetAttr, View};

pub struct WorktreeFs {
    pub view: Arc<View>,
    /// Process leases; None in setups that do not track them.
    tracker: Option<Arc<Tracker>>,
    /// The kernel agreed to do without opendir: it then caches listings itself.
    no_opendir: bool,
    /// FUSE passthrough: asked for (`mount --no-passthrough` turns it off), then on only if
    /// the kernel offers it and registering a backing file works.
    want_passthrough: bool,
    passthrough: std::sync::atomic::AtomicBool,
    /// Listings with the entries' attributes: asked for unless `mount --no-readdirplus`.
    want_readdirplus: bool,
    backings: Mutex<Backings<BackingId>>,
}

/// How an open is answered.
enum OpenMode {
    Passthrough(Arc<BackingId>),
    /// Through the daemon, with these flags.
    Daemon(FopenFlags),
}

impl WorktreeFs {
    /// The answer to every extended-attribute request: they are not supported. ENOSYS
    /// makes the kernel remember that and answer EOPNOTSUPP itself from then on (ENOTSUP
    /// would be asked again each time, and every `write(2)` asks: the kernel checks
    /// `security.capability` before letting a write through).
    fn decline_xattr(&self) -> Errno {
        self.view
            .stats
            .xattr_requests
            .fetch_add(1, Ordering::Relaxed);
        Errno::ENOSYS
    }

    pub fn new(
        view: Arc<View>,
        tracker: Option<Arc<Tracker>>,
        passthrough: bool,
        readdirplus: bool,
    ) -> WorktreeFs {
        WorktreeFs {
            view,
            tracker,
            no_opendir: false,
            want_passthrough: passthrough,
            want_readdirplus: readdirplus,
            passthrough: false.into(),
            backings: Mutex::new(Backings::default()),
        }
    }

    /// A listing's entries from `offset` on: from the handle opendir made, or from the
    /// directory itself when the kernel does without opendir (handle 0).
    fn entries_from(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
    ) -> Result<Vec<(u64, DirEntry)>, FsError> {
        if fh.0 == 0 {
            self.view.readdir_ino(ino.0, offset)
        } else {
            self.view.readdir(fh.0, offset)
        }
    }

    /// Decides how the kernel does I/O on handle `fh`. Upper-layer files pass through to
    /// the upper file. Base files are read through the daemon with the kernel's page cache
    /// kept across opens (their content never changes): a base file copied up while open
    /// must show the new content to every handle, and the kernel cannot move an open
    /// inode from one backing file to another. For the same reason an upper file whose
    /// inode still has handles through the daemon (opened before its copy-up) is served
    /// through the daemon too, until they are closed.
    fn open_mode(
        &self,
        fh: u64,
        generated: bool,
        register: &dyn Fn(&File) -> std::io::Result<BackingId>,
    ) -> OpenMode {
        if generated {
            return OpenMode::Daemon(FopenFlags::FOPEN_DIRECT_IO);
        }
        let Some((ino, on_base)) = self.view.handle_io(fh) else {
            return OpenMode::Daemon(FopenFlags::FOPEN_DIRECT_IO);
        };
        let keep = if on_base {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        let decision = passthrough::decide(
            &self.backings,
            &self.passthrough,
            fh,
            ino,
            on_base,
            || self.view.backing_for(fh),
            register,
        );
        match decision {
            Decision::Passthrough(id) => OpenMode::Passthrough(id),
            Decision::Daemon => OpenMode::Daemon(keep),
            Decision::DirectIo => OpenMode::Daemon(FopenFlags::FOPEN_DIRECT_IO),
        }
    }

    /// Fills a READDIRPLUS reply: each entry is looked up and counted as a LOOKUP
    /// would be, the one that does not fit is given back.
    fn fill_listing_plus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = self.entries_from(ino, fh, offset);
        let entries = match entries {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno("readdirplus", e)),
        };
        for (sent, (next, e)) in entries.into_iter().enumerate() {
            let full = if e.name == "." || e.name == ".." {
                // The kernel links neither: it reads only the inode number and type.
                let attr = bare_attr(e.ino, kind(e.kind));
                reply.add(
                    INodeNo(e.ino),
                    next,
                    &e.name,
                    &Duration::ZERO,
                    &attr,
                    Generation(0),
                )
            } else {
                // The kernel links every other entry it is given, as if it had looked
                // the name up, and forgets it later: the lookup is done and counted here.
                match self.view.lookup_listed(ino.0, &e.name) {
                    Ok(found) => {
                        let full = reply.add(
                            INodeNo(found.attr.ino),
                            next,
                            &e.name,
                            &found.ttl,
                            &fattr(&found.attr),
                            Generation(0),
                        );
                        if full {
                            // Not sent: the kernel does not know it from this reply.
                            self.view.forget(found.attr.ino, 1);
                        }
                        full
                    }
                    Err(err)
                        if !matches!(err.errno(), libc::ENOENT | libc::ESTALE | libc::EBUSY) =>
                    {
                        // Its attributes cannot be read. Sent without them, the name
                        // would be dropped from `readdir` (inode 0, see below) without a
                        // word: the reply ends before it instead, and the next request
                        // lists it as a plain READDIR (unless names here were looked at
                        // in between: then it fails with the error, for the caller to see).
                        if sent == 0 {
                            return reply.error(errno("readdirplus", err));
                        }
                        tracing::debug!(
                            op = "readdirplus",
                            errno = err.errno(),
                            "reply ends before {:?}: {}",
                            e.name,
                            err.message
                        );
                        true
                    }
                    Err(err) => {
                        // Listed a moment ago but gone now (removed meanwhile, or a
                        // worktree being deleted, which cannot be entered): sent with
                        // inode 0, which the kernel passes on without linking (and
                        // glibc before 2.37 leaves out).
                        tracing::debug!(
                            op = "readdirplus",
                            errno = err.errno(),
                            "{:?} listed without attributes: {}",
                            e.name,
                            err.message
                        );
                        let attr = bare_attr(0, kind(e.kind));
                        reply.add(
                            INodeNo(0),
                            next,
                            &e.name,
                            &Duration::ZERO,
                            &attr,
                            Generation(0),
                        )
                    }
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    /// A request inside a worktree: its process is covered by a lease, or takes one.
    /// `own_dir` says whether a request on the worktree's own directory counts (a stat
    /// of it from outside does not).
    fn enter(&self, req: &Request, ino: INodeNo, own_dir: bool) -> Result<(), Errno> {
        let Some(tracker) = &self.tracker else {
            return Ok(());
        };
        let Some((worktree, is_root)) = self.view.worktree_of(ino.0) else {
            return Ok(());
        };
        if is_root && !own_dir {
            return Ok(());
        }
        tracker
            .touch(worktree, || self.view.worktree_path(worktree), req.pid())
            .map_err(|e| {
                errno(
                    "enter",
                    FsError::lease(format!("pid {} entering worktree {worktree}", req.pid()), e),
                )
            })
    }
}

/// A request that would change what `$ino` is in: refused (EBUSY) while a guarded turn
/// runs in its worktree and the caller is outside the turn's process tree.
/// The token it gives is bound to `$token` and counts the request as a change in
/// progress until it is dropped, after the answer.
macro_rules! guard_or_reply {
    ($self:ident, $req:expr, $ino:expr, $op:expr, $reply:ident, $token:ident) => {
        let $token = match $self.view.may_change($ino.0, $req.pid()) {
            Ok(t) => t,
            Err(e) => {
                $reply.error(errno($op, e));
                return;
            }
        };
    };
}

macro_rules! enter_or_reply {
    ($self:ident, $req:expr, $ino:expr, $own:expr, $reply:ident) => {
        if let Err(e) = $self.enter($req, $ino, $own) {
            $reply.error(e);
            return;
        }
    };
}

fn kind(k: FType) -> FileType {
    match k {
        FType::Dir => FileType::Directory,
        FType::File => FileType::RegularFile,
        FType::Symlink => FileType::Symlink,
        FType::Fifo => FileType::NamedPipe,
        FType::Socket => FileType::Socket,
        FType::CharDev => FileType::CharDevice,
        FType::BlockDev => FileType::BlockDevice,
    }
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.mtime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// Attributes carrying only an inode number and a type: what the kernel reads of a
/// negative entry, and of a listing entry it does not link (`.`, `..`, or one declined
/// with inode 0).
fn bare_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// A negative entry: the kernel remembers for `ttl` that the name does not exist.
fn negative_entry(reply: ReplyEntry, ttl: Duration) {
    reply.entry(&ttl, &bare_attr(0, FileType::RegularFile), Generation(0));
}

/// The errno a failed request is answered with, logged at its kind's level.
fn errno(op: &str, e: FsError) -> Errno {
    let errno = e.errno();
    match e.level() {
        Level::Debug => tracing::debug!(op, errno, "{}", e.message),
        Level::Info => tracing::info!(op, errno, "{}", e.message),
        Level::Warn => tracing::warn!(op, errno, "{}", e.message),
        Level::Error => tracing::error!(op, errno, "{}", e.message),
    }
    Errno::from_i32(errno)
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn time(t: Option<TimeOrNow>) -> Option<Option<SystemTime>> {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(s) => Some(s),
    })
}

macro_rules! span {
    ($op:expr, $req:expr, $ino:expr) => {
        let _span = tracing::debug_span!($op, req = $req.unique().0, ino = $ino, pid = $req.pid())
            .entered();
    };
}

impl Filesystem for WorktreeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_background(64);
        // Lookups in one directory may run in parallel (git's preload threads do that);
        // symlink targets never change in place, so the kernel may cache them.
        // Without opendir the kernel caches directory listings, dropping them when a request
        // it makes changes the directory, or when the directory's mtime moves (checked with
        // fresh attributes thanks to AUTO_INVAL_DATA; the top of the mount reports the
        // catalog's change time as mtime).
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT
            | InitFlags::FUSE_AUTO_INVAL_DATA;
        // A listing comes with each entry's attributes, which the kernel links as if it
        // had looked each name up; in its adaptive mode only where names of the
        // directory were looked up or stat'ed since, and always at a listing's start.
        if self.want_readdirplus {
            wanted |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        let offered = config.capabilities() & wanted;
        if let Err(missing) = config.add_capabilities(offered) {
            tracing::info!("kernel declined FUSE capabilities {missing:?}");
        }
        self.no_opendir = offered.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        tracing::info!("FUSE session initialised (capabilities {offered:?})");
        // Passthrough: the kernel reads and writes the backing file (the cached blob, the
        // upper file) itself. Backing files on a stacked filesystem (overlayfs) need one
        // more level of stacking.
        if !self.want_passthrough {
            tracing::info!(
                "FUSE passthrough: off (--no-passthrough); file I/O goes through the daemon"
            );
        } else if !has_cap_sys_admin() {
            tracing::info!("FUSE passthrough: off (the daemon lacks CAP_SYS_ADMIN, which the kernel asks of passthrough: not root); file I/O goes through the daemon");
        } else if !config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) {
            tracing::info!("FUSE passthrough: off (this kernel does not offer it); file I/O goes through the daemon");
        } else {
            let depth = if self.view.state_on_stacked_fs() {
                2
            } else {
                1
            };
            match config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .map_err(|_| ())
                .and_then(|_| config.set_max_stack_depth(depth).map_err(|_| ()))
            {
                Ok(_) => {
                    self.passthrough.store(true, Ordering::Relaxed);
                    self.view.stats.passthrough_on.store(true, Ordering::Relaxed);
                    tracing::info!("FUSE passthrough: on (stack depth {depth}); the kernel does file I/O on the backing files");
                }
                Err(()) => tracing::info!("FUSE passthrough: off (the kernel declined it); file I/O goes through the daemon"),
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        span!("lookup", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        match self.view.lookup(parent.0, name) {
            Ok(e) => reply.entry(&e.ttl, &fattr(&e.attr), Generation(0)),
            Err(e) => match e.negative_ttl {
                Some(ttl) if e.errno() == libc::ENOENT => {
                    tracing::debug!(op = "lookup", "{} (cached as absent)", e.message);
                    negative_entry(reply, ttl)
                }
                _ => reply.error(errno("lookup", e)),
            },
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // Under the backings' lock: no open can register a backing file for a new node
        // with this number between the node's end and the end of its bookkeeping (lock
        // order: backings, then the node table; nothing takes them the other way).
        let mut b = self.backings.lock();
        if self.view.forget(ino.0, nlookup) {
            b.forgotten(ino.0);
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        span!("getattr", req, ino.0);
        enter_or_reply!(self, req, ino, false, reply);
        match self.view.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(e) => reply.attr(&e.ttl, &fattr(&e.attr)),
            Err(e) => reply.error(errno("getattr", e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        span!("setattr", req, ino.0);
        enter_or_reply!(self, req, ino, true, reply);
        guard_or_reply!(self, req, ino, "setattr", reply, _change);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
            fh: fh.map(|f| f.0),
        };
        match self.view.setattr(ino.0, set) {
            Ok(e) => reply.attr(&e.ttl, &fattr(&e.attr)),
            Err(e) => reply.error(errno("setattr", e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        span!("readlink", req, ino.0);
        enter_or_reply!(self, req, ino, false, reply);
        match self.view.readlink(ino.0) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno("readlink", e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        span!("mknod", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "mknod", reply, _change);
        match self
            .view
            .mknod(parent.0, name, mode, umask, rdev, caller(req))
        {
            Ok(e) => reply.entry(&e.ttl, &fattr(&e.attr), Generation(0)),
            Err(e) => reply.error(errno("mknod", e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        span!("mkdir", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "mkdir", reply, _change);
        match self.view.mkdir(parent.0, name, mode, umask, caller(req)) {
            Ok(e) => reply.entry(&e.ttl, &fattr(&e.attr), Generation(0)),
            Err(e) => reply.error(errno("mkdir", e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        span!("unlink", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "unlink", reply, _change);
        match self.view.unlink(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("unlink", e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        span!("rmdir", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "rmdir", reply, _change);
        match self.view.rmdir(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("rmdir", e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        span!("symlink", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "symlink", reply, _change);
        match self.view.symlink(parent.0, link_name, target, caller(req)) {
            Ok(e) => reply.entry(&e.ttl, &fattr(&e.attr), Generation(0)),
            Err(e) => reply.error(errno("symlink", e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        span!("rename", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        enter_or_reply!(self, req, newparent, true, reply);
        guard_or_reply!(self, req, parent, "rename", reply, _from);
        guard_or_reply!(self, req, newparent, "rename", reply, _to);
        match self
            .view
            .rename(parent.0, name, newparent.0, newname, flags.bits())
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("rename", e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        span!("link", req, ino.0);
        enter_or_reply!(self, req, newparent, true, reply);
        guard_or_reply!(self, req, newparent, "link", reply, _into);
        guard_or_reply!(self, req, ino, "link", reply, _linked);
        match self.view.link(ino.0, newparent.0, newname) {
            Ok(e) => reply.entry(&e.ttl, &fattr(&e.attr), Generation(0)),
            Err(e) => reply.error(errno("link", e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        span!("open", req, ino.0);
        enter_or_reply!(self, req, ino, true, reply);
        let writes = flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        let _change = match writes {
            true => match self.view.may_change(ino.0, req.pid()) {
                Ok(t) => Some(t),
                Err(e) => {
                    reply.error(errno("open", e));
                    return;
                }
            },
            false => None,
        };
        match self.view.open(ino.0, flags.0) {
            Ok((fh, generated)) => {
                match self.open_mode(fh, generated, &|f| reply.open_backing(f)) {
                    OpenMode::Passthrough(id) => {
                        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
                    }
                    OpenMode::Daemon(flags) => reply.opened(FileHandle(fh), flags),
                }
            }
            Err(e) => reply.error(errno("open", e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        span!("read", req, ino.0);
        match self.view.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno("read", e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        span!("write", req, ino.0);
        match self.view.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno("write", e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do at close (no write-back cache; locks are the kernel's): ENOSYS
        // tells the kernel never to send FLUSH again, which saves every close() a
        // synchronous round trip.
        reply.error(Errno::ENOSYS);
    }

    /// No ioctl is supported. Answered ENOTTY at once and without a log line: every
    /// `isatty()` (Python's `open`, for one) asks TCGETS of each file it opens.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.backings.lock().release(fh.0);
        self.view.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        span!("fsync", req, ino.0);
        match self.view.fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("fsync", e)),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        span!("opendir", req, ino.0);
        if self.no_opendir {
            // Declined once, the kernel stops asking and caches listings (see init).
            reply.error(Errno::ENOSYS);
            return;
        }
        match self.view.opendir(ino.0) {
            Ok((fh, cacheable)) => {
                let flags = if cacheable {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno("opendir", e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        span!("readdir", req, ino.0);
        enter_or_reply!(self, req, ino, true, reply);
        let entries = self.entries_from(ino, fh, offset);
        match entries {
            Ok(entries) => {
                for (next, e) in entries {
                    if reply.add(INodeNo(e.ino), next, kind(e.kind), &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno("readdir", e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        span!("readdirplus", req, ino.0);
        enter_or_reply!(self, req, ino, true, reply);
        self.fill_listing_plus(ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.view.release(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        span!("statfs", req, ino.0);
        match self.view.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno("statfs", e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.decline_xattr());
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(self.decline_xattr());
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(self.decline_xattr());
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.decline_xattr());
    }

    fn access(&self, req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        span!("access", req, ino.0);
        match self.view.access(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno("access", e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        span!("create", req, parent.0);
        enter_or_reply!(self, req, parent, true, reply);
        guard_or_reply!(self, req, parent, "create", reply, _change);
        match self
            .view
            .create(parent.0, name, mode, umask, flags, caller(req))
        {
            Ok((e, fh)) => match self.open_mode(fh, false, &|f| reply.open_backing(f)) {
                OpenMode::Passthrough(id) => reply.created_passthrough(
                    &e.ttl,
                    &fattr(&e.attr),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                    &id,
                ),
                OpenMode::Daemon(flags) => reply.created(
                    &e.ttl,
                    &fattr(&e.attr),
                    Generation(0),
                    FileHandle(fh),
                    flags,
                ),
            },
            Err(e) => reply.error(errno("create", e)),
        }
    }
}

/// Whether this process has CAP_SYS_ADMIN (effective), which the kernel requires of a
/// FUSE daemon that registers passthrough backing files (`/proc/self/status` CapEff).
pub fn has_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        // CAP_SYS_ADMIN is capability 21 (linux/capability.h).
        .is_some_and(|caps| caps & (1 << 21) != 0)
}
