//! What a snapshot knew of each file it read, beside its manifest (`<manifest>.ident`):
//! the source file's device, inode, size, modification and change times (nanoseconds)
//! and mode, and the content it was stored as. The next take by the same user reads again
//! only the files where one of those moved (a change time cannot be set back by anyone
//! but the kernel, so a rewrite that keeps size and modification time is still seen), and
//! `new --warm` tells from them how much of the source changed since.
//!
//! One record per file: `<dev> <ino> <size> <mtime s> <mtime ns> <ctime s> <ctime ns>
//! <mode, octal> <oid> TAB <path> NUL`.

use std::collections::HashMap;
use std::io::Write;

use git2::Oid;

use crate::beneath::Stat;

/// A source file as a take saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ident {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    mode: u32,
}

impl Ident {
    pub(super) fn of(st: &Stat) -> Ident {
        Ident {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode,
        }
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
            "{} {} {} {} {} {} {} {:o} {oid}\t",
            i.dev, i.ino, i.size, i.mtime.0, i.mtime.1, i.ctime.0, i.ctime.1, i.mode
        );
        out.extend_from_slice(path);
        out.push(0);
    }
    out
}

/// The records of `bytes`, by path; a record that does not read is left out (its file is
/// read again: never wrong).
pub(super) fn decode(bytes: &[u8]) -> HashMap<Vec<u8>, (Ident, Oid)> {
    let mut out = HashMap::new();
    for rec in bytes.split(|b| *b == 0) {
        let Some(tab) = rec.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let (head, path) = (&rec[..tab], &rec[tab + 1..]);
        let Ok(head) = std::str::from_utf8(head) else {
            continue;
        };
        let f: Vec<&str> = head.split(' ').collect();
        if f.len() != 9 {
            continue;
        }
        let n = |i: usize| f[i].parse::<i64>().ok();
        let (Some(dev), Some(ino), Some(size), Some(ms), Some(mns), Some(cs), Some(cns)) =
            (n(0), n(1), n(2), n(3), n(4), n(5), n(6))
        else {
            continue;
        };
        let (Ok(mode), Ok(oid)) = (u32::from_str_radix(f[7], 8), Oid::from_str(f[8])) else {
            continue;
        };
        out.insert(
            path.to_vec(),
            (
                Ident {
                    dev: dev as u64,
                    ino: ino as u64,
                    size: size as u64,
                    mtime: (ms, mns),
                    ctime: (cs, cns),
                    mode,
                },
                oid,
            ),
        );
    }
    out
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
        };
        let oid = Oid::hash_object(git2::ObjectType::Blob, b"x").unwrap();
        let mut bytes = encode(&[(b"node_modules/a b/c.js".to_vec(), i, oid)]);
        bytes.extend_from_slice(b"1 2 3\tbroken\0");
        let back = decode(&bytes);
        assert_eq!(back.len(), 1);
        assert_eq!(back[b"node_modules/a b/c.js".as_slice()], (i, oid));
    }
}
