//! The outcomes' shapes: what a command prints when it did what was asked (`new`, a
//! fork, `restore`, `warm`, a lease acquired or released, a turn ended, `reclaim`,
//! `mount`, `unmount`, `repo remove`, `env`), and the `.control` files that are no row.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ids::WorktreeId;

use super::rows::{RepoJson, SnapshotJson, TurnJson, WorktreeJson};

/// `new --warm --json`: the worktree, and the snapshot it shows (its size; how long
/// taking it took when this command took it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    #[serde(flatten)]
    pub warm: Option<WarmShownJson>,
    /// `new --reuse` found the worktree rather than made it (absent when it made it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
}

/// `env --json`: what `run` and `turn` tell their commands of a worktree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvJson {
    /// `REPO/NAME` (`WORKTREEFS_WORKTREE`).
    pub worktree: String,
    /// Its path under the mount (`WORKTREEFS_PATH`).
    pub path: String,
    /// The registered checkout (`WORKTREEFS_SOURCE`).
    pub source: Option<String>,
    /// Its block of ports: the first (`WORKTREEFS_PORT`) and how many
    /// (`WORKTREEFS_PORTS`); null without one.
    pub port: Option<u16>,
    pub ports: Option<u16>,
}

/// The warm snapshot a new worktree shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmShownJson {
    pub warm_snapshot_files: u64,
    pub warm_snapshot_bytes: u64,
    pub warm_snapshot_took_ms: Option<u64>,
    /// When the snapshot was taken (RFC 3339): how old what the worktree inherits is.
    pub warm_snapshot_taken_at: String,
    /// Since it was taken: its files changed or gone in the source checkout, and its
    /// directories that gained or lost entries (absent when it was taken now, or when it
    /// does not record what it read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_snapshot_moved_files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_snapshot_moved_dirs: Option<u64>,
    /// false when the look ran out of its time (10 ms): at least that many moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_snapshot_moved_complete: Option<bool>,
}

/// `new --from --json`: the fork, its parent, the commit it starts at, what was copied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub forked_from: String,
    pub head: String,
    pub copied: CopiedJson,
    pub notes: Vec<String>,
}

/// What a fork copied of its parent's changes, and how long that took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopiedJson {
    pub files: u64,
    pub bytes: u64,
    pub dirs: u64,
    pub other: u64,
    pub took_ms: u64,
}

/// `restore --json`: the worktree brought back, the kept removal it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoredJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub restored_from: WorktreeId,
    pub notes: Vec<String>,
}

/// `warm --json`: the snapshot taken, what it left out, the older ones it deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmJson {
    pub snapshot: SnapshotJson,
    pub links: u64,
    /// Files the last snapshot of the same user read that were not read again: nothing
    /// of them moved since (device, inode, size, modification and change times, mode).
    pub unchanged: u64,
    pub patterns: Vec<String>,
    pub unmatched: Vec<String>,
    pub skipped: Vec<SkippedJson>,
    pub deleted: Vec<i64>,
}

/// A file a warm snapshot did not take, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkippedJson {
    pub path: String,
    pub reason: String,
}

/// `lease acquire --json`: the worktree after acquiring, and the lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquiredJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub session: String,
    pub exclusive: bool,
    pub new: bool,
    pub acquired_at: Option<String>,
}

/// `lease release --json`: the worktree after releasing, why, and whether the session's
/// turn ended with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleasedJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub session: String,
    pub reason: Option<String>,
    pub turn_ended: bool,
}

/// `turns end --json`: the turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnEndedJson {
    #[serde(flatten)]
    pub turn: TurnJson,
    pub ended: bool,
}

/// A turn as `.control/turns` shows it: with how many files in its worktree are open for
/// writing through the mount (their writes never reach a guard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlTurnJson {
    #[serde(flatten)]
    pub turn: TurnJson,
    pub open_for_writing: u64,
}

/// A turn whose command ended, in its `--report` file: `ended` and the exit status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnOutcomeJson {
    pub outcome: String,
    pub exit_status: i32,
}

/// `reclaim --json`: the worktree as it is now (`W`: a [`WorktreeJson`], or an
/// [`UnknownWorktreeJson`] when there is none), what happened and why; `error` on a
/// refusal, `did_you_mean` with `not-found`, `discarded` with `--discard`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimJson<W> {
    #[serde(flatten)]
    pub worktree: W,
    pub outcome: String,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub did_you_mean: Option<String>,
}

impl<W> ReclaimJson<W> {
    /// The same outcome, about `worktree`.
    pub fn about<V>(self, worktree: V) -> ReclaimJson<V> {
        ReclaimJson {
            worktree,
            outcome: self.outcome,
            detail: self.detail,
            discarded: self.discarded,
            error: self.error,
            did_you_mean: self.did_you_mean,
        }
    }
}

/// A worktree there is no row of: its names, no path, no state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnknownWorktreeJson {
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub path: Option<PathBuf>,
    pub state: Option<String>,
}

/// `unmount --json`: unmounted (or detached, with who is still inside), and what the
/// cleanup ended meanwhile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnmountJson {
    pub outcome: String,
    pub mountpoint: PathBuf,
    pub inside: Vec<String>,
    pub cleaned: Vec<CleanedJson>,
}

/// A worktree an unmount's cleanup ended: removed or retained, why, when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanedJson {
    pub worktree: String,
    pub repo: Option<String>,
    pub name: Option<String>,
    pub state: String,
    pub reason: Option<String>,
    pub at: String,
}

/// `mount --json`: where, the daemon, the repositories, the one this mount registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountJson {
    pub mountpoint: PathBuf,
    pub pid: i32,
    pub state_dir: PathBuf,
    pub repos: Vec<RepoJson>,
    pub registered: Option<String>,
}

/// `repo remove --json`: the repository removed, and how many kept removals went with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoRemovedJson {
    #[serde(flatten)]
    pub repo: RepoJson,
    pub removed: bool,
    pub purged: u64,
}

/// `.control/stats`: the daemon's counters, its transport, its memory and descriptors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsJson {
    pub content_reads: u64,
    pub blob_fills: u64,
    pub copy_ups: u64,
    pub conversions: u64,
    pub content_paths: Vec<String>,
    pub lookups: u64,
    pub getattrs: u64,
    pub opendirs: u64,
    pub readdirs: u64,
    pub passthrough_opens: u64,
    pub passthrough: bool,
    pub transport: String,
    /// io_uring's queue threads yield their CPU to the callers they answer.
    pub yield_cpu: bool,
    pub xattr_requests: u64,
    pub nodes: u64,
    pub removed_files_kept_open: u64,
    pub open_descriptors: u64,
    pub heap_in_use: Option<u64>,
}

/// What a tree uses (`du --json`): bytes on disk (allocated blocks, as `du` counts), bytes
/// of content (file sizes), and entries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageJson {
    pub bytes: u64,
    pub apparent_bytes: u64,
    pub entries: u64,
}

/// One worktree's usage (`du --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorktreeUsageJson {
    pub id: WorktreeId,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub state: String,
    #[serde(flatten)]
    pub usage: UsageJson,
}

/// One kept removal's usage (`du --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptUsageJson {
    pub id: WorktreeId,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    #[serde(flatten)]
    pub usage: UsageJson,
}

/// `du --json`: each worktree's and kept removal's usage, and the rest of the state
/// directory's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DuJson {
    pub state_dir: PathBuf,
    pub worktrees: Vec<WorktreeUsageJson>,
    pub removed: Vec<KeptUsageJson>,
    /// The content store every worktree shares (base files read, warm snapshots'
    /// contents), the warm snapshots' manifests, the indexes made once per tree.
    pub blobs: UsageJson,
    pub warm: UsageJson,
    pub index_cache: UsageJson,
    pub database: UsageJson,
    /// What is being deleted (a removal's files on their way out).
    pub trash: UsageJson,
    /// The whole state directory, each file once, mounts left out.
    pub total: UsageJson,
}

/// How a `doctor` check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// One of `doctor --json`'s checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckJson {
    pub check: String,
    pub status: CheckStatus,
    pub detail: String,
    /// What to do about it (None when there is nothing to do).
    pub fix: Option<String>,
}
