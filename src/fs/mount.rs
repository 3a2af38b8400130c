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
    session: Session<WorktreeFs>,
}

impl Mount {
    pub fn run(self) -> std::io::Result<()> {
        self.session.run()
    }
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
    let session = Session::new(fs, mountpoint, &config).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) || e.kind() == std::io::ErrorKind::PermissionDenied
        {
            anyhow!(
                "no permission to mount at {}: {e}; run as root or allow FUSE mounts for this user",
                mountpoint.display()
            )
        } else {
            anyhow!("mounting at {} failed: {e}", mountpoint.display())
        }
    })?;
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
    Ok(Mount { session })
}
