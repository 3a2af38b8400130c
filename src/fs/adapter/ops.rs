//! One request served: the `Op` matched to its `View` call and the result to its answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::abi_out::*;
use super::errors::*;
use super::worktree_fs::WorktreeFs;
use crate::fs::{Caller, FType, Fh, SetAttr};
use crate::fuse::abi::{self, fopen};
use crate::fuse::reply::valid;
use crate::fuse::{Answer, Device, DirBuf, Header, Op, SetTime};
use crate::ino::Ino;

impl WorktreeFs {
    /// Serves one request (the protocol's own requests, INIT and INTERRUPT, are the
    /// session's).
    pub(super) fn serve_op(&self, h: &Header, op: Op<'_>, device: &Arc<Device>) -> Answer {
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
                match self.view.lookup(Ino(ino), name) {
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
                match self.view.getattr(Ino(ino), fh.map(Fh)) {
                    Ok(e) => Answer::Attr(attr_out(&e)),
                    Err(e) => errno("getattr", e),
                }
            }
            Op::Setattr(a) => {
                span!("setattr");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "setattr");
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
                    fh: a.fh.map(Fh),
                };
                match self.view.setattr(Ino(ino), set) {
                    Ok(e) => Answer::Attr(attr_out(&e)),
                    Err(e) => errno("setattr", e),
                }
            }
            Op::Readlink => {
                span!("readlink");
                enter!(ino, false);
                match self.view.readlink(Ino(ino)) {
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
                let _change = guard!(Ino(ino), "mknod");
                match self.view.mknod(Ino(ino), name, mode, umask, rdev, caller) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("mknod", e),
                }
            }
            Op::Mkdir { name, mode, umask } => {
                span!("mkdir");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "mkdir");
                match self.view.mkdir(Ino(ino), name, mode, umask, caller) {
                    Ok(e) => Answer::Entry(entry_out(&e)),
                    Err(e) => errno("mkdir", e),
                }
            }
            Op::Unlink { name } => {
                span!("unlink");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "unlink");
                match self.view.unlink(Ino(ino), name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("unlink", e),
                }
            }
            Op::Rmdir { name } => {
                span!("rmdir");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "rmdir");
                match self.view.rmdir(Ino(ino), name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("rmdir", e),
                }
            }
            Op::Symlink { name, target } => {
                span!("symlink");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "symlink");
                match self
                    .view
                    .symlink(Ino(ino), name, std::path::Path::new(target), caller)
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
                let _from = guard!(Ino(ino), "rename");
                let _to = guard!(Ino(newdir), "rename");
                match self
                    .view
                    .rename(Ino(ino), name, Ino(newdir), newname, flags)
                {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("rename", e),
                }
            }
            Op::Link { oldnodeid, newname } => {
                let ino = oldnodeid;
                span!("link");
                enter!(h.nodeid, true);
                let _into = guard!(Ino(h.nodeid), "link");
                let _linked = guard!(Ino(ino), "link");
                match self.view.link(Ino(ino), Ino(h.nodeid), newname) {
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
                    true => Some(guard!(Ino(ino), "open")),
                    false => None,
                };
                match self.view.open(Ino(ino), flags) {
                    Ok((fh, generated)) => {
                        Answer::Open(Self::opened(fh, self.open_mode(fh, generated, device)))
                    }
                    Err(e) => errno("open", e),
                }
            }
            Op::Read { fh, offset, size } => {
                span!("read");
                match self.view.read(Fh(fh), offset, size) {
                    Ok(d) => Answer::Data(d),
                    Err(e) => errno("read", e),
                }
            }
            Op::Write { fh, offset, data } => {
                span!("write");
                match self.view.write(Fh(fh), offset, data) {
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
                self.backings.lock().release(Fh(fh));
                self.view.release(Fh(fh));
                Answer::Empty
            }
            Op::Fsync { fh, datasync } => {
                span!("fsync");
                match self.view.fsync(Fh(fh), datasync) {
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
                match self.view.opendir(Ino(ino)) {
                    Ok((fh, cacheable)) => Answer::Open(abi::OpenOut {
                        fh: fh.0,
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
                            if !buf.add(e.ino.0, next, dtype(e.kind), &e.name) {
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
                self.view.release(Fh(fh));
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
                let _change = guard!(Ino(ino), "setxattr");
                self.count_xattr();
                match self.view.setxattr(Ino(ino), name, value, flags) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("setxattr", e),
                }
            }
            Op::Getxattr { name, size } => {
                span!("getxattr");
                self.count_xattr();
                xattr_answer("getxattr", self.view.getxattr(Ino(ino), name, size))
            }
            Op::Listxattr { size } => {
                span!("listxattr");
                self.count_xattr();
                xattr_answer("listxattr", self.view.listxattr(Ino(ino), size))
            }
            Op::Removexattr { name } => {
                span!("removexattr");
                enter!(ino, true);
                let _change = guard!(Ino(ino), "removexattr");
                self.count_xattr();
                match self.view.removexattr(Ino(ino), name) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("removexattr", e),
                }
            }
            Op::Access { .. } => {
                span!("access");
                match self.view.access(Ino(ino)) {
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
                let _change = guard!(Ino(ino), "create");
                match self
                    .view
                    .create(Ino(ino), name, mode, umask, flags as i32, caller)
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
                let _change = guard!(Ino(ino), "tmpfile");
                match self
                    .view
                    .tmpfile(Ino(ino), mode, umask, flags as i32, caller)
                {
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
                match self.view.fallocate(Fh(fh), offset, length, mode) {
                    Ok(()) => Answer::Empty,
                    Err(e) => errno("fallocate", e),
                }
            }
            Op::Lseek { fh, offset, whence } => {
                span!("lseek");
                match self.view.lseek(Fh(fh), offset, whence) {
                    Ok(offset) => Answer::Lseek(abi::LseekOut { offset }),
                    Err(e) => errno("lseek", e),
                }
            }
            Op::CopyFileRange(c) => {
                span!("copy_file_range");
                enter!(c.nodeid_out, true);
                let _change = guard!(Ino(c.nodeid_out), "copy_file_range");
                match self.view.copy_file_range(
                    Fh(c.fh_in),
                    c.off_in,
                    Fh(c.fh_out),
                    c.off_out,
                    c.len,
                ) {
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
}
