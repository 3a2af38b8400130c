//! Setup and teardown commands: the repository's `on-create` command run in each new
//! worktree and its `on-remove` command run before each removal, as the worktree's owner,
//! by a runner process the daemon starts (`worktreefs setup --runner` or `--teardown`,
//! which runs it as a turn's command is run: bounded in time, its process tree ended).
//!
//! `queue.rs` queues a new worktree's run and fails runs whose runner died; `launch.rs`
//! starts runners (setup runners for queued runs, a teardown waited for); `runners.rs`
//! knows which run now (a teardown's processes are let into a worktree that is deleting,
//! nobody else's); `limits.rs` how long each may take; `log.rs` where each run's log is;
//! `environment.rs` the owner's environment the commands start with.

mod environment;
mod launch;
mod limits;
mod log;
mod queue;
mod runners;

pub use environment::owner_environment;
pub use launch::Launcher;
pub use limits::{teardown_limit, DEFAULT_TIMEOUT, LEFT_WORK_LIMIT, TEARDOWN_TIMEOUT};
pub use log::{log_path, read_log, remove_log, LOG_LIMIT, READ_LIMIT};
pub use queue::{fail_orphaned, queue_for_new};
pub use runners::Runners;
