//! git's untracked cache (index extension `UNTR`), written at creation for the base tree.
//!
//! `git status` lists untracked files by opening every directory of the worktree, which
//! in a fresh view costs several FUSE round trips per directory. The untracked cache
//! records, per directory, the untracked files found last time; with fsmonitor git trusts
//! a directory's entry until the hook reports a change below it. A fresh view has no
//! untracked file anywhere, so the cache can be written at creation: every directory of
//! the base tree, valid, with no untracked entries, and the ignore-file ids git would
//! compute. git then lists no directory on the first `git status`.
//!
//! Layout (git's `dir.c`, `write_untracked_extension`): varint ident length, ident
//! ("Location <worktree>, system <sysname>" NUL), the stat data and object ids of
//! `info/exclude` and `core.excludesFile`, the dir flags, the per-directory ignore file
//! name, the number of directories, each directory (pre-order: untracked count, child
//! count, name, untracked names), three EWAH bitmaps (valid, check-only, has-ignore-id),
//! the stat data of valid directories, the ignore-file ids, and a NUL.
//!
//! If anything does not match what git computes at run time (another user's global
//! excludes file, other `status` flags), git drops the cache and scans as usual; the cache
//! can make `git status` faster, never different.

use std::collections::HashMap;
use std::path::Path;

use git2::{ObjectType, Oid};

use crate::git::{IndexStat, MODE_BLOB, MODE_EXEC};
use crate::ino::path_ino_low;

/// `DIR_SHOW_OTHER_DIRECTORIES | DIR_HIDE_EMPTY_DIRECTORIES`: what `git status` asks for
/// by default (`status.showUntrackedFiles=normal`).
const DEFAULT_DIR_FLAGS: u32 = (1 << 1) | (1 << 2);

/// git's variable-length integer (varint.c).
pub fn encode_varint(mut value: u64, out: &mut Vec<u8>) {
    let mut buf = [0u8; 16];
    let mut pos = buf.len() - 1;
    buf[pos] = (value & 127) as u8;
    loop {
        value >>= 7;
        if value == 0 {
            break;
        }
        value -= 1;
        pos -= 1;
        buf[pos] = 128 | (value & 127) as u8;
    }
    out.extend_from_slice(&buf[pos..]);
}

/// An EWAH-compressed bitmap (git's ewah/ewah_io.c serialization) of `bits`. Like git's,
/// it ends at the last set bit.
pub fn ewah(bits: &[bool]) -> Vec<u8> {
    let bits = &bits[..bits.iter().rposition(|b| *b).map_or(0, |i| i + 1)];
    const MAX_RUN: u64 = (1 << 32) - 1;
    const MAX_LITERALS: u64 = (1 << 31) - 1;
    let words: Vec<u64> = bits
        .chunks(64)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, b)| if *b { w | (1 << i) } else { w })
        })
        .collect();
    let mut buffer: Vec<u64> = Vec::new();
    let mut rlw_pos = 0usize;
    let mut i = 0;
    while i < words.len() || buffer.is_empty() {
        let (mut run_bit, mut run_len) = (0u64, 0u64);
        if i < words.len() && (words[i] == 0 || words[i] == u64::MAX) {
            run_bit = (words[i] == u64::MAX) as u64;
            let clean = words[i];
            while i < words.len() && words[i] == clean && run_len < MAX_RUN {
                run_len += 1;
                i += 1;
            }
        }
        let start = i;
        while i < words.len()
            && words[i] != 0
            && words[i] != u64::MAX
            && ((i - start) as u64) < MAX_LITERALS
        {
            i += 1;
        }
        rlw_pos = buffer.len();
        buffer.push(run_bit | (run_len << 1) | (((i - start) as u64) << 33));
        buffer.extend_from_slice(&words[start..i]);
    }
    let mut out = Vec::with_capacity(12 + buffer.len() * 8);
    out.extend_from_slice(&(bits.len() as u32).to_be_bytes());
    out.extend_from_slice(&(buffer.len() as u32).to_be_bytes());
    for w in &buffer {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(&(rlw_pos as u32).to_be_bytes());
    out
}

/// git's on-disk stat data: ctime, mtime (seconds, nanoseconds), dev, ino, uid, gid, size.
fn stat_data(out: &mut Vec<u8>, mtime: u32, ino: u32, uid: u32, gid: u32, size: u32) {
    for v in [mtime, 0, mtime, 0, 0, ino, uid, gid, size] {
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// The directories of a tree as one walk of it finds them, parents before children: each
/// directory's path (no trailing slash; empty for the top) and the id of its `.gitignore`.
/// The walk that lists the index's entries fills it, so the tree is walked once.
pub struct TreeDirs {
    paths: Vec<Vec<u8>>,
    ignore: Vec<Option<Oid>>,
    by_path: HashMap<Vec<u8>, usize>,
}

impl Default for TreeDirs {
    fn default() -> Self {
        TreeDirs {
            paths: vec![Vec::new()],
            ignore: vec![None],
            by_path: HashMap::from([(Vec::new(), 0)]),
        }
    }
}

impl TreeDirs {
    /// Records the directory at `path`, found after its parent.
    pub fn add_dir(&mut self, path: Vec<u8>) {
        self.by_path.insert(path.clone(), self.paths.len());
        self.paths.push(path);
        self.ignore.push(None);
    }

    /// Records a tree entry found in directory `dir`: the directory's ignore file when it
    /// is a regular `.gitignore`.
    pub fn note_entry(&mut self, dir: &[u8], name: &[u8], mode: u32, oid: Oid) {
        if name == b".gitignore" && (mode == MODE_BLOB || mode == MODE_EXEC) {
            if let Some(&i) = self.by_path.get(dir) {
                self.ignore[i] = Some(oid);
            }
        }
    }

    /// The directories in git's order: pre-order, each directory's children sorted by name,
    /// byte-wise. Returns (index into `paths`, child count) pairs.
    fn git_order(&self) -> Vec<(usize, usize)> {
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); self.paths.len()];
        for (i, p) in self.paths.iter().enumerate().skip(1) {
            let parent = &p[..p.iter().rposition(|b| *b == b'/').unwrap_or(0)];
            if let Some(&pi) = self.by_path.get(parent) {
                children[pi].push(i);
            }
        }
        for c in children.iter_mut() {
            c.sort_by(|a, b| self.name(*a).cmp(self.name(*b)));
        }
        let mut order = Vec::with_capacity(self.paths.len());
        let mut stack = vec![0];
        while let Some(i) = stack.pop() {
            order.push((i, children[i].len()));
            stack.extend(children[i].iter().rev());
        }
        order
    }

    fn name(&self, i: usize) -> &[u8] {
        let p = &self.paths[i];
        &p[p.iter().rposition(|b| *b == b'/').map_or(0, |s| s + 1)..]
    }
}

/// The part of the extension that depends only on the base tree and the stat data the view
/// reports: from the directory count to the end. Cached with the index.
pub fn directories_part(dirs: &TreeDirs, stat: &IndexStat) -> Vec<u8> {
    let order = dirs.git_order();
    let mut out = Vec::new();
    encode_varint(order.len() as u64, &mut out);
    for &(d, children) in &order {
        encode_varint(0, &mut out); // untracked files: none in a fresh view
        encode_varint(children as u64, &mut out);
        out.extend_from_slice(dirs.name(d));
        out.push(0);
    }
    out.extend_from_slice(&ewah(&vec![true; order.len()])); // valid
    out.extend_from_slice(&ewah(&vec![false; order.len()])); // check-only
    let has_ignore: Vec<bool> = order
        .iter()
        .map(|&(d, _)| dirs.ignore[d].is_some())
        .collect();
    out.extend_from_slice(&ewah(&has_ignore));
    for &(d, _) in &order {
        stat_data(
            &mut out,
            stat.mtime,
            path_ino_low(&dirs.paths[d]),
            stat.uid,
            stat.gid,
            4096,
        );
    }
    for &(d, _) in &order {
        if let Some(oid) = dirs.ignore[d] {
            out.extend_from_slice(oid.as_bytes());
        }
    }
    out.push(0);
    out
}

/// `directories` (as `directories_part` writes it: every directory valid) with the
/// directories whose path `invalid` names marked not valid: git lists those again at its
/// next `git status` (and only those). None when it has another shape.
pub fn invalidate(directories: &[u8], mut invalid: impl FnMut(&[u8]) -> bool) -> Option<Vec<u8>> {
    let mut at = directories;
    let count = decode_varint(&mut at)? as usize;
    let names_start = directories.len() - at.len();
    // The directories in pre-order, with their paths from the child counts.
    let mut valid = Vec::with_capacity(count);
    let mut stack: Vec<(Vec<u8>, u64)> = Vec::new();
    for _ in 0..count {
        let untracked = decode_varint(&mut at)?;
        let children = decode_varint(&mut at)?;
        let nul = at.iter().position(|b| *b == 0)?;
        let name = &at[..nul];
        at = &at[nul + 1..];
        for _ in 0..untracked {
            let nul = at.iter().position(|b| *b == 0)?;
            at = &at[nul + 1..];
        }
        while stack.last().is_some_and(|(_, left)| *left == 0) {
            stack.pop();
        }
        let path = match stack.last_mut() {
            Some((parent, left)) => {
                *left -= 1;
                let mut p = parent.clone();
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(name);
                p
            }
            None => Vec::new(),
        };
        valid.push(!invalid(&path));
        stack.push((path, children));
    }
    let names_end = directories.len() - at.len();
    let all_valid = ewah(&vec![true; count]);
    let none = ewah(&vec![false; count]);
    let ewah_len = |d: &[u8]| -> Option<usize> {
        let words = u32::from_be_bytes(d.get(4..8)?.try_into().ok()?) as usize;
        Some(12 + 8 * words)
    };
    if !at.starts_with(&all_valid) || !at[all_valid.len()..].starts_with(&none) {
        return None;
    }
    at = &at[all_valid.len() + none.len()..];
    let has_ignore_len = ewah_len(at)?;
    let has_ignore = at.get(..has_ignore_len)?;
    at = &at[has_ignore_len..];
    const STAT: usize = 36;
    let stats = at.get(..count * STAT)?;
    let rest = &at[count * STAT..];
    let mut out = Vec::with_capacity(directories.len());
    out.extend_from_slice(&directories[..names_start]);
    out.extend_from_slice(&directories[names_start..names_end]);
    out.extend_from_slice(&ewah(&valid));
    out.extend_from_slice(&none);
    out.extend_from_slice(has_ignore);
    for (i, v) in valid.iter().enumerate() {
        if *v {
            out.extend_from_slice(&stats[i * STAT..(i + 1) * STAT]);
        }
    }
    out.extend_from_slice(rest);
    Some(out)
}

/// The object id git computes for an ignore file it reads from disk (`add_patterns` in
/// dir.c): the empty blob for an empty file, else the blob id of the content with a
/// newline appended (git appends one before hashing); none when it cannot be read.
fn ignore_file_oid(path: &Path) -> Option<Oid> {
    // Opened only when a regular file (a FIFO there would hold the creation).
    let mut content = crate::beneath::read_regular_following(path, 64 << 20).ok()??;
    if !content.is_empty() {
        content.push(b'\n');
    }
    Oid::hash_object(ObjectType::Blob, &content).ok()
}

/// `core.excludesFile` as git resolves it for the current user, else its default.
fn excludes_file() -> Option<std::path::PathBuf> {
    if let Ok(config) = git2::Config::open_default() {
        if let Ok(p) = config.get_path("core.excludesFile") {
            return Some(p);
        }
    }
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".config")))?;
    Some(xdg.join("git").join("ignore"))
}

/// The cache's ident, as git's `get_ident_string` makes it, with its length before it:
/// git uses the cache only where both the worktree path and the system name match.
fn push_ident(out: &mut Vec<u8>, worktree_path: &Path) {
    let sysname = nix::sys::utsname::uname()
        .map(|u| u.sysname().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "Linux".into());
    let mut ident =
        format!("Location {}, system {}", worktree_path.display(), sysname).into_bytes();
    ident.push(0);
    encode_varint(ident.len() as u64, out);
    out.extend_from_slice(&ident);
}

/// The whole `UNTR` extension for a worktree at `worktree_path` (as git will see it).
pub fn extension(worktree_path: &Path, common_dir: &Path, directories: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(directories.len() + 256);
    push_ident(&mut data, worktree_path);
    // Stat data of info/exclude and the excludes file: git compares only their ids.
    for _ in 0..2 {
        stat_data(&mut data, 0, 0, 0, 0, 0);
    }
    data.extend_from_slice(&DEFAULT_DIR_FLAGS.to_be_bytes());
    let null = [0u8; 20];
    let info_exclude = ignore_file_oid(&common_dir.join("info").join("exclude"));
    let global = excludes_file().and_then(|p| ignore_file_oid(&p));
    for oid in [info_exclude, global] {
        match oid {
            Some(o) => data.extend_from_slice(o.as_bytes()),
            None => data.extend_from_slice(&null),
        }
    }
    data.extend_from_slice(b".gitignore\0");
    data.extend_from_slice(directories);
    let mut ext = Vec::with_capacity(8 + data.len());
    ext.extend_from_slice(b"UNTR");
    ext.extend_from_slice(&(data.len() as u32).to_be_bytes());
    ext.extend_from_slice(&data);
    ext
}

/// `index` (as worktreefs writes it: version 2, then extensions) with the untracked
/// cache's ident naming `worktree_path`; None when the index has another shape or no such
/// extension.
pub fn retarget(index: &[u8], worktree_path: &Path) -> Option<Vec<u8>> {
    use sha1::Digest;
    if index.len() < 32 || &index[0..4] != b"DIRC" || index[4..8] != 2u32.to_be_bytes() {
        return None;
    }
    let count = u32::from_be_bytes(index[8..12].try_into().ok()?) as usize;
    let mut pos = 12;
    for _ in 0..count {
        let nul = index.get(pos + 62..)?.iter().position(|b| *b == 0)?;
        let len = 62 + nul;
        pos += len + (8 - len % 8);
    }
    let body_end = index.len() - 20;
    let mut out = index[..pos].to_vec();
    let mut found = false;
    while pos + 8 <= body_end {
        let sig = &index[pos..pos + 4];
        let len = u32::from_be_bytes(index[pos + 4..pos + 8].try_into().ok()?) as usize;
        let data = index.get(pos + 8..pos + 8 + len)?;
        if sig == b"UNTR" {
            let mut cursor = data;
            let ident_len = decode_varint(&mut cursor)? as usize;
            let rest = cursor.get(ident_len..)?;
            let mut new = Vec::with_capacity(data.len() + 64);
            push_ident(&mut new, worktree_path);
            new.extend_from_slice(rest);
            out.extend_from_slice(b"UNTR");
            out.extend_from_slice(&(new.len() as u32).to_be_bytes());
            out.extend_from_slice(&new);
            found = true;
        } else {
            out.extend_from_slice(&index[pos..pos + 8 + len]);
        }
        pos += 8 + len;
    }
    if !found || pos != body_end {
        return None;
    }
    let digest = sha1::Sha1::digest(&out);
    out.extend_from_slice(&digest);
    Some(out)
}

/// git's varint, read from the front of `data` (which then starts after it).
fn decode_varint(data: &mut &[u8]) -> Option<u64> {
    let mut i = 0;
    let mut c = *data.get(i)?;
    let mut val = (c & 127) as u64;
    while c & 128 != 0 {
        i += 1;
        c = *data.get(i)?;
        val = ((val + 1) << 7) + (c & 127) as u64;
    }
    *data = &data[i + 1..];
    Some(val)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_come_in_git_order_whatever_order_the_walk_found_them() {
        // A tree walk finds "a-b" and "a.b" before "a" (git sorts a tree's subtrees as
        // "a/"); the untracked cache lists each directory's children by bare name.
        let mut dirs = TreeDirs::default();
        for p in ["B", "a-b", "a.b", "a", "a/z", "a/b", "a/b/c"] {
            dirs.add_dir(p.as_bytes().to_vec());
        }
        let ignore = Oid::from_str("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391").unwrap();
        dirs.note_entry(b"a/b", b".gitignore", MODE_BLOB, ignore);
        dirs.note_entry(b"a", b".gitignore", crate::git::MODE_LINK, ignore); // a symlink: not read
        dirs.note_entry(b"B", b"other", MODE_BLOB, ignore);
        let order: Vec<(String, usize, bool)> = dirs
            .git_order()
            .into_iter()
            .map(|(d, n)| {
                let path = String::from_utf8(dirs.paths[d].clone()).unwrap();
                (path, n, dirs.ignore[d].is_some())
            })
            .collect();
        let want = [
            ("", 4, false),
            ("B", 0, false),
            ("a", 2, false),
            ("a/b", 1, true),
            ("a/b/c", 0, false),
            ("a/z", 0, false),
            ("a-b", 0, false),
            ("a.b", 0, false),
        ];
        let want: Vec<(String, usize, bool)> = want
            .iter()
            .map(|(p, n, i)| (p.to_string(), *n, *i))
            .collect();
        assert_eq!(order, want);
    }

    #[test]
    fn invalidating_directories_keeps_the_others_and_their_stat_data() {
        let mut dirs = TreeDirs::default();
        for p in ["a", "a/b", "c"] {
            dirs.add_dir(p.as_bytes().to_vec());
        }
        let ignore = Oid::from_str("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391").unwrap();
        dirs.note_entry(b"a/b", b".gitignore", MODE_BLOB, ignore);
        let stat = IndexStat {
            mtime: 7,
            uid: 1,
            gid: 2,
        };
        let part = directories_part(&dirs, &stat);
        assert_eq!(invalidate(&part, |_| false).unwrap(), part);
        let mut asked = Vec::new();
        let out = invalidate(&part, |p| {
            asked.push(String::from_utf8(p.to_vec()).unwrap());
            p == b"" || p == b"a/b"
        })
        .unwrap();
        assert_eq!(asked, ["", "a", "a/b", "c"]);
        // Two directories' stat data fewer, and a valid bitmap of its own.
        assert_eq!(
            out.len(),
            part.len() - 2 * 36 - ewah(&[true; 4]).len() + ewah(&[false, true, false, true]).len()
        );
        assert!(out
            .windows(ewah(&[false, true, false, true]).len())
            .any(|w| w == ewah(&[false, true, false, true])));
        assert!(invalidate(b"\x05", |_| true).is_none());
    }

    #[test]
    fn varints_match_git() {
        // Values and encodings from git's varint.c scheme.
        let cases: &[(u64, &[u8])] = &[
            (0, &[0]),
            (127, &[127]),
            (128, &[0x80, 0]),
            (255, &[0x80, 0x7f]),
            (16511, &[0xff, 0x7f]),
        ];
        for (v, want) in cases {
            let mut out = Vec::new();
            encode_varint(*v, &mut out);
            assert_eq!(&out[..], *want, "{v}");
            let mut cursor = &out[..];
            assert_eq!(decode_varint(&mut cursor), Some(*v));
            assert!(cursor.is_empty());
        }
    }

    #[test]
    fn ewah_layouts() {
        // Empty: one zero RLW.
        assert_eq!(
            ewah(&[]),
            [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        // 130 set bits: a run of two full words, then one literal word with two bits.
        let e = ewah(&[true; 130]);
        assert_eq!(&e[0..4], &130u32.to_be_bytes());
        assert_eq!(&e[4..8], &2u32.to_be_bytes());
        let rlw = u64::from_be_bytes(e[8..16].try_into().unwrap());
        assert_eq!(rlw & 1, 1);
        assert_eq!((rlw >> 1) & 0xffff_ffff, 2);
        assert_eq!(rlw >> 33, 1);
        assert_eq!(u64::from_be_bytes(e[16..24].try_into().unwrap()), 0b11);
        // Sparse: bit 3 of 10; the size ends at the last set bit, as git's does.
        let mut bits = vec![false; 10];
        bits[3] = true;
        let e = ewah(&bits);
        assert_eq!(&e[0..4], &4u32.to_be_bytes());
        assert_eq!(u64::from_be_bytes(e[16..24].try_into().unwrap()), 1 << 3);
        assert_eq!(ewah(&[false; 7]), ewah(&[]));
    }
}

#[cfg(test)]
mod retarget_tests {
    use super::*;
    use crate::git::{encode_index, IndexEntry};

    #[test]
    fn retarget_replaces_only_the_ident() {
        let entries = vec![IndexEntry {
            path: b"a".to_vec(),
            mode: MODE_BLOB,
            oid: Oid::hash_object(ObjectType::Blob, b"x").unwrap(),
            size: 1,
        }];
        let stat = IndexStat {
            mtime: 1,
            uid: 0,
            gid: 0,
        };
        let dirs = b"\x01\x00\x00\x00rest".to_vec();
        let ext = extension(Path::new("/old/place"), Path::new("/nonexistent"), &dirs);
        let index = encode_index(
            &entries,
            &stat,
            &[crate::git::fsmonitor::index_extension("t"), ext],
        );
        let moved = retarget(&index, Path::new("/new/somewhere/else")).unwrap();
        let want_ext = extension(
            Path::new("/new/somewhere/else"),
            Path::new("/nonexistent"),
            &dirs,
        );
        let want = encode_index(
            &entries,
            &stat,
            &[crate::git::fsmonitor::index_extension("t"), want_ext],
        );
        assert_eq!(moved, want);
        // Without the extension there is nothing to do.
        let plain = encode_index(&entries, &stat, &[]);
        assert!(retarget(&plain, Path::new("/x")).is_none());
    }
}
