//! A removal someone asked for (`reclaim`, `rmdir` of a worktree): refused while it is
//! held or in use, otherwise marked `deleting` through the gate and finished now, or
//! left to the sweeper where its teardown must run first.

use std::fmt;
use std::path::Path;

use git2::Oid;

use crate::lease::State;
use crate::state::StateDir;
use crate::store::{BeginError, Store, StoreError, WorktreeRow};

use super::decide::{decide, Change, Head, Verdict};
use super::deleting::{inspect_bounded, settled, DECIDE_BUSY_TIMEOUT};
use super::inspection::Inspection;
use super::lock::try_lock;
use super::remove::{keeps_now, run_removal, Removal};
use super::target::{target_of, Outcome};

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
