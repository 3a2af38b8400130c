//! The worktree a command means: REPO/WT, a path inside the mount, or the worktree the
//! current directory is in.

use anyhow::anyhow;
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::state::StateDir;

use crate::cli::state::open_store;

/// The worktree a command means, as REPO/WT: `given` as such, or a path inside the mount
/// (read as text, never looked at there), or with nothing given the worktree the current
/// directory is in (`worktreefs::target`). `names_first`: one `/` is always REPO/WT (for
/// `new`, `reclaim` and `restore`, where a path must say it is one).
pub fn which(state: &StateDir, given: Option<&str>, names_first: bool) -> anyhow::Result<String> {
    use worktreefs::target;
    // Not a path, nor REPO/WT: the command's own check says what it takes.
    if names_first && given.is_some_and(|g| !g.contains('/')) {
        return Ok(given.unwrap_or_default().to_string());
    }
    let store = open_store(state)?;
    let recorded = create::mountpoint_of(state, &store);
    let mut mounts = vec![target::physical(&recorded), recorded];
    if let Some(d) = daemon::running_daemon(state) {
        mounts.push(target::physical(&d.mountpoint));
        mounts.push(d.mountpoint);
    }
    mounts.dedup();
    let repos: Vec<String> = store.repos()?.into_iter().map(|r| r.name).collect();
    let cwd = std::env::current_dir().ok();
    target::resolve(given, cwd.as_deref(), &mounts, &|r| {
        names_first || repos.iter().any(|x| x == r)
    })
    .map_err(|e| anyhow!(e))
}

pub fn split_target(target: &str) -> anyhow::Result<(&str, &str)> {
    target
        .split_once('/')
        .ok_or_else(|| anyhow!("'{target}' is not REPO/NAME; for example `worktreefs lease acquire myrepo/task-1 --session s1`"))
}
