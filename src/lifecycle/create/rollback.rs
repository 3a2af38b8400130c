//! Undoing a creation: one that failed in this process, or one killed half-way (its
//! creator gone), taken over first so two rollers never both act.

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;

use git2::{BranchType, Repository};

use crate::git::{self};
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{CreationRow, Store, StoreResult};

use super::error::{db_failure, internal, CreateError};
use super::steps::{branch_log_message, staging_dir, Made};

/// Whether the process that recorded creation `c` still runs (same pid, same start).
pub(crate) fn creator_alive(c: &CreationRow) -> bool {
    // This process's own record (a rollback of it that failed earlier, say: a full disk)
    // is tried again, not waited for: the kernel lets one mkdir of a name run at a time.
    if c.pid == std::process::id() as i32 {
        return false;
    }
    crate::process::info::proc_info(c.pid)
        .is_some_and(|p| p.start == c.pid_start || c.pid_start == 0)
}

/// Takes over the record of a creation whose creator is gone, for this process: the
/// record as it now stands, or None when someone else took it or it is gone.
pub(crate) fn claim(store: &mut Store, c: &CreationRow) -> StoreResult<Option<CreationRow>> {
    let me = std::process::id() as i32;
    let start = crate::process::info::proc_info(me)
        .map(|p| p.start)
        .unwrap_or(0);
    Ok(store.claim_creation(c, me, start)?.then(|| CreationRow {
        pid: me,
        pid_start: start,
        ..c.clone()
    }))
}

/// Undoes what creation `c` recorded, each step only if it finds its work there and
/// only what the record names: the upper layer under its reserved id (no row has that
/// id), its staging directory, git's admin entry when its `locked` file is worktreefs's
/// (this state directory's text, or a part of it with nothing else yet), the branch it
/// made when its reflog is that one creation's entry, it still points at the base commit
/// and is checked out nowhere; then the record goes. Safe to run again.
pub fn roll_back_creation(
    state: &StateDir,
    store: &mut Store,
    gitdir: &Path,
    c: &CreationRow,
) -> LifecycleResult<()> {
    roll_back(state, store, gitdir, c, None)
}

/// Rolls back each creation `which` picks that was killed half-way (its creator gone),
/// taking it over first so two rollers never both act; one whose creator still runs is
/// refused with `alive`'s error.
pub(crate) fn roll_back_dead(
    state: &StateDir,
    store: &mut Store,
    gitdir: &Path,
    which: impl Fn(&CreationRow) -> bool,
    alive: impl Fn(&CreationRow) -> CreateError,
) -> Result<(), CreateError> {
    for c in store
        .creations()
        .map_err(|e| internal("reading creations")(e.to_string()))?
        .into_iter()
        .filter(|c| which(c))
    {
        if creator_alive(&c) {
            return Err(alive(&c));
        }
        let Some(c) =
            claim(store, &c).map_err(db_failure("taking over a creation killed half-way"))?
        else {
            continue; // someone else took it over
        };
        roll_back(state, store, gitdir, &c, None).map_err(|e| {
            internal("rolling back an earlier creation killed half-way")(format!("{e:#}"))
        })?;
    }
    Ok(())
}

pub(crate) fn roll_back(
    state: &StateDir,
    store: &mut Store,
    gitdir: &Path,
    c: &CreationRow,
    made: Option<&Made>,
) -> LifecycleResult<()> {
    use crate::lifecycle::error::Context;
    let what = format!("creation of worktree {} (id {})", c.name, c.worktree_id);
    // A live worktree of this repository that has the admin entry or the branch the
    // record names (another creation finished with them) keeps them.
    let live = store.worktrees()?;
    let live_admin = live
        .iter()
        .any(|w| w.repo_id == c.repo_id && w.admin_name == c.admin_name);
    let live_branch = |b: &str| {
        live.iter()
            .any(|w| w.repo_id == c.repo_id && w.branch.as_deref() == Some(b))
    };
    if store.worktree_by_id(c.worktree_id)?.is_none() {
        let dir = state.worktree_dir(c.worktree_id);
        match c.restored_from {
            // A restore's directory is a kept copy: it goes back where it was kept.
            Some(from) if dir.exists() => {
                let kept = state.removed_dir(from);
                if kept.exists() {
                    tracing::warn!(
                        "{what}: {} is there again; {} is left as it is (move it back by hand)",
                        kept.display(),
                        dir.display()
                    );
                } else {
                    fs::rename(&dir, &kept).with_context(|| {
                        format!(
                            "{what}: putting {} back as {}",
                            dir.display(),
                            kept.display()
                        )
                    })?;
                }
            }
            None if dir.exists() => {
                fs::remove_dir_all(&dir)
                    .with_context(|| format!("{what}: removing {}", dir.display()))?;
            }
            _ => {}
        }
    }
    let staging = staging_dir(state, c.worktree_id);
    if staging.exists() {
        fs::remove_dir_all(&staging)
            .with_context(|| format!("{what}: removing {}", staging.display()))?;
    }
    let admin = git::admin_dir(gitdir, &c.admin_name);
    // Reached through no symlink (the repository's owner may have made `worktrees/` a
    // link to another repository's, whose entry of this name is not this one).
    let worktrees = git::worktrees_dir(gitdir);
    if worktrees.is_none() && fs::symlink_metadata(gitdir.join("worktrees")).is_ok() {
        tracing::warn!(
            "{what}: {} cannot be reached through no symbolic link; any entry {} there is left as it is",
            gitdir.join("worktrees").display(),
            c.admin_name
        );
    }
    // Opened once: what is checked is what is deleted, whatever is renamed meanwhile.
    let entry = worktrees.as_ref().and_then(|w| {
        git::Entry::open(w.as_fd(), std::ffi::OsStr::new(&c.admin_name))
            .ok()
            .map(|e| (w, e))
    });
    if let (Some((worktrees, entry)), false, true) =
        (entry, live_admin, made.is_none_or(|m| m.admin))
    {
        // Ours: its `locked` file is exactly what this state directory writes, or it was
        // killed while writing that file (a part of it, nothing else in the entry yet).
        let expected = crate::git::admin::admin_lock_text(&state.root);
        let locked = entry
            .read("locked")
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let listed = crate::beneath::list(entry.fd()).unwrap_or_default();
        let only_lock = listed.iter().all(|e| e.name == "locked");
        let ours = match &locked {
            Ok(l) => *l == expected || (only_lock && expected.starts_with(l.as_str())),
            // Killed before its first file was made.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => listed.is_empty(),
            Err(_) => false,
        };
        // And this creation's: its `gitdir`, once written, names this worktree (another
        // entry of this state directory renamed into the name would pass the lock).
        let repo = store.repo_by_id(c.repo_id)?.map(|r| r.name);
        // Half made (still the daemon's, given to its owner last, and without the index
        // written last): whatever its `gitdir` holds.
        let half_made = entry.owner() == nix::unistd::geteuid().as_raw()
            && crate::beneath::stat_at(entry.fd(), std::ffi::OsStr::new("index"))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        let named_here = half_made
            || entry.read("gitdir").is_ok_and(|b| {
                repo.is_some_and(|r| b.ends_with(format!("/{r}/{}/.git\n", c.name).as_bytes()))
            });
        if ours && !named_here {
            tracing::warn!(
                "{what}: git worktree entry {} names another worktree; left as it is",
                admin.display()
            );
        } else if ours {
            entry
                .remove(worktrees.as_fd(), std::ffi::OsStr::new(&c.admin_name))
                .with_context(|| format!("{what}: removing {}", admin.display()))?;
        } else {
            tracing::warn!(
                "{what}: git worktree entry {} is not worktreefs's; left as it is",
                admin.display()
            );
        }
    }
    let branch = c
        .branch
        .as_ref()
        .filter(|b| !live_branch(b) && made.is_none_or(|m| m.branch));
    // Killed while git's library made the branch: its lock file stays and would refuse
    // the branch to the next creation. Removed only after a crash (a creation that failed
    // in process may have failed on someone else's lock) and only when made during this
    // creation (a lock older than the record is someone else's).
    let crashed_branch = c
        .branch
        .as_ref()
        .filter(|b| made.is_none() && !live_branch(b));
    if let Some(b) = crashed_branch {
        let lock = gitdir.join("refs/heads").join(format!("{b}.lock"));
        let rel = format!("refs/heads/{b}.lock");
        // Read and removed beneath the git directory, through no symlink: the repository
        // is its owner's to make anything.
        let top = crate::beneath::open_root(gitdir);
        let read = top
            .as_ref()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))
            .and_then(|t| crate::beneath::read_regular(t.as_fd(), rel.as_bytes(), 4096));
        match read {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Made during the creation and holding nothing, or the base commit it was
            // writing (what git's library puts in a ref's lock before the rename).
            Ok((content, st))
                if st.st_mtime >= c.started_at - 1
                    // A fork records its commit just before it makes the branch: with none
                    // recorded yet, no lock there is this creation's.
                    && !c.base_commit.is_empty()
                    && (content.is_empty()
                        || String::from_utf8_lossy(&content).trim() == c.base_commit) =>
            {
                let (dir, name) = rel.rsplit_once('/').expect("refs/heads/…");
                let top = top.as_ref().expect("read through it");
                crate::beneath::dir(top.as_fd(), dir.as_bytes())
                    .and_then(|d| {
                        crate::beneath::unlink_at(d.as_fd(), std::ffi::OsStr::new(name), false)
                    })
                    .with_context(|| format!("{what}: removing {}", lock.display()))?;
            }
            Ok(_) => tracing::warn!("{what}: {} predates it; left as it is", lock.display()),
            Err(e) => tracing::warn!(
                "{what}: {} could not be read as a lock file ({e}); left as it is",
                lock.display()
            ),
        }
    }
    if let Some(b) = branch {
        if let Ok(repo) = Repository::open(gitdir) {
            let full = format!("refs/heads/{b}");
            let checked_out = git::checked_out_branches(&repo)
                .into_iter()
                .any(|(_, r)| r == full);
            if let Ok(br) = repo.find_branch(b, BranchType::Local) {
                let tip = br.get().target();
                // Made by this creation and untouched since: one reflog entry, its own
                // (written by the creation even where the repository keeps no reflogs).
                let made_here = repo.reflog(&full).is_ok_and(|log| {
                    log.len() == 1
                        && log.get(0).and_then(|e| e.message().map(str::to_string))
                            == Some(branch_log_message(c.worktree_id))
                });
                let at_base = tip.is_some_and(|t| t.to_string() == c.base_commit);
                if made_here && at_base && !checked_out {
                    // Through git (`git::ref_delete`), only while it names that tip.
                    crate::git::ref_delete::delete_ref(gitdir, &full, tip).map_err(|e| {
                        crate::lifecycle::error::failed(format!(
                            "{what}: deleting branch {b}: {e:#}"
                        ))
                    })?;
                } else {
                    tracing::warn!("{what}: branch {b} moved or is checked out since; kept");
                }
            }
        }
    }
    store.end_creation(c)?;
    tracing::info!("rolled back the {what}");
    Ok(())
}

/// At every mount: creations whose creator is gone are rolled back.
pub fn roll_back_dead_creations(state: &StateDir, store: &mut Store) -> LifecycleResult<usize> {
    let mut n = 0;
    for c in store.creations()? {
        if creator_alive(&c) {
            continue;
        }
        let Some(c) = claim(store, &c)? else {
            continue;
        };
        let Some(repo) = store.repo_by_id(c.repo_id)? else {
            store.end_creation(&c)?;
            continue;
        };
        // One that cannot be rolled back now does not keep the others from it.
        match roll_back_creation(state, store, &repo.gitdir, &c) {
            Ok(()) => n += 1,
            Err(e) => tracing::error!("{e:#}"),
        }
    }
    Ok(n)
}
