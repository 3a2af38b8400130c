//! At every mount, git's admin entry of each managed worktree is pointed at the mount: the
//! absolute path of a worktree's `.git` depends on where the filesystem is mounted.

use std::path::Path;

use crate::git::{self, admin::ADMIN_MARKER};
use crate::state::StateDir;
use crate::store::Store;

use super::create::gitfile_path;

/// Points every managed worktree's git admin entry at `mountpoint` (called at mount, since
/// the absolute path of each worktree's `.git` depends on where the filesystem is mounted).
pub fn repoint_admin_entries(
    state: &StateDir,
    store: &Store,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    for w in store.worktrees()? {
        let Some(repo) = store.repo_by_id(w.repo_id)? else {
            continue;
        };
        crate::lifecycle::submodules::repoint(
            state,
            &state.worktree_dir(w.id),
            &format!("{}/{}", w.repo, w.name),
            w.uid,
            &mountpoint.join(&w.repo).join(&w.name),
        );
        let want = format!("{}\n", gitfile_path(mountpoint, &w.repo, &w.name).display());
        if let Some(entry) = git::admin::point_admin_entry(
            &repo.gitdir,
            &w.admin_name,
            |b| b.starts_with(ADMIN_MARKER.as_bytes()),
            &format!("{}/{}", w.repo, w.name),
            w.uid,
            &want,
        ) {
            git::admin::retarget_index(
                &entry,
                &git::admin_dir(&repo.gitdir, &w.admin_name),
                &mountpoint.join(&w.repo).join(&w.name),
            );
        }
    }
    Ok(())
}
