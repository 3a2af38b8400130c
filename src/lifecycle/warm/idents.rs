//! What a snapshot knew of each file it read, beside its manifest (`<manifest>.ident`):
//! the source file's device, inode, size, modification and change times (nanoseconds)
//! and mode, and the content it was stored as. The next take by the same user reads again
//! only the files where one of those moved (a change time cannot be set back by anyone
//! but the kernel, so a rewrite that keeps size and modification time is still seen), and
//! `new --warm` tells from them how much of the source changed since.
//!
//! A file whose times were as new as the take that read it (within two seconds) is read
//! again all the same: a change right after the take looked, within the same tick of
//! the file system's clock, would leave its times as they were (git's racy entries).
//!
//! One record per file: `<dev> <ino> <size> <mtime s> <mtime ns> <ctime s> <ctime ns>
//! <mode, octal> <take's start s> <take's start ns> <oid> TAB <path> NUL`.

use std::collections::HashMap;
use std::io::Write;

use git2::Oid;

use crate::beneath::Stat;

/// A source file as a take saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ident {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    mode: u32,
    /// When the take that read it began (not compared).
    seen: (i64, i64),
}

/// Two idents are the same file as it was when they agree on all but when they were seen.
impl PartialEq for Ident {
    fn eq(&self, o: &Ident) -> bool {
        (
            self.dev, self.ino, self.size, self.mtime, self.ctime, self.mode,
        ) == (o.dev, o.ino, o.size, o.mtime, o.ctime, o.mode)
    }
}

impl Eq for Ident {}

/// How close to the take its times may be and still be trusted.
const RACY_SECS: i64 = 2;

impl Ident {
    pub(super) fn of(st: &Stat) -> Ident {
        Ident {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode,
            seen: (0, 0),
        }
    }

    /// As seen by a take that began at `at` (seconds, nanoseconds).
    pub(super) fn seen_at(mut self, at: (i64, i64)) -> Ident {
        self.seen = at;
        self
    }

    /// Whether its times are too close to the take that saw it to be trusted.
    pub(super) fn racy(&self) -> bool {
        let late = (self.seen.0 - RACY_SECS, self.seen.1);
        self.mtime >= late || self.ctime >= late
    }

    pub(super) fn size(&self) -> u64 {
        self.size
    }
}

/// The records of `files` (path, what it was, its content).
pub(super) fn encode(files: &[(Vec<u8>, Ident, Oid)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(files.len() * 96);
    for (path, i, oid) in files {
        let _ = write!(
            out,
            "{} {} {} {} {} {} {} {:o} {} {} {oid}\t",
            i.dev,
            i.ino,
            i.size,
            i.mtime.0,
            i.mtime.1,
            i.ctime.0,
            i.ctime.1,
            i.mode,
            i.seen.0,
            i.seen.1
        );
        out.extend_from_slice(path);
        out.push(0);
    }
    out
}

/// The records of `bytes`, by path; a record that does not read is left out (its file is
/// read again: never wrong).
pub(super) fn decode(bytes: &[u8]) -> HashMap<Vec<u8>, (Ident, Oid)> {
    records(bytes)
        .map(|(path, ident, oid)| (path.to_vec(), (ident, oid)))
        .collect()
}

/// The records of `bytes` one at a time, borrowing their paths.
pub(super) fn records(bytes: &[u8]) -> impl Iterator<Item = (&[u8], Ident, Oid)> {
    bytes.split(|b| *b == 0).filter_map(record)
}

/// One record, or None when it does not read.
fn record(rec: &[u8]) -> Option<(&[u8], Ident, Oid)> {
    let tab = rec.iter().position(|b| *b == b'\t')?;
    let (head, path) = (&rec[..tab], &rec[tab + 1..]);
    let head = std::str::from_utf8(head).ok()?;
    let f: Vec<&str> = head.split(' ').collect();
    if f.len() != 11 {
        return None;
    }
    let n = |i: usize| f[i].parse::<i64>().ok();
    let ident = Ident {
        dev: n(0)? as u64,
        ino: n(1)? as u64,
        size: n(2)? as u64,
        mtime: (n(3)?, n(4)?),
        ctime: (n(5)?, n(6)?),
        mode: u32::from_str_radix(f[7], 8).ok()?,
        seen: (n(8)?, n(9)?),
    };
    Some((path, ident, Oid::from_str(f[10]).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_a_broken_one_is_left_out() {
        let i = Ident {
            dev: 2049,
            ino: 77,
            size: 12,
            mtime: (1_700_000_000, 5),
            ctime: (1_700_000_001, 999_999_999),
            mode: 0o100644,
            seen: (1_700_000_100, 0),
        };
        let oid = Oid::hash_object(git2::ObjectType::Blob, b"x").unwrap();
        let mut bytes = encode(&[(b"node_modules/a b/c.js".to_vec(), i, oid)]);
        bytes.extend_from_slice(b"1 2 3\tbroken\0");
        let back = decode(&bytes);
        assert_eq!(back.len(), 1);
        assert_eq!(back[b"node_modules/a b/c.js".as_slice()], (i, oid));
        assert_eq!(back[b"node_modules/a b/c.js".as_slice()].0.seen, i.seen);
        assert!(!i.racy());
        assert!(i.seen_at((1_700_000_002, 0)).racy());
    }
}
