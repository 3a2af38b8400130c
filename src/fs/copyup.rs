//! Copy-up: bringing a base entry into the upper layer before it changes, atomically
//! (built in the work directory, then renamed into place).

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use crate::git::{self, MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::layout::{whiteout_name, OPAQUE_MARKER};

use super::error::{FsError, FsResult};
use super::nodes::ROOT_INO;
use super::overlay::{BaseRef, WtCtx};
use super::types::FType;
use super::view::{exists, lstat, marker, View};

/// FICLONE where the filesystem shares extents, else copy_file_range (std::io::copy uses it).
pub(super) fn clone_or_copy(src: &File, dst: &File) -> io::Result<()> {
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: both descriptors are open for the duration of the call.
    let rc = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    if rc == 0 {
        return Ok(());
    }
    let mut s = src;
    let mut d = dst;
    io::copy(&mut s, &mut d)?;
    Ok(())
}

impl View {
    /// Makes sure the directory `ino` exists in the upper layer (parents first).
    pub(super) fn ensure_upper_dir(&self, ino: u64) -> FsResult<()> {
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

    pub(super) fn set_in_upper(&self, ino: u64, base: Option<Option<BaseRef>>) {
        let mut t = self.nodes.write();
        if let Some(ov) = t.overlay_mut(ino) {
            ov.in_upper = true;
            if let Some(b) = base {
                ov.base = b;
            }
        }
        drop(t);
        self.handles.copied_up();
    }

    pub(super) fn work_tmp(wt: &WtCtx, what: &str) -> PathBuf {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        wt.work.join(format!(
            "{what}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Copies the entry `ino` into the upper layer (callers hold `mutate`). With
    /// `with_data` false a regular file arrives empty (it is about to be truncated).
    /// Atomic: built in the work directory, fsync'd, renamed into place.
    pub(super) fn copy_up(&self, ino: u64, with_data: bool) -> FsResult<()> {
        let (wt, ov, path) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(ino)?;
            if ov.in_upper {
                return Ok(());
            }
            (wt, ov, t.upper_path(ino)?)
        };
        let parent = self
            .nodes
            .read()
            .get(ino)
            .map(|n| n.parent())
            .unwrap_or(ROOT_INO);
        self.ensure_upper_dir(parent)?;
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("copy-up of an entry with no base"))?;
        match ov.ftype {
            FType::Dir => {
                match fs::create_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(FsError::io(format!("mkdir {}", path.display()), e)),
                }
                chown(&path, wt.uid, wt.gid)?;
            }
            FType::File => {
                let tmp = Self::work_tmp(&wt, "copyup");
                let result = self.copy_blob_to(&wt, base, &tmp, with_data);
                if let Err(e) = result {
                    let _ = fs::remove_file(&tmp);
                    return Err(e);
                }
                fs::rename(&tmp, &path)
                    .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
            }
            FType::Symlink => {
                let target = git::read_blob(&wt.gitdir, base.oid)
                    .map_err(|e| FsError::git("reading symlink target", e))?;
                let tmp = Self::work_tmp(&wt, "copyup");
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &tmp)
                    .map_err(|e| FsError::io("creating symlink in work dir", e))?;
                let _ = nix::unistd::fchownat(
                    None,
                    &tmp,
                    Some(nix::unistd::Uid::from_raw(wt.uid)),
                    Some(nix::unistd::Gid::from_raw(wt.gid)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                );
                fs::rename(&tmp, &path)
                    .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
            }
            _ => return Err(FsError::internal("unexpected base entry type")),
        }
        self.stats.copy_ups.fetch_add(1, Ordering::Relaxed);
        self.set_in_upper(ino, None);
        Ok(())
    }

    pub(super) fn copy_blob_to(
        &self,
        wt: &WtCtx,
        base: BaseRef,
        tmp: &Path,
        with_data: bool,
    ) -> FsResult<()> {
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| FsError::io(format!("creating {}", tmp.display()), e))?;
        if with_data {
            let size = self
                .objects
                .blob_size(&wt.gitdir, base.oid)
                .map_err(|e| FsError::git("blob size", e))?;
            let src_path = self
                .blobs
                .ensure(&wt.gitdir, base.oid, size)
                .map_err(|e| FsError::io(format!("materializing blob {}", base.oid), e))?;
            let src = File::open(&src_path).map_err(|e| FsError::io("opening cached blob", e))?;
            clone_or_copy(&src, &dst).map_err(|e| FsError::io("copying blob", e))?;
        }
        let perm = if base.mode == MODE_EXEC { 0o755 } else { 0o644 };
        dst.set_permissions(fs::Permissions::from_mode(perm))
            .map_err(|e| FsError::io("chmod", e))?;
        let _ = nix::unistd::fchown(
            dst.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(wt.uid)),
            Some(nix::unistd::Gid::from_raw(wt.gid)),
        );
        let t = nix::sys::time::TimeSpec::from(
            wt.base_mtime.duration_since(UNIX_EPOCH).unwrap_or_default(),
        );
        let _ = nix::sys::stat::futimens(dst.as_raw_fd(), &t, &t);
        dst.sync_all().map_err(|e| FsError::io("fsync", e))?;
        Ok(())
    }

    /// Copies every base entry below directory `ino` into the upper layer and marks it
    /// opaque, so the directory can move without its base (used by rename of directories).
    pub(super) fn copy_up_tree(&self, ino: u64) -> FsResult<()> {
        let (wt, ov, path) = {
            let t = self.nodes.read();
            let (wt, ov, _) = t.wt_of(ino)?;
            (wt, ov, t.upper_path(ino)?)
        };
        self.ensure_upper_dir(ino)?;
        if ov.base.is_none() {
            return Ok(());
        }
        self.copy_up_tree_at(&wt, &path, ov.base)?;
        // Every node below now lives entirely in the upper layer.
        let mut t = self.nodes.write();
        let below = t.below(ino);
        for n in below.into_iter().chain(std::iter::once(ino)) {
            if let Some(ov) = t.overlay_mut(n) {
                ov.in_upper = true;
                if ov.ftype == FType::Dir {
                    ov.base = None;
                }
            }
        }
        drop(t);
        self.handles.copied_up();
        Ok(())
    }

    pub(super) fn copy_up_tree_at(
        &self,
        wt: &WtCtx,
        dir: &Path,
        base: Option<BaseRef>,
    ) -> FsResult<()> {
        let Some(base) = base.filter(|b| b.mode == MODE_TREE) else {
            return Ok(());
        };
        if exists(&dir.join(OPAQUE_MARKER)) {
            return Ok(());
        }
        let listing = self
            .objects
            .tree(&wt.gitdir, base.oid)
            .map_err(|e| FsError::git("reading tree", e))?;
        for e in &listing.entries {
            let up = dir.join(&e.name);
            let child_base = BaseRef {
                oid: e.oid,
                mode: e.mode,
            };
            match lstat(&up) {
                Ok(m) => {
                    if m.is_dir() && e.mode == MODE_TREE {
                        self.copy_up_tree_at(wt, &up, Some(child_base))?;
                    }
                    continue;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(FsError::io(format!("stat {}", up.display()), err)),
            }
            if exists(&dir.join(whiteout_name(&e.name))) {
                continue;
            }
            match e.mode {
                MODE_TREE | MODE_GITLINK => {
                    fs::create_dir(&up)
                        .map_err(|err| FsError::io(format!("mkdir {}", up.display()), err))?;
                    chown(&up, wt.uid, wt.gid)?;
                    self.copy_up_tree_at(wt, &up, Some(child_base))?;
                }
                MODE_LINK => {
                    let target = git::read_blob(&wt.gitdir, e.oid)
                        .map_err(|err| FsError::git("reading symlink target", err))?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &up)
                        .map_err(|err| FsError::io("symlink", err))?;
                    chown(&up, wt.uid, wt.gid)?;
                }
                _ => {
                    let tmp = Self::work_tmp(wt, "copyup");
                    self.copy_blob_to(wt, child_base, &tmp, true)?;
                    fs::rename(&tmp, &up).map_err(|err| FsError::io("rename", err))?;
                }
            }
        }
        marker(&dir.join(OPAQUE_MARKER), true)
    }
}

/// Gives `path` to `uid:gid` without following a symlink; EPERM (a daemon that may not
/// chown) leaves the owner as it is.
pub(super) fn chown(path: &Path, uid: u32, gid: u32) -> FsResult<()> {
    match nix::unistd::fchownat(
        None,
        path,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(()) | Err(nix::errno::Errno::EPERM) => Ok(()),
        Err(e) => Err(FsError::sys(format!("chown {}", path.display()), e)),
    }
}
