//! `worktreefs restore`: a removed worktree brought back from its kept copy
//! (`cleanup/keep/`), as a creation whose upper layer, index and HEAD are the kept
//! ones. It is recorded and rolled back like any creation (`create.rs`), except that the
//! kept directory goes back where it was kept instead of being deleted.

use std::fs;

use git2::{BranchType, Oid, Repository};

use crate::git;
use crate::ids::WorktreeId;
use crate::lifecycle::cleanup::keep::{self, KEPT_DIR};
use crate::lifecycle::create::error::{internal, io_failure, CreateError};
use crate::lifecycle::create::rollback::roll_back;
use crate::lifecycle::create::steps::{make_branch, record_creation, write_entry, Made};
use crate::lifecycle::create::{mountpoint_of, preconditions};
use crate::state::StateDir;
use crate::store::{now_secs, CreationRow, ErrorKind, KeptRow, NewWorktree, Store, WorktreeRow};

pub struct RestoreRequest<'a> {
    pub repo: &'a str,
    pub name: &'a str,
    /// Restore under this name instead (`--as`).
    pub as_name: Option<&'a str>,
    /// Which kept copy, when the name was removed more than once (default: the newest).
    pub id: Option<WorktreeId>,
}

/// A restore done: the worktree as it now is, the copy it came from, and what the user
/// should know (a branch made again, one that moved, views made anew).
pub struct Restored {
    pub row: WorktreeRow,
    pub from: KeptRow,
    pub notes: Vec<String>,
}

/// Restores a kept copy. On any error nothing is left behind, and the copy is kept as it
/// was.
pub fn restore_worktree(
    state: &StateDir,
    store: &mut Store,
    req: &RestoreRequest<'_>,
) -> Result<Restored, CreateError> {
    let label = format!("{}/{}", req.repo, req.name);
    let new_name = req.as_name.unwrap_or(req.name);
    preconditions::check_name(new_name)?;
    let repo_row = preconditions::registered_repo(store, req.repo)?;
    let kept = store
        .kept()
        .map_err(|e| internal("reading kept removals")(e.to_string()))?
        .into_iter()
        .filter(|k| k.repo == req.repo && k.worktree == req.name)
        .rfind(|k| req.id.is_none_or(|id| id == k.worktree_id))
        .ok_or_else(|| {
            CreateError::NotKept(match req.id {
                Some(id) => format!(
                    "no removed worktree {label} with id {id} is kept; see `worktreefs removed`"
                ),
                None => format!(
                    "no removed worktree {label} is kept (never removed, restored already, or purged); see `worktreefs removed`"
                ),
            })
        })?;
    let from = kept.worktree_id;
    // A purge (or another restore) of it waits, and is waited for, a while: the lock is
    // also held for an instant by any child process spawned while it was held (its
    // descriptor lives until the child's exec).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let _lock = loop {
        if let Some(l) = crate::lifecycle::cleanup::try_lock(state, from) {
            break l;
        }
        if std::time::Instant::now() >= until {
            return Err(CreateError::Busy(format!(
                "the kept copy of {label} is being purged or restored right now; try again in a moment"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let kept = store
        .kept_by_id(from)
        .map_err(|e| internal("reading kept removals")(e.to_string()))?
        .ok_or_else(|| CreateError::NotKept(format!("the kept copy of {label} was just purged")))?;
    let old = store
        .worktree_by_id(from)
        .map_err(|e| internal("reading worktrees")(e.to_string()))?
        .ok_or_else(|| CreateError::NotKept(format!("worktree {from} has no row")))?;
    let in_use = |state: &str| {
        CreateError::Exists(format!(
            "worktree '{}/{new_name}' is in use again (state: {state}); restore this one under another name with `worktreefs restore {label} --as NEW-NAME`",
            req.repo
        ))
    };
    // A creation of that name, or a restore of this copy, killed half-way is rolled back
    // first (as `new` does); the rollback of a restore puts the copy back.
    preconditions::name_free(
        state,
        store,
        &repo_row,
        new_name,
        Some(&preconditions::InTheWay {
            also: &|c| c.restored_from == Some(from),
            running: &|c| match c.restored_from {
                Some(f) if f == from => CreateError::Busy(format!(
                    "{label} is being restored right now by process {}; wait for it",
                    c.pid
                )),
                _ => in_use("being created"),
            },
            taken: &|st| in_use(st.as_str()),
        }),
    )?;

    let dir = state.removed_dir(from);
    if !dir.is_dir() {
        return Err(CreateError::NotKept(format!(
            "the kept copy of {label} is gone from {} (removed by hand?); nothing to restore",
            dir.display()
        )));
    }
    let repo = preconditions::open_repo(&repo_row)?;
    let gitdir = git::common_dir(&repo);
    let head = kept.head.trim().to_string();
    let tip = kept.tip.as_deref().and_then(|t| Oid::from_str(t).ok());
    let mut notes = Vec::new();
    // HEAD: on its branch (made again at the kept tip when it is gone), or detached.
    let mut remake = None;
    let branch = head.strip_prefix("ref: refs/heads/").map(str::to_string);
    match &branch {
        Some(b) => match repo.find_branch(b, BranchType::Local) {
            Ok(br) => {
                if let Some(holder) = git::checked_out_in(&repo, b) {
                    return Err(CreateError::BranchConflict(format!(
                        "branch '{b}' of {label} is checked out in {holder}; switch that worktree to another branch, then restore again"
                    )));
                }
                let now = br.get().target();
                if tip.is_some() && now != tip {
                    notes.push(format!(
                        "branch {b} has moved since the removal (now at {}, was at {}); the restored worktree is on it",
                        now.map(|o| o.to_string()).unwrap_or_default(),
                        tip.map(|o| o.to_string()).unwrap_or_default()
                    ));
                }
            }
            Err(_) => {
                let tip = tip.ok_or_else(|| {
                    CreateError::BadRevision(format!(
                        "branch '{b}' of {label} is gone and no commit of it was kept; create it again (`git branch {b} COMMIT`), then restore"
                    ))
                })?;
                remake = Some((b.clone(), tip));
            }
        },
        None => {
            let at = Oid::from_str(&head).map_err(|_| {
                CreateError::Internal(format!("the kept HEAD of {label} ({head}) is not a commit"))
            })?;
            if repo.find_commit(at).is_err() {
                return Err(CreateError::BadRevision(format!(
                    "commit {at} (the detached HEAD of {label}) is no longer in the repository"
                )));
            }
        }
    }
    // No index was kept (git's entry was gone at the removal): one of HEAD's tree.
    let index = match fs::read(dir.join(KEPT_DIR).join("index")) {
        Ok(b) => b,
        Err(_) => {
            let at = tip.or_else(|| Oid::from_str(&head).ok()).ok_or_else(|| {
                CreateError::NotKept(format!(
                    "the kept copy of {label} has neither an index nor a commit to make one from"
                ))
            })?;
            notes.push(
                "its index was not kept (git's entry was gone at the removal): it is HEAD's tree, and git looks at every file once".into(),
            );
            crate::git::index::index_of_commit(&repo, at, &dir.join(KEPT_DIR).join("index.made"))
                .map_err(|e| CreateError::Internal(format!("making an index for {label}: {e}")))?
        }
    };

    let me = crate::process::info::proc_info(std::process::id() as i32);
    let mut record = CreationRow {
        worktree_id: WorktreeId(0),
        repo_id: repo_row.id,
        name: new_name.to_string(),
        branch: remake.as_ref().map(|(b, _)| b.clone()),
        // What a rollback compares the branch it made with.
        base_commit: remake
            .as_ref()
            .map(|(_, t)| t.to_string())
            .unwrap_or_else(|| old.base_commit.clone()),
        admin_name: String::new(),
        pid: std::process::id() as i32,
        pid_start: me.map(|p| p.start).unwrap_or(0),
        started_at: now_secs(),
        restored_from: Some(from),
    };
    record.worktree_id = record_creation(store, &gitdir, &mut record, req.repo)?;
    let mut made = Made::default();
    let r = make(
        state, store, &repo, &record, &old, &head, &index, &remake, &mut made,
    );
    if let Err(e) = &r {
        if let Err(undo) = roll_back(state, store, &gitdir, &record, Some(&made)) {
            tracing::error!(
                "restore of {label} failed ({e}) and could not be rolled back ({undo:#}); the next mount rolls it back"
            );
        }
    }
    r?;
    if let Some((b, t)) = &remake {
        notes.push(format!("branch {b} made again at {t}"));
    }
    // What only the removal needed: the copy of git's files, and the submodule views'
    // records (their git entries went with the removal; views are made anew).
    // The ref goes first (a kill after it leaves only `kept/`, which the next removal
    // starts again), unless the branch moved since: then it alone keeps the commits the
    // removed worktree had.
    let moved = notes.iter().any(|n| n.contains("has moved since"));
    let placed = state.worktree_dir(record.worktree_id);
    match (&kept.tip_ref, moved) {
        (Some(name), false) => {
            if let Err(e) = keep::delete_ref(&gitdir, name) {
                tracing::warn!("could not delete {name}: {e:#}");
            }
        }
        (Some(name), true) => {
            // No longer named in `kept/`: a later removal must not take it for its own.
            let _ = fs::remove_file(placed.join(KEPT_DIR).join("ref"));
            notes.push(format!(
                "its commits from before stay under {name} (delete it with `git update-ref -d {name}` once you have what you need)"
            ))
        }
        (None, _) => {}
    }
    let _ = fs::remove_dir_all(placed.join(KEPT_DIR));
    let checkpoints = state.checkpoints(record.worktree_id);
    if checkpoints.exists() {
        // A removal takes the checkpoints with it: the worktree comes back as it was
        // when removed, with none to rewind to.
        let _ = fs::remove_dir_all(&checkpoints);
        notes.push("its checkpoints are not restored (a removal takes them)".into());
    }
    let subs = state.subs(record.worktree_id);
    if subs.exists() {
        // Their git entries name the removed worktree's place: they go with the records.
        crate::lifecycle::submodules::remove_admin_entries(
            state,
            &placed,
            &format!("{}/{}", old.repo, old.name),
            old.uid,
        );
        let _ = fs::remove_dir_all(&subs);
        notes.push(
            "its submodule views are made anew when first looked at (their own changes are not restored)"
                .into(),
        );
    }
    let row = store
        .worktree_by_id(record.worktree_id)
        .map_err(|e| internal("reading back the worktree")(e.to_string()))?
        .ok_or_else(|| CreateError::Internal("restored worktree row vanished".into()))?;
    // Its block of ports back when nobody took it meanwhile, else another.
    let had = store.ports_of(kept.worktree_id).ok().flatten();
    match (
        had,
        crate::lifecycle::ports::give(state, store, row.id, had),
    ) {
        (Some(h), Ok(b)) if h == b => notes.push(format!(
            "ports {}-{}: the block it had",
            b.first,
            b.first as u32 + b.size as u32 - 1
        )),
        (_, Ok(b)) => notes.push(format!(
            "ports {}-{}: a new block{}",
            b.first,
            b.first as u32 + b.size as u32 - 1,
            if had.is_some() {
                " (the one it had is taken, or not of the range now)"
            } else {
                ""
            }
        )),
        (_, Err(why)) => notes.push(format!("no ports: {why}")),
    }
    tracing::info!(
        "restored {label} as {}/{} (worktree {})",
        row.repo,
        row.name,
        row.id
    );
    Ok(Restored {
        row,
        from: kept,
        notes,
    })
}

/// The steps of a recorded restore: the branch made again, git's entry with the kept
/// HEAD and index, the kept directory put in place, and the row (which takes the kept
/// row in its transaction).
#[allow(clippy::too_many_arguments)]
fn make(
    state: &StateDir,
    store: &mut Store,
    repo: &Repository,
    record: &CreationRow,
    old: &WorktreeRow,
    head: &str,
    index: &[u8],
    remake: &Option<(String, Oid)>,
    made: &mut Made,
) -> Result<(), CreateError> {
    let from = record.restored_from.expect("a restore's record");
    if let Some((b, tip)) = remake {
        make_branch(repo, b, *tip, record.worktree_id)?;
        made.branch = true;
    }
    let gitdir = git::common_dir(repo);
    let mountpoint = mountpoint_of(state, store);
    let repo_name = old.repo.as_str();
    let worktree_path = mountpoint.join(repo_name).join(&record.name);
    let index = crate::git::untracked::retarget(index, &worktree_path).unwrap_or(index.to_vec());
    write_entry(
        state,
        &mountpoint,
        &gitdir,
        record,
        repo_name,
        (old.uid, old.gid),
        head,
        |out| std::io::Write::write_all(out, &index),
        made,
    )?;
    fs::rename(
        state.removed_dir(from),
        state.worktree_dir(record.worktree_id),
    )
    .map_err(io_failure("putting the kept upper layer in place"))?;
    let branch = head.strip_prefix("ref: refs/heads/");
    store
        .finish_creation(
            record,
            &NewWorktree {
                repo_id: record.repo_id,
                name: &record.name,
                branch,
                branch_created: old.branch_created && branch == old.branch.as_deref(),
                base_commit: &old.base_commit,
                base_tree: &old.base_tree,
                base_mtime: old.base_mtime,
                uid: old.uid,
                gid: old.gid,
                admin_name: &record.admin_name,
                warm: old.warm,
            },
        )
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => CreateError::NotKept(format!(
                "the kept copy of {}/{} was purged while this restore ran, or the restore was taken over (see `worktreefs removed`)",
                old.repo, old.name
            )),
            ErrorKind::Taken => {
                CreateError::Exists(format!(
                    "worktree '{}/{}' was created by someone else just now; restore under another name with --as",
                    old.repo, record.name
                ))
            }
            _ => crate::lifecycle::create::error::db_failure("recording the worktree")(e),
        })
}
