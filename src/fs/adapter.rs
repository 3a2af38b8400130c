//! The FUSE adapter: each request is one call into `View` and one `match` that turns the
//! result into an answer or an errno. Every operation runs in a tracing span with the
//! request's unique id, inode and pid; failures are logged (expected ones at debug).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fuse::abi::{self, fopen, init};
use crate::fuse::reply::{secs_nsecs, valid};
use crate::fuse::{
    Answer, BackingId, Device, DirBuf, Filesystem, Header, InitChoice, KernelInit, Op, SetTime,
};
use crate::lifecycle::holders::Tracker;

use super::error::{FsError, Level};
use super::passthrough::{self, Backings, Decision};
use super::{Attr, Caller, Entry, FType, SetAttr, View};

pub struct WorktreeFs {
    pub view: Arc<View>,
    /// Process leases; None in setups that do not track them.
    tracker: Option<Arc<Tracker>>,
    /// The kernel agreed to do without opendir: it then caches listings itself.
    no_opendir: AtomicBool,
    /// FUSE passthrough: asked for (`mount --no-passthrough` turns it off), then on only if
    /// the kernel offers it and registering a backing file works.
    want_passthrough: bool,
    passthrough: AtomicBool,
    /// Listings with the entries' attributes: asked for unless `mount --no-readdirplus`.
    want_readdirplus: bool,
    /// `user.` extended attributes served (`mount --xattr`). Off, every attribute request
    /// is answered ENOSYS once and the kernel stops asking: served, it asks a file's
    /// `security.capability` before every `write(2)`, one more round trip each.
    xattrs: bool,
    backings: Mutex<Backings<BackingId>>,
}

/// How an open is answered.
enum OpenMode {
    Passthrough(Arc<BackingId>),
    /// Through the daemon, with these `FOPEN_*` flags.
    Daemon(u32),
}

impl WorktreeFs {
    /// Counts an extended-attribute request (`.control/stats`: with attributes served,
    /// the kernel asks `security.capability` before every write).
    fn count_xattr(&self) {
        self.view
            .stats
            .xattr_requests
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn new(
        view: Arc<View>,
        tracker: Option<Arc<Tracker>>,
        passthrough: bool,
        readdirplus: bool,
        xattrs: bool,
    ) -> WorktreeFs {
        WorktreeFs {
            view,
            tracker,
            no_opendir: false.into(),
            want_passthrough: passthrough,
            want_readdirplus: readdirplus,
            xattrs,
            passthrough: false.into(),
            backings: Mutex::new(Backings::default()),
        }
    }

    /// A listing's entries from `offset` on: from the handle opendir made, or from the
    /// directory itself when the kernel does without opendir (handle 0).
    fn entries_from(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> Result<Vec<(u64, super::DirEntry)>, FsError> {
        if fh == 0 {
            self.view.readdir_ino(ino, offset)
        } else {
            self.view.readdir(fh, offset)
        }
    }

    /// Decides how the kernel does I/O on handle `fh`. Upper-layer files pass through to
    /// the upper file. Base files are read through the daemon with the kernel's page cache
    /// kept across opens (their content never changes): a base file copied up while open
    /// must show the new content to every handle, and the kernel cannot move an open
    /// inode from one backing file to another. For the same reason an upper file whose
    /// inode still has handles through the daemon (opened before its copy-up) is served
    /// through the daemon too, until they are closed.
    fn open_mode(&self, fh: u64, generated: bool, device: &Arc<Device>) -> OpenMode {
        if generated {
            return OpenMode::Daemon(fopen::DIRECT_IO);
        }
        let Some((ino, on_base)) = self.view.handle_io(fh) else {
            return OpenMode::Daemon(fopen::DIRECT_IO);
        };
        let keep = if on_base { fopen::KEEP_CACHE } else { 0 };
        let decision = passthrough::decide(
            &self.backings,
            &self.passthrough,
            fh,
            ino,
            on_base,
            || self.view.backing_for(fh),
            |f: &File| device.open_backing(f),
        );
        match decision {
            Decision::Passthrough(id) => OpenMode::Passthrough(id),
            Decision::Daemon => OpenMode::Daemon(keep),
            Decision::DirectIo => OpenMode::Daemon(fopen::DIRECT_IO),
        }
    }

    /// The open reply for handle `fh` answered as `mode`.
    fn opened(fh: u64, mode: OpenMode) -> abi::OpenOut {
        match mode {
            OpenMode::Passthrough(id) => abi::OpenOut {
                fh,
                open_flags: fopen::PASSTHROUGH,
                backing_id: id.id(),
            },
            OpenMode::Daemon(flags) => abi::OpenOut {
                fh,
                open_flags: flags,
                backing_id: 0,
            },
        }
    }

    /// A READDIRPLUS reply: each entry is looked up and counted as a LOOKUP would be, the
    /// one that does not fit is given back.
    fn listing_plus(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Answer {
        let entries = match self.entries_from(ino, fh, offset) {
            Ok(entries) => entries,
            Err(e) => return errno("readdirplus", e),
        };
        let mut buf = DirBuf::new(size);
        for (sent, (next, e)) in entries.into_iter().enumerate() {
            let added = if e.name == "." || e.name == ".." {
                // The kernel links neither: it reads only the inode number and type.
                buf.add_plus(&bare_entry(e.ino, e.kind), next, dtype(e.kind), &e.name)
            } else {
                // The kernel links every other entry it is given, as if it had looked
                // the name up, and forgets it later: the lookup is done and counted here.
                match self.view.lookup_listed(ino, &e.name) {
                    Ok(found) => {
                        let added = buf.add_plus(&entry_out(&found), next, dtype(e.kind), &e.name);
                        if !added {
                            // Not sent: the kernel does not know it from this reply.
                            self.view.forget(found.attr.ino, 1);
                        }
                        added
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
                            return errno("readdirplus", err);
                        }
                        tracing::debug!(
                            op = "readdirplus",
                            errno = err.errno(),
                            "reply ends before {:?}: {}",
                            e.name,
                            err.message
                        );
                        false
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
                        buf.add_plus(&bare_entry(0, e.kind), next, dtype(e.kind), &e.name)
                    }
                }
            };
            if !added {
                break;
            }
        }
        buf.into_answer()
    }

    /// A request inside a worktree: its process is covered by a lease, or takes one.
    /// `own_dir` says whether a request on the worktree's own directory counts (a stat
    /// of it from outside does not).
    fn enter(&self, h: &Header, ino: u64, own_dir: bool) -> Result<(), i32> {
        let Some(tracker) = &self.tracker else {
            return Ok(());
        };
        let Some((worktree, is_root)) = self.view.worktree_of(ino) else {
            return Ok(());
        };
        if is_root && !own_dir {
            return Ok(());
        }
        tracker
            .touch(worktree, || self.view.worktree_path(worktree), h.pid)
            .map_err(|e| {
                logged(
                    "enter",
                    FsError::lease(format!("pid {} entering worktree {worktree}", h.pid), e),
                )
            })
    }

    fn init_choice(&self, kernel: &KernelInit) -> InitChoice {
        // Lookups in one directory may run in parallel (git's preload threads do that);
        // symlink targets never change in place, so the kernel may cache them.
        // Without opendir the kernel caches directory listings, dropping them when a request
        // it makes changes the directory, or when the directory's mtime moves (checked with
        // fresh attributes thanks to AUTO_INVAL_DATA; the top of the mount reports the
        // catalog's change time as mtime).
        let mut wanted = init::PARALLEL_DIROPS
            | init::CACHE_SYMLINKS
            | init::NO_OPENDIR_SUPPORT
            | init::AUTO_INVAL_DATA;
        // A listing comes with each entry's attributes, which the kernel links as if it
        // had looked each name up; in its adaptive mode only where names of the
        // directory were looked up or stat'ed since, and always at a listing's start.
        if self.want_readdirplus {
            wanted |= init::DO_READDIRPLUS | init::READDIRPLUS_AUTO;
        }
        let offered = kernel.flags & wanted;
        if offered != wanted {
            tracing::info!(
                "kernel declined FUSE capabilities {:#x}",
                wanted & !kernel.flags
            );
        }
        self.no_opendir
            .store(offered & init::NO_OPENDIR_SUPPORT != 0, Ordering::Relaxed);
        tracing::info!(
            "FUSE session initialised (protocol 7.{}, capabilities {offered:#x})",
            kernel.minor
        );
        let mut choice = InitChoice {
            flags: offered,
            max_background: 64,
            max_stack_depth: 0,
        };
        // Passthrough: the kernel reads and writes the backing file (the cached blob, the
        // upper file) itself. Backing files on a stacked filesystem (overlayfs) need one
        // more level of stacking.
        if !self.want_passthrough {
            tracing::info!(
                "FUSE passthrough: off (--no-passthrough); file I/O goes through the daemon"
            );
        } else if !has_cap_sys_admin() {
            tracing::info!("FUSE passthrough: off (the daemon lacks CAP_SYS_ADMIN, which the kernel asks of passthrough: not root); file I/O goes through the daemon");
        } else if kernel.flags & init::PASSTHROUGH == 0 || kernel.minor < 40 {
            tracing::info!("FUSE passthrough: off (this kernel does not offer it); file I/O goes through the daemon");
        } else {
            let depth = if self.view.state_on_stacked_fs() {
                2
            } else {
                1
            };
            choice.flags |= init::PASSTHROUGH;
            choice.max_stack_depth = depth;
            self.passthrough.store(true, Ordering::Relaxed);
            self.view
                .stats
                .passthrough_on
                .store(true, Ordering::Relaxed);
            tracing::info!("FUSE passthrough: on (stack depth {depth}); the kernel does file I/O on the backing files");
        }
        choice
    }

    /// Serves one request (the protocol's own requests, INIT and INTERRUPT, are the
    /// session's).
    fn serve_op(&self, h: &Header, op: Op<'_>, device: &Arc<Device>) -> Answer {
        let ino = h.nodeid;
        macro_rules! span {
            ($op:expr) => {
                let _span =
                    tracing::debug_span!($op, req = h.unique, ino = ino, pid = h.pid).entered();
            };
        }
        macro_rules! enter {
            ($ino:expr, $own:expr) => {
                if let Err(e) = self.enter(h, $ino, $own) {
                    return Answer::Error(e);
                }
            };
        }
        // A request that would change what `$ino` is in: refused (EBUSY) while a guarded
        // turn runs in its worktree and the caller is outside the turn's process tree. The
        // token counts the request as a change in progress until it is dropped, when the
        // request has been served (its answer is sent right after, by the transport).
        macro_rules! guard {
            ($ino:expr, $op:expr) => {
                match self.view.may_change($ino, h.pid) {
                    Ok(t) => t,
                    Err(e) => return errno($op, e),
                }
            };
        }
        let caller = Caller {
            uid: h.uid,
            gid: h.gid,
        };
        match op {
            Op::Lookup { name } => {
                span!("lookup");
                enter!(ino, true);
                match self.view.lookup(ino, name) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => match e.negative_ttl {
                        Some(ttl) if e.errno() == libc::ENOENT => {
                            tracing::debug!(op = "lookup", "{} (cached as absent)", e.message);
                            // A negative entry: the kernel remembers for `ttl` that the
                            // name does not exist.
                            let mut n = bare_entry(0, FType::File);
                            (n.entry_valid, n.entry_valid_nsec) = valid(ttl);
                            Answer::Entry(n)
                        }
                        _ => errno("lookup", e),
                    },
                }
            }
            Op::Forget { nlookup } => {
                self.forget(ino, nlookup);
                Answer::Nothing
            }
            Op::BatchForget(nodes) => {
                for n in nodes {
                    self.forget(n.nodeid, n.nlookup);
                }
                Answer::Nothing
            }
            Op::Getattr { fh } => {
                span!("getattr");
                enter!(ino, false);
                match self.view.getattr(ino, fh) {
                    Ok(e) => Answer::Attr(attr_out(&e)),
                    Err(e) => errno("getattr", e),
                }
            }
            Op::Setattr(a) => {
                span!("setattr");
                enter!(ino, true);
                let _change = guard!(ino, "setattr");
                let time = |t: Option<SetTime>| {
                    t.map(|t| match t {
                        SetTime::Now => None,
                        SetTime::At(s) => Some(s),
                    })
                };
                let set = SetAttr {
                    mode: a.mode,
                    uid: a.uid,
                    gid: a.gid,
                    size: a.size,
                    atime: time(a.atime),
                    mtime: time(a.mtime),
                    fh: a.fh,
                };
                match self.view.setattr(ino, set) {
                    Ok(e) => Answer::Attr(attr_out(&e)),
                    Err(e) => errno("setattr", e),
                }
            }
            Op::Readlink => {
                span!("readlink");
                enter!(ino, false);
                match self.view.readlink(ino) {
                    Ok(d) => Answer::Data(d),
                    Err(e) => errno("readlink", e),
                }
            }
            Op::Mknod {
                name,
                mode,
                umask,
                rdev,
            } => {
                span!("mknod");
                enter!(ino, true);
                let _change = guard!(ino, "mknod");
                match self.view.mknod(ino, name, mode, umask, rdev, caller) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("mknod", e),
                }
            }
            Op::Mkdir { name, mode, umask } => {
                span!("mkdir");
                enter!(ino, true);
                let _change = guard!(ino, "mkdir");
                match self.view.mkdir(ino, name, mode, umask, caller) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("mkdir", e),
                }
            }
            Op::Unlink { name } => {
                span!("unlink");
                enter!(ino, true);
                let _change = guard!(ino, "unlink");
                match self.view.unlink(ino, name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("unlink", e),
                }
            }
            Op::Rmdir { name } => {
                span!("rmdir");
                enter!(ino, true);
                let _change = guard!(ino, "rmdir");
                match self.view.rmdir(ino, name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("rmdir", e),
                }
            }
            Op::Symlink { name, target } => {
                span!("symlink");
                enter!(ino, true);
                let _change = guard!(ino, "symlink");
                match self
                    .view
                    .symlink(ino, name, std::path::Path::new(target), caller)
                {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("symlink", e),
                }
            }
            Op::Rename {
                name,
                newdir,
                newname,
                flags,
            } => {
                span!("rename");
                enter!(ino, true);
                enter!(newdir, true);
                let _from = guard!(ino, "rename");
                let _to = guard!(newdir, "rename");
                match self.view.rename(ino, name, newdir, newname, flags) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("rename", e),
                }
            }
            Op::Link { oldnodeid, newname } => {
                let ino = oldnodeid;
                span!("link");
                enter!(h.nodeid, true);
                let _into = guard!(h.nodeid, "link");
                let _linked = guard!(ino, "link");
                match self.view.link(ino, h.nodeid, newname) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("link", e),
                }
            }
            Op::Open { flags } => {
                span!("open");
                enter!(ino, true);
                let flags = flags as i32;
                let writes =
                    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
                let _change = match writes {
                    true => Some(guard!(ino, "open")),
                    false => None,
                };
                match self.view.open(ino, flags) {
                    Ok((fh, generated)) => {
                        Answer::Open(Self::opened(fh, self.open_mode(fh, generated, device)))
                    }
                    Err(e) => errno("open", e),
                }
            }
            Op::Read { fh, offset, size } => {
                span!("read");
                match self.view.read(fh, offset, size) {
                    Ok(d) => Answer::Data(d),
                    Err(e) => errno("read", e),
                }
            }
            Op::Write { fh, offset, data } => {
                span!("write");
                match self.view.write(fh, offset, data) {
                    Ok(n) => Answer::Write(abi::WriteOut {
                        size: n,
                        padding: 0,
                    }),
                    Err(e) => errno("write", e),
                }
            }
            // Nothing to do at close (no write-back cache; locks are the kernel's): ENOSYS
            // tells the kernel never to send FLUSH again, which saves every close() a
            // synchronous round trip.
            Op::Flush { .. } => Answer::Error(libc::ENOSYS),
            // No ioctl is supported. Answered ENOTTY at once and without a log line: every
            // `isatty()` (Python's `open`, for one) asks TCGETS of each file it opens.
            Op::Ioctl => Answer::Error(libc::ENOTTY),
            Op::Release { fh } => {
                self.backings.lock().release(fh);
                self.view.release(fh);
                Answer::Empty
            }
            Op::Fsync { fh, datasync } => {
                span!("fsync");
                match self.view.fsync(fh, datasync) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("fsync", e),
                }
            }
            Op::Opendir { .. } => {
                span!("opendir");
                if self.no_opendir.load(Ordering::Relaxed) {
                    // Declined once, the kernel stops asking and caches listings (see init).
                    return Answer::Error(libc::ENOSYS);
                }
                match self.view.opendir(ino) {
                    Ok((fh, cacheable)) => Answer::Open(abi::OpenOut {
                        fh,
                        open_flags: if cacheable {
                            fopen::CACHE_DIR | fopen::KEEP_CACHE
                        } else {
                            0
                        },
                        backing_id: 0,
                    }),
                    Err(e) => errno("opendir", e),
                }
            }
            Op::Readdir { fh, offset, size } => {
                span!("readdir");
                enter!(ino, true);
                match self.entries_from(ino, fh, offset) {
                    Ok(entries) => {
                        let mut buf = DirBuf::new(size);
                        for (next, e) in entries {
                            if !buf.add(e.ino, next, dtype(e.kind), &e.name) {
                                break;
                            }
                        }
                        buf.into_answer()
                    }
                    Err(e) => errno("readdir", e),
                }
            }
            Op::Readdirplus { fh, offset, size } => {
                span!("readdirplus");
                enter!(ino, true);
                self.listing_plus(ino, fh, offset, size)
            }
            Op::Releasedir { fh } => {
                self.view.release(fh);
                Answer::Empty
            }
            Op::Fsyncdir { .. } => Answer::Empty,
            Op::Statfs => {
                span!("statfs");
                match self.view.statfs() {
                    Ok(s) => Answer::Statfs(abi::Kstatfs {
                        blocks: s.blocks,
                        bfree: s.bfree,
                        bavail: s.bavail,
                        files: s.files,
                        ffree: s.ffree,
                        bsize: s.bsize,
                        namelen: s.namelen,
                        frsize: s.frsize,
                        padding: 0,
                        spare: [0; 6],
                    }),
                    Err(e) => errno("statfs", e),
                }
            }
            // Not served: ENOSYS, once, and the kernel answers EOPNOTSUPP itself from then
            // on (ENOTSUP would be asked again each time).
            Op::Setxattr { .. }
            | Op::Getxattr { .. }
            | Op::Listxattr { .. }
            | Op::Removexattr { .. }
                if !self.xattrs =>
            {
                self.count_xattr();
                Answer::Error(libc::ENOSYS)
            }
            Op::Setxattr { name, value, flags } => {
                span!("setxattr");
                enter!(ino, true);
                let _change = guard!(ino, "setxattr");
                self.count_xattr();
                match self.view.setxattr(ino, name, value, flags) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("setxattr", e),
                }
            }
            Op::Getxattr { name, size } => {
                span!("getxattr");
                self.count_xattr();
                xattr_answer("getxattr", self.view.getxattr(ino, name, size))
            }
            Op::Listxattr { size } => {
                span!("listxattr");
                self.count_xattr();
                xattr_answer("listxattr", self.view.listxattr(ino, size))
            }
            Op::Removexattr { name } => {
                span!("removexattr");
                enter!(ino, true);
                let _change = guard!(ino, "removexattr");
                self.count_xattr();
                match self.view.removexattr(ino, name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("removexattr", e),
                }
            }
            Op::Access { .. } => {
                span!("access");
                match self.view.access(ino) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("access", e),
                }
            }
            Op::Create {
                name,
                mode,
                umask,
                flags,
            } => {
                span!("create");
                enter!(ino, true);
                let _change = guard!(ino, "create");
                match self
                    .view
                    .create(ino, name, mode, umask, flags as i32, caller)
                {
                    Ok((e, fh)) => Answer::Create(
                        entry_out(&e),
                        Self::opened(fh, self.open_mode(fh, false, device)),
                    ),
                    Err(e) => errno("create", e),
                }
            }
            Op::Tmpfile { mode, umask, flags } => {
                span!("tmpfile");
                enter!(ino, true);
                let _change = guard!(ino, "tmpfile");
                match self.view.tmpfile(ino, mode, umask, flags as i32, caller) {
                    Ok((e, fh)) => Answer::Create(
                        entry_out(&e),
                        Self::opened(fh, self.open_mode(fh, false, device)),
                    ),
                    Err(e) => errno("tmpfile", e),
                }
            }
            Op::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => {
                span!("fallocate");
                match self.view.fallocate(fh, offset, length, mode) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("fallocate", e),
                }
            }
            Op::Lseek { fh, offset, whence } => {
                span!("lseek");
                match self.view.lseek(fh, offset, whence) {
                    Ok(offset) => Answer::Lseek(abi::LseekOut { offset }),
                    Err(e) => errno("lseek", e),
                }
            }
            Op::CopyFileRange(c) => {
                span!("copy_file_range");
                enter!(c.nodeid_out, true);
                let _change = guard!(c.nodeid_out, "copy_file_range");
                match self
                    .view
                    .copy_file_range(c.fh_in, c.off_in, c.fh_out, c.off_out, c.len)
                {
                    // The reply counts bytes in 32 bits: a copy is at most 4 GiB - 1 a
                    // request (the kernel asks again for the rest).
                    Ok(n) => Answer::Write(abi::WriteOut {
                        size: n.min(u32::MAX as u64) as u32,
                        padding: 0,
                    }),
                    Err(e) => errno("copy_file_range", e),
                }
            }
            Op::Init(_) | Op::Destroy | Op::Interrupt { .. } | Op::Unsupported(_) => {
                Answer::Error(libc::ENOSYS)
            }
        }
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        // Under the backings' lock: no open can register a backing file for a new node
        // with this number between the node's end and the end of its bookkeeping (lock
        // order: backings, then the node table; nothing takes them the other way).
        let mut b = self.backings.lock();
        if self.view.forget(ino, nlookup) {
            b.forgotten(ino);
        }
    }
}

impl Filesystem for WorktreeFs {
    fn init(&self, kernel: &KernelInit) -> InitChoice {
        self.init_choice(kernel)
    }

    fn serve(&self, h: &Header, op: Op<'_>, device: &Arc<Device>) -> Answer {
        self.serve_op(h, op, device)
    }

    fn transport(&self, uring: bool) {
        self.view.stats.uring_on.store(uring, Ordering::Relaxed);
    }
}

/// The directory-entry type of a listing entry (`DT_*`, which is `S_IFMT >> 12`).
fn dtype(k: FType) -> u32 {
    mode_type(k) >> 12
}

/// The file-type bits of a mode.
fn mode_type(k: FType) -> u32 {
    match k {
        FType::Dir => libc::S_IFDIR,
        FType::File => libc::S_IFREG,
        FType::Symlink => libc::S_IFLNK,
        FType::Fifo => libc::S_IFIFO,
        FType::Socket => libc::S_IFSOCK,
        FType::CharDev => libc::S_IFCHR,
        FType::BlockDev => libc::S_IFBLK,
    }
}

fn fattr(a: &Attr) -> abi::Attr {
    let (atime, atimensec) = secs_nsecs(a.atime);
    let (mtime, mtimensec) = secs_nsecs(a.mtime);
    let (ctime, ctimensec) = secs_nsecs(a.ctime);
    abi::Attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_type(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn entry_out(e: &Entry) -> abi::EntryOut {
    let (secs, nsecs) = valid(e.ttl);
    abi::EntryOut {
        nodeid: e.attr.ino,
        generation: 0,
        entry_valid: secs,
        attr_valid: secs,
        entry_valid_nsec: nsecs,
        attr_valid_nsec: nsecs,
        attr: fattr(&e.attr),
    }
}

fn attr_out(e: &Entry) -> abi::AttrOut {
    let (secs, nsecs) = valid(e.ttl);
    abi::AttrOut {
        attr_valid: secs,
        attr_valid_nsec: nsecs,
        dummy: 0,
        attr: fattr(&e.attr),
    }
}

/// An entry carrying only an inode number and a type: what the kernel reads of a negative
/// entry, and of a listing entry it does not link (`.`, `..`, or one declined with inode
/// 0). Its cache times are zero.
fn bare_entry(ino: u64, kind: FType) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: ino,
        attr: abi::Attr {
            ino,
            mode: mode_type(kind),
            blksize: 4096,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The answer to a GETXATTR or LISTXATTR.
fn xattr_answer(op: &str, r: Result<crate::fs::xattr::Xattr, FsError>) -> Answer {
    match r {
        Ok(crate::fs::xattr::Xattr::Size(size)) => {
            Answer::XattrSize(abi::GetxattrOut { size, padding: 0 })
        }
        Ok(crate::fs::xattr::Xattr::Data(d)) => Answer::Data(d),
        Err(e) => errno(op, e),
    }
}

/// The answer to a failed request, logged at its kind's level.
fn errno(op: &str, e: FsError) -> Answer {
    Answer::Error(logged(op, e))
}

/// The errno of a failed request, logged at its kind's level.
fn logged(op: &str, e: FsError) -> i32 {
    let errno = e.errno();
    match e.level() {
        Level::Debug => tracing::debug!(op, errno, "{}", e.message),
        Level::Info => tracing::info!(op, errno, "{}", e.message),
        Level::Warn => tracing::warn!(op, errno, "{}", e.message),
        Level::Error => tracing::error!(op, errno, "{}", e.message),
    }
    errno
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn attributes_carry_type_and_permissions_in_the_mode() {
        let a = Attr {
            ino: 5,
            size: 10,
            blocks: 1,
            atime: UNIX_EPOCH + Duration::new(1, 2),
            mtime: SystemTime::UNIX_EPOCH,
            ctime: UNIX_EPOCH + Duration::new(3, 4),
            kind: FType::Symlink,
            perm: 0o777,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
        };
        let f = fattr(&a);
        assert_eq!(f.mode, libc::S_IFLNK | 0o777);
        assert_eq!((f.atime, f.atimensec, f.ctime, f.ctimensec), (1, 2, 3, 4));
        assert_eq!(dtype(FType::Dir), libc::DT_DIR as u32);
        assert_eq!(dtype(FType::Fifo), libc::DT_FIFO as u32);
    }
}
