//! A submodule's view inside a worktree (`lifecycle::submodules`): the gitlink's directory
//! becomes the root of a view of the submodule's own repository, with its own layers,
//! journal and `.git`, covered by the parent worktree's leases. Made at the first lookup
//! of the directory, never under the node table's lock.

use std::sync::Arc;

use git2::Oid;

use crate::lifecycle::submodules::{ensure, Parent};

use super::error::{FsError, FsResult};
use super::overlay::WtCtx;
use super::view::View;

/// The number a submodule view's inode numbers are made from: bit 30 set (no worktree
/// id reaches it), the rest from the parent view's number and the path.
fn sub_ino_id(parent: i64, path: &[u8]) -> i64 {
    let mix = (parent as u64).wrapping_mul(0x9e37_79b9) ^ crate::ino::fnv1a32(path) as u64;
    (0x4000_0000 | (mix & 0x3fff_ffff)) as i64
}

impl View {
    /// The view of the submodule at `path` of view `wt` (a worktree, or a submodule's
    /// view: gitlink `commit`): made the first time. None where the worktree does not
    /// show submodules, and for a submodule that is not initialized.
    ///
    /// `origin` is the path it was made at: `path`, unless it was moved (a stub in the
    /// upper layer says so, see `layout::SUBMODULE_MARKER`).
    pub(super) fn submodule_view(
        &self,
        wt: &Arc<WtCtx>,
        origin: &[u8],
        path: &[u8],
        commit: Oid,
    ) -> FsResult<Option<Arc<WtCtx>>> {
        if !wt.submodules {
            return Ok(None);
        }
        if let Some(s) = wt.subs.lock().get(path) {
            return Ok(Some(s.clone()));
        }
        // Made once: a second lookup of this path waits for the first; lookups of other
        // paths do not (making one may take a while: its index, its conversions).
        let slot = wt.making.lock().entry(path.to_vec()).or_default().clone();
        let _making = slot.lock();
        let made = self.make_submodule_view(wt, origin, path, commit);
        // This path's slot goes once nobody else waits on it (one that waits makes, or
        // finds, the view with this same slot: never two makers of one path at once).
        let mut making = wt.making.lock();
        if making
            .get(path)
            .is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(s) == 2)
        {
            making.remove(path);
        }
        made
    }

    fn make_submodule_view(
        &self,
        wt: &Arc<WtCtx>,
        origin: &[u8],
        path: &[u8],
        commit: Oid,
    ) -> FsResult<Option<Arc<WtCtx>>> {
        if let Some(s) = wt.subs.lock().get(path) {
            return Ok(Some(s.clone())); // made while this one waited
        }
        let (within, worktree) = (wt.sub_path(), wt.worktree_name());
        if wt.is_submodule() && within.is_none() {
            // The view above is being let go (its worktree's context is gone).
            return Ok(None);
        }
        let parent = Parent {
            id: wt.id,
            repo: &wt.repo,
            name: &worktree,
            within: within.as_deref(),
            admin_name: &wt.admin_name,
            common_dir: &wt.gitdir,
            base_tree: wt.base_tree,
            uid: wt.uid,
            gid: wt.gid,
            mountpoint: &self.mountpoint,
        };
        let what = format!("{}/{}", wt.name, String::from_utf8_lossy(path));
        let (dir, record) = match ensure(&self.state, &parent, origin, path, commit) {
            Ok(Some(made)) => made,
            Ok(None) => return Ok(None),
            // Not entered rather than an empty directory, whose files would hide the
            // submodule from then on.
            Err(e) => {
                return Err(FsError::eio(
                    format!("submodule {what}: its view could not be made ({e:#})"),
                    std::io::Error::other("submodule view"),
                ))
            }
        };
        let ctx = (|| -> anyhow::Result<WtCtx> {
            let upper = dir.join("upper");
            let work = dir.join("work");
            let (upper_fd, work_fd, whiteouts, _) = super::namespace::open_layers(&upper, &work)?;
            Ok(WtCtx {
                id: wt.id,
                repo_id: wt.repo_id,
                repo: wt.repo.clone(),
                name: what.clone(),
                gitdir: record.gitdir.clone(),
                base_tree: Oid::from_str(&record.tree)?,
                base_mtime: std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(record.base_mtime.max(0) as u64),
                uid: wt.uid,
                gid: wt.gid,
                upper,
                work,
                upper_fd,
                work_fd,
                whiteouts,
                gitfile: format!("gitdir: {}\n", record.admin().display()).into_bytes(),
                sizes_seeded: false.into(),
                journal: Default::default(),
                conversions: super::namespace::read_conversions(
                    &dir.join(crate::state::CONVERSIONS_FILE),
                )?,
                ino_id: sub_ino_id(wt.ino_id, path),
                lease_id: wt.lease_id,
                sub_of: Some(super::overlay::SubOf {
                    parent: Arc::downgrade(wt),
                    path: parking_lot::Mutex::new(path.to_vec()),
                    origin: origin.to_vec(),
                    commit,
                }),
                submodules: true,
                admin_name: record.admin_name.clone(),
                subs: Default::default(),
                making: Default::default(),
            })
        })()
        .map_err(|e| FsError::internal(format!("submodule {what}: {e:#}")))?;
        if ctx.conversions.is_some() {
            self.conversions_in_use
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let ctx = Arc::new(ctx);
        wt.subs.lock().insert(path.to_vec(), ctx.clone());
        tracing::info!(
            "submodule {what}: shown at {} ({})",
            record.commit,
            record.name
        );
        Ok(Some(ctx))
    }
}

impl View {
    /// The stub of a submodule view moved to `name` in the upper directory `dir` (see
    /// `layout::SUBMODULE_MARKER`): the path it was made at and its commit.
    pub(super) fn stub_at(
        &self,
        dir: std::os::fd::BorrowedFd,
        name: &std::ffi::OsStr,
    ) -> Option<(Vec<u8>, Oid)> {
        use std::os::unix::ffi::OsStrExt;
        let mut rel = name.as_bytes().to_vec();
        rel.push(b'/');
        rel.extend_from_slice(crate::layout::SUBMODULE_MARKER.as_bytes());
        let (b, _) = crate::beneath::read_regular(dir, &rel, 64 << 10).ok()?;
        crate::lifecycle::submodules::parse_stub(&b)
    }

    /// `rename` of a submodule view's root (`git mv vendor/lib lib`, `mv`): its git entry
    /// and record say the new path first; then a stub in the upper layer at the new name
    /// shows the view there (the one already there, when it was moved before, moves; else
    /// one is made), and a whiteout hides the gitlink at the old name. The target is
    /// absent or an empty directory (checked by `rename`). In memory, the view is found
    /// at its new path. A crash between the steps shows it at one of the two paths, and
    /// the next lookup there finishes the move.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename_submodule(
        &self,
        parent: u64,
        name: &std::ffi::OsStr,
        newparent: u64,
        newname: &std::ffi::OsStr,
        root: u64,
        sub: &Arc<WtCtx>,
        dst: Option<super::overlay::Overlay>,
    ) -> FsResult<()> {
        use crate::beneath;
        use std::os::fd::AsFd;
        let Some(of) = sub.sub_of.as_ref() else {
            return Err(FsError::stale(root));
        };
        let Some(owner) = of.parent.upgrade() else {
            return Err(FsError::stale(root));
        };
        let new_rel = self.nodes.read().child_rel_path(newparent, newname)?;
        let Ok(new_s) = std::str::from_utf8(&new_rel) else {
            return Err(FsError::invalid(
                "a submodule's view moves only to a UTF-8 path (its record names it)",
            ));
        };
        let to = crate::lifecycle::submodules::full_path(owner.sub_path().as_deref(), new_s);
        let Some(origin) = sub.sub_origin() else {
            return Err(FsError::stale(root));
        };
        let dir = self
            .state
            .subs(owner.id)
            .join(crate::lifecycle::submodules::key_of(origin.as_bytes()));
        self.ensure_upper_dir(parent)?;
        self.ensure_upper_dir(newparent)?;
        let from_dir = self.upper_dir(parent)?;
        let to_dir = self.upper_dir(newparent)?;
        let (from_dir, to_dir) = (from_dir.as_fd(), to_dir.as_fd());
        let work = owner.work_fd.as_fd();
        let failed = |what: &str, e: std::io::Error| {
            FsError::io(
                format!(
                    "rename of submodule {} to {}: {what}",
                    sub.name,
                    String::from_utf8_lossy(&new_rel)
                ),
                e,
            )
        };
        // 1. Its record and git entry.
        let record = {
            let bytes = std::fs::read(dir.join("record")).map_err(|e| failed("its record", e))?;
            serde_json::from_slice::<crate::lifecycle::submodules::SubRecord>(&bytes)
                .map_err(|e| failed("its record", std::io::Error::other(e)))?
        };
        let from = record.path.clone();
        let place = format!("{}/{}", owner.repo, owner.worktree_name());
        let moved = |r, to: &str| {
            crate::lifecycle::submodules::move_view(
                &self.state,
                &self.mountpoint,
                &place,
                &dir,
                r,
                to,
            )
        };
        let record = moved(record, &to).map_err(|e| {
            FsError::eio(
                format!("submodule {}: {e:#}", sub.name),
                std::io::Error::other("moving a submodule view"),
            )
        })?;
        // 2. The stub, at the new name; the gitlink at the old one hidden.
        let hide_old = self.base_has(parent, name)?;
        let placed = (|| -> std::io::Result<()> {
            if let Some(d) = dst {
                if d.in_upper && d.ftype == super::types::FType::Dir {
                    self.to_trash(&owner, to_dir, newname)?;
                }
            }
            if owner.whiteouts.at(to_dir, newname) {
                beneath::unlink_at(to_dir, newname, false)?;
            }
            let stub_here = self.stub_at(from_dir, name).is_some();
            if stub_here {
                beneath::rename_at(from_dir, name, to_dir, newname, libc::RENAME_NOREPLACE)?;
            } else {
                let tmp = Self::work_tmp("stub");
                beneath::mkdir_at(work, &tmp, 0o755)?;
                let made = (|| {
                    let d = beneath::dir(work, tmp.as_encoded_bytes())?;
                    let f = beneath::open(
                        d.as_fd(),
                        crate::layout::SUBMODULE_MARKER.as_bytes(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        0o644,
                    )?;
                    let mut f = std::fs::File::from(f);
                    std::io::Write::write_all(
                        &mut f,
                        &crate::lifecycle::submodules::stub_text(&of.origin, of.commit),
                    )?;
                    f.sync_all()?;
                    beneath::chmod(d.as_fd(), 0o755)?;
                    let _ = beneath::chown(d.as_fd(), Some(owner.uid), Some(owner.gid));
                    beneath::rename_at(work, &tmp, to_dir, newname, libc::RENAME_NOREPLACE)
                })();
                if made.is_err() {
                    let _ = beneath::remove_tree(work, &tmp);
                }
                made?;
            }
            if hide_old {
                owner.whiteouts.link(work, from_dir, name)?;
            }
            Ok(())
        })();
        if let Err(e) = placed {
            // Its record and git entry back to where it still is.
            if let Err(back) = moved(record, &from) {
                tracing::warn!("submodule {}: {back:#}", sub.name);
            }
            return Err(failed("placing it", e));
        }
        // 3. In memory.
        {
            let mut subs = owner.subs.lock();
            let old = of.path();
            if let Some(s) = subs.remove(&old) {
                subs.insert(new_rel.clone(), s);
            }
            *of.path.lock() = new_rel.clone();
        }
        self.nodes
            .write()
            .move_name(root, parent, name, newparent, newname, None);
        self.note_child(parent, name);
        self.note_child(newparent, newname);
        tracing::info!(
            "submodule {}: moved to {}",
            sub.name,
            String::from_utf8_lossy(&new_rel)
        );
        Ok(())
    }
}
