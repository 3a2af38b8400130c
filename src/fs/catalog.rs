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

use crate::lease::State;
use crate::store::{RepoRow, WorktreeRow};

use super::overlay::WtCtx;

/// The inode of repository `id`'s directory at the top of the mount.
pub(super) const REPO_INO_BASE: u64 = 1 << 61;

pub(super) fn repo_ino(repo_id: i64) -> u64 {
    REPO_INO_BASE + repo_id as u64
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
    worktrees: HashMap<(i64, String), Arc<WtCtx>>,
    /// Lifecycle state by worktree id.
    states: HashMap<i64, State>,
    /// Worktrees without a lease (ready, lingering, retained) and since when.
    idle_since: HashMap<i64, i64>,
}

/// What an update changed, for the kernel's caches.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Update {
    /// The set of repositories or worktrees changed: the top listings are stale.
    pub(super) changed: bool,
    /// Every repository now known.
    pub(super) repo_ids: Vec<i64>,
    /// (repository directory inode, worktree name) of worktrees that just began deleting
    /// or are gone: the kernel must ask again before anyone enters them.
    pub(super) now_deleting: Vec<(u64, OsString)>,
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

    pub(super) fn repo(&self, id: i64) -> Option<RepoRow> {
        let c = self.contents.read();
        c.repos.iter().find(|r| r.id == id).cloned()
    }

    /// Worktree `name` of repository `repo_id`.
    pub(super) fn worktree(&self, repo_id: i64, name: &str) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees.get(&(repo_id, name.to_string())).cloned()
    }

    /// Worktree `name` of the repository named `repo`.
    pub(super) fn worktree_named(&self, repo: &str, name: &str) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees
            .values()
            .find(|w| w.repo == repo && w.name == name)
            .cloned()
    }

    pub(super) fn worktree_by_id(&self, id: i64) -> Option<Arc<WtCtx>> {
        let c = self.contents.read();
        c.worktrees.values().find(|w| w.id == id).cloned()
    }

    /// Every worktree served, in no order.
    pub(super) fn worktrees(&self) -> Vec<Arc<WtCtx>> {
        self.contents.read().worktrees.values().cloned().collect()
    }

    pub(super) fn state(&self, id: i64) -> Option<State> {
        self.contents.read().states.get(&id).copied()
    }

    /// Worktrees without a lease, with since when (seconds).
    pub(super) fn idle(&self) -> Vec<(i64, Arc<WtCtx>)> {
        let c = self.contents.read();
        c.worktrees
            .values()
            .filter_map(|w| Some((*c.idle_since.get(&w.id)?, w.clone())))
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
        make: impl Fn(&WorktreeRow, &RepoRow) -> anyhow::Result<WtCtx>,
    ) -> Update {
        let mut cat = self.contents.write();
        let mut worktrees = HashMap::new();
        let states: HashMap<i64, State> = rows.iter().map(|r| (r.id, r.state)).collect();
        let idle_since: HashMap<i64, i64> = rows
            .iter()
            .filter(|r| matches!(r.state, State::Ready | State::Lingering | State::Retained))
            .map(|r| (r.id, r.state_changed_at))
            .collect();
        // Worktrees that just started deleting: the kernel must ask again before anyone
        // enters them, and then hears EBUSY.
        let now_deleting: Vec<(u64, OsString)> = rows
            .iter()
            .filter(|r| {
                r.state == State::Deleting && cat.states.get(&r.id) != Some(&State::Deleting)
            })
            .map(|r| (repo_ino(r.repo_id), OsString::from(&r.name)))
            .chain(
                // Gone from the catalog (removed) without being seen deleting.
                cat.worktrees
                    .iter()
                    .filter(|(_, w)| !states.contains_key(&w.id))
                    .map(|((repo_id, name), _)| (repo_ino(*repo_id), OsString::from(name))),
            )
            .collect();
        for row in rows {
            let key = (row.repo_id, row.name.clone());
            if let Some(existing) = cat.worktrees.get(&key).filter(|w| w.id == row.id) {
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
        let repo_ids: Vec<i64> = repos.iter().map(|r| r.id).collect();
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
