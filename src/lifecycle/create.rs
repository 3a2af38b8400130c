//! Creating a managed worktree: the git side (branch, admin entry, index), the upper layer,
//! and the row in the store. Either all of it lands or none of it does.

use std::fmt;
use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use git2::{BranchType, Repository};

use crate::git::{self, IndexStat};
use crate::lease::State;
use crate::lifecycle::cleanup::ADMIN_MARKER;
use crate::names::validate_name;
use crate::state::StateDir;
use crate::store::{now_secs, BeginCreation, CreationRow, NewWorktree, Store, WorktreeRow};

pub const META_MOUNTPOINT: &str = "mountpoint";

#[derive(Debug)]
pub enum CreateError {
    InvalidName(String),
    UnknownRepo(String),
    Exists(String),
    BadRevision(String),
    BranchConflict(String),
    /// Nothing kept to restore: what was asked for and where to look.
    NotKept(String),
    /// The worktree named (to fork) does not exist.
    NoWorktree(String),
    /// The worktree named is in a state that does not allow it (forking one that is
    /// deleting or removed): its state and the way out.
    Conflict(String),
    /// The user may not read what the request needs.
    Denied(String),
    /// The disk (the state dir's or the repository's) is full or over quota: the message
    /// and the errno (ENOSPC or EDQUOT).
    NoSpace(String, i32),
    /// Another process holds the database: try again.
    Busy(String),
    Internal(String),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidName(m)
            | CreateError::UnknownRepo(m)
            | CreateError::Exists(m)
            | CreateError::BadRevision(m)
            | CreateError::BranchConflict(m)
            | CreateError::NotKept(m)
            | CreateError::NoWorktree(m)
            | CreateError::Conflict(m)
            | CreateError::Denied(m)
            | CreateError::NoSpace(m, _)
            | CreateError::Busy(m)
            | CreateError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CreateError {}

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
}

/// The mountpoint git's admin entries point at: the one recorded by the last mount, else
/// the default one.
pub fn mountpoint_of(state: &StateDir, store: &Store) -> PathBuf {
    store
        .meta_get(META_MOUNTPOINT)
        .ok()
        .flatten()
        .map(PathBuf::from)
        .unwrap_or_else(|| state.default_mountpoint())
}

pub fn gitfile_path(mountpoint: &Path, repo: &str, name: &str) -> PathBuf {
    mountpoint.join(repo).join(name).join(".git")
}

/// A file system failure of a step: out of space is said as such (ENOSPC through the
/// mount), anything else is internal.
pub(super) fn io_failure(context: &str) -> impl Fn(std::io::Error) -> CreateError + '_ {
    move |e| {
        if crate::git::blobcache::is_out_of_space(&e) {
            CreateError::NoSpace(
                format!("{context}: {e}; free some space and try again"),
                e.raw_os_error().unwrap_or(libc::ENOSPC),
            )
        } else {
            CreateError::Internal(format!("{context}: {e}"))
        }
    }
}

/// A failure with an I/O error somewhere in its chain, judged as `io_failure` does.
pub(super) fn chain_failure(context: &str) -> impl Fn(anyhow::Error) -> CreateError + '_ {
    move |e| {
        let full = e
            .chain()
            .filter_map(|c| c.downcast_ref::<std::io::Error>())
            .find(|io| crate::git::blobcache::is_out_of_space(io))
            .and_then(|io| io.raw_os_error());
        if let Some(errno) = full {
            CreateError::NoSpace(
                format!("{context}: {e:#}; free some space and try again"),
                errno,
            )
        } else {
            CreateError::Internal(format!("{context}: {e:#}"))
        }
    }
}

/// A store failure: a full disk is said as such.
pub(super) fn db_failure(context: &str) -> impl Fn(rusqlite::Error) -> CreateError + '_ {
    move |e| match &e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
            CreateError::NoSpace(
                format!("{context}: {e}; free some space and try again"),
                libc::ENOSPC,
            )
        }
        _ if crate::store::is_busy(&e) => CreateError::Busy(format!(
            "{context}: another process holds the database ({e}); try again in a moment"
        )),
        _ => CreateError::Internal(format!("{context}: {e}")),
    }
}

pub(super) fn internal(context: &str) -> impl Fn(String) -> CreateError + '_ {
    move |e| CreateError::Internal(format!("{context}: {e}"))
}

/// Creates worktree `repo/name`. On any error nothing is left behind: no row, no
/// directory, no git worktree entry, no branch that was not there before.
pub fn create_worktree(
    state: &StateDir,
    store: &mut Store,
    req: &CreateRequest<'_>,
) -> Result<WorktreeRow, CreateError> {
    validate_name("worktree", req.name).map_err(CreateError::InvalidName)?;
    let repo_row = store
        .repo_by_name(req.repo)
        .map_err(|e| internal("reading repositories")(e.to_string()))?
        .ok_or_else(|| unknown_repo(store, req.repo))?;
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
    roll_back_dead(
        state,
        store,
        &repo_row.gitdir,
        |c| c.repo_id == repo_row.id && c.name == req.name,
        |c| {
            CreateError::Exists(format!(
                "worktree '{}/{}' is being created right now by process {}; wait for it, or pick another name",
                req.repo, req.name, c.pid
            ))
        },
    )?;
    if let Some(existing) = store
        .worktree(req.repo, req.name)
        .map_err(|e| internal("reading worktrees")(e.to_string()))?
        .filter(|w| w.state != State::Removed)
    {
        return Err(CreateError::Exists(format!(
            "worktree '{}/{}' already exists (state: {}); pick another name",
            req.repo, req.name, existing.state
        )));
    }
    check_branch_name(req.name, req.branch)?;

    let repo = Repository::open(&repo_row.gitdir).map_err(|e| {
        CreateError::Internal(format!(
            "repository '{}' at {} cannot be opened: {}; check the path or `worktreefs repo remove {}`",
            repo_row.name,
            repo_row.gitdir.display(),
            e.message(),
            repo_row.name
        ))
    })?;

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
    let setting = crate::git::checkout::Setting::of(req.uid, req.gid, &git::common_dir(&repo));
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
        worktree_id: 0,
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
    store
        .worktree(req.repo, req.name)
        .map_err(|e| internal("reading back the worktree")(e.to_string()))?
        .ok_or_else(|| CreateError::Internal("worktree row vanished".into()))
}

/// The refusal of a repository name nobody registered: the registered name closest to it,
/// if one is, else how to register it.
pub(super) fn unknown_repo(store: &Store, repo: &str) -> CreateError {
    let names: Vec<String> = store
        .repos()
        .map(|rows| rows.into_iter().map(|r| r.name).collect())
        .unwrap_or_default();
    let way_out = match crate::names::closest(repo, names.iter().map(String::as_str)) {
        Some(close) => format!("did you mean '{close}'? (see `worktreefs repo list`)"),
        None => format!(
            "add it with `worktreefs repo add PATH --name {repo}` (see `worktreefs repo list`)"
        ),
    };
    CreateError::UnknownRepo(format!("repository '{repo}' is not registered; {way_out}"))
}

/// Refuses, before anything is made, a branch name git would not allow: `branch` when
/// given, else the worktree's `name`, which becomes its branch's.
pub(super) fn check_branch_name(name: &str, branch: Option<&str>) -> Result<(), CreateError> {
    let refused =
        |why: String, way_out: String| Err(CreateError::InvalidName(format!("{why}; {way_out}")));
    match branch {
        Some(b) => crate::names::validate_branch_name(b).or_else(|why| {
            refused(why, "pass another --branch".into())
        }),
        None => crate::names::validate_branch_name(name).or_else(|why| {
            refused(
                format!("worktree name '{name}' would be its new branch's name, and {why}"),
                format!("pick another worktree name, or keep it with --branch OTHER (`worktreefs new REPO/{name} --branch {}`)", suggested_branch(name)),
            )
        }),
    }
}

/// A branch name git allows that is close to `name` (for a way out to print).
fn suggested_branch(name: &str) -> String {
    let mut s = name.replace("..", "-").trim_end_matches('.').to_string();
    while let Some(stem) = s.strip_suffix(".lock") {
        s = format!("{stem}-lock");
    }
    if s == "HEAD" || crate::names::validate_branch_name(&s).is_err() {
        s = format!("wt-{s}");
    }
    s
}

/// Records creation `record` (its admin entry name picked here, one no other entry or
/// creation has) and returns the worktree id reserved for it.
pub(super) fn record_creation(
    store: &mut Store,
    gitdir: &Path,
    record: &mut CreationRow,
    repo: &str,
) -> Result<i64, CreateError> {
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
            Err(BeginCreation::Db(rusqlite::Error::SqliteFailure(f, _)))
                if f.code == rusqlite::ErrorCode::ConstraintViolation && tries < 5 =>
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
pub(super) fn make_branch(
    repo: &Repository,
    branch_name: &str,
    commit: git2::Oid,
    id: i64,
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
    let mountpoint = mountpoint_of(state, store);
    let worktree_path = mountpoint.join(req.repo).join(req.name);
    // Where the snapshot puts files, git must list the directory: its untracked cache
    // entry is written invalid there (the rest stays valid, so git lists nothing else).
    let untr = req
        .warm
        .map(|w| super::warm::untracked_part(state, w, &index.untr));
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
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                CreateError::Exists(format!(
                    "worktree '{}/{}' was created by someone else just now; pick another name",
                    req.repo, req.name
                ))
            }
            rusqlite::Error::QueryReturnedNoRows if req.warm.is_some() => {
                warm_gone(store, req.warm.map(|w| w.id), req.repo, req.name)
                    .unwrap_or_else(|| db_failure("recording the worktree")(e))
            }
            other => db_failure("recording the worktree")(other),
        })
}

/// The error of a creation whose warm snapshot `warm` was pruned while it ran (a newer
/// one was taken, and no worktree showed this one): none if it is still there.
pub(super) fn warm_gone(
    store: &Store,
    warm: Option<i64>,
    repo: &str,
    name: &str,
) -> Option<CreateError> {
    let id = warm?;
    matches!(store.warm(id), Ok(None)).then(|| {
        CreateError::Conflict(format!(
            "warm snapshot {id} was deleted while '{repo}/{name}' was made (a newer one was taken and no worktree showed it); nothing was made: run the command again"
        ))
    })
}

/// git's admin entry of creation `record` (worktree `record.name` of `repo`): HEAD
/// `head`, the index `write_index` writes. `made.admin` says whether a rollback has an
/// entry of this creation's to undo.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_entry(
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
        &admin_lock_text(state),
    )
    .map_err(|e| {
        // Not made (an entry of someone else's already there, a `worktrees/` that cannot
        // be used): nothing of it is ours to undo.
        made.admin = e.downcast_ref::<git::EntryNotMade>().is_none();
        chain_failure("writing the git worktree entry")(e)
    })?;
    made.admin = true;
    Ok(())
}

/// The `locked` file of an admin entry this state directory's worktreefs writes.
pub(super) fn admin_lock_text(state: &StateDir) -> String {
    format!("{ADMIN_MARKER} (state dir {})\n", state.root.display())
}

/// The reflog message of a branch creation `id` makes.
fn branch_log_message(id: i64) -> String {
    format!("worktreefs: created for worktree {id}")
}

pub(super) fn staging_dir(state: &StateDir, id: i64) -> PathBuf {
    state.root.join("worktrees").join(format!(".new-{id}"))
}

/// Whether the process that recorded creation `c` still runs (same pid, same start).
pub(super) fn creator_alive(c: &CreationRow) -> bool {
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
pub(super) fn claim(store: &mut Store, c: &CreationRow) -> rusqlite::Result<Option<CreationRow>> {
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
) -> anyhow::Result<()> {
    roll_back(state, store, gitdir, c, None)
}

/// Rolls back each creation `which` picks that was killed half-way (its creator gone),
/// taking it over first so two rollers never both act; one whose creator still runs is
/// refused with `alive`'s error.
pub(super) fn roll_back_dead(
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

/// What an in-process creation that failed had made itself (a rollback after a crash
/// knows only the record, and judges what it finds).
#[derive(Debug, Default)]
pub(super) struct Made {
    pub branch: bool,
    pub admin: bool,
}

pub(super) fn roll_back(
    state: &StateDir,
    store: &mut Store,
    gitdir: &Path,
    c: &CreationRow,
    made: Option<&Made>,
) -> anyhow::Result<()> {
    use anyhow::Context;
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
        let expected = admin_lock_text(state);
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
            if let Ok(mut br) = repo.find_branch(b, BranchType::Local) {
                let tip = br.get().target().map(|t| t.to_string());
                // Made by this creation and untouched since: one reflog entry, its own
                // (written by the creation even where the repository keeps no reflogs).
                let made_here = repo.reflog(&full).is_ok_and(|log| {
                    log.len() == 1
                        && log.get(0).and_then(|e| e.message().map(str::to_string))
                            == Some(branch_log_message(c.worktree_id))
                });
                if made_here && tip.as_deref() == Some(c.base_commit.as_str()) && !checked_out {
                    br.delete().map_err(|e| {
                        anyhow::anyhow!("{what}: deleting branch {b}: {}", e.message())
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
pub fn roll_back_dead_creations(state: &StateDir, store: &mut Store) -> anyhow::Result<usize> {
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

/// A cached index on disk and what a creation needs to copy it: the worktree-independent
/// part of its untracked cache, and its body's hash state, so that a creation neither
/// reads nor hashes the 10 MB body.
pub(super) struct CachedIndex {
    body: IndexBody,
    /// The body's length: the cached index without its checksum.
    body_len: u64,
    prefix: git::Sha1Prefix,
    /// The body's bytes after the blocks `prefix` covers (fewer than 64).
    tail: Vec<u8>,
    pub(super) untr: Vec<u8>,
    /// The tree's converted files (`git::checkout`), if any: the cache's file, or its
    /// bytes when it could not be cached.
    conversions: Option<Conversions>,
}

enum Conversions {
    File(PathBuf),
    Bytes(Vec<u8>),
}

enum IndexBody {
    /// The cached file, copied into each worktree by the kernel (`copy_file_range`).
    File(fs::File),
    /// In memory, when the cache could not be written.
    Bytes(Vec<u8>),
}

impl CachedIndex {
    fn from_bytes(index: Vec<u8>, untr: Vec<u8>) -> Self {
        let body_len = index.len().saturating_sub(20);
        let prefix = git::Sha1Prefix::of(&index[..body_len]);
        let tail = index[prefix.covered() as usize..body_len].to_vec();
        CachedIndex {
            body: IndexBody::Bytes(index),
            body_len: body_len as u64,
            prefix,
            tail,
            untr,
            conversions: None,
        }
    }

    /// Opens the cached index at `path` with its hash state from `state_path`, computing
    /// (and storing) the state when it is missing or belongs to other content.
    fn open(path: &Path, state_path: &Path, untr: Vec<u8>) -> std::io::Result<Self> {
        use std::os::unix::fs::FileExt;
        let file = fs::File::open(path)?;
        let len = file.metadata()?.len();
        if len < 32 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "cached index too short",
            ));
        }
        let body_len = len - 20;
        // The state file ends with the cached index's own checksum, which names the content.
        let mut checksum = [0u8; 20];
        file.read_exact_at(&mut checksum, body_len)?;
        let saved = fs::read(state_path).ok().and_then(|b| {
            let (state, sum) = b.split_at_checked(git::Sha1Prefix::ENCODED_LEN)?;
            let prefix = git::Sha1Prefix::decode(state)?;
            (sum == checksum && prefix.covered() == body_len / 64 * 64).then_some(prefix)
        });
        let prefix = match saved {
            Some(prefix) => prefix,
            None => {
                // From the file opened above (whose checksum was read), not the path,
                // which another writer may have replaced since.
                let mut bytes = vec![0u8; body_len as usize];
                file.read_exact_at(&mut bytes, 0)?;
                let prefix = git::Sha1Prefix::of(&bytes);
                let saved = [&prefix.encode()[..], &checksum].concat();
                if let Err(e) = crate::durable::write_file_synced(state_path, &saved) {
                    tracing::warn!("could not cache {}: {e}", state_path.display());
                }
                prefix
            }
        };
        let mut tail = vec![0u8; (body_len - prefix.covered()) as usize];
        file.read_exact_at(&mut tail, prefix.covered())?;
        Ok(CachedIndex {
            body: IndexBody::File(file),
            body_len,
            prefix,
            tail,
            untr,
            conversions: None,
        })
    }

    /// Writes the index of the worktree at `worktree_path` to `out`: the body, this
    /// worktree's untracked cache (git ties that cache to the path) and the checksum of both.
    pub(super) fn write_for(
        &self,
        out: &mut fs::File,
        worktree_path: &Path,
        common_dir: &Path,
        untr: Option<&[u8]>,
    ) -> std::io::Result<()> {
        use std::io::{Read, Seek, Write};
        let untr = untr.unwrap_or(&self.untr);
        let ext = crate::git::untracked::extension(worktree_path, common_dir, untr);
        let checksum = self.prefix.finish(&[&self.tail, &ext]);
        match &self.body {
            IndexBody::File(file) => {
                // A file-to-file copy: the standard library uses copy_file_range.
                let mut file = file;
                file.seek(std::io::SeekFrom::Start(0))?;
                let copied = std::io::copy(&mut Read::take(file, self.body_len), out)?;
                if copied != self.body_len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the cached index shrank while it was copied",
                    ));
                }
            }
            IndexBody::Bytes(bytes) => out.write_all(&bytes[..self.body_len as usize])?,
        }
        out.write_all(&ext)?;
        out.write_all(&checksum)
    }

    /// Puts the tree's conversions at `to` (a worktree's `conversions`): a link to the
    /// cache's file, so a creation's cost does not grow with the list.
    pub(super) fn place_conversions(&self, to: &Path) -> std::io::Result<()> {
        match &self.conversions {
            None => Ok(()),
            Some(Conversions::File(from)) => fs::hard_link(from, to)
                .or_else(|_| crate::durable::write_file_synced(to, &fs::read(from)?)),
            Some(Conversions::Bytes(bytes)) => crate::durable::write_file_synced(to, bytes),
        }
    }
}

/// Whether `file` has `index`'s length and ends with its checksum (which covers the rest).
fn same_content(file: &fs::File, index: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut checksum = [0u8; 20];
    index.len() >= 20
        && file.metadata().is_ok_and(|m| m.len() == index.len() as u64)
        && file
            .read_exact_at(&mut checksum, index.len() as u64 - 20)
            .is_ok()
        && checksum[..] == index[index.len() - 20..]
}

/// The mtime and ctime an untouched view reports for every file of a commit made at
/// `commit_time`, seen at `now`: one second before the commit. That is older than any index
/// written once the commit exists (git reads the content of a file whose mtime is not older
/// than its index, taking it as racily clean), and it depends on the commit alone, so the
/// index cache finds the index of a commit made a moment ago on every later creation too.
/// A commit dated ahead of this machine's clock gets one second before `now` instead: its
/// index is then built afresh for each creation, never wrong.
pub(crate) fn view_mtime(commit_time: i64, now: i64) -> i64 {
    (commit_time - 1).min(now - 1).max(1)
}

/// Where `cached_index` keeps the index of `tree` (with this stat data and setting); it
/// was made already when the `untr` file beside it is there.
fn index_cache_key(
    state: &StateDir,
    tree: git2::Oid,
    mtime: i64,
    uid: u32,
    gid: u32,
    setting: &crate::git::checkout::Setting,
) -> PathBuf {
    // Each setting has keys of its own (and indexes cached before conversions were
    // decided are not used: they have no list beside them; nor those cached before blobs
    // that do not survive a checkout were found: `r2`).
    let setting_part = format!("-c{}-r2", setting.fingerprint());
    state.index_cache().join(format!(
        "{tree}-{mtime}-{uid}-{gid}{setting_part}.fsmn.index"
    ))
}

/// Returns the index for `tree` with the given stat data, building and caching it on first
/// use. The cache makes creation cost independent of the repository's size after the first
/// worktree at a commit.
pub(super) fn cached_index(
    state: &StateDir,
    repo: &Repository,
    tree: git2::Oid,
    mtime: i64,
    uid: u32,
    gid: u32,
    setting: &crate::git::checkout::Setting,
) -> Result<CachedIndex, CreateError> {
    let key = index_cache_key(state, tree, mtime, uid, gid, setting);
    let untr_key = key.with_extension("untr");
    let state_key = key.with_extension("sha1");
    let conv_key = key.with_extension("conv");
    if let Ok(untr) = fs::read(&untr_key) {
        match CachedIndex::open(&key, &state_key, untr) {
            Ok(mut cached) => {
                cached.conversions = conv_key.exists().then_some(Conversions::File(conv_key));
                return Ok(cached);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("rebuilding the cached index {}: {e}", key.display()),
        }
    }
    let stat = IndexStat {
        mtime: mtime as u32,
        uid,
        gid,
    };
    crate::durable::sweep_temporaries(&state.index_cache());
    let known = sizes_from_newest_cached_index(state);
    let mut dirs = crate::git::untracked::TreeDirs::default();
    let mut entries = git::index_entries(repo, tree, &known, &mut dirs)
        .map_err(|e| internal("reading the base tree")(format!("{e:#}")))?;
    let conversions = setting
        .decide(repo, &git::common_dir(repo), tree, &mut entries)
        .map_err(|e| internal("deciding what a checkout converts")(format!("{e:#}")))?;
    let index = git::encode_index(
        &entries,
        &stat,
        &[crate::git::fsmonitor::index_extension(
            crate::git::fsmonitor::CREATED_TOKEN,
        )],
    );
    let untr = crate::git::untracked::directories_part(&dirs, &stat);
    let mut cached = CachedIndex::from_bytes(index, untr);
    let mut written = true;
    if let Some(c) = &conversions {
        tracing::info!(
            "tree {tree}: a checkout converts {} file(s) (attributes, filters)",
            c.len()
        );
        let bytes = c.encode();
        // Before the index: a cached index is taken as complete, conversions included.
        if let Err(e) = crate::durable::write_file_synced(&conv_key, &bytes) {
            tracing::warn!("could not cache {}: {e}", conv_key.display());
            written = false;
            cached.conversions = Some(Conversions::Bytes(bytes));
        } else {
            cached.conversions = Some(Conversions::File(conv_key.clone()));
        }
    } else {
        // A list left by an earlier build that was cut short is not this one's.
        let _ = fs::remove_file(&conv_key);
    }
    let IndexBody::Bytes(index) = &cached.body else {
        unreachable!("built in memory")
    };
    let checksum = &index[cached.body_len as usize..];
    let saved = [&cached.prefix.encode()[..], checksum].concat();
    for (path, bytes) in [
        (&untr_key, &cached.untr),
        (&state_key, &saved),
        (&key, index),
    ] {
        if !written {
            break;
        }
        if let Err(e) = crate::durable::write_file_synced(path, bytes) {
            tracing::warn!("could not cache {}: {e}", path.display());
            written = false;
        }
    }
    // Copied from the file just written, this worktree's index is written as the next
    // ones will be (the kernel's copy is several times faster than a write from memory);
    // unless the file there is not the one built here (another writer's, since).
    if written {
        if let Ok(file) = fs::File::open(&key) {
            if same_content(&file, index) {
                cached.body = IndexBody::File(file);
            }
        }
    }
    Ok(cached)
}

/// Blob sizes from the most recently written cached index: usually the same repository a
/// few commits back, so most of a new commit's blobs are known without reading objects.
fn sizes_from_newest_cached_index(state: &StateDir) -> std::collections::HashMap<git2::Oid, u64> {
    let newest = fs::read_dir(state.index_cache())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".index"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    let Some((_, path)) = newest else {
        return Default::default();
    };
    let converted = crate::git::checkout::converted_oids_beside(&path);
    match fs::read(&path) {
        Ok(bytes) => git::decode_index_sizes(&bytes)
            .into_iter()
            .filter(|(oid, _)| !converted.contains(oid))
            .collect(),
        Err(_) => Default::default(),
    }
}

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
        if let Some(entry) = point_admin_entry(
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

/// Writes `want` into the `gitdir` file of git's entry `admin_name` of the repository
/// whose git directory is `gitdir`, when it holds something else; true when it did. The
/// entry is in the repository's owner's hands: what is there now is read only when it is
/// a regular file reached through no symlink (a FIFO would hold the mount), and it is
/// replaced, never written through (a symlink to a file of root's stays untouched). An
/// entry that is gone is left gone.
pub(crate) fn point_admin_entry(
    gitdir: &Path,
    admin_name: &str,
    lock_ok: impl Fn(&[u8]) -> bool,
    place: &str,
    uid: u32,
    want: &str,
) -> Option<git::Entry> {
    let path = git::admin_dir(gitdir, admin_name);
    let worktrees = git::worktrees_dir(gitdir)?;
    let entry = match git::Entry::open(worktrees.as_fd(), std::ffi::OsStr::new(admin_name)) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("could not open git's entry {}: {e}", path.display());
            return None;
        }
    };
    if entry.read("gitdir").is_ok_and(|now| now == want.as_bytes()) {
        return None;
    }
    // Only this worktree's own entry: one renamed into its name (another worktree's, say)
    // pointed here would pass for this one's, and its removal would take it.
    if let Err(why) = entry.check(lock_ok, place, uid) {
        tracing::warn!(
            "git's entry {} {why}; not pointed at the mount (if it is another worktree's, rename it back to that worktree's entry name)",
            path.display()
        );
        return None;
    }
    match crate::beneath::replace_file_at(
        entry.fd(),
        std::ffi::OsStr::new("gitdir"),
        want.as_bytes(),
        0o644,
    ) {
        Ok(()) => Some(entry),
        Err(e) => {
            tracing::warn!(
                "could not point git's entry {} at the mount: {e}",
                path.display()
            );
            None
        }
    }
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

#[cfg(test)]
mod tests {
    use super::view_mtime;

    #[test]
    fn a_commits_view_mtime_does_not_move_with_the_clock() {
        // A commit made this very second, created from now and again two seconds later:
        // the same stat data, so the second creation finds the first one's cached index.
        let made = 1_700_000_000;
        assert_eq!(view_mtime(made, made), view_mtime(made, made + 2));
        assert_eq!(view_mtime(made, made + 1), view_mtime(made, made + 3600));
        // Always older than an index written at `now` or later.
        assert!(view_mtime(made, made) < made);
        // A commit dated ahead of the clock still gets a time in the past.
        assert_eq!(view_mtime(made + 60, made), made - 1);
        // An epoch-dated commit keeps a positive time.
        assert_eq!(view_mtime(0, made), 1);
    }
}
