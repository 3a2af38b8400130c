//! The catalog: the repositories and worktrees the mount serves, as last read from the
//! store, with each worktree's lifecycle state. It owns its lock; nothing outside reaches
//! its fields.
//!
//! Lock order: the catalog is taken after the node table (a lookup at the top of the mount
//! holds the table while it reads the catalog), never the other way round.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::RwLock;

use super::error::FsResult;
use crate::lease::State;
use crate::store::{RepoRow, WorktreeRow};

use super::worktree::WtCtx;
use crate::ids::{RepoId, WorktreeId};
use crate::ino::Ino;

/// The inode of repository `id`'s directory at the top of the mount.
pub(super) const REPO_INO_BASE: u64 = 1 << 61;

pub(super) fn repo_ino(repo_id: RepoId) -> Ino {
    Ino(REPO_INO_BASE + repo_id.0 as u64)
}

pub(super) struct Catalog {
    contents: RwLock<Contents>,
}

struct Contents {
    data_version: i64,
    /// When the set of repositories or worktrees last changed: the mtime of the top
    /// directories, which the kernel compares to decide whether its cached listing holds.
    changed_at: SystemTime,
    repos: Vec<RepoRow>,
    worktrees: HashMap<(RepoId, String), Arc<WtCtx>>,
    /// Lifecycle state by worktree id.
    states: HashMap<WorktreeId, State>,
    /// Worktrees without a lease (ready, lingering, retained) and since when.
    idle_since: HashMap<WorktreeId, i64>,
}

/// What an update changed, for the kernel's caches.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Update {
    /// The set of repositories or worktrees changed: the top listings are stale.
    pub(super) changed: bool,
    /// Every repository now known.
    pub(super) repo_ids: Vec<RepoId>,
    /// (repository directory inode, worktree name) of worktrees that just began deleting
    /// or are gone: the kernel must ask again before anyone enters them.
    pub(super) now_deleting: Vec<(Ino, OsString)>,
}

impl Catalog {
    pub(super) fn new() -> Catalog {
        Catalog {
            contents: RwLock::new(Contents {
                data_version: -1,
                changed_at: SystemTime::now(),
                repos: Vec::new(),
                worktrees: HashMap::new(),
                states: HashMap::new(),
                idle_since: HashMap::new(),
            }),
        }
    }

    /// The store's data version the catalog was read at.
    pub(super) fn data_version(&self) -> i64 {
        self.contents.read().data_version
    }

    pub(super) fn changed_at(&self) -> SystemTime {
        self.contents.read().changed_at
    }

    pub(super) fn repos(&self) -> Vec<RepoRow> {
        self.contents.read().repos.clone()
    }

    pub(super) fn repo_named(&self, name: &[u8]) -> Option<RepoRow> {
        let c = self.contents.read();
        c.repos.iter().find(|r| r.name.as_bytes() == name).cloned()
    }

    pub(super) fn repo(&self, id: RepoId) -> Option<RepoRow> {
        let c = self.contents.read();
        c.repos.iter().find(|r| r.id == id).cloned()
    }

    /// Worktree `name` of repository `repo_id`.
    pub(super) fn worktree(&self, repo_id: RepoId, name: &str) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees.get(&(repo_id, name.to_string())).cloned()
    }

    /// Worktree `name` of the repository named `repo`.
    pub(super) fn worktree_named(&self, repo: &str, name: &str) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees
            .values()
            .find(|w| w.ident.repo == repo && w.ident.name == name)
            .cloned()
    }

    pub(super) fn worktree_by_id(&self, id: WorktreeId) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees.values().find(|w| w.ident.id == id).cloned()
    }

    /// Every worktree served, in no order.
    pub(super) fn worktrees(&self) -> Vec<Arc<WtCtx>> {
        self.contents.read().worktrees.values().cloned().collect()
    }

    pub(super) fn state(&self, id: WorktreeId) -> Option<State> {
        self.contents.read().states.get(&id).copied()
    }

    /// Worktrees without a lease, with since when (seconds).
    pub(super) fn idle(&self) -> Vec<(i64, Arc<WtCtx>)> {
        let c = self.contents.read();
        c.worktrees
            .values()
            .filter_map(|w| Some((*c.idle_since.get(&w.ident.id)?, w.clone())))
            .collect()
    }

    /// Replaces the contents with what the store holds at `version`. A worktree already
    /// served keeps its context (and so its journal); a new one gets `make`'s, or is left
    /// out when `make` fails (logged).
    pub(super) fn update(
        &self,
        version: i64,
        repos: Vec<RepoRow>,
        rows: Vec<WorktreeRow>,
        make: impl Fn(&WorktreeRow, &RepoRow) -> FsResult<WtCtx>,
    ) -> Update {
        let mut cat = self.contents.write();
        let mut worktrees = HashMap::new();
        let states: HashMap<WorktreeId, State> = rows.iter().map(|r| (r.id, r.state)).collect();
        let idle_since: HashMap<WorktreeId, i64> = rows
            .iter()
            .filter(|r| matches!(r.state, State::Ready | State::Lingering | State::Retained))
            .map(|r| (r.id, r.state_changed_at))
            .collect();
        // Worktrees that just started deleting: the kernel must ask again before anyone
        // enters them, and then hears EBUSY.
        let now_deleting: Vec<(Ino, OsString)> = rows
            .iter()
            .filter(|r| {
                r.state == State::Deleting && cat.states.get(&r.id) != Some(&State::Deleting)
            })
            .map(|r| (repo_ino(r.repo_id), OsString::from(&r.name)))
            .chain(
                // Gone from the catalog (removed) without being seen deleting.
                cat.worktrees
                    .iter()
                    .filter(|(_, w)| !states.contains_key(&w.ident.id))
                    .map(|((repo_id, name), _)| (repo_ino(*repo_id), OsString::from(name))),
            )
            .collect();
        for row in rows {
            let key = (row.repo_id, row.name.clone());
            if let Some(existing) = cat.worktrees.get(&key).filter(|w| w.ident.id == row.id) {
                worktrees.insert(key, existing.clone());
                continue;
            }
            let Some(repo) = repos.iter().find(|r| r.id == row.repo_id) else {
                continue;
            };
            match make(&row, repo) {
                Ok(ctx) => {
                    worktrees.insert(key, Arc::new(ctx));
                }
                // One being removed (its upper layer parked or gone) is expected to fail:
                // a lookup racing its removal.
                Err(e) if row.state == State::Deleting || row.removal.is_some() => {
                    tracing::debug!(
                        "worktree {}/{} is being removed and is no longer served: {e:#}",
                        row.repo,
                        row.name
                    )
                }
                Err(e) => {
                    tracing::error!("worktree {}/{} cannot be served: {e:#}", row.repo, row.name)
                }
            }
        }
        let changed = cat
            .repos
            .iter()
            .map(|r| r.id)
            .ne(repos.iter().map(|r| r.id))
            || cat.worktrees.len() != worktrees.len()
            || worktrees.keys().any(|k| !cat.worktrees.contains_key(k));
        let repo_ids: Vec<RepoId> = repos.iter().map(|r| r.id).collect();
        cat.repos = repos;
        cat.worktrees = worktrees;
        cat.states = states;
        cat.idle_since = idle_since;
        cat.data_version = version;
        if changed {
            cat.changed_at = SystemTime::now();
        }
        Update {
            changed,
            repo_ids,
            now_deleting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::base_layer::Base;
    use crate::fs::worktree::{Identity, UpperLayer};
    use std::path::{Path, PathBuf};

    fn repo(id: i64) -> RepoRow {
        RepoRow {
            id: RepoId(id),
            name: format!("r{id}"),
            path: PathBuf::from("/nowhere"),
            gitdir: PathBuf::from("/nowhere/.git"),
            added_at: 0,
            include: Vec::new(),
            warm_default: false,
        }
    }

    fn row(id: i64, name: &str, state: State) -> WorktreeRow {
        WorktreeRow {
            id: WorktreeId(id),
            repo_id: RepoId(1),
            repo: "r1".into(),
            name: name.into(),
            branch: None,
            branch_created: false,
            base_commit: String::new(),
            base_tree: String::new(),
            base_mtime: 0,
            uid: 0,
            gid: 0,
            admin_name: name.into(),
            state,
            created_at: 0,
            state_changed_at: 10 + id,
            removal: None,
            warm: None,
            warm_manifest: None,
        }
    }

    fn ctx(row: &WorktreeRow, _: &RepoRow) -> FsResult<WtCtx> {
        if row.name == "broken" {
            return Err(super::super::error::FsError::internal(
                "its directory is missing",
            ));
        }
        Ok(WtCtx {
            ident: Identity {
                id: row.id,
                repo_id: row.repo_id,
                repo: row.repo.clone(),
                name: row.name.clone(),
                uid: 0,
                gid: 0,
                admin_name: String::new(),
                gitfile: Vec::new(),
                ino_space: crate::ino::InoSpace(row.id.0),
                lease_id: row.id,
            },
            upper: UpperLayer {
                path: PathBuf::new(),
                work: PathBuf::new(),
                fd: crate::beneath::open_root(Path::new("/")).unwrap(),
                work_fd: crate::beneath::open_root(Path::new("/")).unwrap(),
                whiteouts: crate::layout::Whiteouts::empty(),
            },
            base: Base::new(
                PathBuf::new(),
                git2::Oid::zero(),
                SystemTime::UNIX_EPOCH,
                None,
                None,
            ),
            journal: Default::default(),
            nested: Default::default(),
            checkpoints: None,
        })
    }

    /// An update keeps the contexts of worktrees already served, says when the set
    /// changed, which worktrees just began deleting or are gone, and which are idle.
    #[test]
    fn an_update_keeps_contexts_and_names_what_the_kernel_must_forget() {
        let cat = Catalog::new();
        let first = cat.update(
            1,
            vec![repo(1)],
            vec![row(1, "a", State::Active), row(2, "b", State::Ready)],
            ctx,
        );
        assert!(first.changed);
        assert_eq!(first.repo_ids, vec![RepoId(1)]);
        assert!(first.now_deleting.is_empty());
        assert_eq!(cat.data_version(), 1);
        let a = cat.worktree(RepoId(1), "a").unwrap();
        let idle: Vec<(i64, i64)> = cat.idle().iter().map(|(s, w)| (*s, w.ident.id.0)).collect();
        assert_eq!(idle, vec![(12, 2)], "only the ready one is idle");

        // Same set, b now deleting: not a change of the set, but b must be looked up again.
        let second = cat.update(
            2,
            vec![repo(1)],
            vec![row(1, "a", State::Active), row(2, "b", State::Deleting)],
            ctx,
        );
        assert!(!second.changed);
        assert_eq!(second.now_deleting, vec![(repo_ino(RepoId(1)), "b".into())]);
        assert!(
            Arc::ptr_eq(&a, &cat.worktree(RepoId(1), "a").unwrap()),
            "context kept"
        );
        assert_eq!(cat.state(WorktreeId(2)), Some(State::Deleting));

        // Still deleting: nothing new to forget. Then b goes, and a worktree that cannot be
        // served is left out.
        let third = cat.update(
            3,
            vec![repo(1)],
            vec![row(1, "a", State::Active), row(2, "b", State::Deleting)],
            ctx,
        );
        assert!(third.now_deleting.is_empty());
        let fourth = cat.update(
            4,
            vec![repo(1)],
            vec![row(1, "a", State::Active), row(3, "broken", State::Ready)],
            ctx,
        );
        assert!(fourth.changed);
        assert_eq!(fourth.now_deleting, vec![(repo_ino(RepoId(1)), "b".into())]);
        assert!(cat.worktree(RepoId(1), "broken").is_none());
        assert_eq!(cat.worktrees().len(), 1);
        assert_eq!(
            cat.worktree_named("r1", "a").map(|w| w.ident.id),
            Some(WorktreeId(1))
        );
        assert_eq!(
            cat.worktree_by_id(WorktreeId(1))
                .map(|w| w.ident.name.clone()),
            Some("a".into())
        );
        assert_eq!(cat.repo_named(b"r1").map(|r| r.id), Some(RepoId(1)));
    }
}
