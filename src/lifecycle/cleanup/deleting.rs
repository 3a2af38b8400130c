//! A worktree in `deleting` finished: inspected (bounded in time), judged (removed or
//! retained, and why), then removed; what would keep a worktree, asked by a setup
//! runner.

use std::path::Path;

use crate::ids::WorktreeId;
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{Store, WorktreeRow};

use super::decide::{decide, Findings, Verdict};
use super::inspection::Inspection;
use super::remove::{gone_by_hand, run_removal, Removal};
use super::target::{target_of, Outcome, Target};

/// Why nothing of a worktree found clean is lost, as inspection said it.
pub(super) fn settled(inspected: &Result<Findings, String>) -> Option<&str> {
    inspected.as_ref().ok().and_then(|f| f.settled.as_deref())
}

/// [`inspect`], given up after the inspection timeout: the files inspection reads are
/// its user's, and libgit2 opens a ref or an object as a file, so one made a FIFO would
/// block it (and every removal after it) for good. It runs on a thread of its own; one
/// still blocked at the timeout is left to end by itself (it only reads, and its answer
/// goes nowhere), and the worktree is retained with a reason that says so. While it is
/// blocked, no other inspection of that worktree starts (one thread per worktree at
/// most, however often the sweeper or a user asks).
pub(super) fn inspect_bounded(t: &Target, how: &Inspection) -> Result<Findings, String> {
    static GATE: crate::bounded::Gate<WorktreeId> = crate::bounded::Gate::new();
    let target = t.clone();
    let answers = how.answers();
    let filters = how.filter_timeout;
    use crate::bounded::Bounded;
    match GATE.run(
        t.id,
        format!("inspect-{}", t.id),
        how.timeout,
        move || super::inspect::inspect_asking(&target, answers.as_ref(), filters),
    ) {
        Bounded::Done(found) => found,
        Bounded::StillBlocked(since) => Err(format!(
            "an earlier inspection of it is still blocked ({} s; something in {} or {} blocks reading: a FIFO or a file of a filesystem that hangs?); remove it and reclaim again",
            since.as_secs(),
            t.gitdir.display(),
            t.admin.display()
        )),
        Bounded::TooMany(n) => Err(format!(
            "{n} inspections are blocked (something in their repositories blocks reading: a FIFO or a file of a filesystem that hangs?); none more starts until they end: restart the daemon once the cause is gone"
        )),
        Bounded::Failed => Err(format!(
            "the inspection of {} failed unexpectedly (see the daemon's log)",
            t.path.display()
        )),
        Bounded::TimedOut => {
            let secs = how.timeout.as_millis() as f64 / 1000.0;
            tracing::warn!(
                worktree = %t.path.display(),
                "inspection did not finish within {secs} s; retained"
            );
            Err(format!(
                "the inspection did not finish within {secs} s (something in {} or {} blocks reading: a FIFO or a file of a filesystem that hangs?); remove it and reclaim again, or raise `mount --inspect-timeout`",
                t.gitdir.display(),
                t.admin.display()
            ))
        }
    }
}

/// How long the transaction that decides a move to `deleting` may wait for another
/// connection's lock: the worktree takes no new lease meanwhile.
pub const DECIDE_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(200);

/// Finishes a worktree in `deleting`: inspects, decides, removes or retains; or carries
/// on with a removal already decided by a daemon that died.
pub fn finish(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
) -> LifecycleResult<Outcome> {
    // The mount gone from under a cleanup round: not even inspected (the cleanup at the
    // session's end does that).
    if how.mount_gone(mountpoint) && how.waits_for_mount(store, row, mountpoint) {
        return Ok(Outcome::Waiting("its mount has gone".into()));
    }
    match judge(state, store, row, mountpoint, how)? {
        Judged::Done(outcome) => Ok(outcome),
        Judged::Removable(_) if how.waits_for_mount(store, row, mountpoint) => {
            let why = "its teardown command runs inside it, once a mount serves it";
            tracing::info!("{}/{}: removable; left deleting: {why}", row.repo, row.name);
            Ok(Outcome::Waiting(why.into()))
        }
        Judged::Removable(r) => {
            let torn_down = how.tear_down(store, row, None);
            remove_judged(state, store, r, torn_down)
        }
    }
}

/// What a worktree holds, as cleanup would judge it now ([`would_keep`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// Nothing cleanup would keep.
    Nothing,
    /// Work cleanup would keep it for: why.
    Work(String),
    /// It could not be inspected (in time): why.
    Unknown(String),
}

/// What cleanup would find in worktree `row` if it ran now (`row` is not marked for it):
/// a setup command's end asks, so that work it left is never taken for clean.
pub fn would_keep(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
) -> LifecycleResult<Holds> {
    let t = target_of(state, store, row, mountpoint)?;
    let inspected = inspect_bounded(&t, how);
    if let Err(why) = &inspected {
        return Ok(Holds::Unknown(why.clone()));
    }
    Ok(
        match decide(t.branch.as_deref(), t.branch_created, &inspected) {
            Verdict::Remove { .. } => Holds::Nothing,
            Verdict::Retain(reason) => Holds::Work(reason),
        },
    )
}

/// What [`judge`] found of a worktree in `deleting`.
pub(crate) enum Judged {
    /// Nothing more to do: retained, gone by hand, or a removal begun before finished.
    Done(Outcome),
    /// Found clean and pushed: its teardown command runs next, then [`remove_judged`].
    Removable(Box<Removable>),
}

/// A worktree found removable, with what inspection said.
pub(crate) struct Removable {
    t: Target,
    delete_branch: bool,
    integrated: Option<String>,
    inspected: Result<Findings, String>,
}

/// The first half of [`finish`]: inspects worktree `row` (in `deleting`) and retains it
/// when it holds work; or carries on with a removal already decided.
pub(super) fn judge(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
) -> LifecycleResult<Judged> {
    let t = target_of(state, store, row, mountpoint)?;
    if let Some(removal) = &row.removal {
        tracing::info!(worktree = %t.path.display(), "finishing a removal begun before ({removal})");
        return Ok(Judged::Done(run_removal(
            state,
            store,
            &t,
            &super::remove::recorded(removal),
        )?));
    }
    if !t.dir.exists() && !t.parked_dir(state).exists() {
        return Ok(Judged::Done(gone_by_hand(state, store, &t)?));
    }
    let inspected = inspect_bounded(&t, how);
    match decide(t.branch.as_deref(), t.branch_created, &inspected) {
        Verdict::Remove {
            delete_branch,
            integrated,
        } => Ok(Judged::Removable(Box::new(Removable {
            t,
            delete_branch,
            integrated,
            inspected,
        }))),
        Verdict::Retain(reason) => {
            store.retain(t.id, &t.path.to_string_lossy(), &reason)?;
            tracing::info!(worktree = %t.path.display(), "retained: {reason}");
            Ok(Judged::Done(Outcome::Retained(reason)))
        }
    }
}

/// The second half of [`finish`], once the worktree's teardown command has run
/// (`torn_down`; Err: it moved HEAD or the branch, why): removes the worktree, or retains
/// it for that.
pub(super) fn remove_judged(
    state: &StateDir,
    store: &mut Store,
    r: Box<Removable>,
    torn_down: Result<(), String>,
) -> LifecycleResult<Outcome> {
    let Removable {
        t,
        delete_branch,
        integrated,
        inspected,
    } = *r;
    if let Err(reason) = torn_down {
        store.retain(t.id, &t.path.to_string_lossy(), &reason)?;
        tracing::info!(worktree = %t.path.display(), "retained: {reason}");
        return Ok(Outcome::Retained(reason));
    }
    let removal = Removal::clean(
        state,
        store,
        delete_branch,
        integrated.as_deref(),
        settled(&inspected),
    );
    run_removal(state, store, &t, &removal)
}
