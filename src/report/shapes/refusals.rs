//! The refusals' shapes: what a command prints, with its `error`, when it will not do
//! what was asked (a worktree somebody holds, one that cannot be had, a turn already
//! running, writers inside, a failed setup, a turn past its limit, an unmount or a
//! repository removal refused, any other failure).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::rows::{RepoJson, SetupJson, TurnJson, WorktreeJson};

/// The refusal of `run` or `turn` in a worktree whose setup failed (`setup-failed`, exit
/// 3; `--ignore-setup` goes ahead).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupFailedJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub setup: SetupJson,
}

/// A holder in an `occupied` refusal: as a lease, with why its process could not be
/// checked (then it counts as holding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderJson {
    pub holder: String,
    pub kind: String,
    pub session: Option<String>,
    pub pid: Option<i64>,
    pub command: Option<String>,
    pub exclusive: bool,
    pub acquired_at: String,
    pub last_active_at: String,
    pub unchecked: Option<String>,
}

/// The ways out of a refusal of a worktree somebody holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaysOut {
    pub new: String,
    pub release: Vec<String>,
    pub wait: String,
}

/// The refusal of a lease on a worktree others hold (`occupied`, exit 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OccupiedJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub exclusive: bool,
    pub holders: Vec<HolderJson>,
    pub waited_secs: Option<u64>,
    pub ways_out: WaysOut,
}

/// The refusal of a worktree that cannot be had: `not-found` (with `did_you_mean` when a
/// worktree of the repository has a close name), `removed`, `deleting`; `lease release`
/// adds the `session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnleasableJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub did_you_mean: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// The refusal of a turn while another runs in the worktree (`busy`, exit 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusyJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub turn: TurnJson,
    pub unchecked: Option<String>,
    pub waited_secs: Option<u64>,
    pub ways_out: WaysOut,
}

/// A process outside a guarded turn that writes in its worktree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriterJson {
    pub pid: i32,
    pub command: String,
    pub path: PathBuf,
    pub how: String,
}

/// The refusal of a guarded turn while processes outside it write there
/// (`writers-inside`, exit 3); the command line adds `open_for_writing` and
/// `waited_secs` when they apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WritersInsideJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub writers: Vec<WriterJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_for_writing: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_secs: Option<u64>,
}

/// Any failure that is not a typed refusal (`failed`): the message people get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedJson {
    pub error: String,
    pub message: String,
}

/// A refusal about one worktree that asks nothing somebody else has (`not-held`,
/// `not-mounted`, `not-running`, …, exit 1): the worktree, the `error`, and the
/// `session` when one was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// A turn whose command ran past `--timeout` (`timed-out`, exit 124): the worktree, the
/// session, the limit, the signal that ended it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimedOutJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub error: String,
    pub session: String,
    pub timeout_secs: u64,
    pub signal: String,
    pub exit_status: i32,
    pub message: String,
}

/// A holder in `reclaim`'s `occupied` refusal: its lease (null fields for a process
/// inside that holds none), whether it is the caller's own, whether it is going.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimHolderJson {
    pub holder: Option<String>,
    pub kind: String,
    pub session: Option<String>,
    pub pid: Option<i64>,
    pub command: Option<String>,
    pub exclusive: bool,
    pub acquired_at: Option<String>,
    pub last_active_at: Option<String>,
    pub leased: bool,
    pub yours: bool,
    pub settling: bool,
    pub unchecked: Option<String>,
}

/// The ways out of a reclaim refused while somebody holds the worktree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimWaysOut {
    pub release: Vec<String>,
    pub wait: String,
}

/// The refusal of a reclaim of a worktree somebody holds (`occupied`, exit 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimOccupiedJson {
    pub error: String,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub holders: Vec<ReclaimHolderJson>,
    pub waited_secs: Option<u64>,
    pub ways_out: ReclaimWaysOut,
}

/// The refusal of an unmount (`not-mounted`, `in-progress`, `in-use` naming who is
/// inside, exit 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnmountRefusedJson {
    pub error: String,
    pub mountpoint: PathBuf,
    pub inside: Vec<String>,
}

/// The refusal of `repo remove` while the repository has worktrees (`has-worktrees`,
/// exit 1), each named with its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HasWorktreesJson {
    #[serde(flatten)]
    pub repo: RepoJson,
    pub error: String,
    pub worktrees: Vec<String>,
}
