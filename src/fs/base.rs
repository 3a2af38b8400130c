//! The base layer as the view reads it (git's tree, a warm snapshot, converted files):
//! attributes, listings, sizes and link targets, and a child resolved across the upper
//! layer and the base.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use super::error::{FsError, FsResult};
use super::nodes::NodeKind;
use super::overlay::{BaseRef, Overlay, UpperDir};
use super::types::{Attr, FType, GITFILE_NAME};
use super::view::View;
use super::worktree::WtCtx;
use crate::beneath;
use crate::git::{MODE_EXEC, MODE_LINK, MODE_TREE};
use crate::ino::Ino;
use crate::layout::OPAQUE_MARKER;

impl View {
    /// The attributes of base entry `ino`, at `path()` (asked only in a worktree with
    /// converted files).
    pub(super) fn base_attr(
        &self,
        ino: Ino,
        wt: &WtCtx,
        ov: &Overlay,
        path: impl FnOnce() -> FsResult<Vec<u8>>,
    ) -> FsResult<Attr> {
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("base entry without object"))?;
        let warm_time = |t: (i64, u32)| super::types::systime(t.0, t.1 as i64);
        if let Some(i) = wt.base.inherited(&base) {
            // A snapshot's entry: a file (or symlink) of it, or a directory only it has.
            let t = warm_time(i.mtime);
            let (kind, nlink) = match base.mode {
                crate::git::MODE_TREE => (FType::Dir, 2),
                _ => (ov.ftype, 1),
            };
            return Ok(Attr {
                ino,
                size: i.size,
                blocks: i.size.div_ceil(512),
                atime: t,
                mtime: t,
                ctime: t,
                kind,
                perm: i.perm as u16,
                nlink,
                uid: wt.ident.uid,
                gid: wt.ident.gid,
                rdev: 0,
            });
        }
        let (size, perm, nlink) = match ov.ftype {
            FType::Dir => (4096, 0o755, 2),
            FType::Symlink | FType::File => {
                wt.base.seed_sizes(&self.objects, &self.state.index_cache());
                let converted = match (wt.base.converts(), ov.ftype) {
                    (true, FType::File) => {
                        wt.base
                            .conversion(&path()?, base.oid, wt.ident.uid, wt.ident.gid)
                    }
                    _ => None,
                };
                let size = match converted {
                    Some(c) => self.converted_size(wt, &c, base.oid)?,
                    None => self
                        .objects
                        .blob_size(&wt.base.gitdir, base.oid)
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
            atime: wt.base.mtime,
            mtime: wt.base.mtime,
            ctime: wt.base.mtime,
            kind: ov.ftype,
            perm,
            nlink,
            uid: wt.ident.uid,
            gid: wt.ident.gid,
            rdev: 0,
        })
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
        let base_listing = wt.base.tree_of(&self.objects, dir_ov)?;
        let base_entry = base_listing.as_ref().and_then(|l| l.get(name)).cloned();
        if dir_ov.in_upper {
            if upper.fd.is_none() {
                upper.fd = Some(dir_upper()?);
            }
            let dir = upper.fd.as_ref().expect("just opened");
            match beneath::stat_at(dir.as_fd(), name) {
                Ok(st) if wt.upper.whiteouts.is(&st) => {
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
                        format!("stat {}/{}", wt.ident.name, name.to_string_lossy()),
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
        parent: Ino,
        name: &OsStr,
    ) -> FsResult<Option<(Option<Ino>, Overlay)>> {
        self.child_state_in(parent, name, &mut UpperDir::default())
    }

    /// As `child_state`; `upper` keeps the parent's upper directory if it was opened, and
    /// says whether a whiteout holds the name there.
    pub(super) fn child_state_in(
        &self,
        parent: Ino,
        name: &OsStr,
        upper: &mut UpperDir,
    ) -> FsResult<Option<(Option<Ino>, Overlay)>> {
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

    pub(super) fn base_has(&self, parent: Ino, name: &OsStr) -> FsResult<bool> {
        let (wt, ov) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(parent)?;
            (wt, ov)
        };
        Ok(wt
            .base
            .tree_of(&self.objects, &ov)?
            .map(|l| l.get(name).is_some())
            .unwrap_or(false))
    }
}
