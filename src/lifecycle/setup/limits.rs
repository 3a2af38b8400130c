//! How long setup and teardown commands, their runners and the looks around them may
//! take, and how many run at once.

use std::time::Duration;

/// How long a setup command may run when its repository sets no limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long a teardown command may run when its repository sets no limit.
pub const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a repository's teardown command may run: its own limit, else
/// [`TEARDOWN_TIMEOUT`].
pub fn teardown_limit(hooks: &crate::store::RepoHooks) -> Duration {
    Duration::from_secs(
        hooks
            .remove_timeout
            .unwrap_or(TEARDOWN_TIMEOUT.as_secs())
            .max(1),
    )
}

/// How long past its command's limit a teardown's runner may take to end it and what it
/// left, before it is killed.
pub(super) const RUNNER_GRACE: Duration = Duration::from_secs(15);

/// How long a queued run may wait for its runner to say who it is before it is failed.
pub(super) const RUNNER_START_WITHIN: i64 = 60;

/// How many setup runs may run at once; the rest wait their turn, queued.
pub(super) const MAX_RUNNING: usize = 8;

/// How long past its limit a setup runner may take to end its command (and to inspect
/// the worktree before and after it, [`LEFT_WORK_LIMIT`] each) before the daemon ends
/// its session.
pub(super) const SETUP_GRACE: Duration = Duration::from_secs(60);

/// How long each of a setup runner's inspections of what the worktree holds may take
/// (twice this and the time to end the command stay within [`SETUP_GRACE`]).
pub const LEFT_WORK_LIMIT: Duration = Duration::from_secs(20);

/// How long reading a worktree's HEAD may take around its teardown.
pub(super) const HEAD_LIMIT: Duration = Duration::from_secs(5);
