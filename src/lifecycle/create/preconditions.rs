//! What every creation checks before it makes anything: the repository is registered,
//! the branch name is one git allows, the warm snapshot is still there.

use crate::store::Store;

use super::error::CreateError;

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
