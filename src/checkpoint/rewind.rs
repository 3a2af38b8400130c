//! Putting a worktree's upper layer back as it was at a checkpoint.
//!
//! A rewind to checkpoint N first takes a checkpoint R of the state it leaves (so it can
//! be undone), writes a marker saying it is under way, and then makes every path the
//! epochs N..R touched what their earliest record says (every other path is what it was
//! at N already). Each change it makes is kept in R like any other. Every step compares
//! what is there with what should be and does only what differs, so a rewind cut short
//! by a crash is finished by running it again (`continue_rewind` at the next start,
//! before the worktree is served): the upper layer ends as it was at N, never a mix.
//! The marker goes when the caller says the rewind is done (`end_rewind`: git's state of
//! the worktree is put back between the two).
//!
//! 1. Deepest first, an entry that is not what its path held is kept in R and removed
//!    (a directory with all below it: everything in it was made since).
//! 2. Shallowest first, what a path held and does not hold now is made: a directory, or
//!    the inode kept in `saved/` linked back (the same inode: a group of hard links comes
//!    back as the group).
//! 3. A file whose data was kept gets that data back: as a new file renamed over each of
//!    its names when all its names are known (an open file then reads what it read, as
//!    after a rename over it), else copied back into it.
//! 4. Attributes kept are put back on the inodes they were kept of, and last, deepest
//!    first, on the directories.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::beneath;

use super::meta::{is_dir, Meta};
use super::record::{show, Record, Was};
use super::{entry_at, ino_name, read_records, split, Checkpoints, Epoch, Info};
use super::{CONTENT, REWINDING, SAVED};

/// What a rewind did.
#[derive(Debug)]
pub struct Rewound {
    pub to: u64,
    /// The checkpoint it took first: the state it left, to rewind to again.
    pub before: Info,
    /// Paths whose entry it removed, made or replaced.
    pub names: Vec<Vec<u8>>,
    /// Paths of files whose data or attributes it put back.
    pub inodes: Vec<Vec<u8>>,
    /// Paths of directories whose attributes it put back.
    pub dirs: Vec<Vec<u8>>,
}

/// What `put_back` changed: the paths whose entry it removed, made or replaced, and
/// those of files whose data or attributes it put back.
struct PutBack {
    names: Vec<Vec<u8>>,
    inodes: Vec<Vec<u8>>,
    dirs: Vec<Vec<u8>>,
}

/// What the epochs from the checkpoint on say the upper layer was then.
#[derive(Default)]
struct Target {
    /// Each path touched: its earliest record, and the epoch it is in.
    names: BTreeMap<Vec<u8>, (u64, Was)>,
    /// Each file's data: its earliest copy (epoch, path then).
    content: HashMap<u64, (u64, Vec<u8>)>,
    /// Each inode's attributes (not a directory's): the earliest (epoch, path then).
    attrs: HashMap<u64, (u64, Vec<u8>, Meta)>,
}

fn depth(p: &[u8]) -> usize {
    if p.is_empty() {
        0
    } else {
        1 + p.iter().filter(|&&b| b == b'/').count()
    }
}

impl Checkpoints {
    /// Rewinds the upper layer `upper` to checkpoint `to` in one go (`begin_rewind`,
    /// `continue_rewind`, `end_rewind`, with nothing of the caller's between).
    pub fn rewind(
        &self,
        upper: BorrowedFd,
        to: u64,
        label: Option<String>,
        open_for_writing: &[(Option<Vec<u8>>, BorrowedFd)],
    ) -> io::Result<Rewound> {
        self.begin_rewind(upper, to, label, open_for_writing)?;
        let r = self.continue_rewind(upper)?.expect("begun");
        self.end_rewind()?;
        Ok(r)
    }

    /// Begins a rewind to checkpoint `to`: takes a checkpoint (`label`) of the state it
    /// leaves (`open_for_writing` as for `take`) and marks the rewind under way; from
    /// here on a crash is followed by `continue_rewind` at the next start.
    pub fn begin_rewind(
        &self,
        upper: BorrowedFd,
        to: u64,
        label: Option<String>,
        open_for_writing: &[(Option<Vec<u8>>, BorrowedFd)],
    ) -> io::Result<Info> {
        let mut state = self.state.lock();
        if !self.epoch_ids()?.contains(&to) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no checkpoint {to}"),
            ));
        }
        let before = self.take_locked(&mut state, label, upper, open_for_writing)?;
        crate::durable::write_file_synced(
            &self.path.join(REWINDING),
            format!("{to} {}\n", before.id).as_bytes(),
        )?;
        self.unfinished
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(before)
    }

    /// A rewind under way (begun, not ended): the checkpoint it goes to and the one it
    /// took first.
    pub fn pending_rewind(&self) -> Option<(u64, u64)> {
        let s = fs::read_to_string(self.path.join(REWINDING)).ok()?;
        let (a, b) = s.trim().split_once(' ')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    /// Puts the upper layer back as the rewind under way says (none: nothing to do).
    /// Run again after a crash, it finishes what the first run began.
    pub fn continue_rewind(&self, upper: BorrowedFd) -> io::Result<Option<Rewound>> {
        let Some((to, before)) = self.pending_rewind() else {
            return Ok(None);
        };
        let mut state = self.state.lock();
        let info = self.info(before)?;
        let epoch = match state.as_mut() {
            Some(e) if e.id == before => e,
            _ => {
                return Err(super::other(format!(
                    "the rewind to checkpoint {to} is under way, but checkpoint {before} it took is not the newest"
                )))
            }
        };
        let PutBack {
            names,
            inodes,
            dirs,
        } = self.put_back(epoch, upper, to)?;
        Ok(Some(Rewound {
            to,
            before: info,
            names,
            inodes,
            dirs,
        }))
    }

    /// The rewind under way is done (git's state too): its mark goes.
    pub fn end_rewind(&self) -> io::Result<()> {
        match fs::remove_file(self.path.join(REWINDING)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => {
                self.unfinished
                    .store(false, std::sync::atomic::Ordering::Release);
                Ok(())
            }
        }
    }

    fn target(&self, from: u64, until: u64) -> io::Result<Target> {
        let mut t = Target::default();
        for id in self.epoch_ids()? {
            if id < from || id >= until {
                continue;
            }
            for r in read_records(&self.dir(id))? {
                match r {
                    Record::Name { path, was } => {
                        t.names.entry(path).or_insert((id, was));
                    }
                    Record::Content { path, ino, meta } => {
                        t.content.entry(ino).or_insert((id, path.clone()));
                        t.attrs.entry(ino).or_insert((id, path, meta));
                    }
                    Record::Attrs { path, ino, meta } => {
                        t.attrs.entry(ino).or_insert((id, path, meta));
                    }
                }
            }
        }
        Ok(t)
    }

    /// Makes the upper layer what the epochs from `to` on say it was, keeping each change
    /// in `epoch` (the one the rewind began). The paths changed, and the files put back.
    fn put_back(&self, epoch: &mut Epoch, upper: BorrowedFd, to: u64) -> io::Result<PutBack> {
        let t = self.target(to, epoch.id)?;
        // Copies a run cut short made and never renamed into place.
        let own_dir = beneath::open_root(&self.dir(epoch.id))?;
        for e in beneath::list(own_dir.as_fd())? {
            if e.name.as_bytes().starts_with(FRESH.as_bytes()) {
                beneath::unlink_at(own_dir.as_fd(), &e.name, false)?;
            }
        }
        let mut changed = Vec::new();
        let mut paths: Vec<&Vec<u8>> = t.names.keys().collect();

        // 1. What should not be there goes, deepest first.
        paths.sort_by_key(|p| std::cmp::Reverse(depth(p)));
        for &p in &paths {
            let (_, was) = &t.names[p];
            let Some(st) = entry_at(upper, p)? else {
                continue;
            };
            let fits = match was {
                Was::Absent => false,
                Was::Dir(_) => is_dir(st.st_mode),
                Was::Inode(ino) => !is_dir(st.st_mode) && st.st_ino == *ino,
            };
            if fits || p.is_empty() {
                continue;
            }
            epoch.keep_tree(upper, p)?;
            let (dir, name) = split(p);
            let d = beneath::dir(upper, dir)?;
            beneath::remove_tree(d.as_fd(), name)?;
            changed.push(p.clone());
        }

        // 2. What should be there and is not is made, shallowest first.
        paths.reverse();
        for &p in &paths {
            let (id, was) = &t.names[p];
            if matches!(was, Was::Absent) || entry_at(upper, p)?.is_some() {
                continue;
            }
            epoch.keep_name(upper, p)?;
            let (dir, name) = split(p);
            let d = beneath::dir(upper, dir)?;
            match was {
                Was::Dir(_) => beneath::mkdir_at(d.as_fd(), name, 0o700)?,
                Was::Inode(ino) => {
                    let saved = beneath::open_root(&self.dir(*id).join(SAVED))?;
                    beneath::link_at(saved.as_fd(), &ino_name(*ino), d.as_fd(), name).map_err(
                        |e| {
                            super::other(format!(
                                "putting {} back from checkpoint {id}: {e}",
                                show(p)
                            ))
                        },
                    )?;
                }
                Was::Absent => unreachable!("left out above"),
            }
            if !changed.contains(p) {
                changed.push(p.clone());
            }
        }

        // Where each inode kept is now: its names among the paths put back, or the path
        // it was kept at when no epoch touched that name.
        let names_of = |ino: u64, kept_at: &[u8]| -> io::Result<Vec<Vec<u8>>> {
            let mut at: Vec<Vec<u8>> = t
                .names
                .iter()
                .filter(|(_, (_, w))| *w == Was::Inode(ino))
                .map(|(p, _)| p.clone())
                .collect();
            if !kept_at.is_empty() && !t.names.contains_key(kept_at) {
                at.push(kept_at.to_vec());
            }
            let mut found = Vec::new();
            for p in at {
                if entry_at(upper, &p)?.is_some_and(|st| st.st_ino == ino) {
                    found.push(p);
                }
            }
            Ok(found)
        };

        // 3. Data back.
        let mut inodes = Vec::new();
        let mut replaced = std::collections::HashSet::new();
        for (&ino, (id, kept_at)) in &t.content {
            let names = names_of(ino, kept_at)?;
            let copy = File::from(beneath::open(
                beneath::open_root(&self.dir(*id).join(CONTENT))?.as_fd(),
                ino_name(ino).as_bytes(),
                libc::O_RDONLY,
                0,
            )?);
            let saved = beneath::open_root(&self.dir(*id).join(SAVED))?;
            let Ok(st) = beneath::stat_at(saved.as_fd(), &ino_name(ino)) else {
                // Never linked (it had no name then): in no state a rewind puts back.
                continue;
            };
            let links_kept = self.links_kept(ino)?;
            if let ([p], true) = (names.as_slice(), st.st_nlink as usize == 1 + links_kept) {
                // Its one name known: a new file over it, given its attributes first (a
                // crash after the rename leaves the name a whole file).
                let fresh = self.fresh_copy(epoch, &copy)?;
                let tmp_dir = beneath::open_root(&self.dir(epoch.id))?;
                if let Some((_, _, meta)) = t.attrs.get(&ino) {
                    meta.apply(tmp_dir.as_fd(), &fresh)?;
                }
                epoch.keep_name(upper, p)?;
                let (dir, name) = split(p);
                let d = beneath::dir(upper, dir)?;
                // The directory's times stay (the name's file changes, not the name).
                let times = beneath::fstat(d.as_fd())?;
                beneath::rename_at(tmp_dir.as_fd(), &fresh, d.as_fd(), name, 0)?;
                beneath::set_times(
                    d.as_fd(),
                    timespec(times.st_atime, times.st_atime_nsec),
                    timespec(times.st_mtime, times.st_mtime_nsec),
                )?;
                replaced.insert(ino);
                changed.push(p.clone());
            } else {
                // Names of it unknown: back into the file itself, through its link.
                let fd = beneath::entry(saved.as_fd(), &ino_name(ino))?;
                epoch.keep_content(upper, names.first().map(|p| p.as_slice()), fd.as_fd())?;
                let into = File::from(beneath::open(
                    saved.as_fd(),
                    ino_name(ino).as_bytes(),
                    libc::O_WRONLY | libc::O_TRUNC,
                    0,
                )?);
                crate::filecopy::clone_or_copy(&copy, &into)?;
                inodes.extend(names.first().cloned());
            }
        }

        // 4. Attributes back: files' (those not made anew above), then directories'.
        for (&ino, (id, kept_at, meta)) in &t.attrs {
            if replaced.contains(&ino) {
                continue;
            }
            let saved = beneath::open_root(&self.dir(*id).join(SAVED))?;
            let Ok(fd) = beneath::entry(saved.as_fd(), &ino_name(ino)) else {
                continue; // never linked: it had no name then
            };
            if Meta::of_fd(fd.as_fd())? == *meta {
                continue;
            }
            let names = names_of(ino, kept_at)?;
            epoch.keep_attrs(upper, names.first().map(|p| p.as_slice()), fd.as_fd())?;
            meta.apply(saved.as_fd(), &ino_name(ino))?;
            inodes.extend(names.first().cloned());
        }
        let mut dirs: Vec<(&Vec<u8>, &Meta)> = t
            .names
            .iter()
            .filter_map(|(p, (_, w))| match w {
                Was::Dir(m) => Some((p, m)),
                _ => None,
            })
            .collect();
        dirs.sort_by_key(|(p, _)| std::cmp::Reverse(depth(p)));
        let mut dirs_back = Vec::new();
        for (p, meta) in dirs {
            let now = if p.is_empty() {
                Meta::of_fd(upper)?
            } else {
                let (dir, name) = split(p);
                Meta::of(beneath::dir(upper, dir)?.as_fd(), name)?
            };
            if now == *meta {
                continue;
            }
            epoch.keep_name(upper, p)?;
            if p.is_empty() {
                meta.apply_to_dir(upper)?;
            } else {
                let (dir, name) = split(p);
                meta.apply(beneath::dir(upper, dir)?.as_fd(), name)?;
            }
            // Reported: what the kernel cached of it (its mode, which it checks) goes.
            dirs_back.push(p.clone());
        }
        Ok(PutBack {
            names: changed,
            inodes,
            dirs: dirs_back,
        })
    }

    /// How many links to inode `ino` the checkpoints' stores hold.
    fn links_kept(&self, ino: u64) -> io::Result<usize> {
        let mut n = 0;
        for id in self.epoch_ids()? {
            let saved = self.dir(id).join(SAVED).join(ino.to_string());
            if let Ok(m) = fs::symlink_metadata(&saved) {
                if std::os::unix::fs::MetadataExt::ino(&m) == ino {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// A new file in the epoch's directory with the data of `copy`; its name there.
    fn fresh_copy(&self, epoch: &Epoch, copy: &File) -> io::Result<std::ffi::OsString> {
        let dir: OwnedFd = beneath::open_root(&self.dir(epoch.id))?;
        let name = std::ffi::OsString::from(format!("{FRESH}{}", super::now_nanos()));
        let dst = File::from(beneath::open(
            dir.as_fd(),
            name.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?);
        crate::filecopy::clone_or_copy(copy, &dst)?;
        Ok(name)
    }
}

/// The start of the name of a file a rewind copies data into before it renames it over
/// the file's name.
const FRESH: &str = "fresh-";

fn timespec(s: i64, ns: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: s,
        tv_nsec: ns,
    }
}
