//! A submodule's view inside a worktree (`lifecycle::submodules`): the gitlink's directory
//! becomes the root of a view of the submodule's own repository, with its own layers,
//! journal and `.git`, covered by the parent worktree's leases. Made at the first lookup
//! of the directory, never under the node table's lock.

use std::sync::Arc;

use git2::Oid;

use crate::lifecycle::submodules::{ensure, Parent};

use super::error::{FsError, FsResult};
use super::view::View;
use super::worktree::{Identity, Nested, SubOf, UpperLayer, WtCtx};
use crate::ids::WorktreeId;
use crate::ino::Ino;

impl View {
    /// The view of the submodule at `path` of view `wt` (a worktree, or a submodule's
    /// view: gitlink `commit`): made the first time. None where the worktree does not
    /// show submodules, and for a submodule that is not initialized.
    ///
    /// `stub` is the path it was made at, when it was found through a stub (moved: see
    /// `layout::SUBMODULE_MARKER`); None at its gitlink.
    pub(super) fn submodule_view(
        &self,
        wt: &Arc<WtCtx>,
        stub: Option<&[u8]>,
        path: &[u8],
        commit: Oid,
    ) -> FsResult<Option<Arc<WtCtx>>> {
        if !wt.nested.shown {
            return Ok(None);
        }
        if let Some(s) = wt.nested.views.lock().get(path) {
            return Ok(Some(s.clone()));
        }
        // Made once: a second lookup of this path waits for the first; lookups of other
        // paths do not (making one may take a while: its index, its conversions).
        let slot = wt
            .nested
            .making
            .lock()
            .entry(path.to_vec())
            .or_default()
            .clone();
        let _making = slot.lock();
        let made = self.make_submodule_view(wt, stub, path, commit);
        // This path's slot goes once nobody else waits on it (one that waits makes, or
        // finds, the view with this same slot: never two makers of one path at once).
        let mut making = wt.nested.making.lock();
        if making
            .get(path)
            .is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(s) == 2)
        {
            making.remove(path);
        }
        made
    }

    fn make_submodule_view(
        &self,
        wt: &Arc<WtCtx>,
        stub: Option<&[u8]>,
        path: &[u8],
        commit: Oid,
    ) -> FsResult<Option<Arc<WtCtx>>> {
        let origin = stub.unwrap_or(path);
        if let Some(s) = wt.nested.views.lock().get(path) {
            return Ok(Some(s.clone())); // made while this one waited
        }
        let (within, worktree) = (wt.sub_path(), wt.worktree_name());
        if wt.is_submodule() && within.is_none() {
            // The view above is being let go (its worktree's context is gone).
            return Ok(None);
        }
        let what = format!("{}/{}", wt.ident.name, String::from_utf8_lossy(path));
        // Made on a thread of its own, waited for a bounded time: the submodule's
        // repository is its owner's, who may have put a FIFO where libgit2 opens a file
        // (which would hold this FUSE worker, and, one lookup at a time, all of them).
        static GATE: crate::bounded::Gate<(WorktreeId, String)> = crate::bounded::Gate::new();
        let limit = self.inspection().request_timeout();
        let filter_timeout = self.filter_timeout();
        let (state, mountpoint) = (self.state.clone(), self.mountpoint.clone());
        let (repo, admin_name, common_dir) = (
            wt.ident.repo.clone(),
            wt.ident.admin_name.clone(),
            wt.base.gitdir.clone(),
        );
        let (id, base_tree, uid, gid) = (wt.ident.id, wt.base.tree, wt.ident.uid, wt.ident.gid);
        let (from, at, via_stub) = (origin.to_vec(), path.to_vec(), stub.is_some());
        // Keyed by the view's record (its origin path), whatever path it shows at.
        let key = crate::layout::submodules::key_of(
            crate::layout::submodules::full_path(
                within.as_deref(),
                &String::from_utf8_lossy(origin),
            )
            .as_bytes(),
        );
        let making = GATE.run(
            (wt.ident.id, key),
            format!("submodule-{id}"),
            limit,
            move || {
                let parent = Parent {
                    id,
                    repo: &repo,
                    name: &worktree,
                    within: within.as_deref(),
                    admin_name: &admin_name,
                    common_dir: &common_dir,
                    base_tree,
                    uid,
                    gid,
                    mountpoint: &mountpoint,
                    filter_timeout,
                };
                ensure(&state, &parent, &from, &at, commit, via_stub)
            },
        );
        use crate::bounded::Bounded;
        let made = match making {
            Bounded::Done(made) => made.map_err(|e| format!("{e:#}")),
            Bounded::TimedOut => Err(format!(
                "not made within {} s (something in its repository blocks reading: a FIFO or a file of a filesystem that hangs?)",
                limit.as_secs_f64()
            )),
            Bounded::StillBlocked(since) => Err(format!(
                "an earlier making of it is still blocked ({} s: something in its repository blocks reading, a FIFO or a file of a filesystem that hangs?)",
                since.as_secs()
            )),
            Bounded::TooMany(n) => Err(format!(
                "{n} makings of submodule views are blocked (something in their repositories blocks reading); none more starts until they end"
            )),
            Bounded::Failed => Err("its making failed unexpectedly (see the log)".to_string()),
        };
        let (dir, record) = match made {
            Ok(Some(made)) => made,
            Ok(None) => return Ok(None),
            // Not entered rather than an empty directory, whose files would hide the
            // submodule from then on.
            Err(e) => {
                return Err(FsError::eio(
                    format!("submodule {what}: its view could not be made ({e})"),
                    std::io::Error::other("submodule view"),
                ))
            }
        };
        let ctx = (|| -> FsResult<WtCtx> {
            let upper = dir.join("upper");
            let work = dir.join("work");
            let (upper_fd, work_fd, whiteouts, _) = super::namespace::open_layers(&upper, &work)?;
            Ok(WtCtx {
                ident: Identity {
                    id: wt.ident.id,
                    repo_id: wt.ident.repo_id,
                    repo: wt.ident.repo.clone(),
                    name: what.clone(),
                    uid: wt.ident.uid,
                    gid: wt.ident.gid,
                    admin_name: record.admin_name.clone(),
                    gitfile: format!("gitdir: {}\n", record.admin().display()).into_bytes(),
                    ino_space: crate::ino::InoSpace::of_submodule(wt.ident.ino_space, path),
                    lease_id: wt.ident.lease_id,
                },
                upper: UpperLayer {
                    path: upper,
                    work,
                    fd: upper_fd,
                    work_fd,
                    whiteouts,
                },
                base: self.bases.open(
                    &record.gitdir,
                    Oid::from_str(&record.tree)
                        .map_err(|e| FsError::git("its record's tree", e))?,
                    std::time::UNIX_EPOCH
                        + std::time::Duration::from_secs(record.base_mtime.max(0) as u64),
                    None,
                    &dir.join(crate::state::CONVERSIONS_FILE),
                )?,
                journal: Default::default(),
                nested: Nested {
                    of: Some(SubOf {
                        parent: Arc::downgrade(wt),
                        path: parking_lot::Mutex::new(path.to_vec()),
                        origin: origin.to_vec(),
                        commit,
                    }),
                    shown: true,
                    ..Nested::default()
                },
                checkpoints: None,
            })
        })()
        .map_err(|e| FsError::internal(format!("submodule {what}: {}", e.message)))?;
        // Shown at the path its record names now: a rename of a directory above it while
        // it was made moved it (moves hold `moving` while they change records and
        // `nested.views`). One made meanwhile by another lookup is the one shown (never two
        // contexts over one layer).
        let _moving = wt.nested.moving.lock();
        let now = std::fs::read(dir.join("record"))
            .ok()
            .and_then(|b| serde_json::from_slice::<crate::layout::submodules::SubRecord>(&b).ok())
            .map(|r| r.path)
            .unwrap_or_else(|| record.path.clone());
        let key = match &wt.sub_path() {
            Some(w) => now
                .strip_prefix(w.as_str())
                .and_then(|p| p.strip_prefix('/'))
                .unwrap_or(&now)
                .as_bytes()
                .to_vec(),
            None => now.into_bytes(),
        };
        if let Some(of) = &ctx.nested.of {
            *of.path.lock() = key.clone();
        }
        let ctx = wt
            .nested
            .views
            .lock()
            .entry(key)
            .or_insert(Arc::new(ctx))
            .clone();
        tracing::info!(
            "submodule {what}: shown at {} ({})",
            record.commit,
            record.name
        );
        Ok(Some(ctx))
    }
}

impl View {
    /// The stub of a submodule view moved to `name` in the upper directory `dir` (see
    /// `layout::SUBMODULE_MARKER`): the path it was made at and its commit.
    pub(super) fn stub_at(
        &self,
        dir: std::os::fd::BorrowedFd,
        name: &std::ffi::OsStr,
    ) -> Option<(Vec<u8>, Oid)> {
        use std::os::fd::AsFd;
        use std::os::unix::ffi::OsStrExt;
        let d = crate::beneath::dir(dir, name.as_bytes()).ok()?;
        let b = crate::layout::read_stub(d.as_fd())?;
        crate::layout::submodules::parse_stub(&b)
    }

    /// `rename` of a submodule view's root (`git mv vendor/lib lib`, `mv`): its git entry
    /// is checked first (one that is not this view's refuses the move, changing
    /// nothing); then a stub in the upper layer at the new name shows the view there
    /// (the one already there, when it was moved before, moves; else one is made), put
    /// in place of a whiteout there in one exchange, and a whiteout hides the gitlink at
    /// the old name; then the record and git entry say the new path. The target is absent
    /// or an empty directory (checked by `rename`). In memory, the view is found at its
    /// new path. A crash after the stub shows the view at the new path (its record
    /// follows at the next lookup there); between the stub and the whiteout, at both.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename_submodule(
        &self,
        parent: Ino,
        name: &std::ffi::OsStr,
        newparent: Ino,
        newname: &std::ffi::OsStr,
        root: Ino,
        sub: &Arc<WtCtx>,
        dst: Option<super::overlay::Overlay>,
    ) -> FsResult<()> {
        use crate::beneath;
        use crate::layout::submodules as records;
        use crate::lifecycle::submodules as subs;
        use std::os::fd::AsFd;
        let Some(of) = sub.nested.of.as_ref() else {
            return Err(FsError::stale(root));
        };
        let Some(owner) = of.parent.upgrade() else {
            return Err(FsError::stale(root));
        };
        let new_rel = self.nodes.read().child_rel_path(newparent, newname)?;
        let Ok(new_s) = std::str::from_utf8(&new_rel) else {
            return Err(FsError::invalid(
                "a submodule's view moves only to a UTF-8 path (its record names it)",
            ));
        };
        let to = records::full_path(owner.sub_path().as_deref(), new_s);
        let Some(origin) = sub.sub_origin() else {
            return Err(FsError::stale(root));
        };
        let dir = self
            .state
            .subs(owner.ident.id)
            .join(records::key_of(origin.as_bytes()));
        let failed = |what: &str, e: std::io::Error| {
            FsError::io(
                format!(
                    "rename of submodule {} to {}: {what}",
                    sub.ident.name,
                    String::from_utf8_lossy(&new_rel)
                ),
                e,
            )
        };
        let refused = |e: String| {
            FsError::eio(
                format!("submodule {}: {e}", sub.ident.name),
                std::io::Error::other("moving a submodule view"),
            )
        };
        // 1. Its record, and its git entry checked.
        let record = {
            let bytes = std::fs::read(dir.join("record")).map_err(|e| failed("its record", e))?;
            serde_json::from_slice::<records::SubRecord>(&bytes)
                .map_err(|e| failed("its record", std::io::Error::other(e)))?
        };
        let place = format!("{}/{}", owner.ident.repo, owner.worktree_name());
        subs::entry_is_ours(&self.state, &record, &place, owner.ident.uid)
            .map_err(|e| refused(format!("{e:#}")))?;
        // 2. The stub at the new name; the gitlink at the old one hidden.
        self.ensure_upper_dir(parent)?;
        self.ensure_upper_dir(newparent)?;
        let from_dir = self.upper_dir(parent)?;
        let to_dir = self.upper_dir(newparent)?;
        let (from_dir, to_dir) = (from_dir.as_fd(), to_dir.as_fd());
        let work = owner.upper.work_fd.as_fd();
        let hide_old = self.base_has(parent, name)?;
        if let Some(d) = dst {
            if d.in_upper && d.ftype == super::types::FType::Dir {
                self.to_trash(&owner, to_dir, newname)
                    .map_err(|e| failed("moving the replaced directory out", e))?;
            }
        }
        let onto_whiteout = owner.upper.whiteouts.at(to_dir, newname);
        let stub_here = self.stub_at(from_dir, name).is_some();
        // Over a base directory at the new name (one the user removed): opaque, so
        // nothing of it merges in (a copy-up of the tree above never descends into it).
        let opaque = self.base_has(newparent, newname)?;
        // Where the stub comes from: its place at the old name, or a new one in work/.
        let tmp = Self::work_tmp("stub");
        let (src_dir, src_name) = if stub_here {
            if opaque {
                let d = beneath::dir(from_dir, name.as_encoded_bytes())
                    .map_err(|e| failed("opening its stub", e))?;
                super::view::marker(
                    d.as_fd(),
                    std::ffi::OsStr::new(crate::layout::OPAQUE_MARKER),
                    true,
                )?;
            }
            (from_dir, name)
        } else {
            beneath::mkdir_at(work, &tmp, 0o755).map_err(|e| failed("making its stub", e))?;
            let made = (|| -> FsResult<()> {
                let d = beneath::dir(work, tmp.as_encoded_bytes())
                    .map_err(|e| failed("making its stub", e))?;
                super::copyup::write_stub(d.as_fd(), &of.origin, of.commit)?;
                if opaque {
                    super::view::marker(
                        d.as_fd(),
                        std::ffi::OsStr::new(crate::layout::OPAQUE_MARKER),
                        true,
                    )?;
                }
                beneath::chmod(d.as_fd(), 0o755).map_err(|e| failed("making its stub", e))?;
                let _ = beneath::chown(d.as_fd(), Some(owner.ident.uid), Some(owner.ident.gid));
                Ok(())
            })();
            if let Err(e) = made {
                let _ = beneath::remove_tree(work, &tmp);
                return Err(e);
            }
            (work, tmp.as_os_str())
        };
        // In one step: onto a whiteout, exchanged with it (which then lands where the
        // stub was: at the old name, it hides the gitlink there).
        let exchanged = onto_whiteout
            && beneath::rename_at(src_dir, src_name, to_dir, newname, libc::RENAME_EXCHANGE)
                .is_ok();
        let placed = if exchanged {
            Ok(())
        } else {
            (|| {
                if onto_whiteout {
                    beneath::unlink_at(to_dir, newname, false)?;
                }
                beneath::rename_at(src_dir, src_name, to_dir, newname, libc::RENAME_NOREPLACE)
            })()
        };
        if let Err(e) = placed {
            if !stub_here {
                let _ = beneath::remove_tree(work, &tmp);
            }
            return Err(failed("placing its stub", e));
        }
        let old_name_done = match (exchanged, stub_here, hide_old) {
            // The whiteout came to the old name.
            (true, true, true) => Ok(()),
            (true, true, false) => beneath::unlink_at(from_dir, name, false),
            (true, false, _) => beneath::unlink_at(work, &tmp, false),
            (false, _, _) => Ok(()),
        }
        .and_then(|_| {
            if hide_old && !(exchanged && stub_here) {
                owner.upper.whiteouts.link(work, from_dir, name)
            } else {
                Ok(())
            }
        });
        if let Err(e) = old_name_done {
            // The stub goes back where it was (or away), the whiteout at the new name is
            // not remade: the view stays at its old path.
            let back = match (stub_here, exchanged) {
                (true, true) => {
                    beneath::rename_at(to_dir, newname, from_dir, name, libc::RENAME_EXCHANGE)
                }
                (true, false) => {
                    beneath::rename_at(to_dir, newname, from_dir, name, libc::RENAME_NOREPLACE)
                }
                // The whiteout it took the place of is still in work/ (its unlink failed):
                // exchanged back, then the stub goes.
                (false, true) => {
                    beneath::rename_at(work, &tmp, to_dir, newname, libc::RENAME_EXCHANGE)
                        .and_then(|_| beneath::remove_tree(work, &tmp))
                }
                (false, false) => self.to_trash(&owner, to_dir, newname),
            };
            if let Err(b) = back {
                tracing::warn!("submodule {}: taking its stub back: {b}", sub.ident.name);
            }
            return Err(failed("hiding its old path", e));
        }
        // 3. Its record and git entry (a failure here is finished at the next lookup
        // through the stub), and 4. in memory, as one step for a view being made.
        let _moving = owner.nested.moving.lock();
        if let Err(e) = subs::move_view(
            &self.state,
            &self.mountpoint,
            &place,
            owner.ident.uid,
            &dir,
            record,
            &to,
        ) {
            tracing::warn!("submodule {}: {e:#}", sub.ident.name);
        }
        // 4. In memory.
        {
            let mut subs = owner.nested.views.lock();
            let old = of.path();
            if let Some(s) = subs.remove(&old) {
                subs.insert(new_rel.clone(), s);
            }
            *of.path.lock() = new_rel.clone();
        }
        self.nodes
            .write()
            .move_name(root, parent, name, newparent, newname, None);
        self.note_child(parent, name);
        self.note_child(newparent, newname);
        tracing::info!(
            "submodule {}: moved to {}",
            sub.ident.name,
            String::from_utf8_lossy(&new_rel)
        );
        Ok(())
    }
}
