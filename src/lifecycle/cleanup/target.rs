//! What cleanup looks at (one worktree: its repository, git's entry for it, its upper
//! layer, its base, its owner) and what it did with it.

use std::path::{Path, PathBuf};

use crate::ids::WorktreeId;
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{RepoRow, Store, WorktreeRow};

/// Everything cleanup needs to know of one worktree.
#[derive(Debug, Clone)]
pub struct Target {
    pub id: WorktreeId,
    pub repo: String,
    pub name: String,
    /// The repository's common git dir.
    pub gitdir: PathBuf,
    /// git's admin entry for this worktree (`<gitdir>/worktrees/wtfs-<name>`).
    pub admin: PathBuf,
    /// `<state>/worktrees/<id>`: the upper layer and work directory.
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub base_commit: String,
    pub base_tree: String,
    pub branch: Option<String>,
    pub branch_created: bool,
    /// Where it is under the mount (for messages and the retained store).
    pub path: PathBuf,
    /// Its owner: git runs as them to compare a file through its clean side.
    pub uid: u32,
    pub gid: u32,
    /// For a submodule's view: its path in the worktree.
    pub submodule: Option<String>,
    /// The manifest of its warm snapshot, if it has one.
    pub warm: Option<PathBuf>,
    /// The blob cache, which holds the snapshot's contents.
    pub blobs: PathBuf,
}

impl Target {
    pub fn new(state: &StateDir, row: &WorktreeRow, repo: &RepoRow, mountpoint: &Path) -> Target {
        Target {
            submodule: None,
            id: row.id,
            repo: row.repo.clone(),
            name: row.name.clone(),
            gitdir: repo.gitdir.clone(),
            admin: crate::git::admin_dir(&repo.gitdir, &row.admin_name),
            dir: state.worktree_dir(row.id),
            upper: state.upper(row.id),
            base_commit: row.base_commit.clone(),
            base_tree: row.base_tree.clone(),
            branch: row.branch.clone(),
            branch_created: row.branch_created,
            path: mountpoint.join(&row.repo).join(&row.name),
            uid: row.uid,
            gid: row.gid,
            warm: row.warm_manifest.as_ref().map(|m| state.warm().join(m)),
            blobs: state.blobs(),
        }
    }

    /// `<repo>/<name>`: the worktree's place under the mount.
    pub(super) fn repo_and_name(&self) -> String {
        format!("{}/{}", self.repo, self.name)
    }

    pub(super) fn parked_admin(&self) -> PathBuf {
        let name = self
            .admin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.gitdir
            .join(crate::git::admin::PARKED_ADMIN_DIR)
            .join(format!("{}-{name}", self.id))
    }

    pub(super) fn parked_dir(&self, state: &StateDir) -> PathBuf {
        state.removed_dir(self.id)
    }
}

/// What cleanup did with a worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed(String),
    Retained(String),
    /// Found removable, but its teardown command runs inside it and no mount serves it:
    /// left `deleting` for the next mount's cleanup (why).
    Waiting(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Removed(how) => write!(f, "removed ({how})"),
            Outcome::Retained(why) => write!(f, "retained ({why})"),
            Outcome::Waiting(why) => write!(f, "left deleting ({why})"),
        }
    }
}

/// The target of worktree `row`, its branch followed where `git branch -m` renamed it.
pub(super) fn target_of(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
    mountpoint: &Path,
) -> LifecycleResult<Target> {
    let repo = store.repo_by_id(row.repo_id)?.ok_or_else(|| {
        crate::lifecycle::error::failed(format!("repository of worktree {} is gone", row.id))
    })?;
    let mut t = Target::new(state, row, &repo, mountpoint);
    // Its branch renamed with `git branch -m` (as doctor advises for a name git forbids)
    // is still its branch: followed, and recorded.
    if let Some(now) = t
        .branch
        .as_deref()
        .and_then(|b| crate::git::renamed_branch(&t.gitdir, &t.admin, b))
    {
        tracing::info!(
            "worktree {}: its branch {} was renamed {now} (git branch -m); following it",
            t.repo_and_name(),
            t.branch.as_deref().unwrap_or_default()
        );
        store.set_worktree_branch(t.id, &now)?;
        t.branch = Some(now);
    }
    Ok(t)
}
