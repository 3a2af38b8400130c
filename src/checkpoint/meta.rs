//! An entry's attributes as a checkpoint keeps them: type and mode, owner, times, and its
//! `user.` extended attributes (the only namespace a view lets callers set). Read from
//! an entry of the upper layer and put back on one.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::beneath::{self, Stat};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    /// `st_mode`: the type and the permission bits.
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) atime: (i64, i64),
    pub(crate) mtime: (i64, i64),
    /// `user.` attributes, by name.
    pub(crate) xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

pub(crate) fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

fn has_xattrs(mode: u32) -> bool {
    matches!(mode & libc::S_IFMT, libc::S_IFDIR | libc::S_IFREG)
}

impl Meta {
    /// The attributes of the entry `name` of `dir` (not following a symlink).
    pub(crate) fn of(dir: BorrowedFd, name: &OsStr) -> io::Result<Meta> {
        let st = beneath::stat_at(dir, name)?;
        let xattrs = if has_xattrs(st.st_mode) {
            read_user_xattrs(open_for_xattrs(dir, name, st.st_mode)?.as_fd())?
        } else {
            Vec::new()
        };
        Ok(Meta::from_stat(&st, xattrs))
    }

    /// The attributes of the file `fd` (an `O_PATH` descriptor will do).
    pub(crate) fn of_fd(fd: BorrowedFd) -> io::Result<Meta> {
        let st = beneath::fstat(fd)?;
        let xattrs = if has_xattrs(st.st_mode) {
            read_user_xattrs(beneath::reopen(fd, xattr_flags(st.st_mode))?.as_fd())?
        } else {
            Vec::new()
        };
        Ok(Meta::from_stat(&st, xattrs))
    }

    pub(crate) fn from_stat(st: &Stat, xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> Meta {
        Meta {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: (st.st_atime, st.st_atime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            xattrs,
        }
    }

    /// Puts these attributes on the entry `name` of `dir`: owner first (a chown clears
    /// set-id bits), then the mode, the `user.` attributes (those it did not have removed),
    /// and the times last (every other change moves them).
    pub(crate) fn apply(&self, dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
        let st = beneath::stat_at(dir, name)?;
        let c = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        if st.st_uid != self.uid || st.st_gid != self.gid {
            // SAFETY: a valid descriptor and a NUL-terminated name.
            check(unsafe {
                libc::fchownat(
                    dir.as_raw_fd(),
                    c.as_ptr(),
                    self.uid,
                    self.gid,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        if !is_link {
            beneath::chmod_at(dir, name, self.mode & 0o7777)?;
        }
        if has_xattrs(st.st_mode) {
            self.put_xattrs(open_for_xattrs(dir, name, st.st_mode)?.as_fd())?;
        }
        let ts = |(s, ns): (i64, i64)| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        beneath::utimens_at(dir, name, &[ts(self.atime), ts(self.mtime)])
    }

    /// Puts these attributes on the directory `fd` itself (the upper layer's root).
    pub(crate) fn apply_to_dir(&self, fd: BorrowedFd) -> io::Result<()> {
        let st = beneath::fstat(fd)?;
        if st.st_uid != self.uid || st.st_gid != self.gid {
            beneath::chown(fd, Some(self.uid), Some(self.gid))?;
        }
        beneath::chmod(fd, self.mode & 0o7777)?;
        let f = beneath::reopen(fd, xattr_flags(st.st_mode))?;
        self.put_xattrs(f.as_fd())?;
        let ts = |(s, ns): (i64, i64)| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        beneath::set_times(fd, ts(self.atime), ts(self.mtime))
    }

    /// Makes the `user.` attributes of the open file `f` these.
    fn put_xattrs(&self, f: BorrowedFd) -> io::Result<()> {
        for (n, _) in read_user_xattrs(f)? {
            if !self.xattrs.iter().any(|(k, _)| *k == n) {
                let n = CString::new(n).map_err(|_| einval())?;
                // SAFETY: a valid descriptor and a NUL-terminated name.
                check(unsafe { libc::fremovexattr(f.as_raw_fd(), n.as_ptr()) })?;
            }
        }
        for (n, v) in &self.xattrs {
            let n = CString::new(n.clone()).map_err(|_| einval())?;
            // SAFETY: a valid descriptor, a NUL-terminated name, a value of that length.
            check(unsafe {
                libc::fsetxattr(f.as_raw_fd(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0)
            })?;
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [self.mode, self.uid, self.gid] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.atime.0, self.atime.1, self.mtime.0, self.mtime.1] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.xattrs.len() as u32).to_le_bytes());
        for (n, v) in &self.xattrs {
            out.extend_from_slice(&(n.len() as u32).to_le_bytes());
            out.extend_from_slice(n);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Meta> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = b.get(at..at.checked_add(n)?)?;
            at += n;
            Some(s)
        };
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or_default());
        let i64_ = |s: &[u8]| i64::from_le_bytes(s.try_into().unwrap_or_default());
        let mode = u32_(take(4)?);
        let uid = u32_(take(4)?);
        let gid = u32_(take(4)?);
        let atime = (i64_(take(8)?), i64_(take(8)?));
        let mtime = (i64_(take(8)?), i64_(take(8)?));
        let n = u32_(take(4)?);
        let mut xattrs = Vec::new();
        for _ in 0..n {
            let nl = u32_(take(4)?) as usize;
            let name = take(nl)?.to_vec();
            let vl = u32_(take(4)?) as usize;
            xattrs.push((name, take(vl)?.to_vec()));
        }
        Some(Meta {
            mode,
            uid,
            gid,
            atime,
            mtime,
            xattrs,
        })
    }
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A regular file or directory opened to read and set its extended attributes (never a
/// FIFO or device: opening one may block or act).
fn open_for_xattrs(dir: BorrowedFd, name: &OsStr, mode: u32) -> io::Result<OwnedFd> {
    let flags = xattr_flags(mode);
    let fd = beneath::open(
        dir,
        std::os::unix::ffi::OsStrExt::as_bytes(name),
        flags | libc::O_NOATIME,
        0,
    )
    .or_else(|_| beneath::open(dir, std::os::unix::ffi::OsStrExt::as_bytes(name), flags, 0))?;
    Ok(fd)
}

fn xattr_flags(mode: u32) -> i32 {
    if is_dir(mode) {
        libc::O_RDONLY | libc::O_DIRECTORY
    } else {
        libc::O_RDONLY | libc::O_NONBLOCK
    }
}

/// The `user.` extended attributes of the open file `fd`, sorted by name.
pub(crate) fn read_user_xattrs(fd: BorrowedFd) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let raw = fd.as_raw_fd();
    let names = loop {
        // SAFETY: a size query.
        let want = unsafe { libc::flistxattr(raw, std::ptr::null_mut(), 0) };
        if want < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOTSUP) => Ok(Vec::new()),
                _ => Err(e),
            };
        }
        let mut buf = vec![0u8; want as usize];
        // SAFETY: a buffer of that length.
        let got = unsafe { libc::flistxattr(raw, buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue; // grew meanwhile
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        break buf;
    };
    let mut out = Vec::new();
    for n in names.split(|&b| b == 0).filter(|n| n.starts_with(b"user.")) {
        let c = CString::new(n).map_err(|_| einval())?;
        let value = loop {
            // SAFETY: a NUL-terminated name, a size query.
            let want = unsafe { libc::fgetxattr(raw, c.as_ptr(), std::ptr::null_mut(), 0) };
            if want < 0 {
                break None; // removed meanwhile
            }
            let mut v = vec![0u8; want as usize];
            // SAFETY: a buffer of that length.
            let got = unsafe { libc::fgetxattr(raw, c.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            if got < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE) {
                    continue;
                }
                break None;
            }
            v.truncate(got as usize);
            break Some(v);
        };
        if let Some(v) = value {
            out.push((n.to_vec(), v));
        }
    }
    out.sort();
    Ok(out)
}
