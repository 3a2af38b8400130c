//! Where the mount is recorded (the last mount's, else the default) and where a
//! worktree's `.git` file is under it: what git's admin entries point at.

use std::path::{Path, PathBuf};

use crate::state::StateDir;
use crate::store::Store;

pub const META_MOUNTPOINT: &str = "mountpoint";

/// The mountpoint git's admin entries point at: the one recorded by the last mount, else
/// the default one.
pub fn mountpoint_of(state: &StateDir, store: &Store) -> PathBuf {
    store
        .meta_get(META_MOUNTPOINT)
        .ok()
        .flatten()
        .map(PathBuf::from)
        .unwrap_or_else(|| state.default_mountpoint())
}

pub fn gitfile_path(mountpoint: &Path, repo: &str, name: &str) -> PathBuf {
    mountpoint.join(repo).join(name).join(".git")
}
