//! The state directory: where the database, the upper layers and the blob cache live.
//!
//! ```text
//! <state>/worktreefs.db            SQLite (WAL)
//! <state>/daemon.lock              flock'd by the one daemon serving this state dir
//! <state>/daemon.log               the daemon's log when it runs in the background
//! <state>/blobs/<2 hex>/<38 hex>   blob cache: one file per blob, read-only
//! <state>/blobs/tmp/               blobs being written
//! <state>/index-cache/             prebuilt git indexes, by base tree and stat data
//! <state>/worktrees/<id>/upper/    a worktree's upper layer
//! <state>/worktrees/<id>/work/     its work directory (copy-up and trash, same filesystem)
//! <state>/worktrees/<id>/conversions  what a checkout converts in its base tree, if anything
//! <state>/worktrees/<id>/submodules   present: initialized submodules show as views
//! <state>/worktrees/<id>/subs/<key>/  one submodule's view: record, upper/, work/
//! <state>/blobs/conv/<2 hex>/<38 hex>  converted content, by blob and conversion
//! <state>/removed/<id>/            a removed worktree's directory, kept for restore (with
//!                                  kept/: its HEAD, index and the ref of its tip)
//! <state>/trash/<id>/              a removed worktree's directory (before removals were kept)
//! <state>/warm/<manifest>          a warm snapshot's manifest (`git::warm`), and
//!                                  `<manifest>.dirs`: its directories that hold entries
//! <state>/locks/<id>               flock'd by whoever runs a worktree's cleanup
//! <state>/mnt/                     the old default mountpoint, inside (kept where it exists)
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use crate::ids::WorktreeId;

/// A worktree's list of converted files (`git::checkout::Conversions`), beside its layers.
pub const CONVERSIONS_FILE: &str = "conversions";

#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    /// `--state-dir`, else `WORKTREEFS_STATE_DIR` (clap fills both into `explicit`), else
    /// `$XDG_STATE_HOME/worktreefs`, else `~/.local/state/worktreefs`.
    pub fn resolve(explicit: Option<PathBuf>) -> PathBuf {
        if let Some(p) = explicit {
            return p;
        }
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(x).join("worktreefs");
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"));
        home.join(".local/state/worktreefs")
    }

    /// Creates the directory layout if it is missing. The state directory is private to
    /// its owner (0700, every directory in it 0700): it holds every worktree's content
    /// and every lease and event. One made public by an older version is made private
    /// again by its owner.
    pub fn open(root: &Path) -> std::io::Result<StateDir> {
        private_dir_all(root)?;
        let root = fs::canonicalize(root)?;
        make_private(&root)?;
        let s = StateDir { root };
        for d in [
            s.blobs(),
            s.blobs_tmp(),
            s.index_cache(),
            s.root.join("worktrees"),
            s.trash(),
            s.removed(),
            s.root.join("locks"),
            s.warm(),
        ] {
            private_dir_all(&d)?;
        }
        Ok(s)
    }

    pub fn lock_file(&self) -> PathBuf {
        self.root.join("daemon.lock")
    }
    pub fn log_file(&self) -> PathBuf {
        self.root.join("daemon.log")
    }
    /// What `worktreefs unmount` asks of the daemon's end (`reclaim`, `keep-sessions`).
    pub fn unmount_mode_file(&self) -> PathBuf {
        self.root.join("unmount-mode")
    }
    /// The daemon's socket, where the command line asks it to reclaim.
    pub fn socket(&self) -> PathBuf {
        self.root.join("daemon.sock")
    }
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    pub fn blobs_tmp(&self) -> PathBuf {
        self.root.join("blobs").join("tmp")
    }
    pub fn warm(&self) -> PathBuf {
        self.root.join("warm")
    }
    pub fn index_cache(&self) -> PathBuf {
        self.root.join("index-cache")
    }
    pub fn worktree_dir(&self, id: WorktreeId) -> PathBuf {
        self.root.join("worktrees").join(id.to_string())
    }
    pub fn upper(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join("upper")
    }
    pub fn work(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join("work")
    }
    /// A worktree's checkpoints (`crate::checkpoint`).
    pub fn checkpoints(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join("checkpoints")
    }
    pub fn conversions(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join(CONVERSIONS_FILE)
    }
    /// Present when the worktree shows its initialized submodules (`new --submodules`).
    pub fn submodules_marker(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join("submodules")
    }
    /// The views of a worktree's submodules: `subs/<key>/{record,upper,work}`.
    pub fn subs(&self, id: WorktreeId) -> PathBuf {
        self.worktree_dir(id).join("subs")
    }
    /// Where removals park a worktree's directory, and keep it for `worktreefs restore`.
    pub fn removed(&self) -> PathBuf {
        self.root.join("removed")
    }
    pub fn removed_dir(&self, id: WorktreeId) -> PathBuf {
        self.removed().join(id.to_string())
    }
    pub fn trash(&self) -> PathBuf {
        self.root.join("trash")
    }
    pub fn cleanup_lock(&self, id: WorktreeId) -> PathBuf {
        self.root.join("locks").join(id.to_string())
    }
    /// Where `mount` mounts when no mountpoint is given: `<state>-mnt`, next to the state
    /// directory rather than in it, so the private state directory does not hide the
    /// mount from the users `--allow-other` lets in. A state directory that already has
    /// the old default, `<state>/mnt`, keeps it: its worktrees' git entries point there.
    pub fn default_mountpoint(&self) -> PathBuf {
        let old = self.old_default_mountpoint();
        // A dead mount there (its daemon died) answers ENOTCONN: it is there all the same.
        let there = match fs::symlink_metadata(&old) {
            Ok(m) => m.is_dir(),
            Err(e) => matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        };
        if there {
            return old;
        }
        let mut name = self.root.file_name().unwrap_or_default().to_os_string();
        name.push("-mnt");
        self.root.with_file_name(name)
    }

    /// The old default mountpoint, inside the state directory (where it exists, it is kept).
    pub fn old_default_mountpoint(&self) -> PathBuf {
        self.root.join("mnt")
    }
}

/// Creates `dir` and its missing parents; `dir` itself gets mode 0700.
fn private_dir_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        r => r,
    }
}

/// Takes group and other permissions off `dir` when this user owns it.
fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = fs::symlink_metadata(dir)?;
    if m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(m.mode() & 0o700))?;
    }
    Ok(())
}
