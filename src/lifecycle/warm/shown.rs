//! The snapshot a new worktree shows: the latest of its repository and user, taken first
//! when there is none; and the part of the untracked cache that names its files.

use std::fs;

use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{RepoRow, Store, StoreResult, WarmRow};

use super::cache::{dirs_path, idents_path, manifest_path};
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

/// How much of a snapshot's source moved since it was taken, as far as cheaply known: its
/// files changed or gone (by what the snapshot recorded of each: device, inode, size,
/// times, mode), and its directories whose entries changed (a file added that the
/// patterns match shows only there). Files made in a directory the snapshot does not
/// have are not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub files: u64,
    pub dirs: u64,
    /// Whether every file and directory was looked at within the time given (else the
    /// counts are of those that were: at least that many moved).
    pub complete: bool,
}

/// What moved in `repo`'s source checkout since snapshot `w`, looked at for at most
/// `within` (a `stat` of each directory it has, then of each file, as the calling user):
/// past that, what was found so far, marked incomplete. None: the snapshot does not say
/// (one taken before it recorded its files).
pub fn moved_since(
    state: &StateDir,
    repo: &RepoRow,
    w: &WarmRow,
    within: std::time::Duration,
) -> Option<Moved> {
    use super::as_user::{look, Found};
    use std::os::fd::AsFd;
    let until = std::time::Instant::now() + within;
    let idents = fs::read(idents_path(state, &w.manifest)).ok()?;
    let manifest = fs::read(manifest_path(state, w)).ok()?;
    // Looked at as the take looked: below the checkout, through no symbolic link.
    let root = crate::beneath::open_real_dir(&repo.path).ok()?;
    let stat = |p: &[u8]| match look(root.as_fd(), p, false) {
        Found::File(_, st) | Found::Link(_, st) | Found::Dir(st) => Some(st),
        Found::Skip(_) => None,
    };
    let mut moved = Moved {
        files: 0,
        dirs: 0,
        complete: true,
    };
    // Directories first: a file added or removed (a package installed, one gone) shows
    // in its directory's time, and a snapshot has far fewer directories than files.
    for r in crate::git::warm::parse(&manifest).ok()?.flatten() {
        if r.kind != crate::git::warm::Kind::Dir {
            continue;
        }
        if std::time::Instant::now() >= until {
            moved.complete = false;
            return Some(moved);
        }
        if stat(r.path).is_none_or(|st| (st.st_mtime, st.st_mtime_nsec as u32) != r.mtime) {
            moved.dirs += 1;
        }
    }
    // Then each file, while the time lasts.
    for (path, was, _) in super::idents::records(&idents) {
        if std::time::Instant::now() >= until {
            moved.complete = false;
            return Some(moved);
        }
        if stat(path).is_none_or(|st| super::idents::Ident::of(&st) != was) {
            moved.files += 1;
        }
    }
    Some(moved)
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
