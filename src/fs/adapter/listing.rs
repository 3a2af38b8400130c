//! Listings as the kernel asks them: with attributes (READDIRPLUS) or without.

use super::abi_out::*;
use super::errors::*;
use super::worktree_fs::WorktreeFs;
use crate::fs::error::FsError;
use crate::fs::Fh;
use crate::fuse::{Answer, DirBuf};
use crate::ino::Ino;

impl WorktreeFs {
    /// A listing's entries from `offset` on: from the handle opendir made, or from the
    /// directory itself when the kernel does without opendir (handle 0).
    pub(super) fn entries_from(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> Result<Vec<(u64, crate::fs::DirEntry)>, FsError> {
        if fh == 0 {
            self.view.readdir_ino(Ino(ino), offset)
        } else {
            self.view.readdir(Fh(fh), offset)
        }
    }

    /// A READDIRPLUS reply: each entry is looked up and counted as a LOOKUP would be, the
    /// one that does not fit is given back.
    pub(super) fn listing_plus(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Answer {
        let entries = match self.entries_from(ino, fh, offset) {
            Ok(entries) => entries,
            Err(e) => return errno("readdirplus", e),
        };
        let mut buf = DirBuf::new(size);
        for (sent, (next, e)) in entries.into_iter().enumerate() {
            let added = if e.name == "." || e.name == ".." {
                // The kernel links neither: it reads only the inode number and type.
                buf.add_plus(&bare_entry(e.ino.0, e.kind), next, dtype(e.kind), &e.name)
            } else {
                // The kernel links every other entry it is given, as if it had looked
                // the name up, and forgets it later: the lookup is done and counted here.
                match self.view.lookup_listed(Ino(ino), &e.name) {
                    Ok(found) => {
                        let added = buf.add_plus(&entry_out(&found), next, dtype(e.kind), &e.name);
                        if !added {
                            // Not sent: the kernel does not know it from this reply.
                            self.view.forget(found.attr.ino, 1);
                        }
                        added
                    }
                    Err(err)
                        if !matches!(err.errno(), libc::ENOENT | libc::ESTALE | libc::EBUSY) =>
                    {
                        // Its attributes cannot be read. Sent without them, the name
                        // would be dropped from `readdir` (inode 0, see below) without a
                        // word: the reply ends before it instead, and the next request
                        // lists it as a plain READDIR (unless names here were looked at
                        // in between: then it fails with the error, for the caller to see).
                        if sent == 0 {
                            return errno("readdirplus", err);
                        }
                        tracing::debug!(
                            op = "readdirplus",
                            errno = err.errno(),
                            "reply ends before {:?}: {}",
                            e.name,
                            err.message
                        );
                        false
                    }
                    Err(err) => {
                        // Listed a moment ago but gone now (removed meanwhile, or a
                        // worktree being deleted, which cannot be entered): sent with
                        // inode 0, which the kernel passes on without linking (and
                        // glibc before 2.37 leaves out).
                        tracing::debug!(
                            op = "readdirplus",
                            errno = err.errno(),
                            "{:?} listed without attributes: {}",
                            e.name,
                            err.message
                        );
                        buf.add_plus(&bare_entry(0, e.kind), next, dtype(e.kind), &e.name)
                    }
                }
            };
            if !added {
                break;
            }
        }
        buf.into_answer()
    }
}
