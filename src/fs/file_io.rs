//! Reading and writing through handles: open (a base blob, an upper file, a converted
//! file), read, write, fsync and release, and the paths a handle records.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::control::ControlDir;
use super::error::{FsError, FsResult};
use super::handles::{
    opened, plain_read_write, upper_flags, BaseBlob, HandleKind, MAX_RECORDED_PATHS,
};
use super::nodes::NodeKind;
use super::types::Fh;
use super::types::{Backing, FType};
use super::view::View;
use super::worktree::WtCtx;
use crate::ino::Ino;

impl View {
    /// A handle on the upper file `file`, or (with `blob`) on a base file, opened at its
    /// first read.
    pub(super) fn file_handle(
        &self,
        ino: Ino,
        wt: Option<Arc<WtCtx>>,
        file: Option<File>,
        blob: Option<BaseBlob>,
    ) -> Fh {
        let on_base = blob.is_some();
        if let Some(w) = &wt {
            w.journal.writer_opened(ino);
        }
        self.add_handle(HandleKind::File {
            ino,
            wt,
            noted_epoch: AtomicU64::new(u64::MAX),
            seen_copy_ups: AtomicU64::new(self.handles.copy_up_epoch()),
            read_seen: false.into(),
            file: RwLock::new(file),
            on_base: on_base.into(),
            blob,
        })
    }

    pub(super) fn add_handle(&self, kind: HandleKind) -> Fh {
        self.handles.add(kind)
    }

    pub(super) fn handle(&self, fh: Fh) -> FsResult<Arc<HandleKind>> {
        self.handles
            .get(fh)
            .ok_or_else(|| FsError::bad_handle(format!("file handle {fh} is not open")))
    }

    pub fn release(&self, fh: Fh) {
        let h = self.handles.remove(fh);
        if let Some(HandleKind::File {
            ino, wt: Some(wt), ..
        }) = h.as_deref()
        {
            if wt.journal.writer_closed(*ino) {
                // Written behind the daemon's back (passthrough, mmap): recorded at close.
                self.note_node(*ino);
            }
        }
    }

    /// For an open file handle: its inode and whether it reads the base (the blob cache).
    pub fn handle_io(&self, fh: Fh) -> Option<(Ino, bool)> {
        match &*self.handle(fh).ok()? {
            HandleKind::File { ino, on_base, .. } => Some((*ino, on_base.load(Ordering::Acquire))),
            _ => None,
        }
    }

    /// The file the kernel may read and write directly for handle `fh` (FUSE passthrough):
    /// the cached blob, read-only, for a base file; the upper file, read-write, otherwise.
    /// With it, its identity (device, inode): every passthrough open of one inode must use
    /// the same backing file. None for generated content.
    pub fn backing_for(&self, fh: Fh) -> FsResult<Option<Backing>> {
        let h = self.handle(fh)?;
        let HandleKind::File {
            ino,
            file,
            on_base,
            read_seen,
            blob,
            ..
        } = &*h
        else {
            return Ok(None);
        };
        let backing = if on_base.load(Ordering::Acquire) {
            self.read_file(file, blob.as_ref())?
                .try_clone()
                .map_err(|e| FsError::io("dup of a cached blob", e))?
        } else if let Some(plain) = opened(file).ok().and_then(|f| plain_read_write(&f)) {
            // The handle's own file (a creation's, say) is what the backing needs: a dup
            // spares a path walk.
            plain
        } else {
            self.at_place(*ino, "opening for passthrough", |p| p.open(libc::O_RDWR))?
        };
        let m = backing
            .metadata()
            .map_err(|e| FsError::io("fstat of a backing file", e))?;
        self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
        self.stats.content_reads.fetch_add(1, Ordering::Relaxed);
        if !read_seen.swap(true, Ordering::Relaxed) {
            self.record_content_path(*ino);
        }
        Ok(Some(Backing {
            file: backing,
            key: (m.dev(), m.ino()),
        }))
    }

    /// Opens a file. The flag says the content is generated (`.git`, `.control`): the
    /// kernel must read it directly rather than trust a cached size.
    pub fn open(&self, ino: Ino, flags: i32) -> FsResult<(Fh, bool)> {
        let generated = matches!(self.nodes.read().kind(ino), Some(NodeKind::ControlFile(..)));
        self.open_inner(ino, flags).map(|fh| (fh, generated))
    }

    pub(super) fn open_inner(&self, ino: Ino, flags: i32) -> FsResult<Fh> {
        let kind = self
            .nodes
            .read()
            .get(ino)
            .map(|n| n.kind().clone())
            .ok_or_else(|| FsError::stale(ino))?;
        let acc = flags & libc::O_ACCMODE;
        let writing = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match kind {
            NodeKind::GitFile(wt) => {
                if writing && wt.is_submodule() && acc != libc::O_RDONLY {
                    return Ok(self.add_handle(HandleKind::GitFileWrite(wt)));
                }
                if writing {
                    return Err(FsError::denied(
                        "the worktree's .git file is managed by worktreefs",
                    ));
                }
                Ok(self.add_handle(HandleKind::Memory(wt.ident.gitfile.clone())))
            }
            NodeKind::ControlFile(dir, name) => {
                if writing {
                    return Err(FsError::denied(".control is read-only"));
                }
                let content = if dir == ControlDir::FsMonitor {
                    self.fsmonitor_query(&name)?
                } else {
                    self.control_content(dir, &name)?
                };
                Ok(self.add_handle(HandleKind::Memory(content)))
            }
            NodeKind::Wt { wt, ov, .. } => {
                if ov.ftype == FType::Dir {
                    return Err(FsError::is_dir());
                }
                if writing {
                    // The converted content made before `mutate` is taken (a filter may
                    // take long): the copy-up then finds it in the cache.
                    if !ov.in_upper && flags & libc::O_TRUNC == 0 {
                        if let (true, Some(base)) = (wt.base.converts(), ov.base) {
                            let path = self.nodes.read().rel_path(ino)?;
                            if let Some(c) =
                                wt.base
                                    .conversion(&path, base.oid, wt.ident.uid, wt.ident.gid)
                            {
                                let _ = self.open_converted(&wt, &c, base.oid);
                            }
                        }
                    }
                    let _m = self.lock_changes_of(&wt);
                    self.copy_up(ino, flags & libc::O_TRUNC == 0)?;
                    // Its data kept before the kernel writes past the daemon; a checkpoint
                    // (taken under `mutate`) sees the handle once this returns.
                    self.keep_node_content(ino)?;
                    let file = self.at_place(ino, "open", |p| p.open(upper_flags(flags)))?;
                    self.note_node(ino);
                    return Ok(self.file_handle(ino, Some(wt), Some(file), None));
                }
                if ov.in_upper {
                    let file = self.at_place(ino, "open", |p| p.open(upper_flags(flags)))?;
                    return Ok(self.file_handle(ino, None, Some(file), None));
                }
                let base = ov
                    .base
                    .ok_or_else(|| FsError::internal("file without object"))?;
                // The blob is read at the first READ; a missing object (a partial clone, a
                // pruned one) still fails here, from the size cache the attributes filled.
                let size = wt.base.size(&self.objects, &base)?;
                let converted = match wt.base.converts() {
                    true => {
                        let path = self.nodes.read().rel_path(ino)?;
                        wt.base
                            .conversion(&path, base.oid, wt.ident.uid, wt.ident.gid)
                    }
                    false => None,
                };
                let blob = BaseBlob {
                    wt,
                    oid: base.oid,
                    size,
                    converted,
                };
                Ok(self.file_handle(ino, None, None, Some(blob)))
            }
            _ => Err(FsError::is_dir()),
        }
    }

    pub fn read(&self, fh: Fh, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::Memory(data) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            HandleKind::File {
                ino,
                file,
                on_base,
                read_seen,
                seen_copy_ups,
                blob,
                ..
            } => {
                self.stats.content_reads.fetch_add(1, Ordering::Relaxed);
                if !read_seen.swap(true, Ordering::Relaxed) {
                    self.record_content_path(*ino);
                }
                if on_base.load(Ordering::Acquire) {
                    // Recorded before looking: a copy-up after the look moves the epoch again.
                    let epoch = self.handles.copy_up_epoch();
                    if seen_copy_ups.swap(epoch, Ordering::AcqRel) != epoch {
                        self.follow_copy_up(*ino, file, on_base)?;
                    }
                }
                let mut buf = vec![0u8; size as usize];
                let f = self.read_file(file, blob.as_ref())?;
                let mut done = 0;
                while done < buf.len() {
                    match f.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FsError::io("read", e)),
                    }
                }
                buf.truncate(done);
                Ok(buf)
            }
            HandleKind::GitFileWrite(wt) => {
                let data = &wt.ident.gitfile;
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            HandleKind::Dir(_) => Err(FsError::is_dir()),
        }
    }

    pub(super) fn record_content_path(&self, ino: Ino) {
        if self.stats.content_paths.lock().len() >= MAX_RECORDED_PATHS {
            return;
        }
        // The path first, then the list: the stats file takes the list while its reader
        // holds the node table, so the list is never held while waiting for the table.
        let p = {
            let t = self.nodes.read();
            let Ok((wt, _, _)) = t.wt_of(ino) else {
                return;
            };
            let rel = t.rel_path(ino).unwrap_or_default();
            format!(
                "{}/{}/{}",
                wt.ident.repo,
                wt.ident.name,
                String::from_utf8_lossy(&rel)
            )
        };
        let mut paths = self.stats.content_paths.lock();
        if paths.len() < MAX_RECORDED_PATHS && !paths.contains(&p) {
            paths.push(p);
        }
    }

    /// The file handle `file` reads: for a base file not read yet, the blob `blob`, taken
    /// from (or first put in) the blob cache now.
    pub(super) fn read_file<'a>(
        &self,
        file: &'a RwLock<Option<File>>,
        blob: Option<&BaseBlob>,
    ) -> FsResult<MappedRwLockReadGuard<'a, File>> {
        if let Ok(f) = opened(file) {
            return Ok(f);
        }
        let BaseBlob {
            wt,
            oid,
            size,
            converted,
        } = blob.ok_or_else(|| FsError::bad_handle("handle has no file"))?;
        let mut slot = file.write();
        if slot.is_none() {
            // EIO whatever went wrong (a full disk, say): the errno a read may return.
            // The cache on a full disk: the blob is served from memory instead.
            let file = match converted {
                Some(c) => self.open_converted(wt, c, *oid)?,
                None => self
                    .blobs
                    .open(&wt.base.gitdir, *oid, *size)
                    .map_err(|e| FsError::eio(format!("materializing blob {oid}"), e))?,
            };
            *slot = Some(file);
        }
        RwLockReadGuard::try_map(RwLockWriteGuard::downgrade(slot), Option::as_ref)
            .map_err(|_| FsError::bad_handle("handle has no file"))
    }

    /// A handle opened before its file was copied up reads the upper file from then on, so
    /// every reader sees changes made through the view.
    pub(super) fn follow_copy_up(
        &self,
        ino: Ino,
        file: &RwLock<Option<File>>,
        on_base: &std::sync::atomic::AtomicBool,
    ) -> FsResult<()> {
        let Ok((_, ov, _)) = self.nodes.read().wt_of(ino) else {
            return Ok(());
        };
        if !ov.in_upper {
            return Ok(());
        }
        let f = self.at_place(ino, "open", |p| p.open(libc::O_RDONLY))?;
        *file.write() = Some(f);
        // Release: whoever sees `false` (Acquire) also sees the file just put in.
        on_base.store(false, Ordering::Release);
        Ok(())
    }

    pub fn write(&self, fh: Fh, offset: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::File {
                ino,
                wt,
                noted_epoch,
                file,
                on_base,
                ..
            } if !on_base.load(Ordering::Acquire) => {
                opened(file)?
                    .write_all_at(data, offset)
                    .map_err(|e| FsError::io("write", e))?;
                // After the data, not before: a query that ran before this check either saw
                // this handle's earlier record (and git will stat the file after this write)
                // or bumped the epoch, and then the path is recorded again here.
                if let Some(wt) = wt {
                    let epoch = wt.journal.query_epoch();
                    if noted_epoch.swap(epoch, Ordering::AcqRel) != epoch {
                        self.note_node(*ino);
                    }
                }
                Ok(data.len() as u32)
            }
            HandleKind::GitFileWrite(wt) => {
                if offset == 0 && self.names_own_entry(wt, data) {
                    return Ok(data.len() as u32);
                }
                Err(FsError::not_permitted(format!(
                    "{}/.git names the view's git entry and nothing else (written: {:?})",
                    wt.ident.name,
                    String::from_utf8_lossy(&data[..data.len().min(200)])
                )))
            }
            _ => Err(FsError::bad_handle("handle not open for writing")),
        }
    }

    /// Whether `data`, written as a submodule view's `.git` file (`gitdir: <path>`, the
    /// path relative to the view's root as `git mv` writes it, or absolute), names the
    /// view's own git entry, the one its `.git` names.
    fn names_own_entry(&self, wt: &WtCtx, data: &[u8]) -> bool {
        let Some(named) = std::str::from_utf8(data)
            .ok()
            .and_then(|t| t.strip_prefix("gitdir: "))
            .map(|t| t.trim_end_matches('\n'))
        else {
            return false;
        };
        let Some(own) = std::str::from_utf8(&wt.ident.gitfile)
            .ok()
            .and_then(|t| t.strip_prefix("gitdir: "))
            .map(|t| std::path::PathBuf::from(t.trim_end_matches('\n')))
        else {
            return false;
        };
        let Some(at) = wt.sub_path() else {
            return false;
        };
        let root = self
            .mountpoint
            .join(&wt.ident.repo)
            .join(wt.worktree_name())
            .join(at);
        // By name only: resolving the entry's path would follow what the repository's
        // owner made of it (git writes real paths; the recorded one is the repository's
        // real path, taken at registration).
        lexical(&root.join(named)) == lexical(&own)
    }

    pub fn fsync(&self, fh: Fh, datasync: bool) -> FsResult<()> {
        let h = self.handle(fh)?;
        if let HandleKind::File { file, on_base, .. } = &*h {
            if !on_base.load(Ordering::Acquire) {
                let f = opened(file)?;
                let r = if datasync {
                    f.sync_data()
                } else {
                    f.sync_all()
                };
                r.map_err(|e| FsError::io("fsync", e))?;
            }
        }
        Ok(())
    }
}

/// `path` with `.` and `..` taken out by their names alone (no lookup: the daemon never
/// resolves a path through its own mount).
fn lexical(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
