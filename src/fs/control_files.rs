//! What the files of `.control` say: the worktrees, leases, retained and removed
//! worktrees, turns and the daemon's counters, read from the store and from what the
//! daemon keeps in memory, and who owns each file.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;

use super::control::{control_file_attr, ControlDir, LAYOUT, REFRESH_NAME, STATS, STATUS};
use super::error::{ErrorKind, FsError, FsResult};
use super::nodes::{control_ino, NodeKind};
use super::ttl::{ttl_of, CONTROL_TTL};
use super::types::Entry;
use super::view::View;
use crate::ino::Ino;
use crate::report::shapes;
use crate::store::StoreError;

/// How long a refresh waits for the change requests that began before a guard to end.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

impl View {
    /// Who a generated file of `.control` belongs to when not the mount's owner: an
    /// fsmonitor answer, `<repo>:<worktree>@<token>`, and a setup log,
    /// `<repo>:<worktree>`, to the worktree's owner.
    pub(super) fn control_file_owner(&self, dir: ControlDir, name: &str) -> Option<(u32, u32)> {
        let (repo, rest) = name.split_once(':')?;
        let wt = match dir {
            ControlDir::FsMonitor => rest.rsplit_once('@')?.0,
            ControlDir::SetupLog => rest,
            _ => return None,
        };
        self.catalog
            .worktree_named(repo, wt)
            .map(|w| (w.ident.uid, w.ident.gid))
    }
}

impl View {
    /// The worktree a `.control` entry named `<repo>:<worktree>` is about (ENOENT when
    /// the name is not one, or names no worktree).
    fn entry_worktree(&self, entry: &str) -> FsResult<crate::store::WorktreeRow> {
        let (repo, wt) = entry
            .split_once(':')
            .ok_or_else(|| FsError::not_found(entry.to_string()))?;
        self.store
            .lock()
            .worktree(repo, wt)
            .map_err(|e| FsError::store("reading .control", e))?
            .ok_or_else(|| FsError::not_found(entry.to_string()))
    }

    /// Every lease: those in SQLite and those the daemon keeps in memory until SQLite
    /// takes them (a database held by another process), so `.control` says who holds
    /// what either way.
    fn all_leases(&self) -> FsResult<Vec<crate::store::LeaseRow>> {
        use crate::store::LeaseRow;
        let mut rows = self
            .store
            .lock()
            .leases()
            .map_err(|e| FsError::store("reading leases", e))?;
        let pending = self.pending_leases.get().map(|f| f()).unwrap_or_default();
        for (worktree_id, lease, since) in pending {
            let holder = lease.holder();
            if rows
                .iter()
                .any(|r| r.worktree_id == worktree_id && r.holder == holder)
            {
                continue;
            }
            let Some(wt) = self.catalog.worktree_by_id(worktree_id) else {
                continue;
            };
            let c = lease.columns();
            rows.push(LeaseRow {
                repo: wt.ident.repo.clone(),
                worktree: wt.ident.name.clone(),
                worktree_id,
                holder_kind: c.kind.into(),
                holder,
                pid: c.pid,
                pid_start: c.start,
                command: c.command,
                session: c.session,
                acquired_at: since,
                exclusive: false,
                active_at: None,
            });
        }
        if let Some(activity) = self.lease_activity.get().map(|f| f()) {
            for (worktree_id, holder, at) in activity {
                if let Some(r) = rows
                    .iter_mut()
                    .find(|r| r.worktree_id == worktree_id && r.holder == holder)
                {
                    r.active_at = Some(r.active_at.unwrap_or(0).max(at));
                }
            }
        }
        Ok(rows)
    }

    pub(super) fn control_names(&self, dir: ControlDir) -> FsResult<Vec<String>> {
        match dir {
            ControlDir::Top => Ok(LAYOUT.iter().map(|(_, n, _)| n.to_string()).collect()),
            ControlDir::Worktrees
            | ControlDir::Env
            | ControlDir::SetupLog
            | ControlDir::Checkpoints => {
                self.refresh()?;
                let mut names: Vec<String> = self
                    .catalog
                    .worktrees()
                    .iter()
                    .map(|w| format!("{}:{}", w.ident.repo, w.ident.name))
                    .collect();
                names.sort();
                Ok(names)
            }
            ControlDir::Leases => Ok(self.all_leases()?.iter().map(|l| l.entry_name()).collect()),
            ControlDir::Retained => Ok(self
                .store
                .lock()
                .retained()
                .map_err(|e| FsError::store("reading the retained store", e))?
                .iter()
                .map(|r| r.entry_name())
                .collect()),
            ControlDir::Removed => Ok(self
                .store
                .lock()
                .kept()
                .map_err(|e| FsError::store("reading kept removals", e))?
                .iter()
                .map(|r| r.entry_name())
                .collect()),
            ControlDir::Turns => {
                self.refresh()?;
                Ok(self
                    .turns
                    .running()
                    .iter()
                    .map(|t| t.entry_name())
                    .collect())
            }
            // Entries exist for any name asked (the name carries the query).
            ControlDir::FsMonitor => Ok(Vec::new()),
        }
    }

    pub(super) fn control_content(&self, dir: ControlDir, name: &str) -> FsResult<Vec<u8>> {
        let store_err = |e: StoreError| FsError::store("reading .control", e);
        match (dir, name) {
            // Answered at open (a query has effects); nothing to show before.
            (ControlDir::FsMonitor, _) => Ok(Vec::new()),
            (ControlDir::Top, STATUS) => {
                let rows = self.store.lock().worktrees().map_err(store_err)?;
                let leases = self.all_leases()?;
                Ok(crate::report::status_table(&rows, &leases, None, &[]).into_bytes())
            }
            (ControlDir::Top, STATS) => {
                let v = shapes::value(shapes::StatsJson {
                    content_reads: self.stats.content_reads.load(Ordering::Relaxed),
                    blob_fills: self.blob_fills(),
                    copy_ups: self.stats.copy_ups.load(Ordering::Relaxed),
                    conversions: self.stats.conversions.load(Ordering::Relaxed),
                    content_paths: self.stats.content_paths.lock().clone(),
                    lookups: self.stats.lookups.load(Ordering::Relaxed),
                    getattrs: self.stats.getattrs.load(Ordering::Relaxed),
                    opendirs: self.stats.opendirs.load(Ordering::Relaxed),
                    readdirs: self.stats.readdirs.load(Ordering::Relaxed),
                    passthrough_opens: self.stats.passthrough_opens.load(Ordering::Relaxed),
                    passthrough: self.stats.passthrough_on.load(Ordering::Relaxed),
                    transport: if self.stats.uring_on.load(Ordering::Relaxed) {
                        "io_uring"
                    } else {
                        "/dev/fuse"
                    }
                    .into(),
                    yield_cpu: self.stats.yield_on.load(Ordering::Relaxed),
                    xattr_requests: self.stats.xattr_requests.load(Ordering::Relaxed),
                    nodes: self.node_count() as u64,
                    removed_files_kept_open: self.nodes.kept_open() as u64,
                    open_descriptors: std::fs::read_dir("/proc/self/fd")
                        .map(|d| d.count())
                        .unwrap_or(0) as u64,
                    heap_in_use: crate::heap::in_use(),
                });
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Leases, entry) => {
                let lease = self
                    .all_leases()?
                    .into_iter()
                    .find(|l| l.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/leases/{entry}")))?;
                let v = crate::report::lease_json(&lease);
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Turns, entry) => {
                let turn = self
                    .turns
                    .running()
                    .into_iter()
                    .find(|t| t.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/turns/{entry}")))?;
                // Files there open for writing through the mount (descriptors, mappings):
                // their writes never reach a guard. (Generated under the node table's lock:
                // the handles' lock comes after it.)
                let v = shapes::value(shapes::ControlTurnJson {
                    turn: shapes::TurnJson::of(&turn, Some(&self.mountpoint)),
                    open_for_writing: self.handles.writable_in(turn.worktree_id).len() as u64,
                });
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Retained, entry) => {
                let row = self
                    .store
                    .lock()
                    .retained()
                    .map_err(store_err)?
                    .into_iter()
                    .find(|r| r.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/retained/{entry}")))?;
                let v = crate::report::retained_json(&row);
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Removed, entry) => {
                let store = self.store.lock();
                let row = store
                    .kept()
                    .map_err(store_err)?
                    .into_iter()
                    .find(|r| r.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/removed/{entry}")))?;
                let keep_secs = crate::lifecycle::cleanup::keep::KeepPolicy::of(&store).keep_secs;
                let v = crate::report::kept_json(&row, keep_secs, None);
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Env, entry) => {
                let row = self.entry_worktree(entry)?;
                let store = self.store.lock();
                let path = self.mountpoint.join(&row.repo).join(&row.name);
                let mut out = String::new();
                for (k, v) in crate::lifecycle::ports::environment(&store, &row, &path) {
                    out.push_str(&format!("export {k}={}\n", crate::report::shell_word(&v)));
                }
                Ok(out.into_bytes())
            }
            (ControlDir::SetupLog, entry) => {
                let row = self.entry_worktree(entry)?;
                crate::lifecycle::setup::read_log(&self.state, &row).map_err(|e| {
                    FsError::io(
                        format!("reading the setup log of {}/{}", row.repo, row.name),
                        e,
                    )
                })
            }
            (ControlDir::Checkpoints, entry) => {
                let row = self.entry_worktree(entry)?;
                let kept = crate::checkpoint::Checkpoints::read(&self.state.checkpoints(row.id))
                    .map_err(|e| FsError::io("reading checkpoints", e))?;
                let v = shapes::value(shapes::CheckpointsJson {
                    worktree: format!("{}/{}", row.repo, row.name),
                    checkpoints: kept
                        .into_iter()
                        .map(|(c, changed)| {
                            shapes::CheckpointJson::of(
                                c.id,
                                c.label,
                                c.taken_at,
                                (c.copied_open, c.copied_bytes),
                                Some(changed),
                            )
                        })
                        .collect(),
                });
                Ok(format!("{v:#}\n").into_bytes())
            }
            (ControlDir::Worktrees, entry) => {
                let row = self.entry_worktree(entry)?;
                let v = crate::report::worktree_json(&row, &self.mountpoint);
                Ok(format!("{v}\n").into_bytes())
            }
            _ => Err(FsError::not_found(format!(".control entry {name}"))),
        }
    }

    pub(super) fn lookup_control(
        &self,
        parent: Ino,
        dir: ControlDir,
        name: &OsStr,
        listed: bool,
    ) -> FsResult<Entry> {
        let name_s = name.to_string_lossy().into_owned();
        if dir == ControlDir::Top && name == REFRESH_NAME {
            // The CLI asks this after changing repositories or worktrees, so listings the
            // kernel cached are dropped before the command returns.
            self.refresh_catalog(true)
                .map_err(|e| FsError::store("reading the store", e))?;
            // A guard just read is in place for every request once those that began
            // before it have ended: the first refresh after it waits for them (no lock
            // held here; later ones do not), and answers EBUSY, not ENOENT, when they do
            // not end (a guarded `turn` then refuses).
            if self.turns.any_guarded() && !self.turns.settle_new(SETTLE_LIMIT) {
                return Err(FsError::busy(format!(
                    "requests that change files began before a turn's guard and did not end within {} s",
                    SETTLE_LIMIT.as_secs()
                )));
            }
            return Err(FsError::new(ErrorKind::NotFound, "catalog refreshed"));
        }
        // A generated file named in a listing is sent with size 0 instead of having its
        // content generated for each entry (a listing of N leases would generate N
        // times): its TTL is 0, so the kernel asks again (LOOKUP by path, GETATTR on an
        // open file; both generate it) before it uses the attributes for anything.
        let owner = self.control_file_owner(dir, &name_s);
        let listed_file = move |ino: Ino| control_file_attr(ino, 0, owner);
        if dir == ControlDir::Top {
            // Fixed nodes: their lookup counts are never used up.
            let t = self.nodes.read();
            let ino = t
                .child(parent, name)
                .ok_or_else(|| FsError::not_found(format!(".control/{name_s}")))?;
            let attr = match t.kind(ino) {
                Some(NodeKind::ControlFile(..)) if listed => listed_file(ino),
                _ => self.node_attr(&t, ino)?,
            };
            return Ok(Entry {
                attr,
                ttl: ttl_of(&t, ino),
            });
        }
        if !listed && dir != ControlDir::FsMonitor && !self.control_names(dir)?.contains(&name_s) {
            return Err(FsError::not_found(format!(".control entry {name_s}")));
        }
        let natural = control_ino(dir, name);
        let mut t = self.nodes.write();
        let ino = t.insert_child(parent, name, natural.0, NodeKind::ControlFile(dir, name_s));
        if listed {
            return Ok(Entry {
                attr: listed_file(ino),
                ttl: CONTROL_TTL,
            });
        }
        self.counted_entry(t, ino)
    }
}
