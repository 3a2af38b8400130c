//! What every creation (new, fork, restore) checks before it makes anything, written
//! once: the name is one a worktree may have, the repository is registered and opens, no
//! live worktree has the name (a creation of it killed half-way rolled back first), the
//! branch name is one git allows, the warm snapshot is still there.

use git2::Repository;

use crate::lease::State;
use crate::names::validate_name;
use crate::state::StateDir;
use crate::store::{CreationRow, RepoRow, Store};

use super::error::{internal, CreateError};
use super::rollback::roll_back_dead;

/// Refuses a name a worktree may not have.
pub(crate) fn check_name(name: &str) -> Result<(), CreateError> {
    validate_name("worktree", name).map_err(CreateError::InvalidName)
}

/// The registered repository `repo`, or the refusal naming the closest registered one.
pub(crate) fn registered_repo(store: &Store, repo: &str) -> Result<RepoRow, CreateError> {
    store
        .repo_by_name(repo)
        .map_err(|e| internal("reading repositories")(e.to_string()))?
        .ok_or_else(|| unknown_repo(store, repo))
}

/// How a creation that is not `new`'s words what stands in its way (a restore: it rolls
/// back what a dead restore of the same copy left, and says `--as` where `new` says "pick
/// another name").
pub(crate) struct InTheWay<'a> {
    /// Creations killed half-way rolled back too, besides those of the name.
    pub also: &'a dyn Fn(&CreationRow) -> bool,
    /// The refusal while a creation it would roll back is still running.
    pub running: &'a dyn Fn(&CreationRow) -> CreateError,
    /// The refusal when a live worktree has the name (in that state).
    pub taken: &'a dyn Fn(State) -> CreateError,
}

/// Makes room for worktree `repo/name` of `repo_row`: a creation of that name killed
/// half-way is rolled back first; one still running, or a live worktree of that name,
/// refuses it (in `way`'s words, else `new`'s).
pub(crate) fn name_free(
    state: &StateDir,
    store: &mut Store,
    repo_row: &RepoRow,
    name: &str,
    way: Option<&InTheWay<'_>>,
) -> Result<(), CreateError> {
    let repo = repo_row.name.as_str();
    roll_back_dead(
        state,
        store,
        &repo_row.gitdir,
        |c| (c.repo_id == repo_row.id && c.name == name) || way.is_some_and(|w| (w.also)(c)),
        |c| {
            match way {
            Some(w) => (w.running)(c),
            None => CreateError::Exists(format!(
                "worktree '{repo}/{name}' is being created right now by process {}; wait for it, or pick another name",
                c.pid
            )),
        }
        },
    )?;
    if let Some(w) = store
        .worktree(repo, name)
        .map_err(|e| internal("reading worktrees")(e.to_string()))?
        .filter(|w| w.state != State::Removed)
    {
        return Err(match way {
            Some(way) => (way.taken)(w.state),
            None => CreateError::Exists(format!(
                "worktree '{repo}/{name}' already exists (state: {}); pick another name",
                w.state
            )),
        });
    }
    Ok(())
}

/// The repository of `repo_row`, opened, or why not with a way out.
pub(crate) fn open_repo(repo_row: &RepoRow) -> Result<Repository, CreateError> {
    Repository::open(&repo_row.gitdir).map_err(|e| {
        CreateError::Internal(format!(
            "repository '{}' at {} cannot be opened: {}; check the path or `worktreefs repo remove {}`",
            repo_row.name,
            repo_row.gitdir.display(),
            e.message(),
            repo_row.name
        ))
    })
}

/// The refusal of a repository name nobody registered: the registered name closest to it,
/// if one is, else how to register it.
pub(crate) fn unknown_repo(store: &Store, repo: &str) -> CreateError {
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
pub(crate) fn check_branch_name(name: &str, branch: Option<&str>) -> Result<(), CreateError> {
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

/// The error of a creation whose warm snapshot `warm` was pruned while it ran (a newer
/// one was taken, and no worktree showed this one): none if it is still there.
pub(crate) fn warm_gone(
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
