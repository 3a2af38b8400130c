//! The shapes of checkpoints: one kept (`checkpoints --json`), one taken (`checkpoint
//! --json`), a rewind (`rewind --json`).

use serde::{Deserialize, Serialize};

use super::rows::WorktreeJson;

/// A checkpoint: its number in the worktree, its label (a turn's: its session), when it
/// was taken, how many paths changed since (in a listing), and what was copied at once
/// (files open for writing then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointJson {
    pub checkpoint: u64,
    pub label: Option<String>,
    pub taken_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_since: Option<usize>,
    pub copied_open: u64,
    pub copied_bytes: u64,
}

impl CheckpointJson {
    /// Checkpoint `id` (labelled `label`, taken at `taken_at` seconds, with `copied`: the
    /// files open for writing copied then and their bytes), and the paths changed since
    /// in a listing.
    pub fn of(
        id: u64,
        label: Option<String>,
        taken_at: i64,
        copied: (u64, u64),
        changed_since: Option<usize>,
    ) -> CheckpointJson {
        CheckpointJson {
            checkpoint: id,
            label,
            taken_at: crate::report::times::rfc3339(taken_at),
            changed_since,
            copied_open: copied.0,
            copied_bytes: copied.1,
        }
    }
}

/// `checkpoint --json`: the worktree, and the checkpoint taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointTakenJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    #[serde(flatten)]
    pub checkpoint: CheckpointJson,
}

/// `rewind --json`: the worktree, the checkpoint it is back at, the one taken first (a
/// rewind to it undoes this one), and how many paths came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewoundJson {
    #[serde(flatten)]
    pub worktree: WorktreeJson,
    pub rewound_to: CheckpointJson,
    pub undo: CheckpointJson,
    pub changed: usize,
}

/// `checkpoints --json`: a worktree's checkpoints, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointsJson {
    pub worktree: String,
    pub checkpoints: Vec<CheckpointJson>,
}
