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
mod deleting;
mod fsmonitor;
pub(crate) mod git_files;
mod inspect;
mod inspection;
pub mod keep;
mod lock;
mod reach;
mod reconcile;
mod remove;
mod request;
mod target;
mod walk;

pub use before_unmount::{end_cleanups_before_unmount, Ended};
pub use before_unmount::{tear_down_before_unmount, BeforeUnmount};
pub use decide::{decide, Change, ChangeKind, Findings, Head, Verdict};
pub use deleting::{finish, would_keep, Holds, DECIDE_BUSY_TIMEOUT};
pub use fsmonitor::FsmonitorAnswers;
pub use inspect::{inspect, inspect_asking};
pub use inspection::Inspection;
pub use lock::{try_lock, try_lock_shared, CleanupLock};
pub use reconcile::{finish_all_deleting, reclaim_at_unmount, reconcile_at_boot};
pub use remove::{execute, plan, Remover, Step};
pub use request::{request_removal, request_removal_gated, Discarded, RequestError};
pub use target::{Outcome, Target};
