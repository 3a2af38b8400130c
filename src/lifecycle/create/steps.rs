//! The steps every creation takes, each undoable: its record (the id and admin entry
//! name reserved), the branch, git's admin entry, the staging directory.

use std::fs;
use std::path::{Path, PathBuf};

use git2::Repository;

use crate::git::{self};
use crate::state::StateDir;
use crate::store::{BeginCreation, CreationRow, ErrorKind, Store};

use super::error::{db_failure, git_failure, internal, CreateError};
use super::mountpoint::gitfile_path;
use crate::ids::WorktreeId;

/// Records creation `record` (its admin entry name picked here, one no other entry or
/// creation has) and returns the worktree id reserved for it.
pub(crate) fn record_creation(
    store: &mut Store,
    gitdir: &Path,
    record: &mut CreationRow,
    repo: &str,
) -> Result<WorktreeId, CreateError> {
    // Two creations at once may pick one admin name (`foo` and `foo1` both choosing
    // `wtfs-foo1`, say): the second's record is refused by the name's uniqueness, and it
    // picks again.
    let mut tries = 0;
    let id = loop {
        let taken = store
            .creation_admin_names(record.repo_id)
            .map_err(|e| internal("reading creations")(e.to_string()))?;
        record.admin_name = git::free_admin_name_except(gitdir, &record.name.clone(), &taken);
        match store.begin_creation(record) {
            Ok(id) => break id,
            Err(BeginCreation::Exists(state)) => {
                return Err(CreateError::Exists(format!(
                    "worktree '{}/{}' already exists (state: {state}); pick another name",
                    repo, record.name
                )))
            }
            Err(BeginCreation::InProgress(other)) => {
                return Err(CreateError::Exists(format!(
                    "worktree '{}/{}' is being created right now by process {}; wait for it, or pick another name",
                    repo, record.name, other.pid
                )))
            }
            Err(BeginCreation::Db(e)) if e.kind() == ErrorKind::Taken && tries < 5 =>
            {
                tries += 1;
            }
            Err(BeginCreation::Db(e)) => return Err(db_failure("recording the creation")(e)),
        }
    };
    Ok(id)
}

/// Makes branch `branch_name` at `commit` for creation `id`, with a reflog entry of that
/// creation's own: a rollback deletes the branch only if its whole history is that entry.
pub(crate) fn make_branch(
    repo: &Repository,
    branch_name: &str,
    commit: git2::Oid,
    id: WorktreeId,
) -> Result<(), CreateError> {
    // With a reflog message of this creation's own: a rollback deletes the branch only
    // if its whole history is this one entry (no one else made or moved it).
    repo.reference(
        &format!("refs/heads/{branch_name}"),
        commit,
        false,
        &branch_log_message(id),
    )
    .map_err(|e| {
        // libgit2 keeps no errno: a full disk shows in its message only.
        let msg = e.message();
        let errno = if msg.contains("No space left on device") {
            Some(libc::ENOSPC)
        } else if msg.contains("Disk quota exceeded") {
            Some(libc::EDQUOT)
        } else {
            None
        };
        match errno {
            Some(errno) => CreateError::NoSpace(
                format!(
                    "cannot create branch '{branch_name}': {msg}; free some space and try again"
                ),
                errno,
            ),
            None => {
                CreateError::BranchConflict(format!("cannot create branch '{branch_name}': {msg}"))
            }
        }
    })?;
    // The reflog entry a rollback recognises, written even where the repository keeps
    // no reflogs (a bare one, `core.logAllRefUpdates=false`).
    let full = format!("refs/heads/{branch_name}");
    if let Ok(mut log) = repo.reflog(&full) {
        if log.is_empty() {
            if let Ok(sig) = git2::Signature::now("worktreefs", "worktreefs@localhost") {
                let _ = log.append(commit, &sig, Some(&branch_log_message(id)));
                let _ = log.write();
            }
        }
    }
    Ok(())
}

/// git's admin entry of creation `record` (worktree `record.name` of `repo`): HEAD
/// `head`, the index `write_index` writes. `made.admin` says whether a rollback has an
/// entry of this creation's to undo.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_entry(
    state: &StateDir,
    mountpoint: &Path,
    gitdir: &Path,
    record: &CreationRow,
    repo: &str,
    owner: (u32, u32),
    head: &str,
    write_index: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
    made: &mut Made,
) -> Result<(), CreateError> {
    git::write_admin_entry(
        gitdir,
        &record.admin_name,
        owner,
        head,
        &gitfile_path(mountpoint, repo, &record.name),
        write_index,
        &crate::git::admin::admin_lock_text(&state.root),
    )
    .map_err(|e| {
        // Not made (an entry of someone else's already there, a `worktrees/` that cannot
        // be used): nothing of it is ours to undo.
        made.admin = e.kind() != git::GitErrorKind::EntryNotMade;
        git_failure("writing the git worktree entry")(e)
    })?;
    made.admin = true;
    Ok(())
}

/// The reflog message of a branch creation `id` makes.
pub(crate) fn branch_log_message(id: WorktreeId) -> String {
    format!("worktreefs: created for worktree {id}")
}

pub(crate) fn staging_dir(state: &StateDir, id: WorktreeId) -> PathBuf {
    state.root.join("worktrees").join(format!(".new-{id}"))
}

/// What an in-process creation that failed had made itself (a rollback after a crash
/// knows only the record, and judges what it finds).
#[derive(Debug, Default)]
pub(crate) struct Made {
    pub branch: bool,
    pub admin: bool,
}
