//! What a mount asks of the daemon (`MountRequest`), and what its end does with the
//! leases (`AtUnmount`, which `worktreefs unmount` tells the daemon through a file).

use std::fs::{self, File};
use std::path::PathBuf;

use crate::state::StateDir;

/// The environment variable naming the descriptor a background daemon reports ready on.
pub const READY_FD_ENV: &str = "WORKTREEFS_READY_FD";

/// Everything a mount is started with.
pub struct MountRequest {
    pub state: StateDir,
    pub mountpoint: Option<PathBuf>,
    pub threads: usize,
    /// Grace period, in seconds, between a worktree's last release and its cleanup.
    pub linger: u64,
    /// Process leases (off only to measure what they cost).
    pub track_leases: bool,
    /// FUSE passthrough where the kernel offers it.
    pub passthrough: bool,
    /// Listings with the entries' attributes (READDIRPLUS) where the kernel offers them.
    pub readdirplus: bool,
    /// FUSE over io_uring: `auto` (where the kernel offers it), `off`, `on` (required).
    pub uring: crate::fs::mount::Uring,
    /// Whether io_uring's queue threads yield their CPU to the callers they answer
    /// (`--yield-cpu auto|off|always`).
    pub yield_cpu: crate::fs::mount::YieldCpu,
    /// `user.` extended attributes served (`mount --xattr`).
    pub xattrs: bool,
    /// Inodes kept before the kernel's caches of idle worktrees are dropped.
    pub cache_nodes: usize,
    /// Other users may use the mount (`mount --allow-other`); otherwise it is private.
    pub allow_other: bool,
    /// How long one checkout filter may run for a file.
    pub filter_timeout: std::time::Duration,
    /// How long cleanup's inspection of one worktree may take.
    pub inspect_timeout: std::time::Duration,
    /// How long removals are kept for `worktreefs restore`, and the free disk they leave.
    pub keep: crate::lifecycle::cleanup::keep::KeepPolicy,
    /// What an unmount that did not say (`umount`, `fusermount3 -u`, a signal) does.
    pub on_umount: AtUnmount,
    /// The ports worktrees get blocks of.
    pub ports: crate::lifecycle::ports::PortRange,
}

/// What the end of a mount does with the leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtUnmount {
    /// Every lease released (reason `unmount`), then cleanup: the admin's reclaim.
    Reclaim,
    /// A planned restart: named leases and their worktrees kept for the next mount;
    /// process leases released, and what nobody then holds cleaned up.
    KeepSessions,
}

impl AtUnmount {
    pub fn from_keep_sessions(keep: bool) -> AtUnmount {
        if keep {
            AtUnmount::KeepSessions
        } else {
            AtUnmount::Reclaim
        }
    }

    fn word(self) -> &'static str {
        match self {
            AtUnmount::Reclaim => "reclaim",
            AtUnmount::KeepSessions => "keep-sessions",
        }
    }

    /// What `worktreefs unmount` asked for this unmount (`state`'s `unmount-mode` file,
    /// taken away as it is read), else `default`.
    pub(super) fn asked(state: &StateDir, default: AtUnmount) -> AtUnmount {
        let asked = AtUnmount::said(state, default);
        let _ = fs::remove_file(state.unmount_mode_file());
        asked
    }

    /// What `worktreefs unmount` has said for this unmount so far (a lazy one that
    /// detached the mount, say), else `default`; the file is left for
    /// [`AtUnmount::asked`].
    pub(super) fn said(state: &StateDir, default: AtUnmount) -> AtUnmount {
        use std::os::fd::AsFd;
        // Only a small regular file (never a FIFO or a link put there) is read.
        let said = File::open(&state.root).ok().and_then(|root| {
            crate::beneath::read_regular(root.as_fd(), b"unmount-mode", 64)
                .ok()
                .map(|(bytes, _)| String::from_utf8_lossy(&bytes).into_owned())
        });
        match said.as_deref().map(str::trim) {
            Some("keep-sessions") => AtUnmount::KeepSessions,
            Some("reclaim") => AtUnmount::Reclaim,
            _ => default,
        }
    }

    /// Marks this as what the unmount whose cleanup before the mount goes is running asked
    /// ([`AtUnmount::being_asked`]), until the guard goes: a signal's unmount meanwhile
    /// does as that one would.
    pub fn asking(self) -> Asking {
        *ASKED.lock() = Some(self);
        Asking(self)
    }

    /// What the unmount whose cleanup before the mount goes is running asked, if one is.
    pub fn being_asked() -> Option<AtUnmount> {
        *ASKED.lock()
    }

    /// Tells the daemon what this unmount is to do, before it is unmounted; the inode of
    /// the file written (a new one each time: written beside and renamed into place).
    pub fn tell(self, state: &StateDir) -> std::io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let file = state.unmount_mode_file();
        crate::durable::write_file_synced(&file, self.word().as_bytes())?;
        Ok(fs::symlink_metadata(&file)?.ino())
    }
}

/// What the unmount running its cleanup before the mount goes asked (the daemon's, in
/// memory: nothing is left of it when that ends, or when the command is killed).
static ASKED: parking_lot::Mutex<Option<AtUnmount>> = parking_lot::Mutex::new(None);

/// [`AtUnmount::asking`]'s guard.
pub struct Asking(AtUnmount);

impl Drop for Asking {
    fn drop(&mut self) {
        let mut asked = ASKED.lock();
        if *asked == Some(self.0) {
            *asked = None;
        }
    }
}
