//! Reaching files below a directory descriptor, never by absolute path: every resolution
//! starts at a directory the daemon holds open, never follows a symlink, never leaves that
//! directory, and never crosses into another filesystem (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`; where
//! the kernel lacks `openat2`, one `openat(O_NOFOLLOW)` per component). The final component
//! of every call here is taken as it is (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`).
//!
//! The daemon runs as root on behalf of users who may be adversaries and who create the
//! symlinks the upper layer holds; this module is the one place that turns a name into a
//! file, so nothing a user made can steer the daemon outside the layer (libfuse's
//! `passthrough_hp` and fuse-backend-rs resolve the same way).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

pub type Stat = libc::stat;

/// Whether `openat2` is known to be missing (then components are walked one by one).
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// The longest piece of a relative path handed to the kernel at once: a path of any
/// length is resolved in pieces of at most this many bytes, each beneath the last.
const PIECE: usize = 3072;

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn owned(rc: libc::c_int) -> io::Result<OwnedFd> {
    check(rc)?;
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}

/// Opens `path` (trusted: the daemon's own state directory) as a directory to resolve
/// beneath.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    owned(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

/// Opens the directory at the absolute `path` through no symbolic link on the way (one
/// `openat(O_NOFOLLOW)` per component from `/`; mount points are crossed): a path
/// recorded as a real path (a registered repository's git directory) is still the same
/// place only while none of its components has become a link. ELOOP or ENOTDIR when
/// one has.
pub fn open_real_dir(path: &Path) -> io::Result<OwnedFd> {
    let rel = path
        .as_os_str()
        .as_bytes()
        .strip_prefix(b"/")
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let root = open_root(Path::new("/"))?;
    walk(
        root.as_fd(),
        rel,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    )
}

/// Opens `rel` (relative, `/`-separated, no `..`; empty for `dir` itself) beneath `dir`
/// with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` added) and `mode` for a creation.
pub fn open(dir: BorrowedFd, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let rel = trim(rel);
    if rel.is_empty() {
        return reopen_dir(dir, flags);
    }
    if rel.len() > PIECE {
        // Long: walk to the last piece's directory first.
        let cut = split_long(rel);
        let (head, tail) = (&rel[..cut], &rel[cut + 1..]);
        let d = open(dir, head, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        return open(d.as_fd(), tail, flags, mode);
    }
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2(dir, rel, flags, mode) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
            }
            other => return other,
        }
    }
    walk(dir, rel, flags, mode)
}

/// Where to cut a long path: the last `/` within the first `PIECE` bytes.
fn split_long(rel: &[u8]) -> usize {
    rel[..PIECE]
        .iter()
        .rposition(|&b| b == b'/')
        .unwrap_or(PIECE.min(rel.len()))
}

fn trim(rel: &[u8]) -> &[u8] {
    let mut r = rel;
    while let Some(rest) = r.strip_prefix(b"/") {
        r = rest;
    }
    while let Some(rest) = r.strip_suffix(b"/") {
        r = rest;
    }
    r
}

/// `dir` itself, opened anew with `flags` (`.` beneath it).
fn reopen_dir(dir: BorrowedFd, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            flags | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

fn openat2(dir: BorrowedFd, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(rel)?;
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        mode as u64
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH
        | libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_NO_MAGICLINKS
        | libc::RESOLVE_NO_XDEV;
    // SAFETY: valid descriptor, NUL-terminated path, and an open_how of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned(rc as libc::c_int)
}

/// One `openat(O_NOFOLLOW)` per component, refusing `..` (the fallback for kernels
/// without `openat2`).
fn walk(dir: BorrowedFd, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let parts: Vec<&[u8]> = rel
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let mut cur: Option<OwnedFd> = None;
    for (i, part) in parts.iter().enumerate() {
        if *part == b".." {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let last = i + 1 == parts.len();
        let f = if last {
            flags
        } else {
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC
        };
        let at = cur.as_ref().map(|d| d.as_fd()).unwrap_or(dir);
        let c = cstr(part)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = owned(unsafe { libc::openat(at.as_raw_fd(), c.as_ptr(), f, mode) });
        // A symlink met on the way (ENOTDIR from O_DIRECTORY|O_NOFOLLOW) reads as ELOOP,
        // as openat2 says it.
        let fd = match fd {
            Err(e) if !last && e.raw_os_error() == Some(libc::ENOTDIR) => {
                match stat_at(at, OsStr::from_bytes(part)) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        return Err(io::Error::from_raw_os_error(libc::ELOOP))
                    }
                    _ => return Err(e),
                }
            }
            other => other?,
        };
        cur = Some(fd);
    }
    match cur {
        Some(fd) => Ok(fd),
        None => reopen_dir(dir, flags),
    }
}

/// The directory `rel` beneath `dir`, as an `O_PATH` descriptor.
pub fn dir(dir: BorrowedFd, rel: &[u8]) -> io::Result<OwnedFd> {
    open(dir, rel, libc::O_PATH | libc::O_DIRECTORY, 0)
}

/// The entry `name` of `dir` itself, whatever it is (a symlink is not followed), as an
/// `O_PATH` descriptor.
pub fn entry(dir: BorrowedFd, name: &OsStr) -> io::Result<OwnedFd> {
    let c = name_c(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })
}

/// Reads the regular file `rel` beneath `dir` whole, as a file a user may have replaced
/// must be read: reached without following a symlink anywhere on the way, looked at
/// before it is opened (a FIFO, a socket or a device is never opened: a FIFO would block
/// the reader until someone writes), at most `cap` bytes, in one read of the one file
/// whose stat is returned with it. An error names what the file is instead.
pub fn read_regular(dir: BorrowedFd, rel: &[u8], cap: u64) -> io::Result<(Vec<u8>, Stat)> {
    let not_regular = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a regular file ({what})"),
        )
    };
    let fd = open(dir, rel, libc::O_PATH, 0).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => not_regular("a symbolic link, not followed"),
        Some(libc::EXDEV) => {
            not_regular("reached through a symbolic link or a mount, not followed")
        }
        _ => e,
    })?;
    let st = fstat(fd.as_fd())?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFLNK => return Err(not_regular("a symbolic link, not followed")),
        libc::S_IFIFO => return Err(not_regular("a FIFO")),
        libc::S_IFDIR => return Err(not_regular("a directory")),
        libc::S_IFSOCK => return Err(not_regular("a socket")),
        _ => return Err(not_regular("a device")),
    }
    if st.st_size as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes ({} bytes)", st.st_size),
        ));
    }
    let file = reopen(fd.as_fd(), libc::O_RDONLY)?;
    let mut out = Vec::with_capacity(st.st_size as usize);
    io::Read::read_to_end(&mut io::Read::take(&file, cap + 1), &mut out)?;
    if out.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {cap} bytes (it grew while read)"),
        ));
    }
    // The stat of what was read (a write between the two shows in its times or size).
    Ok((out, fstat(file.as_fd())?))
}

/// The file at `path` opened for reading only when it is a regular file, following
/// symlinks as the program whose file it is would (git follows them in ignore files),
/// but never opening anything else: `O_PATH` and `fstat` first, since opening a FIFO
/// blocks the reader and opening a device has effects of its own. Ok(None) when it is
/// not a regular file.
pub fn open_regular_following(path: &Path) -> io::Result<Option<File>> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    let fd = owned(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) })?;
    if fstat(fd.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    reopen(fd.as_fd(), libc::O_RDONLY).map(Some)
}

/// [`open_regular_following`], read whole: at most `cap` bytes.
pub fn read_regular_following(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    let Some(f) = open_regular_following(path)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&f, cap), &mut out)?;
    Ok(Some(out))
}

/// [`read_regular`] of `rel` beneath the trusted directory `root` (the repository's git
/// directory, say, whose own path the daemon was given).
pub fn read_regular_in(root: &Path, rel: &Path, cap: u64) -> io::Result<(Vec<u8>, Stat)> {
    let dir = open_root(root)?;
    read_regular(dir.as_fd(), rel.as_os_str().as_bytes(), cap)
}

/// Replaces the file `name` in the directory `rel` beneath the trusted directory `root`
/// with one holding `bytes` (mode `mode`), as a file a user may have replaced must be
/// written: the directory is reached through no symlink, and whatever `name` is now (a
/// symlink to a file of root's, say) is replaced, never written through: the new file is
/// made beside it (`O_EXCL`, never following) and renamed over it, synced.
pub fn replace_file_in(
    root: &Path,
    rel: &Path,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
) -> io::Result<()> {
    let top = open_root(root)?;
    let dir = open(
        top.as_fd(),
        rel.as_os_str().as_bytes(),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    replace_file_at(dir.as_fd(), name, bytes, mode)
}

/// As [`replace_file_in`], in the directory `dir` (a descriptor: the directory it was
/// opened as, whatever has been renamed since).
pub fn replace_file_at(dir: BorrowedFd, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".wtfs-new");
    let tmp = name_c(&tmp_name)?;
    let _ = unlink_at(dir, &tmp_name, false);
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    })?;
    // The mode asked for, whatever the umask.
    chmod(fd.as_fd(), mode)?;
    let mut f = File::from(fd);
    let written = io::Write::write_all(&mut f, bytes)
        .and_then(|_| f.sync_all())
        .and_then(|_| rename_at(dir, &tmp_name, dir, name, 0));
    if written.is_err() {
        let _ = unlink_at(dir, &tmp_name, false);
    }
    written
}

/// A single component: no `/`, not `..` (`.` is the directory itself).
fn name_c(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.contains(&b'/') || b == b".." || b.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    cstr(b)
}

pub fn fstat(fd: BorrowedFd) -> io::Result<Stat> {
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and a stat buffer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn stat_at(dir: BorrowedFd, name: &OsStr) -> io::Result<Stat> {
    let c = name_c(name)?;
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, a stat buffer.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// The `/proc/self/fd/N` name of `fd`: opening or changing it reaches exactly the file
/// `fd` is (the way `passthrough_hp` reopens and changes an `O_PATH` descriptor).
pub fn proc_path(fd: BorrowedFd) -> CString {
    cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes()).expect("no NUL in a number")
}

/// Sets the access and modification times of the file `fd` refers to (an `O_PATH`
/// descriptor too: through its `/proc/self/fd` link, which needs no read access).
pub fn set_times(fd: BorrowedFd, atime: libc::timespec, mtime: libc::timespec) -> io::Result<()> {
    let p = proc_path(fd);
    let times = [atime, mtime];
    // SAFETY: a NUL-terminated path and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) })
}

/// Opens the file `fd` (an `O_PATH` descriptor of a file that is not a symlink) anew with
/// `flags`.
pub fn reopen(fd: BorrowedFd, flags: i32) -> io::Result<File> {
    let p = proc_path(fd);
    // SAFETY: a NUL-terminated path.
    let fd = owned(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, 0) })?;
    Ok(File::from(fd))
}

/// chmod of the file `fd` is (not a symlink: Linux has no mode on those): `fchmod` for an
/// open file, through `/proc/self/fd` for an `O_PATH` descriptor.
pub fn chmod(fd: BorrowedFd, mode: u32) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    match check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
        other => return other,
    }
    let p = proc_path(fd);
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })
}

/// chmod of the entry `name` of `dir`, which the caller knows is no symlink (fchmodat
/// follows one at the name).
pub fn chmod_at(dir: BorrowedFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = name_c(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t, 0) })
}

/// chown of the file `fd` is (a symlink itself, when it is one); `None` keeps a field.
pub fn chown(fd: BorrowedFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    // SAFETY: valid descriptor, empty name with AT_EMPTY_PATH.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid.unwrap_or(u32::MAX),
            gid.unwrap_or(u32::MAX),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// utimensat of `name` in `dir`, not following a symlink.
pub fn utimens_at(dir: BorrowedFd, name: &OsStr, times: &[libc::timespec; 2]) -> io::Result<()> {
    let c = name_c(name)?;
    // SAFETY: valid descriptor, NUL-terminated name, two timespecs.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// utimensat of the file `fd` is (not a symlink).
pub fn utimens(fd: BorrowedFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    let p = proc_path(fd);
    // SAFETY: NUL-terminated path, two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) })
}

pub fn mkdir_at(dir: BorrowedFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = name_c(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) })
}

pub fn mknod_at(dir: BorrowedFd, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let c = name_c(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            c.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })
}

pub fn symlink_at(target: &[u8], dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
    let (t, c) = (cstr(target)?, name_c(name)?);
    // SAFETY: NUL-terminated strings and a valid descriptor.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) })
}

pub fn readlink_at(dir: BorrowedFd, name: &OsStr) -> io::Result<Vec<u8>> {
    readlink_c(dir, &name_c(name)?)
}

/// The target of the symlink `fd` is (an `O_PATH` descriptor of it).
pub fn readlink(fd: BorrowedFd) -> io::Result<Vec<u8>> {
    readlink_c(fd, c"")
}

fn readlink_c(dir: BorrowedFd, c: &std::ffi::CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid descriptor, NUL-terminated name, a buffer of the length passed.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Removes `name` from `dir` (a directory with `is_dir`).
pub fn unlink_at(dir: BorrowedFd, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let c = name_c(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) })
}

/// renameat2 of `from` in `from_dir` to `to` in `to_dir`, with `flags`
/// (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
pub fn rename_at(
    from_dir: BorrowedFd,
    from: &OsStr,
    to_dir: BorrowedFd,
    to: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let (a, b) = (name_c(from)?, name_c(to)?);
    // SAFETY: valid descriptors and NUL-terminated names.
    check(unsafe {
        libc::renameat2(
            from_dir.as_raw_fd(),
            a.as_ptr(),
            to_dir.as_raw_fd(),
            b.as_ptr(),
            flags,
        )
    })
}

/// A hard link `to` in `to_dir` of `from` in `from_dir` (not following a symlink).
pub fn link_at(
    from_dir: BorrowedFd,
    from: &OsStr,
    to_dir: BorrowedFd,
    to: &OsStr,
) -> io::Result<()> {
    let (a, b) = (name_c(from)?, name_c(to)?);
    // SAFETY: valid descriptors and NUL-terminated names.
    check(unsafe {
        libc::linkat(
            from_dir.as_raw_fd(),
            a.as_ptr(),
            to_dir.as_raw_fd(),
            b.as_ptr(),
            0,
        )
    })
}

/// Opens a new file with no name in the directory `dir` (`O_TMPFILE`, with `flags`, the
/// access mode among them, and mode `mode`).
pub fn tmpfile(dir: BorrowedFd, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            flags | libc::O_TMPFILE | libc::O_CLOEXEC,
            mode as libc::mode_t,
        )
    })
}

/// Gives the file `fd` the name `to` in `to_dir`: a link of an `O_TMPFILE` file opened
/// without `O_EXCL` (any other file with no name left: ENOENT, as the kernel answers).
/// Through `/proc/self/fd`, which needs no privilege (`AT_EMPTY_PATH` would).
pub fn link_fd(fd: BorrowedFd, to_dir: BorrowedFd, to: &OsStr) -> io::Result<()> {
    let (p, b) = (proc_path(fd), name_c(to)?);
    // SAFETY: a valid descriptor and NUL-terminated paths.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            p.as_ptr(),
            to_dir.as_raw_fd(),
            b.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

/// One entry of a directory listing: its name, its type as `d_type` gives it
/// (`DT_UNKNOWN` on filesystems that do not fill it), its inode number.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: OsString,
    pub d_type: u8,
    pub ino: u64,
}

impl Listed {
    pub fn is_dir(&self, dir: BorrowedFd) -> bool {
        match self.d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => {
                stat_at(dir, &self.name).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            }
            _ => false,
        }
    }
}

/// The entries of the directory `dir` (`.` and `..` left out). Each entry that cannot be
/// read fails the listing.
pub fn list(dir: BorrowedFd) -> io::Result<Vec<Listed>> {
    let fd = reopen_dir(dir, libc::O_RDONLY)?;
    // SAFETY: fdopendir takes the descriptor over (closed by closedir).
    let d = unsafe { libc::fdopendir(fd.as_raw_fd()) };
    if d.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(fd);
    let mut out = Vec::new();
    let result = loop {
        // readdir's end and its error look alike but for errno.
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: a stream opened above.
        let e = unsafe { libc::readdir64(d) };
        if e.is_null() {
            let err = io::Error::last_os_error();
            break match err.raw_os_error() {
                Some(0) | None => Ok(()),
                _ => Err(err),
            };
        }
        // SAFETY: readdir returned an entry with a NUL-terminated name.
        let (name, d_type, ino) = unsafe {
            (
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr()),
                (*e).d_type,
                (*e).d_ino,
            )
        };
        let name = name.to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(Listed {
            name: OsString::from_vec(name.to_vec()),
            d_type,
            ino,
        });
    };
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(d) };
    result.map(|_| out)
}

/// Removes `name` in `dir` and everything below it, never following a symlink. The walk
/// keeps its own stack (each directory's name, identity and what of its listing is left)
/// and one descriptor at a time, going back up by `..`: a tree as deep as a user can make
/// one costs neither a thread's stack nor the process's descriptors. A directory moved
/// out of the tree meanwhile (by a user who owns it) would lead `..` elsewhere: the
/// directory reached must be the one the walk came down from (device and inode), or the
/// removal stops (EXDEV) having removed nothing outside the tree.
pub fn remove_tree(dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
    // Removes a non-directory; whether it was a directory instead.
    let unlinked = |d: BorrowedFd, n: &OsStr| match unlink_at(d, n, false) {
        Ok(()) => Ok(false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::EPERM)) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    };
    if !unlinked(dir, name)? {
        return Ok(());
    }
    let identity = |fd: BorrowedFd| fstat(fd).map(|st| (st.st_dev, st.st_ino));
    let mut cur = open(dir, name.as_bytes(), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let mut stack: Vec<(OsString, (u64, u64), Vec<Listed>)> = vec![(
        name.to_os_string(),
        identity(cur.as_fd())?,
        list(cur.as_fd())?,
    )];
    loop {
        let (_, _, left) = stack.last_mut().expect("emptied only at the end");
        let mut deeper = None;
        while let Some(e) = left.pop() {
            if unlinked(cur.as_fd(), &e.name)? {
                deeper = Some(e.name);
                break;
            }
        }
        if let Some(child) = deeper {
            cur = open(
                cur.as_fd(),
                child.as_bytes(),
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )?;
            let entries = list(cur.as_fd())?;
            stack.push((child, identity(cur.as_fd())?, entries));
            continue;
        }
        let (n, _, _) = stack.pop().expect("looked at above");
        if stack.is_empty() {
            return match unlink_at(dir, &n, true) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                other => other,
            };
        }
        // SAFETY: a valid descriptor and a NUL-terminated name.
        cur = owned(unsafe {
            libc::openat(
                cur.as_raw_fd(),
                c"..".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        let (_, came_from, _) = stack.last().expect("not empty");
        if identity(cur.as_fd())? != *came_from {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        match unlink_at(cur.as_fd(), &n, true) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            other => other?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), b"inside").unwrap();
        fs::create_dir(d.path().join("outside")).unwrap();
        fs::write(d.path().join("outside/f"), b"outside").unwrap();
        symlink(d.path().join("outside"), root.join("a/abs")).unwrap();
        symlink("../..", root.join("a/b/up")).unwrap();
        symlink("b", root.join("a/rel")).unwrap();
        let fd = open_root(&root).unwrap();
        (d, fd)
    }

    #[test]
    fn a_real_path_is_opened_only_while_no_component_is_a_link() {
        let (d, _) = tree();
        let real = d.path().join("root/a/b");
        assert!(open_real_dir(&real).is_ok());
        // a/rel -> b, and a link to the whole tree.
        assert!(open_real_dir(&d.path().join("root/a/rel")).is_err());
        symlink(d.path().join("root"), d.path().join("link")).unwrap();
        assert!(open_real_dir(&d.path().join("link/a/b")).is_err());
        assert!(open_real_dir(Path::new("relative/path")).is_err());
    }

    fn read(dir: BorrowedFd, rel: &str) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = File::from(open(dir, rel.as_bytes(), libc::O_RDONLY, 0)?);
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    /// A file a user may have replaced is read only when it is a regular file reached
    /// through no symlink, within its cap; a FIFO is refused without blocking.
    #[test]
    fn read_regular_reads_files_and_refuses_the_rest_without_blocking() {
        let (d, root) = tree();
        let r = root.as_fd();
        let (bytes, st) = read_regular(r, b"a/b/f", 64).unwrap();
        assert_eq!((bytes.as_slice(), st.st_size), (&b"inside"[..], 6));
        let fifo = cstr(d.path().join("root/a/fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        check(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }).unwrap();
        let started = std::time::Instant::now();
        for (rel, what) in [
            ("a/fifo", "a FIFO"),
            ("a/rel", "a symbolic link"),
            ("a/rel/f", "symbolic link"),
            ("a/abs/f", "symbolic link"),
            ("a/b", "a directory"),
        ] {
            let e = read_regular(r, rel.as_bytes(), 64).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{rel}: {e}");
            assert!(e.to_string().contains(what), "{rel}: {e}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let e = read_regular(r, b"a/b/f", 5).unwrap_err();
        assert!(e.to_string().contains("larger than 5 bytes"), "{e}");
        let (bytes, _) = read_regular_in(&d.path().join("root"), Path::new("a/b/f"), 64).unwrap();
        assert_eq!(bytes, b"inside");
        // Following symlinks (as git does in ignore files), never opening a FIFO.
        let rf = |rel: &str| read_regular_following(&d.path().join("root").join(rel), 64);
        assert_eq!(rf("a/rel/f").unwrap().unwrap(), b"inside");
        assert_eq!(rf("a/fifo").unwrap(), None);
        assert_eq!(rf("a/b").unwrap(), None);
        assert_eq!(rf("nope").unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    /// A replaced file is never written through: a symlink at its name is replaced, its
    /// target untouched; a symlink on the way to its directory is refused.
    #[test]
    fn replace_file_in_replaces_and_never_writes_through() {
        let (d, _root) = tree();
        let root = d.path().join("root");
        symlink(d.path().join("outside/f"), root.join("a/b/g")).unwrap();
        replace_file_in(&root, Path::new("a/b"), OsStr::new("g"), b"new\n", 0o644).unwrap();
        assert_eq!(fs::read(d.path().join("outside/f")).unwrap(), b"outside");
        assert!(fs::symlink_metadata(root.join("a/b/g")).unwrap().is_file());
        assert_eq!(fs::read(root.join("a/b/g")).unwrap(), b"new\n");
        let e =
            replace_file_in(&root, Path::new("a/abs"), OsStr::new("f"), b"x", 0o644).unwrap_err();
        assert!(
            matches!(
                e.raw_os_error(),
                Some(libc::ELOOP) | Some(libc::EXDEV) | Some(libc::ENOTDIR)
            ),
            "{e}"
        );
        assert_eq!(fs::read(d.path().join("outside/f")).unwrap(), b"outside");
        let names: Vec<_> = fs::read_dir(root.join("a/b"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 3, "no temporary left: {names:?}");
    }

    /// Inside names resolve; a symlink anywhere on the way, `..`, or a final symlink
    /// never does, whether the kernel has openat2 or the walk stands in for it.
    #[test]
    fn resolution_stays_beneath_and_follows_no_symlink() {
        let (_d, root) = tree();
        for fallback in [false, true] {
            NO_OPENAT2.store(fallback, Ordering::Relaxed);
            let r = root.as_fd();
            assert_eq!(read(r, "a/b/f").unwrap(), b"inside", "fallback {fallback}");
            for bad in ["a/abs/f", "a/rel/f", "a/b/up/a/b/f", "../root/a/b/f"] {
                let e = read(r, bad).unwrap_err();
                assert!(
                    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV)),
                    "fallback {fallback}: {bad}: {e}"
                );
            }
            // The final component is never followed either.
            let e = open(r, b"a/rel", libc::O_RDONLY, 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "fallback {fallback}");
            assert!(
                open(r, b"a/rel", libc::O_PATH, 0).is_ok(),
                "a symlink itself"
            );
        }
        NO_OPENAT2.store(false, Ordering::Relaxed);
    }

    /// A path longer than PATH_MAX resolves, in pieces, each beneath the last.
    #[test]
    fn a_path_longer_than_path_max_resolves() {
        let d = tempfile::tempdir().unwrap();
        let root = open_root(d.path()).unwrap();
        let part = "d".repeat(200);
        let mut rel = Vec::new();
        let mut cur = root.try_clone().unwrap();
        for _ in 0..30 {
            mkdir_at(cur.as_fd(), OsStr::new(&part), 0o755).unwrap();
            cur = dir(cur.as_fd(), part.as_bytes()).unwrap();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(part.as_bytes());
        }
        assert!(rel.len() > libc::PATH_MAX as usize);
        let deep = dir(root.as_fd(), &rel).unwrap();
        assert_eq!(
            fstat(deep.as_fd()).unwrap().st_ino,
            fstat(cur.as_fd()).unwrap().st_ino
        );
    }

    #[test]
    fn changes_through_descriptors_reach_the_file_not_its_name() {
        let (d, root) = tree();
        let r = root.as_fd();
        let a = dir(r, b"a").unwrap();
        let f = entry(dir(r, b"a/b").unwrap().as_fd(), OsStr::new("f")).unwrap();
        // The name now holds something else; the descriptor still reaches the file.
        rename_at(
            a.as_fd(),
            OsStr::new("b"),
            a.as_fd(),
            OsStr::new("moved"),
            0,
        )
        .unwrap();
        symlink(d.path().join("outside"), d.path().join("root/a/b")).unwrap();
        chmod(f.as_fd(), 0o600).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            fs::symlink_metadata(d.path().join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("root/a/moved/f") & 0o777, 0o600);
        assert_ne!(mode("outside/f") & 0o777, 0o600);
        let st = fstat(f.as_fd()).unwrap();
        assert_eq!(st.st_mode & 0o777, 0o600);
        // Listings and trees go by descriptor too: removing a tree with a symlink to the
        // outside in it leaves the outside alone.
        let names: Vec<_> = list(a.as_fd())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(names.contains(&OsString::from("moved")), "{names:?}");
        remove_tree(r, OsStr::new("a")).unwrap();
        assert_eq!(fs::read(d.path().join("outside/f")).unwrap(), b"outside");
        assert!(!d.path().join("root/a").exists());
    }

    /// A directory moved out of a tree while the tree is removed: the walk, going back up
    /// from it, meets another directory than the one it came down from, and stops there,
    /// leaving the names of that directory (here the same names the tree's had) alone.
    #[test]
    fn removing_a_tree_stops_where_a_level_moved_out_of_it_leads() {
        let d = tempfile::tempdir().unwrap();
        let (tree, outside) = (d.path().join("a/b"), d.path().join("outside"));
        fs::create_dir_all(tree.join("y")).unwrap();
        fs::create_dir(&outside).unwrap();
        for n in 0..20_000 {
            fs::write(tree.join("y").join(n.to_string()), b"").unwrap();
        }
        // Names after `y` in b's listing, and the same names outside.
        for n in 0..50 {
            fs::write(tree.join(format!("v{n}")), b"tree").unwrap();
            fs::write(outside.join(format!("v{n}")), b"outside").unwrap();
        }
        let mover = {
            let (y, to) = (tree.join("y"), outside.join("y"));
            std::thread::spawn(move || loop {
                let left = fs::read_dir(&y).map(|r| r.count()).unwrap_or(0);
                if left < 19_000 {
                    let _ = fs::rename(&y, &to);
                    return;
                }
                std::thread::yield_now();
            })
        };
        let root = open_root(d.path()).unwrap();
        let r = remove_tree(root.as_fd(), OsStr::new("a"));
        mover.join().unwrap();
        for n in 0..50 {
            assert_eq!(
                fs::read(outside.join(format!("v{n}"))).unwrap(),
                b"outside",
                "v{n} outside the tree"
            );
        }
        if outside.join("y").exists() {
            // Moved in time: the walk met it elsewhere and stopped.
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EXDEV));
        }
    }
}
