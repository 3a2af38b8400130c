//! The JSON shapes the rows are printed in (`--json`, `.control/`), one type each, so the
//! shapes `docs/cli.md` shows are checked against them (the tests below read it). Each
//! is made from its row and printed through `serde_json`; fields are named as printed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::times::rfc3339;
use crate::ids::{RepoId, WorktreeId};
use crate::store::WorktreeRow;
use crate::store::{EventRow, KeptRow, LeaseRow, RepoRow, RetainedRow, TurnRow, WarmRow};

/// A worktree (`new`, `list`, `status`, `lease acquire|release`, `reclaim`,
/// `.control/worktrees`, the refusals that carry the worktree).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorktreeJson {
    pub id: WorktreeId,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub path: PathBuf,
    pub state: String,
    pub branch: Option<String>,
    pub branch_created: bool,
    pub base_commit: String,
    pub warm_snapshot: Option<i64>,
    pub created_at: String,
    pub state_changed_at: String,
    /// How many processes are inside it (`list` alone says it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_inside: Option<u64>,
    /// Its run of the repository's setup command, if it has had one (`list` and `new`
    /// say it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupJson>,
}

/// A worktree as `list --json` gives it: the worktree object and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListedJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    #[serde(flatten)]
    pub glance: GlanceJson,
}

/// What a worktree holds, at a glance (`list --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlanceJson {
    /// Entries of its upper layer at paths its base has (modified, replaced, deleted):
    /// with `untracked`, an upper bound of what `git status` lists.
    pub changed: Option<u64>,
    /// Entries at paths its base has not (a new directory counts once).
    pub untracked: Option<u64>,
    /// Its commits not in `compared_with`, and those of `compared_with` not in it.
    pub ahead: Option<usize>,
    pub behind: Option<usize>,
    /// Its branch's upstream (`origin/main`), or `base` (its base commit) where it has
    /// none; null when HEAD cannot be read.
    pub compared_with: Option<String>,
    /// The session whose turn runs in it now.
    pub turn: Option<String>,
    /// The last time anything happened in it: made, a state change, a lease's last
    /// request, an entry of its upper layer made or removed, its setup's end.
    pub last_activity_at: String,
}

/// A worktree's run of its repository's setup command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupJson {
    /// `pending`, `running`, `ok` or `failed`.
    pub state: String,
    /// As `list` shows it: `ok`, `failed (exit 3)`, `failed (timed out after 30 s)`.
    pub summary: String,
    pub command: String,
    pub exit_code: Option<i32>,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
}

impl SetupJson {
    pub fn of(s: &crate::store::SetupRow) -> SetupJson {
        SetupJson {
            state: s.state.as_str().to_string(),
            summary: s.summary(),
            command: s.command.clone(),
            exit_code: s.exit_code,
            started_at: s.started_at.map(rfc3339),
            ended_at: s.ended_at.map(rfc3339),
        }
    }
}

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

impl WorktreeJson {
    /// Worktree `w`, at its path under `mountpoint`.
    pub fn of(w: &WorktreeRow, mountpoint: &Path) -> WorktreeJson {
        WorktreeJson {
            id: w.id,
            worktree: format!("{}/{}", w.repo, w.name),
            repo: w.repo.clone(),
            name: w.name.clone(),
            path: mountpoint.join(&w.repo).join(&w.name),
            state: w.state.as_str().to_string(),
            branch: w.branch.clone(),
            branch_created: w.branch_created,
            base_commit: w.base_commit.clone(),
            warm_snapshot: w.warm,
            created_at: rfc3339(w.created_at),
            state_changed_at: rfc3339(w.state_changed_at),
            processes_inside: None,
            setup: None,
        }
    }
}

/// `status --json`: the state dir, the daemon serving it (none, or detached from its
/// mount), every worktree and every lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusJson {
    pub state_dir: PathBuf,
    pub mountpoint: Option<PathBuf>,
    pub detached: bool,
    pub daemon_pid: Option<i32>,
    pub worktrees: Vec<WorktreeJson>,
    pub leases: Vec<LeaseJson>,
}

/// A lease (`leases`, `status`, `.control/leases`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseJson {
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub holder: String,
    pub kind: String,
    pub session: Option<String>,
    pub pid: Option<i64>,
    pub command: Option<String>,
    pub exclusive: bool,
    pub acquired_at: String,
    pub last_active_at: String,
}

impl LeaseJson {
    pub fn of(l: &LeaseRow) -> LeaseJson {
        LeaseJson {
            worktree: format!("{}/{}", l.repo, l.worktree),
            repo: l.repo.clone(),
            name: l.worktree.clone(),
            holder: l.holder.clone(),
            kind: l.holder_kind.clone(),
            session: l.session.clone(),
            pid: l.pid,
            command: l.command.clone(),
            exclusive: l.exclusive,
            acquired_at: rfc3339(l.acquired_at),
            last_active_at: rfc3339(l.last_active()),
        }
    }
}

/// An event (`events --json`, one per line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventJson {
    pub id: i64,
    pub at: String,
    pub worktree: Option<String>,
    pub repo: Option<String>,
    pub name: Option<String>,
    pub kind: String,
    pub holder: Option<String>,
    pub reason: Option<String>,
}

impl EventJson {
    pub fn of(e: &EventRow) -> EventJson {
        EventJson {
            id: e.id,
            at: rfc3339(e.at),
            worktree: match (&e.repo, &e.worktree) {
                (Some(r), Some(w)) => Some(format!("{r}/{w}")),
                _ => None,
            },
            repo: e.repo.clone(),
            name: e.worktree.clone(),
            kind: e.kind.clone(),
            holder: e.holder.clone(),
            reason: e.reason.clone(),
        }
    }
}

/// A retained worktree (`retained --json`, `.control/retained`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetainedJson {
    pub id: WorktreeId,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub path: String,
    pub branch: Option<String>,
    pub base_commit: String,
    pub reason: String,
    pub holder_reason: Option<String>,
    pub retained_at: String,
}

impl RetainedJson {
    pub fn of(r: &RetainedRow) -> RetainedJson {
        RetainedJson {
            id: r.worktree_id,
            worktree: format!("{}/{}", r.repo, r.worktree),
            repo: r.repo.clone(),
            name: r.worktree.clone(),
            path: r.path.clone(),
            branch: r.branch.clone(),
            base_commit: r.base_commit.clone(),
            reason: r.reason.clone(),
            holder_reason: r.holder_reason.clone(),
            retained_at: rfc3339(r.entered_at),
        }
    }
}

/// A kept removal (`removed --json`, `.control/removed`): `kept_dir` only where the
/// copy's place is said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptJson {
    pub id: WorktreeId,
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub branch: Option<String>,
    pub base_commit: String,
    pub head: String,
    pub tip: Option<String>,
    pub tip_ref: Option<String>,
    pub bytes: i64,
    pub how: String,
    pub removed_at: String,
    pub expires_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_dir: Option<String>,
}

impl KeptJson {
    /// Kept copy `k`, gone `keep_secs` after it was kept, in `kept_dir` when given.
    pub fn of(k: &KeptRow, keep_secs: i64, kept_dir: Option<&Path>) -> KeptJson {
        KeptJson {
            id: k.worktree_id,
            worktree: format!("{}/{}", k.repo, k.worktree),
            repo: k.repo.clone(),
            name: k.worktree.clone(),
            branch: k.branch.clone(),
            base_commit: k.base_commit.clone(),
            head: k.head.clone(),
            tip: k.tip.clone(),
            tip_ref: k.tip_ref.clone(),
            bytes: k.bytes,
            how: k.how.clone(),
            removed_at: rfc3339(k.kept_at),
            expires_at: rfc3339(k.kept_at + keep_secs),
            kept_dir: kept_dir.map(|d| d.display().to_string()),
        }
    }
}

/// A registered repository (`repo list --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoJson {
    pub id: RepoId,
    pub repo: String,
    pub path: PathBuf,
    pub gitdir: PathBuf,
    pub include: Vec<String>,
    pub warm_default: bool,
    pub added_at: String,
    /// Its setup command (`repo set --on-create`), run in each new worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_create: Option<String>,
    /// How long that command may run, in seconds (absent: the default, 1800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_timeout_secs: Option<u64>,
    /// Its teardown command (`repo set --on-remove`), run before each removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_remove: Option<String>,
    /// How long that command may run, in seconds (absent: the default, 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown_timeout_secs: Option<u64>,
}

impl RepoJson {
    pub fn of(r: &RepoRow) -> RepoJson {
        RepoJson {
            id: r.id,
            repo: r.name.clone(),
            path: r.path.clone(),
            gitdir: r.gitdir.clone(),
            include: r.include.clone(),
            warm_default: r.warm_default,
            added_at: rfc3339(r.added_at),
            on_create: None,
            setup_timeout_secs: None,
            on_remove: None,
            teardown_timeout_secs: None,
        }
    }

    /// With its setup command.
    pub fn with_hooks(mut self, hooks: &crate::store::RepoHooks) -> RepoJson {
        self.on_create = hooks.on_create.clone();
        self.setup_timeout_secs = hooks.create_timeout;
        self.on_remove = hooks.on_remove.clone();
        self.teardown_timeout_secs = hooks.remove_timeout;
        self
    }
}

/// A warm snapshot (`warm --json`, `new --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotJson {
    pub id: i64,
    pub uid: u32,
    pub files: u64,
    pub bytes: u64,
    pub took_ms: u64,
    pub skipped_count: u64,
    pub taken_at: String,
}

impl SnapshotJson {
    pub fn of(w: &WarmRow) -> SnapshotJson {
        SnapshotJson {
            id: w.id,
            uid: w.uid,
            files: w.files,
            bytes: w.bytes,
            took_ms: w.took_ms,
            skipped_count: w.skipped,
            taken_at: rfc3339(w.taken_at),
        }
    }
}

/// A running turn (`turns --json`, `.control/turns`, a busy refusal): `path` is null
/// where no mountpoint is known.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnJson {
    pub worktree: String,
    pub repo: String,
    pub name: String,
    pub path: Option<PathBuf>,
    pub session: String,
    pub pid: i64,
    pub command: String,
    pub guard: bool,
    pub started_at: String,
}

impl TurnJson {
    /// Turn `t`, its worktree's path under `mountpoint` when one is known.
    pub fn of(t: &TurnRow, mountpoint: Option<&Path>) -> TurnJson {
        TurnJson {
            worktree: format!("{}/{}", t.repo, t.worktree),
            repo: t.repo.clone(),
            name: t.worktree.clone(),
            path: mountpoint.map(|m| m.join(&t.repo).join(&t.worktree)),
            session: t.session.clone(),
            pid: t.pid,
            command: t.command.clone(),
            guard: t.guard,
            started_at: rfc3339(t.started_at),
        }
    }
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

/// The refusal of an unmount (`not-mounted`, `in-progress`, `in-use` naming who is
/// inside, exit 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnmountRefusedJson {
    pub error: String,
    pub mountpoint: PathBuf,
    pub inside: Vec<String>,
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
    pub xattr_requests: u64,
    pub nodes: u64,
    pub removed_files_kept_open: u64,
    pub open_descriptors: u64,
    pub heap_in_use: Option<u64>,
}

/// `shape` as a JSON value (the shapes hold strings, numbers and paths: always encodable).
pub fn value(shape: impl Serialize) -> serde_json::Value {
    serde_json::to_value(shape).expect("a shape of plain values encodes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::Value;

    /// The examples of `docs/cli.md` under the heading that starts with `heading`: each
    /// code block up to the next heading of its level or above, parsed (a block of one
    /// object per line gives each line; a block marked `json` must parse whole). An
    /// array's `"…"` (more of the same) is dropped.
    fn examples(heading: &str) -> Vec<Value> {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
            .expect("docs/cli.md");
        let start = doc
            .lines()
            .position(|l| l.starts_with(heading))
            .unwrap_or_else(|| panic!("docs/cli.md has no heading {heading:?}"));
        let level = heading.split(' ').next().unwrap().len();
        let mut out = Vec::new();
        let mut block: Option<Vec<&str>> = None;
        let mut marked_json = false;
        for line in doc.lines().skip(start + 1) {
            let hashes = line.chars().take_while(|&c| c == '#').count();
            if block.is_none() && hashes > 0 && hashes <= level {
                break;
            }
            match (&mut block, line.starts_with("```")) {
                (None, true) => {
                    block = Some(Vec::new());
                    marked_json = line.trim() == "```json";
                }
                (Some(lines), true) => {
                    let text = lines.join("\n");
                    if let Ok(v) = serde_json::from_str::<Value>(&text) {
                        out.push(v);
                    } else if marked_json {
                        panic!("{heading}: a block marked json does not parse:\n{text}");
                    } else {
                        // One object per line (`events`, `.control` files), or not JSON
                        // (a command, a table): only what parses counts.
                        out.extend(
                            lines
                                .iter()
                                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                                .filter(Value::is_object),
                        );
                    }
                    block = None;
                }
                (Some(lines), false) => lines.push(line),
                (None, false) => {}
            }
        }
        out.into_iter()
            .flat_map(|v| match v {
                Value::Array(items) => items
                    .into_iter()
                    .filter(|i| i.as_str() != Some("…"))
                    .collect(),
                other => vec![other],
            })
            .collect()
    }

    /// Every example under `heading` is a `T` to the field, and prints back as shown.
    fn shows<T: DeserializeOwned + Serialize>(heading: &str) -> usize {
        shows_where::<T>(heading, |_| true)
    }

    /// As [`shows`], for the examples under `heading` that `pick` picks.
    fn shows_where<T: DeserializeOwned + Serialize>(
        heading: &str,
        pick: impl Fn(&Value) -> bool,
    ) -> usize {
        let found: Vec<Value> = examples(heading).into_iter().filter(|v| pick(v)).collect();
        assert!(!found.is_empty(), "no example under {heading:?}");
        for example in &found {
            let typed: T = serde_json::from_value(example.clone()).unwrap_or_else(|e| {
                panic!(
                    "{heading}: the example is not a {}: {e}\n{example:#}",
                    std::any::type_name::<T>()
                )
            });
            assert_eq!(
                &value(&typed),
                example,
                "{heading}: printed back differently"
            );
        }
        found.len()
    }

    #[test]
    fn the_shared_shapes_in_the_docs_are_the_types() {
        assert_eq!(shows::<WorktreeJson>("### The worktree object"), 2);
        assert_eq!(shows::<LeaseJson>("### The lease object"), 2);
        assert!(shows::<LeaseJson>("## `leases --json`") >= 2);
        assert!(shows::<RetainedJson>("## `retained --json`") >= 1);
        assert!(shows::<KeptJson>("## `removed --json`") >= 1);
        assert!(shows::<RepoJson>("## `repo list --json`") >= 1);
        assert!(shows::<EventJson>("## `events --json`") >= 2);
        assert_eq!(shows::<OccupiedJson>("### Refusal `occupied`"), 1);
        assert_eq!(
            shows_where::<TurnJson>("## `turns --json`", |v| v.get("open_for_writing").is_none()),
            1
        );
        assert_eq!(
            shows_where::<ControlTurnJson>("## `turns --json`", |v| v
                .get("open_for_writing")
                .is_some()),
            1
        );
        assert_eq!(shows::<FailedJson>("### The failure object"), 1);
        assert!(shows::<ListedJson>("## `list --json`") >= 1);
        assert!(shows::<StatusJson>("## `status --json`") >= 2);
        let error = |e: &'static str| move |v: &Value| v["error"] == e;
        assert_eq!(
            shows::<UnleasableJson>("### The unknown-worktree refusal"),
            1
        );
        assert_eq!(
            shows::<UnleasableJson>("### Refusals `not-found`, `removed`"),
            1
        );
        assert_eq!(
            shows_where::<BusyJson>("## `turn --json`", error("busy")),
            1
        );
    }

    /// What a command prints besides the rows, checked the same way: each outcome and
    /// refusal against the examples under its command's heading.
    #[test]
    fn the_outcomes_in_the_docs_are_the_types() {
        let error = |e: &'static str| move |v: &Value| v["error"] == e;
        let no_error = |v: &Value| v.get("error").is_none();
        assert_eq!(shows::<NewJson>("### `new --warm --json`"), 1);
        assert_eq!(shows::<NewJson>("### `new --reuse --json`"), 1);
        assert_eq!(shows::<EnvJson>("## `env --json`"), 1);
        assert_eq!(shows_where::<SetupJson>("## `setup --json`", no_error), 1);
        assert_eq!(
            shows_where::<SetupFailedJson>("## `setup --json`", error("setup-failed")),
            1
        );
        assert_eq!(shows::<ForkJson>("### `new --from --json`"), 1);
        assert_eq!(shows::<RestoredJson>("## `restore --json`"), 1);
        assert_eq!(shows::<WarmJson>("## `warm --json`"), 1);
        assert_eq!(
            shows_where::<AcquiredJson>("## `lease acquire --json`", no_error),
            1
        );
        assert_eq!(shows::<ReleasedJson>("## `lease release --json`"), 1);
        assert_eq!(
            shows_where::<TurnEndedJson>("## `turns end --json`", no_error),
            1
        );
        assert_eq!(
            shows_where::<TimedOutJson>("### Past `--timeout`", error("timed-out")),
            1
        );
        assert_eq!(
            shows_where::<TurnOutcomeJson>("### Past `--timeout`", |v| v["outcome"] == "ended"),
            1
        );
        let reclaim = "## `reclaim --json`";
        assert_eq!(
            shows_where::<ReclaimJson<WorktreeJson>>(reclaim, |v| v.get("id").is_some()),
            4
        );
        assert_eq!(
            shows_where::<ReclaimJson<UnknownWorktreeJson>>(reclaim, |v| v.get("id").is_none()
                && v["error"] != "occupied"),
            1
        );
        assert_eq!(
            shows_where::<ReclaimOccupiedJson>(reclaim, error("occupied")),
            1
        );
        let unmount = "## `unmount --json`";
        assert_eq!(shows_where::<UnmountJson>(unmount, no_error), 2);
        assert_eq!(
            shows_where::<UnmountRefusedJson>(unmount, |v| v.get("error").is_some()),
            1
        );
        assert_eq!(shows::<MountJson>("## `mount --json`"), 1);
        assert_eq!(shows::<StatsJson>("## `.control/stats`"), 1);
        let repo = "## `repo add|set|remove --json`";
        assert_eq!(
            shows_where::<RepoJson>(repo, |v| no_error(v) && v.get("removed").is_none()),
            1
        );
        assert_eq!(
            shows_where::<RepoRemovedJson>(repo, |v| v.get("removed").is_some()),
            1
        );
        assert_eq!(
            shows_where::<HasWorktreesJson>(repo, error("has-worktrees")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `run --json`", error("not-mounted")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `turn --json`", error("not-mounted")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `turns end --json`", error("other-session")),
            1
        );
        assert_eq!(
            shows_where::<WritersInsideJson>("## `turn --json`", error("writers-inside")),
            2
        );
    }

    /// The check itself: a field the type lacks, or one it has that the example lacks,
    /// is found.
    #[test]
    fn a_shape_that_differs_from_its_type_is_found() {
        let w = serde_json::json!({
            "id": 1, "worktree": "r/a", "repo": "r", "name": "a", "path": "/m/r/a",
            "state": "ready", "branch": null, "branch_created": false, "base_commit": "c",
            "warm_snapshot": null, "created_at": "t", "state_changed_at": "t"
        });
        let typed: WorktreeJson = serde_json::from_value(w.clone()).unwrap();
        assert_eq!(value(&typed), w);
        let mut extra = w.clone();
        extra["size"] = 0.into();
        assert!(serde_json::from_value::<WorktreeJson>(extra).is_err());
        let mut missing = w;
        missing.as_object_mut().unwrap().remove("state");
        assert!(serde_json::from_value::<WorktreeJson>(missing).is_err());
    }
}
