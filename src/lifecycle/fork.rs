//! `worktreefs new REPO/CHILD --from REPO/PARENT`: a fork of a live worktree. The child
//! is a new worktree on a new branch at the parent's HEAD, with the parent's index and a
//! copy of the parent's upper layer (every uncommitted, untracked and ignored change)
//! over the same base tree. It is recorded and rolled back like any creation
//! (`create/`).
//!
//! The parent keeps running: its upper layer is copied as of one instant where it holds
//! still long enough, file by file otherwise (`layer_copy.rs`); the cost is the parent's
//! changes (the layer's entries and bytes), not the repository's size.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Instant;

use git2::{BranchType, Repository};

use crate::git;
use crate::ids::WorktreeId;
use crate::lease::State;
use crate::lifecycle::cleanup::{git_files, Target};
use crate::lifecycle::create::error::{internal, io_failure, CreateError};
use crate::lifecycle::create::rollback::roll_back;
use crate::lifecycle::create::steps::{
    make_branch, record_creation, staging_dir, write_entry, Made,
};
use crate::lifecycle::create::{mountpoint_of, preconditions};
use crate::lifecycle::layer_copy::{on_walk_stack, Copied, Copier, CopyError, MAX_COPIES};
use crate::state::StateDir;
use crate::store::{now_secs, CreationRow, ErrorKind, NewWorktree, Store, WorktreeRow};

pub struct ForkRequest<'a> {
    pub repo: &'a str,
    /// The new worktree.
    pub name: &'a str,
    /// The worktree forked.
    pub from: &'a str,
    /// The new branch (default: the new worktree's name).
    pub branch: Option<&'a str>,
    /// Who forks (the command's effective user).
    pub uid: u32,
    pub gid: u32,
}

/// A fork done: the new worktree, the commit its branch starts at, what was copied and
/// what the user should know.
pub struct Forked {
    pub row: WorktreeRow,
    pub head: git2::Oid,
    pub copied: Copied,
    pub notes: Vec<String>,
}

/// Forks `req.from` as `req.name`. On any error nothing is left behind and the parent is
/// as it was.
pub fn fork_worktree(
    state: &StateDir,
    store: &mut Store,
    req: &ForkRequest<'_>,
) -> Result<Forked, CreateError> {
    let started = Instant::now();
    let label = format!("{}/{}", req.repo, req.from);
    preconditions::check_name(req.name)?;
    preconditions::check_branch_name(req.name, req.branch)?;
    let repo_row = preconditions::registered_repo(store, req.repo)?;
    let branch_name = req.branch.unwrap_or(req.name).to_string();
    let parent_of = |store: &Store| -> Result<WorktreeRow, CreateError> {
        let row = store
            .worktree(req.repo, req.from)
            .map_err(|e| internal("reading worktrees")(e.to_string()))?;
        match row {
            None => Err(CreateError::NoWorktree(format!(
                "worktree '{label}' does not exist; see `worktreefs list` for the worktrees to fork"
            ))),
            Some(w) if w.state == State::Removed => Err(CreateError::Conflict(format!(
                "worktree '{label}' is removed; bring it back with `worktreefs restore {label}` and fork it then, or fork another"
            ))),
            Some(w) if w.state == State::Deleting || w.removal.is_some() => {
                Err(CreateError::Conflict(format!(
                    "worktree '{label}' is being cleaned up (state: {}); it cannot be forked now: fork another, or restore it once it is removed (`worktreefs restore {label}`)",
                    w.state
                )))
            }
            Some(w) => Ok(w),
        }
    };
    let parent = parent_of(store)?;
    if req.uid != 0 && req.uid != parent.uid {
        return Err(CreateError::Denied(format!(
            "worktree '{label}' belongs to uid {}, and uid {} may not read it; fork it as its owner or as root",
            parent.uid, req.uid
        )));
    }
    preconditions::name_free(state, store, &repo_row, req.name, None)?;
    let repo = preconditions::open_repo(&repo_row)?;
    let gitdir = git::common_dir(&repo);
    let mountpoint = mountpoint_of(state, store);
    let t = Target::new(state, &parent, &repo_row, &mountpoint);
    // A first look, before anything is made: HEAD names a commit, the branch is new.
    let (head, _) = git_files(&t, &label)?;
    let (_, taken) = resolve(&gitdir, &head, &branch_name, &label)?;
    if taken {
        return Err(CreateError::BranchConflict(format!(
            "branch '{branch_name}' already exists in repository '{}'; a fork starts a new branch: pass --branch NEW-BRANCH",
            req.repo
        )));
    }
    // The parent's removal waits for the fork (its cleanup takes this lock), and a fork
    // does not start under one.
    // Shared: two forks of one parent run at once; a removal takes it exclusively.
    let _lock = crate::lifecycle::cleanup::try_lock_shared(state, parent.id).ok_or_else(|| {
        CreateError::Conflict(format!(
            "worktree '{label}' is being cleaned up right now; fork another, or try again in a moment"
        ))
    })?;
    let parent = parent_of(store)?;
    let mut notes = Vec::new();
    // The child belongs to who forks; root forks for the parent's owner.
    let (uid, gid) = if req.uid == 0 {
        (parent.uid, parent.gid)
    } else {
        (req.uid, req.gid)
    };

    let me = crate::process::info::proc_info(std::process::id() as i32);
    let mut record = CreationRow {
        worktree_id: WorktreeId(0),
        repo_id: repo_row.id,
        name: req.name.to_string(),
        branch: Some(branch_name.clone()),
        // What a rollback compares the branch it made with: set once HEAD is read for
        // good, before the branch is made.
        base_commit: String::new(),
        admin_name: String::new(),
        pid: std::process::id() as i32,
        pid_start: me.map(|p| p.start).unwrap_or(0),
        started_at: now_secs(),
        restored_from: None,
    };
    record.worktree_id = record_creation(store, &gitdir, &mut record, req.repo)?;
    let mut made = Made::default();
    let plan = Plan {
        parent: &parent,
        target: &t,
        label: &label,
        branch: &branch_name,
        owner: (uid, gid),
        mountpoint: &mountpoint,
    };
    let r = make(
        state,
        store,
        &repo,
        &mut record,
        &plan,
        &mut made,
        &mut notes,
    );
    if let Err(e) = &r {
        if let Err(undo) = roll_back(state, store, &gitdir, &record, Some(&made)) {
            tracing::error!(
                "fork of {label} as {} failed ({e}) and could not be rolled back ({undo:#}); the next mount rolls it back",
                req.name
            );
        }
    }
    let (mut copied, head_commit) = r?;
    copied.took = started.elapsed();
    let row = store
        .worktree_by_id(record.worktree_id)
        .map_err(|e| internal("reading back the worktree")(e.to_string()))?
        .ok_or_else(|| CreateError::Internal("forked worktree row vanished".into()))?;
    let _ = store.add_event(
        row.id,
        "forked",
        &format!(
            "forked from {label} (worktree {}) at {head_commit}: {} file(s), {} byte(s) copied in {} walk(s)",
            parent.id, copied.files, copied.bytes, copied.walks
        ),
    );
    tracing::info!(
        "forked {label} as {}/{} (worktree {}): {} files, {} bytes, {} walks",
        row.repo,
        row.name,
        row.id,
        copied.files,
        copied.bytes,
        copied.walks,
    );
    // Without ports (the log says why) it is made all the same.
    let _ = crate::lifecycle::ports::give(state, store, row.id, None);
    Ok(Forked {
        row,
        head: head_commit,
        copied,
        notes,
    })
}

/// git's `HEAD` and `index` of the parent, read through its checked entry; a split index
/// is refused (half of it is in a file of the parent's own entry).
fn git_files(t: &Target, label: &str) -> Result<(String, Option<Vec<u8>>), CreateError> {
    let (head, index) = git_files::git_files_of(t)
        .map_err(|why| CreateError::Internal(format!("reading git's files of '{label}': {why}")))?;
    if index
        .as_deref()
        .is_some_and(|i| crate::git::fsmonitor::has_extension(i, b"link"))
    {
        return Err(CreateError::Conflict(format!(
            "the index of '{label}' is split (core.splitIndex), which a fork cannot copy; run `git config core.splitIndex false && git update-index --no-split-index` in it, then fork again"
        )));
    }
    Ok((head, index))
}

/// The commit `head` (a HEAD file's text) names and whether branch `branch` exists,
/// resolved as the repository's owner and bounded: a ref the owner made a FIFO would
/// block root for good.
fn resolve(
    gitdir: &Path,
    head: &str,
    branch: &str,
    label: &str,
) -> Result<(git2::Oid, bool), CreateError> {
    let (dir, h, b) = (gitdir.to_path_buf(), head.to_string(), branch.to_string());
    let (commit, taken) =
        crate::git::owner::as_owner_of(gitdir, move || -> crate::git::GitResult<_> {
            let repo = Repository::open(&dir)?;
            let commit = git_files::commit_of_head(&repo, &h);
            let taken = repo.find_branch(&b, BranchType::Local).is_ok();
            Ok((commit, taken))
        })
        .map_err(|e| CreateError::Internal(format!("resolving the HEAD of '{label}': {e:#}")))?;
    let commit = commit.ok_or_else(|| {
        CreateError::BadRevision(format!(
            "the HEAD of '{label}' ({}) names no commit; commit there first",
            head.trim()
        ))
    })?;
    Ok((commit, taken))
}

struct Plan<'a> {
    parent: &'a WorktreeRow,
    target: &'a Target,
    label: &'a str,
    branch: &'a str,
    owner: (u32, u32),
    mountpoint: &'a Path,
}

/// How many times a fork reads the parent's HEAD and index around a settled copy of its
/// layer before it gives up on a parent whose git files keep changing.
const MAX_GIT_READS: u32 = 5;

/// The steps of a recorded fork: the copied upper layer (made under `.new-<id>`), the
/// parent's HEAD and index read again around it until neither changed while the layer
/// held still, the branch at that HEAD, git's entry with that index, the layer put at
/// `<id>`, and the row. What was copied, and the commit the branch starts at.
fn make(
    state: &StateDir,
    store: &mut Store,
    repo: &Repository,
    record: &mut CreationRow,
    p: &Plan<'_>,
    made: &mut Made,
    notes: &mut Vec<String>,
) -> Result<(Copied, git2::Oid), CreateError> {
    let gitdir = git::common_dir(repo);
    let repo_name = p.parent.repo.as_str();
    let id = record.worktree_id;
    let staging = staging_dir(state, id);
    fs::create_dir_all(staging.join("upper"))
        .and_then(|_| fs::create_dir_all(staging.join("work")))
        .map_err(io_failure("creating the upper layer"))?;
    let from_dir = state.worktree_dir(p.parent.id);
    // The daemon's own files of the parent: which base files a checkout converts, whether
    // submodules show, whether the layer is in format 2.
    for (name, to) in [
        (
            crate::state::CONVERSIONS_FILE,
            staging.join(crate::state::CONVERSIONS_FILE),
        ),
        ("submodules", staging.join("submodules")),
        ("work/format-2", staging.join("work/format-2")),
    ] {
        let from = from_dir.join(name);
        match fs::read(&from) {
            Ok(bytes) => crate::durable::write_file_synced(&to, &bytes)
                .map_err(io_failure("copying the parent's records"))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_failure("reading the parent's records")(e)),
        }
    }
    if fs::read_dir(from_dir.join("subs")).is_ok_and(|mut d| d.next().is_some()) {
        notes.push(format!(
            "the submodule views of {} are made anew in the fork when first looked at (their own changes are not copied)",
            p.label
        ));
    }
    if crate::checkpoint::Checkpoints::read(&state.checkpoints(p.parent.id))
        .is_ok_and(|kept| !kept.is_empty())
    {
        notes.push(format!(
            "the checkpoints of {} are not copied: the fork starts with none (they stay with {}, to rewind it)",
            p.label, p.label
        ));
    }
    let copy_error = |e: CopyError| {
        match e {
        CopyError::Io(what, e) if e.raw_os_error() == Some(libc::EACCES) => {
            CreateError::Denied(format!(
                "{what} of '{}': {e}; the fork must read every changed file: fork as its owner or as root",
                p.label
            ))
        }
        CopyError::Io(what, e) => io_failure(&format!("{what} of '{}'", p.label))(e),
        CopyError::NeverStill(path) => CreateError::Busy(format!(
            "{} of '{}' changed during each of {MAX_COPIES} copies; pause what writes it, then fork again",
            String::from_utf8_lossy(&path),
            p.label
        )),
    }
    };
    let mut copier = Copier::new(
        &from_dir.join("upper"),
        &from_dir.join("work"),
        &staging.join("upper"),
        &staging.join("work"),
        nix::unistd::geteuid().is_root(),
    )
    .map_err(copy_error)?;
    // The layer settled between two reads of git's files that agree: HEAD, index and
    // files are the parent's as of one instant.
    // What HEAD names is part of each read: a commit, reset or amend moves the branch
    // and leaves the HEAD file as it was.
    let read = || -> Result<_, CreateError> {
        let (head, index) = git_files(p.target, p.label)?;
        let (commit, taken) = resolve(&gitdir, &head, p.branch, p.label)?;
        Ok((head, commit, index, taken))
    };
    let mut git_files_now = read()?;
    let mut reads = 1;
    let (_head, head_commit, index, taken) = loop {
        on_walk_stack(|| copier.settle()).map_err(copy_error)?;
        let again = read()?;
        reads += 1;
        if again.0 == git_files_now.0 && again.1 == git_files_now.1 && again.2 == git_files_now.2 {
            break again;
        }
        if reads > MAX_GIT_READS {
            return Err(CreateError::Busy(format!(
                "git's HEAD or index of '{}' changed during each of {MAX_GIT_READS} copies of its files (a commit or `git add` running there); fork again once it is done",
                p.label
            )));
        }
        git_files_now = again;
    };
    let copied = copier.finish().map_err(copy_error)?;
    if !copied.settled {
        notes.push(format!(
            "{} changed all through the fork ({} walks of its files, the last saw {} change): each file is whole as of one instant, not all of the same one, and a name it removed or moved meanwhile may show at its old place too",
            p.label,
            copied.walks,
            copied.last_change.as_deref().unwrap_or("?")
        ));
    }
    if taken {
        return Err(CreateError::BranchConflict(format!(
            "branch '{}' was made by someone else during the fork; fork again with --branch NEW-BRANCH",
            p.branch
        )));
    }
    record.base_commit = head_commit.to_string();
    store
        .set_creation_base(record)
        .map_err(crate::lifecycle::create::error::db_failure(
            "recording the fork's commit",
        ))?;
    make_branch(repo, p.branch, head_commit, id)?;
    made.branch = true;

    let worktree_path = p.mountpoint.join(repo_name).join(&record.name);
    let index = match index {
        Some(b) => crate::git::untracked::retarget(&b, &worktree_path).unwrap_or(b),
        None => {
            notes.push(format!(
                "the index of {} was not found (its git entry is gone): the fork's is HEAD's tree, and git looks at every file once",
                p.label
            ));
            crate::git::index::index_of_commit(repo, head_commit, &staging.join("index.made"))
                .map_err(|e| CreateError::Internal(format!("making an index: {e:#}")))?
        }
    };
    write_entry(
        state,
        p.mountpoint,
        &gitdir,
        record,
        repo_name,
        p.owner,
        &format!("ref: refs/heads/{}", p.branch),
        |out| io::Write::write_all(out, &index),
        made,
    )?;
    fs::rename(&staging, state.worktree_dir(id)).map_err(io_failure("placing the upper layer"))?;
    store
        .finish_creation(
            record,
            &NewWorktree {
                repo_id: record.repo_id,
                name: &record.name,
                branch: Some(p.branch),
                branch_created: true,
                base_commit: &p.parent.base_commit,
                base_tree: &p.parent.base_tree,
                base_mtime: p.parent.base_mtime,
                uid: p.owner.0,
                gid: p.owner.1,
                admin_name: &record.admin_name,
                warm: p.parent.warm,
            },
        )
        .map_err(|e| match e.kind() {
            ErrorKind::Taken => CreateError::Exists(format!(
                "worktree '{}/{}' was created by someone else just now; pick another name",
                repo_name, record.name
            )),
            ErrorKind::NotFound if p.parent.warm.is_some() => {
                crate::lifecycle::create::preconditions::warm_gone(
                    store,
                    p.parent.warm,
                    repo_name,
                    &record.name,
                )
                .unwrap_or_else(|| {
                    crate::lifecycle::create::error::db_failure("recording the worktree")(e)
                })
            }
            _ => crate::lifecycle::create::error::db_failure("recording the worktree")(e),
        })?;
    Ok((copied, head_commit))
}
