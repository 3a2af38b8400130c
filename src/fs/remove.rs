//! Namespace changes that take a name away: unlink, rmdir and rename.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::beneath;
use crate::layout::{UpperDir, OPAQUE_MARKER};

use super::error::{ErrorKind, FsError, FsResult};
use super::inodes::join_rel;
use super::nodes::NodeKind;
use super::overlay::Overlay;
use super::place::Fd;
use super::types::FType;
use super::view::{check_name, marker, not_supported, View};
use super::worktree::WtCtx;
use crate::ino::Ino;

impl View {
    pub(super) fn remove_checks(
        &self,
        parent: Ino,
        name: &OsStr,
    ) -> FsResult<(Option<Ino>, Overlay)> {
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

    /// A directory or a submodule's view with views of a submodule's own submodules made
    /// below it does not move: EXDEV, as overlayfs answers for a merged directory (`mv`
    /// then copies and removes, which a view allows); their records are keyed by paths
    /// through it. Views of the worktree's own submodules move with a directory above
    /// them ([`View::move_views_below`]), and a view's root moves itself
    /// (`rename_submodule`).
    fn refuse_moving_submodules(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let (wt, rel) = {
            let t = self.nodes.read();
            let (wt, _, _) = t.wt_of(parent)?;
            if !wt.nested.shown {
                return Ok(());
            }
            (wt, t.child_rel_path(parent, name)?)
        };
        let mut prefix = self.full_sub_path(&wt, &rel);
        prefix.push(b'/');
        let nested =
            crate::layout::submodules::readable_records(&self.state.worktree_dir(wt.ident.id))
                .into_iter()
                .any(|(_, r)| {
                    !r.removed && r.within.is_some() && r.path.as_bytes().starts_with(&prefix)
                });
        if nested {
            return Err(FsError::cross_device(format!(
                "{}/{} holds views of a submodule's own submodules, which do not move with it (mv copies it instead)",
                wt.ident.name,
                String::from_utf8_lossy(&rel)
            )));
        }
        Ok(())
    }

    /// The path in the worktree of `rel` in view `wt` (a submodule view's paths are
    /// below its own).
    fn full_sub_path(&self, wt: &WtCtx, rel: &[u8]) -> Vec<u8> {
        crate::layout::submodules::full_path(
            wt.sub_path().as_deref(),
            &String::from_utf8_lossy(rel),
        )
        .into_bytes()
    }

    /// After the directory at `old` in the worktree's view `wt` moved to `new`: the views
    /// of submodules below it (their stubs moved with it) are found at their new paths,
    /// their records and git entries say so. A record or entry that cannot be changed is
    /// only logged: its view's next lookup tries again (its stub says where it is).
    pub(super) fn move_views_below(&self, wt: &WtCtx, old: &[u8], new: &[u8]) {
        if !wt.nested.shown || wt.is_submodule() {
            return;
        }
        let mut prefix = old.to_vec();
        prefix.push(b'/');
        let moved = |p: &[u8]| -> Option<Vec<u8>> {
            let rest = p.strip_prefix(prefix.as_slice())?;
            let mut n = new.to_vec();
            n.push(b'/');
            n.extend_from_slice(rest);
            Some(n)
        };
        // In memory first (lookups meanwhile find the views at their new paths), then on
        // disk; one step for a view being made (see `moving`).
        let _moving = wt.nested.moving.lock();
        let mut subs = wt.nested.views.lock();
        let paths: Vec<Vec<u8>> = subs
            .keys()
            .filter(|p| moved(p).is_some())
            .cloned()
            .collect();
        for p in paths {
            if let (Some(to), Some(ctx)) = (moved(&p), subs.remove(&p)) {
                if let Some(of) = &ctx.nested.of {
                    *of.path.lock() = to.clone();
                }
                subs.insert(to, ctx);
            }
        }
        drop(subs);
        let place = format!("{}/{}", wt.ident.repo, wt.worktree_name());
        for (dir, r) in
            crate::layout::submodules::readable_records(&self.state.worktree_dir(wt.ident.id))
        {
            let Some(to) = moved(r.path.as_bytes()) else {
                continue;
            };
            let to = String::from_utf8_lossy(&to).into_owned();
            let from = r.path.clone();
            if let Err(e) = crate::lifecycle::submodules::move_view(
                &self.state,
                &self.mountpoint,
                &place,
                wt.ident.uid,
                &dir,
                r,
                &to,
            ) {
                tracing::warn!("submodule view {from} (moved to {to}): {e:#}");
            }
        }
    }

    /// The submodule view whose root is node `ino`, if it is one.
    fn sub_root(&self, ino: Ino) -> Option<std::sync::Arc<WtCtx>> {
        match self.nodes.read().kind(ino) {
            Some(NodeKind::Wt {
                wt, is_root: true, ..
            }) if wt.is_submodule() => Some(wt.clone()),
            _ => None,
        }
    }

    /// `unlink <submodule>/.git`: the first step of `git rm` and `git submodule deinit`
    /// (they remove the directory's contents, then it). A whiteout in the view's upper
    /// root says so; the git entry it named stays until the worktree goes.
    fn unlink_sub_gitfile(&self, root: Ino, sub: &WtCtx) -> FsResult<()> {
        if sub.gitfile_removed() {
            return Err(FsError::not_found(format!("{}/.git", sub.ident.name)));
        }
        let name = OsStr::new(super::types::GITFILE_NAME);
        sub.upper
            .whiteouts
            .link(sub.upper.work_fd.as_fd(), sub.upper.fd.as_fd(), name)
            .map_err(|e| FsError::io(format!("unlink {}/.git", sub.ident.name), e))?;
        sub.record_change(b".git");
        self.nodes.write().detach_keeping(root, name, None);
        tracing::info!("submodule {}: its .git file removed", sub.ident.name);
        Ok(())
    }

    /// `rmdir` of a submodule view's root, once empty (its `.git` file too): the
    /// superproject's path goes, as in a checkout; the record says so first, so the view
    /// is not made again and cleanup counts no deleted file of it as work (its commits
    /// still are).
    fn rmdir_submodule(&self, parent: Ino, name: &OsStr, root: Ino, sub: &WtCtx) -> FsResult<()> {
        let nonempty = {
            let t = self.nodes.read();
            !self.merged_listing(&t, root)?.is_empty()
        };
        if nonempty {
            return Err(FsError::not_empty(format!(
                "{} is not empty",
                sub.ident.name
            )));
        }
        let Some((owner, path)) = sub
            .nested
            .of
            .as_ref()
            .and_then(|of| Some((of.parent.upgrade()?, of.path())))
        else {
            return Err(FsError::stale(root));
        };
        let Some(full) = sub.sub_origin() else {
            return Err(FsError::stale(root));
        };
        // What can fail on the superproject's side first; then the record, then the
        // whiteout (a failure there takes the record back: the view stays).
        self.ensure_upper_dir(parent)?;
        let dir = self.upper_dir(parent)?;
        let hide = self.base_has(parent, name)?;
        let stub = self.stub_at(dir.as_fd(), name).is_some();
        let record = |removed: bool| {
            crate::lifecycle::submodules::mark_removed(
                &self.state,
                owner.ident.id,
                full.as_bytes(),
                removed,
            )
            .map_err(|e| {
                FsError::eio(
                    format!("submodule {}: {e:#}", sub.ident.name),
                    std::io::Error::other("submodule record"),
                )
            })
        };
        self.keep_child_tree(parent, name)?;
        record(true)?;
        let work = owner.upper.work_fd.as_fd();
        let gone = match (stub, hide) {
            // Moved here: its stub goes (exchanged with a whiteout when the base has the
            // name too).
            (true, true) => {
                let tmp = Self::work_tmp("trash");
                let r = owner
                    .upper
                    .whiteouts
                    .replace(work, dir.as_fd(), name, &tmp, true);
                if r.is_ok() {
                    let _ = beneath::remove_tree(work, &tmp);
                }
                Some(r)
            }
            (true, false) => Some(self.to_trash(&owner, dir.as_fd(), name)),
            (false, true) => Some(owner.upper.whiteouts.link(work, dir.as_fd(), name)),
            (false, false) => None,
        };
        if let Some(Err(e)) = gone {
            if let Err(back) = record(false) {
                tracing::warn!("{back}");
            }
            return Err(FsError::io(format!("rmdir {}", sub.ident.name), e));
        }
        owner.nested.views.lock().remove(&path);
        self.note_child(parent, name);
        self.nodes.write().detach_keeping(parent, name, None);
        tracing::info!("submodule {}: its directory removed", sub.ident.name);
        Ok(())
    }

    /// The file at `(parent, name)` held open, when removing the name takes the last name
    /// of a node the kernel knows: the node keeps it (the deleted-but-open set). Callers
    /// hold `mutate`. An error (no descriptor left, say) fails the removal: the file must
    /// not lose its name while it cannot be kept.
    pub(super) fn keep(&self, parent: Ino, name: &OsStr) -> FsResult<Option<(Ino, OwnedFd)>> {
        let ino = {
            let t = self.nodes.read();
            let Some(ino) = t.child(parent, name) else {
                return Ok(None);
            };
            let Ok((_, ov, _)) = t.wt_of(ino) else {
                return Ok(None);
            };
            if !(ov.in_upper && t.is_last_name(ino, parent, name)) {
                return Ok(None);
            }
            ino
        };
        match self.place(ino)?.fd() {
            Ok(Fd::Owned(fd)) => Ok(Some((ino, fd))),
            Ok(Fd::Borrowed(_)) => Ok(None),
            Err(e) => Err(FsError::io(
                format!("keeping inode {ino} open past its last name"),
                e,
            )),
        }
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let _m = self.lock_changes(parent);
        if name == super::types::GITFILE_NAME {
            if let Some(sub) = self.sub_root(parent) {
                return self.unlink_sub_gitfile(parent, &sub);
            }
        }
        let (_, ov) = self.remove_checks(parent, name)?;
        if ov.ftype == FType::Dir {
            return Err(FsError::is_dir());
        }
        self.ensure_upper_dir(parent)?;
        let dir = self.upper_dir(parent)?;
        let kept = self.keep(parent, name)?;
        self.keep_child(parent, name)?;
        let wt = self.nodes.read().wt_of(parent)?.0;
        let work = wt.upper.work_fd.as_fd();
        let gone = match (self.base_has(parent, name)?, ov.in_upper) {
            (true, true) => {
                let tmp = Self::work_tmp("whiteout");
                wt.upper
                    .whiteouts
                    .replace(work, dir.as_fd(), name, &tmp, false)
            }
            (true, false) => wt.upper.whiteouts.link(work, dir.as_fd(), name),
            (false, _) => beneath::unlink_at(dir.as_fd(), name, false),
        };
        gone.map_err(|e| FsError::io(format!("unlink {}", name.to_string_lossy()), e))?;
        self.note_child(parent, name);
        self.nodes.write().detach_keeping(parent, name, kept);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let parent_kind = self.nodes.read().kind(parent).cloned();
        if let Some(NodeKind::Repo(repo_id)) = parent_kind {
            return self.rmdir_worktree(parent, repo_id, name);
        }
        let _m = self.lock_changes(parent);
        let (ino, ov) = self.remove_checks(parent, name)?;
        if ov.ftype != FType::Dir {
            return Err(FsError::not_dir());
        }
        if let Some((root, sub)) = ino.and_then(|i| Some((i, self.sub_root(i)?))) {
            return self.rmdir_submodule(parent, name, root, &sub);
        }
        // Emptiness in the merged view.
        let wt = self.nodes.read().wt_of(parent)?.0;
        let nonempty = match ino {
            Some(ino) => {
                let t = self.nodes.read();
                !self.merged_listing(&t, ino)?.is_empty()
            }
            None => {
                let upper = if ov.in_upper {
                    let dir = self.upper_dir(parent)?;
                    beneath::dir(dir.as_fd(), name.as_bytes())
                        .and_then(|d| UpperDir::read(d.as_fd(), &wt.upper.whiteouts))
                        .map_err(|e| {
                            FsError::io(format!("listing {}", name.to_string_lossy()), e)
                        })?
                } else {
                    UpperDir::default()
                };
                let base_has = match wt.base.tree_of(&self.objects, &ov)? {
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
        self.ensure_upper_dir(parent)?;
        let dir = self.upper_dir(parent)?;
        let kept = self.keep(parent, name)?;
        self.keep_child_tree(parent, name)?;
        let work = wt.upper.work_fd.as_fd();
        let gone = match (self.base_has(parent, name)?, ov.in_upper) {
            (true, true) => {
                // Exchanged with a whiteout in one rename, then deleted out of the view.
                let tmp = Self::work_tmp("trash");
                let r = wt
                    .upper
                    .whiteouts
                    .replace(work, dir.as_fd(), name, &tmp, true);
                if r.is_ok() {
                    if let Err(e) = beneath::remove_tree(work, &tmp) {
                        tracing::warn!(
                            "could not empty {}/{}: {e}",
                            wt.upper.work.display(),
                            tmp.to_string_lossy()
                        );
                    }
                }
                r
            }
            (true, false) => wt.upper.whiteouts.link(work, dir.as_fd(), name),
            (false, _) => self.to_trash(&wt, dir.as_fd(), name),
        };
        gone.map_err(|e| FsError::io(format!("rmdir {}", name.to_string_lossy()), e))?;
        self.note_child(parent, name);
        self.nodes.write().detach_keeping(parent, name, kept);
        Ok(())
    }

    /// Takes the directory `name` of `dir` out of the view in one rename, then deletes it
    /// with its markers (a failure to delete is only logged: it is out of the view).
    pub(super) fn to_trash(
        &self,
        wt: &WtCtx,
        dir: BorrowedFd,
        name: &OsStr,
    ) -> std::io::Result<()> {
        let trash = Self::work_tmp("trash");
        let work = wt.upper.work_fd.as_fd();
        beneath::rename_at(dir, name, work, &trash, 0)?;
        if let Err(e) = beneath::remove_tree(work, &trash) {
            tracing::warn!(
                "could not empty {}/{}: {e}",
                wt.upper.work.display(),
                trash.to_string_lossy()
            );
        }
        Ok(())
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
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
        if self.bases.any_converts() {
            let known = self.nodes.read().child(parent, name);
            if let Some(ino) = known {
                self.prepare_content(ino);
            }
        }
        let _m = self.lock_changes(parent);
        let (src_ino, src) = self.remove_checks(parent, name)?;
        let src_sub = src_ino.and_then(|i| Some((i, self.sub_root(i)?)));
        if src.ftype == FType::Dir {
            self.refuse_moving_submodules(parent, name)?;
        }
        if let Ok((Some(ino), _)) = self.remove_checks(newparent, newname) {
            if let Some(sub) = self.sub_root(ino) {
                return Err(FsError::cross_device(format!(
                    "{} is a submodule's view: nothing replaces it by a rename",
                    sub.ident.name
                )));
            }
        }
        // Nothing there is the usual case; a name that may not be replaced (the worktree's
        // .git) refuses the rename.
        let dst = match self.remove_checks(newparent, newname) {
            Ok(d) => Some(d),
            Err(e) if e.errno() == libc::ENOENT => None,
            Err(e) => return Err(e),
        };
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
        if let Some((root, sub)) = src_sub {
            // The superproject's names it changes: the two places, and the markers a stub
            // made at the new one holds.
            self.keep_move(parent, name, newparent, newname)?;
            for marker in [crate::layout::SUBMODULE_MARKER, OPAQUE_MARKER] {
                if let Some((wt, rel)) = self.keeping_child(newparent, newname)? {
                    super::keep::keep_path(&wt, &join_rel(&rel, marker.as_bytes()))?;
                }
            }
            return self.rename_submodule(
                parent,
                name,
                newparent,
                newname,
                root,
                &sub,
                dst.map(|d| d.1),
            );
        }
        // The kernel has looked the source up before renaming it; a direct caller may not
        // have, so take a node for the duration of the rename and give it back after.
        let (src_ino, borrowed) = match src_ino {
            Some(i) => (i, false),
            None => (self.lookup(parent, name)?.attr.ino, true),
        };
        // Paths of the views of submodules below a moving directory.
        let paths = if src.ftype == FType::Dir {
            let t = self.nodes.read();
            match (
                t.wt_of(parent),
                t.child_rel_path(parent, name),
                t.child_rel_path(newparent, newname),
            ) {
                (Ok((wt, _, _)), Ok(old), Ok(new)) if wt.nested.shown => Some((wt, old, new)),
                _ => None,
            }
        } else {
            None
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
        if let (Ok(()), Some((wt, old, new))) = (&result, paths) {
            self.move_views_below(&wt, &old, &new);
        }
        if borrowed {
            self.forget(src_ino, 1);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename_inner(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        src_ino: Ino,
        src: Overlay,
        dst: Option<Overlay>,
    ) -> FsResult<()> {
        if src.ftype == FType::Dir {
            self.copy_up_tree(src_ino)?;
        } else {
            self.copy_up(src_ino, true)?;
        }
        self.ensure_upper_dir(newparent)?;
        let wt = self.nodes.read().wt_of(parent)?.0;
        let from_dir = self.upper_dir(parent)?;
        let to_dir = self.upper_dir(newparent)?;
        let (from_dir, to_dir) = (from_dir.as_fd(), to_dir.as_fd());
        let opaque = src.ftype == FType::Dir && self.base_has(newparent, newname)?;
        if opaque && wt.keeping().is_some() {
            // The marker is a name made in the directory before it moves.
            let rel = self.nodes.read().child_rel_path(parent, name)?;
            super::keep::keep_path(&wt, &join_rel(&rel, OPAQUE_MARKER.as_bytes()))?;
        }
        if opaque {
            let d = beneath::dir(from_dir, name.as_bytes())
                .map_err(|e| FsError::io(format!("opening {}", name.to_string_lossy()), e))?;
            marker(d.as_fd(), OsStr::new(OPAQUE_MARKER), true)?;
        }
        self.keep_move(parent, name, newparent, newname)?;
        let kept = match dst {
            Some(d) if d.in_upper => self.keep(newparent, newname)?,
            _ => None,
        };
        if let Some(d) = dst {
            if d.in_upper && d.ftype == FType::Dir {
                self.to_trash(&wt, to_dir, newname)
                    .map_err(|e| FsError::io("moving the replaced directory out", e))?;
            }
        }
        let moved = |e| {
            FsError::io(
                format!(
                    "rename {} to {}",
                    name.to_string_lossy(),
                    newname.to_string_lossy()
                ),
                e,
            )
        };
        let work = wt.upper.work_fd.as_fd();
        let source_hidden = self.base_has(parent, name)?;
        let onto_whiteout = dst.is_none() && wt.upper.whiteouts.at(to_dir, newname);
        if src.ftype == FType::Dir && onto_whiteout {
            // A directory cannot replace a file: exchanged with the whiteout, which then
            // hides the base entry at the old name, or goes.
            match beneath::rename_at(from_dir, name, to_dir, newname, libc::RENAME_EXCHANGE) {
                Ok(()) if source_hidden => {}
                Ok(()) => beneath::unlink_at(from_dir, name, false).map_err(moved)?,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    beneath::unlink_at(to_dir, newname, false).map_err(moved)?;
                    beneath::rename_at(from_dir, name, to_dir, newname, 0).map_err(moved)?;
                    if source_hidden {
                        wt.upper
                            .whiteouts
                            .link(work, from_dir, name)
                            .map_err(moved)?;
                    }
                }
                Err(e) => return Err(moved(e)),
            }
        } else {
            beneath::rename_at(from_dir, name, to_dir, newname, 0).map_err(moved)?;
            // After the move, not before: a crash between the two shows the base entry at
            // its old name again beside the moved one, and loses nothing.
            if source_hidden {
                wt.upper
                    .whiteouts
                    .link(work, from_dir, name)
                    .map_err(moved)?;
            }
        }
        // The table learns the move at once (readers meanwhile look again under `mutate`);
        // the fsmonitor journal after it.
        {
            let mut t = self.nodes.write();
            t.move_name(src_ino, parent, name, newparent, newname, kept);
            if let Some(ov) = t.overlay_mut(src_ino) {
                if ov.ftype == FType::Dir && dst.is_some() {
                    ov.base = None;
                }
            }
        }
        self.note_child(parent, name);
        self.note_child(newparent, newname);
        if src.ftype == FType::Dir {
            let rel_of = |p: Ino, n: &OsStr| self.nodes.read().child_rel_path(p, n);
            if let (Ok(new_rel), Ok(old_rel)) = (rel_of(newparent, newname), rel_of(parent, name)) {
                if let Ok(moved) = beneath::dir(to_dir, newname.as_bytes()) {
                    self.note_moved_tree(&wt, moved.as_fd(), &new_rel, &old_rel);
                }
            }
        }
        Ok(())
    }
}
