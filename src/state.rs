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
//! <state>/trash/<id>/              a removed worktree's directory, until it is deleted
//! <state>/locks/<id>               flock'd by whoever runs a worktree's cleanup
//! <state>/mnt/                     the default mountpoint
//! ```

use std::fs;
use std::path::{Path, PathBuf};

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

    /// Creates the directory layout if it is missing.
    pub fn open(root: &Path) -> std::io::Result<StateDir> {
        fs::create_dir_all(root)?;
        let root = fs::canonicalize(root)?;
        let s = StateDir { root };
        fs::create_dir_all(s.blobs_tmp())?;
        fs::create_dir_all(s.index_cache())?;
        fs::create_dir_all(s.root.join("worktrees"))?;
        fs::create_dir_all(s.root.join("trash"))?;
        fs::create_dir_all(s.root.join("locks"))?;
        Ok(s)
    }

    pub fn lock_file(&self) -> PathBuf {
        self.root.join("daemon.lock")
    }
    pub fn log_file(&self) -> PathBuf {
        self.root.join("daemon.log")
    }
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    pub fn blobs_tmp(&self) -> PathBuf {
        self.root.join("blobs").join("tmp")
    }
    pub fn index_cache(&self) -> PathBuf {
        self.root.join("index-cache")
    }
    pub fn worktree_dir(&self, id: i64) -> PathBuf {
        self.root.join("worktrees").join(id.to_string())
    }
    pub fn upper(&self, id: i64) -> PathBuf {
        self.worktree_dir(id).join("upper")
    }
    pub fn work(&self, id: i64) -> PathBuf {
        self.worktree_dir(id).join("work")
    }
    pub fn trash(&self) -> PathBuf {
        self.root.join("trash")
    }
    pub fn cleanup_lock(&self, id: i64) -> PathBuf {
        self.root.join("locks").join(id.to_string())
    }
    pub fn default_mountpoint(&self) -> PathBuf {
        self.root.join("mnt")
    }
}
