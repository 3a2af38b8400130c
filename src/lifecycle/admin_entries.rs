//! At every mount, git's admin entry of each managed worktree is pointed at the mount: the
//! absolute path of a worktree's `.git` depends on where the filesystem is mounted.

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;

use crate::git::{self, admin::ADMIN_MARKER};
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::Store;

use super::create::gitfile_path;

/// Points every managed worktree's git admin entry at `mountpoint` (called at mount, since
/// the absolute path of each worktree's `.git` depends on where the filesystem is mounted).
pub fn repoint_admin_entries(
    state: &StateDir,
    store: &Store,
    mountpoint: &Path,
) -> LifecycleResult<()> {
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
            retarget_index(
                &entry,
                &git::admin_dir(&repo.gitdir, &w.admin_name),
                &mountpoint.join(&w.repo).join(&w.name),
            );
        }
    }
    Ok(())
}

/// The untracked cache names the worktree's path; when the mountpoint moved, an index
/// still as worktreefs wrote it gets the new path (under git's `index.lock`), so the
/// first `git status` there still lists no directory. An index git has rewritten since is
/// left to git, which rebuilds its cache once. Read and written as the entry's other
/// files are (see [`point_admin_entry`]).
fn retarget_index(entry: &git::Entry, admin: &Path, worktree_path: &Path) {
    let Ok((index, _)) = crate::beneath::read_regular(entry.fd(), b"index", 2 << 30) else {
        return;
    };
    let Some(updated) = crate::git::untracked::retarget(&index, worktree_path) else {
        return;
    };
    let index_path = admin.join("index");
    let placed = (|| {
        let dir = entry.fd();
        // git's lock: made only where none is (someone holding the index keeps it).
        let lock = crate::beneath::open(
            dir.as_fd(),
            b"index.lock",
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )?;
        // The entry's owner's, as the index git would write there.
        if let Ok(st) = crate::beneath::fstat(dir.as_fd()) {
            let _ = crate::beneath::chown(lock.as_fd(), Some(st.st_uid), Some(st.st_gid));
        }
        let mut f = fs::File::from(lock);
        let done = std::io::Write::write_all(&mut f, &updated)
            .and_then(|_| f.sync_all())
            .and_then(|_| {
                crate::beneath::rename_at(
                    dir.as_fd(),
                    std::ffi::OsStr::new("index.lock"),
                    dir.as_fd(),
                    std::ffi::OsStr::new("index"),
                    0,
                )
            });
        if done.is_err() {
            let _ =
                crate::beneath::unlink_at(dir.as_fd(), std::ffi::OsStr::new("index.lock"), false);
        }
        done
    })();
    match placed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {} // git holds it
        Err(e) => tracing::warn!("could not update {}: {e}", index_path.display()),
    }
}
