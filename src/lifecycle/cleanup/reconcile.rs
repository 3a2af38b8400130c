//! Finishing what an earlier daemon left: deleting worktrees at boot, parked admin
//! entries, and the cleanup of every worktree left without a lease at unmount.

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;

use super::decide::{decide, Verdict};
use super::deleting::{finish, inspect_bounded, settled};
use super::inspection::Inspection;
use super::keep;
use super::lock::try_lock;
use super::remove::{gone_by_hand, Removal};
use super::target::{target_of, Outcome};
use crate::ids::WorktreeId;
use crate::lease::State;
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{Store, WorktreeRow};

/// Runs cleanup for every worktree in `deleting` that nobody else is working on.
pub fn finish_all_deleting(
    state: &StateDir,
    store: &mut Store,
    mountpoint: &Path,
    how: &Inspection,
    gate: Option<&crate::lifecycle::gate::Gate>,
) -> Vec<(WorktreeRow, LifecycleResult<Outcome>)> {
    let mut out = Vec::new();
    for row in store.worktrees_in(State::Deleting).unwrap_or_default() {
        // While the daemon serves: closed to new leases until its cleanup is over (a
        // deleting worktree with a lease kept in memory waits for it to be written, and
        // refused).
        // While the daemon serves: no lease kept in memory may be pending (the catalog's
        // `deleting` keeps new ones out).
        let _closed = match gate {
            Some(g) => match g.close(row.id) {
                Some(c) => Some(c),
                None => continue,
            },
            None => None,
        };
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        // Read again under the lock: someone may have finished it meanwhile.
        let Ok(Some(row)) = store.worktree_by_id(row.id) else {
            continue;
        };
        if row.state != State::Deleting {
            continue;
        }
        let r = finish(state, store, &row, mountpoint, how);
        if let Err(e) = &r {
            tracing::error!("cleanup of {}/{} failed: {e:#}", row.repo, row.name);
        }
        out.push((row, r));
    }
    out
}

/// At every mount, before serving: puts back or deletes what a dead cleanup parked,
/// finishes `deleting` worktrees, removes retained ones that are now clean and pushed, and
/// lets go of worktrees whose directory was removed by hand. Never touches a directory
/// worktreefs did not make.
pub fn reconcile_at_boot(
    state: &StateDir,
    mountpoint: &Path,
    how: &Inspection,
) -> LifecycleResult<()> {
    let mut store = Store::open(&state.root)?;
    restore_or_purge_parked(state, &store);
    // Kept copies whose directory is gone (deleted by hand) leave the store; the others
    // go when their time is over or the disk is low.
    // (One a restore killed half-way holds is put back by that restore's rollback.)
    let restoring: Vec<WorktreeId> = store
        .creations()
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.restored_from)
        .collect();
    for k in store.kept().unwrap_or_default() {
        if !state.removed_dir(k.worktree_id).exists() && !restoring.contains(&k.worktree_id) {
            let _ = keep::purge_kept(
                state,
                &mut store,
                k.worktree_id,
                "its kept directory was removed by hand",
            );
        }
    }
    let policy = keep::KeepPolicy::of(&store);
    keep::purge_due(state, &mut store, &policy);
    keep::sweep_checkpoint_refs(&store, &policy);
    for (row, r) in finish_all_deleting(state, &mut store, mountpoint, how, None) {
        if let Ok(o) = r {
            tracing::info!("boot reconcile: {}/{}: {o}", row.repo, row.name);
        }
    }
    for row in store.worktrees_in(State::Retained)? {
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        let t = target_of(state, &store, &row, mountpoint)?;
        if !t.dir.exists() {
            continue; // handled below
        }
        let inspected = inspect_bounded(&t, how);
        if let Verdict::Remove {
            delete_branch,
            integrated,
        } = decide(t.branch.as_deref(), t.branch_created, &inspected)
        {
            if store
                .begin_deleting(
                    row.id,
                    &[State::Retained],
                    "boot reconcile: now clean and pushed",
                )
                .is_ok()
            {
                if how.waits_for_mount(&store, &row, mountpoint) {
                    tracing::info!(
                        "boot reconcile: {}/{}: now clean and pushed; removed once the mount serves it (its teardown command runs inside it)",
                        row.repo,
                        row.name
                    );
                    continue;
                }
                let how = Removal::clean(
                    state,
                    &store,
                    delete_branch,
                    integrated.as_deref(),
                    settled(&inspected),
                );
                let o = super::remove::run_removal(state, &mut store, &t, &how)?;
                tracing::info!("boot reconcile: {}/{}: {o}", row.repo, row.name);
            }
        }
    }
    for row in store.worktrees()? {
        if row.state == State::Deleting || state.worktree_dir(row.id).exists() {
            continue;
        }
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        let t = target_of(state, &store, &row, mountpoint)?;
        gone_by_hand(state, &mut store, &t)?;
    }
    Ok(())
}

/// Parked directories (a worktree's state dir in `<state>/trash`, git entries in
/// `<gitdir>/worktreefs/removing`) of removals that did not finish: deleted when their
/// worktree is removed, put back when its removal was never recorded as decided.
fn restore_or_purge_parked(state: &StateDir, store: &Store) {
    let decide_for = |id: WorktreeId| -> Option<bool> {
        // Some(true): delete; Some(false): put back; None: leave (removal to finish).
        match store.worktree_by_id(id).ok()? {
            None => Some(true),
            Some(r) if r.state == State::Removed => Some(true),
            Some(r) if r.state == State::Deleting && r.removal.is_some() => None,
            Some(_) => Some(false),
        }
    };
    // Which copies are kept: when that cannot be read, `removed/` is left as it is (fail
    // closed: a kept copy is never deleted for want of its row).
    let kept: Option<std::collections::HashSet<WorktreeId>> = store
        .kept()
        .ok()
        .map(|rows| rows.iter().map(|k| k.worktree_id).collect());
    let removed_dirs = match &kept {
        Some(_) => fs::read_dir(state.removed()).ok(),
        None => None,
    };
    let kept = kept.unwrap_or_default();
    // Purges a kill stopped half-way (their rows, if still there, go at the next purge).
    for e in fs::read_dir(state.trash()).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(keep::PURGING) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    let parked = fs::read_dir(state.trash())
        .into_iter()
        .flatten()
        .chain(removed_dirs.into_iter().flatten())
        .flatten();
    for e in parked {
        let Some(id) = e
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<WorktreeId>().ok())
        else {
            continue;
        };
        // Kept for a restore: its row says so. The git entries of its submodule views
        // go (a kill between the removal's last two steps left them).
        if kept.contains(&id) && e.path() == state.removed_dir(id) {
            if let Ok(Some(r)) = store.worktree_by_id(id) {
                crate::lifecycle::submodules::remove_admin_entries(
                    state,
                    &e.path(),
                    &format!("{}/{}", r.repo, r.name),
                    r.uid,
                );
            }
            continue;
        }
        match decide_for(id) {
            Some(true) => {
                match store.worktree_by_id(id).ok().flatten() {
                    Some(r) => crate::lifecycle::submodules::remove_admin_entries(
                        state,
                        &e.path(),
                        &format!("{}/{}", r.repo, r.name),
                        r.uid,
                    ),
                    // Which worktree's views they were is not known: nothing of git's can be
                    // told to be theirs, so nothing is deleted (the records that name
                    // those entries stay with it).
                    None => {
                        if !crate::layout::submodules::readable_records(&e.path()).is_empty() {
                            tracing::warn!(
                                "{}: no record of its worktree; kept, with its submodule views' records (their git entries are left)",
                                e.path().display()
                            );
                            continue;
                        }
                    }
                }
                let _ = fs::remove_dir_all(e.path());
            }
            Some(false) if !state.worktree_dir(id).exists() => {
                tracing::warn!(
                    "putting back {} (its removal never finished)",
                    e.path().display()
                );
                let _ = fs::rename(e.path(), state.worktree_dir(id));
            }
            _ => {}
        }
    }
    for repo in store.repos().unwrap_or_default() {
        let dir = repo.gitdir.join(crate::git::admin::PARKED_ADMIN_DIR);
        // Beneath the git directory, through no symlink (see `AdminDirs`).
        let Ok(dirs) = crate::git::admin::AdminDirs::open(&repo.gitdir) else {
            continue;
        };
        let Ok(removing) = dirs.removing(false) else {
            continue;
        };
        for e in crate::beneath::list(removing.as_fd()).unwrap_or_default() {
            let name = e.name.to_string_lossy().into_owned();
            let path = dir.join(&e.name);
            let Some((id, admin)) = name
                .split_once('-')
                .and_then(|(i, a)| Some((i.parse::<WorktreeId>().ok()?, a.to_string())))
            else {
                continue;
            };
            match decide_for(id) {
                // Deleted only when it is the entry of the worktree its name says it is.
                Some(true) => match store.worktree_by_id(id).ok().flatten() {
                    Some(r) => {
                        let place = format!("{}/{}", r.repo, r.name);
                        let entry = crate::git::Entry::open(removing.as_fd(), &e.name);
                        match entry.map_err(|e| e.to_string()).and_then(|entry| {
                            entry.check(
                                |b| b.starts_with(crate::git::admin::ADMIN_MARKER.as_bytes()),
                                &place,
                                r.uid,
                            )?;
                            entry
                                .remove(removing.as_fd(), &e.name)
                                .map_err(|e| e.to_string())
                        }) {
                            Ok(()) => {}
                            Err(why) => tracing::warn!(
                                "{} (parked by a removal of {place}) {why}; left alone",
                                path.display()
                            ),
                        }
                    }
                    None => {
                        tracing::warn!("{}: no record of its worktree; left alone", path.display())
                    }
                },
                Some(false) => {
                    let back = crate::git::admin_dir(&repo.gitdir, &admin);
                    let put = dirs.worktrees(true).and_then(|worktrees| {
                        crate::beneath::rename_at(
                            removing.as_fd(),
                            &e.name,
                            worktrees.as_fd(),
                            std::ffi::OsStr::new(&admin),
                            libc::RENAME_NOREPLACE,
                        )
                    });
                    match put {
                        Ok(()) => tracing::warn!(
                            "put back {} (its removal never finished; it was parked as {})",
                            back.display(),
                            path.display()
                        ),
                        Err(e) => tracing::error!(
                            "could not put back {} from {}: {e}; if {} is this worktree's entry, remove {}, else move the parked one back by hand",
                            back.display(),
                            path.display(),
                            back.display(),
                            path.display()
                        ),
                    }
                }
                None => {}
            }
        }
    }
}

/// At unmount: every lease released with reason `unmount` (with `keep_sessions`, a planned
/// restart: process leases only, named ones kept for the next mount), then cleanup for
/// every worktree left without one (the grace period does not apply: the mount is going
/// away). Worktrees never leased (`ready`) and retained ones stay as they are.
pub fn reclaim_at_unmount(
    state: &StateDir,
    mountpoint: &Path,
    how: &Inspection,
    keep_sessions: bool,
) -> LifecycleResult<()> {
    let mut store = Store::open(&state.root)?;
    let released = if keep_sessions {
        store.release_process_leases("unmount (named leases kept for the next mount)")?
    } else {
        store.release_all_leases("unmount")?
    };
    let marked = store.mark_deleting_after_grace(0)?;
    tracing::info!(
        "unmount: {released} lease(s) released, {} worktree(s) to clean up",
        marked.len()
    );
    for (row, r) in finish_all_deleting(state, &mut store, mountpoint, how, None) {
        match r {
            Ok(o) => tracing::info!("unmount: {}/{}: {o}", row.repo, row.name),
            Err(e) => tracing::error!("unmount: {}/{}: {e:#}", row.repo, row.name),
        }
    }
    Ok(())
}
