//! Namespace changes that add a name or change an entry: create, mknod, mkdir, symlink,
//! link, setattr (and readlink).

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::git::{self};

use crate::layout::{whiteout_name, OPAQUE_MARKER};

use super::copyup::chown;
use super::error::{FsError, FsResult};
use super::handles::{opened, HandleKind};
use super::nodes::NodeKind;
use super::overlay::{Overlay, WtCtx};
use super::types::{Caller, Entry, FType, SetAttr};
use super::view::ttl_of;
use super::view::{check_name, cstr, marker, not_supported, View};

impl View {
    pub(super) fn dir_upper_path(&self, parent: u64) -> FsResult<(Arc<WtCtx>, PathBuf)> {
        let t = self.nodes.read();
        let (wt, _, _) = t.wt_of(parent)?;
        Ok((wt, t.upper_path(parent)?))
    }

    pub(super) fn new_entry(&self, parent: u64, name: &OsStr, ov: Overlay) -> FsResult<Entry> {
        let mut t = self.nodes.write();
        let (wt, _, _) = t.wt_of(parent)?;
        t.detach_name(parent, name);
        let ino = t.insert_entry(parent, name, wt, ov)?;
        self.counted_entry(t, ino)
    }

    /// Prepares `(parent, name)` for a new upper entry: the name must be free in the view
    /// and the parent directory present in the upper layer. Returns the parent's upper dir.
    pub(super) fn prepare_create(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<(Arc<WtCtx>, PathBuf)> {
        check_name(name)?;
        if self.child_state(parent, name)?.is_some() {
            return Err(FsError::exists(format!(
                "{} exists",
                name.to_string_lossy()
            )));
        }
        self.ensure_upper_dir(parent)?;
        self.dir_upper_path(parent)
    }

    /// Removes the whiteout of `name` in `parent` (upper directory `dir`), if there can be
    /// one: whiteouts are written only over base entries, so most creations have none to
    /// remove and skip the failing `unlink`.
    pub(super) fn drop_whiteout(&self, parent: u64, dir: &Path, name: &OsStr) {
        if self.base_has(parent, name).unwrap_or(true) {
            let _ = fs::remove_file(dir.join(whiteout_name(name)));
        }
    }

    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Entry, u64)> {
        let _m = self.mutate.lock();
        let (wt, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(flags & (libc::O_APPEND | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC))
            .mode(mode & !umask & 0o7777)
            .open(&path)
            .map_err(|e| FsError::io(format!("create {}", path.display()), e))?;
        chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        let entry = self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::File,
                base: None,
                in_upper: true,
            },
        )?;
        let fh = self.file_handle(entry.attr.ino, Some(wt), Some(file), None);
        Ok((entry, fh))
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a file beside worktrees"));
        }
        let _m = self.mutate.lock();
        let (_, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let c = cstr(&path)?;
        // SAFETY: c is a valid NUL-terminated path.
        let rc = unsafe {
            libc::mknod(
                c.as_ptr(),
                (mode & !umask) as libc::mode_t,
                rdev as libc::dev_t,
            )
        };
        if rc != 0 {
            return Err(FsError::io(
                format!("mknod {}", path.display()),
                io::Error::last_os_error(),
            ));
        }
        chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::from_mode(mode),
                base: None,
                in_upper: true,
            },
        )
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        let parent_kind = self.nodes.read().kind(parent).cloned();
        match parent_kind {
            Some(NodeKind::Repo(repo_id)) => return self.mkdir_worktree(parent, repo_id, name, caller),
            Some(NodeKind::Wt { .. }) => {}
            Some(NodeKind::Root) => {
                return Err(FsError::not_permitted(format!(
                        "cannot mkdir {:?} at the top of the mount: repositories are added with `worktreefs repo add PATH`",
                        name
                    ),
                ))
            }
            _ => return Err(not_supported("mkdir here")),
        }
        let _m = self.mutate.lock();
        let base_had_name = self.base_has(parent, name)?;
        let (wt, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let perm = mode & !umask & 0o7777;
        if base_had_name {
            // The base has (had) this name and it was removed: the new directory must hide
            // the base's content, so it is built opaque and renamed into place.
            let tmp = Self::work_tmp(&wt, "mkdir");
            fs::create_dir(&tmp).map_err(|e| FsError::io("mkdir in work dir", e))?;
            marker(&tmp.join(OPAQUE_MARKER), true)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(perm))
                .map_err(|e| FsError::io("chmod", e))?;
            chown(&tmp, caller.uid, caller.gid)?;
            fs::rename(&tmp, &path)
                .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
        } else {
            fs::create_dir(&path)
                .map_err(|e| FsError::io(format!("mkdir {}", path.display()), e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(perm))
                .map_err(|e| FsError::io("chmod", e))?;
            chown(&path, caller.uid, caller.gid)?;
        }
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::Dir,
                base: None,
                in_upper: true,
            },
        )
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a symlink beside worktrees"));
        }
        let _m = self.mutate.lock();
        let (_, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        std::os::unix::fs::symlink(target, &path)
            .map_err(|e| FsError::io(format!("symlink {}", path.display()), e))?;
        chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::Symlink,
                base: None,
                in_upper: true,
            },
        )
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let t = self.nodes.read();
        let (wt, ov, _) = t.wt_of(ino)?;
        if ov.ftype != FType::Symlink {
            return Err(FsError::invalid("not a symlink"));
        }
        if ov.in_upper {
            let path = t.upper_path(ino)?;
            return fs::read_link(&path)
                .map(|p| p.into_os_string().into_vec())
                .map_err(|e| FsError::io(format!("readlink {}", path.display()), e));
        }
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("symlink without object"))?;
        drop(t);
        git::read_blob(&wt.gitdir, base.oid).map_err(|e| FsError::git("reading symlink", e))
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> FsResult<Entry> {
        self.nodes.read().same_domain(ino, newparent, "link")?;
        let _m = self.mutate.lock();
        let (_, ov, _) = {
            let t = self.nodes.read();
            t.wt_of(ino)?
        };
        if ov.ftype == FType::Dir {
            return Err(FsError::not_permitted(
                "hard links to directories are not allowed",
            ));
        }
        let (_, dir) = self.prepare_create(newparent, newname)?;
        self.copy_up(ino, true)?;
        let src = self.nodes.read().upper_path(ino)?;
        let dst = dir.join(newname);
        fs::hard_link(&src, &dst).map_err(|e| FsError::io(format!("link {}", dst.display()), e))?;
        self.drop_whiteout(newparent, &dir, newname);
        self.note_child(newparent, newname);
        self.note_node(ino);
        let mut t = self.nodes.write();
        t.detach_name(newparent, newname);
        if t.contains(ino) {
            t.add_alias(ino, newparent, newname);
        }
        t.count_lookup(ino);
        self.counted_entry(t, ino)
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> FsResult<Entry> {
        let _m = self.mutate.lock();
        {
            let t = self.nodes.read();
            match t.kind(ino) {
                Some(NodeKind::Wt { .. }) => {}
                Some(NodeKind::GitFile(_)) => {
                    return Err(FsError::not_permitted(
                        "the worktree's .git file is managed by worktreefs",
                    ))
                }
                _ => return Err(not_supported("changing attributes here")),
            }
        }
        let truncating_to_zero = set.size == Some(0);
        self.copy_up(ino, !truncating_to_zero)?;
        let path = self.nodes.read().upper_path(ino)?;
        if let Some(mode) = set.mode {
            let c = cstr(&path)?;
            // SAFETY: valid path; fchmodat without AT_SYMLINK_NOFOLLOW as Linux requires.
            if unsafe { libc::chmod(c.as_ptr(), (mode & 0o7777) as libc::mode_t) } != 0 {
                return Err(FsError::io(
                    format!("chmod {}", path.display()),
                    io::Error::last_os_error(),
                ));
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            nix::unistd::fchownat(
                None,
                &path,
                set.uid.map(nix::unistd::Uid::from_raw),
                set.gid.map(nix::unistd::Gid::from_raw),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| FsError::sys(format!("chown {}", path.display()), e))?;
        }
        if let Some(size) = set.size {
            let via_handle = set.fh.and_then(|fh| self.handle(fh).ok());
            match via_handle.as_deref() {
                Some(HandleKind::File { file, on_base, .. })
                    if !on_base.load(Ordering::Acquire) =>
                {
                    opened(file)?
                        .set_len(size)
                        .map_err(|e| FsError::io("ftruncate", e))?
                }
                _ => OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .and_then(|f| f.set_len(size))
                    .map_err(|e| FsError::io(format!("truncate {}", path.display()), e))?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let spec = |t: Option<Option<SystemTime>>| match t {
                None => nix::sys::time::TimeSpec::new(0, libc::UTIME_OMIT),
                Some(None) => nix::sys::time::TimeSpec::new(0, libc::UTIME_NOW),
                Some(Some(t)) => {
                    nix::sys::time::TimeSpec::from(t.duration_since(UNIX_EPOCH).unwrap_or_default())
                }
            };
            nix::sys::stat::utimensat(
                None,
                &path,
                &spec(set.atime),
                &spec(set.mtime),
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .map_err(|e| FsError::sys(format!("utimens {}", path.display()), e))?;
        }
        // Recorded after the change, so a query cannot slip in between and miss it.
        self.note_node(ino);
        let t = self.nodes.read();
        Ok(Entry {
            attr: self.node_attr(&t, ino)?,
            ttl: ttl_of(&t, ino),
        })
    }
}
