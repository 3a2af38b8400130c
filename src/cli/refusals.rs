//! The typed refusals commands share: a worktree that does not exist (with the closest
//! name), is removed or deleting, or has no mount to run in.

use worktreefs::lease::State;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::exit::Failed;

/// " (did you mean REPO/W?)" when a worktree of `repo` that is not removed has a name
/// close to `name`, else "".
pub fn did_you_mean(store: &Store, repo: &str, name: &str) -> String {
    let rows = store.worktrees().unwrap_or_default();
    let names = rows
        .iter()
        .filter(|w| w.repo == repo && w.state != State::Removed)
        .map(|w| w.name.as_str());
    match worktreefs::names::closest(name, names) {
        Some(c) => format!(" (did you mean {repo}/{c}?)"),
        None => String::new(),
    }
}

/// The refusal of `repo/name`, which does not exist: `not-found`, with the closest name.
pub fn not_found(store: &Store, repo: &str, name: &str) -> report::Refusal {
    let mut r = report::unleasable(repo, name, None);
    let hint = did_you_mean(store, repo, name);
    if !hint.is_empty() {
        r.message = format!("worktree '{repo}/{name}' does not exist{hint}; see `worktreefs list`, or create it with `worktreefs new {repo}/{name}`");
        r.json["did_you_mean"] = did_you_mean_field(&hint).into();
    }
    r
}

/// The REPO/W of a [`did_you_mean`] hint, for JSON's `did_you_mean`.
pub fn did_you_mean_field(hint: &str) -> &str {
    hint.trim_start_matches(" (did you mean ")
        .trim_end_matches("?)")
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
        None => Err(not_found(store, repo, name).into()),
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
