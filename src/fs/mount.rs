//! Mounting: the FUSE session over the adapter, its options, and the thread that carries
//! the view's cache invalidations to the kernel.

use std::path::Path;
use std::sync::Arc;

use anyhow::anyhow;
use fuser::{Config, MountOption, Session, SessionACL};

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
}

/// A mounted filesystem; `run` serves it until it is unmounted.
pub struct Mount {
    session: Option<Session<WorktreeFs>>,
    /// Mounted here by [`mount_direct`] (fuser's own mounts undo themselves): detached
    /// when this is dropped before `run` saw the mount go (a failure after mounting).
    ours: Option<std::path::PathBuf>,
}

impl Mount {
    pub fn run(mut self) -> std::io::Result<()> {
        let session = self.session.take().expect("a mount runs once");
        let r = session.run();
        // The session ends when the kernel's connection does: unmounted.
        self.ours = None;
        r
    }

    pub fn notifier(&self) -> fuser::Notifier {
        self.session.as_ref().expect("not run yet").notifier()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        drop(self.session.take());
        if let Some(path) = self.ours.take() {
            if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
                // SAFETY: umount2 on a path string we own.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
            }
        }
    }
}

/// The filesystem type the kernel shows for a mount (`/proc/mounts`, `mount -t`):
/// FUSE's, with worktreefs as its subtype, as fusermount3 and fstab name it.
pub const FSTYPE: &str = "fuse.worktreefs";

/// Mounts with mount(2) itself, so the mount's type is [`FSTYPE`] (fuser's own mount
/// says plain `fuse`). Ok(None) when this process may not mount (not root): fuser's
/// mount then goes through fusermount3, which sets the subtype too.
fn mount_direct(
    mountpoint: &Path,
    allow_other: bool,
) -> anyhow::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| anyhow!("opening /dev/fuse: {e}"))?;
    // The root's mode as the kernel wants it (S_IFDIR and the permission bits); the
    // directory is opened without following a symlink put there.
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(mountpoint)
        .map_err(|e| anyhow!("opening mountpoint {}: {e}", mountpoint.display()))?;
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
        return Err(anyhow!("mounting at {} failed: {e}", mountpoint.display()));
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
) -> anyhow::Result<Mount> {
    let answers: std::sync::Weak<dyn crate::lifecycle::cleanup::FsmonitorAnswers> =
        Arc::downgrade(&view) as _;
    crate::lifecycle::cleanup::answer_fsmonitor_from(answers);
    let fs = WorktreeFs::new(view.clone(), tracker, opts.passthrough, opts.readdirplus);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("worktreefs".into()),
        MountOption::Subtype("worktreefs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // Private to the user who mounted it, as FUSE mounts are by default; `--allow-other`
    // lets every user in (each worktree then belongs to the user who created it, and a
    // repository's directory is no more open than the repository's own).
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let acl = config.acl;
    let direct = match mount_direct(mountpoint, opts.allow_other) {
        Ok(fd) => fd,
        Err(e) => {
            // Not able to mount directly for another reason than permission: fuser's mount
            // says what it finds (its errors are the ones documented and tested).
            tracing::debug!("mounting with mount(2) directly: {e:#}; trying fuser's mount");
            None
        }
    };
    let (session, ours) = match direct {
        Some(fd) => {
            let ours = Some(mountpoint.to_path_buf());
            match Session::from_fd(fs, fd, acl, config) {
                Ok(s) => (s, ours),
                Err(e) => {
                    drop(Mount {
                        session: None,
                        ours,
                    });
                    return Err(anyhow!(
                        "starting the FUSE session at {} failed: {e}",
                        mountpoint.display()
                    ));
                }
            }
        }
        None => (fuser_mount(fs, mountpoint, &config)?, None),
    };
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
                    Inval::Inode(ino) => notifier.inval_inode(fuser::INodeNo(*ino), 0, 0),
                    Inval::Entry(parent, name) => {
                        notifier.inval_entry(fuser::INodeNo(*parent), name)
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
        ours,
    })
}

/// Mounts through fuser (fusermount3 where this process may not mount).
fn fuser_mount(
    fs: WorktreeFs,
    mountpoint: &Path,
    config: &Config,
) -> anyhow::Result<Session<WorktreeFs>> {
    Session::new(fs, mountpoint, config).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) || e.kind() == std::io::ErrorKind::PermissionDenied
        {
            anyhow!(
                "no permission to mount at {}: {e}; run as root or allow FUSE mounts for this user",
                mountpoint.display()
            )
        } else {
            anyhow!("mounting at {} failed: {e}", mountpoint.display())
        }
    })
}
