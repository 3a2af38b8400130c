//! Checkpoints asked of the daemon: taking one and rewinding run in it (they need the
//! view's node table, its open files and its `mutate`); a rewind is refused first while
//! a turn runs in the worktree, while git holds its `index.lock`, or while processes
//! outside the caller's session have files open for writing in it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::Info;
use crate::fs::View;
use crate::store::Store;

/// A checkpoint as the socket carries it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub id: u64,
    pub label: Option<String>,
    pub taken_at: i64,
    pub copied_open: u64,
    pub copied_bytes: u64,
}

impl From<Info> for CheckpointInfo {
    fn from(i: Info) -> Self {
        CheckpointInfo {
            id: i.id,
            label: i.label,
            taken_at: i.taken_at,
            copied_open: i.copied_open,
            copied_bytes: i.copied_bytes,
        }
    }
}

/// What the daemon did with a checkpoint's request (the socket answers with it).
#[derive(Debug)]
pub(super) enum Done {
    Taken(CheckpointInfo),
    Rewound {
        to: CheckpointInfo,
        before: CheckpointInfo,
        changed: usize,
    },
    /// Refused for now: why, and the ways out.
    Refused(String),
    /// No such worktree or checkpoint.
    Gone(String),
    Failed(String),
}

fn error(message: String) -> Done {
    Done::Failed(message)
}

/// Takes a checkpoint of `repo/name` in the daemon's view.
pub(super) fn take(
    view: &View,
    store: &Store,
    repo: &str,
    name: &str,
    label: Option<String>,
) -> Done {
    let row = match store.worktree(repo, name) {
        Ok(Some(r)) if r.state != crate::lease::State::Removed => r,
        Ok(_) => return Done::Gone(format!("worktree {repo}/{name} does not exist")),
        Err(e) => return error(format!("{e:#}")),
    };
    match view.take_checkpoint(row.id, label) {
        Ok(info) => Done::Taken(info.into()),
        Err(e) => error(format!(
            "checkpoint of {repo}/{name} not taken: {}",
            e.message
        )),
    }
}

/// Rewinds `repo/name` to checkpoint `to`, unless something refuses it (`caller`: the
/// pid that asked, whose session's own writers do not count).
pub(super) fn rewind(
    view: &View,
    store: &Store,
    mountpoint: &Path,
    (repo, name): (&str, &str),
    to: u64,
    caller: Option<i32>,
) -> Done {
    let row = match store.worktree(repo, name) {
        Ok(Some(r)) if r.state != crate::lease::State::Removed => r,
        Ok(_) => return Done::Gone(format!("worktree {repo}/{name} does not exist")),
        Err(e) => return error(format!("{e:#}")),
    };
    if let Err(message) = refusal(store, mountpoint, &row, caller) {
        return Done::Refused(message);
    }
    match view.rewind(row.id, to) {
        Ok(done) => Done::Rewound {
            to: done.to.into(),
            before: done.before.into(),
            changed: done.changed,
        },
        Err(e) if e.errno() == libc::ENOENT => Done::Gone(format!(
            "{repo}/{name} has no checkpoint {to}: see `worktreefs checkpoints {repo}/{name}`"
        )),
        // Refused before anything changed, with the way out.
        Err(e) if e.errno() == libc::EBUSY => Done::Refused(format!(
            "the rewind of {repo}/{name} to checkpoint {to}: {}",
            e.message
        )),
        Err(e) => error(format!(
            "the rewind of {repo}/{name} to checkpoint {to} failed: {}",
            e.message
        )),
    }
}

/// Why a rewind of `row` may not run now, with the ways out.
fn refusal(
    store: &Store,
    mountpoint: &Path,
    row: &crate::store::WorktreeRow,
    caller: Option<i32>,
) -> Result<(), String> {
    let at = format!("{}/{}", row.repo, row.name);
    let turns = store.turns().map_err(|e| format!("{e:#}"))?;
    if let Some(t) = turns.iter().find(|t| t.worktree_id == row.id) {
        return Err(format!(
            "a turn runs in {at} (session {}, pid {}): rewind once it has ended",
            t.session, t.pid
        ));
    }
    let repo = store
        .repo_by_id(row.repo_id)
        .map_err(|e| format!("{e:#}"))?
        .ok_or_else(|| format!("{at}'s repository is not registered"))?;
    let lock = crate::git::admin::admin_dir(&repo.gitdir, &row.admin_name).join("index.lock");
    if lock.exists() {
        return Err(format!(
            "git holds {} (a git command runs in {at}, or one that died left it): rewind once it has ended, or remove the file if no git command runs there",
            lock.display()
        ));
    }
    let dir = crate::target::physical(mountpoint)
        .join(&row.repo)
        .join(&row.name);
    let session = caller
        .and_then(crate::process::info::proc_info)
        .map(|p| p.session);
    let theirs = |pid: i32| {
        session
            .is_some_and(|s| crate::process::info::proc_info(pid).is_some_and(|p| p.session == s))
    };
    let writers = crate::process::inside::writers_below(&dir, theirs);
    if !writers.is_empty() {
        let named: Vec<String> = writers
            .iter()
            .map(|(pid, path)| {
                let cmd = crate::process::info::command_line(*pid).unwrap_or_default();
                format!("pid {pid} ({cmd}) writes {}", path.display())
            })
            .collect();
        return Err(format!(
            "processes outside your session have files open for writing in {at}: {}; end them or wait for them to close those files, then rewind",
            named.join("; ")
        ));
    }
    Ok(())
}
