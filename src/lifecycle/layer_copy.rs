//! Copying a live upper layer (a fork's parent's) into an empty one. The parent keeps
//! running: its layer is copied file by file (a reflink where the filesystem has them,
//! else `copy_file_range`), never linked, so the copy shares no inode with it. Each file
//! is copied whole as of one instant: its status (inode, size, mtime, ctime) before and
//! after the copy must agree, or it is copied again. The layer is then walked again, and
//! again, until a walk finds nothing changed since it was copied: the copy is then the
//! layer as of one instant (the moment between the last two walks). A layer that never
//! holds still for a whole walk gets a copy whose files are each whole but of different
//! instants, and the copy says so. The cost is the layer's entries and bytes.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crate::beneath::{self, Stat};
use crate::layout::Whiteouts;

/// What a copy of a layer copied.
#[derive(Debug, Default, Clone)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
    pub dirs: u64,
    /// Symlinks, whiteouts, FIFOs, sockets and devices.
    pub other: u64,
    /// Files copied again because they changed while they were copied.
    pub again: u64,
    /// Walks of the layer (the last one found nothing changed, when `settled`).
    pub walks: u32,
    pub settled: bool,
    /// When not settled: a path that changed during the last walk.
    pub last_change: Option<String>,
    pub took: Duration,
}

/// How many walks a fork makes of a parent that never holds still (the last only adds).
pub const MAX_WALKS: u32 = 10;
/// How many times one file is copied before a fork gives up on it: it changed during
/// each copy.
pub const MAX_COPIES: u32 = 50;

pub enum CopyError {
    /// What was being done (naming the path) and the error.
    Io(String, io::Error),
    /// A file that changed during every copy of it.
    NeverStill(Vec<u8>),
}

impl std::fmt::Debug for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::Io(what, e) => write!(f, "{what}: {e}"),
            CopyError::NeverStill(p) => {
                write!(f, "{} never held still", String::from_utf8_lossy(p))
            }
        }
    }
}

/// What an entry was when it was copied: a later walk that finds it so again has nothing
/// to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sig {
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Sig {
    fn of(st: &Stat) -> Sig {
        Sig {
            ino: st.st_ino,
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// How deep a layer's directories may go: git's own limit (`core.maxTreeDepth`). A user
/// can make a chain of any depth; the walk recurses once per level, on a thread whose
/// stack holds this many (`WALK_STACK`).
const MAX_DEPTH: usize = 2048;

/// The stack of the thread a fork walks the layer on (reserved, not used, until deep
/// directories need it).
const WALK_STACK: usize = 256 << 20;

/// Runs `f` on a thread with a stack of `WALK_STACK`.
pub fn on_walk_stack<T: Send>(
    f: impl FnOnce() -> Result<T, CopyError> + Send,
) -> Result<T, CopyError> {
    std::thread::scope(|s| {
        let walker = std::thread::Builder::new()
            .name("fork-walk".into())
            .stack_size(WALK_STACK)
            .spawn_scoped(s, f)
            .map_err(|e| CopyError::Io("starting the walk".into(), e))?;
        // A panic is an error like any other: the creation is rolled back.
        walker.join().unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(CopyError::Io(
                "walking the layer".into(),
                io::Error::other(format!("the walk failed: {why}")),
            ))
        })
    })
}

/// Copies the upper layer `from` (whose whiteout files are in `from_work`) to the empty
/// layer `to` (whiteouts made in `to_work`), as described at the top of this module.
/// `as_root`: owners are kept (else every copy is the caller's).
pub fn copy_layer(
    from: &Path,
    from_work: &Path,
    to: &Path,
    to_work: &Path,
    as_root: bool,
) -> Result<Copied, CopyError> {
    let mut c = Copier::new(from, from_work, to, to_work, as_root)?;
    c.settle()?;
    c.finish()
}

/// A copy of a live layer, walked again until it holds still.
pub struct Copier {
    from: OwnedFd,
    /// The parent's whiteout files (read again when one may have been added meanwhile).
    from_whiteouts: Whiteouts,
    from_work: OwnedFd,
    to_root: OwnedFd,
    to_whiteouts: Whiteouts,
    to_work: OwnedFd,
    as_root: bool,
    /// Each entry copied, by its path in the layer: what it was when copied.
    copied: BTreeMap<Vec<u8>, Sig>,
    /// Each directory's status (applied once the copy is done: its content changes it).
    dirs: BTreeMap<Vec<u8>, Stat>,
    /// Files with more than one name, by inode: the names copied and what it was.
    linked: HashMap<u64, (Vec<Vec<u8>>, Sig)>,
    /// A path that changed in the current walk.
    changed: Option<Vec<u8>>,
    /// This walk only adds (see `settle`).
    additive: bool,
    stats: Copied,
}

impl Copier {
    pub fn new(
        from: &Path,
        from_work: &Path,
        to: &Path,
        to_work: &Path,
        as_root: bool,
    ) -> Result<Copier, CopyError> {
        let io = |what: &str, p: &Path| {
            let what = format!("{what} {}", p.display());
            move |e| CopyError::Io(what, e)
        };
        let from_fd = beneath::open_root(from).map_err(io("opening", from))?;
        let from_work_fd = beneath::open_root(from_work).map_err(io("opening", from_work))?;
        let to_fd = beneath::open_root(to).map_err(io("opening", to))?;
        let to_work_fd = beneath::open_root(to_work).map_err(io("opening", to_work))?;
        let from_whiteouts = Whiteouts::read(from_work_fd.as_fd())
            .map_err(io("reading the whiteouts of", from_work))?;
        let to_whiteouts =
            Whiteouts::open(to_work_fd.as_fd()).map_err(io("making whiteouts in", to_work))?;
        Ok(Copier {
            from: from_fd,
            from_whiteouts,
            from_work: from_work_fd,
            to_root: to_fd,
            to_whiteouts,
            to_work: to_work_fd,
            as_root,
            copied: BTreeMap::new(),
            dirs: BTreeMap::new(),
            linked: HashMap::new(),
            changed: None,
            additive: false,
            stats: Copied::default(),
        })
    }

    /// Walks the layer, copying what changed, until a walk finds nothing changed since
    /// the one before (at least one walk after the last copy). The `MAX_WALKS`th walk,
    /// when every one before found changes, only adds: a name the parent no longer has
    /// stays in the copy (a file moved during it is then at both places, never at
    /// neither), and the copy is not of one instant (`Copied::settled` false).
    pub fn settle(&mut self) -> Result<(), CopyError> {
        let mut walks = 0;
        loop {
            walks += 1;
            self.additive = walks == MAX_WALKS;
            // After a walk that found changes, a pause before the next, longer each time:
            // a parent that writes in bursts holds still between them (1.6 s in all).
            if walks > 2 {
                std::thread::sleep(Duration::from_millis((10u64 << (walks - 3)).min(500)));
            }
            self.stats.walks += 1;
            self.changed = None;
            let from = self
                .from
                .try_clone()
                .map_err(|e| CopyError::Io("the layer".into(), e))?;
            let to = self
                .to_root
                .try_clone()
                .map_err(|e| CopyError::Io("the copy".into(), e))?;
            let root_st = beneath::fstat(from.as_fd())
                .map_err(|e| CopyError::Io("reading the layer's top".into(), e))?;
            // The layer's top changed since the last walk (an entry made or removed there).
            let root = Sig::of(&root_st);
            let mut changes = u64::from(self.copied.insert(Vec::new(), root) != Some(root));
            if changes > 0 && self.stats.walks > 1 {
                self.changed.get_or_insert_with(|| b".".to_vec());
            }
            self.dirs.insert(Vec::new(), root_st);
            changes += self.sync_dir(from.as_fd(), to.as_fd(), b"", 0)?;
            if changes == 0 && self.stats.walks > 1 {
                self.stats.settled = true;
                self.additive = false;
                return Ok(());
            }
            self.stats.settled = false;
            if walks >= MAX_WALKS {
                self.additive = false;
                self.stats.last_change = self
                    .changed
                    .take()
                    .map(|p| String::from_utf8_lossy(&p).into_owned());
                return Ok(());
            }
        }
    }

    /// The directories' attributes, once nothing more is copied; what was copied.
    pub fn finish(mut self) -> Result<Copied, CopyError> {
        self.finish_dirs()?;
        Ok(self.stats)
    }
}

fn join(rel: &[u8], name: &OsStr) -> Vec<u8> {
    if rel.is_empty() {
        name.as_bytes().to_vec()
    } else {
        [rel, b"/", name.as_bytes()].concat()
    }
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

impl Copier {
    /// Makes the directory `to` hold what `from` holds now; how many entries that
    /// changed (0: everything below was as copied before).
    fn sync_dir(
        &mut self,
        from: BorrowedFd,
        to: BorrowedFd,
        rel: &[u8],
        depth: usize,
    ) -> Result<u64, CopyError> {
        let shown = |rel: &[u8]| String::from_utf8_lossy(rel).into_owned();
        let io = |what: &str, rel: &[u8]| {
            let what = format!("{what} {}", shown(rel));
            move |e| CopyError::Io(what, e)
        };
        if depth > MAX_DEPTH {
            return Err(io("walking", rel)(io::Error::other(format!(
                "directories deeper than {MAX_DEPTH}"
            ))));
        }
        let mut changes = 0;
        let listed = beneath::list(from).map_err(io("listing", rel))?;
        let mut names: std::collections::HashSet<OsString> = Default::default();
        for e in listed {
            let name = e.name;
            let path = join(rel, &name);
            let st = match beneath::stat_at(from, &name) {
                Ok(st) => st,
                // Gone since the listing: the next walk sees the directory as it is then.
                Err(e) if is_gone(&e) => {
                    changes += self.note(&path);
                    continue;
                }
                Err(e) => return Err(io("reading", &path)(e)),
            };
            names.insert(name.clone());
            let sig = Sig::of(&st);
            let kind = st.st_mode & libc::S_IFMT;
            if kind == libc::S_IFDIR {
                let known = self
                    .copied
                    .get(&path)
                    .is_some_and(|s| s.ino == sig.ino && s.mode & libc::S_IFMT == libc::S_IFDIR);
                if !known {
                    self.forget(to, &name, &path)
                        .map_err(io("replacing", &path))?;
                    beneath::mkdir_at(to, &name, 0o700).map_err(io("making", &path))?;
                    self.stats.dirs += 1;
                    changes += self.note(&path);
                }
                let sub_from =
                    match beneath::open(from, name.as_bytes(), libc::O_PATH | libc::O_DIRECTORY, 0)
                    {
                        Ok(fd) => fd,
                        Err(e) if is_gone(&e) => {
                            changes += self.note(&path);
                            continue;
                        }
                        Err(e) => return Err(io("opening", &path)(e)),
                    };
                let opened = beneath::fstat(sub_from.as_fd()).map_err(io("reading", &path))?;
                if opened.st_ino != st.st_ino {
                    changes += self.note(&path); // replaced between the stat and the open
                    continue;
                }
                let sub_to = beneath::dir(to, name.as_bytes()).map_err(io("opening", &path))?;
                // Its status was read before its listing: changed since the last walk
                // (an entry made, removed or renamed in it, even one gone again), the
                // copy is of no one instant yet.
                if known && self.copied.get(&path) != Some(&sig) {
                    changes += self.note(&path);
                }
                self.copied.insert(path.clone(), sig);
                self.dirs.insert(path.clone(), st);
                changes += self.sync_dir(sub_from.as_fd(), sub_to.as_fd(), &path, depth + 1)?;
                continue;
            }
            // A whiteout file the parent made since (at a filesystem's link limit) looks
            // like this before it is known.
            if kind == libc::S_IFREG
                && st.st_size == 0
                && st.st_nlink > 1
                && st.st_mode & 0o7777 == 0
                && !self.from_whiteouts.is(&st)
            {
                if let Ok(w) = Whiteouts::read(self.from_work.as_fd()) {
                    self.from_whiteouts = w;
                }
            }
            let whiteout = self.from_whiteouts.is(&st);
            // A whiteout is one file with a name for each: its times change with every
            // other whiteout made, which changes nothing of this one.
            let sig = if whiteout {
                Sig {
                    mtime: (0, 0),
                    ctime: (0, 0),
                    ..sig
                }
            } else {
                sig
            };
            if self.copied.get(&path) == Some(&sig) {
                continue;
            }
            changes += self.note(&path);
            self.forget(to, &name, &path)
                .map_err(io("replacing", &path))?;
            if whiteout {
                self.to_whiteouts
                    .link(self.to_work.as_fd(), to, &name)
                    .map_err(io("making the whiteout", &path))?;
                self.stats.other += 1;
                self.copied.insert(path, sig);
                continue;
            }
            let got = match kind {
                libc::S_IFREG => self.copy_file(from, to, &name, &path, &st)?,
                libc::S_IFLNK => {
                    let target = match beneath::readlink_at(from, &name) {
                        Ok(t) => t,
                        Err(e) if is_gone(&e) || e.raw_os_error() == Some(libc::EINVAL) => {
                            continue;
                        }
                        Err(e) => return Err(io("reading the symlink", &path)(e)),
                    };
                    beneath::symlink_at(&target, to, &name).map_err(io("making", &path))?;
                    let link = beneath::entry(to, &name).map_err(io("opening", &path))?;
                    if self.as_root {
                        beneath::chown(link.as_fd(), Some(st.st_uid), Some(st.st_gid))
                            .map_err(io("giving", &path))?;
                    }
                    beneath::utimens_at(to, &name, &times(&st)).map_err(io("dating", &path))?;
                    self.stats.other += 1;
                    Some(sig)
                }
                _ => {
                    // A FIFO, socket or device node the layer holds: made again, never
                    // opened.
                    beneath::mknod_at(to, &name, st.st_mode & (libc::S_IFMT | 0o777), st.st_rdev)
                        .map_err(io("making", &path))?;
                    let node = beneath::entry(to, &name).map_err(io("opening", &path))?;
                    self.attrs(node.as_fd(), &st).map_err(io("giving", &path))?;
                    self.stats.other += 1;
                    Some(sig)
                }
            };
            if let Some(sig) = got {
                self.copied.insert(path, sig);
            }
        }
        // What the parent no longer has (kept by the last, adding walk).
        for e in beneath::list(to).map_err(io("listing the copy of", rel))? {
            if !names.contains(&e.name) {
                let path = join(rel, &e.name);
                if !self.additive {
                    self.forget(to, &e.name, &path)
                        .map_err(io("removing the copy of", &path))?;
                }
                changes += self.note(&path);
            }
        }
        Ok(changes)
    }

    /// Counts a change at `path` (one that makes another walk needed).
    fn note(&mut self, path: &[u8]) -> u64 {
        self.changed.get_or_insert_with(|| path.to_vec());
        1
    }

    /// Removes the copy of `name` (at `path`) and everything known below it.
    fn forget(&mut self, to: BorrowedFd, name: &OsStr, path: &[u8]) -> io::Result<()> {
        if let Some(old) = self.copied.remove(path) {
            if old.is_dir() {
                let below = [path, b"/"].concat();
                for map_keys in [self
                    .copied
                    .range(below.clone()..)
                    .take_while(|(k, _)| k.starts_with(&below))
                    .map(|(k, _)| k.clone())
                    .collect::<Vec<_>>()]
                {
                    for k in map_keys {
                        self.copied.remove(&k);
                    }
                }
                let dirs: Vec<_> = self
                    .dirs
                    .range(below.clone()..)
                    .take_while(|(k, _)| k.starts_with(&below))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in dirs {
                    self.dirs.remove(&k);
                }
                self.dirs.remove(path);
                for (names, _) in self.linked.values_mut() {
                    names.retain(|k| !k.starts_with(&below));
                }
            } else if let Some((names, _)) = self.linked.get_mut(&old.ino) {
                names.retain(|k| k != path);
            }
        }
        match beneath::remove_tree(to, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// Copies the regular file `name`, whole as of one instant; what it was then (None:
    /// gone or no longer a regular file, which the next walk sees).
    fn copy_file(
        &mut self,
        from: BorrowedFd,
        to: BorrowedFd,
        name: &OsStr,
        path: &[u8],
        listed: &Stat,
    ) -> Result<Option<Sig>, CopyError> {
        let io = |what: &str| {
            let what = format!("{what} {}", String::from_utf8_lossy(path));
            move |e| CopyError::Io(what, e)
        };
        // Another name of a file already copied: the same link in the copy.
        if listed.st_nlink > 1 {
            if let Some((names, sig)) = self.linked.get(&listed.st_ino).cloned() {
                if sig == Sig::of(listed) {
                    for first in &names {
                        if self.link_copy(first, to, name).is_ok() {
                            if let Some((names, _)) = self.linked.get_mut(&listed.st_ino) {
                                names.push(path.to_vec());
                            }
                            self.stats.other += 1;
                            return Ok(Some(sig));
                        }
                    }
                }
            }
        }
        let src = match beneath::entry(from, name) {
            Ok(fd) => fd,
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(io("opening")(e)),
        };
        let st = beneath::fstat(src.as_fd()).map_err(io("reading"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None);
        }
        // Read without touching its access time (the parent is not changed by a fork),
        // where the kernel lets this user.
        let file = match beneath::reopen(src.as_fd(), libc::O_RDONLY | libc::O_NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                beneath::reopen(src.as_fd(), libc::O_RDONLY)
            }
            other => other,
        }
        .map_err(io("opening"))?;
        let out = beneath::open(
            to,
            name.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .map_err(io("making the copy of"))?;
        let out = fs::File::from(out);
        for attempt in 0..MAX_COPIES {
            let before = beneath::fstat(file.as_fd()).map_err(io("reading"))?;
            if attempt > 0 {
                out.set_len(0).map_err(io("copying"))?;
                self.stats.again += 1;
            }
            let n = crate::filecopy::clone_or_copy(&file, &out).map_err(io("copying"))?;
            #[cfg(test)]
            tests::DURING_COPY.with(|h| {
                if let Some(h) = h.borrow_mut().as_mut() {
                    h(path)
                }
            });
            let after = beneath::fstat(file.as_fd()).map_err(io("reading"))?;
            if Sig::of(&before) == Sig::of(&after) {
                self.attrs(out.as_fd(), &after).map_err(io("giving"))?;
                self.stats.files += 1;
                self.stats.bytes += n;
                let sig = Sig::of(&after);
                if after.st_nlink > 1 {
                    self.linked.insert(after.st_ino, (vec![path.to_vec()], sig));
                }
                return Ok(Some(sig));
            }
        }
        Err(CopyError::NeverStill(path.to_vec()))
    }

    /// Links `name` in `to` to the copy at `first` (a path in the copied layer).
    fn link_copy(&self, first: &[u8], to: BorrowedFd, name: &OsStr) -> io::Result<()> {
        let (dir, base) = match first.iter().rposition(|b| *b == b'/') {
            Some(i) => (&first[..i], &first[i + 1..]),
            None => (&b""[..], first),
        };
        let d = beneath::dir(self.to_root.as_fd(), dir)?;
        beneath::link_at(d.as_fd(), OsStr::from_bytes(base), to, name)
    }

    /// Gives the copy `fd` the owner (as root), mode and times of `st`.
    fn attrs(&self, fd: BorrowedFd, st: &Stat) -> io::Result<()> {
        if self.as_root {
            beneath::chown(fd, Some(st.st_uid), Some(st.st_gid))?;
        }
        beneath::chmod(fd, st.st_mode & 0o7777)?;
        beneath::utimens(fd, &times(st))
    }

    /// Each directory's owner, mode and times, deepest first (a directory's times
    /// change with what is made in it; a mode without write would stop that).
    fn finish_dirs(&mut self) -> Result<(), CopyError> {
        let mut dirs: Vec<_> = std::mem::take(&mut self.dirs).into_iter().collect();
        dirs.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        for (rel, st) in dirs {
            let fd = beneath::dir(self.to_root.as_fd(), &rel).map_err(|e| {
                CopyError::Io(
                    format!("opening the copy of {}", String::from_utf8_lossy(&rel)),
                    e,
                )
            })?;
            self.attrs(fd.as_fd(), &st).map_err(|e| {
                CopyError::Io(
                    format!("giving the copy of {}", String::from_utf8_lossy(&rel)),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

fn times(st: &Stat) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn layer(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let (u, w) = (root.join("upper"), root.join("work"));
        fs::create_dir_all(&u).unwrap();
        fs::create_dir_all(&w).unwrap();
        (u, w)
    }

    #[test]
    fn a_layer_is_copied_with_its_whiteouts_links_modes_and_times_and_shares_no_inode() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        fs::create_dir_all(fu.join("a/b")).unwrap();
        fs::write(fu.join("a/b/f"), b"hello").unwrap();
        fs::set_permissions(fu.join("a/b/f"), fs::Permissions::from_mode(0o751)).unwrap();
        fs::write(fu.join("big"), vec![7u8; 3 << 20]).unwrap();
        fs::hard_link(fu.join("big"), fu.join("a/big-link")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", fu.join("a/out")).unwrap();
        fs::write(fu.join("a/.wtfs-opaque"), b"").unwrap();
        let fwork = beneath::open_root(&fw).unwrap();
        let wh = Whiteouts::open(fwork.as_fd()).unwrap();
        let up = beneath::open_root(&fu).unwrap();
        wh.link(fwork.as_fd(), up.as_fd(), OsStr::new("gone.txt"))
            .unwrap();
        nix::unistd::mkfifo(
            &fu.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o640),
        )
        .unwrap();
        fs::set_permissions(fu.join("a/b"), fs::Permissions::from_mode(0o555)).unwrap();

        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        assert!(c.settled, "{c:?}");
        assert_eq!(
            c.walks, 2,
            "one copy and one walk that finds nothing changed"
        );
        assert_eq!(fs::read(tu.join("a/b/f")).unwrap(), b"hello");
        assert_eq!(fs::read(tu.join("big")).unwrap(), vec![7u8; 3 << 20]);
        assert_eq!(
            fs::read_link(tu.join("a/out")).unwrap(),
            Path::new("../../etc/passwd")
        );
        assert!(tu.join("a/.wtfs-opaque").is_file());
        let m = |p: &Path| fs::symlink_metadata(p).unwrap();
        assert_eq!(m(&tu.join("a/b/f")).mode() & 0o7777, 0o751);
        assert_eq!(m(&tu.join("a/b")).mode() & 0o7777, 0o555);
        assert_eq!(
            m(&tu.join("a/b/f")).mtime_nsec(),
            m(&fu.join("a/b/f")).mtime_nsec()
        );
        assert_eq!(m(&tu.join("a/b")).mtime(), m(&fu.join("a/b")).mtime());
        assert!(m(&tu.join("fifo")).file_type().is_fifo_like());
        // The two names of one file are one file in the copy too, and not the parent's.
        assert_eq!(m(&tu.join("big")).ino(), m(&tu.join("a/big-link")).ino());
        for p in ["a/b/f", "big", "a", "a/out"] {
            assert_ne!(m(&tu.join(p)).ino(), m(&fu.join(p)).ino(), "{p}");
        }
        // The whiteout is one of the copy's own whiteout files.
        let twork = beneath::open_root(&tw).unwrap();
        let twh = Whiteouts::open(twork.as_fd()).unwrap();
        let tup = beneath::open_root(&tu).unwrap();
        assert!(twh.at(tup.as_fd(), OsStr::new("gone.txt")));
        assert!(!wh.at(tup.as_fd(), OsStr::new("gone.txt")));
        fs::set_permissions(fu.join("a/b"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(tu.join("a/b"), fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn an_entry_made_and_removed_again_during_a_walk_is_not_taken_for_a_still_layer() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        fs::create_dir(fu.join("dir")).unwrap();
        fs::write(fu.join("dir/f"), b"f").unwrap();
        let dir = fu.join("dir");
        let once = std::rc::Rc::new(std::cell::Cell::new(true));
        let o = once.clone();
        // While `dir/f` is copied, a file comes and goes in `dir`: the listing the next
        // walk reads is the same, but the directory was not still in between.
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |_: &[u8]| {
                if o.replace(false) {
                    fs::write(dir.join("transient"), b"t").unwrap();
                    fs::remove_file(dir.join("transient")).unwrap();
                }
            }))
        });
        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        assert!(c.settled);
        assert_eq!(c.walks, 3, "{c:?}");
        assert!(!tu.join("dir/transient").exists());
    }

    #[test]
    fn two_names_of_one_file_stay_one_file_when_the_first_ones_directory_moves() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        fs::create_dir_all(fu.join("a/D")).unwrap();
        fs::create_dir_all(fu.join("b")).unwrap();
        fs::create_dir_all(fu.join("z")).unwrap();
        fs::write(fu.join("a/D/X"), b"one file").unwrap();
        fs::hard_link(fu.join("a/D/X"), fu.join("b/Y")).unwrap();
        let (from, to) = (fu.join("a/D"), fu.join("z/D"));
        let once = std::rc::Rc::new(std::cell::Cell::new(true));
        let o = once.clone();
        // Whichever name is copied first, its directory moves during that copy.
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |_: &[u8]| {
                if o.replace(false) {
                    fs::rename(&from, &to).unwrap();
                }
            }))
        });
        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        assert!(c.settled);
        assert!(!tu.join("a/D").exists());
        let ino = |p: &str| fs::metadata(tu.join(p)).unwrap().ino();
        assert_eq!(ino("z/D/X"), ino("b/Y"), "{c:?}");
        assert_eq!(fs::metadata(tu.join("b/Y")).unwrap().nlink(), 2);
    }

    #[test]
    fn a_layer_that_never_holds_still_is_copied_file_by_file_and_a_deep_one_fails_cleanly() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        fs::write(fu.join("f"), b"f").unwrap();
        let n = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let (k, dir) = (n.clone(), fu.clone());
        // Every copy makes a new file: each walk finds one more.
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |_: &[u8]| {
                k.set(k.get() + 1);
                fs::write(dir.join(format!("new{}", k.get())), b"n").unwrap();
            }))
        });
        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        assert!(!c.settled);
        assert_eq!(c.walks, MAX_WALKS);
        // Nothing the parent held all through the fork is missing.
        assert_eq!(fs::read(tu.join("f")).unwrap(), b"f");

        let (fu, fw) = layer(&d.path().join("deep-from"));
        let (tu, tw) = layer(&d.path().join("deep-to"));
        let mut at = beneath::open_root(&fu).unwrap();
        for _ in 0..MAX_DEPTH + 2 {
            beneath::mkdir_at(at.as_fd(), OsStr::new("d"), 0o755).unwrap();
            at = beneath::dir(at.as_fd(), b"d").unwrap();
        }
        let r = on_walk_stack(|| copy_layer(&fu, &fw, &tu, &tw, false));
        match r {
            Err(CopyError::Io(what, e)) => {
                assert!(e.to_string().contains("deeper than"), "{what}: {e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sparse_file_is_copied_with_its_holes() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        let f = fs::File::create(fu.join("sparse")).unwrap();
        f.set_len(64 << 30).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"middle", 32 << 30).unwrap();
        drop(f);
        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        let m = fs::metadata(tu.join("sparse")).unwrap();
        assert_eq!(m.len(), 64 << 30);
        assert!(
            m.blocks() * 512 < 16 << 20,
            "{} blocks: the holes were filled",
            m.blocks()
        );
        assert!(c.bytes < 16 << 20, "{c:?}");
        let mut got = [0u8; 6];
        fs::File::open(tu.join("sparse"))
            .unwrap()
            .read_exact_at(&mut got, 32 << 30)
            .unwrap();
        assert_eq!(&got, b"middle");
    }

    trait FifoLike {
        fn is_fifo_like(&self) -> bool;
    }
    impl FifoLike for fs::FileType {
        fn is_fifo_like(&self) -> bool {
            use std::os::unix::fs::FileTypeExt;
            self.is_fifo()
        }
    }

    #[test]
    fn a_file_rewritten_during_the_copy_is_copied_whole_and_the_layer_as_of_one_instant() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        let size = 4 << 20;
        fs::write(fu.join("hot"), vec![b'a'; size]).unwrap();
        for i in 0..200 {
            fs::write(fu.join(format!("f{i}")), format!("{i}")).unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, hot, dir) = (stop.clone(), fu.join("hot"), fu.clone());
            std::thread::spawn(move || {
                use std::os::unix::fs::FileExt;
                let f = fs::OpenOptions::new().write(true).open(&hot).unwrap();
                let mut n = 0u64;
                // Whole-file rewrites in place, each of one letter, and a file renamed
                // between directories now and then.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 40 {
                    let letter = b'a' + (n % 26) as u8;
                    f.write_all_at(&vec![letter; size], 0).unwrap();
                    let _ = fs::rename(dir.join("f1"), dir.join("f1-moved"));
                    let _ = fs::rename(dir.join("f1-moved"), dir.join("f1"));
                    n += 1;
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        };
        let c = copy_layer(&fu, &fw, &tu, &tw, false).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        let hot = fs::read(tu.join("hot")).unwrap();
        assert_eq!(hot.len(), size);
        assert!(
            hot.iter().all(|b| *b == hot[0]),
            "the copy of a file being rewritten is one version of it ({c:?})"
        );
        for i in 0..200 {
            let p = if c.settled || i != 1 {
                tu.join(format!("f{i}"))
            } else {
                continue;
            };
            assert_eq!(fs::read_to_string(p).unwrap(), format!("{i}"), "{c:?}");
        }
        if c.settled {
            assert!(!tu.join("f1-moved").exists());
        }
    }

    type Hook = Option<Box<dyn FnMut(&[u8])>>;

    thread_local! {
        /// Called between the copy of a file and the look at it after (tests only).
        pub(super) static DURING_COPY: std::cell::RefCell<Hook> =
            const { std::cell::RefCell::new(None) };
    }

    #[test]
    fn a_file_that_never_holds_still_fails_the_copy_by_name_and_leaves_a_torn_copy_to_no_one() {
        let d = tempfile::tempdir().unwrap();
        let (fu, fw) = layer(&d.path().join("from"));
        let (tu, tw) = layer(&d.path().join("to"));
        fs::write(fu.join("spin"), vec![0u8; 1 << 20]).unwrap();
        fs::write(fu.join("still"), b"x").unwrap();
        let spin = fu.join("spin");
        let copies = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = copies.clone();
        // A write lands during every copy of `spin`.
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |path: &[u8]| {
                if path == b"spin" {
                    seen.set(seen.get() + 1);
                    use std::os::unix::fs::FileExt;
                    let f = fs::OpenOptions::new().write(true).open(&spin).unwrap();
                    f.write_all_at(&[seen.get() as u8], 0).unwrap();
                }
            }))
        });
        let r = copy_layer(&fu, &fw, &tu, &tw, false);
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        match r {
            Err(CopyError::NeverStill(p)) => assert_eq!(p, b"spin"),
            other => panic!("{other:?}"),
        }
        assert_eq!(copies.get(), MAX_COPIES);

        // Still only for a while: copied whole, as it was after the last write.
        let (tu2, tw2) = layer(&d.path().join("to2"));
        let spin = fu.join("spin");
        let left = std::rc::Rc::new(std::cell::Cell::new(3u8));
        let l = left.clone();
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |path: &[u8]| {
                if path == b"spin" && l.get() > 0 {
                    l.set(l.get() - 1);
                    fs::write(&spin, vec![b'a' + l.get(); 1 << 20]).unwrap();
                }
            }))
        });
        let c = copy_layer(&fu, &fw, &tu2, &tw2, false).unwrap();
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        assert!(c.settled);
        assert_eq!(c.again, 3, "{c:?}");
        assert_eq!(fs::read(tu2.join("spin")).unwrap(), vec![b'a'; 1 << 20]);
    }
}
