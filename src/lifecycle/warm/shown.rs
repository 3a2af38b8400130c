//! The snapshot a new worktree shows: the latest of its repository and user, taken first
//! when there is none; and the part of the untracked cache that names its files.

use std::fs;

use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{RepoRow, Store, StoreResult, WarmRow};

use super::cache::{dirs_path, manifest_path};
use super::take::{take, Progress, Taken};
use crate::ids::RepoId;

/// The newest snapshot of repository `repo_id` taken with `uid`'s permissions whose
/// manifest is in place.
pub fn latest(
    state: &StateDir,
    store: &Store,
    repo_id: RepoId,
    uid: u32,
) -> StoreResult<Option<WarmRow>> {
    Ok(store
        .latest_warm(repo_id, uid)?
        .filter(|w| manifest_path(state, w).exists()))
}

/// The newest snapshot of `repo` taken with `uid`'s permissions, else a new one.
pub fn ensure(
    state: &StateDir,
    store: &mut Store,
    repo: &RepoRow,
    uid: u32,
    gid: u32,
    progress: Progress<'_>,
) -> LifecycleResult<(WarmRow, Option<Taken>)> {
    if let Some(row) = latest(state, store, repo.id, uid)? {
        return Ok((row, None));
    }
    let taken = take(state, store, repo, uid, gid, progress)?;
    Ok((taken.row.clone(), Some(taken)))
}

/// The untracked-cache part `untr` of a warm worktree's index: invalid at every
/// directory where snapshot `w` has entries, so git lists those (and only those).
pub fn untracked_part(state: &StateDir, w: &WarmRow, untr: &[u8]) -> Vec<u8> {
    let dirs = fs::read(dirs_path(state, &w.manifest)).ok();
    let set: Option<std::collections::HashSet<&[u8]>> =
        dirs.as_deref().map(|d| d.split(|b| *b == 0).collect());
    // Without the list (removed by hand), every directory is listed: slower, never wrong.
    crate::git::untracked::invalidate(untr, |p| set.as_ref().is_none_or(|s| s.contains(p)))
        .unwrap_or_else(|| untr.to_vec())
}
