//! The upper layer's on-disk format, shared by the filesystem (`fs/`) and cleanup.
//!
//! * A file, symlink or directory present in the upper layer wins over the base.
//! * A whiteout for name `N` is an empty regular file `.wtfs-wh.N` in the same upper
//!   directory; it hides the base entry `N`. An upper entry `N` next to a whiteout for
//!   `N` still wins (that is how a crash between the two steps of a change resolves).
//! * An opaque directory holds an empty file `.wtfs-opaque`: nothing of the base below it
//!   shows through.
//! * Names starting with `.wtfs-` are reserved in the view (EINVAL on create).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;

use crate::beneath::{self, Listed};

pub const RESERVED_PREFIX: &[u8] = b".wtfs-";
pub const WHITEOUT_PREFIX: &str = ".wtfs-wh.";
pub const OPAQUE_MARKER: &str = ".wtfs-opaque";

/// The name of the whiteout that hides base entry `name`.
pub fn whiteout_name(name: &OsStr) -> OsString {
    let mut s = OsString::from(WHITEOUT_PREFIX);
    s.push(name);
    s
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
    if let Some(hidden) = b.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
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
    /// Reads the upper directory `dir` (a descriptor: see `crate::beneath`).
    pub fn read(dir: BorrowedFd) -> io::Result<UpperDir> {
        let mut out = UpperDir::default();
        for e in beneath::list(dir)? {
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
    use std::os::fd::AsFd;

    /// Every marker kind, written as the filesystem writes it, reads back as what it is;
    /// entries stay entries, whatever their type.
    #[test]
    fn every_marker_kind_written_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let fd = beneath::open_root(dir).unwrap();
        let at = fd.as_fd();
        write_marker(at, &whiteout_name(OsStr::new("gone.txt")), true).unwrap();
        write_marker(at, &whiteout_name(OsStr::new("old dir")), false).unwrap();
        write_marker(at, OsStr::new(OPAQUE_MARKER), true).unwrap();
        fs::write(dir.join(".wtfs-future"), b"").unwrap();
        fs::write(dir.join("file"), b"x").unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink("file", dir.join("link")).unwrap();
        // A name that only looks like a marker once its prefix is taken off.
        fs::write(dir.join("wh.not-a-whiteout"), b"").unwrap();

        let u = UpperDir::read(at).unwrap();
        assert!(u.opaque);
        let mut whiteouts: Vec<_> = u.whiteouts.iter().cloned().collect();
        whiteouts.sort();
        assert_eq!(
            whiteouts,
            vec![OsString::from("gone.txt"), "old dir".into()]
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
                ("file".into(), "file"),
                ("link".into(), "link"),
                ("sub".into(), "dir"),
                ("wh.not-a-whiteout".into(), "file"),
            ]
        );
        assert!(!u.shows_base(OsStr::new("anything")), "opaque hides all");

        // Markers are empty files of mode 0600, whatever was there before.
        let wh = dir.join(whiteout_name(OsStr::new("gone.txt")));
        fs::write(&wh, b"junk").unwrap();
        write_marker(at, &whiteout_name(OsStr::new("gone.txt")), true).unwrap();
        let m = fs::metadata(&wh).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!((m.len(), m.permissions().mode() & 0o777), (0, 0o600));
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
