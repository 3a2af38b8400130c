//! The rows' shapes: a worktree, a lease, an event, a retained worktree, a kept
//! removal, a repository, a warm snapshot, a turn, a setup run, and the listings built of
//! them (`list`, `status`), each made from its store row.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::{RepoId, WorktreeId};
use crate::report::times::rfc3339;
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
