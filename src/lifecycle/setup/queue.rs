//! Queuing a new worktree's setup run, and failing the runs whose runner is gone.

use crate::store::{SetupRow, Store, WorktreeRow};

use super::limits::{DEFAULT_TIMEOUT, RUNNER_START_WITHIN};

/// Queues worktree `row`'s run of its repository's setup command, if the repository has
/// one. Returns the run queued.
pub fn queue_for_new(store: &Store, row: &WorktreeRow) -> Option<SetupRow> {
    let hooks = match store.hooks_of(row.repo_id) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(
                "{}/{}: its repository's setup command could not be read, so none runs: {e}",
                row.repo,
                row.name
            );
            return None;
        }
    };
    let command = hooks.on_create?;
    let timeout = hooks.create_timeout.unwrap_or(DEFAULT_TIMEOUT.as_secs());
    match store.queue_setup(row.id, &command, timeout) {
        Ok(_) => store.setup_of(row.id).ok().flatten(),
        Err(e) => {
            tracing::warn!(
                "{}/{}: its setup could not be queued: {e}",
                row.repo,
                row.name
            );
            None
        }
    }
}

/// Fails the runs whose runner died without ending them (killed, the machine restarted)
/// or never came. Returns how many.
pub fn fail_orphaned(store: &mut Store) -> usize {
    let gone = |pid: i32, start: i64| {
        crate::process::info::liveness(pid as i64, start) == crate::process::info::Liveness::Gone
    };
    match store.fail_orphaned_setups(&gone, RUNNER_START_WITHIN) {
        Ok(ended) => {
            for id in &ended {
                tracing::warn!("the setup of worktree {id} failed: its runner is gone");
            }
            ended.len()
        }
        Err(e) => {
            tracing::warn!("looking for setups whose runner is gone: {e}");
            0
        }
    }
}
