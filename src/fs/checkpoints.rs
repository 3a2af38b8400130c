//! A worktree's checkpoints taken and rewound through the view (`crate::checkpoint` keeps
//! the upper layer; `crate::git::checkpoint` git's own state of the worktree): under
//! `mutate`, so no change is half made; with the files open for writing copied; and after
//! a rewind, the node table and the kernel's caches brought to what is on disk.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::checkpoint::{Info, Rewound};
use crate::ids::WorktreeId;

use super::catalog::repo_ino;
use super::error::{FsError, FsResult};
use super::nodes::NodeKind;
use super::types::{FType, Inval};
use super::view::View;
use super::worktree::WtCtx;

/// What a rewind did, as the view reports it.
#[derive(Debug)]
pub struct RewindDone {
    pub to: Info,
    /// The checkpoint taken first, to undo it.
    pub before: Info,
    /// Paths put back: names removed, made or replaced, and files whose data or
    /// attributes came back.
    pub changed: usize,
}

impl View {
    fn checkpointed(&self, id: WorktreeId) -> FsResult<Arc<WtCtx>> {
        self.refresh()?;
        let wt = self
            .catalog
            .worktree_by_id(id)
            .ok_or_else(|| FsError::not_found(format!("worktree {id}")))?;
        if wt.checkpoints.is_none() {
            return Err(FsError::invalid("this view keeps no checkpoints"));
        }
        Ok(wt)
    }

    /// The files of worktree `wt` open for writing now: the path of each (none when
    /// removed) and a descriptor of it.
    fn open_for_writing(&self, wt: &Arc<WtCtx>) -> Vec<(Option<Vec<u8>>, OwnedFd)> {
        let files = self.handles.writable_files_in(wt);
        let t = self.nodes.read();
        files
            .into_iter()
            .map(|(ino, fd)| (t.live_rel_path(ino).ok(), fd))
            .collect()
    }

    /// Takes a checkpoint of worktree `id` (labelled `label`): its upper layer (O(1),
    /// the files open for writing copied) and git's state of it.
    pub fn take_checkpoint(&self, id: WorktreeId, label: Option<String>) -> FsResult<Info> {
        let wt = self.checkpointed(id)?;
        let cps = wt.checkpoints.as_ref().expect("checked");
        let started = std::time::Instant::now();
        let _m = self.lock_changes_of(&wt);
        self.refuse_while_unfinished(&wt)?;
        let open = self.open_for_writing(&wt);
        let open: Vec<_> = open.iter().map(|(p, f)| (p.clone(), f.as_fd())).collect();
        let info = cps
            .take(label, wt.upper.fd.as_fd(), &open)
            .map_err(|e| FsError::io("taking a checkpoint", e))?;
        if let Err(e) = self.save_git_state(&wt, info.id, &[]) {
            if cps.drop_checkpoint(info.id).is_ok() {
                self.drop_git_state(&wt, info.id);
            }
            return Err(e);
        }
        tracing::info!(
            repo = %wt.ident.repo,
            worktree = %wt.ident.name,
            checkpoint = info.id,
            open_copied = info.copied_open,
            took_us = started.elapsed().as_micros() as u64,
            "checkpoint taken"
        );
        self.drop_past_limits(&wt);
        Ok(info)
    }

    /// The checkpoints of worktree `id`, oldest first.
    pub fn checkpoints(&self, id: WorktreeId) -> FsResult<Vec<Info>> {
        let wt = self.checkpointed(id)?;
        wt.checkpoints
            .as_ref()
            .expect("checked")
            .list()
            .map_err(|e| FsError::io("listing checkpoints", e))
    }

    /// Rewinds worktree `id` to checkpoint `to`: first a checkpoint of the state it
    /// leaves, then the upper layer and git's state as they were at `to`, then what the
    /// kernel and the node table knew of the paths that changed dropped. Answers once
    /// the kernel was told (outside the lock on changes: telling it may wait for a
    /// request that needs that lock).
    pub fn rewind(&self, id: WorktreeId, to: u64) -> FsResult<RewindDone> {
        let done = self.rewind_locked(id, to);
        self.await_invalidations(std::time::Duration::from_secs(10));
        done
    }

    fn rewind_locked(&self, id: WorktreeId, to: u64) -> FsResult<RewindDone> {
        let wt = self.checkpointed(id)?;
        let cps = wt.checkpoints.as_ref().expect("checked");
        let _m = self.lock_changes_of(&wt);
        // One that did not finish: a rewind to the checkpoint it took first goes back to
        // the state before it (every change it made is kept there), anything else finishes
        // it first (or says again why it cannot).
        match cps.pending_rewind() {
            Some((_, before)) if before == to => {
                cps.end_rewind()
                    .map_err(|e| FsError::io("calling off the rewind that did not finish", e))?;
            }
            Some(_) => {
                if let Some(r) = self.finish_rewind(&wt)? {
                    self.forget_rewound(&wt, &r);
                }
            }
            None => {}
        }
        let target = cps
            .list()
            .map_err(|e| FsError::io("listing checkpoints", e))?
            .into_iter()
            .find(|i| i.id == to)
            .ok_or_else(|| FsError::not_found(format!("checkpoint {to}")))?;
        if !self.git_place(&wt).is_saved(to) {
            return Err(FsError::invalid(format!(
                "checkpoint {to} is incomplete (git's state of it was not kept: a crash while it was taken?); rewind to another"
            )));
        }
        self.refuse_moving_nested_views(&wt, &cps.dir(to))?;
        let open = self.open_for_writing(&wt);
        let open: Vec<_> = open.iter().map(|(p, f)| (p.clone(), f.as_fd())).collect();
        let label = Some(format!("before the rewind to {to}"));
        let started = std::time::Instant::now();
        let upper = wt.upper.fd.as_fd();
        let failed = |e| FsError::io(format!("rewinding to checkpoint {to}"), e);
        let before = cps.begin_rewind(upper, to, label, &open).map_err(failed)?;
        // The branches the rewind moves are kept too, so that its undo moves them back.
        let moved = crate::git::checkpoint::branches_of(&cps.dir(to));
        if let Err(e) = self.save_git_state(&wt, before.id, &moved) {
            // Nothing changed yet: the rewind is called off whole.
            let _ = cps.end_rewind();
            if cps.drop_checkpoint(before.id).is_ok() {
                self.drop_git_state(&wt, before.id);
            }
            return Err(e);
        }
        let r = match self.finish_rewind(&wt) {
            Ok(r) => r.expect("begun above"),
            Err(e) => {
                // Cut short: what changed is not known; everything the kernel knows of
                // the worktree is dropped, and the rewind stays marked as under way.
                self.forget_worktree(&wt);
                return Err(e);
            }
        };
        let changed = r.names.len() + r.inodes.len();
        self.forget_rewound(&wt, &r);
        tracing::info!(
            repo = %wt.ident.repo,
            worktree = %wt.ident.name,
            checkpoint = to,
            undo = r.before.id,
            changed,
            took_us = started.elapsed().as_micros() as u64,
            "rewound"
        );
        Ok(RewindDone {
            to: target,
            before: r.before,
            changed,
        })
    }

    /// Finishes the rewind under way in `wt` (begun here, or cut short by a crash):
    /// the upper layer, then git's state, then the mark that it was under way.
    pub(super) fn finish_rewind(&self, wt: &WtCtx) -> FsResult<Option<Rewound>> {
        let cps = wt.checkpoints.as_ref().expect("a worktree's own view");
        let Some((to, before)) = cps.pending_rewind() else {
            return Ok(None);
        };
        let failed = |e| {
            FsError::io(
                format!(
                    "the rewind to checkpoint {to} did not finish (rewind again to finish it, or to checkpoint {before} to go back)"
                ),
                e,
            )
        };
        if !self.git_place(wt).is_saved(before) {
            // Cut short before git's state of the checkpoint it took was kept: git's
            // files are untouched until the upper layer is back, so they are kept now.
            let moved = crate::git::checkpoint::branches_of(&cps.dir(to));
            self.save_git_state(wt, before, &moved)?;
        }
        let mut r = cps.continue_rewind(wt.upper.fd.as_fd()).map_err(failed)?;
        let moved = self.restore_submodule_records(wt, &cps.dir(to))?;
        if let Some(r) = r.as_mut() {
            // Where the moved views were shown and are now: looked up again.
            r.names.extend(moved);
        }
        self.restore_git_state(wt, to).map_err(|e| {
            FsError::eio(
                format!(
                    "the rewind to checkpoint {to} did not finish (rewind again to finish it, or to checkpoint {before} to go back): {}",
                    e.message
                ),
                std::io::Error::other("git state"),
            )
        })?;
        cps.end_rewind().map_err(failed)?;
        Ok(r)
    }

    /// At the start of serving `wt`: a rewind a crash cut short is finished, and a
    /// checkpoint a crash cut short while it was taken (its upper layer's epoch begun, git's
    /// state of it not kept) is dropped.
    pub(super) fn settle_checkpoints(&self, wt: &WtCtx) -> FsResult<()> {
        let Some(cps) = wt.checkpoints.as_ref() else {
            return Ok(());
        };
        if cps.pending_rewind().is_some() {
            tracing::warn!(
                repo = %wt.ident.repo,
                worktree = %wt.ident.name,
                "finishing a rewind a crash cut short"
            );
            if let Err(e) = self.finish_rewind(wt) {
                // Served as it is: its checkpoints refuse new ones until it is finished.
                tracing::error!(
                    repo = %wt.ident.repo,
                    worktree = %wt.ident.name,
                    "{}",
                    e.message
                );
                return Ok(());
            }
        }
        let place = self.git_place(wt);
        if !place.exists() {
            return Ok(());
        }
        for c in cps.list().unwrap_or_default() {
            if !place.is_saved(c.id) {
                tracing::warn!(
                    repo = %wt.ident.repo,
                    worktree = %wt.ident.name,
                    checkpoint = c.id,
                    "a checkpoint cut short while it was taken is dropped"
                );
                cps.drop_checkpoint(c.id)
                    .map_err(|e| FsError::io(format!("dropping checkpoint {}", c.id), e))?;
                self.drop_git_state(wt, c.id);
            }
        }
        Ok(())
    }

    /// Refuses a checkpoint while a rewind that did not finish is marked in `wt`.
    fn refuse_while_unfinished(&self, wt: &WtCtx) -> FsResult<()> {
        let cps = wt.checkpoints.as_ref().expect("a worktree's own view");
        match cps.pending_rewind() {
            Some((to, before)) => Err(FsError::new(
                super::error::ErrorKind::Busy,
                format!(
                    "a rewind to checkpoint {to} did not finish: rewind again to finish it (or to checkpoint {before}, the state before it)"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Where `wt`'s git state is.
    fn git_place<'a>(&self, wt: &'a WtCtx) -> crate::git::checkpoint::Place<'a> {
        crate::git::checkpoint::Place {
            gitdir: &wt.base.gitdir,
            admin_name: &wt.ident.admin_name,
            worktree: format!("{}/{}", wt.ident.repo, wt.ident.name),
            uid: wt.ident.uid,
        }
    }

    /// Keeps git's state of checkpoint `n` (and, first, where the submodule views are):
    /// once it is kept, the checkpoint is whole.
    fn save_git_state(&self, wt: &WtCtx, n: u64, also: &[String]) -> FsResult<()> {
        let cps = wt.checkpoints.as_ref().expect("a worktree's own view");
        self.keep_submodule_records(wt, &cps.dir(n))?;
        crate::git::checkpoint::save(
            &self.git_place(wt),
            &cps.dir(n),
            &crate::git::checkpoint_refs::worktree_key(&self.refs_key, wt.ident.id.0),
            n,
            also,
        )
        .map_err(|e| FsError::eio(format!("{e:#}"), std::io::Error::other("git state")))
    }

    fn restore_git_state(&self, wt: &WtCtx, n: u64) -> FsResult<()> {
        let cps = wt.checkpoints.as_ref().expect("a worktree's own view");
        crate::git::checkpoint::restore(&self.git_place(wt), &cps.dir(n), n)
            .map_err(|e| FsError::eio(format!("{e:#}"), std::io::Error::other("git state")))
    }

    /// Drops checkpoint `n`'s git state, and retires the ref that kept what it reached
    /// (kept for the removal period: nothing it reached is lost with it).
    fn drop_git_state(&self, wt: &WtCtx, n: u64) {
        if let Err(e) = crate::git::checkpoint::drop(&self.git_place(wt), n) {
            tracing::warn!("dropping git's state of checkpoint {n}: {e:#}");
        }
        let key = crate::git::checkpoint_refs::worktree_key(&self.refs_key, wt.ident.id.0);
        if let Err(e) = crate::git::checkpoint_refs::retire(&wt.base.gitdir, &key, n) {
            // Retired at the worktree's removal, or kept until then.
            tracing::warn!("retiring the ref of checkpoint {n}: {e:#}");
        }
    }

    /// Drops the checkpoints of `wt` past the limits (`checkpoint::KEEP_COUNT`,
    /// `KEEP_HOURS`), oldest first, and while the state directory's disk is low (as kept
    /// removals give way: `KeepPolicy::low_disk`) all but the newest; a failure is logged
    /// (the next take tries again).
    fn drop_past_limits(&self, wt: &WtCtx) {
        let cps = wt.checkpoints.as_ref().expect("a worktree's own view");
        let policy = crate::lifecycle::cleanup::keep::KeepPolicy::of(&self.store.lock());
        let count = match policy.low_disk(&self.state.root) {
            Some(why) => {
                tracing::warn!(
                    repo = %wt.ident.repo,
                    worktree = %wt.ident.name,
                    "{why}: its checkpoints but the newest are dropped"
                );
                1
            }
            None => crate::checkpoint::KEEP_COUNT,
        };
        let past = match cps.past_limits(count, crate::checkpoint::KEEP_HOURS) {
            Ok(p) => p,
            Err(e) => return tracing::warn!("listing checkpoints to drop: {e}"),
        };
        for n in past {
            match cps.drop_checkpoint(n) {
                Ok(()) => {
                    self.drop_git_state(wt, n);
                    tracing::info!(
                        repo = %wt.ident.repo,
                        worktree = %wt.ident.name,
                        checkpoint = n,
                        "checkpoint dropped (past the limits)"
                    );
                }
                Err(e) => return tracing::warn!("dropping checkpoint {n}: {e}"),
            }
        }
    }

    /// While the state directory's disk is low (`policy.low_disk`; kept removals gave
    /// way first): the checkpoints of every worktree, oldest first across them, each
    /// worktree keeping its newest (most often the one that undoes the turn under way).
    /// Returns how many went.
    pub fn drop_checkpoints_for_disk(
        &self,
        policy: &crate::lifecycle::cleanup::keep::KeepPolicy,
    ) -> usize {
        let mut all: Vec<(i64, u64, Arc<WtCtx>)> = Vec::new();
        for wt in self.catalog.worktrees() {
            let Some(cps) = wt.checkpoints.as_ref() else {
                continue;
            };
            let Ok(list) = cps.list() else { continue };
            let n = list.len();
            for c in list.into_iter().take(n.saturating_sub(1)) {
                all.push((c.taken_at, c.id, wt.clone()));
            }
        }
        all.sort_by_key(|(at, id, _)| (*at, *id));
        let mut dropped = 0;
        for (_, n, wt) in all {
            let Some(why) = policy.low_disk(&self.state.root) else {
                break;
            };
            let _m = self.lock_changes_of(&wt);
            let cps = wt.checkpoints.as_ref().expect("listed");
            match cps.drop_checkpoint(n) {
                Ok(()) => {
                    self.drop_git_state(&wt, n);
                    dropped += 1;
                    tracing::warn!(
                        repo = %wt.ident.repo,
                        worktree = %wt.ident.name,
                        checkpoint = n,
                        "checkpoint dropped: {why}"
                    );
                }
                // Gone meanwhile, or held by a rewind that did not finish.
                Err(e) => tracing::info!(
                    repo = %wt.ident.repo,
                    worktree = %wt.ident.name,
                    "checkpoint {n} not dropped for the disk: {e}"
                ),
            }
        }
        dropped
    }

    /// After a rewind: each changed path's node made what the disk now holds (kept
    /// when it is still the same directory or file, else its name forgotten, so the next
    /// lookup makes a node of what is there), and the kernel told to drop what it cached
    /// of each name and each directory listing.
    pub(super) fn forget_rewound(&self, wt: &Arc<WtCtx>, r: &Rewound) {
        let paths: Vec<Vec<u8>> = r
            .names
            .iter()
            .chain(r.inodes.iter())
            .chain(r.dirs.iter())
            .cloned()
            .collect();
        self.forget_paths(wt, paths);
    }

    /// After a rewind that did not finish: every path of `wt` the node table knows, as
    /// `forget_rewound` does for those a rewind put back.
    fn forget_worktree(&self, wt: &Arc<WtCtx>) {
        let paths: Vec<Vec<u8>> = {
            let t = self.nodes.read();
            let root = t.child(repo_ino(wt.ident.repo_id), OsStr::new(&wt.ident.name));
            match root {
                Some(root) => t
                    .below(root)
                    .into_iter()
                    .filter_map(|n| t.live_rel_path(n).ok())
                    .chain(std::iter::once(Vec::new()))
                    .collect(),
                None => Vec::new(),
            }
        };
        self.forget_paths(wt, paths);
    }

    fn forget_paths(&self, wt: &Arc<WtCtx>, mut paths: Vec<Vec<u8>>) {
        paths.sort();
        paths.dedup();
        paths.sort_by_key(|p| p.iter().filter(|&&b| b == b'/').count());
        let mut inval = Vec::new();
        let root = {
            let t = self.nodes.read();
            t.child(repo_ino(wt.ident.repo_id), OsStr::new(&wt.ident.name))
        };
        let Some(root) = root else { return };
        for rel in paths {
            if rel.is_empty() {
                inval.push(Inval::Inode(root));
                continue;
            }
            let (parent, name) = {
                let t = self.nodes.read();
                let mut cur = Some(root);
                let comps: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
                for c in &comps[..comps.len() - 1] {
                    cur = cur.and_then(|p| t.child(p, OsStr::from_bytes(c)));
                }
                match cur {
                    Some(p) => (p, OsStr::from_bytes(comps[comps.len() - 1]).to_os_string()),
                    None => continue, // the kernel knows nothing below
                }
            };
            inval.push(Inval::Inode(parent));
            inval.push(Inval::Entry(parent, name.clone()));
            let Some(node) = self.nodes.read().child(parent, &name) else {
                continue;
            };
            inval.push(Inval::Inode(node));
            // The table's read lock let go before the disk is looked at (`upper_dir`
            // takes it again: a writer queued between two reads would wait forever).
            let dir = self.nodes.read().wt_of(parent);
            let fresh = dir.and_then(|(_, dir_ov, _)| {
                self.resolve_child(
                    wt,
                    &dir_ov,
                    &mut Default::default(),
                    || self.upper_dir(parent),
                    &name,
                )
            });
            let mut t = self.nodes.write();
            let same = match (&fresh, t.wt_of(node)) {
                (Ok(Some(now)), Ok((_, was, _))) => {
                    now.ftype == was.ftype
                        && (now.ftype == FType::Dir
                            || (now.in_upper && now.upper_ino == was.upper_ino)
                            || (!now.in_upper
                                && !was.in_upper
                                && now.base.map(|b| b.oid) == was.base.map(|b| b.oid)))
                }
                _ => false,
            };
            if same {
                if let (Ok(Some(now)), Some(NodeKind::Wt { ov, .. })) = (fresh, t.kind_mut(node)) {
                    *ov = now;
                }
            } else {
                t.detach_name(parent, &name);
            }
        }
        if let Some(send) = self.invalidator.get() {
            for i in inval {
                send(i);
            }
        }
    }
}
