//! The `.control` tree's layout (its directories, fixed inodes and names, stated once) and
//! its files' modes. What the files say is `control_files.rs`.

use std::time::SystemTime;

use super::types::Attr;
use crate::ino::Ino;

pub(super) const CONTROL_INO: Ino = Ino(2);
pub const CONTROL_NAME: &str = ".control";
/// Looking up `.control/refresh` makes the daemon re-read the store at once.
pub const REFRESH_NAME: &str = "refresh";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ControlDir {
    Top,
    Leases,
    Worktrees,
    Retained,
    /// `<repo>:<worktree>#<id>`: removed worktrees still restorable.
    Removed,
    /// `<repo>:<worktree>`: running turns.
    Turns,
    /// `<repo>:<worktree>`: what `run` and `turn` give their commands (its ports among
    /// them), as `export` lines to source.
    Env,
    /// `<repo>:<worktree>`: what the worktree's last setup run printed.
    SetupLog,
    /// `<repo>:<worktree>@<token>`: git's fsmonitor hook reads what changed (see
    /// `git/fsmonitor.rs`, `fs/journal.rs`).
    FsMonitor,
    /// `<repo>:<worktree>`: its checkpoints, as `checkpoints --json` prints them.
    Checkpoints,
}

/// `.control/status`: the table `worktreefs status` prints.
pub(super) const STATUS: &str = "status";
/// `.control/stats`: the daemon's counters (JSON).
pub(super) const STATS: &str = "stats";

/// What `.control` itself holds, stated once: inode, name, and the directory it is (None:
/// a generated file of `.control` itself). The view's fixed nodes, the listing of
/// `.control` and its names all come from here.
pub(super) const LAYOUT: [(Ino, &str, Option<ControlDir>); 11] = [
    (Ino(3), "leases", Some(ControlDir::Leases)),
    (Ino(4), "worktrees", Some(ControlDir::Worktrees)),
    (Ino(5), "retained", Some(ControlDir::Retained)),
    (Ino(9), "removed", Some(ControlDir::Removed)),
    (Ino(10), "turns", Some(ControlDir::Turns)),
    (Ino(11), "env", Some(ControlDir::Env)),
    (Ino(12), "setup-log", Some(ControlDir::SetupLog)),
    (Ino(13), "checkpoints", Some(ControlDir::Checkpoints)),
    (Ino(6), STATUS, None),
    (Ino(7), STATS, None),
    (
        Ino(8),
        crate::git::fsmonitor::CONTROL_DIR,
        Some(ControlDir::FsMonitor),
    ),
];

/// The mode of `.control`'s directory `ino`. `.control` shows every lease with its
/// command line: on a mount other users may use (`--allow-other`), only the mount's owner
/// lists and reads it; others may only pass through to `fsmonitor/`, whose answers git's
/// hook reads by name for the worktrees it works in, and to `setup-log/`, where a
/// worktree's owner reads its setup log by name.
pub(super) fn control_dir_perm(ino: Ino) -> u16 {
    let dir = LAYOUT
        .iter()
        .find(|&&(i, _, _)| i == ino)
        .and_then(|&(_, _, d)| d);
    match dir {
        Some(ControlDir::FsMonitor | ControlDir::SetupLog) => 0o511,
        Some(_) => 0o500,
        // `.control` itself.
        None => 0o511,
    }
}

/// A generated file of `.control`, 0400: the mount owner's (the daemon's user), except
/// that an fsmonitor answer and a setup log belong to the owner of the worktree they are
/// about (`owner`): the user whose git asks for the one, whose command wrote the other.
pub(super) fn control_file_attr(ino: Ino, len: usize, owner: Option<(u32, u32)>) -> Attr {
    let (uid, gid) = owner.unwrap_or_else(|| {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    });
    let mut a = Attr::memory(ino, len, SystemTime::now(), uid, gid);
    a.perm = 0o400;
    a
}

/// Whether `name` in `.control` itself is a directory.
pub(super) fn is_control_dir(name: &str) -> bool {
    LAYOUT.iter().any(|&(_, n, dir)| n == name && dir.is_some())
}
