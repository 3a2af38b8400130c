//! Which opens pass through to a backing file (FUSE passthrough), and the bookkeeping the
//! kernel's rules need: it keeps one I/O mode per inode while the inode is open, so every
//! passthrough open of an inode must name the same backing file, and no open through the
//! daemon (the page cache) may stand next to a passthrough one (it refuses such an open
//! with EIO).
//!
//! Generic over the kernel's backing id (`B`), so the decision is tested without a mount.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::FsResult;
use super::types::Backing;
use super::types::Fh;
use crate::ino::Ino;

/// Backing files registered with the kernel, and which inodes have handles doing I/O
/// through the daemon.
pub(super) struct Backings<B> {
    /// Handle -> its inode and backing.
    by_fh: HashMap<Fh, (Ino, Arc<B>)>,
    /// Inode -> its backing (while any handle holds it) and the backing file's identity;
    /// the entry goes with the inode's last handle, which closes the backing.
    by_ino: HashMap<Ino, (Arc<B>, (u64, u64))>,
    /// Handles doing I/O through the daemon, and how many each inode has.
    cached_fh: HashMap<Fh, Ino>,
    cached: HashMap<Ino, usize>,
}

impl<B> Default for Backings<B> {
    fn default() -> Self {
        Backings {
            by_fh: HashMap::new(),
            by_ino: HashMap::new(),
            cached_fh: HashMap::new(),
            cached: HashMap::new(),
        }
    }
}

/// How one open is answered.
#[derive(Debug)]
pub(super) enum Decision<B> {
    /// The kernel does I/O on this backing file itself.
    Passthrough(Arc<B>),
    /// Through the daemon, with the kernel's page cache (kept across opens for a base
    /// file, whose content never changes).
    Daemon,
    /// Through the daemon, bypassing the page cache: generated content, or an inode whose
    /// open could not be given its backing file while other handles pass through.
    DirectIo,
}

impl<B> Backings<B> {
    /// Whether an open of `ino` must go through the daemon: no handle of it passes
    /// through, and it reads the base (a copy-up while open would need another backing
    /// file), or another handle of it goes through the daemon.
    fn must_use_daemon(&self, ino: Ino, on_base: bool) -> bool {
        !self.by_ino.contains_key(&ino)
            && (on_base || self.cached.get(&ino).copied().unwrap_or(0) > 0)
    }

    fn through_daemon(&mut self, fh: Fh, ino: Ino) -> Decision<B> {
        self.cached_fh.insert(fh, ino);
        *self.cached.entry(ino).or_insert(0) += 1;
        Decision::Daemon
    }

    /// Handle `fh` is closed: its share of a backing file, or of the inode's handles
    /// through the daemon, goes.
    pub(super) fn release(&mut self, fh: Fh) {
        if let Some((ino, id)) = self.by_fh.remove(&fh) {
            // Ours and the inode entry's: the last handle of this inode.
            if Arc::strong_count(&id) == 2 {
                self.by_ino.remove(&ino);
            }
        }
        if let Some(ino) = self.cached_fh.remove(&fh) {
            if let Some(n) = self.cached.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    self.cached.remove(&ino);
                }
            }
        }
    }

    /// The kernel forgot inode `ino` (its node is gone; the number may be given to a new
    /// node at once). What its handles held goes now, not at their releases, which the
    /// daemon may process later than the forget: a new node with this number starts with
    /// no backing file and no handle through the daemon.
    pub(super) fn forgotten(&mut self, ino: Ino) {
        self.by_ino.remove(&ino);
        self.cached.remove(&ino);
        self.by_fh.retain(|_, (i, _)| *i != ino);
        self.cached_fh.retain(|_, i| *i != ino);
    }

    /// How many inodes have a backing file registered.
    #[cfg(test)]
    fn inodes_passing_through(&self) -> usize {
        self.by_ino.len()
    }
}

/// Decides how handle `fh` (of inode `ino`; `on_base`: it reads the base) is opened, with
/// passthrough on (`enabled`). The backing file is opened by `open_backing` outside the
/// lock (a syscall and the view's locks) and the decision checked again before `register`
/// makes the kernel's backing id; a failed registration turns passthrough off for the
/// session.
pub(super) fn decide<B>(
    backings: &Mutex<Backings<B>>,
    enabled: &AtomicBool,
    fh: Fh,
    ino: Ino,
    on_base: bool,
    open_backing: impl FnOnce() -> FsResult<Option<Backing>>,
    register: impl FnOnce(&File) -> std::io::Result<B>,
) -> Decision<B> {
    if !enabled.load(Ordering::Relaxed) {
        return Decision::Daemon;
    }
    {
        let mut b = backings.lock();
        if b.must_use_daemon(ino, on_base) {
            return b.through_daemon(fh, ino);
        }
    }
    let opened = open_backing();
    let mut b = backings.lock();
    let (file, key) = match opened {
        Ok(Some(backing)) => (backing.file, backing.key),
        Ok(None) => return b.through_daemon(fh, ino),
        Err(e) => {
            tracing::warn!("no passthrough for this open: {}", e.message);
            if b.by_ino.contains_key(&ino) {
                return Decision::DirectIo;
            }
            return b.through_daemon(fh, ino);
        }
    };
    if let Some((id, k)) = b.by_ino.get(&ino) {
        if *k != key {
            // Cannot happen while an inode keeps its upper file; said loudly if it does.
            tracing::error!(
                "inode {ino} is open with another backing file; this open is served by the daemon"
            );
            return Decision::DirectIo;
        }
        let id = id.clone();
        b.by_fh.insert(fh, (ino, id.clone()));
        return Decision::Passthrough(id);
    }
    if b.must_use_daemon(ino, on_base) {
        return b.through_daemon(fh, ino);
    }
    match register(&file) {
        Ok(id) => {
            let id = Arc::new(id);
            b.by_ino.insert(ino, (id.clone(), key));
            b.by_fh.insert(fh, (ino, id.clone()));
            Decision::Passthrough(id)
        }
        Err(e) => {
            // Turned off for the session: every later open goes through the daemon.
            if enabled.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    "FUSE passthrough turned off: registering a backing file failed ({e}); file I/O goes through the daemon"
                );
            }
            b.through_daemon(fh, ino)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::error::FsError;
    use std::cell::Cell;

    /// A backing id: the number of the registration that made it.
    type Id = u32;

    struct Kernel {
        backings: Mutex<Backings<Id>>,
        enabled: AtomicBool,
        registered: Cell<u32>,
        file: File,
    }

    impl Kernel {
        fn new() -> Kernel {
            Kernel {
                backings: Mutex::new(Backings::default()),
                enabled: AtomicBool::new(true),
                registered: Cell::new(0),
                file: tempfile::tempfile().unwrap(),
            }
        }

        /// Opens handle `fh` of `ino` whose backing file is `key` (None: no backing file,
        /// generated content; Some(Err): opening it fails).
        fn open(&self, fh: u64, ino: Ino, on_base: bool, key: Option<(u64, u64)>) -> String {
            let d = decide(
                &self.backings,
                &self.enabled,
                Fh(fh),
                ino,
                on_base,
                || {
                    Ok(key.map(|key| Backing {
                        file: self.file.try_clone().unwrap(),
                        key,
                    }))
                },
                |_| {
                    self.registered.set(self.registered.get() + 1);
                    Ok(self.registered.get())
                },
            );
            match d {
                Decision::Passthrough(id) => format!("pass {id}"),
                Decision::Daemon => "daemon".into(),
                Decision::DirectIo => "direct".into(),
            }
        }

        fn release(&self, fh: u64) {
            self.backings.lock().release(Fh(fh));
        }
    }

    const UPPER: Option<(u64, u64)> = Some((1, 100));

    #[test]
    fn opens_of_one_inode_share_one_backing_file_until_the_last_closes() {
        let k = Kernel::new();
        assert_eq!(k.open(1, Ino(7), false, UPPER), "pass 1");
        assert_eq!(
            k.open(2, Ino(7), false, UPPER),
            "pass 1",
            "shared, not registered again"
        );
        k.release(1);
        assert_eq!(k.backings.lock().inodes_passing_through(), 1);
        k.release(2);
        assert_eq!(k.backings.lock().inodes_passing_through(), 0);
        assert_eq!(
            k.open(3, Ino(7), false, UPPER),
            "pass 2",
            "a new backing after the last"
        );
    }

    #[test]
    fn a_base_file_goes_through_the_daemon_and_so_do_later_opens_of_its_inode() {
        let k = Kernel::new();
        assert_eq!(k.open(1, Ino(7), true, UPPER), "daemon");
        // Copied up meanwhile: the next open is of the upper file, but a handle of the
        // inode still goes through the daemon, and the kernel allows no mix.
        assert_eq!(k.open(2, Ino(7), false, UPPER), "daemon");
        k.release(1);
        assert_eq!(
            k.open(3, Ino(7), false, UPPER),
            "daemon",
            "handle 2 is still open"
        );
        k.release(2);
        k.release(3);
        assert_eq!(k.open(4, Ino(7), false, UPPER), "pass 1");
        // An inode that passes through takes a base open too (it has its backing).
        assert_eq!(k.open(5, Ino(7), true, UPPER), "pass 1");
    }

    #[test]
    fn another_backing_file_for_an_open_inode_is_served_direct() {
        let k = Kernel::new();
        assert_eq!(k.open(1, Ino(7), false, UPPER), "pass 1");
        assert_eq!(k.open(2, Ino(7), false, Some((1, 200))), "direct");
        assert_eq!(k.registered.get(), 1);
    }

    /// A node forgotten while the release of one of its handles is still queued: the next
    /// node given its inode number passes through with its own backing file, and the late
    /// release leaves the new node's state alone.
    #[test]
    fn an_inode_number_given_again_after_a_forget_starts_afresh() {
        let k = Kernel::new();
        assert_eq!(k.open(1, Ino(7), false, UPPER), "pass 1");
        assert_eq!(k.open(2, Ino(8), true, UPPER), "daemon");
        k.backings.lock().forgotten(Ino(7));
        k.backings.lock().forgotten(Ino(8));
        assert_eq!(
            k.open(3, Ino(7), false, Some((1, 200))),
            "pass 2",
            "a new file"
        );
        assert_eq!(
            k.open(4, Ino(8), false, UPPER),
            "pass 3",
            "no handle through the daemon"
        );
        k.release(1);
        k.release(2);
        assert_eq!(
            k.open(5, Ino(7), false, Some((1, 200))),
            "pass 2",
            "still shared"
        );
        assert_eq!(k.open(6, Ino(8), false, UPPER), "pass 3");
        for fh in 3..=6 {
            k.release(fh);
        }
        assert_eq!(k.backings.lock().inodes_passing_through(), 0);
    }

    #[test]
    fn no_backing_file_or_a_failed_open_goes_through_the_daemon() {
        let k = Kernel::new();
        assert_eq!(k.open(1, Ino(7), false, None), "daemon");
        let failing = |fh, ino| {
            decide(
                &k.backings,
                &k.enabled,
                Fh(fh),
                ino,
                false,
                || Err(FsError::not_found("upper file")),
                |_| Ok(0),
            )
        };
        assert!(matches!(failing(2, Ino(8)), Decision::Daemon));
        // The same failure for an inode that passes through: direct, no mix.
        assert_eq!(k.open(3, Ino(9), false, UPPER), "pass 1");
        assert!(matches!(failing(4, Ino(9)), Decision::DirectIo));
    }

    #[test]
    fn a_failed_registration_turns_passthrough_off_for_the_session() {
        let k = Kernel::new();
        let d = decide(
            &k.backings,
            &k.enabled,
            Fh(1),
            Ino(7),
            false,
            || {
                Ok(Some(Backing {
                    file: k.file.try_clone().unwrap(),
                    key: (1, 100),
                }))
            },
            |_| Err(std::io::Error::from_raw_os_error(libc::EPERM)),
        );
        assert!(matches!(d, Decision::Daemon));
        assert!(!k.enabled.load(Ordering::Relaxed));
        assert_eq!(k.open(2, Ino(8), false, UPPER), "daemon");
        assert_eq!(k.registered.get(), 0);
    }
}
