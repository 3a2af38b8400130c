//! Base files a checkout converts (`git::checkout`): their size and content are what
//! `git worktree add` would write, made at the file's first lookup (or, for an LFS
//! pointer, whose size the pointer gives, at its first read) and kept in the blob cache
//! by blob and conversion, shared by every worktree.
//!
//! End of line and `ident` are converted here; filters and encodings by git, run as the
//! worktree's owner (`git::filters`). A filter that fails does what it does to a
//! checkout: a `required` one makes the read fail (EIO, with a log line naming it),
//! another leaves the blob as it is (with a log line). A failure is remembered until the
//! daemon restarts, so a hanging filter costs its timeout once.

use std::fs::File;
use std::io::Write;

use git2::Oid;

use super::base_layer::Converted;
use crate::git::filters::{self, Owner};

use super::error::{FsError, FsResult};
use super::view::View;
use super::worktree::WtCtx;
use crate::ino::Ino;

impl View {
    /// The size of converted base file `c`: the LFS pointer's word, or the converted
    /// content's (made now). A failed conversion gives the blob's own size.
    pub(super) fn converted_size(&self, wt: &WtCtx, c: &Converted, oid: Oid) -> FsResult<u64> {
        if let Some(size) = c.conv.lfs_size {
            return Ok(size);
        }
        if let Some(size) = self.bases.converted_size(c.key) {
            return Ok(size);
        }
        match self.open_converted(wt, c, oid) {
            Ok(f) => {
                let size = f
                    .metadata()
                    .map_err(|e| FsError::io("fstat of converted content", e))?
                    .len();
                self.bases.remember_size(c.key, size);
                Ok(size)
            }
            // The read says why (and fails, for a required filter); the file shows the
            // blob as committed. Kept only for a failure that is remembered (not a full
            // disk, after which the conversion is tried again).
            Err(_) => {
                let size = self
                    .objects
                    .blob_size(&wt.base.gitdir, oid)
                    .map_err(|e| FsError::git(format!("size of blob {oid}"), e))?;
                if self.bases.failed(c.key) {
                    self.bases.remember_size(c.key, size);
                }
                Ok(size)
            }
        }
    }

    /// Makes the size of base file `path` (blob `oid`) of `wt` known, converting it now if
    /// a checkout converts it: called before any lock of the node table is taken, since a
    /// filter may take long and may itself look into the view.
    pub(super) fn prepare_converted(&self, wt: &WtCtx, path: &[u8], oid: Oid) {
        if let Some(c) = wt.base.conversion(path, oid, wt.ident.uid, wt.ident.gid) {
            let _ = self.converted_size(wt, &c, oid);
        }
    }

    /// Makes the converted content of node `ino` (a base file a checkout converts) before
    /// `mutate` is taken for a change that copies it up: the copy-up then finds it made.
    /// A directory's files are not made ahead (a rename of a directory converts under
    /// `mutate`).
    pub(super) fn prepare_content(&self, ino: Ino) {
        let Some((wt, oid, path)) = self.converted_base_file(ino) else {
            return;
        };
        if let Some(c) = wt.base.conversion(&path, oid, wt.ident.uid, wt.ident.gid) {
            let _ = self.open_converted(&wt, &c, oid);
        }
    }

    /// The worktree, blob and path of node `ino` when it is a base file of a worktree
    /// with converted files (none looked for until some worktree has them).
    fn converted_base_file(&self, ino: Ino) -> Option<(std::sync::Arc<WtCtx>, Oid, Vec<u8>)> {
        if !self.bases.any_converts() {
            return None;
        }
        let t = self.nodes.read();
        match t.kind(ino) {
            Some(super::nodes::NodeKind::Wt { wt, ov, .. })
                if wt.base.converts() && !ov.in_upper && ov.ftype == super::types::FType::File =>
            {
                Some((wt.clone(), ov.base?.oid, t.rel_path(ino).ok()?))
            }
            _ => None,
        }
    }

    /// As `prepare_converted`, for node `ino` when it is a converted base file.
    pub(super) fn prepare_node(&self, ino: Ino) {
        let Some((wt, oid, path)) = self.converted_base_file(ino) else {
            return;
        };
        self.prepare_converted(&wt, &path, oid);
    }

    /// The converted content `c` of blob `oid`, opened for reading. A conversion that
    /// failed gives the raw blob, or for a required filter EIO.
    pub(super) fn open_converted(&self, wt: &WtCtx, c: &Converted, oid: Oid) -> FsResult<File> {
        let failed = self.bases.failed(c.key);
        let made = if failed {
            Err(None)
        } else {
            // In memory on a full disk only what is converted here (a blob's size, at most
            // twice over); a program's output could be anything.
            let in_memory = !c.conv.runs_git()
                && self
                    .objects
                    .blob_size(&wt.base.gitdir, oid)
                    .is_ok_and(|s| s <= 32 << 20);
            self.blobs
                .open_converted(c.key, in_memory, &|out| self.convert_into(wt, c, oid, out))
                .map_err(Some)
        };
        let e = match made {
            Ok(f) => return Ok(f),
            Err(e) => e,
        };
        let what = match &c.conv.filter {
            Some(f) => format!("filter '{f}'"),
            None => match &c.conv.encoding {
                Some(enc) => format!("working-tree-encoding {enc}"),
                None => "end-of-line conversion".to_string(),
            },
        };
        let path = String::from_utf8_lossy(&c.path);
        if let Some(e) = &e {
            if crate::git::blobcache::is_out_of_space(e) {
                return Err(FsError::io(
                    format!("converting {}/{path}", wt.ident.name),
                    clone_io(e),
                ));
            }
            // Said once, when it happens (a listing may be what ran it).
            self.bases.remember_failure(c.key);
            if c.conv.required {
                tracing::warn!(
                    "{}/{path}: the required {what} failed ({e}); reads of the file fail (EIO) until it is fixed and the daemon restarts",
                    wt.ident.name
                );
            } else {
                tracing::warn!(
                    "{}/{path}: {what} failed ({e}); the file shows the blob as committed, as a checkout would",
                    wt.ident.name
                );
            }
        }
        if c.conv.required {
            return Err(FsError::eio(
                format!(
                    "{}/{path}: the required {what} failed (see the log line above); fix it, then remount",
                    wt.ident.name
                ),
                std::io::Error::other("conversion failed"),
            ));
        }
        let size = self
            .objects
            .blob_size(&wt.base.gitdir, oid)
            .map_err(|e| FsError::git("blob size", e))?;
        self.blobs
            .open(&wt.base.gitdir, oid, size)
            .map_err(|e| FsError::eio(format!("materializing blob {oid}"), e))
    }

    /// Writes what a checkout writes for `c` to `out`.
    fn convert_into(
        &self,
        wt: &WtCtx,
        c: &Converted,
        oid: Oid,
        mut out: File,
    ) -> std::io::Result<()> {
        self.stats
            .conversions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if c.conv.runs_git() {
            let owner = Owner::of(wt.ident.uid, wt.ident.gid, self.filter_timeout());
            // The filter's processes run on every CPU, not on the one a queue's thread
            // answering this request is pinned to.
            let smudged = crate::fuse::uring::unpinned(|| {
                filters::smudge(&owner, &wt.base.gitdir, wt.base.tree, &c.path, oid, out)
            });
            return smudged.map_err(|e| match e {
                filters::RunError::NoSpace(_) => std::io::Error::from_raw_os_error(libc::ENOSPC),
                e => std::io::Error::other(e.to_string()),
            });
        }
        let blob = crate::git::read_blob(&wt.base.gitdir, oid)
            .map_err(|e| std::io::Error::other(format!("reading blob {oid}: {}", e.message())))?;
        out.write_all(&c.conv.apply(oid, &blob))
    }
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(n) => std::io::Error::from_raw_os_error(n),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}
