//! How an open is answered: through a backing file (passthrough) or the daemon, with
//! its `FOPEN_*` flags.

use std::fs::File;
use std::sync::Arc;

use super::worktree_fs::WorktreeFs;
use crate::fs::passthrough::{self, Decision};
use crate::fs::Fh;
use crate::fuse::abi::{self, fopen};
use crate::fuse::{BackingId, Device};
use crate::ino::Ino;

/// How an open is answered.
pub(super) enum OpenMode {
    Passthrough(Arc<BackingId>),
    /// Through the daemon, with these `FOPEN_*` flags.
    Daemon(u32),
}

impl WorktreeFs {
    /// Decides how the kernel does I/O on handle `fh`. Upper-layer files pass through to
    /// the upper file. Base files are read through the daemon with the kernel's page cache
    /// kept across opens (their content never changes): a base file copied up while open
    /// must show the new content to every handle, and the kernel cannot move an open
    /// inode from one backing file to another. For the same reason an upper file whose
    /// inode still has handles through the daemon (opened before its copy-up) is served
    /// through the daemon too, until they are closed.
    pub(super) fn open_mode(&self, fh: Fh, generated: bool, device: &Arc<Device>) -> OpenMode {
        if generated {
            return OpenMode::Daemon(fopen::DIRECT_IO);
        }
        let Some((ino, on_base)) = self.view.handle_io(fh) else {
            return OpenMode::Daemon(fopen::DIRECT_IO);
        };
        let keep = if on_base { fopen::KEEP_CACHE } else { 0 };
        let decision = passthrough::decide(
            &self.backings,
            &self.passthrough,
            fh,
            Ino(ino.0),
            on_base,
            || self.view.backing_for(fh),
            |f: &File| device.open_backing(f),
        );
        match decision {
            Decision::Passthrough(id) => OpenMode::Passthrough(id),
            Decision::Daemon => OpenMode::Daemon(keep),
            Decision::DirectIo => OpenMode::Daemon(fopen::DIRECT_IO),
        }
    }

    /// The open reply for handle `fh` answered as `mode`.
    pub(super) fn opened(fh: Fh, mode: OpenMode) -> abi::OpenOut {
        match mode {
            OpenMode::Passthrough(id) => abi::OpenOut {
                fh: fh.0,
                open_flags: fopen::PASSTHROUGH,
                backing_id: id.id(),
            },
            OpenMode::Daemon(flags) => abi::OpenOut {
                fh: fh.0,
                open_flags: flags,
                backing_id: 0,
            },
        }
    }
}
