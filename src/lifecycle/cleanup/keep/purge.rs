//! Purging kept copies: one (its directory out of a restore's reach first, its ref, its
//! row), those whose time is over or that the disk needs, a repository's all; and the
//! refs of checkpoints gone, whose time is over (`git::checkpoint_refs`).

use std::fs;

use crate::ids::WorktreeId;
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{now_secs, KeptRow, Store};

use super::kept::delete_ref;
use super::policy::KeepPolicy;
use crate::lifecycle::cleanup::lock::try_lock;

/// A kept copy being purged: `<state>/trash/purging-<id>` (deleted at every mount).
pub const PURGING: &str = "purging-";

/// Deletes one kept copy: its directory, its ref, then its row (with an event saying
/// `why`). Under the worktree's cleanup lock (a restore of it holds that lock): Ok(false)
/// when someone holds it.
pub fn purge_kept(
    state: &StateDir,
    store: &mut Store,
    id: WorktreeId,
    why: &str,
) -> LifecycleResult<bool> {
    let Some(_lock) = try_lock(state, id) else {
        return Ok(false);
    };
    let Some(row) = store.kept_by_id(id)? else {
        return Ok(true);
    };
    // Not there because a restore killed half-way holds it: its rollback puts it back.
    if !state.removed_dir(id).exists()
        && store
            .creations()?
            .iter()
            .any(|c| c.restored_from == Some(id))
    {
        return Ok(false);
    }
    let owner = store.worktree_by_id(id)?;
    // The git entries of its submodule views (gone with the removal, unless a kill came
    // between the removal's last two steps).
    if let Some(w) = &owner {
        crate::lifecycle::submodules::remove_admin_entries(
            state,
            &state.removed_dir(id),
            &format!("{}/{}", w.repo, w.name),
            w.uid,
        );
    }
    // Out of a restore's reach first, in one rename: a purge that stops half-way (a
    // kill, a file that cannot be deleted) never leaves a partial copy to restore.
    let dir = state.removed_dir(id);
    let doomed = state.trash().join(format!("{PURGING}{id}"));
    if dir.exists() {
        let _ = fs::remove_dir_all(&doomed);
        fs::rename(&dir, &doomed).map_err(|e| {
            crate::lifecycle::error::failed(format!(
                "moving {} to {}: {e}",
                dir.display(),
                doomed.display()
            ))
        })?;
    }
    if let Some(name) = &row.tip_ref {
        let gitdir = owner
            .as_ref()
            .and_then(|w| store.repo_by_id(w.repo_id).ok().flatten())
            .map(|r| r.gitdir);
        if let Some(gitdir) = gitdir {
            if let Err(e) = delete_ref(&gitdir, name) {
                tracing::warn!("could not delete {name} in {}: {e:#}", gitdir.display());
            }
        }
    }
    store.drop_kept(id, why)?;
    if doomed.exists() {
        if let Err(e) = fs::remove_dir_all(&doomed) {
            tracing::warn!(
                "could not delete {}: {e} (deleted at the next mount)",
                doomed.display()
            );
        }
    }
    tracing::info!(
        "kept copy of {}/{} (worktree {id}) purged: {why}",
        row.repo,
        row.worktree
    );
    Ok(true)
}

/// Purges the kept copies whose time is over, then, oldest first, as many as it takes
/// for the state directory's disk to be no longer low. Returns how many went.
pub fn purge_due(state: &StateDir, store: &mut Store, policy: &KeepPolicy) -> usize {
    let now = now_secs();
    let mut n = 0;
    let mut purge = |store: &mut Store, r: &KeptRow, why: &str| match purge_kept(
        state,
        store,
        r.worktree_id,
        why,
    ) {
        Ok(done) => n += done as usize,
        Err(e) => tracing::warn!("purging the kept copy of {}/{}: {e:#}", r.repo, r.worktree),
    };
    let rows = store.kept().unwrap_or_default();
    for r in rows.iter().filter(|r| now - r.kept_at >= policy.keep_secs) {
        let why = format!(
            "kept for {} (--keep-removed {} h)",
            crate::report::age(now - r.kept_at),
            policy.keep_secs as f64 / 3600.0
        );
        purge(store, r, &why);
    }
    for r in store.kept().unwrap_or_default() {
        let Some(why) = policy.low_disk(&state.root) else {
            break;
        };
        purge(store, &r, &why);
    }
    n
}

/// In every registered repository, this state directory's refs of checkpoints gone:
/// those of worktrees removed (the removal leaves them to this) retired, and those
/// retired `policy.keep_secs` ago or more deleted, as a removal's kept tip is. Returns
/// how many were deleted.
pub fn sweep_checkpoint_refs(store: &Store, policy: &KeepPolicy) -> usize {
    let (Ok(repos), Ok(key)) = (store.repos(), store.refs_key()) else {
        return 0;
    };
    let mut deleted = 0;
    for repo in repos {
        // Removed for good: a row removed stays removed (a restore is a new worktree).
        let removed: Vec<i64> = store
            .removed_ids(repo.id)
            .unwrap_or_default()
            .into_iter()
            .map(|id| id.0)
            .collect();
        match crate::git::checkpoint_refs::sweep(&repo.gitdir, &key, removed, policy.keep_secs) {
            Ok(s) => {
                if s.retired + s.deleted > 0 {
                    tracing::info!(
                        repo = %repo.name,
                        retired = s.retired,
                        deleted = s.deleted,
                        "refs of checkpoints gone: those of removed worktrees retired, those past the removal period deleted"
                    );
                }
                deleted += s.deleted;
            }
            Err(e) => tracing::warn!("sweeping the checkpoint refs of {}: {e:#}", repo.name),
        }
    }
    deleted
}

/// Purges every kept copy of repository `repo` (before it is unregistered), and the
/// refs of its worktrees' checkpoints.
pub fn purge_repo(state: &StateDir, store: &mut Store, repo: &str) -> LifecycleResult<usize> {
    if let Some(row) = store.repos()?.into_iter().find(|r| r.name == repo) {
        if let Err(e) = crate::git::checkpoint_refs::delete_all(&row.gitdir, &store.refs_key()?) {
            tracing::warn!("deleting the checkpoint refs of {repo}: {e:#}");
        }
    }
    let mut n = 0;
    for r in store.kept()?.into_iter().filter(|r| r.repo == repo) {
        if purge_kept(
            state,
            store,
            r.worktree_id,
            "its repository is unregistered",
        )? {
            n += 1;
        } else {
            return Err(crate::lifecycle::error::refused(format!(
                "the kept copy of {}/{} is being restored or purged right now; try again in a moment",
                r.repo,
                r.worktree
            )));
        }
    }
    Ok(n)
}
