//! Copy-up: bringing a base entry into the upper layer before it changes, atomically
//! (built in the work directory, then renamed into place).

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use crate::beneath;
use crate::git::{MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::layout::OPAQUE_MARKER;

use super::base_layer::Converted;
use super::error::{FsError, FsResult};
use super::inodes::{join_rel, ROOT_INO};
use super::keep::keep_path;
use super::overlay::BaseRef;
use super::types::{systime, FType};
use super::view::{marker, View};
use super::worktree::WtCtx;
use crate::ino::Ino;

impl View {
    /// Makes sure the directory `ino` exists in the upper layer (parents first).
    pub(super) fn ensure_upper_dir(&self, ino: Ino) -> FsResult<()> {
        let mut chain = Vec::new();
        {
            let t = self.nodes.read();
            let mut cur = ino;
            loop {
                let (_, ov, is_root) = t.wt_of(cur)?;
                if ov.in_upper {
                    break;
                }
                if ov.ftype != FType::Dir {
                    return Err(FsError::not_dir());
                }
                chain.push(cur);
                if is_root {
                    break;
                }
                cur = t.get(cur).map(|n| n.parent()).unwrap_or(ROOT_INO);
            }
        }
        for dir in chain.into_iter().rev() {
            self.copy_up(dir, true)?;
        }
        Ok(())
    }

    /// Node `ino` is in the upper layer now, as the file with inode number `upper_ino`
    /// (`base`: its base changes too).
    pub(super) fn set_in_upper(&self, ino: Ino, base: Option<Option<BaseRef>>, upper_ino: u64) {
        let mut t = self.nodes.write();
        if let Some(ov) = t.overlay_mut(ino) {
            ov.in_upper = true;
            ov.upper_ino = upper_ino;
            if let Some(b) = base {
                ov.base = b;
            }
        }
        drop(t);
        self.handles.copied_up();
    }

    /// A fresh name in the worktree's work directory, for something built there before
    /// it is renamed into place.
    pub(super) fn work_tmp(what: &str) -> OsString {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        OsString::from(format!(
            "{what}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Copies the entry `ino` into the upper layer (callers hold `mutate`). With
    /// `with_data` false a regular file arrives empty (it is about to be truncated).
    /// Atomic: built in the work directory, fsync'd, renamed into place. An entry whose
    /// last name is gone (a removed base file still open) is built the same way and kept
    /// open instead, with no name.
    pub(super) fn copy_up(&self, ino: Ino, with_data: bool) -> FsResult<()> {
        let (wt, ov, parent, name, unlinked, path) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(ino)?;
            if ov.in_upper {
                return Ok(());
            }
            let n = t.get(ino).ok_or_else(|| FsError::stale(ino))?;
            // The path says which conversion a checkout applies (a base entry is where
            // its base has it: a directory that moves is copied up first).
            let path = match (wt.base.converts(), ov.ftype) {
                (true, FType::File) => Some(t.rel_path(ino)?),
                _ => None,
            };
            (
                wt,
                ov,
                n.parent(),
                n.name().to_os_string(),
                n.is_unlinked(),
                path,
            )
        };
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("copy-up of an entry with no base"))?;
        let tmp = Self::work_tmp("copyup");
        let work = wt.upper.work_fd.as_fd();
        let converted =
            path.and_then(|p| wt.base.conversion(&p, base.oid, wt.ident.uid, wt.ident.gid));
        let built = self.build_in_work(&wt, ov.ftype, base, &tmp, with_data, converted);
        let upper_ino = match built {
            Ok(ino) => ino,
            Err(e) => {
                let _ = beneath::remove_tree(work, &tmp);
                return Err(e);
            }
        };
        if unlinked {
            let fd = beneath::entry(work, &tmp).map_err(|e| FsError::io("keeping a copy-up", e));
            let _ = beneath::remove_tree(work, &tmp);
            self.nodes.write().set_orphan(ino, fd?);
        } else {
            self.ensure_upper_dir(parent)?;
            let dir = self.upper_dir(parent)?;
            if wt.keeping().is_some() {
                let rel = self.nodes.read().child_rel_path(parent, &name)?;
                keep_path(&wt, &rel)?;
            }
            let renamed = keeping_times(dir.as_fd(), || {
                beneath::rename_at(work, &tmp, dir.as_fd(), &name, 0)
            });
            if let Err(e) = renamed {
                let _ = beneath::remove_tree(work, &tmp);
                // A directory made by an earlier copy-up that did not finish (a crash)
                // stays: it is what the entry is.
                let existing = beneath::stat_at(dir.as_fd(), &name);
                match existing {
                    Ok(st)
                        if ov.ftype == FType::Dir && FType::from_mode(st.st_mode) == FType::Dir =>
                    {
                        self.stats.copy_ups.fetch_add(1, Ordering::Relaxed);
                        self.set_in_upper(ino, None, st.st_ino);
                        return Ok(());
                    }
                    _ => {
                        return Err(FsError::io(
                            format!("copy-up of {}/{}", wt.ident.name, name.to_string_lossy()),
                            e,
                        ))
                    }
                }
            }
        }
        self.stats.copy_ups.fetch_add(1, Ordering::Relaxed);
        self.set_in_upper(ino, None, upper_ino);
        Ok(())
    }

    /// Builds the base entry `base` (of type `ftype`) as `tmp` in the work directory, owned
    /// by the worktree's owner; returns its inode number.
    fn build_in_work(
        &self,
        wt: &WtCtx,
        ftype: FType,
        base: BaseRef,
        tmp: &OsStr,
        with_data: bool,
        converted: Option<Converted>,
    ) -> FsResult<u64> {
        let work = wt.upper.work_fd.as_fd();
        match ftype {
            FType::Dir => {
                // An inherited directory keeps its mode (a 0700 one stays private), and
                // every directory the time the view showed for it.
                let perm = wt.base.inherited(&base).map_or(0o755, |d| d.perm);
                beneath::mkdir_at(work, tmp, 0o700)
                    .map_err(|e| FsError::io("mkdir in work dir", e))?;
                let ino = own_dir(work, tmp, wt.ident.uid, wt.ident.gid, perm)?;
                let t = timespec_of(self.base_dir_time(wt, &base));
                let _ = beneath::entry(work, tmp).and_then(|d| beneath::set_times(d.as_fd(), t, t));
                Ok(ino)
            }
            FType::File => self.copy_blob_to(wt, base, work, tmp, with_data, converted.as_ref()),
            FType::Symlink => {
                let target = wt.base.link_target(&base)?;
                beneath::symlink_at(&target, work, tmp)
                    .map_err(|e| FsError::io("creating symlink in work dir", e))?;
                own(work, tmp, wt.ident.uid, wt.ident.gid)
            }
            _ => Err(FsError::internal("unexpected base entry type")),
        }
    }

    /// The time the view shows for the base directory `base` (as `base_attr` does).
    fn base_dir_time(&self, wt: &WtCtx, base: &BaseRef) -> std::time::SystemTime {
        wt.base
            .inherited(base)
            .map_or(wt.base.mtime, |d| systime(d.mtime.0, d.mtime.1 as i64))
    }

    /// Writes the blob `base` (as a checkout converts it, with `converted`) as the new file
    /// `name` of `dir`, with the base's mode and time and the worktree's owner; returns
    /// its inode number.
    pub(super) fn copy_blob_to(
        &self,
        wt: &WtCtx,
        base: BaseRef,
        dir: BorrowedFd,
        name: &OsStr,
        with_data: bool,
        converted: Option<&Converted>,
    ) -> FsResult<u64> {
        let dst = File::from(
            beneath::open(
                dir,
                name.as_bytes(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
            .map_err(|e| FsError::io(format!("creating {}", name.to_string_lossy()), e))?,
        );
        if with_data {
            let src = match converted {
                Some(c) => self.open_converted(wt, c, base.oid)?,
                None => {
                    let size = wt.base.size(&self.objects, &base)?;
                    self.blobs
                        .open(&wt.base.gitdir, base.oid, size)
                        .map_err(|e| FsError::io(format!("materializing blob {}", base.oid), e))?
                }
            };
            crate::filecopy::clone_or_copy(&src, &dst)
                .map_err(|e| FsError::io("copying blob", e))?;
        }
        // Owner first: a chown clears set-id bits, and the mode is the last word.
        let _ = nix::unistd::fchown(
            dst.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(wt.ident.uid)),
            Some(nix::unistd::Gid::from_raw(wt.ident.gid)),
        );
        // An inherited file keeps its mode and time (a build compares times).
        let warm = wt.base.inherited(&base);
        let perm = match warm {
            Some(f) => f.perm & 0o7777,
            None if base.mode == MODE_EXEC => 0o755,
            None => 0o644,
        };
        dst.set_permissions(fs::Permissions::from_mode(perm))
            .map_err(|e| FsError::io("chmod", e))?;
        let t = match warm {
            Some(f) => nix::sys::time::TimeSpec::new(f.mtime.0, f.mtime.1 as i64),
            None => nix::sys::time::TimeSpec::from(
                wt.base.mtime.duration_since(UNIX_EPOCH).unwrap_or_default(),
            ),
        };
        let _ = nix::sys::stat::futimens(dst.as_raw_fd(), &t, &t);
        dst.sync_all().map_err(|e| FsError::io("fsync", e))?;
        let st = beneath::fstat(dst.as_fd()).map_err(|e| FsError::io("fstat", e))?;
        Ok(st.st_ino)
    }

    /// Copies every base entry below directory `ino` into the upper layer and marks it
    /// opaque, so the directory can move without its base (used by rename of directories).
    pub(super) fn copy_up_tree(&self, ino: Ino) -> FsResult<()> {
        let (wt, ov, rel) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(ino)?;
            let rel = if wt.base.converts() || wt.nested.shown || wt.keeping().is_some() {
                t.rel_path(ino)?
            } else {
                Vec::new()
            };
            (wt, ov, rel)
        };
        self.ensure_upper_dir(ino)?;
        if ov.base.is_none() {
            return Ok(());
        }
        let dir = self.upper_dir(ino)?;
        self.copy_up_tree_at(&wt, dir.as_fd(), ov.base, &rel)?;
        // Every node below now lives entirely in the upper layer, each as the file now at
        // its name.
        // A node whose name is gone (a removed base file still open) keeps reading its
        // base; one whose file cannot be found is left as it is (its next use says why).
        // Nodes of a submodule's view below are that view's, in its own layers: not
        // touched (its stub moves with the directory).
        let below: Vec<Ino> = {
            let t = self.nodes.read();
            t.below(ino)
                .into_iter()
                .filter(|n| t.get(*n).is_some_and(|node| !node.is_unlinked()))
                .filter(|n| {
                    t.wt_of(*n)
                        .is_ok_and(|(w, _, _)| std::sync::Arc::ptr_eq(&w, &wt))
                })
                .collect()
        };
        let mut found = Vec::with_capacity(below.len() + 1);
        for n in below {
            match self.place(n).and_then(|p| {
                p.stat()
                    .map_err(|e| FsError::io(format!("stat of inode {n}"), e))
            }) {
                Ok(st) => found.push((n, Some(st.st_ino))),
                Err(e) => tracing::warn!("after copying up a tree: {}", e.message),
            }
        }
        found.push((ino, None));
        let mut t = self.nodes.write();
        for (n, upper_ino) in found {
            if let Some(ov) = t.overlay_mut(n) {
                ov.in_upper = true;
                if let Some(i) = upper_ino {
                    ov.upper_ino = i;
                }
                if ov.ftype == FType::Dir {
                    ov.base = None;
                }
            }
        }
        drop(t);
        self.handles.copied_up();
        Ok(())
    }

    /// As `copy_up_tree`, for the upper directory `dir` at path `rel` (known only in a
    /// worktree with converted files) over base tree `base`. The directory keeps its
    /// times, and each directory made below gets the time the view showed for it.
    pub(super) fn copy_up_tree_at(
        &self,
        wt: &WtCtx,
        dir: BorrowedFd,
        base: Option<BaseRef>,
        rel: &[u8],
    ) -> FsResult<()> {
        keeping_times(dir, || self.fill_tree_at(wt, dir, base, rel))
    }

    fn fill_tree_at(
        &self,
        wt: &WtCtx,
        dir: BorrowedFd,
        base: Option<BaseRef>,
        rel: &[u8],
    ) -> FsResult<()> {
        let Some(base) = base.filter(|b| b.mode == MODE_TREE) else {
            return Ok(());
        };
        if beneath::stat_at(dir, OsStr::new(OPAQUE_MARKER)).is_ok() {
            return Ok(());
        }
        let listing = wt.base.listing(&self.objects, base)?;
        let sub = |name: &OsStr| {
            beneath::dir(dir, name.as_bytes())
                .map_err(|e| FsError::io(format!("opening {}", name.to_string_lossy()), e))
        };
        for e in &listing.entries {
            if crate::layout::is_reserved(&e.name) {
                // Hidden in the view (as a lookup hides it): never brought up.
                continue;
            }
            let child_base = BaseRef::of(e);
            let keep = || keep_path(wt, &join_rel(rel, e.name.as_bytes()));
            match beneath::stat_at(dir, &e.name) {
                Ok(st) if wt.upper.whiteouts.is(&st) => continue,
                Ok(st) => {
                    if FType::from_mode(st.st_mode) == FType::Dir && e.mode == MODE_TREE {
                        let d = sub(&e.name)?;
                        // A submodule view's stub over a base directory: the view's.
                        if crate::layout::read_stub(d.as_fd()).is_none() {
                            let rel = join_rel(rel, e.name.as_bytes());
                            self.copy_up_tree_at(wt, d.as_fd(), Some(child_base), &rel)?;
                        }
                    }
                    continue;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(FsError::io(
                        format!("stat {}", e.name.to_string_lossy()),
                        err,
                    ))
                }
            }
            keep()?;
            match e.mode {
                MODE_TREE | MODE_GITLINK => {
                    // Made writable for what goes in it, given its mode last.
                    let perm = wt.base.inherited(&child_base).map_or(0o755, |d| d.perm);
                    beneath::mkdir_at(dir, &e.name, 0o700).map_err(|err| {
                        FsError::io(format!("mkdir {}", e.name.to_string_lossy()), err)
                    })?;
                    let rel = join_rel(rel, e.name.as_bytes());
                    if e.mode == MODE_GITLINK && wt.nested.shown {
                        // Where submodules are views: a stub stands for the gitlink (see
                        // `layout::SUBMODULE_MARKER`), so its view moves with the tree.
                        let d = sub(&e.name)?;
                        write_stub(d.as_fd(), &rel, e.oid)?;
                    }
                    let made = sub(&e.name)?;
                    self.copy_up_tree_at(wt, made.as_fd(), Some(child_base), &rel)?;
                    own_dir(dir, &e.name, wt.ident.uid, wt.ident.gid, perm)?;
                    let t = timespec_of(self.base_dir_time(wt, &child_base));
                    let _ = beneath::set_times(made.as_fd(), t, t);
                }
                MODE_LINK => {
                    let target = wt.base.link_target(&child_base)?;
                    beneath::symlink_at(&target, dir, &e.name)
                        .map_err(|err| FsError::io("symlink", err))?;
                    own(dir, &e.name, wt.ident.uid, wt.ident.gid)?;
                }
                _ => {
                    let tmp = Self::work_tmp("copyup");
                    let work = wt.upper.work_fd.as_fd();
                    let converted = wt
                        .base
                        .converts()
                        .then(|| {
                            let rel = join_rel(rel, e.name.as_bytes());
                            wt.base.conversion(&rel, e.oid, wt.ident.uid, wt.ident.gid)
                        })
                        .flatten();
                    self.copy_blob_to(wt, child_base, work, &tmp, true, converted.as_ref())?;
                    beneath::rename_at(work, &tmp, dir, &e.name, 0)
                        .map_err(|err| FsError::io("rename", err))?;
                }
            }
        }
        keep_path(wt, &join_rel(rel, OPAQUE_MARKER.as_bytes()))?;
        marker(dir, OsStr::new(OPAQUE_MARKER), true)
    }
}

/// Writes the stub of a submodule's view (see `layout::SUBMODULE_MARKER`) in the
/// directory `dir`: made at `origin`, gitlink `commit`. Synced: a stub that lost its
/// marker in a crash would show the view's place as an empty directory.
pub(super) fn write_stub(dir: BorrowedFd, origin: &[u8], commit: git2::Oid) -> FsResult<()> {
    let f = beneath::open(
        dir,
        crate::layout::SUBMODULE_MARKER.as_bytes(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    )
    .map_err(|e| FsError::io("writing a submodule view's stub", e))?;
    let mut f = std::fs::File::from(f);
    io::Write::write_all(
        &mut f,
        &crate::layout::submodules::stub_text(origin, commit),
    )
    .and_then(|_| f.sync_all())
    .map_err(|e| FsError::io("writing a submodule view's stub", e))
}

/// Runs `change`, which adds entries to the upper directory `dir`, then puts the
/// directory's access and modification times back: a copy-up is no change of the
/// directory to the view (on ext4 a change to a file leaves its directory's times alone;
/// overlayfs does the same). Callers hold `mutate`, so no other change of the directory
/// comes in between.
fn keeping_times<R>(dir: BorrowedFd, change: impl FnOnce() -> R) -> R {
    let before = beneath::fstat(dir).ok();
    let r = change();
    if let Some(st) = before {
        let at = |sec, nsec| libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        };
        if let Err(e) = beneath::set_times(
            dir,
            at(st.st_atime, st.st_atime_nsec),
            at(st.st_mtime, st.st_mtime_nsec),
        ) {
            tracing::warn!("a directory's times could not be put back after a copy-up: {e}");
        }
    }
    r
}

/// `t` as the kernel takes a time.
fn timespec_of(t: std::time::SystemTime) -> libc::timespec {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// As `own`, for a directory copied up from the base, given mode `perm` as the base showed
/// it (0755, or an inherited directory's own; `mkdir` took the daemon's umask off).
fn own_dir(dir: BorrowedFd, name: &OsStr, uid: u32, gid: u32, perm: u32) -> FsResult<u64> {
    let ino = own(dir, name, uid, gid)?;
    // By name: the directory was just made here, in the work directory no one else
    // writes, and is no symlink.
    beneath::chmod_at(dir, name, perm).map_err(|e| FsError::io("chmod", e))?;
    Ok(ino)
}

/// Gives the entry `name` of `dir` (not following a symlink) to `uid:gid`; EPERM (a
/// daemon that may not chown) leaves the owner as it is. Returns its inode number.
pub(super) fn own(dir: BorrowedFd, name: &OsStr, uid: u32, gid: u32) -> FsResult<u64> {
    let fd = beneath::entry(dir, name)
        .map_err(|e| FsError::io(format!("opening {}", name.to_string_lossy()), e))?;
    match beneath::chown(fd.as_fd(), Some(uid), Some(gid)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        Err(e) => return Err(FsError::io(format!("chown {}", name.to_string_lossy()), e)),
    }
    beneath::fstat(fd.as_fd())
        .map(|st| st.st_ino)
        .map_err(|e| FsError::io("fstat", e))
}
