//! The top of the mount: the catalog of repositories and worktrees read from the store,
//! repository directories, and the creation (mkdir) and removal (rmdir) of a worktree,
//! handed to the lifecycle.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::Oid;

use crate::git;
use crate::ino;
use crate::lease::State;
use crate::lifecycle::create::{self, CreateRequest};
use crate::store::{RepoRow, Store, StoreResult, WorktreeRow};

use super::catalog::{repo_ino, REPO_INO_BASE};

/// How long `mkdir` of a worktree waits for a database another process holds (the kernel
/// holds the repository's directory while it waits) before it answers EBUSY.
const MKDIR_BUSY_TIMEOUT: Duration = Duration::from_millis(500);
use super::control::{CONTROL_INO, CONTROL_NAME};
use super::error::{ErrorKind, FsError, FsResult};
use super::inodes::{DYNAMIC_INO_BIT, ROOT_INO};
use super::journal::WorktreeJournal;
use super::nodes::{Node, NodeKind};
use super::overlay::Overlay;
use super::ttl::{CONTROL_TTL, TOP_TTL};
use super::types::{systime, Attr, Caller, Entry, FType, Inval};
use super::view::View;
use super::worktree::{Identity, Nested, UpperLayer, WtCtx};
use crate::ids::{RepoId, WorktreeId};
use crate::ino::Ino;

impl View {
    pub(super) fn wt_ctx(&self, row: &WorktreeRow, repo: &RepoRow) -> FsResult<WtCtx> {
        let upper = self.state.upper(row.id);
        let work = self.state.work(row.id);
        // A worktree whose directory is gone (being removed, or removed by hand) is not
        // made again here.
        let dir = self.state.worktree_dir(row.id);
        if !dir.is_dir() {
            return Err(FsError::new(
                ErrorKind::NotFound,
                format!("{} is missing", dir.display()),
            ));
        }
        for d in [&upper, &work] {
            fs::create_dir_all(d).map_err(|e| FsError::io(format!("making {}", d.display()), e))?;
        }
        let (upper_fd, work_fd, whiteouts, migrated) = open_layers(&upper, &work)?;
        if migrated > 0 {
            tracing::info!(
                repo = %row.repo,
                worktree = %row.name,
                whiteouts = migrated,
                "upper layer rewritten in format 2 (whiteouts that spend no name bytes)"
            );
        }
        let admin = git::admin_dir(&repo.gitdir, &row.admin_name);
        let checkpoints = crate::checkpoint::Checkpoints::open(self.state.checkpoints(row.id))
            .map_err(|e| FsError::io("opening its checkpoints", e))?;
        let warm = match (row.warm, &row.warm_manifest) {
            (Some(id), Some(manifest)) => Some((id, self.state.warm().join(manifest))),
            (Some(id), None) => {
                return Err(FsError::new(
                    ErrorKind::Store,
                    format!("its warm snapshot {id} is not in the store"),
                ))
            }
            _ => None,
        };
        let tree = Oid::from_str(&row.base_tree).map_err(|e| FsError::git("its base tree", e))?;
        let base = self.bases.open(
            &repo.gitdir,
            tree,
            systime(row.base_mtime, 0),
            warm.as_ref()
                .map(|(id, manifest)| (*id, manifest.as_path())),
            &self.state.conversions(row.id),
        )?;
        let ctx = WtCtx {
            ident: Identity {
                id: row.id,
                repo_id: row.repo_id,
                repo: row.repo.clone(),
                name: row.name.clone(),
                uid: row.uid,
                gid: row.gid,
                admin_name: row.admin_name.clone(),
                gitfile: format!("gitdir: {}\n", admin.display()).into_bytes(),
                ino_space: crate::ino::InoSpace(row.id.0),
                lease_id: row.id,
            },
            upper: UpperLayer {
                path: upper,
                work,
                fd: upper_fd,
                work_fd,
                whiteouts,
            },
            base,
            journal: WorktreeJournal::default(),
            nested: Nested {
                shown: self.state.submodules_marker(row.id).exists(),
                ..Nested::default()
            },
            checkpoints: Some(checkpoints),
        };
        // What a crash left of a rewind or a checkpoint, settled before anything is served.
        self.settle_checkpoints(&ctx)?;
        Ok(ctx)
    }

    /// Reloads repositories and worktrees when another connection changed the store.
    pub(super) fn refresh_catalog(&self, force: bool) -> StoreResult<()> {
        let store = self.store.lock();
        let version = store.data_version()?;
        if !force && self.catalog.data_version() == version {
            return Ok(());
        }
        let read = self.gate.begin_read();
        let repos = store.repos()?;
        let rows = store.worktrees()?;
        self.turns.set(store.turns()?);
        self.gate.set_deleting(
            read,
            rows.iter()
                .filter(|r| r.state == State::Deleting)
                .map(|r| r.id),
        );
        drop(store);
        let update = self
            .catalog
            .update(version, repos, rows, |row, repo| self.wt_ctx(row, repo));
        if let Some(inval) = self.invalidator.get() {
            if update.changed {
                inval(Inval::Inode(ROOT_INO));
                for id in update.repo_ids {
                    inval(Inval::Inode(repo_ino(id)));
                }
            }
            for (parent, name) in update.now_deleting {
                inval(Inval::Entry(parent, name));
            }
        }
        Ok(())
    }

    /// The store changed (a lifecycle sweep, a lease): re-read it now.
    pub fn catalog_changed(&self) {
        if let Err(e) = self.refresh_catalog(true) {
            tracing::warn!("re-reading the store failed: {e:#}");
        }
    }

    /// Keeps the inode table near `budget` nodes: when it is over, asks the kernel to drop
    /// its cached entries of worktrees nobody holds a lease on, idle longest first (a few
    /// per call; the kernel then forgets their inodes and the nodes go). A worktree in use
    /// is never touched; one shed is not asked again for `again`. Returns how many were
    /// asked.
    pub fn shed_idle(
        &self,
        budget: usize,
        recently: &mut HashMap<WorktreeId, std::time::Instant>,
        again: Duration,
    ) -> usize {
        if self.node_count() <= budget {
            return 0;
        }
        let Some(inval) = self.invalidator.get() else {
            return 0;
        };
        let now = std::time::Instant::now();
        // Leases taken but not yet in the store: their worktrees are in use, whatever the
        // catalog (read from the store) says.
        let pending: std::collections::HashSet<WorktreeId> = self
            .pending_leases
            .get()
            .map(|f| f())
            .unwrap_or_default()
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        // The catalog first, released before the table is read: the lock order is `nodes`
        // then `catalog` (a lookup at the top holds the table while it reads the catalog),
        // and holding both the other way round deadlocks once a catalog writer queues.
        let idle_now: Vec<(i64, Arc<super::worktree::WtCtx>)> = self
            .catalog
            .idle()
            .into_iter()
            .filter(|(_, w)| !pending.contains(&w.ident.id))
            .collect();
        // A worktree in use since it was shed is asked again as soon as it is idle again
        // (its caches filled meanwhile); one still idle, only after `again`.
        recently.retain(|id, at| {
            now.duration_since(*at) < again && idle_now.iter().any(|(_, w)| w.ident.id == *id)
        });
        let candidates: Vec<(i64, WorktreeId, Ino, OsString)> = idle_now
            .into_iter()
            .filter(|(_, w)| !recently.contains_key(&w.ident.id))
            .map(|(since, w)| {
                (
                    since,
                    w.ident.id,
                    repo_ino(w.ident.repo_id),
                    OsString::from(&w.ident.name),
                )
            })
            .collect();
        let mut idle: Vec<(i64, WorktreeId, Ino, OsString)> = {
            let t = self.nodes.read();
            candidates
                .into_iter()
                .filter(|(_, _, parent, name)| t.child(*parent, name).is_some())
                .collect()
        };
        idle.sort();
        let n = idle.len().min(4);
        for (_, id, parent, name) in idle.into_iter().take(n) {
            tracing::debug!("dropping the kernel's cache of idle worktree {id}");
            recently.insert(id, now);
            inval(Inval::Entry(parent, name));
        }
        n
    }

    /// Where worktree `id` is under the mount.
    pub fn worktree_path(&self, id: WorktreeId) -> Option<PathBuf> {
        self.catalog
            .worktree_by_id(id)
            .map(|w| self.mountpoint.join(&w.ident.repo).join(&w.ident.name))
    }

    pub(super) fn refresh(&self) -> FsResult<()> {
        self.refresh_catalog(false)
            .map_err(|e| FsError::store("reading the store", e))
    }

    pub(super) fn top_dir_attr(&self, ino: Ino) -> Attr {
        // Root and repository directories change when the catalog does; `.control`
        // directories with every lease, so they always look new.
        let now = SystemTime::now();
        let is_repo = (REPO_INO_BASE..DYNAMIC_INO_BIT).contains(&ino.0);
        let mtime = if ino == ROOT_INO || is_repo {
            self.catalog.changed_at()
        } else {
            now
        };
        // A repository's directory belongs to the repository's owner, who may create
        // worktrees in it with mkdir; others may enter it as far as the repository's own
        // directory lets them (a repository kept 0700 keeps its worktrees to its owner).
        let (uid, gid, perm) = if is_repo {
            self.catalog
                .repo(RepoId((ino.0 - REPO_INO_BASE) as i64))
                .and_then(|r| fs::metadata(&r.path).ok())
                .map(|m| (m.uid(), m.gid(), 0o700 | (m.mode() & 0o055) as u16))
                .unwrap_or((0, 0, 0o700))
        } else if ino == ROOT_INO {
            (0, 0, 0o755)
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
                super::control::control_dir_perm(ino),
            )
        };
        Attr {
            ino,
            size: 4096,
            blocks: 8,
            atime: mtime,
            mtime,
            ctime: mtime,
            kind: FType::Dir,
            perm,
            nlink: 2,
            uid,
            gid,
            rdev: 0,
        }
    }

    pub(super) fn lookup_top(&self, name: &OsStr) -> FsResult<Entry> {
        if name == CONTROL_NAME {
            return Ok(Entry {
                attr: self.top_dir_attr(CONTROL_INO),
                ttl: CONTROL_TTL,
            });
        }
        self.refresh()?;
        let repo = self
            .catalog
            .repo_named(name.as_bytes())
            .ok_or_else(|| FsError::not_found(format!("repository {}", name.to_string_lossy())))?;
        let ino = repo_ino(repo.id);
        let mut t = self.nodes.write();
        if !t.contains(ino) {
            t.insert_node(ino, Node::new(NodeKind::Repo(repo.id), ROOT_INO, name, 0));
        }
        t.count_lookup(ino);
        Ok(Entry {
            attr: self.top_dir_attr(ino),
            ttl: TOP_TTL,
        })
    }

    pub(super) fn worktree_ctx(&self, repo_id: RepoId, name: &OsStr) -> FsResult<Arc<WtCtx>> {
        self.refresh()?;
        self.catalog
            .worktree(repo_id, &name.to_string_lossy())
            .ok_or_else(|| FsError::not_found(format!("worktree {}", name.to_string_lossy())))
    }

    pub(super) fn lookup_repo_child(
        &self,
        parent: Ino,
        repo_id: RepoId,
        name: &OsStr,
    ) -> FsResult<Entry> {
        let wt = self.worktree_ctx(repo_id, name)?;
        // While its teardown command runs, its processes find it (entering it is theirs
        // alone: the lease tracker lets nobody else in).
        if self.catalog.state(wt.ident.lease_id) == Some(State::Deleting)
            && !self
                .inspection
                .get()
                .is_some_and(|i| i.tearing_down(wt.ident.id))
        {
            return Err(FsError::conflict(
                format!(
                    "worktree {}/{} is deleting (no lease, cleanup begun): not entered",
                    wt.ident.repo, wt.ident.name
                ),
                crate::lease::Conflict::Deleting,
            ));
        }
        let mut t = self.nodes.write();
        let natural = ino::path_ino(wt.ident.ino_space, b"");
        // A worktree re-created under the same name is a different worktree: replace the
        // stale mapping.
        if let Some(old) = t.child(parent, name) {
            let stale = match t.kind(old) {
                Some(NodeKind::Wt { wt: w, .. }) => w.ident.id != wt.ident.id,
                _ => true,
            };
            if stale {
                t.detach_name(parent, name);
            }
        }
        let ino = t.insert_child(
            parent,
            name,
            natural,
            NodeKind::Wt {
                wt: wt.clone(),
                ov: Overlay {
                    ftype: FType::Dir,
                    base: Some(wt.base.root()),
                    in_upper: true,
                    // The worktree's directory is its upper directory's descriptor itself.
                    upper_ino: 0,
                },
                is_root: true,
            },
        );
        self.counted_entry(t, ino)
    }

    pub(super) fn is_repo(&self, ino: Ino) -> bool {
        matches!(
            self.nodes.read().kind(ino),
            Some(NodeKind::Repo(_)) | Some(NodeKind::Root) | Some(NodeKind::ControlDir(_)) | None
        )
    }

    pub(super) fn mkdir_worktree(
        &self,
        parent: Ino,
        repo_id: RepoId,
        name: &OsStr,
        caller: Caller,
    ) -> FsResult<Entry> {
        let name_s = name
            .to_str()
            .ok_or_else(|| FsError::invalid(format!("worktree name {name:?} is not UTF-8")))?;
        let repo_row = self
            .catalog
            .repo(repo_id)
            .ok_or_else(|| FsError::not_found("repository"))?;
        let repo = repo_row.name.clone();
        {
            // A connection of its own, as rmdir's: a creation may wait for the database
            // (held by another process), and the view's own connection answers lookups.
            let mut store = Store::open(&self.state.root)
                .map_err(|e| FsError::store("opening the store", e))?;
            // The kernel holds the repository directory meanwhile: not for long.
            store
                .set_busy_timeout(MKDIR_BUSY_TIMEOUT)
                .map_err(|e| FsError::store("opening the store", e))?;
            // A repository warm by default shows its caller's newest snapshot; mkdir never
            // takes one (that reads the whole checkout: `worktreefs warm`, `new --warm`).
            let warm = match repo_row.warm_default {
                true => crate::lifecycle::warm::latest(&self.state, &store, repo_id, caller.uid)
                    .map_err(|e| FsError::store("reading the warm snapshots", e))?,
                false => None,
            };
            if repo_row.warm_default && warm.is_none() {
                tracing::info!(
                    repo,
                    worktree = name_s,
                    "mkdir: no warm snapshot of uid {} yet; the worktree is cold (`worktreefs warm {repo}` takes one)",
                    caller.uid
                );
            }
            // Its threads and git's processes run on every CPU, not on the one a queue's
            // thread answering this request is pinned to.
            crate::fuse::uring::unpinned(|| {
                create::create_worktree(
                    &self.state,
                    &mut store,
                    &CreateRequest {
                        repo: &repo,
                        name: name_s,
                        base: None,
                        branch: None,
                        uid: caller.uid,
                        gid: caller.gid,
                        submodules: false,
                        warm: warm.as_ref(),
                        progress: None,
                        filter_timeout: self.filter_timeout(),
                    },
                )
            })
            .map_err(|e| FsError::creation(format!("mkdir {repo}/{name_s}"), e))
            .map(|row| {
                // The sweeper starts it within a quarter second.
                if let Some(run) = crate::lifecycle::setup::queue_for_new(&store, &row) {
                    tracing::info!(
                        repo,
                        worktree = name_s,
                        "mkdir: its setup is queued: {}",
                        run.command
                    );
                }
            })?;
        }
        self.refresh_catalog(true)
            .map_err(|e| FsError::store("reading the store", e))?;
        tracing::info!(repo, worktree = name_s, "created worktree by mkdir");
        self.lookup_repo_child(parent, repo_id, name)
    }

    /// `rmdir <mount>/<repo>/<wt>`: the same removal as `worktreefs reclaim`. EBUSY while
    /// leased or in use, ENOTEMPTY while it holds work (its files stay).
    pub(super) fn rmdir_worktree(
        &self,
        parent: Ino,
        repo_id: RepoId,
        name: &OsStr,
    ) -> FsResult<()> {
        use crate::lifecycle::cleanup::{request_removal_gated, Outcome};
        let wt = self.worktree_ctx(repo_id, name)?;
        let label = format!("{}/{}", wt.ident.repo, wt.ident.name);
        let mut store =
            Store::open(&self.state.root).map_err(|e| FsError::store("opening the store", e))?;
        let row = store
            .worktree_by_id(wt.ident.id)
            .map_err(|e| FsError::store("reading the worktree", e))?
            .ok_or_else(|| FsError::not_found(&label))?;
        // A holder that has exited or left holds nothing by the time rmdir asks: wait
        // (up to `occupancy::SETTLE`) for the tracker to release such leases, as
        // `reclaim` does, rather than answer EBUSY for a process that is gone. Who
        // still holds it is decided below, where the refusal is made.
        let path = self.mountpoint.join(&wt.ident.repo).join(&wt.ident.name);
        crate::lifecycle::occupancy::holders_now(&mut store, &row, &path, 0, false)
            .map_err(|e| FsError::store("reading the leases", e))?;
        // git's processes of the cleanup run on every CPU (see `mkdir_worktree`).
        let r = crate::fuse::uring::unpinned(|| {
            request_removal_gated(
                &self.gate,
                &|| self.catalog_changed(),
                &self.state,
                &mut store,
                &row,
                &self.mountpoint,
                // A teardown cannot run inside this request: the kernel holds the
                // repository directory's lock until it is answered, and the command's
                // way into the worktree goes through it.
                &self.inspection().deferring_teardowns(),
                false,
                &mut |_| {},
            )
        });
        self.catalog_changed();
        match r {
            // Left to the daemon's cleanup (its teardown first), as a removal is.
            Ok(Outcome::Removed(detail) | Outcome::Waiting(detail)) => {
                tracing::info!("rmdir {label}: removed ({detail})");
                self.nodes.write().detach_name(parent, name);
                Ok(())
            }
            Ok(Outcome::Retained(reason)) => Err(FsError::removal_failed(&label, &reason)),
            Err(e) => Err(FsError::removal(&label, e)),
        }
    }
}

/// The lifecycle reaches the filesystem only through this (see `lifecycle::Mounted`).
impl crate::lifecycle::Mounted for View {
    fn mountpoint(&self) -> &std::path::Path {
        View::mountpoint(self)
    }

    fn catalog_changed(&self) {
        View::catalog_changed(self)
    }

    fn shed_idle(
        &self,
        budget: usize,
        recently: &mut HashMap<WorktreeId, std::time::Instant>,
        again: Duration,
    ) -> usize {
        View::shed_idle(self, budget, recently, again)
    }

    fn running_turns(&self) -> Vec<crate::store::TurnRow> {
        self.turns.running()
    }

    fn drop_checkpoints_for_disk(
        &self,
        policy: &crate::lifecycle::cleanup::keep::KeepPolicy,
    ) -> usize {
        View::drop_checkpoints_for_disk(self, policy)
    }
}

/// The descriptors of an upper layer and its work directory, with its whiteout files,
/// the layer rewritten in format 2 first if it is older (how many whiteouts that took).
pub(super) fn open_layers(
    upper: &std::path::Path,
    work: &std::path::Path,
) -> FsResult<(
    std::os::fd::OwnedFd,
    std::os::fd::OwnedFd,
    crate::layout::Whiteouts,
    usize,
)> {
    let open = |d: &std::path::Path| {
        crate::beneath::open_root(d).map_err(|e| FsError::io(format!("opening {}", d.display()), e))
    };
    let upper_fd = open(upper)?;
    let work_fd = open(work)?;
    let whiteouts = crate::layout::Whiteouts::open(work_fd.as_fd())
        .map_err(|e| FsError::io(format!("opening the whiteouts of {}", work.display()), e))?;
    let migrated = crate::layout::migrate(upper_fd.as_fd(), work_fd.as_fd(), &whiteouts)
        .map_err(|e| FsError::io(format!("migrating the upper layer {}", upper.display()), e))?;
    Ok((upper_fd, work_fd, whiteouts, migrated))
}
