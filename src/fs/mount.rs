//! Mounting: the FUSE session over the adapter, its options, and the thread that carries
//! the view's cache invalidations to the kernel.

use std::path::Path;
use std::sync::Arc;

use crate::fuse::{Notifier, Session};
pub use crate::fuse::{Uring, YieldCpu};

/// Whether the kernel offers FUSE over io_uring now; Err: why not and how to turn it on.
pub fn uring_available() -> Result<(), String> {
    crate::fuse::uring::available()
}

/// The fuse module's switch for io_uring (as `doctor` names it).
pub fn uring_switch() -> std::path::PathBuf {
    crate::fuse::uring::switch()
}

use crate::lifecycle::holders::Tracker;

use super::adapter::WorktreeFs;
use super::{Inval, View};

pub struct MountOptions {
    /// Threads answering requests.
    pub threads: usize,
    /// FUSE passthrough where the kernel offers it.
    pub passthrough: bool,
    /// Listings with their entries' attributes (READDIRPLUS).
    pub readdirplus: bool,
    /// Other users may use the mount (FUSE's `allow_other`); otherwise only its owner.
    pub allow_other: bool,
    /// FUSE over io_uring: where the kernel offers it (`auto`), never, or required.
    pub uring: Uring,
    /// `user.` extended attributes served (each write then costs one more round trip).
    pub xattrs: bool,
    /// Whether io_uring's queue threads yield their CPU to the callers they answer
    /// (`fuse/yielding.rs`).
    pub yield_cpu: YieldCpu,
}

/// A mounted filesystem; `run` serves it until it is unmounted.
pub struct Mount {
    session: Option<Session<WorktreeFs>>,
    /// Mounted here by [`mount_direct`] or [`mount_fusermount`]: detached when this is
    /// dropped before `run` saw the mount go (a failure after mounting).
    ours: Option<Ours>,
}

impl Mount {
    pub fn run(mut self) -> std::io::Result<()> {
        let session = self.session.take().expect("a mount runs once");
        let r = session.run();
        // The session ends when the kernel's connection does: unmounted. One that failed
        // (INIT refused) leaves the mount to be detached when this is dropped.
        if r.is_ok() {
            self.ours = None;
        }
        r
    }

    pub fn notifier(&self) -> Notifier {
        self.session.as_ref().expect("not run yet").notifier()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        drop(self.session.take());
        match self.ours.take() {
            Some(Ours::Direct(path)) => {
                if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
                    // SAFETY: umount2 on a path string we own.
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
                }
            }
            Some(Ours::Fusermount(path, bin)) => {
                let _ = std::process::Command::new(bin)
                    .args(["-u", "-z", "--"])
                    .arg(path)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            None => {}
        }
    }
}

/// How a mount this module made is undone.
enum Ours {
    /// mount(2) as root: umount2.
    Direct(std::path::PathBuf),
    /// Through fusermount3 (this user may not mount): `fusermount3 -u`.
    Fusermount(std::path::PathBuf, std::path::PathBuf),
}

/// What a user who may not mount FUSE filesystems itself, and has no fusermount3, is told.
pub fn cannot_mount_message() -> String {
    format!(
        "this user (uid {}) may not mount FUSE filesystems itself (that needs root, or /dev/fuse open to it) and fusermount3 is not installed to do it on its behalf: install it (`apt-get install fuse3` on Debian and Ubuntu, `dnf install fuse3` on Fedora), or mount as root. Without root the daemon has no FUSE passthrough and cannot give files to other users (see `worktreefs doctor`)",
        nix::unistd::getuid()
    )
}

/// The fusermount3 a user who may not mount FUSE filesystems mounts through (the
/// setuid helper of the fuse3 package), if installed: `$WORKTREEFS_FUSERMOUNT` (for
/// tests), else the first on PATH, /usr/bin, /bin.
pub fn fusermount_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("WORKTREEFS_FUSERMOUNT") {
        let p = std::path::PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/bin".into()])
        .map(|d| d.join("fusermount3"))
        .find(|p| p.is_file())
}

/// Mounts through fusermount3, as libfuse does for a user who may not mount: it opens
/// /dev/fuse, mounts (type fuse.worktreefs) and hands the descriptor back over a socket
/// named in `_FUSE_COMMFD`.
fn mount_fusermount(
    bin: &Path,
    mountpoint: &Path,
    allow_other: bool,
) -> Result<std::os::fd::OwnedFd, MountError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    let (ours, theirs) = UnixStream::pair()?;
    // The helper's end is inherited (the pair is made close-on-exec).
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut opts =
        String::from("default_permissions,fsname=worktreefs,subtype=worktreefs,nosuid,nodev");
    if allow_other {
        opts.push_str(",allow_other");
    }
    let out = std::process::Command::new(bin)
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| MountError(format!("running {}: {e}", bin.display())))?;
    drop(theirs);
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let hint = if why.contains("/dev/fuse") {
            "; fusermount3 opens /dev/fuse as the user, so it must be open to users (mode 0666, as distributions make it: `chmod 0666 /dev/fuse`, or a udev rule), or mount as root"
        } else {
            ""
        };
        return Err(MountError(format!(
            "{} could not mount at {} ({}): {why}{hint}",
            bin.display(),
            mountpoint.display(),
            out.status
        )));
    }
    // One byte and the descriptor, in an SCM_RIGHTS message.
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; its buffers are set below and outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: recvmsg into the buffers above.
    let n = unsafe { libc::recvmsg(ours.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(MountError(format!(
            "receiving the FUSE descriptor from {}: {}",
            bin.display(),
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: the control buffer was filled by recvmsg; CMSG_FIRSTHDR checks its length.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: cmsg, when not null, points into cbuf.
    if cmsg.is_null()
        || unsafe {
            (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        }
    {
        return Err(MountError(format!(
            "{} mounted but sent no FUSE descriptor",
            bin.display()
        )));
    }
    // SAFETY: an SCM_RIGHTS message's data is a descriptor now ours.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int) };
    // SAFETY: as above: it is open and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why mounting failed, said for a person: the mountpoint, the cause and what to do.
#[derive(Debug)]
pub struct MountError(String);

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MountError {}

impl From<std::io::Error> for MountError {
    fn from(e: std::io::Error) -> Self {
        MountError(e.to_string())
    }
}

/// The filesystem type the kernel shows for a mount (`/proc/mounts`, `mount -t`):
/// FUSE's, with worktreefs as its subtype, as fusermount3 and fstab name it.
pub const FSTYPE: &str = "fuse.worktreefs";

/// Mounts with mount(2) itself, as type [`FSTYPE`]. Ok(None) when this process may not
/// mount (not root): the mount then goes through fusermount3, which sets the subtype too.
fn mount_direct(
    mountpoint: &Path,
    allow_other: bool,
) -> Result<Option<std::os::fd::OwnedFd>, MountError> {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse");
    let device = match device {
        Ok(d) => d,
        // Not this user's to open: mounts go through fusermount3.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Ok(None),
        Err(e) => return Err(MountError(format!("opening /dev/fuse: {e}"))),
    };
    // The root's mode as the kernel wants it (S_IFDIR and the permission bits); the
    // directory is opened without following a symlink put there.
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(mountpoint)
        .map_err(|e| MountError(format!("opening mountpoint {}: {e}", mountpoint.display())))?;
    let mode = dir.metadata()?.mode() & (libc::S_IFMT | 0o7777);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={},default_permissions",
        device.as_raw_fd(),
        mode,
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if allow_other {
        data.push_str(",allow_other");
    }
    // Mounted on the directory opened above (through its descriptor), never on whatever
    // the path names by the time mount(2) looks it up.
    let target = c(&format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let (source, fstype, data) = (c("worktreefs"), c(FSTYPE), c(&data));
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Ok(None);
        }
        return Err(MountError(format!(
            "mounting at {} failed: {e}",
            mountpoint.display()
        )));
    }
    Ok(Some(OwnedFd::from(device)))
}

/// Mounts `view` at `mountpoint`; `tracker` takes process leases (None: not tracked).
/// Signals should be blocked in the calling thread first: the session's threads inherit
/// the mask.
pub fn mount(
    view: Arc<View>,
    tracker: Option<Arc<Tracker>>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mount, MountError> {
    // Required and not to be had: refused before anything is mounted (the kernel offers
    // it at INIT exactly when its fuse module has it on).
    if opts.uring == Uring::On {
        if let Err(why) = uring_available() {
            return Err(MountError(format!(
                "FUSE over io_uring was asked for (--uring on) but {why}; or mount with --uring auto"
            )));
        }
    }
    let fs = WorktreeFs::new(
        view.clone(),
        tracker,
        opts.passthrough,
        opts.readdirplus,
        opts.xattrs,
    );
    // Private to the user who mounted it, as FUSE mounts are by default (the kernel lets
    // nobody else in); `--allow-other` lets every user in (each worktree then belongs to
    // the user who created it, and a repository's directory is no more open than the
    // repository's own).
    let (fd, ours) = match mount_direct(mountpoint, opts.allow_other)? {
        Some(fd) => (fd, Ours::Direct(mountpoint.to_path_buf())),
        None => match fusermount_bin() {
            Some(bin) => {
                let fd = mount_fusermount(&bin, mountpoint, opts.allow_other)?;
                (fd, Ours::Fusermount(mountpoint.to_path_buf(), bin))
            }
            None => return Err(MountError(cannot_mount_message())),
        },
    };
    let session = Session::new(fs, fd, opts.threads.max(1), opts.uring, opts.yield_cpu);
    // Invalidations are sent from their own thread, never from the thread answering a
    // request: the kernel holds a directory's lock while it waits for our answer to a
    // lookup, mkdir or rmdir in it, and invalidating an entry of that directory takes the
    // same lock (a deadlock if done in the request's thread).
    let notifier = session.notifier();
    let (inval_tx, inval_rx) = std::sync::mpsc::channel::<Inval>();
    let _ = std::thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for what in inval_rx {
                let result = match &what {
                    Inval::Inode(ino) => notifier.inval_inode(ino.0),
                    Inval::Entry(parent, name) => notifier.inval_entry(parent.0, name),
                    Inval::Delivered(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                // ENOENT: the kernel had nothing cached; nothing to drop.
                if let Err(e) = result {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        tracing::debug!("invalidating a kernel cache entry: {e}");
                    }
                }
            }
        });
    let inval_tx = parking_lot::Mutex::new(inval_tx);
    view.set_invalidator(Box::new(move |what| {
        let _ = inval_tx.lock().send(what);
    }));
    Ok(Mount {
        session: Some(session),
        ours: Some(ours),
    })
}
