//! Mountpoints: what is mounted where (from /proc/self/mountinfo) and whether a path
//! can take a mount.

use std::fs;
use std::path::Path;

use anyhow::{anyhow, bail, Context};

/// The source and filesystem type mounted at `path`, if anything is.
pub fn mount_type(path: &Path) -> Option<(String, String)> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let want = path.to_string_lossy();
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (unescape_mount_path(target) == want).then(|| (src.to_string(), fstype.to_string()))
    })
}

pub(super) fn is_worktreefs_mount(path: &Path) -> bool {
    matches!(mount_type(path), Some((src, fstype)) if src == "worktreefs" && fstype.starts_with("fuse"))
}

pub fn is_mountpoint(path: &Path) -> bool {
    mount_type(path).is_some()
}

pub(super) fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub(super) fn check_mountpoint(path: &Path) -> anyhow::Result<()> {
    // A worktreefs mount whose daemon died (no daemon holds this state dir's lock, checked
    // by the caller) answers ENOTCONN to everything: detach it and carry on.
    if let Ok(canonical) =
        fs::canonicalize(path).or_else(|_| Ok::<_, std::io::Error>(path.to_path_buf()))
    {
        if is_worktreefs_mount(&canonical) {
            tracing::warn!(
                "detaching the stale worktreefs mount at {} left by a daemon that is gone",
                canonical.display()
            );
            eprintln!(
                "worktreefs: detaching the stale mount at {} (its daemon is gone)",
                canonical.display()
            );
            nix::mount::umount2(&canonical, nix::mount::MntFlags::MNT_DETACH)
                .with_context(|| format!("detaching the stale mount at {}", canonical.display()))?;
        }
    }
    let meta = fs::metadata(path).map_err(|e| {
        anyhow!(
            "mountpoint {} cannot be used: {e}; create an empty directory there first",
            path.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "mountpoint {} is not a directory; pass an empty directory",
            path.display()
        );
    }
    if is_mountpoint(path) {
        bail!(
            "mountpoint {} is already a mount; unmount it first or pick another directory",
            path.display()
        );
    }
    if fs::read_dir(path)?.next().is_some() {
        bail!(
            "mountpoint {} is not empty; worktreefs mounts only on an empty directory",
            path.display()
        );
    }
    Ok(())
}
