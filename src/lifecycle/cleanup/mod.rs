//! Cleanup after the last release (docs/contract.md, "Cleanup"): inspect a worktree, decide, then
//! remove it or retain it with the reason.
//!
//! * **Inspect** from the upper layer and the object database, never through the view:
//!   the index against HEAD's tree, and the merged view against HEAD's tree only where the
//!   two can differ (paths in the upper layer, and paths where HEAD's tree differs from the
//!   base tree; identical subtrees are skipped by object id). Untracked files count unless
//!   `.gitignore` (the view's own, read from the upper layer or the base), the
//!   repository's `info/exclude` or `core.excludesFile` ignore them.
//! * **Decide** ([`decide`], pure): removed only when nothing is uncommitted, HEAD is where
//!   creation put it, and every commit is reachable from the base commit or a
//!   remote-tracking ref. The branch goes too only when worktreefs created it and its tip
//!   is reachable from another ref (merged or pushed).
//! * **Remove** ([`execute`]): each step can be undone; a failing step undoes the ones
//!   before it and the worktree is retained with `cleanup-error: …`, files untouched. The
//!   decision is written to the store before the first step, so a daemon that dies in the
//!   middle finishes the removal at the next mount.

mod before_unmount;
mod decide;
mod fsmonitor;
pub(crate) mod git_files;
mod inspect;
mod inspection;
pub mod keep;
mod lock;
mod reach;
mod reconcile;
mod remove;
mod target;
mod walk;

pub use before_unmount::{end_cleanups_before_unmount, Ended};
pub use before_unmount::{tear_down_before_unmount, BeforeUnmount};
pub use decide::{decide, Change, ChangeKind, Findings, Head, Verdict};
pub use fsmonitor::FsmonitorAnswers;
pub use inspect::{inspect, inspect_asking};
pub use inspection::Inspection;
pub use lock::{try_lock, try_lock_shared, CleanupLock};
pub use reconcile::{finish_all_deleting, reclaim_at_unmount, reconcile_at_boot};
pub use remove::{execute, plan, Remover, Step};
use remove::{gone_by_hand, run_removal, Removal};
use target::target_of;
pub use target::{Outcome, Target};

/// Why nothing of a worktree found clean is lost, as inspection said it.
fn settled(inspected: &Result<Findings, String>) -> Option<&str> {
    inspected.as_ref().ok().and_then(|f| f.settled.as_deref())
}

impl Removal {
    /// The removal of a worktree found clean and pushed (or `integrated` upstream by
    /// content), kept by the policy.
    fn clean(
        state: &StateDir,
        store: &Store,
        delete_branch: bool,
        integrated: Option<&str>,
        settled: Option<&str>,
    ) -> Removal {
        let mut what = match integrated.or(settled) {
            Some(how) => format!("clean; {how}"),
            None => String::from("clean and pushed"),
        };
        let keep = keeps_now(state, store, &mut what);
        // Commits whose content is upstream but which no other ref reaches stay on their
        // branch unless the removal keeps its tip (restorable): deleting it then would be
        // the only step nothing can undo.
        let delete_branch = delete_branch && (keep || integrated.is_none());
        if integrated.is_some() && !keep {
            what.push_str(" (its branch is kept: the removal keeps nothing)");
        }
        Removal {
            keep,
            delete_branch,
            what,
            index_clean: true,
        }
    }
}

/// Whether a removal now keeps: by the policy, and not while the disk is low (the copy
/// would be purged at once, and writing it could fill the disk); `what` then says so.
fn keeps_now(state: &StateDir, store: &Store, what: &mut String) -> bool {
    let p = keep::KeepPolicy::of(store);
    match p.low_disk(&state.root) {
        Some(why) if p.keeps() => {
            tracing::warn!("removal keeps nothing: {why}");
            what.push_str(&format!(" (not kept: {why})"));
            false
        }
        _ => p.keeps(),
    }
}

use std::fmt;

use std::path::Path;

use git2::Oid;

use crate::ids::WorktreeId;
use crate::lease::State;
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{BeginError, Store, StoreError, WorktreeRow};

/// [`inspect`], given up after the inspection timeout: the files inspection reads are
/// its user's, and libgit2 opens a ref or an object as a file, so one made a FIFO would
/// block it (and every removal after it) for good. It runs on a thread of its own; one
/// still blocked at the timeout is left to end by itself (it only reads, and its answer
/// goes nowhere), and the worktree is retained with a reason that says so. While it is
/// blocked, no other inspection of that worktree starts (one thread per worktree at
/// most, however often the sweeper or a user asks).
pub(crate) fn inspect_bounded(t: &Target, how: &Inspection) -> Result<Findings, String> {
    static GATE: crate::bounded::Gate<WorktreeId> = crate::bounded::Gate::new();
    let target = t.clone();
    let answers = how.answers();
    let filters = how.filter_timeout;
    use crate::bounded::Bounded;
    match GATE.run(
        t.id,
        format!("inspect-{}", t.id),
        how.timeout,
        move || inspect::inspect_asking(&target, answers.as_ref(), filters),
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
pub(crate) fn judge(
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
            &remove::recorded(removal),
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
pub(crate) fn remove_judged(
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

/// Why a removal someone asked for did not happen.
#[derive(Debug)]
pub enum RequestError {
    /// Leased, in use, or being cleaned up: try again later.
    Busy(String),
    /// It holds work: the reason.
    HoldsWork(String),
    /// Already removed.
    Gone(String),
    Other(crate::lifecycle::error::LifecycleError),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Busy(m) | RequestError::HoldsWork(m) | RequestError::Gone(m) => {
                f.write_str(m)
            }
            RequestError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<crate::lifecycle::error::LifecycleError> for RequestError {
    fn from(e: crate::lifecycle::error::LifecycleError) -> Self {
        RequestError::Other(e)
    }
}

impl From<StoreError> for RequestError {
    fn from(e: StoreError) -> Self {
        RequestError::Other(e.into())
    }
}

/// What `--discard` throws away, shown before it does.
#[derive(Debug, Clone)]
pub struct Discarded {
    pub changes: Vec<Change>,
    /// Commits that no ref keeps once the worktree is gone (HEAD was detached or moved).
    pub commits: Vec<Oid>,
    /// Unpushed commits that stay on the (kept) branch.
    pub kept_on_branch: Option<(String, usize)>,
    /// Inspection failed: everything in the upper layer goes.
    pub uninspected: Option<String>,
}

impl Discarded {
    /// What `--discard` says it throws away, one line each.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(e) = &self.uninspected {
            out.push(format!(
                "everything in its upper layer (it could not be inspected: {e})"
            ));
        }
        out.extend(self.changes.iter().map(|c| c.to_string()));
        out.extend(
            self.commits
                .iter()
                .map(|c| format!("commit {c} (on no branch or remote-tracking ref)")),
        );
        if let Some((b, n)) = &self.kept_on_branch {
            out.push(format!("(kept: {n} unpushed commit(s) stay on branch {b})"));
        }
        out
    }
}

/// `request_removal` in the live daemon: through its gate, so that the move to
/// `deleting` also sees the leases it keeps in memory and no lease comes in while it is
/// decided; `refresh` re-reads the store into the daemon's catalog once it is deleting
/// (from then on the catalog keeps leases out), before the gate opens again.
#[allow(clippy::too_many_arguments)]
pub fn request_removal_gated(
    gate: &crate::lifecycle::gate::Gate,
    refresh: &dyn Fn(),
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
    discard: bool,
    show: &mut dyn FnMut(&Discarded),
) -> Result<Outcome, RequestError> {
    // The gate is closed only around the decision (after the scan for processes inside,
    // which may take a while), and the decision waits for the database not for long.
    let busy = || {
        RequestError::Busy(format!(
            "worktree {}/{} has a process lease being recorded (a process has just entered it); see `worktreefs leases`",
            row.repo, row.name
        ))
    };
    let mut closed = None;
    let r = request_removal_then(
        state,
        store,
        row,
        mountpoint,
        how,
        discard,
        show,
        &mut |phase, store| {
            match phase {
                Phase::Deciding => {
                    closed = Some(gate.close(row.id).ok_or_else(busy)?);
                    store.set_busy_timeout(DECIDE_BUSY_TIMEOUT)?;
                }
                Phase::Deleting => {
                    store.set_busy_timeout(crate::store::BUSY_TIMEOUT)?;
                    if let Some(c) = closed.take() {
                        c.deleting();
                        refresh();
                    }
                }
            }
            Ok(())
        },
    );
    let _ = store.set_busy_timeout(crate::store::BUSY_TIMEOUT);
    r
}

/// A removal asked for by `worktreefs reclaim` or `rmdir`: only without leases and nobody
/// inside, and only when the checks pass, unless `discard` (then `show` is told what goes
/// before anything does).
pub fn request_removal(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
    discard: bool,
    show: &mut dyn FnMut(&Discarded),
) -> Result<Outcome, RequestError> {
    request_removal_then(
        state,
        store,
        row,
        mountpoint,
        how,
        discard,
        show,
        &mut |_, _| Ok(()),
    )
}

/// Where a removal is, for `request_removal_then`'s hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// About to decide the move to `deleting` (its transaction comes next).
    Deciding,
    /// Marked deleting.
    Deleting,
}

/// `request_removal`, calling `hook` just before the transaction that decides the move to
/// `deleting` and once the worktree is marked deleting.
#[allow(clippy::too_many_arguments)]
fn request_removal_then(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    how: &Inspection,
    discard: bool,
    show: &mut dyn FnMut(&Discarded),
    hook: &mut dyn FnMut(Phase, &mut Store) -> Result<(), RequestError>,
) -> Result<Outcome, RequestError> {
    let label = format!("{}/{}", row.repo, row.name);
    let t = target_of(state, store, row, mountpoint)?;
    let _lock = try_lock(state, row.id).ok_or_else(|| {
        RequestError::Busy(format!(
            "worktree {label} is being cleaned up right now; try again in a moment"
        ))
    })?;
    let inside = crate::process::inside::describe_processes_inside(&t.path);
    if !inside.is_empty() {
        return Err(RequestError::Busy(format!(
            "worktree {label} is in use by {}; those processes must leave it first",
            inside.join(", ")
        )));
    }
    let why = if discard {
        "reclaim --discard"
    } else {
        "removal asked for"
    };
    hook(Phase::Deciding, store)?;
    let prev = store
        .begin_deleting(row.id, &[State::Ready, State::Lingering, State::Retained], why)
        .map_err(|e| match e {
            BeginError::Leased(n, st) => RequestError::Busy(format!(
                "worktree {label} is {st} with {n} lease{}; release {} first (see `worktreefs leases`)",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            )),
            BeginError::State(State::Removed) => {
                RequestError::Gone(format!("worktree {label} is already removed"))
            }
            BeginError::State(st) => RequestError::Busy(format!(
                "worktree {label} is {st}; its cleanup is already running"
            )),
            BeginError::Db(e) if e.is_busy() => RequestError::Busy(format!(
                "worktree {label} cannot be marked for removal now: another process holds the database ({e}); try again in a moment"
            )),
            BeginError::Db(e) => e.into(),
        })?;
    hook(Phase::Deleting, store)?;
    let inspected = inspect_bounded(&t, how);
    let verdict = decide(t.branch.as_deref(), t.branch_created, &inspected);
    match verdict {
        Verdict::Remove { .. } if how.defers(store, row) => {
            tracing::info!(
                "{label}: removable; its teardown command and the removal run next, in the sweeper"
            );
            Ok(Outcome::Removed(
                "its teardown command runs first, then the removal".into(),
            ))
        }
        Verdict::Remove {
            delete_branch,
            integrated,
        } => {
            if let Err(reason) = how.tear_down(store, row, None) {
                store.end_deleting(row.id, prev, &format!("removal refused: {reason}"))?;
                return Err(RequestError::HoldsWork(reason));
            }
            Ok(run_removal(
                state,
                store,
                &t,
                &Removal::clean(
                    state,
                    store,
                    delete_branch,
                    integrated.as_deref(),
                    settled(&inspected),
                ),
            )?)
        }
        Verdict::Retain(reason) if !discard => {
            store.end_deleting(row.id, prev, &format!("removal refused: {reason}"))?;
            Err(RequestError::HoldsWork(reason))
        }
        Verdict::Retain(_) => {
            let d = match &inspected {
                Ok(f) => {
                    let on_branch = match &f.head {
                        Head::Branch(b) => Some(b.clone()),
                        Head::Detached(_) => None,
                    };
                    // A submodule's changes and commits go too: named with its path (its
                    // HEAD is detached, so its commits are on no branch once its entry
                    // goes).
                    let mut changes = f.changes.clone();
                    let mut sub_commits = Vec::new();
                    for (path, s) in &f.submodules {
                        changes.extend(s.changes.iter().map(|c| Change {
                            kind: c.kind,
                            path: format!("{path}/{}", c.path),
                        }));
                        sub_commits.extend(s.unpushed.iter().copied());
                    }
                    Discarded {
                        changes,
                        commits: if on_branch.is_some() {
                            sub_commits
                        } else {
                            f.unpushed.iter().copied().chain(sub_commits).collect()
                        },
                        kept_on_branch: on_branch
                            .filter(|_| !f.unpushed.is_empty())
                            .map(|b| (b, f.unpushed.len())),
                        uninspected: None,
                    }
                }
                Err(e) => Discarded {
                    changes: Vec::new(),
                    commits: Vec::new(),
                    kept_on_branch: None,
                    uninspected: Some(e.clone()),
                },
            };
            show(&d);
            let delete_branch = match &inspected {
                Ok(f) => {
                    t.branch_created
                        && f.tip_elsewhere
                        && matches!((&f.head, &t.branch), (Head::Branch(h), Some(b)) if h == b)
                }
                Err(_) => false,
            };
            let n = d.changes.len() + d.commits.len();
            let what = match &d.uninspected {
                Some(_) => "discarded (uninspected)".to_string(),
                None => format!("discarded ({n} change(s) or commit(s) thrown away)"),
            };
            let mut what = what;
            let removal = Removal {
                keep: keeps_now(state, store, &mut what),
                delete_branch,
                what,
                index_clean: false,
            };
            // Discarded: whatever its teardown did goes too, as asked.
            let _ = how.tear_down(store, row, None);
            Ok(run_removal(state, store, &t, &removal)?)
        }
    }
}
