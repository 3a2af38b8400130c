//! The upper layer's on-disk format, shared by the filesystem (`fs/`) and cleanup.
//!
//! * A file, symlink or directory present in the upper layer wins over the base.
//! * A whiteout for name `N` sits at `N` itself: a hard link of one of the worktree's
//!   whiteout files (`<work>/whiteout-K`, empty, mode 0; a new one when a filesystem's
//!   link limit is reached). It hides the base entry `N` and spends no byte of the name,
//!   so names keep all 255 bytes; only worktreefs can make one, since no whiteout file is
//!   ever visible in a view. Putting a whiteout over an upper entry, or an entry over a
//!   whiteout, is one rename (`RENAME_EXCHANGE` for a directory), so a crash leaves one
//!   or the other.
//! * Format 1 (the first format) wrote a whiteout as an empty file `.wtfs-wh.N`; readers
//!   still take it as one, and `migrate` rewrites a format-1 upper layer once, at mount,
//!   re-runnably (`<work>/format-2` says it is done).
//! * An opaque directory holds an empty file `.wtfs-opaque`: nothing of the base below it
//!   shows through.
//! * Names starting with `.wtfs-` are reserved in the view (EINVAL on create).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use crate::beneath::{self, Listed};

pub mod submodules;

pub const RESERVED_PREFIX: &[u8] = b".wtfs-";
/// Format 1's whiteout names (`.wtfs-wh.N`), read and migrated, never written.
pub const OLD_WHITEOUT_PREFIX: &str = ".wtfs-wh.";
pub const OPAQUE_MARKER: &str = ".wtfs-opaque";
/// In a directory of the upper layer: a submodule's view moved here (a rename), and
/// which one (`submodules::stub_text`).
pub const SUBMODULE_MARKER: &str = ".wtfs-submodule";
const WHITEOUT_FILE: &str = "whiteout-";
const FORMAT_MARKER: &str = "format-2";

/// The name format 1 gave the whiteout that hides base entry `name`.
pub fn old_whiteout_name(name: &OsStr) -> OsString {
    let mut s = OsString::from(OLD_WHITEOUT_PREFIX);
    s.push(name);
    s
}

/// A worktree's whiteout files (in its work directory), by inode number.
#[derive(Debug)]
pub struct Whiteouts {
    /// `(inode, name)` of each; the last is the one new whiteouts link to.
    files: parking_lot::RwLock<Vec<(u64, OsString)>>,
}

impl Whiteouts {
    /// No whiteout files (for tests of code that never reads an upper layer).
    pub fn empty() -> Whiteouts {
        Whiteouts {
            files: parking_lot::RwLock::new(Vec::new()),
        }
    }

    /// The whiteout files of the work directory `work`, making the first if there is none.
    pub fn open(work: BorrowedFd) -> io::Result<Whiteouts> {
        let w = Whiteouts {
            files: parking_lot::RwLock::new(Vec::new()),
        };
        w.load(work)?;
        if w.files.read().is_empty() {
            w.add(work, 0)?;
        }
        Ok(w)
    }

    /// The whiteout files `work` holds, making none (another worktree's, read).
    pub fn read(work: BorrowedFd) -> io::Result<Whiteouts> {
        let w = Whiteouts::empty();
        w.load(work)?;
        Ok(w)
    }

    fn load(&self, work: BorrowedFd) -> io::Result<()> {
        let mut found: Vec<(u64, u64, OsString)> = Vec::new();
        for e in beneath::list(work)? {
            let Some(k) = e
                .name
                .to_str()
                .and_then(|n| n.strip_prefix(WHITEOUT_FILE))
                .and_then(|k| k.parse::<u64>().ok())
            else {
                continue;
            };
            let st = beneath::stat_at(work, &e.name)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                found.push((k, st.st_ino, e.name));
            }
        }
        found.sort();
        *self.files.write() = found.into_iter().map(|(_, ino, n)| (ino, n)).collect();
        Ok(())
    }

    /// Makes whiteout file number `k` (another process may have made it first).
    fn add(&self, work: BorrowedFd, k: u64) -> io::Result<()> {
        let name = OsString::from(format!("{WHITEOUT_FILE}{k}"));
        match beneath::open(
            work,
            name.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0,
        ) {
            Ok(fd) => fs::File::from(fd).sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        sync_dir(work)?;
        self.load(work)
    }

    /// Whether inode `ino` (of a regular file in the upper layer) is a whiteout.
    pub fn contains(&self, ino: u64) -> bool {
        self.files.read().iter().any(|(i, _)| *i == ino)
    }

    /// Whether `st` (an upper entry's) is a whiteout.
    pub fn is(&self, st: &beneath::Stat) -> bool {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && self.contains(st.st_ino)
    }

    /// Whether the entry `name` of `dir` is a whiteout.
    pub fn at(&self, dir: BorrowedFd, name: &OsStr) -> bool {
        beneath::stat_at(dir, name).is_ok_and(|st| self.is(&st))
    }

    /// Links a whiteout at `name` in `to_dir` (which must be free), from the work
    /// directory `work`.
    pub fn link(&self, work: BorrowedFd, to_dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
        for _ in 0..8 {
            let (count, current) = {
                let f = self.files.read();
                let last = f.last().map(|(_, n)| n.clone());
                (f.len() as u64, last)
            };
            let current = current.ok_or_else(|| io::Error::other("no whiteout file"))?;
            match beneath::link_at(work, &current, to_dir, name) {
                Err(e) if e.raw_os_error() == Some(libc::EMLINK) => self.add(work, count)?,
                other => return other,
            }
        }
        Err(io::Error::other("no whiteout file takes another link"))
    }

    /// Puts a whiteout in place of the entry `name` of `dir` in one rename. For a
    /// directory (`is_dir`) the two are exchanged: the directory is then `tmp` in the work
    /// directory, for the caller to remove.
    pub fn replace(
        &self,
        work: BorrowedFd,
        dir: BorrowedFd,
        name: &OsStr,
        tmp: &OsStr,
        is_dir: bool,
    ) -> io::Result<()> {
        self.link(work, work, tmp)?;
        let flags = if is_dir { libc::RENAME_EXCHANGE } else { 0 };
        let r = beneath::rename_at(work, tmp, dir, name, flags);
        if r.is_err() || !is_dir {
            let _ = beneath::unlink_at(work, tmp, false);
        }
        match r {
            // A filesystem without RENAME_EXCHANGE: the directory out, then the whiteout
            // in (a crash between shows the base entry again; nothing is lost).
            Err(e) if is_dir && e.raw_os_error() == Some(libc::EINVAL) => {
                beneath::rename_at(dir, name, work, tmp, 0)?;
                self.link(work, dir, name)
            }
            other => other,
        }
    }

    /// Puts the entry `tmp` of the work directory at `name` in `dir`, where a whiteout
    /// (or nothing) is, in one rename; a directory (`is_dir`) is exchanged with the
    /// whiteout, which then goes.
    pub fn install(
        &self,
        work: BorrowedFd,
        tmp: &OsStr,
        dir: BorrowedFd,
        name: &OsStr,
        is_dir: bool,
    ) -> io::Result<()> {
        if !is_dir || !self.at(dir, name) {
            return beneath::rename_at(work, tmp, dir, name, 0);
        }
        match beneath::rename_at(work, tmp, dir, name, libc::RENAME_EXCHANGE) {
            Ok(()) => {
                // Installed; the whiteout left in the work directory is only litter.
                if let Err(e) = beneath::unlink_at(work, tmp, false) {
                    tracing::warn!("could not remove a whiteout from the work directory: {e}");
                }
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                beneath::unlink_at(dir, name, false)?;
                beneath::rename_at(work, tmp, dir, name, 0).inspect_err(|_| {
                    // Put the whiteout back: the base entry must stay hidden.
                    let _ = self.link(work, dir, name);
                })
            }
            Err(e) => Err(e),
        }
    }
}

fn sync_dir(dir: BorrowedFd) -> io::Result<()> {
    let fd = beneath::open(dir, b"", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    fs::File::from(fd).sync_all()
}

/// Rewrites a format-1 upper layer (`upper`, with the work directory `work`): each
/// whiteout file `.wtfs-wh.N` becomes a whiteout at `N` (unless an upper entry `N` won
/// over it), then goes. Re-runnable: a crash leaves old whiteouts, new ones, or both,
/// and each reads right; `<work>/format-2` is written once all are done. Returns how
/// many whiteouts it rewrote.
pub fn migrate(upper: BorrowedFd, work: BorrowedFd, whiteouts: &Whiteouts) -> io::Result<usize> {
    if beneath::stat_at(work, OsStr::new(FORMAT_MARKER)).is_ok() {
        return Ok(0);
    }
    fn walk(dir: BorrowedFd, work: BorrowedFd, w: &Whiteouts, n: &mut usize) -> io::Result<()> {
        for e in beneath::list(dir)? {
            if let Some(hidden) = e
                .name
                .as_bytes()
                .strip_prefix(OLD_WHITEOUT_PREFIX.as_bytes())
            {
                let hidden = OsStr::from_bytes(hidden);
                if !hidden.is_empty() {
                    match beneath::stat_at(dir, hidden) {
                        Err(err) if err.kind() == io::ErrorKind::NotFound => {
                            w.link(work, dir, hidden)?;
                            *n += 1;
                        }
                        Err(err) => return Err(err),
                        // An entry, or the new whiteout of an earlier run.
                        Ok(_) => {}
                    }
                }
                // The new whiteout reaches the disk before the old one leaves it.
                sync_dir(dir)?;
                beneath::unlink_at(dir, &e.name, false)?;
            } else if e.is_dir(dir) {
                let sub = beneath::dir(dir, e.name.as_bytes())?;
                walk(sub.as_fd(), work, w, n)?;
            }
        }
        Ok(())
    }
    let mut n = 0;
    walk(upper, work, whiteouts, &mut n)?;
    let fd = beneath::open(
        work,
        FORMAT_MARKER.as_bytes(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o600,
    )?;
    fs::File::from(fd).sync_all()?;
    sync_dir(work)?;
    Ok(n)
}

/// Creates an empty marker file (whiteout or opaque) `name` in the upper directory `dir`.
/// `ordered`: a later step removes or moves an upper entry and must not reach the disk
/// before this marker does, so the marker is synced first. A marker with nothing after it
/// is as durable as any other unlink: until the next sync, like the filesystem underneath.
pub fn write_marker(dir: BorrowedFd, name: &OsStr, ordered: bool) -> io::Result<()> {
    let fd = beneath::open(
        dir,
        name.as_bytes(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o600,
    )?;
    if ordered {
        fs::File::from(fd).sync_all()?;
    }
    Ok(())
}

/// Whether `name` is one of worktreefs' own (a marker, or reserved for one).
/// The marker of the stub of a submodule's view in the directory `dir` (see
/// [`SUBMODULE_MARKER`]), when `dir` holds nothing else but markers: a directory where
/// anything else was put (the path shown as a plain directory, its submodule not
/// initialized, and files made in it) is the superproject's, whatever marker it holds.
pub fn read_stub(dir: BorrowedFd) -> Option<Vec<u8>> {
    // The common case (no marker) costs one stat.
    crate::beneath::stat_at(dir, OsStr::new(SUBMODULE_MARKER)).ok()?;
    let listed = crate::beneath::list(dir).ok()?;
    if !listed.iter().any(|e| e.name == SUBMODULE_MARKER)
        || !listed.iter().all(|e| is_reserved(&e.name))
    {
        return None;
    }
    crate::beneath::read_regular(dir, SUBMODULE_MARKER.as_bytes(), 64 << 10)
        .ok()
        .map(|(b, _)| b)
}

pub fn is_reserved(name: &OsStr) -> bool {
    name.as_bytes().starts_with(RESERVED_PREFIX)
}

/// What an upper-directory name is.
#[derive(Debug, PartialEq, Eq)]
pub enum Name<'a> {
    /// An entry of the view.
    Entry,
    /// A whiteout hiding the base entry named so.
    Whiteout(&'a OsStr),
    /// The opaque marker.
    Opaque,
    /// Reserved, but neither of the above (left alone).
    Reserved,
}

pub fn classify(name: &OsStr) -> Name<'_> {
    let b = name.as_bytes();
    if let Some(hidden) = b.strip_prefix(OLD_WHITEOUT_PREFIX.as_bytes()) {
        Name::Whiteout(OsStr::from_bytes(hidden))
    } else if b == OPAQUE_MARKER.as_bytes() {
        Name::Opaque
    } else if b.starts_with(RESERVED_PREFIX) {
        Name::Reserved
    } else {
        Name::Entry
    }
}

/// One upper directory, read in one pass: its entries (markers left out), the base names
/// its whiteouts hide, and whether it is opaque.
#[derive(Debug, Default)]
pub struct UpperDir {
    pub entries: Vec<Listed>,
    pub whiteouts: HashSet<OsString>,
    pub opaque: bool,
}

impl UpperDir {
    /// Reads the upper directory `dir` (a descriptor: see `crate::beneath`) of a worktree
    /// with the whiteout files `whiteouts`.
    pub fn read(dir: BorrowedFd, whiteouts: &Whiteouts) -> io::Result<UpperDir> {
        let mut out = UpperDir::default();
        for e in beneath::list(dir)? {
            let regular = match e.d_type {
                libc::DT_REG => true,
                libc::DT_UNKNOWN => beneath::stat_at(dir, &e.name)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG),
                _ => false,
            };
            if regular && whiteouts.contains(e.ino) {
                out.whiteouts.insert(e.name);
                continue;
            }
            match classify(&e.name) {
                Name::Entry => out.entries.push(e),
                Name::Whiteout(hidden) => {
                    out.whiteouts.insert(hidden.to_os_string());
                }
                Name::Opaque => out.opaque = true,
                Name::Reserved => {}
            }
        }
        Ok(out)
    }

    /// Whether the base entry `name` shows through here (not opaque, no whiteout).
    pub fn shows_base(&self, name: &OsStr) -> bool {
        !self.opaque && !self.whiteouts.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every marker kind, written as the filesystem writes it, reads back as what it is;
    /// entries stay entries, whatever their type; a format-1 whiteout still reads as one.
    #[test]
    fn every_marker_kind_written_reads_back() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("work")).unwrap();
        fs::create_dir(d.path().join("upper")).unwrap();
        let work = beneath::open_root(&d.path().join("work")).unwrap();
        let fd = beneath::open_root(&d.path().join("upper")).unwrap();
        let (work, at) = (work.as_fd(), fd.as_fd());
        let w = Whiteouts::open(work).unwrap();
        let long = "l".repeat(255);
        w.link(work, at, OsStr::new("gone.txt")).unwrap();
        w.link(work, at, OsStr::new(&long)).unwrap();
        write_marker(at, &old_whiteout_name(OsStr::new("old dir")), false).unwrap();
        write_marker(at, OsStr::new(OPAQUE_MARKER), true).unwrap();
        let dir = d.path().join("upper");
        fs::write(dir.join(".wtfs-future"), b"").unwrap();
        fs::write(dir.join("file"), b"x").unwrap();
        fs::write(dir.join("empty"), b"").unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink("file", dir.join("link")).unwrap();
        // A name that only looks like a marker once its prefix is taken off.
        fs::write(dir.join("wh.not-a-whiteout"), b"").unwrap();

        let u = UpperDir::read(at, &w).unwrap();
        assert!(u.opaque);
        let mut whiteouts: Vec<_> = u.whiteouts.iter().cloned().collect();
        whiteouts.sort();
        assert_eq!(
            whiteouts,
            vec![
                OsString::from("gone.txt"),
                long.clone().into(),
                "old dir".into()
            ]
        );
        let mut entries: Vec<(String, &str)> = u
            .entries
            .iter()
            .map(|e| {
                let kind = match e.d_type {
                    libc::DT_DIR => "dir",
                    libc::DT_LNK => "link",
                    _ => "file",
                };
                (e.name.to_string_lossy().into_owned(), kind)
            })
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            vec![
                ("empty".into(), "file"),
                ("file".into(), "file"),
                ("link".into(), "link"),
                ("sub".into(), "dir"),
                ("wh.not-a-whiteout".into(), "file"),
            ]
        );
        assert!(!u.shows_base(OsStr::new("anything")), "opaque hides all");
        assert!(w.at(at, OsStr::new("gone.txt")) && !w.at(at, OsStr::new("empty")));

        // An entry replaced by a whiteout, and a whiteout replaced by a directory, each in
        // one rename.
        w.replace(work, at, OsStr::new("file"), OsStr::new("t1"), false)
            .unwrap();
        assert!(w.at(at, OsStr::new("file")));
        w.replace(work, at, OsStr::new("sub"), OsStr::new("t2"), true)
            .unwrap();
        assert!(w.at(at, OsStr::new("sub")));
        assert!(beneath::stat_at(work, OsStr::new("t2"))
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR));
        w.install(work, OsStr::new("t2"), at, OsStr::new("gone.txt"), true)
            .unwrap();
        assert!(dir.join("gone.txt").is_dir());
        assert!(beneath::stat_at(work, OsStr::new("t2")).is_err());

        // Markers are empty files of mode 0600, whatever was there before.
        let wh = dir.join(OPAQUE_MARKER);
        fs::write(&wh, b"junk").unwrap();
        write_marker(at, OsStr::new(OPAQUE_MARKER), true).unwrap();
        let m = fs::metadata(&wh).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!((m.len(), m.permissions().mode() & 0o777), (0, 0o600));
    }

    /// A format-1 upper layer is rewritten once: each `.wtfs-wh.N` becomes a whiteout at
    /// `N` (unless an entry `N` won over it) and goes. A run stopped at any step (a crash)
    /// and run again ends in the same layer, and reads the same at every step.
    #[test]
    fn a_format_1_upper_layer_is_migrated_whatever_step_a_crash_stopped_it_at() {
        let build = |root: &Path| {
            let up = root.join("upper");
            fs::create_dir_all(up.join("a/b")).unwrap();
            fs::create_dir_all(root.join("work")).unwrap();
            for (dir, name) in [("", "gone"), ("a", "x"), ("a/b", "deep"), ("a", "won")] {
                fs::write(up.join(dir).join(old_whiteout_name(OsStr::new(name))), b"").unwrap();
            }
            fs::write(up.join("a/won"), b"the entry wins").unwrap();
            fs::write(up.join("kept"), b"kept").unwrap();
        };
        let read_all = |root: &Path| {
            let work = beneath::open_root(&root.join("work")).unwrap();
            let w = Whiteouts::open(work.as_fd()).unwrap();
            let up = beneath::open_root(&root.join("upper")).unwrap();
            let mut out = Vec::new();
            for rel in ["", "a", "a/b"] {
                let d = beneath::dir(up.as_fd(), rel.as_bytes()).unwrap();
                let u = UpperDir::read(d.as_fd(), &w).unwrap();
                let mut en: Vec<_> = u.entries.into_iter().map(|e| e.name).collect();
                en.sort();
                // An entry wins over a whiteout of its name (format 1's crash rule).
                let mut wh: Vec<_> = u
                    .whiteouts
                    .into_iter()
                    .filter(|n| !en.contains(n))
                    .collect();
                wh.sort();
                out.push((rel, wh, en));
            }
            out
        };
        let d = tempfile::tempdir().unwrap();
        let clean = d.path().join("clean");
        build(&clean);
        let before = read_all(&clean);
        let work = beneath::open_root(&clean.join("work")).unwrap();
        let w = Whiteouts::open(work.as_fd()).unwrap();
        let up = beneath::open_root(&clean.join("upper")).unwrap();
        assert_eq!(migrate(up.as_fd(), work.as_fd(), &w).unwrap(), 3);
        let after = read_all(&clean);
        assert_eq!(before, after, "the view reads the same");
        assert_eq!(migrate(up.as_fd(), work.as_fd(), &w).unwrap(), 0, "once");
        let names = |root: &Path| {
            let mut v: Vec<String> = Vec::new();
            for rel in ["", "a", "a/b"] {
                for e in fs::read_dir(root.join("upper").join(rel)).unwrap() {
                    v.push(format!(
                        "{rel}/{}",
                        e.unwrap().file_name().to_string_lossy()
                    ));
                }
            }
            v.sort();
            v
        };
        assert!(!names(&clean)
            .iter()
            .any(|n| n.contains(OLD_WHITEOUT_PREFIX)));

        // A crash after each step: the new whiteout of the first k old ones linked, the
        // old one of the first j removed.
        for k in 0..=3usize {
            for j in 0..=k {
                let root = d.path().join(format!("crash-{k}-{j}"));
                build(&root);
                let work = beneath::open_root(&root.join("work")).unwrap();
                let w = Whiteouts::open(work.as_fd()).unwrap();
                let up = beneath::open_root(&root.join("upper")).unwrap();
                for (i, (dir, name)) in [("", "gone"), ("a", "x"), ("a/b", "deep")]
                    .iter()
                    .enumerate()
                {
                    let dfd = beneath::dir(up.as_fd(), dir.as_bytes()).unwrap();
                    if i < k {
                        w.link(work.as_fd(), dfd.as_fd(), OsStr::new(name)).unwrap();
                    }
                    if i < j {
                        let old = old_whiteout_name(OsStr::new(name));
                        beneath::unlink_at(dfd.as_fd(), &old, false).unwrap();
                    }
                }
                assert_eq!(read_all(&root), before, "crash {k}/{j}: reads the same");
                migrate(up.as_fd(), work.as_fd(), &w).unwrap();
                assert_eq!(read_all(&root), before, "crash {k}/{j}: migrated");
                assert_eq!(names(&root), names(&clean), "crash {k}/{j}");
            }
        }
    }

    #[test]
    fn names_are_classified_by_their_prefix() {
        let rows: [(&str, Name); 6] = [
            ("a", Name::Entry),
            (".wtfs-wh.a", Name::Whiteout(OsStr::new("a"))),
            (".wtfs-wh.", Name::Whiteout(OsStr::new(""))),
            (".wtfs-opaque", Name::Opaque),
            (".wtfs-other", Name::Reserved),
            (".wtfs", Name::Entry),
        ];
        for (name, want) in rows {
            assert_eq!(classify(OsStr::new(name)), want, "{name}");
            assert_eq!(is_reserved(OsStr::new(name)), want != Name::Entry, "{name}");
        }
        let mut u = UpperDir::default();
        u.whiteouts.insert("x".into());
        assert!(!u.shows_base(OsStr::new("x")));
        assert!(u.shows_base(OsStr::new("y")));
    }
}
