//! A named acquisition as `lease acquire`, `run` and `turn` ask it: waiting for the
//! holders to go, then a typed refusal naming each.

use std::fs;
use std::time::Duration;

use worktreefs::daemon;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::exit::Failed;

/// What a named acquisition asks: exclusive or not, and how long to wait for the holders
/// to go.
#[derive(Clone, Copy)]
pub struct Want {
    pub exclusive: bool,
    pub wait: Option<u64>,
}

/// How often a `--wait` looks again.
pub const WAIT_POLL: Duration = Duration::from_millis(200);

/// A named acquisition of `row` (`repo/name`) by `lease`, as the `lease acquire` and
/// `run` commands ask it: refused for occupancy, after waiting up to `wait` seconds for
/// the holders to go, or for the worktree's state (deleting, removed), each a typed
/// refusal. Ok(false): the holder already had it.
pub fn acquire_named(
    state: &StateDir,
    store: &mut Store,
    (repo, name, row): (&str, &str, &worktreefs::store::WorktreeRow),
    lease: &worktreefs::store::NewLease,
    reason: &str,
    want: &Want,
) -> Result<bool, Failed> {
    use worktreefs::store::{Ask, LeaseError};
    let Want { exclusive, wait } = *want;
    let liveness = worktreefs::process::info::liveness_for(std::process::id() as i32);
    let ask = Ask {
        exclusive,
        liveness: &liveness,
    };
    let started = std::time::Instant::now();
    let deadline = wait.map(|s| {
        started
            .checked_add(Duration::from_secs(s))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400))
    });
    loop {
        match store.acquire_named(row.id, lease, reason, &ask) {
            Ok(inserted) => return Ok(inserted),
            Err(LeaseError::Occupied(mut o)) => {
                if deadline.is_some_and(|d| std::time::Instant::now() < d) {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                // A process holder's last activity is the daemon's (in memory).
                if let Some(d) = daemon::running_daemon(state) {
                    let dir = d.mountpoint.join(".control").join("leases");
                    for x in &mut o {
                        let at = fs::read_to_string(dir.join(x.lease.entry_name()))
                            .ok()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                            .and_then(|v| {
                                v["last_active_at"].as_str().and_then(report::parse_rfc3339)
                            });
                        if at.is_some() {
                            x.lease.active_at = at;
                        }
                    }
                }
                let command_now = |pid: i64| worktreefs::process::info::command_line(pid as i32);
                return Err(report::occupied(
                    repo,
                    name,
                    &o,
                    exclusive,
                    wait.map(|_| started.elapsed().as_secs()),
                    worktreefs::store::now_secs(),
                    &command_now,
                )
                .into());
            }
            Err(LeaseError::Conflict(_, st)) => {
                return Err(report::unleasable(repo, name, Some(st)).into());
            }
            Err(LeaseError::Db(e)) => return Err(e.into()),
        }
    }
}
