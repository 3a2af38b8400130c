//! What an epoch keeps before a change, the first time each thing changes in it: a
//! name (absent, a directory's attributes, or its inode linked into `saved/`), an
//! inode's attributes, a regular file's data (copied into `content/`). The records say
//! so (`record.rs`); `mod.rs` takes the epochs and hands the callers' keeps to the one
//! under way.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::beneath;

use super::meta::{is_dir, Meta};
use super::record::{Record, Was};
use super::{entry_at, ino_name, join, other, split, Epoch};

impl Epoch {
    pub(super) fn note(&mut self, r: &Record) {
        match r {
            Record::Name { path, .. } => {
                self.names.insert(path.clone());
            }
            Record::Attrs { ino, .. } => {
                self.attrs.insert(*ino);
            }
            Record::Content { ino, .. } => {
                self.contents.insert(*ino);
                self.attrs.insert(*ino);
            }
        }
    }

    pub(super) fn has(&self, r: &Record) -> bool {
        match r {
            Record::Name { path, .. } => self.names.contains(path),
            Record::Attrs { ino, .. } => self.attrs.contains(ino),
            Record::Content { ino, .. } => self.contents.contains(ino),
        }
    }

    pub(super) fn append(&mut self, r: &Record) -> io::Result<()> {
        self.records.write_all(&r.encode())?;
        self.note(r);
        Ok(())
    }

    /// Keeps what the name `rel` holds, and its directory's attributes (a name made or
    /// removed in it changes its times).
    pub(super) fn keep_name(&mut self, upper: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        // The directory first even when the name is kept already (kept then as the
        // directory of another name's change, when its own directory was not).
        if !rel.is_empty() {
            self.keep_one(upper, split(rel).0)?;
        }
        self.keep_one(upper, rel)
    }

    /// Keeps what the name `rel` holds.
    fn keep_one(&mut self, upper: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        if self.names.contains(rel) {
            return Ok(());
        }
        let was = match entry_at(upper, rel)? {
            None => Was::Absent,
            Some(st) if is_dir(st.st_mode) => {
                let meta = if rel.is_empty() {
                    Meta::of_fd(upper)?
                } else {
                    let (dir, name) = split(rel);
                    Meta::of(beneath::dir(upper, dir)?.as_fd(), name)?
                };
                Was::Dir(meta)
            }
            Some(st) => {
                let (dir, name) = split(rel);
                let d = beneath::dir(upper, dir)?;
                let kept = ino_name(st.st_ino);
                match beneath::link_at(d.as_fd(), name, self.saved.as_fd(), &kept) {
                    Ok(()) => *self.held.lock().entry(st.st_ino).or_insert(0) += 1,
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        // Kept already under another of its names.
                        let there = beneath::stat_at(self.saved.as_fd(), &kept)?;
                        if there.st_ino != st.st_ino {
                            return Err(other(format!(
                                "checkpoint {}: saved/{} is not inode {}",
                                self.id, st.st_ino, st.st_ino
                            )));
                        }
                    }
                    Err(e) => return Err(e),
                }
                Was::Inode(st.st_ino)
            }
        };
        self.append(&Record::Name {
            path: rel.to_vec(),
            was,
        })
    }

    /// Links the inode `fd` into `saved/` (if it is not there yet), so that whatever
    /// becomes of its names, a rewind reaches it to put its data and attributes back. A
    /// file with no name left (removed while open) cannot be linked and needs not be: it
    /// is in no state a rewind puts back, or its removal kept it already.
    fn link_inode(&self, fd: BorrowedFd, ino: u64) -> io::Result<()> {
        match beneath::link_fd(fd, self.saved.as_fd(), &ino_name(ino)) {
            Ok(()) => {
                *self.held.lock().entry(ino).or_insert(0) += 1;
                Ok(())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOENT)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Keeps `rel` and, a directory, everything below it (a walk with a stack of its
    /// own: a tree as deep as a user makes it costs no thread's stack).
    pub(super) fn keep_tree(&mut self, upper: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        let mut stack = vec![rel.to_vec()];
        while let Some(rel) = stack.pop() {
            self.keep_name(upper, &rel)?;
            let Some(st) = entry_at(upper, &rel)? else {
                continue;
            };
            if !is_dir(st.st_mode) {
                continue;
            }
            let d = beneath::dir(upper, &rel)?;
            for e in beneath::list(d.as_fd())? {
                stack.push(join(&rel, e.name.as_bytes()));
            }
        }
        Ok(())
    }

    pub(super) fn keep_moved(
        &mut self,
        upper: BorrowedFd,
        from: &[u8],
        to: &[u8],
    ) -> io::Result<()> {
        self.keep_tree(upper, from)?;
        self.keep_tree(upper, to)?;
        let Some(st) = entry_at(upper, from)? else {
            return Ok(());
        };
        if is_dir(st.st_mode) {
            self.keep_arriving(upper, from, to)?;
        }
        Ok(())
    }

    /// Keeps each path below `to` that the entries below `from` will take.
    fn keep_arriving(&mut self, upper: BorrowedFd, from: &[u8], to: &[u8]) -> io::Result<()> {
        let mut stack = vec![(from.to_vec(), to.to_vec())];
        while let Some((from, to)) = stack.pop() {
            let d = beneath::dir(upper, &from)?;
            for e in beneath::list(d.as_fd())? {
                let (f, t) = (join(&from, e.name.as_bytes()), join(&to, e.name.as_bytes()));
                self.keep_name(upper, &t)?;
                if e.is_dir(d.as_fd()) {
                    stack.push((f, t));
                }
            }
        }
        Ok(())
    }

    pub(super) fn keep_attrs(
        &mut self,
        upper: BorrowedFd,
        rel: Option<&[u8]>,
        fd: BorrowedFd,
    ) -> io::Result<()> {
        let st = beneath::fstat(fd)?;
        if is_dir(st.st_mode) {
            // A directory's attributes belong to its name (it has one name).
            return match rel {
                Some(rel) => self.keep_name(upper, rel),
                None => Ok(()),
            };
        }
        if self.attrs.contains(&st.st_ino) {
            return Ok(());
        }
        let meta = Meta::of_fd(fd)?;
        self.link_inode(fd, st.st_ino)?;
        self.append(&Record::Attrs {
            path: rel.unwrap_or_default().to_vec(),
            ino: st.st_ino,
            meta,
        })
    }

    /// Keeps a regular file's data; how many bytes were copied (None: nothing to do).
    pub(super) fn keep_content(
        &mut self,
        upper: BorrowedFd,
        rel: Option<&[u8]>,
        fd: BorrowedFd,
    ) -> io::Result<Option<u64>> {
        let st = beneath::fstat(fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            self.keep_attrs(upper, rel, fd)?;
            return Ok(None);
        }
        if self.contents.contains(&st.st_ino) {
            return Ok(None);
        }
        let meta = Meta::of_fd(fd)?;
        self.link_inode(fd, st.st_ino)?;
        let src = beneath::reopen(fd, libc::O_RDONLY)?;
        let name = ino_name(st.st_ino);
        let mut tmp = name.clone().into_vec();
        tmp.extend_from_slice(b".tmp");
        let tmp = OsString::from_vec(tmp);
        let _ = beneath::unlink_at(self.content.as_fd(), &tmp, false);
        let dst = File::from(beneath::open(
            self.content.as_fd(),
            tmp.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?);
        let bytes = crate::filecopy::clone_or_copy(&src, &dst)?;
        drop(dst);
        beneath::rename_at(self.content.as_fd(), &tmp, self.content.as_fd(), &name, 0)?;
        self.append(&Record::Content {
            path: rel.unwrap_or_default().to_vec(),
            ino: st.st_ino,
            meta,
        })?;
        Ok(Some(bytes))
    }
}
