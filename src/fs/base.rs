//! The base layer as the view reads it (git's tree, a warm snapshot, converted files):
//! attributes, listings, sizes and link targets, and a child resolved across the upper
//! layer and the base.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::{FsError, FsResult};
use super::nodes::NodeKind;
use super::overlay::{BaseRef, Overlay, UpperDir, WtCtx};
use super::types::{Attr, FType, GITFILE_NAME};
use super::view::View;
use crate::beneath;
use crate::git::{self, MODE_EXEC, MODE_LINK, MODE_TREE};
use crate::layout::OPAQUE_MARKER;

impl View {
    /// The attributes of base entry `ino`, at `path()` (asked only in a worktree with
    /// converted files).
    pub(super) fn base_attr(
        &self,
        ino: u64,
        wt: &WtCtx,
        ov: &Overlay,
        path: impl FnOnce() -> FsResult<Vec<u8>>,
    ) -> FsResult<Attr> {
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("base entry without object"))?;
        let warm_time = |t: (i64, u32)| super::types::systime(t.0, t.1 as i64);
        if let Some(f) = self.warm_file(wt, &base) {
            let (size, perm) = match wt.warm.as_ref().and_then(|s| s.link(f)) {
                Some(l) => (l.len() as u64, 0o777),
                None => (f.size, f.perm as u16),
            };
            let t = warm_time(f.mtime);
            return Ok(Attr {
                ino,
                size,
                blocks: size.div_ceil(512),
                atime: t,
                mtime: t,
                ctime: t,
                kind: ov.ftype,
                perm,
                nlink: 1,
                uid: wt.uid,
                gid: wt.gid,
                rdev: 0,
            });
        }
        if let Some(d) = self.warm_dir(wt, &base) {
            let t = warm_time(d.mtime);
            return Ok(Attr {
                ino,
                size: 4096,
                blocks: 8,
                atime: t,
                mtime: t,
                ctime: t,
                kind: FType::Dir,
                perm: d.perm as u16,
                nlink: 2,
                uid: wt.uid,
                gid: wt.gid,
                rdev: 0,
            });
        }
        let (size, perm, nlink) = match ov.ftype {
            FType::Dir => (4096, 0o755, 2),
            FType::Symlink | FType::File => {
                if !wt.sizes_seeded.swap(true, Ordering::Relaxed) {
                    self.objects
                        .seed_sizes_from_index_cache(&self.state.index_cache(), wt.base_tree);
                }
                let converted = match (&wt.conversions, ov.ftype) {
                    (Some(_), FType::File) => self.conversion(wt, &path()?, base.oid),
                    _ => None,
                };
                let size = match converted {
                    Some(c) => self.converted_size(wt, &c, base.oid)?,
                    None => self
                        .objects
                        .blob_size(&wt.gitdir, base.oid)
                        .map_err(|e| FsError::git(format!("size of blob {}", base.oid), e))?,
                };
                let perm = match base.mode {
                    MODE_EXEC => 0o755,
                    MODE_LINK => 0o777,
                    _ => 0o644,
                };
                (size, perm, 1)
            }
            _ => (0, 0o644, 1),
        };
        Ok(Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: wt.base_mtime,
            mtime: wt.base_mtime,
            ctime: wt.base_mtime,
            kind: ov.ftype,
            perm,
            nlink,
            uid: wt.uid,
            gid: wt.gid,
            rdev: 0,
        })
    }

    pub(super) fn base_tree_of(
        &self,
        wt: &WtCtx,
        ov: &Overlay,
    ) -> FsResult<Option<Arc<git::TreeListing>>> {
        match ov.base {
            Some(b) if b.mode == MODE_TREE && ov.ftype == FType::Dir => {
                self.listing_of(wt, b).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The listing of base directory `b`: its tree's, with the warm snapshot's directory
    /// merged where it has one.
    pub(super) fn listing_of(&self, wt: &WtCtx, b: BaseRef) -> FsResult<Arc<git::TreeListing>> {
        let tree = if b.oid == git::warm::no_tree() {
            None
        } else {
            Some(
                self.objects
                    .tree(&wt.gitdir, b.oid)
                    .map_err(|e| FsError::git(format!("reading tree {}", b.oid), e))?,
            )
        };
        match (&wt.warm, b.warm, tree) {
            (Some(snap), w, tree) if w != 0 => Ok(snap.merged(b.oid, tree.as_deref(), w)),
            (_, _, Some(tree)) => Ok(tree),
            _ => Err(FsError::internal(
                "a directory with neither tree nor snapshot",
            )),
        }
    }

    /// The warm snapshot's file behind base entry `b`, if it is one.
    pub(super) fn warm_file<'a>(
        &self,
        wt: &'a WtCtx,
        b: &BaseRef,
    ) -> Option<&'a crate::git::warm::File> {
        match (&wt.warm, b.mode) {
            (_, MODE_TREE) => None,
            (Some(s), _) => s.file(b.warm),
            (None, _) => None,
        }
    }

    /// The target of the warm snapshot's symlink behind base entry `b`, if it is one.
    pub(super) fn warm_link<'a>(&self, wt: &'a WtCtx, b: &BaseRef) -> Option<&'a [u8]> {
        let f = self.warm_file(wt, b)?;
        wt.warm.as_ref()?.link(f)
    }

    /// The size of base file `b`: the warm snapshot's record, else the object's (its
    /// content is in the blob cache, not always in the repository).
    pub(super) fn base_size(&self, wt: &WtCtx, b: &BaseRef) -> FsResult<u64> {
        if let Some(f) = self.warm_file(wt, b) {
            return Ok(f.size);
        }
        self.objects
            .blob_size(&wt.gitdir, b.oid)
            .map_err(|e| FsError::git("blob size", e))
    }

    /// The warm snapshot's directory behind base directory `b` when only the snapshot has
    /// it (a tracked directory keeps a checkout's attributes).
    pub(super) fn warm_dir<'a>(
        &self,
        wt: &'a WtCtx,
        b: &BaseRef,
    ) -> Option<&'a crate::git::warm::Dir> {
        match &wt.warm {
            Some(s) if b.mode == MODE_TREE && b.oid == git::warm::no_tree() => s.dir(b.warm),
            _ => None,
        }
    }

    /// A base symlink's target.
    pub(super) fn link_target(&self, wt: &WtCtx, b: &BaseRef) -> FsResult<Vec<u8>> {
        if let Some(link) = self.warm_link(wt, b) {
            return Ok(link.to_vec());
        }
        git::read_blob(&wt.gitdir, b.oid).map_err(|e| FsError::git("reading symlink target", e))
    }

    /// What the name `name` in worktree directory `dir` is, from the layers on disk.
    /// `dir_upper` gives the directory's upper directory, asked only when the directory is
    /// in the upper layer (most lookups are in base-only directories).
    /// `dir` keeps the upper directory once opened, for a caller that goes on in it.
    pub(super) fn resolve_child(
        &self,
        wt: &WtCtx,
        dir_ov: &Overlay,
        upper: &mut UpperDir,
        dir_upper: impl FnOnce() -> FsResult<OwnedFd>,
        name: &OsStr,
    ) -> FsResult<Option<Overlay>> {
        let base_listing = self.base_tree_of(wt, dir_ov)?;
        let base_entry = base_listing.as_ref().and_then(|l| l.get(name)).cloned();
        if dir_ov.in_upper {
            if upper.fd.is_none() {
                upper.fd = Some(dir_upper()?);
            }
            let dir = upper.fd.as_ref().expect("just opened");
            match beneath::stat_at(dir.as_fd(), name) {
                Ok(st) if wt.whiteouts.is(&st) => {
                    upper.whiteout_at_name = true;
                    return Ok(None);
                }
                Ok(st) => {
                    let ftype = FType::from_mode(st.st_mode);
                    let base = match &base_entry {
                        Some(e)
                            if ftype == FType::Dir
                                && e.mode == MODE_TREE
                                && !self.is_opaque(dir.as_fd(), name) =>
                        {
                            Some(BaseRef::of(e))
                        }
                        _ => None,
                    };
                    return Ok(Some(Overlay {
                        ftype,
                        base,
                        in_upper: true,
                        upper_ino: st.st_ino,
                    }));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(FsError::io(
                        format!("stat {}/{}", wt.name, name.to_string_lossy()),
                        e,
                    ))
                }
            }
        }
        Ok(base_entry.map(|e| Overlay {
            ftype: FType::from_git_mode(e.mode),
            base: Some(BaseRef::of(&e)),
            in_upper: false,
            upper_ino: 0,
        }))
    }

    /// Whether the upper directory `name` of `dir` is opaque (holds the opaque marker).
    pub(super) fn is_opaque(&self, dir: std::os::fd::BorrowedFd, name: &OsStr) -> bool {
        beneath::dir(dir, std::os::unix::ffi::OsStrExt::as_bytes(name))
            .and_then(|d| beneath::stat_at(d.as_fd(), OsStr::new(OPAQUE_MARKER)))
            .is_ok()
    }

    /// The overlay entry currently at `(parent, name)`, from the table or from disk.
    pub(super) fn child_state(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<Option<(Option<u64>, Overlay)>> {
        self.child_state_in(parent, name, &mut UpperDir::default())
    }

    /// As `child_state`; `upper` keeps the parent's upper directory if it was opened, and
    /// says whether a whiteout holds the name there.
    pub(super) fn child_state_in(
        &self,
        parent: u64,
        name: &OsStr,
        upper: &mut UpperDir,
    ) -> FsResult<Option<(Option<u64>, Overlay)>> {
        let t = self.nodes.read();
        if let Some(ino) = t.child(parent, name) {
            if let Some(NodeKind::Wt { ov, .. }) = t.kind(ino) {
                return Ok(Some((Some(ino), *ov)));
            }
            if let Some(NodeKind::GitFile(_)) = t.kind(ino) {
                return Err(FsError::not_permitted(
                    "the worktree's .git file is managed by worktreefs",
                ));
            }
        }
        let (wt, ov, is_root) = t.wt_of(parent)?;
        if is_root && name == GITFILE_NAME {
            return Err(FsError::not_permitted(
                "the worktree's .git file is managed by worktreefs",
            ));
        }
        drop(t);
        let dir_upper = || self.upper_dir(parent);
        Ok(self
            .resolve_child(&wt, &ov, upper, dir_upper, name)?
            .map(|o| (None, o)))
    }

    pub(super) fn base_has(&self, parent: u64, name: &OsStr) -> FsResult<bool> {
        let (wt, ov) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(parent)?;
            (wt, ov)
        };
        Ok(self
            .base_tree_of(&wt, &ov)?
            .map(|l| l.get(name).is_some())
            .unwrap_or(false))
    }
}
