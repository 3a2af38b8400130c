//! Reading the source checkout as the user who asks: a thread that holds that user's
//! file-system identity, and a path looked at through no symlink.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc;

use crate::beneath::{self, Stat};
use crate::git::filters::Owner;
use crate::lifecycle::error::LifecycleResult;

/// Runs closures on a thread whose file-system identity is one user's.
pub(super) struct AsUser {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl AsUser {
    pub(super) fn start(owner: &Owner) -> LifecycleResult<AsUser> {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let (uid, gid, groups) = (owner.uid, owner.gid, owner.groups.clone());
        std::thread::Builder::new()
            .name("warm-as-user".into())
            .spawn(move || {
                let became = crate::git::owner::become_identity(uid, gid, &groups)
                    || nix::unistd::geteuid().as_raw() != 0;
                let _ = ready_tx.send(became);
                if became {
                    for job in rx {
                        job();
                    }
                }
            })?;
        if !ready.recv().unwrap_or(false) {
            return Err(crate::lifecycle::error::failed(format!(
                "could not take the identity {uid}:{gid} to read the source checkout"
            )));
        }
        Ok(AsUser { jobs })
    }

    pub(super) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> LifecycleResult<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| crate::lifecycle::error::failed("the reading thread ended"))?;
        rx.recv()
            .map_err(|_| crate::lifecycle::error::failed("the reading thread ended"))
    }
}

/// What a path of the checkout is, as the user sees it.
pub(super) enum Found {
    /// A regular file, opened when asked.
    File(Option<fs::File>, Stat),
    Link(Vec<u8>, Stat),
    Dir(Stat),
    /// Not taken: why.
    Skip(String),
}

/// What `rel` below `root` is, reached through no symlink; a regular file is opened
/// (for reading, never blocking) only when `open` asks.
pub(super) fn look(root: BorrowedFd, rel: &[u8], open: bool) -> Found {
    let reason = |e: io::Error| match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => "not readable by the user who asked".to_string(),
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            "below a symbolic link (never followed)".to_string()
        }
        Some(libc::ENOENT) => "gone while the snapshot was taken".to_string(),
        _ => e.to_string(),
    };
    let fd = match beneath::open(root, rel, libc::O_PATH, 0) {
        Ok(fd) => fd,
        Err(e) => return Found::Skip(reason(e)),
    };
    let st = match beneath::fstat(fd.as_fd()) {
        Ok(st) => st,
        Err(e) => return Found::Skip(reason(e)),
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG if open => {
            match beneath::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_NONBLOCK) {
                Ok(f) => Found::File(Some(f), st),
                Err(e) => Found::Skip(reason(e)),
            }
        }
        libc::S_IFREG => Found::File(None, st),
        libc::S_IFLNK => match beneath::readlink(fd.as_fd()) {
            Ok(t) => Found::Link(t, st),
            Err(e) => Found::Skip(reason(e)),
        },
        libc::S_IFDIR => Found::Dir(st),
        _ => Found::Skip("not a regular file, directory or symbolic link (never opened)".into()),
    }
}
