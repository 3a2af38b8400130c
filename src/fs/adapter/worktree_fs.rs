//! The filesystem the FUSE layer serves: the view, the lease tracker, and what INIT
//! agreed (passthrough, listings, extended attributes); entering a worktree takes a lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::errors::*;
use crate::fs::error::FsError;
use crate::fs::passthrough::Backings;
use crate::fs::View;
use crate::fuse::abi::init;
use crate::fuse::{Answer, BackingId, Device, Filesystem, Header, InitChoice, KernelInit, Op};
use crate::ino::Ino;
use crate::lifecycle::holders::Tracker;

pub struct WorktreeFs {
    pub view: Arc<View>,
    /// Process leases; None in setups that do not track them.
    pub(super) tracker: Option<Arc<Tracker>>,
    /// The kernel agreed to do without opendir: it then caches listings itself.
    pub(super) no_opendir: AtomicBool,
    /// FUSE passthrough: asked for (`mount --no-passthrough` turns it off), then on only if
    /// the kernel offers it and registering a backing file works.
    pub(super) want_passthrough: bool,
    pub(super) passthrough: AtomicBool,
    /// Listings with the entries' attributes: asked for unless `mount --no-readdirplus`.
    pub(super) want_readdirplus: bool,
    /// `user.` extended attributes served (`mount --xattr`). Off, every attribute request
    /// is answered ENOSYS once and the kernel stops asking: served, it asks a file's
    /// `security.capability` before every `write(2)`, one more round trip each.
    pub(super) xattrs: bool,
    pub(super) backings: Mutex<Backings<BackingId>>,
}

impl WorktreeFs {
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

    /// Counts an extended-attribute request (`.control/stats`: with attributes served,
    /// the kernel asks `security.capability` before every write).
    pub(super) fn count_xattr(&self) {
        self.view
            .stats
            .xattr_requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A request inside a worktree: its process is covered by a lease, or takes one.
    /// `own_dir` says whether a request on the worktree's own directory counts (a stat
    /// of it from outside does not).
    pub(super) fn enter(&self, h: &Header, ino: u64, own_dir: bool) -> Result<(), i32> {
        let Some(tracker) = &self.tracker else {
            return Ok(());
        };
        let Some((worktree, is_root)) = self.view.worktree_of(Ino(ino)) else {
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

    pub(super) fn init_choice(&self, kernel: &KernelInit) -> InitChoice {
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

    pub(super) fn forget(&self, ino: u64, nlookup: u64) {
        // Under the backings' lock: no open can register a backing file for a new node
        // with this number between the node's end and the end of its bookkeeping (lock
        // order: backings, then the node table; nothing takes them the other way).
        let mut b = self.backings.lock();
        if self.view.forget(Ino(ino), nlookup) {
            b.forgotten(Ino(ino));
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
        if !uring {
            self.view.stats.yield_on.store(false, Ordering::Relaxed);
        }
    }

    fn yielding(&self, on: bool) {
        self.view.stats.yield_on.store(on, Ordering::Relaxed);
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
