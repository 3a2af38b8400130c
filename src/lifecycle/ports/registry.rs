//! This user's registry of claims (one file a block, naming the worktree and the state
//! directory), locked while it is read and written, and never written through a symlink.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::ids::WorktreeId;
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::state::StateDir;
use crate::store::{PortBlock, Store};

/// Where the claims are: root's registry for every state directory of root's, a user's
/// own for that user's.
pub(super) fn registry() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/worktreefs/ports");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("worktreefs/ports"),
        _ => std::env::temp_dir().join(format!(
            "worktreefs-ports-{}",
            nix::unistd::geteuid().as_raw()
        )),
    }
}

/// How long a creation waits for another process's allocation before it goes on without
/// ports.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One claim file: its block, and the worktree and state directory it is for.
pub(super) struct Claim {
    pub(super) block: PortBlock,
    pub(super) id: Option<WorktreeId>,
    pub(super) root: PathBuf,
}

/// The registry, locked for as long as this lives: a directory of this user's that
/// nobody else may write, reached through no symlink, and whose files are never opened
/// through one.
pub(super) struct Registry {
    dir: PathBuf,
    _lock: fs::File,
}

impl Registry {
    pub(super) fn open(dir: &Path) -> LifecycleResult<Registry> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("making {}", dir.display()))?;
        let meta =
            fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
        if !meta.is_dir()
            || meta.uid() != nix::unistd::geteuid().as_raw()
            || meta.mode() & 0o022 != 0
        {
            return Err(crate::lifecycle::error::refused(format!(
                "{} is not a directory of this user's that only it may write (a symlink, another user's, or writable by others): no ports are claimed there",
                dir.display()
            )));
        }
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(dir.join(".lock"))
            .with_context(|| format!("opening {}", dir.join(".lock").display()))?;
        let until = std::time::Instant::now() + LOCK_WAIT;
        // SAFETY: flock on a descriptor this function owns; released when it is closed.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if std::time::Instant::now() >= until {
                return Err(crate::lifecycle::error::refused(format!(
                    "{} stayed locked by another allocation for {} s",
                    dir.join(".lock").display(),
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(Registry {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    pub(super) fn claims(&self) -> LifecycleResult<Vec<Claim>> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = Vec::new();
        for e in
            fs::read_dir(&self.dir).with_context(|| format!("listing {}", self.dir.display()))?
        {
            let e = e.with_context(|| format!("listing {}", self.dir.display()))?;
            let Some(block) = parse_claim_name(&e.file_name().to_string_lossy()) else {
                continue;
            };
            // `<id>\n<state root>`: the root last, as bytes (it may hold anything).
            let text = fs::read(e.path()).unwrap_or_default();
            let (id, root) = match text.iter().position(|b| *b == b'\n') {
                Some(n) => (
                    std::str::from_utf8(&text[..n])
                        .ok()
                        .and_then(|s| s.parse().ok()),
                    PathBuf::from(std::ffi::OsStr::from_bytes(&text[n + 1..])),
                ),
                None => (None, PathBuf::new()),
            };
            out.push(Claim { block, id, root });
        }
        Ok(out)
    }

    pub(super) fn write(
        &self,
        b: PortBlock,
        state: &StateDir,
        id: WorktreeId,
    ) -> LifecycleResult<()> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(claim_name(b));
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("claiming {}", path.display()))?;
        let mut text = format!("{id}\n").into_bytes();
        text.extend_from_slice(state.root.as_os_str().as_bytes());
        f.write_all(&text)
            .with_context(|| format!("claiming {}", path.display()))?;
        Ok(())
    }

    /// Block `b` claimed for worktree `id` and recorded as its own, and counted as
    /// claimed from now on.
    pub(super) fn give(
        &self,
        b: PortBlock,
        state: &StateDir,
        store: &Store,
        id: WorktreeId,
        claimed: &mut Vec<PortBlock>,
    ) -> LifecycleResult<()> {
        self.write(b, state, id)?;
        store
            .set_ports(id, b)
            .context("recording the worktree's ports")?;
        claimed.push(b);
        Ok(())
    }

    pub(super) fn remove(&self, b: PortBlock) {
        let _ = fs::remove_file(self.dir.join(claim_name(b)));
    }

    /// The blocks claimed, after dropping the claims that hold nothing any more: this
    /// state directory's that its store no longer has, another's whose state directory
    /// is not there (gone, not merely unreadable). This state directory's live blocks are
    /// claimed again where no claim is (a reboot empties /run); one another state
    /// directory claimed meanwhile is returned in the second list.
    pub(super) fn sync(
        &self,
        state: &StateDir,
        live: &[(WorktreeId, PortBlock)],
    ) -> LifecycleResult<Synced> {
        let mut claimed = Vec::new();
        let mut ours = Vec::new();
        for c in self.claims()? {
            let stale = if c.root == state.root {
                !live.iter().any(|(w, b)| Some(*w) == c.id && *b == c.block)
            } else {
                c.root.as_os_str().is_empty()
                    || fs::symlink_metadata(&c.root)
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            };
            if stale {
                self.remove(c.block);
                continue;
            }
            if c.root == state.root {
                ours.push(c.block);
            }
            claimed.push(c.block);
        }
        let mut taken_over = Vec::new();
        for (w, b) in live {
            if ours.contains(b) {
                continue;
            }
            if claimed.iter().any(|c| c.overlaps(b)) {
                taken_over.push((*w, *b));
                continue;
            }
            self.write(*b, state, *w)?;
            claimed.push(*b);
        }
        Ok(Synced {
            claimed,
            taken_over,
        })
    }
}

/// What [`Registry::sync`] found: every block claimed, and this state directory's live
/// blocks that another state directory claimed meanwhile.
pub(super) struct Synced {
    pub(super) claimed: Vec<PortBlock>,
    pub(super) taken_over: Vec<(WorktreeId, PortBlock)>,
}

pub(super) fn claim_name(b: PortBlock) -> String {
    format!("{}-{}", b.first, b.size)
}

pub(super) fn parse_claim_name(name: &str) -> Option<PortBlock> {
    let (f, s) = name.split_once('-')?;
    Some(PortBlock {
        first: f.parse().ok()?,
        size: s.parse().ok()?,
    })
}
