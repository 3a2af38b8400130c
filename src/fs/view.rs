//! The view: the struct that composes the node table, the catalog, the handles and the
//! object caches; its lock order; lookup, forget and getattr.
//!
//! ## Locks (take them in this order, never the reverse)
//!
//! 1. `mutate`: one namespace change at a time in a worktree (create, unlink, rename,
//!    copy-up, …); each worktree has its own (`place::Mutate`), a thread holds one.
//! 2. `nodes` (`nodes.rs`): the inode table, read-locked by lookups, getattr and path
//!    resolution, write-locked to add, move or forget nodes. No thread takes it while it
//!    already holds it, not even to read twice (parking_lot's lock is fair: a second read
//!    waits behind a queued writer, which waits for the first).
//! 3. `handles` (`handles.rs`): the open handles (a brief map lookup).
//! 4. `catalog` (`catalog.rs`) and `store`: repositories and worktrees from SQLite, taken
//!    at the top of the mount and in `.control` (mkdir and rmdir of a worktree open store
//!    connections of their own, since they may wait for the database), never on a
//!    worktree's read path.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLockWriteGuard};

use super::ttl::{ttl_of, WT_TTL};
use crate::git::blobcache::BlobCache;
use crate::git::ObjectCache;
use crate::ino;
use crate::layout::is_reserved;
use crate::state::StateDir;
use crate::store::Store;

use super::catalog::Catalog;
use super::error::{FsError, FsResult};
use super::handles::{opened, HandleKind, Handles, Listings};
use super::inodes::ROOT_INO;
use super::nodes::{fixed_nodes, NodeKind, NodeTable, Nodes};
use super::place::{held, is_changing, Place};
use super::types::Fh;
use super::types::{
    Attr, Entry, FType, Invalidator, LeaseActivity, PendingLeases, Statfs, GITFILE_NAME,
};
use crate::ids::WorktreeId;
use crate::ino::Ino;

/// The daemon's counters, shown in `.control/stats`.
#[derive(Default)]
pub struct Stats {
    /// read() requests served on worktree content (not `.git` or `.control`).
    pub content_reads: AtomicU64,
    pub copy_ups: AtomicU64,
    /// Base files whose checkout conversion was made (end of line, ident, filters).
    pub conversions: AtomicU64,
    /// The first distinct paths (`repo/worktree/path`) whose content was read, for tests
    /// and diagnosis; recorded once per open handle, not per read.
    pub content_paths: Mutex<Vec<String>>,
    /// Requests served, by kind: what the kernel could not answer from its caches.
    pub lookups: AtomicU64,
    pub getattrs: AtomicU64,
    pub opendirs: AtomicU64,
    pub readdirs: AtomicU64,
    /// Opens answered with FUSE passthrough (the kernel then reads and writes the backing
    /// file itself; such an open counts as one content read).
    pub passthrough_opens: AtomicU64,
    /// Whether the kernel took FUSE passthrough for this session (`.control/stats`, for
    /// `worktreefs doctor`).
    pub passthrough_on: std::sync::atomic::AtomicBool,
    /// Requests come over FUSE over io_uring (else `/dev/fuse`).
    pub uring_on: std::sync::atomic::AtomicBool,
    /// io_uring's queue threads yield their CPU to the callers they answer.
    pub yield_on: std::sync::atomic::AtomicBool,
    /// getxattr, setxattr, listxattr and removexattr requests (each kind is declined with
    /// ENOSYS, which the kernel remembers, so at most one of each per mount).
    pub xattr_requests: AtomicU64,
}

/// The filesystem core: every operation the adapter calls, on plain values, with no
/// mount needed. Each part owns its state and lock; see the lock order above.
pub struct View {
    pub(super) state: StateDir,
    pub(super) mountpoint: PathBuf,
    pub(super) store: Mutex<Store>,
    /// Events a request records without waiting for the database (a guarded refusal).
    pub(super) events: crate::store::EventQueue,
    /// The leases and removals the daemon knows in memory (`lifecycle::gate`): rmdir of a
    /// worktree goes through it, as the sweeper and the tracker do.
    pub(super) gate: Arc<crate::lifecycle::gate::Gate>,
    pub(super) catalog: Catalog,
    pub(super) objects: ObjectCache,
    pub(super) blobs: BlobCache,
    /// What every worktree's base shares: warm snapshots in use, conversions' sizes and
    /// failures, whether any base converts.
    pub(super) bases: super::bases::Bases,
    pub(super) mutate: super::place::Mutate,
    pub(super) nodes: Nodes,
    pub(super) handles: Handles,
    /// Listings being read by handle-less readdir (see `readdir_ino`).
    pub(super) listings: Listings,
    pub(super) invalidator: std::sync::OnceLock<Invalidator>,
    /// The process leases the daemon keeps in memory until SQLite takes them.
    pub(super) pending_leases: std::sync::OnceLock<PendingLeases>,
    /// The process holders' last activity, kept in memory by the tracker.
    pub(super) lease_activity: std::sync::OnceLock<LeaseActivity>,
    /// How cleanup inspects, as the daemon was set up (`rmdir` of a worktree runs one;
    /// the making of a submodule's view is bounded by its request timeout).
    pub(super) inspection: std::sync::OnceLock<crate::lifecycle::cleanup::Inspection>,
    /// The running turns, and the gate of guarded ones (`lifecycle::turns`).
    pub(super) turns: crate::lifecycle::turns::Turns,
    /// Names this daemon's fsmonitor tokens, so a token from an earlier life is known.
    pub(super) instance: String,
    /// The state directory's own name in its repositories' refs (`Store::refs_key`).
    pub(super) refs_key: String,
    pub stats: Stats,
}

pub(super) fn check_name(name: &OsStr) -> FsResult<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(FsError::invalid(format!("invalid name {name:?}")));
    }
    if is_reserved(name) {
        return Err(FsError::invalid(format!(
                "name {name:?} uses the prefix '.wtfs-', which worktreefs reserves for its upper-layer markers"
            ),
        ));
    }
    check_len(name)
}

/// The longest name, as on ext4 (whiteouts spend none of it: see `crate::layout`).
pub(super) const NAME_MAX: usize = 255;

/// ENAMETOOLONG for a name longer than `NAME_MAX`, from every operation (a lookup too).
pub(super) fn check_len(name: &OsStr) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::name_too_long(format!(
            "name of {} bytes is longer than {NAME_MAX}",
            name.len()
        )));
    }
    Ok(())
}

pub(super) fn not_supported(what: &str) -> FsError {
    FsError::not_permitted(format!("{what} is not possible here"))
}

impl View {
    /// The gate the tracker, the sweeper and requests through the daemon's socket share
    /// with this view's rmdir.
    pub fn gate(&self) -> Arc<crate::lifecycle::gate::Gate> {
        self.gate.clone()
    }

    pub fn new(state: StateDir, mountpoint: PathBuf) -> crate::store::StoreResult<View> {
        let store = Store::open(&state.root)?;
        let refs_key = store.refs_key()?;
        let events = crate::store::EventQueue::new(state.root.clone());
        let blobs = BlobCache::new(state.blobs(), state.blobs_tmp());
        let root = (ROOT_INO, NodeKind::Root, ROOT_INO, "");
        let nodes = Nodes::new(std::iter::once(root).chain(fixed_nodes()));
        let view = View {
            state,
            mountpoint,
            store: Mutex::new(store),
            events,
            gate: Arc::new(crate::lifecycle::gate::Gate::new()),
            catalog: Catalog::new(),
            objects: ObjectCache::default(),
            blobs,
            bases: Default::default(),
            mutate: super::place::Mutate::new(),
            nodes,
            handles: Handles::new(),
            listings: Listings::new(),
            invalidator: std::sync::OnceLock::new(),
            pending_leases: std::sync::OnceLock::new(),
            lease_activity: std::sync::OnceLock::new(),
            inspection: std::sync::OnceLock::new(),
            turns: Default::default(),
            instance: format!(
                "{}.{}",
                std::process::id(),
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ),
            refs_key,
            stats: Stats::default(),
        };
        view.refresh_catalog(true)?;
        Ok(view)
    }

    pub fn blob_fills(&self) -> u64 {
        self.blobs.fills.load(Ordering::Relaxed)
    }

    /// The worktree an inode belongs to, as (id, whether the inode is the worktree's own
    /// directory). None for the top of the mount and `.control`. On every request: no
    /// allocation.
    pub fn worktree_of(&self, ino: Ino) -> Option<(WorktreeId, bool)> {
        let t = self.nodes.read();
        match t.kind(ino) {
            // A submodule's view is covered by its parent worktree's leases.
            Some(NodeKind::Wt { wt, is_root, .. }) => {
                Some((wt.ident.lease_id, *is_root && !wt.is_submodule()))
            }
            Some(NodeKind::GitFile(wt)) => Some((wt.ident.lease_id, false)),
            _ => None,
        }
    }

    /// Holds the lock on changes of the worktree `ino` is in (see `place::Mutate`).
    pub(super) fn lock_changes(&self, ino: Ino) -> super::place::MutateGuard {
        self.mutate.lock(self.worktree_of(ino).map(|(id, _)| id))
    }

    /// Holds the lock on changes of worktree `wt` (and the submodule views in it).
    pub(super) fn lock_changes_of(&self, wt: &super::worktree::WtCtx) -> super::place::MutateGuard {
        self.mutate.lock(Some(wt.ident.lease_id))
    }

    /// How many inodes the daemon keeps (one per inode the kernel holds).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the state directory (where backing files live) is on a stacked filesystem
    /// such as overlayfs, which FUSE passthrough must count as one level of stacking.
    pub fn state_on_stacked_fs(&self) -> bool {
        nix::sys::statfs::statfs(&self.state.root)
            .map(|s| s.filesystem_type() == nix::sys::statfs::OVERLAYFS_SUPER_MAGIC)
            .unwrap_or(false)
    }

    /// Where `.control/leases` learns of the leases kept in memory (the tracker's).
    pub fn set_pending_leases(&self, f: PendingLeases) {
        let _ = self.pending_leases.set(f);
    }

    /// Whether the process asking (`tid`, as FUSE names the calling thread) may change
    /// what `ino` is in: EBUSY when a guarded turn runs in its worktree and the process is
    /// outside the turn's tree. The first refusal of each process is an event naming the
    /// turn.
    ///
    /// The request is counted from before the gate is looked at until the token returned
    /// is dropped (after its answer): a guarded turn's command starts only once every
    /// change that began before its gate has ended (`Turns::settle`).
    pub fn may_change(&self, ino: Ino, tid: u32) -> FsResult<crate::lifecycle::turns::Change<'_>> {
        // Its worktree first (an inode's worktree never changes), so the count is by
        // worktree and a guard waits only for the changes in its own.
        let worktree = self.worktree_of(ino).map(|(w, _)| w);
        let change = self.turns.begin_change(worktree);
        if !self.turns.any_guarded() {
            return Ok(change);
        }
        let Some(worktree) = worktree else {
            return Ok(change);
        };
        self.turns
            .may_change(worktree, tid)
            .map(|()| change)
            .map_err(|r| {
                if r.first {
                    let holder = r.turn.holder();
                    // Queued: this request answers now, whatever holds the database.
                    self.events
                        .note(worktree, "turn-refused", Some(&holder), &r.message);
                }
                FsError::busy(r.message)
            })
    }

    /// How cleanup inspects for this view (the daemon's `--inspect-timeout`, this view
    /// asked what its fsmonitor hook would answer).
    pub fn set_inspection(&self, how: crate::lifecycle::cleanup::Inspection) {
        let _ = self.inspection.set(how);
    }

    /// How cleanup inspects for this view: as set, else the defaults.
    pub fn inspection(&self) -> crate::lifecycle::cleanup::Inspection {
        self.inspection.get().cloned().unwrap_or_default()
    }

    /// How long one run of git as a worktree's owner may take (`mount --filter-timeout`,
    /// given with the inspection's settings): a filter, the reading of the configuration
    /// that decides a checkout's conversions.
    pub(super) fn filter_timeout(&self) -> std::time::Duration {
        self.inspection().filter_timeout
    }

    /// Where `.control/leases` learns each process holder's last activity.
    pub fn set_lease_activity(&self, f: LeaseActivity) {
        let _ = self.lease_activity.set(f);
    }

    pub fn set_invalidator(&self, f: Invalidator) {
        let _ = self.invalidator.set(f);
    }

    /// Waits (up to `limit`) until the kernel was told every invalidation sent so far.
    /// A change made outside a request (a rewind, a removal asked through the socket)
    /// answers after it: whoever asked for it then opens what it made, never a name the
    /// kernel still had of what it replaced. Never from a request's thread: the
    /// invalidations may wait for a lock the kernel holds while that request runs.
    pub fn await_invalidations(&self, limit: std::time::Duration) {
        let Some(send) = self.invalidator.get() else {
            return;
        };
        let (done, delivered) = std::sync::mpsc::sync_channel(1);
        send(super::types::Inval::Delivered(done));
        if delivered.recv_timeout(limit).is_err() {
            tracing::warn!(
                "the kernel was not told of changed names within {limit:?}: it may show the old ones a little longer"
            );
        }
    }

    pub(super) fn node_attr(&self, t: &NodeTable, ino: Ino) -> FsResult<Attr> {
        let node = t.get(ino).ok_or_else(|| FsError::stale(ino))?;
        match node.kind() {
            NodeKind::Root | NodeKind::ControlDir(_) | NodeKind::Repo(_) => {
                Ok(self.top_dir_attr(ino))
            }
            NodeKind::ControlFile(dir, name) => {
                let content = self.control_content(*dir, name)?;
                let owner = self.control_file_owner(*dir, name);
                Ok(super::control::control_file_attr(ino, content.len(), owner))
            }
            NodeKind::GitFile(wt) => Ok(Attr::memory(
                ino,
                wt.ident.gitfile.len(),
                wt.base.mtime,
                wt.ident.uid,
                wt.ident.gid,
            )),
            NodeKind::Wt { wt, ov, .. } => {
                if ov.in_upper {
                    let (wt, spec) = t.place_spec(ino)?;
                    let st = Place::find(wt.clone(), spec)?
                        .stat()
                        .map_err(|e| FsError::io(format!("stat of inode {ino}"), e))?;
                    Ok(wt.upper_attr(ino, &st))
                } else {
                    let mut attr = self.base_attr(ino, wt, ov, || t.rel_path(ino))?;
                    if node.is_unlinked() {
                        attr.nlink = 0;
                    }
                    Ok(attr)
                }
            }
        }
    }

    /// The attributes and TTL of `ino`; when its name held another file (a change in
    /// flight), asked again once that change is done.
    pub(super) fn settled_attr(&self, ino: Ino) -> FsResult<(Attr, Duration)> {
        self.prepare_node(ino);
        let once = || {
            let t = self.nodes.read();
            self.node_attr(&t, ino).map(|a| (a, ttl_of(&t, ino)))
        };
        match once() {
            Err(e) if is_changing(Some(e.errno())) && !held() => {
                let _m = self.lock_changes(ino);
                once()
            }
            other => other,
        }
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<Entry> {
        self.stats.lookups.fetch_add(1, Ordering::Relaxed);
        check_len(name)?;
        self.lookup_in(parent, name, false)
    }

    /// A lookup the kernel did not ask for: of an entry of a listing just made, sent with
    /// its attributes (READDIRPLUS), which the kernel links and later forgets like a
    /// looked-up name. Counted as a lookup of the node, not in the LOOKUP statistics; a
    /// `.control` name is not checked against its directory again (the listing was), and
    /// a generated file's size is left 0 (see `lookup_control`).
    pub fn lookup_listed(&self, parent: Ino, name: &OsStr) -> FsResult<Entry> {
        self.lookup_in(parent, name, true)
    }

    pub(super) fn lookup_in(&self, parent: Ino, name: &OsStr, listed: bool) -> FsResult<Entry> {
        let parent_kind = {
            let t = self.nodes.read();
            let kind = t
                .kind(parent)
                .cloned()
                .ok_or_else(|| FsError::stale(parent))?;
            let known = t.child(parent, name);
            if let Some(ino) = known.filter(|_| {
                !matches!(
                    kind,
                    NodeKind::Root | NodeKind::Repo(_) | NodeKind::ControlDir(_)
                )
            }) {
                // Counted under the read lock that found it (given back if its attributes
                // fail).
                t.count_lookup(ino);
                drop(t);
                return match self.settled_attr(ino) {
                    Ok((attr, ttl)) => Ok(Entry { attr, ttl }),
                    Err(e) => {
                        self.forget(ino, 1);
                        Err(e)
                    }
                };
            }
            kind
        };
        match parent_kind {
            NodeKind::Root => self.lookup_top(name),
            NodeKind::Repo(repo_id) => self.lookup_repo_child(parent, repo_id, name),
            NodeKind::ControlDir(dir) => self.lookup_control(parent, dir, name, listed),
            NodeKind::Wt { wt, ov, is_root } => {
                if ov.ftype != FType::Dir {
                    return Err(FsError::not_dir());
                }
                if is_root && name == GITFILE_NAME {
                    if wt.gitfile_removed() {
                        return Err(FsError::not_found(format!("{}/.git", wt.ident.name)));
                    }
                    let natural = ino::path_ino(wt.ident.ino_space, b".git");
                    let mut t = self.nodes.write();
                    let ino = t.insert_child(parent, name, natural, NodeKind::GitFile(wt.clone()));
                    return self.counted_entry(t, ino);
                }
                if is_reserved(name) {
                    return Err(FsError::not_found(name.to_string_lossy()));
                }
                let dir_upper = || self.upper_dir(parent);
                let child = self
                    .resolve_child(&wt, &ov, &mut Default::default(), dir_upper, name)?
                    .ok_or_else(|| {
                        let mut e = FsError::not_found(format!(
                            "{}/{}",
                            wt.ident.name,
                            name.to_string_lossy()
                        ));
                        // Not the hour of present names: a lookup inside a directory
                        // being renamed (whose new path the table learns after the
                        // rename on disk) answers "absent" for that moment.
                        e.negative_ttl = Some(WT_TTL);
                        e
                    })?;
                // A submodule shown as a view of its own: its root, at its gitlink or
                // moved here (a stub in the upper layer says from where).
                let at = match (wt.nested.shown, child.base, child.in_upper) {
                    (true, Some(base), false) if base.mode == crate::git::MODE_GITLINK => {
                        Some((None, base.oid))
                    }
                    (true, _, true) if child.ftype == FType::Dir => self
                        .upper_dir(parent)
                        .ok()
                        .and_then(|d| self.stub_at(d.as_fd(), name))
                        .map(|(origin, commit)| (Some(origin), commit)),
                    _ => None,
                };
                if let Some((origin, commit)) = at {
                    {
                        let path = self.nodes.read().child_rel_path(parent, name)?;
                        if let Some(sub) =
                            self.submodule_view(&wt, origin.as_deref(), &path, commit)?
                        {
                            // The number a listing of the parent gives the name.
                            let natural = ino::path_ino(wt.ident.ino_space, &path);
                            let root = super::overlay::Overlay {
                                ftype: FType::Dir,
                                base: Some(sub.base.root()),
                                in_upper: true,
                                upper_ino: 0,
                            };
                            let mut t = self.nodes.write();
                            let ino = t.insert_child(
                                parent,
                                name,
                                natural,
                                NodeKind::Wt {
                                    wt: sub,
                                    ov: root,
                                    is_root: true,
                                },
                            );
                            return self.counted_entry(t, ino);
                        }
                    }
                }
                if let (true, FType::File, Some(base), false) =
                    (wt.base.converts(), child.ftype, child.base, child.in_upper)
                {
                    let path = self.nodes.read().child_rel_path(parent, name)?;
                    self.prepare_converted(&wt, &path, base.oid);
                }
                let mut t = self.nodes.write();
                let ino = t.insert_entry(parent, name, wt, child)?;
                self.counted_entry(t, ino)
            }
            NodeKind::ControlFile(..) | NodeKind::GitFile(_) => Err(FsError::not_dir()),
        }
    }

    /// The entry of `ino`, whose lookup count was just raised under the write lock `t`:
    /// its attributes and TTL, or, when its attributes cannot be had, the error with the
    /// count given back (the kernel, answered with the error, never learns of the node).
    pub(super) fn counted_entry(
        &self,
        t: RwLockWriteGuard<'_, NodeTable>,
        ino: Ino,
    ) -> FsResult<Entry> {
        match self.node_attr(&t, ino) {
            Ok(attr) => Ok(Entry {
                attr,
                ttl: ttl_of(&t, ino),
            }),
            Err(e) => {
                drop(t);
                self.forget(ino, 1);
                Err(e)
            }
        }
    }

    /// The kernel forgot `nlookup` of its lookups of `ino`; true when the node went with
    /// them (its number may be given to a new node from now on).
    pub fn forget(&self, ino: Ino, nlookup: u64) -> bool {
        self.nodes.write().forget(ino, nlookup)
    }

    pub fn getattr(&self, ino: Ino, fh: Option<Fh>) -> FsResult<Entry> {
        self.stats.getattrs.fetch_add(1, Ordering::Relaxed);
        if let Some(fh) = fh {
            if let Some(h) = self.handles.get(fh) {
                if let HandleKind::File { file, on_base, .. } = &*h {
                    if !on_base.load(Ordering::Acquire) {
                        let st = crate::beneath::fstat(opened(file)?.as_fd())
                            .map_err(|e| FsError::io("fstat", e))?;
                        let attr = match self.nodes.read().wt_of(ino) {
                            Ok((wt, _, _)) => wt.upper_attr(ino, &st),
                            Err(_) => Attr::from_stat(ino, &st),
                        };
                        return Ok(Entry { attr, ttl: WT_TTL });
                    }
                }
            }
        }
        let (attr, ttl) = self.settled_attr(ino)?;
        Ok(Entry { attr, ttl })
    }

    pub fn statfs(&self) -> FsResult<Statfs> {
        let s =
            nix::sys::statvfs::statvfs(&self.state.root).map_err(|e| FsError::sys("statvfs", e))?;
        Ok(Statfs {
            blocks: s.blocks(),
            bfree: s.blocks_free(),
            bavail: s.blocks_available(),
            files: s.files(),
            ffree: s.files_free(),
            bsize: s.block_size() as u32,
            namelen: NAME_MAX as u32,
            frsize: s.fragment_size() as u32,
        })
    }

    pub fn access(&self, ino: Ino) -> FsResult<()> {
        if self.nodes.read().contains(ino) {
            Ok(())
        } else {
            Err(FsError::stale(ino))
        }
    }
}

/// Writes an upper-layer marker (see `layout::write_marker`), with the path in the error.
pub(super) fn marker(dir: BorrowedFd, name: &OsStr, ordered: bool) -> FsResult<()> {
    crate::layout::write_marker(dir, name, ordered)
        .map_err(|e| FsError::io(format!("writing marker {}", name.to_string_lossy()), e))
}
