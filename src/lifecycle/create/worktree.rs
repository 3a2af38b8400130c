//! Creating a managed worktree: the git side (branch, admin entry, index), the upper
//! layer, and the row in the store. Either all of it lands or none of it does.

use std::fs;

use git2::{BranchType, Repository};

use crate::git::{self};
use crate::state::StateDir;
use crate::store::{now_secs, CreationRow, ErrorKind, NewWorktree, Store, WorktreeRow};

use super::error::{db_failure, internal, io_failure, CreateError};
use super::index_cache::{cached_index, index_cache_key, view_mtime, CachedIndex};
use super::preconditions::{
    check_branch_name, check_name, name_free, open_repo, registered_repo, warm_gone,
};
use super::rollback::roll_back;
use super::steps::{make_branch, record_creation, staging_dir, write_entry, Made};
use crate::ids::WorktreeId;

pub struct CreateRequest<'a> {
    pub repo: &'a str,
    pub name: &'a str,
    pub base: Option<&'a str>,
    pub branch: Option<&'a str>,
    pub uid: u32,
    pub gid: u32,
    /// Show initialized submodules as views of their own (`new --submodules`); without
    /// it, the repository's `worktreefs.submodules` setting decides.
    pub submodules: bool,
    /// The warm snapshot it shows (`new --warm`), taken before.
    pub warm: Option<&'a crate::store::WarmRow>,
    /// Told what the creation is doing at each step that can take a while (the CLI says
    /// it when the creation takes over a second).
    pub progress: Option<&'a (dyn Fn(&str) + Sync)>,
    /// How long one run of git as the owner may take (reading their configuration for
    /// the conversions a checkout makes): `mount --filter-timeout` in the daemon.
    pub filter_timeout: std::time::Duration,
}

/// Creates worktree `repo/name`. On any error nothing is left behind: no row, no
/// directory, no git worktree entry, no branch that was not there before.
pub fn create_worktree(
    state: &StateDir,
    store: &mut Store,
    req: &CreateRequest<'_>,
) -> Result<WorktreeRow, CreateError> {
    check_name(req.name)?;
    let repo_row = registered_repo(store, req.repo)?;
    // A snapshot holds what its taker could read: it is shown to that user alone (in
    // worktrees they own), never to another who could not read the files.
    if let Some(w) = req.warm {
        if w.repo_id != repo_row.id || w.uid != req.uid {
            return Err(CreateError::Denied(format!(
                "warm snapshot {} was taken with the permissions of uid {} (repository {}): it is not shown in a worktree of uid {} of {}; take one as that user (`worktreefs warm {}`)",
                w.id, w.uid, w.repo_id, req.uid, req.repo, req.repo
            )));
        }
    }
    // A creation of this name that was killed half-way is rolled back first; one that is
    // still running makes this one wait its turn.
    name_free(state, store, &repo_row, req.name, None)?;
    check_branch_name(req.name, req.branch)?;
    let repo = open_repo(&repo_row)?;

    // Branch and base.
    let branch_name = req.branch.unwrap_or(req.name).to_string();
    let existing_branch = repo.find_branch(&branch_name, BranchType::Local).ok();
    let base_rev = match (req.base, &existing_branch) {
        (Some(b), _) => b.to_string(),
        (None, Some(_)) => format!("refs/heads/{branch_name}"),
        (None, None) => "HEAD".to_string(),
    };
    let base = git::resolve_base(&repo, &base_rev).map_err(|e| {
        CreateError::BadRevision(format!(
            "{e}; pass --base with a commit, branch or tag that exists"
        ))
    })?;
    if let Some(br) = &existing_branch {
        if req.branch.is_none() {
            // --branch is a way out only while no other worktree has the branch.
            return Err(CreateError::BranchConflict(
                match git::checked_out_in(&repo, &branch_name) {
                    Some(holder) => format!(
                        "branch '{branch_name}' already exists in repository '{}' and is checked out in {holder}; a worktree needs a branch of its own: pick another name (`worktreefs new {}/{branch_name}-2` starts a branch from HEAD, add --base {branch_name} to start from it)",
                        req.repo, req.repo
                    ),
                    None => format!(
                        "branch '{branch_name}' already exists in repository '{}'; pass --branch {branch_name} to work on it, or choose another worktree name",
                        req.repo
                    ),
                },
            ));
        }
        let tip = br.get().target();
        if tip != Some(base.commit) {
            return Err(CreateError::BranchConflict(format!(
                "branch '{branch_name}' exists at {} but --base resolves to {}; drop --base to start from the branch, or pick a new branch name",
                tip.map(|t| t.to_string()).unwrap_or_default(),
                base.commit
            )));
        }
        if let Some(holder) = git::checked_out_in(&repo, &branch_name) {
            return Err(CreateError::BranchConflict(format!(
                "branch '{branch_name}' is already checked out in {holder}; choose another branch"
            )));
        }
    }

    // Index, built once per (tree, stat data) and kept in the state dir's cache.
    let base_mtime = view_mtime(base.commit_time, now_secs());
    // What a checkout would convert is decided with the index (once per tree and setting).
    let setting = crate::git::checkout::Setting::of(
        req.uid,
        req.gid,
        &git::common_dir(&repo),
        req.filter_timeout,
    );
    if let Some(p) = req.progress {
        let short = &base.commit.to_string()[..12];
        let key = index_cache_key(state, base.tree, base_mtime, req.uid, req.gid, &setting);
        if key.with_extension("untr").exists() {
            p(&format!("reading the cached index of the tree at {short}"));
        } else {
            p(&format!(
                "building the index of the tree at {short}: the first worktree at a commit reads its whole tree (once; later ones reuse it)"
            ));
        }
    }
    let index = cached_index(
        state, &repo, base.tree, base_mtime, req.uid, req.gid, &setting,
    )?;

    // Recorded before the first step: the id, the branch it makes, git's admin entry.
    // Killed at any point from here, the next mount or the next creation of this name
    // rolls back exactly these (`roll_back_creation`).
    let gitdir = git::common_dir(&repo);
    let me = crate::process::info::proc_info(std::process::id() as i32);
    let mut record = CreationRow {
        worktree_id: WorktreeId(0),
        repo_id: repo_row.id,
        name: req.name.to_string(),
        branch: existing_branch.is_none().then(|| branch_name.clone()),
        base_commit: base.commit.to_string(),
        admin_name: String::new(),
        pid: std::process::id() as i32,
        pid_start: me.map(|p| p.start).unwrap_or(0),
        started_at: now_secs(),
        restored_from: None,
    };
    record.worktree_id = record_creation(store, &gitdir, &mut record, req.repo)?;
    if let Some(p) = req.progress {
        p("writing the worktree's index, branch and git's entry for it");
    }
    let mut progress = Made::default();
    let made = make_recorded(
        state,
        store,
        &repo,
        &record,
        req,
        &base,
        base_mtime,
        &index,
        &mut progress,
    );
    if let Err(e) = &made {
        if let Err(undo) = roll_back(state, store, &gitdir, &record, Some(&progress)) {
            tracing::error!(
                "creation of {}/{} failed ({e}) and could not be rolled back ({undo:#}); the next mount rolls it back",
                req.repo,
                req.name
            );
        }
    }
    made?;
    // Without ports (the log says why) it is made all the same.
    let _ = crate::lifecycle::ports::give(state, store, record.worktree_id, None);
    store
        .worktree(req.repo, req.name)
        .map_err(|e| internal("reading back the worktree")(e.to_string()))?
        .ok_or_else(|| CreateError::Internal("worktree row vanished".into()))
}

/// The steps of a recorded creation, in order: the branch, git's admin entry, the upper
/// layer (made under `.new-<id>`, then put at `<id>`), and the row, which replaces the
/// record in one transaction.
#[allow(clippy::too_many_arguments)]
fn make_recorded(
    state: &StateDir,
    store: &mut Store,
    repo: &Repository,
    record: &CreationRow,
    req: &CreateRequest<'_>,
    base: &git::ResolvedBase,
    base_mtime: i64,
    index: &CachedIndex,
    made: &mut Made,
) -> Result<(), CreateError> {
    let branch_name = req.branch.unwrap_or(req.name).to_string();
    if record.branch.is_some() {
        make_branch(repo, &branch_name, base.commit, record.worktree_id)?;
        made.branch = true;
    }

    let gitdir = git::common_dir(repo);
    let mountpoint = super::mountpoint::mountpoint_of(state, store);
    let worktree_path = mountpoint.join(req.repo).join(req.name);
    // Where the snapshot puts files, git must list the directory: its untracked cache
    // entry is written invalid there (the rest stays valid, so git lists nothing else).
    let untr = req
        .warm
        .map(|w| crate::lifecycle::warm::untracked_part(state, w, &index.untr));
    write_entry(
        state,
        &mountpoint,
        &gitdir,
        record,
        req.repo,
        (req.uid, req.gid),
        &format!("ref: refs/heads/{branch_name}"),
        |out| index.write_for(out, &worktree_path, &gitdir, untr.as_deref()),
        made,
    )?;

    let id = record.worktree_id;
    let staging = staging_dir(state, id);
    fs::create_dir_all(staging.join("upper"))
        .and_then(|_| fs::create_dir_all(staging.join("work")))
        .map_err(io_failure("creating the upper layer"))?;
    index
        .place_conversions(&staging.join(crate::state::CONVERSIONS_FILE))
        .map_err(io_failure("recording what a checkout converts"))?;
    let submodules = req.submodules
        || repo
            .config()
            .and_then(|c| c.get_bool("worktreefs.submodules"))
            .unwrap_or(false);
    if submodules {
        fs::write(staging.join("submodules"), b"1\n")
            .map_err(io_failure("recording that submodules show"))?;
    }
    let _ = nix::unistd::chown(
        &staging.join("upper"),
        Some(nix::unistd::Uid::from_raw(req.uid)),
        Some(nix::unistd::Gid::from_raw(req.gid)),
    );
    fs::rename(&staging, state.worktree_dir(id)).map_err(io_failure("placing the upper layer"))?;

    let commit_s = base.commit.to_string();
    let tree_s = base.tree.to_string();
    store
        .finish_creation(
            record,
            &NewWorktree {
                repo_id: record.repo_id,
                name: req.name,
                branch: Some(&branch_name),
                branch_created: record.branch.is_some(),
                base_commit: &commit_s,
                base_tree: &tree_s,
                base_mtime,
                uid: req.uid,
                gid: req.gid,
                admin_name: &record.admin_name,
                warm: req.warm.map(|w| w.id),
            },
        )
        .map_err(|e| match e.kind() {
            ErrorKind::Taken => CreateError::Exists(format!(
                "worktree '{}/{}' was created by someone else just now; pick another name",
                req.repo, req.name
            )),
            ErrorKind::NotFound if req.warm.is_some() => {
                warm_gone(store, req.warm.map(|w| w.id), req.repo, req.name)
                    .unwrap_or_else(|| db_failure("recording the worktree")(e))
            }
            _ => db_failure("recording the worktree")(e),
        })
}
