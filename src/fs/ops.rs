//! Namespace changes that add a name or change an entry: create, mknod, mkdir, symlink,
//! link, setattr (and readlink).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::beneath;
use crate::layout::OPAQUE_MARKER;

use super::error::{ErrorKind, FsError, FsResult};
use super::handles::{opened, HandleKind};
use super::nodes::NodeKind;
use super::overlay::{Overlay, UpperDir};
use super::place::Place;
use super::ttl::ttl_of;
use super::types::Fh;
use super::types::{Attr, Caller, Entry, FType, SetAttr};
use super::view::{check_name, marker, not_supported, View};
use super::worktree::WtCtx;
use crate::ino::Ino;

/// The owner of a new entry made by `caller` in a directory with attributes `dir`, and
/// whether it gets the set-group-id bit: as ext4 gives them, the caller's uid, and the
/// directory's group (and, for a directory, its bit) when the directory is set-group-id.
fn new_owner(caller: Caller, dir: &beneath::Stat, is_dir: bool) -> (u32, u32, u32) {
    if dir.st_mode & libc::S_ISGID != 0 {
        let bit = if is_dir { libc::S_ISGID } else { 0 };
        (caller.uid, dir.st_gid, bit)
    } else {
        (caller.uid, caller.gid, 0)
    }
}

/// The mode of a new file (not a directory) asked for as `mode` by `caller` in the
/// directory `dir`: as the kernel's `mode_strip_sgid` gives it, without the set-group-id
/// bit (when group-executable) if the file takes a set-group-id directory's group and the
/// caller is neither root nor of that group. Linux 6.0 and later strip it before the
/// request arrives; this keeps older kernels right too. (Supplementary groups are not
/// known here: a caller of the group only through one loses the bit, the safe side.)
fn file_mode(caller: Caller, dir: &beneath::Stat, mode: u32) -> u32 {
    let mode = mode & 0o7777;
    let sgid_exec = libc::S_ISGID | libc::S_IXGRP;
    if dir.st_mode & libc::S_ISGID != 0
        && mode & sgid_exec == sgid_exec
        && caller.uid != 0
        && caller.gid != dir.st_gid
    {
        mode & !libc::S_ISGID
    } else {
        mode
    }
}

/// Sets the entry `name` of `dir` to owner `uid:gid` and then mode `perm` (a chown clears
/// the set-id bits, so the mode comes last); returns its inode number. The daemon's own
/// umask never applies: the mode is the one the caller asked for, the kernel's `umask`
/// taken off.
fn finish_new(
    dir: BorrowedFd,
    name: &OsStr,
    uid: u32,
    gid: u32,
    perm: Option<u32>,
) -> FsResult<u64> {
    let fd = beneath::entry(dir, name).map_err(io_err("opening the new entry", name))?;
    let ino = finish_fd(fd.as_fd(), uid, gid, None)?.st_ino;
    if let Some(perm) = perm {
        // By name: the entry was just made here, under `mutate` (no one else changes the
        // upper layer), and is no symlink (those get no mode).
        beneath::chmod_at(dir, name, perm).map_err(io_err("chmod of the new entry", name))?;
    }
    Ok(ino)
}

/// As `finish_new`, for the new entry `fd` (an `O_PATH` descriptor or an open file);
/// returns its attributes.
fn finish_fd(fd: BorrowedFd, uid: u32, gid: u32, perm: Option<u32>) -> FsResult<beneath::Stat> {
    match beneath::chown(fd, Some(uid), Some(gid)) {
        Ok(()) => {}
        // A daemon that may not chown leaves the owner as it is.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        Err(e) => return Err(FsError::io("chown of a new entry", e)),
    }
    if let Some(perm) = perm {
        beneath::chmod(fd, perm).map_err(|e| FsError::io("chmod of a new entry", e))?;
    }
    beneath::fstat(fd).map_err(|e| FsError::io("fstat of a new entry", e))
}

/// A directory made ready for a new entry (see `View::prepare_create`).
pub(super) struct Prepared {
    pub(super) wt: Arc<WtCtx>,
    /// The parent's upper directory, and its attributes (for the new entry's owner).
    pub(super) dir: OwnedFd,
    pub(super) dir_attr: beneath::Stat,
    /// A whiteout holds the name (a removed base entry's).
    over_whiteout: bool,
}

/// Where a new entry is being made (see `View::new_at`).
pub(super) struct NewAt<'a> {
    wt: &'a WtCtx,
    pub(super) dir: BorrowedFd<'a>,
    pub(super) name: std::borrow::Cow<'a, OsStr>,
    /// The name it goes to once built, when it is built in the work directory.
    target: Option<(BorrowedFd<'a>, &'a OsStr)>,
}

impl NewAt<'_> {
    /// Whether the entry is built at its name (not in the work directory, to be renamed).
    pub(super) fn in_place(&self) -> bool {
        self.target.is_none()
    }

    /// Puts the entry in place (over a whiteout), or removes what was built on failure.
    pub(super) fn finish(self, built: FsResult<u64>, is_dir: bool) -> FsResult<u64> {
        let Some((dir, name)) = self.target else {
            return built;
        };
        let placed = built.and_then(|ino| {
            self.wt
                .upper
                .whiteouts
                .install(self.dir, &self.name, dir, name, is_dir)
                .map_err(io_err("installing", name))
                .map(|_| ino)
        });
        if placed.is_err() {
            let _ = beneath::remove_tree(self.dir, &self.name);
        }
        placed
    }
}

fn io_err<'a>(what: &'a str, name: &'a OsStr) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |e| FsError::io(format!("{what} {}", name.to_string_lossy()), e)
}

impl View {
    pub(super) fn new_entry(&self, parent: Ino, name: &OsStr, ov: Overlay) -> FsResult<Entry> {
        let mut t = self.nodes.write();
        let (wt, _, _) = t.wt_of(parent)?;
        t.detach_name(parent, name);
        let ino = t.insert_entry(parent, name, wt, ov)?;
        self.counted_entry(t, ino)
    }

    /// As `new_entry`, for an upper entry whose attributes `st` were read after its last
    /// change (they are not read again).
    pub(super) fn new_entry_of(
        &self,
        parent: Ino,
        name: &OsStr,
        ov: Overlay,
        st: &beneath::Stat,
    ) -> FsResult<Entry> {
        let mut t = self.nodes.write();
        let (wt, _, _) = t.wt_of(parent)?;
        t.detach_name(parent, name);
        let ino = t.insert_entry(parent, name, wt, ov)?;
        Ok(Entry {
            attr: Attr::from_stat(ino, st),
            ttl: ttl_of(&t, ino),
        })
    }

    /// Prepares `(parent, name)` for a new upper entry: the name must be free in the view
    /// and the parent directory present in the upper layer. The parent's upper directory
    /// is opened and its entry at `name` looked at once, here, for everything the creation
    /// needs to know of them.
    pub(super) fn prepare_create(&self, parent: Ino, name: &OsStr) -> FsResult<Prepared> {
        check_name(name)?;
        let mut upper = UpperDir::default();
        let mut dir_attr = None;
        let in_upper = self
            .nodes
            .read()
            .wt_of(parent)
            .is_ok_and(|(_, ov, _)| ov.in_upper);
        if in_upper {
            let (dir, st) = self.upper_dir_stat(parent)?;
            upper.fd = Some(dir);
            dir_attr = Some(st);
        }
        if self.child_state_in(parent, name, &mut upper)?.is_some() {
            return Err(FsError::exists(format!(
                "{} exists",
                name.to_string_lossy()
            )));
        }
        let wt = self.nodes.read().wt_of(parent)?.0;
        // On what the disk holds, not on whether the base has the name: a directory moved
        // (made opaque) keeps the whiteouts it had, for names its base no longer shows.
        let (dir, dir_attr, over_whiteout) = match (upper.fd, dir_attr) {
            (Some(dir), Some(st)) => (dir, st, upper.whiteout_at_name),
            _ => {
                self.ensure_upper_dir(parent)?;
                let (dir, st) = self.upper_dir_stat(parent)?;
                let over = wt.upper.whiteouts.at(dir.as_fd(), name);
                (dir, st, over)
            }
        };
        // What the name holds now (nothing, or a whiteout) is kept for the checkpoints.
        self.keep_child(parent, name)?;
        Ok(Prepared {
            wt,
            dir,
            dir_attr,
            over_whiteout,
        })
    }

    /// Where the new entry `name` of a prepared directory is made: at the name itself,
    /// or, where a whiteout sits (over a removed base entry), built in the work directory
    /// and installed over it in one rename (`finish`).
    pub(super) fn new_at<'a>(&self, p: &'a Prepared, name: &'a OsStr) -> NewAt<'a> {
        if p.over_whiteout {
            NewAt {
                wt: &p.wt,
                dir: p.wt.upper.work_fd.as_fd(),
                name: Self::work_tmp("new").into(),
                target: Some((p.dir.as_fd(), name)),
            }
        } else {
            NewAt {
                wt: &p.wt,
                dir: p.dir.as_fd(),
                name: name.into(),
                target: None,
            }
        }
    }

    pub fn create(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Entry, Fh)> {
        let _m = self.lock_changes(parent);
        let p = self.prepare_create(parent, name)?;
        let extra = flags & (libc::O_APPEND | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC);
        let at = self.new_at(&p, name);
        let file = File::from(
            beneath::open(
                at.dir,
                at.name.as_bytes(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | extra,
                0o600,
            )
            .map_err(io_err("create", name))?,
        );
        let (uid, gid, _) = new_owner(caller, &p.dir_attr, false);
        let perm = file_mode(caller, &p.dir_attr, mode & !umask);
        let built = finish_fd(file.as_fd(), uid, gid, Some(perm));
        // The attributes just read are the file's as the reply gives them, unless a rename
        // over a whiteout changes its ctime after.
        let exact = built.as_ref().ok().filter(|_| at.in_place()).copied();
        let upper_ino = at.finish(built.map(|st| st.st_ino), false)?;
        self.note_child(parent, name);
        let ov = Overlay::upper(FType::File, upper_ino);
        let entry = match exact {
            Some(st) => self.new_entry_of(parent, name, ov, &st)?,
            None => self.new_entry(parent, name, ov)?,
        };
        let fh = self.file_handle(entry.attr.ino, Some(p.wt.clone()), Some(file), None);
        Ok((entry, fh))
    }

    /// An `O_TMPFILE` open in directory `parent`: a new file with no name in its upper
    /// directory, which its node keeps until a link names it or the kernel forgets it. As
    /// on ext4, `O_EXCL` makes a file no link can name.
    pub fn tmpfile(
        &self,
        parent: Ino,
        mode: u32,
        umask: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Entry, Fh)> {
        let wt = match self.nodes.read().wt_of(parent) {
            Ok((_, ov, _)) if ov.ftype != FType::Dir => return Err(FsError::not_dir()),
            Ok((wt, _, _)) => wt,
            Err(_) => return Err(not_supported("a file with no name outside a worktree")),
        };
        let _m = self.lock_changes_of(&wt);
        self.ensure_upper_dir(parent)?;
        let (dir, dir_attr) = self.upper_dir_stat(parent)?;
        let extra = flags
            & (libc::O_APPEND | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC | libc::O_EXCL);
        let file = File::from(
            beneath::tmpfile(dir.as_fd(), libc::O_RDWR | extra, 0o600)
                .map_err(|e| FsError::io("creating a file with no name", e))?,
        );
        let (uid, gid, _) = new_owner(caller, &dir_attr, false);
        let perm = file_mode(caller, &dir_attr, mode & !umask);
        let st = finish_fd(file.as_fd(), uid, gid, Some(perm))?;
        let kept = file
            .try_clone()
            .map_err(|e| FsError::io("keeping a file with no name", e))?;
        let kind = NodeKind::Wt {
            wt: wt.clone(),
            ov: Overlay::upper(FType::File, st.st_ino),
            is_root: false,
        };
        // The number is the table's to give: no path names this file.
        let natural = crate::ino::path_ino(
            wt.ident.ino_space,
            format!("\0tmpfile/{}", st.st_ino).as_bytes(),
        );
        let entry = {
            let mut t = self.nodes.write();
            let ino = t.insert_nameless(parent, natural, kind, kept.into());
            Entry {
                attr: Attr::from_stat(ino, &st),
                ttl: ttl_of(&t, ino),
            }
        };
        let fh = self.file_handle(entry.attr.ino, Some(wt), Some(file), None);
        Ok((entry, fh))
    }

    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a file beside worktrees"));
        }
        let _m = self.lock_changes(parent);
        let p = self.prepare_create(parent, name)?;
        let at = self.new_at(&p, name);
        beneath::mknod_at(at.dir, &at.name, (mode & libc::S_IFMT) | 0o600, rdev as u64)
            .map_err(io_err("mknod", name))?;
        let (uid, gid, _) = new_owner(caller, &p.dir_attr, false);
        let perm = file_mode(caller, &p.dir_attr, mode & !umask);
        let built = finish_new(at.dir, &at.name, uid, gid, Some(perm));
        let upper_ino = at.finish(built, false)?;
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay::upper(FType::from_mode(mode), upper_ino),
        )
    }

    pub fn mkdir(
        &self,
        parent: Ino,
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
        let _m = self.lock_changes(parent);
        let base_had_name = self.base_has(parent, name)?;
        let p = self.prepare_create(parent, name)?;
        let (uid, gid, sgid) = new_owner(caller, &p.dir_attr, true);
        let perm = (mode & !umask & 0o1777) | sgid;
        // Over a whiteout: built in the work directory and put in its place. Where the base
        // has (had) this name, the new directory must hide the base's content: opaque.
        if base_had_name {
            // The marker is a name made too (the path may have held a directory at a
            // checkpoint, without one).
            let rel = self.nodes.read().child_rel_path(parent, name)?;
            super::keep::keep_path(
                &p.wt,
                &super::inodes::join_rel(&rel, OPAQUE_MARKER.as_bytes()),
            )?;
        }
        let at = self.new_at(&p, name);
        beneath::mkdir_at(at.dir, &at.name, 0o700).map_err(io_err("mkdir", name))?;
        let opaque = || {
            if !base_had_name {
                return Ok(());
            }
            beneath::dir(at.dir, at.name.as_bytes())
                .map_err(io_err("mkdir", name))
                .and_then(|d| marker(d.as_fd(), OsStr::new(OPAQUE_MARKER), true))
        };
        let built = opaque().and_then(|_| finish_new(at.dir, &at.name, uid, gid, Some(perm)));
        let upper_ino = at.finish(built, true)?;
        self.note_child(parent, name);
        self.new_entry(parent, name, Overlay::upper(FType::Dir, upper_ino))
    }

    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a symlink beside worktrees"));
        }
        let _m = self.lock_changes(parent);
        let p = self.prepare_create(parent, name)?;
        let at = self.new_at(&p, name);
        beneath::symlink_at(target.as_os_str().as_bytes(), at.dir, &at.name)
            .map_err(io_err("symlink", name))?;
        let (uid, gid, _) = new_owner(caller, &p.dir_attr, false);
        let built = finish_new(at.dir, &at.name, uid, gid, None);
        let upper_ino = at.finish(built, false)?;
        self.note_child(parent, name);
        self.new_entry(parent, name, Overlay::upper(FType::Symlink, upper_ino))
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let (wt, ov, _) = self.nodes.read().wt_of(ino)?;
        if ov.ftype != FType::Symlink {
            return Err(FsError::invalid("not a symlink"));
        }
        if ov.in_upper {
            return self.at_place(ino, "readlink", |p| beneath::readlink(p.fd()?.as_fd()));
        }
        let base = ov
            .base
            .ok_or_else(|| FsError::internal("symlink without object"))?;
        wt.base.link_target(&base)
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> FsResult<Entry> {
        self.nodes.read().same_domain(ino, newparent, "link")?;
        self.prepare_content(ino);
        let _m = self.lock_changes(ino);
        let (_, ov, _) = {
            let t = self.nodes.read();
            t.wt_of(ino)?
        };
        if ov.ftype == FType::Dir {
            return Err(FsError::not_permitted(
                "hard links to directories are not allowed",
            ));
        }
        let p = self.prepare_create(newparent, newname)?;
        self.copy_up(ino, true)?;
        let from = self.place(ino)?;
        let at = self.new_at(&p, newname);
        let (linked, first_name) = match &from {
            Place::Named {
                dir: from_dir,
                name: from_name,
                ..
            } => {
                from.fd().map_err(|e| FsError::io("link", e))?;
                let linked = beneath::link_at(from_dir.as_fd(), from_name, at.dir, &at.name);
                (linked, false)
            }
            // A file with no name: an O_TMPFILE one gets its first; any other (removed
            // while open) cannot be linked, ENOENT as on ext4.
            Place::Orphan(fd) => (beneath::link_fd(fd.as_fd(), at.dir, &at.name), true),
            Place::Root(_) => return Err(FsError::not_found("the file to link was removed")),
        };
        let built = linked.map_err(io_err("link", newname)).map(|_| 0);
        at.finish(built, false)?;
        self.note_child(newparent, newname);
        self.note_node(ino);
        let mut t = self.nodes.write();
        t.detach_name(newparent, newname);
        if t.contains(ino) {
            if first_name {
                t.name_nameless(ino, newparent, newname);
            } else {
                t.add_alias(ino, newparent, newname);
            }
        }
        t.count_lookup(ino);
        self.counted_entry(t, ino)
    }

    pub fn setattr(&self, ino: Ino, set: SetAttr) -> FsResult<Entry> {
        if set.size != Some(0) {
            self.prepare_content(ino);
        }
        let _m = self.lock_changes(ino);
        {
            let t = self.nodes.read();
            match t.kind(ino) {
                Some(NodeKind::Wt { .. }) => {}
                // A submodule view's, truncated to be written anew (`git mv`): the write
                // says whether it names the same entry.
                Some(NodeKind::GitFile(wt))
                    if wt.is_submodule()
                        && set.size == Some(0)
                        && set.mode.is_none()
                        && set.uid.is_none()
                        && set.gid.is_none() =>
                {
                    drop(t);
                    let (attr, ttl) = self.settled_attr(ino)?;
                    return Ok(Entry { attr, ttl });
                }
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
        if set.size.is_some() {
            self.keep_node_content(ino)?;
        } else {
            self.keep_node_attrs(ino)?;
        }
        let place = self.place(ino)?;
        let fd = place
            .fd()
            .map_err(|e| FsError::io(format!("setattr of inode {ino}"), e))?;
        let is_link = beneath::fstat(fd.as_fd())
            .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
            .map_err(|e| FsError::io("fstat", e))?;
        if set.uid.is_some() || set.gid.is_some() {
            beneath::chown(fd.as_fd(), set.uid, set.gid).map_err(|e| FsError::io("chown", e))?;
        }
        if let Some(mode) = set.mode {
            if is_link {
                return Err(FsError::new(
                    ErrorKind::Os(libc::EOPNOTSUPP),
                    "a symlink has no mode of its own",
                ));
            }
            beneath::chmod(fd.as_fd(), mode & 0o7777).map_err(|e| FsError::io("chmod", e))?;
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
                _ => beneath::reopen(fd.as_fd(), libc::O_WRONLY)
                    .and_then(|f| f.set_len(size))
                    .map_err(|e| FsError::io(format!("truncate of inode {ino}"), e))?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let spec = |t: Option<Option<SystemTime>>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(None) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(Some(t)) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_nsec: d.subsec_nanos() as libc::c_long,
                    }
                }
            };
            let times = [spec(set.atime), spec(set.mtime)];
            let r = match place.named() {
                Some((dir, name)) if is_link => beneath::utimens_at(dir, name, &times),
                _ => beneath::utimens(fd.as_fd(), &times),
            };
            r.map_err(|e| FsError::io("utimens", e))?;
        }
        if (SetAttr { fh: None, ..set }) == SetAttr::default() {
            // chown(f, -1, -1): nothing changes but the change time, as on ext4.
            beneath::chown(fd.as_fd(), None, None).map_err(|e| FsError::io("chown", e))?;
        }
        // Recorded after the change, so a query cannot slip in between and miss it.
        self.note_node(ino);
        let (attr, ttl) = self.settled_attr(ino)?;
        Ok(Entry { attr, ttl })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(mode: u32, gid: u32) -> beneath::Stat {
        // SAFETY: stat is plain data.
        let mut st: beneath::Stat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFDIR | mode;
        st.st_gid = gid;
        st
    }

    /// Owners and modes of new entries, one row each, as ext4 gives them.
    #[test]
    fn new_entries_get_the_owner_and_mode_ext4_gives() {
        let user = Caller {
            uid: 1000,
            gid: 100,
        };
        let root = Caller { uid: 0, gid: 0 };
        let (plain, sgid) = (dir(0o755, 7), dir(0o2775, 7));
        // (caller, dir, is_dir) -> (uid, gid, bit passed on)
        assert_eq!(new_owner(user, &plain, false), (1000, 100, 0));
        assert_eq!(new_owner(user, &sgid, false), (1000, 7, 0));
        assert_eq!(new_owner(user, &sgid, true), (1000, 7, libc::S_ISGID));
        // (caller, dir, mode) -> mode
        let rows = [
            (user, &plain, 0o2755, 0o2755),
            (user, &sgid, 0o2755, 0o0755),
            (user, &sgid, 0o2745, 0o2745), // not group-executable: kept (mandatory locking)
            (Caller { uid: 1000, gid: 7 }, &sgid, 0o2755, 0o2755),
            (root, &sgid, 0o2755, 0o2755),
            (user, &sgid, 0o4755, 0o4755),
            (user, &plain, 0o106777, 0o6777),
        ];
        for (caller, d, mode, want) in rows {
            assert_eq!(file_mode(caller, d, mode), want, "{caller:?} {mode:o}");
        }
    }
}
