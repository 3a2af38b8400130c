//! The state directory a command opens, and its store.

use std::fs;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use worktreefs::daemon;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

/// The state directory `given` (`--state-dir`), or the default one, opened (made if
/// missing), or why not, with a way out.
pub fn open_state(given: Option<PathBuf>) -> anyhow::Result<StateDir> {
    let root = StateDir::resolve(given);
    if fs::metadata(&root).is_ok_and(|m| !m.is_dir()) {
        bail!(
            "state dir {} is a file, not a directory; give --state-dir (or WORKTREEFS_STATE_DIR) a directory, or move the file away",
            root.display()
        );
    }
    StateDir::open(&root).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            anyhow!(
                "state dir {} cannot be used by this user (uid {}): {e}; run as its owner, or use a state dir of your own with --state-dir",
                root.display(),
                nix::unistd::geteuid()
            )
        } else {
            anyhow!("opening state dir {}: {e}", root.display())
        }
    })
}

pub fn open_store(state: &StateDir) -> anyhow::Result<Store> {
    Ok(Store::open_described(&state.root)?)
}

/// Whether state directory `state` holds nothing of anyone's: no daemon serves it, and
/// its database (if any) has no repository and no worktree.
pub fn unused(state: &StateDir) -> bool {
    if daemon::running_daemon(state).is_some() {
        return false;
    }
    if !state.root.join(worktreefs::store::DB_FILE).exists() {
        return true;
    }
    Store::open(&state.root).is_ok_and(|s| {
        s.repos().is_ok_and(|r| r.is_empty()) && s.worktrees().is_ok_and(|w| w.is_empty())
    })
}
