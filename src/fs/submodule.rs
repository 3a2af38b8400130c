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
    pub(super) fn submodule_view(
        &self,
        wt: &Arc<WtCtx>,
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
        let made = self.make_submodule_view(wt, path, commit);
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
        let (dir, record) = match ensure(&self.state, &parent, path, commit) {
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
                sub_of: Some((Arc::downgrade(wt), path.to_vec())),
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
