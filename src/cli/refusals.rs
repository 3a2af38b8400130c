//! The typed refusals commands share: a worktree that does not exist (with the closest
//! name), is removed or deleting, or has no mount to run in.

use worktreefs::lease::State;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::exit::Failed;

/// The worktree of `repo` that is not removed whose name is closest to `name`, as
/// REPO/W, if one is close.
pub fn did_you_mean(store: &Store, repo: &str, name: &str) -> Option<String> {
    let rows = store.worktrees().unwrap_or_default();
    let names = rows
        .iter()
        .filter(|w| w.repo == repo && w.state != State::Removed)
        .map(|w| w.name.as_str());
    worktreefs::names::closest(name, names).map(|c| format!("{repo}/{c}"))
}

/// " (did you mean REPO/W?)" for a close worktree, else "".
pub fn hint(close: Option<&str>) -> String {
    close.map_or_else(String::new, |c| format!(" (did you mean {c}?)"))
}

/// The refusal of `repo/name`, which does not exist: `not-found`, with the closest name
/// and the `session` asked for (`lease release`).
pub fn not_found(store: &Store, repo: &str, name: &str, session: Option<&str>) -> report::Refusal {
    let close = did_you_mean(store, repo, name);
    report::Refusal {
        message: format!(
            "worktree '{repo}/{name}' does not exist{}; see `worktreefs list`, or create it with `worktreefs new {repo}/{name}`",
            hint(close.as_deref())
        ),
        json: shapes::value(shapes::UnleasableJson {
            error: "not-found".into(),
            worktree: format!("{repo}/{name}"),
            repo: repo.to_string(),
            name: name.to_string(),
            state: None,
            did_you_mean: close,
            session: session.map(str::to_string),
        }),
        code: report::EXIT_CONFLICT,
    }
}

/// The worktree `repo/name` for `run` or `turn`: refused as `lease acquire` refuses it
/// when it does not exist, is removed or is being deleted, before anything else is asked
/// (a mount would not help).
pub fn runnable_worktree(
    store: &Store,
    repo: &str,
    name: &str,
) -> Result<worktreefs::store::WorktreeRow, Failed> {
    let row = leasable_worktree(store, repo, name)?;
    if matches!(row.state, State::Removed | State::Deleting) {
        return Err(report::unleasable(repo, name, Some(row.state)).into());
    }
    Ok(row)
}

/// The worktree `repo/name`, or a typed refusal naming the way out.
pub fn leasable_worktree(
    store: &Store,
    repo: &str,
    name: &str,
) -> Result<worktreefs::store::WorktreeRow, Failed> {
    match store.worktree(repo, name)? {
        Some(row) => Ok(row),
        None => Err(not_found(store, repo, name, None).into()),
    }
}

/// The refusal of `run` or `turn` when no daemon serves the state dir: `not-mounted`, the
/// worktree object with the session asked for.
pub fn not_mounted(
    state: &StateDir,
    store: &Store,
    row: &worktreefs::store::WorktreeRow,
    session: Option<&str>,
) -> report::Refusal {
    let at = create::mountpoint_of(state, store);
    report::refused(
        row,
        &at,
        "not-mounted",
        session,
        format!(
            "nothing is mounted for state dir {}, so nothing can run in {}/{}; start it with `worktreefs mount`",
            state.root.display(),
            row.repo,
            row.name
        ),
    )
}
