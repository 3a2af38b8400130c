//! Namespace changes that take a name away: unlink, rmdir and rename.

use std::ffi::OsStr;
use std::fs::{self};

use crate::layout::{whiteout_name, OPAQUE_MARKER};
use crate::layout::{Unreadable, UpperDir};

use super::error::{ErrorKind, FsError, FsResult};
use super::nodes::NodeKind;
use super::overlay::Overlay;
use super::types::FType;
use super::view::{check_name, marker, not_supported, View};

impl View {
    pub(super) fn remove_checks(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<(Option<u64>, Overlay)> {
        let kind = self.nodes.read().kind(parent).cloned();
        match kind {
            Some(NodeKind::Wt { .. }) => {}
            Some(NodeKind::Repo(_)) => {
                return Err(FsError::not_permitted(format!(
                        "{} is a worktree: remove it with rmdir (or `worktreefs reclaim`), not unlink or rename",
                        name.to_string_lossy()
                    ),
                ))
            }
            _ => return Err(not_supported("removing this entry")),
        }
        self.child_state(parent, name)?
            .ok_or_else(|| FsError::not_found(name.to_string_lossy()))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let _m = self.mutate.lock();
        let (_, ov) = self.remove_checks(parent, name)?;
        if ov.ftype == FType::Dir {
            return Err(FsError::is_dir());
        }
        let needs_whiteout = self.base_has(parent, name)?;
        if needs_whiteout {
            self.ensure_upper_dir(parent)?;
        }
        let (_, dir) = self.dir_upper_path(parent)?;
        if needs_whiteout {
            marker(&dir.join(whiteout_name(name)), ov.in_upper)?;
        }
        if ov.in_upper {
            let path = dir.join(name);
            fs::remove_file(&path)
                .map_err(|e| FsError::io(format!("unlink {}", path.display()), e))?;
        }
        self.note_child(parent, name);
        self.nodes.write().detach_name(parent, name);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let parent_kind = self.nodes.read().kind(parent).cloned();
        if let Some(NodeKind::Repo(repo_id)) = parent_kind {
            return self.rmdir_worktree(parent, repo_id, name);
        }
        let _m = self.mutate.lock();
        let (ino, ov) = self.remove_checks(parent, name)?;
        if ov.ftype != FType::Dir {
            return Err(FsError::not_dir());
        }
        // Emptiness in the merged view.
        let (wt, dir) = self.dir_upper_path(parent)?;
        let path = dir.join(name);
        let nonempty = match ino {
            Some(ino) => {
                let t = self.nodes.read();
                !self.merged_listing(&t, ino)?.is_empty()
            }
            None => {
                let upper = if ov.in_upper {
                    UpperDir::read(&path, Unreadable::Skip)
                        .map_err(|e| FsError::io(format!("listing {}", path.display()), e))?
                } else {
                    UpperDir::default()
                };
                let base_has = match self.base_tree_of(&wt, &ov)? {
                    Some(l) => l.entries.iter().any(|e| upper.shows_base(&e.name)),
                    None => false,
                };
                let upper_has = !upper.entries.is_empty();
                upper_has || base_has
            }
        };
        if nonempty {
            return Err(FsError::not_empty(format!(
                "{} is not empty",
                name.to_string_lossy()
            )));
        }
        let needs_whiteout = self.base_has(parent, name)?;
        if needs_whiteout {
            self.ensure_upper_dir(parent)?;
            marker(&dir.join(whiteout_name(name)), ov.in_upper)?;
        }
        if ov.in_upper {
            // Out of the view in one rename, then deleted with its markers.
            let trash = Self::work_tmp(&wt, "trash");
            fs::rename(&path, &trash)
                .map_err(|e| FsError::io(format!("rmdir {}", path.display()), e))?;
            if let Err(e) = fs::remove_dir_all(&trash) {
                tracing::warn!("could not empty {}: {e}", trash.display());
            }
        }
        self.note_child(parent, name);
        self.nodes.write().detach_name(parent, name);
        Ok(())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if flags & (libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0 {
            return Err(FsError::invalid(
                "RENAME_EXCHANGE and RENAME_WHITEOUT are not supported",
            ));
        }
        self.nodes.read().same_domain(parent, newparent, "rename")?;
        check_name(newname)?;
        let _m = self.mutate.lock();
        let (src_ino, src) = self.remove_checks(parent, name)?;
        let dst = self.remove_checks(newparent, newname).ok();
        if parent == newparent && name == newname {
            return Ok(());
        }
        if let Some((dst_ino, d)) = &dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(FsError::exists(format!(
                    "{} exists",
                    newname.to_string_lossy()
                )));
            }
            match (src.ftype == FType::Dir, d.ftype == FType::Dir) {
                (true, false) => {
                    return Err(FsError::new(ErrorKind::NotDir, "target is not a directory"))
                }
                (false, true) => {
                    return Err(FsError::new(ErrorKind::IsDir, "target is a directory"))
                }
                (true, true) => {
                    let ino = match dst_ino {
                        Some(i) => *i,
                        None => self.lookup(newparent, newname)?.attr.ino,
                    };
                    let nonempty = {
                        let t = self.nodes.read();
                        !self.merged_listing(&t, ino)?.is_empty()
                    };
                    if dst_ino.is_none() {
                        self.forget(ino, 1);
                    }
                    if nonempty {
                        return Err(FsError::not_empty("target directory is not empty"));
                    }
                }
                _ => {}
            }
        }
        // The kernel has looked the source up before renaming it; a direct caller may not
        // have, so take a node for the duration of the rename and give it back after.
        let (src_ino, borrowed) = match src_ino {
            Some(i) => (i, false),
            None => (self.lookup(parent, name)?.attr.ino, true),
        };
        let result = self.rename_inner(
            parent,
            name,
            newparent,
            newname,
            src_ino,
            src,
            dst.map(|d| d.1),
        );
        if borrowed {
            self.forget(src_ino, 1);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename_inner(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        src_ino: u64,
        src: Overlay,
        dst: Option<Overlay>,
    ) -> FsResult<()> {
        if src.ftype == FType::Dir {
            self.copy_up_tree(src_ino)?;
        } else {
            self.copy_up(src_ino, true)?;
        }
        self.ensure_upper_dir(newparent)?;
        let (wt, from_dir) = self.dir_upper_path(parent)?;
        let (_, to_dir) = self.dir_upper_path(newparent)?;
        let from = from_dir.join(name);
        let to = to_dir.join(newname);
        if src.ftype == FType::Dir && self.base_has(newparent, newname)? {
            marker(&from.join(OPAQUE_MARKER), true)?;
        }
        if self.base_has(parent, name)? {
            marker(&from_dir.join(whiteout_name(name)), true)?;
        }
        if let Some(d) = dst {
            if d.in_upper && d.ftype == FType::Dir {
                let trash = Self::work_tmp(&wt, "trash");
                fs::rename(&to, &trash)
                    .map_err(|e| FsError::io("moving the replaced directory out", e))?;
                let _ = fs::remove_dir_all(&trash);
            }
        }
        fs::rename(&from, &to).map_err(|e| {
            FsError::io(format!("rename {} to {}", from.display(), to.display()), e)
        })?;
        self.drop_whiteout(newparent, &to_dir, newname);
        self.note_child(parent, name);
        self.note_child(newparent, newname);
        if src.ftype == FType::Dir {
            let rel_of = |p: u64, n: &OsStr| self.nodes.read().child_rel_path(p, n);
            if let (Ok(new_rel), Ok(old_rel)) = (rel_of(newparent, newname), rel_of(parent, name)) {
                self.note_moved_tree(&wt, &to, &new_rel, &old_rel);
            }
        }
        let mut t = self.nodes.write();
        t.move_name(src_ino, parent, name, newparent, newname);
        if let Some(ov) = t.overlay_mut(src_ino) {
            if ov.ftype == FType::Dir && dst.is_some() {
                ov.base = None;
            }
        }
        Ok(())
    }
}
