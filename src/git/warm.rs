//! A warm snapshot: the ignored and untracked files of a repository's source checkout that
//! new worktrees inherit (`.worktreeinclude`, `repo add|set --include`), as one manifest
//! file, and in memory as the directory tree the view merges under its base tree.
//!
//! The manifest (`<state>/warm/<id>`) is a header line `worktreefs-warm 1` and one record
//! per entry, parents before children:
//!
//! ```text
//! <kind d|f|l> SP <perm, octal> SP <size> SP <mtime s> SP <mtime ns> SP <oid or -> TAB <path> NUL
//! ```
//!
//! A file's content is in the blob cache under its git blob id (shared with the base
//! files of every worktree: one copy of each content); a symlink's oid names its target
//! text, which the record's path is followed by (`<target> NUL`). Paths hold no NUL (git
//! paths cannot), so the format needs no quoting.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use git2::Oid;
use parking_lot::Mutex;

use super::objects::{TreeEntry, TreeListing};
use super::{MODE_BLOB, MODE_EXEC, MODE_LINK, MODE_TREE};

const HEADER: &[u8] = b"worktreefs-warm 1\n";

/// One entry of a snapshot, as taken and as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub path: Vec<u8>,
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub perm: u32,
    pub size: u64,
    pub mtime: (i64, u32),
    /// Files: the content's blob id. Symlinks: the target's.
    pub oid: Option<Oid>,
    /// Symlinks: the target text.
    pub target: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
}

/// Writes `records` (parents before children) as the manifest text.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut out = HEADER.to_vec();
    for r in records {
        let kind = match r.kind {
            Kind::Dir => 'd',
            Kind::File => 'f',
            Kind::Link => 'l',
        };
        let oid = r.oid.map_or_else(|| "-".to_string(), |o| o.to_string());
        let _ = write!(
            out,
            "{kind} {:o} {} {} {} {oid}\t",
            r.perm, r.size, r.mtime.0, r.mtime.1
        );
        out.extend_from_slice(&r.path);
        out.push(0);
        if r.kind == Kind::Link {
            out.extend_from_slice(&r.target);
            out.push(0);
        }
    }
    out
}

/// One entry of a manifest as read, borrowing its bytes (`Record` owns its own).
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    pub path: &'a [u8],
    pub kind: Kind,
    pub perm: u32,
    pub size: u64,
    pub mtime: (i64, u32),
    pub oid: Option<Oid>,
    pub target: &'a [u8],
}

impl Record {
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            path: &self.path,
            kind: self.kind,
            perm: self.perm,
            size: self.size,
            mtime: self.mtime,
            oid: self.oid,
            target: &self.target,
        }
    }
}

/// Reads a manifest written by `encode`.
pub fn decode(bytes: &[u8]) -> Result<Vec<Record>, String> {
    parse(bytes)?
        .map(|r| {
            r.map(|r| Record {
                path: r.path.to_vec(),
                kind: r.kind,
                perm: r.perm,
                size: r.size,
                mtime: r.mtime,
                oid: r.oid,
                target: r.target.to_vec(),
            })
        })
        .collect()
}

/// The records of a manifest, one at a time, without copying their paths.
pub fn parse(bytes: &[u8]) -> Result<impl Iterator<Item = Result<RecordRef<'_>, String>>, String> {
    let rest = bytes
        .strip_prefix(HEADER)
        .ok_or("not a warm snapshot manifest (no header)")?;
    let mut fields = rest.split(|b| *b == 0);
    Ok(std::iter::from_fn(move || {
        let head = fields.next().filter(|h| !h.is_empty())?;
        Some(record(head, &mut fields))
    }))
}

fn record<'a>(
    head: &'a [u8],
    fields: &mut impl Iterator<Item = &'a [u8]>,
) -> Result<RecordRef<'a>, String> {
    let tab = head
        .iter()
        .position(|b| *b == b'\t')
        .ok_or("a record without a path")?;
    let (meta, path) = (&head[..tab], &head[tab + 1..]);
    let meta = std::str::from_utf8(meta).map_err(|_| "a record's fields are not text")?;
    let mut f = meta.split(' ');
    let mut next = || f.next();
    let (Some(kind), Some(perm), Some(size), Some(sec), Some(nsec), Some(oid), None) =
        (next(), next(), next(), next(), next(), next(), next())
    else {
        return Err(format!("a record with {} fields", meta.split(' ').count()));
    };
    let bad = |what: &str| format!("record {}: bad {what}", String::from_utf8_lossy(path));
    let kind = match kind {
        "d" => Kind::Dir,
        "f" => Kind::File,
        "l" => Kind::Link,
        _ => return Err(bad("kind")),
    };
    let oid = match oid {
        "-" => None,
        hex => Some(Oid::from_str(hex).map_err(|_| bad("object id"))?),
    };
    let target = if kind == Kind::Link {
        fields.next().ok_or_else(|| bad("link target"))?
    } else {
        &[][..]
    };
    if path.is_empty()
        || path.starts_with(b"/")
        || path
            .split(|b| *b == b'/')
            .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return Err(bad("path"));
    }
    Ok(RecordRef {
        path,
        kind,
        perm: u32::from_str_radix(perm, 8).map_err(|_| bad("mode"))? & 0o7777,
        size: size.parse().map_err(|_| bad("size"))?,
        mtime: (
            sec.parse().map_err(|_| bad("time"))?,
            nsec.parse().map_err(|_| bad("time"))?,
        ),
        oid,
        target,
    })
}

/// A directory of a snapshot.
#[derive(Debug)]
pub struct Dir {
    pub perm: u32,
    pub mtime: (i64, u32),
    /// Its entries: `Snapshot::entries[start..start + len]`, sorted by name.
    start: u32,
    len: u32,
}

/// A directory entry: its name (`Snapshot::names[name..name + name_len]`) and what it
/// names (`DIR_BIT` set: a directory's number, else a file's).
#[derive(Debug, Clone, Copy)]
struct Entry {
    name: u32,
    name_len: u32,
    what: u32,
}

const DIR_BIT: u32 = 1 << 31;

impl Entry {
    /// What it names: (is a directory, number + 1).
    fn target(&self) -> (bool, u32) {
        (self.what & DIR_BIT != 0, (self.what & !DIR_BIT) + 1)
    }
}

/// A file or symlink of a snapshot.
#[derive(Debug)]
pub struct File {
    pub perm: u32,
    pub size: u64,
    pub mtime: (i64, u32),
    pub oid: Oid,
    /// A symlink's target: its number in `Snapshot::links` plus one; 0 for a file.
    link: u32,
}

impl File {
    /// Its git mode: a symlink, an executable or a plain file.
    pub fn mode(&self) -> u32 {
        match (self.is_link(), self.perm & 0o111) {
            (true, _) => MODE_LINK,
            (false, 0) => MODE_BLOB,
            _ => MODE_EXEC,
        }
    }

    pub fn is_link(&self) -> bool {
        self.link != 0
    }
}

/// A snapshot in memory, shared by every worktree made from it. A view names its
/// directories and files by number: `TreeEntry::warm` and `BaseRef::warm` hold the
/// number plus one (0: none), a directory's for `MODE_TREE`, a file's otherwise.
///
/// Compact, since a snapshot of a dependency tree holds tens of thousands of files: the
/// entries of all directories in one array, their names in one buffer, a file in 56
/// bytes.
pub struct Snapshot {
    pub id: i64,
    dirs: Vec<Dir>,
    files: Vec<File>,
    entries: Vec<Entry>,
    names: Vec<u8>,
    links: Vec<Box<[u8]>>,
    /// Merged listings (a base tree's entries with this snapshot's directory below them),
    /// by (tree, directory).
    merged: Mutex<HashMap<(Oid, u32), Arc<TreeListing>>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Snapshot({}, {} dirs, {} files)",
            self.id,
            self.dirs.len(),
            self.files.len()
        )
    }
}

/// The id a tree entry has for a directory only the snapshot holds (no git tree).
pub fn no_tree() -> Oid {
    Oid::zero()
}

impl Snapshot {
    /// Builds the tree of `records` (a parent missing from the records is made with mode
    /// 0755 and time `made`). Refused past 2^31 entries or 4 GiB of names (the numbers and
    /// offsets are 32-bit).
    pub fn build<'a, E: From<String>>(
        id: i64,
        records: impl IntoIterator<Item = Result<RecordRef<'a>, E>>,
        made: (i64, u32),
    ) -> Result<Snapshot, E> {
        let mut dirs = vec![Dir {
            perm: 0o755,
            mtime: made,
            start: 0,
            len: 0,
        }];
        let mut files = Vec::new();
        let mut links = Vec::new();
        let mut names = Vec::new();
        // Each directory's entries while they are gathered, then laid out one after the
        // other.
        let mut children: Vec<Vec<Entry>> = vec![Vec::new()];
        let mut by_path: HashMap<&'a [u8], u32> = HashMap::from([(&[][..], 0)]);
        #[allow(clippy::too_many_arguments)]
        fn dir_of<'a>(
            path: &'a [u8],
            dirs: &mut Vec<Dir>,
            children: &mut Vec<Vec<Entry>>,
            names: &mut Vec<u8>,
            by_path: &mut HashMap<&'a [u8], u32>,
            made: (i64, u32),
        ) -> u32 {
            if let Some(&d) = by_path.get(path) {
                return d;
            }
            let (parent, name) = split(path);
            let p = dir_of(parent, dirs, children, names, by_path, made);
            let d = dirs.len() as u32;
            dirs.push(Dir {
                perm: 0o755,
                mtime: made,
                start: 0,
                len: 0,
            });
            children.push(Vec::new());
            let e = entry(names, name, d | DIR_BIT);
            children[p as usize].push(e);
            by_path.insert(path, d);
            d
        }
        fn entry(names: &mut Vec<u8>, name: &[u8], what: u32) -> Entry {
            let e = Entry {
                name: names.len() as u32,
                name_len: name.len() as u32,
                what,
            };
            names.extend_from_slice(name);
            e
        }
        for r in records {
            let r = r?;
            // A record adds at most one entry and one name per part of its path.
            if dirs.len() + files.len() + r.path.len() >= DIR_BIT as usize
                || names.len() + r.path.len() >= u32::MAX as usize
            {
                return Err(E::from(format!(
                    "more than a snapshot can hold ({} directories, {} files, {} bytes of names)",
                    dirs.len(),
                    files.len(),
                    names.len()
                )));
            }
            match r.kind {
                Kind::Dir => {
                    let d = dir_of(
                        r.path,
                        &mut dirs,
                        &mut children,
                        &mut names,
                        &mut by_path,
                        made,
                    );
                    dirs[d as usize].perm = r.perm;
                    dirs[d as usize].mtime = r.mtime;
                }
                Kind::File | Kind::Link => {
                    let (parent, name) = split(r.path);
                    let p = dir_of(
                        parent,
                        &mut dirs,
                        &mut children,
                        &mut names,
                        &mut by_path,
                        made,
                    );
                    let f = files.len() as u32;
                    let link = match r.kind {
                        Kind::Link => {
                            links.push(r.target.into());
                            links.len() as u32
                        }
                        _ => 0,
                    };
                    files.push(File {
                        perm: r.perm,
                        size: r.size,
                        mtime: r.mtime,
                        oid: r.oid.unwrap_or_else(no_tree),
                        link,
                    });
                    let e = entry(&mut names, name, f);
                    children[p as usize].push(e);
                }
            }
        }
        drop(by_path);
        let name_of = |e: &Entry| &names[e.name as usize..(e.name + e.name_len) as usize];
        let mut entries = Vec::with_capacity(children.iter().map(Vec::len).sum());
        for (d, mut list) in children.into_iter().enumerate() {
            list.sort_by(|a, b| name_of(a).cmp(name_of(b)));
            // A name recorded twice (a hand-edited manifest): the first stays.
            list.dedup_by(|a, b| name_of(a) == name_of(b));
            dirs[d].start = entries.len() as u32;
            dirs[d].len = list.len() as u32;
            entries.extend_from_slice(&list);
        }
        files.shrink_to_fit();
        dirs.shrink_to_fit();
        names.shrink_to_fit();
        Ok(Snapshot {
            id,
            dirs,
            files,
            entries,
            names,
            links,
            merged: Mutex::new(HashMap::new()),
        })
    }

    /// Reads the manifest at `path`.
    pub fn load(id: i64, path: &Path) -> Result<Snapshot, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let made = std::fs::metadata(path)
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or((0, 0), |d| (d.as_secs() as i64, d.subsec_nanos()));
        let at = |e: String| format!("{}: {e}", path.display());
        let snap = Snapshot::build(id, parse(&bytes).map_err(at)?, made).map_err(at);
        snap
    }

    /// The number (plus one) of the top directory.
    pub const ROOT: u32 = 1;

    /// The bytes its tree takes in memory (the merged listings aside: those stand for the
    /// tree listings a plain worktree's base would have cached).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.dirs.capacity() * size_of::<Dir>()
            + self.files.capacity() * size_of::<File>()
            + self.entries.capacity() * size_of::<Entry>()
            + self.names.capacity()
            + self.links.capacity() * size_of::<Box<[u8]>>()
            + self.links.iter().map(|l| l.len()).sum::<usize>()
    }

    pub fn dir(&self, warm: u32) -> Option<&Dir> {
        self.dirs.get((warm as usize).checked_sub(1)?)
    }

    pub fn file(&self, warm: u32) -> Option<&File> {
        self.files.get((warm as usize).checked_sub(1)?)
    }

    /// A symlink's target.
    pub fn link(&self, f: &File) -> Option<&[u8]> {
        self.links
            .get((f.link as usize).checked_sub(1)?)
            .map(|l| &l[..])
    }

    fn name(&self, e: &Entry) -> &[u8] {
        &self.names[e.name as usize..(e.name + e.name_len) as usize]
    }

    /// The entries of `dir`, by name: (name, is a directory, number + 1).
    fn entries_of<'s>(&'s self, dir: &Dir) -> impl Iterator<Item = (&'s [u8], bool, u32)> + 's {
        self.list(dir).iter().map(|e| {
            let (is_dir, n) = e.target();
            (self.name(e), is_dir, n)
        })
    }

    fn list(&self, dir: &Dir) -> &[Entry] {
        &self.entries[dir.start as usize..(dir.start + dir.len) as usize]
    }

    /// The entry `name` of directory `warm`: (is a directory, number + 1).
    pub fn child(&self, warm: u32, name: &[u8]) -> Option<(bool, u32)> {
        let list = self.list(self.dir(warm)?);
        let i = list.binary_search_by(|e| self.name(e).cmp(name)).ok()?;
        Some(list[i].target())
    }

    /// The listing of a view's directory: the base tree's entries (`base`, the tree
    /// `tree`; none where only the snapshot has the directory) and, where the base has no
    /// entry of the name, the snapshot directory `warm`'s. A tracked entry always wins: an
    /// inherited file never stands in for a tracked one; a directory both have is merged.
    pub fn merged(&self, tree: Oid, base: Option<&TreeListing>, warm: u32) -> Arc<TreeListing> {
        if let Some(l) = self.merged.lock().get(&(tree, warm)) {
            return l.clone();
        }
        let mut entries: Vec<TreeEntry> = base.map(|b| b.entries.clone()).unwrap_or_default();
        let mut by_name: HashMap<OsString, usize> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        if let Some(dir) = self.dir(warm) {
            for (name, is_dir, n) in self.entries_of(dir) {
                let name = OsStr::from_bytes(name);
                if let Some(&i) = by_name.get(name) {
                    if is_dir && entries[i].mode == MODE_TREE {
                        entries[i].warm = n;
                    }
                    continue;
                }
                let e = match is_dir {
                    true => TreeEntry {
                        name: name.to_os_string(),
                        mode: MODE_TREE,
                        oid: no_tree(),
                        warm: n,
                    },
                    false => {
                        let file = &self.files[n as usize - 1];
                        TreeEntry {
                            name: name.to_os_string(),
                            mode: file.mode(),
                            oid: file.oid,
                            warm: n,
                        }
                    }
                };
                by_name.insert(e.name.clone(), entries.len());
                entries.push(e);
            }
        }
        let listing = Arc::new(TreeListing::from_entries(entries));
        self.merged.lock().insert((tree, warm), listing.clone());
        listing
    }

    /// Every path of the snapshot below directory `warm` (`prefix/` its path), for
    /// inspection: (path, whether it is a directory).
    pub fn walk(&self, warm: u32, prefix: &[u8], out: &mut Vec<(Vec<u8>, bool)>) {
        let Some(dir) = self.dir(warm) else { return };
        for (name, is_dir, n) in self.entries_of(dir) {
            let mut p = prefix.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            out.push((p.clone(), is_dir));
            if is_dir {
                self.walk(n, &p, out);
            }
        }
    }

    /// The entry at `path` (`/`-separated) below the top: (is a directory, number + 1).
    pub fn find(&self, path: &[u8]) -> Option<(bool, u32)> {
        let mut at = Self::ROOT;
        if path.is_empty() {
            return Some((true, at));
        }
        let mut parts = path.split(|b| *b == b'/').peekable();
        while let Some(part) = parts.next() {
            match self.child(at, part)? {
                (true, d) => at = d,
                (false, f) => return parts.peek().is_none().then_some((false, f)),
            }
        }
        Some((true, at))
    }
}

fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[][..], path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(path: &str, kind: Kind, perm: u32) -> Record {
        Record {
            path: path.as_bytes().to_vec(),
            kind,
            perm,
            size: 3,
            mtime: (1_700_000_000, 5),
            oid: (kind != Kind::Dir)
                .then(|| Oid::hash_object(git2::ObjectType::Blob, path.as_bytes()).unwrap()),
            target: if kind == Kind::Link {
                b"../x".to_vec()
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn the_manifest_reads_back_as_written() {
        let records = vec![
            rec("node_modules", Kind::Dir, 0o755),
            rec("node_modules/a b\tc", Kind::File, 0o644),
            rec("node_modules/bin", Kind::Link, 0o777),
            rec(".env", Kind::File, 0o600),
            rec("run.sh", Kind::File, 0o755),
        ];
        assert_eq!(decode(&encode(&records)).unwrap(), records);
        assert!(decode(b"nonsense").is_err());
        let mut bad = encode(&records[..1]);
        bad.extend_from_slice(b"f 644 1 0 0 -\t../etc/passwd\0");
        assert!(decode(&bad).unwrap_err().contains("bad path"), "{bad:?}");
    }

    #[test]
    fn a_tracked_entry_wins_and_directories_merge() {
        let records = [
            rec("src/gen.rs", Kind::File, 0o644),
            rec("README", Kind::File, 0o600),
            rec(".env", Kind::File, 0o600),
            rec("bin/tool", Kind::File, 0o755),
        ];
        let snap = Snapshot::build(
            1,
            records.iter().map(|r| Ok::<_, String>(r.as_ref())),
            (1, 0),
        )
        .unwrap();
        let tracked = |name: &str, mode| TreeEntry {
            name: name.into(),
            mode,
            oid: Oid::hash_object(git2::ObjectType::Blob, b"t").unwrap(),
            warm: 0,
        };
        let base = TreeListing::from_entries(vec![
            tracked("README", MODE_BLOB),
            tracked("src", MODE_TREE),
        ]);
        let m = snap.merged(Oid::zero(), Some(&base), Snapshot::ROOT);
        let get = |n: &str| m.get(OsStr::new(n)).unwrap().clone();
        assert_eq!(get("README").warm, 0, "the tracked README wins");
        let src = get("src");
        assert_eq!((src.mode, src.warm != 0), (MODE_TREE, true));
        assert_eq!(get(".env").mode, MODE_BLOB);
        assert!(snap.file(get(".env").warm).unwrap().perm == 0o600);
        let bin = get("bin");
        assert_eq!((bin.mode, bin.oid), (MODE_TREE, no_tree()));
        let below = snap.merged(no_tree(), None, bin.warm);
        assert_eq!(below.get(OsStr::new("tool")).unwrap().mode, MODE_EXEC);
        assert_eq!(snap.find(b"bin/tool").map(|f| f.0), Some(false));
        assert_eq!(snap.find(b"bin/tool/x"), None);
        assert_eq!(snap.find(b"src").map(|f| f.0), Some(true));
        let mut all = Vec::new();
        snap.walk(Snapshot::ROOT, b"", &mut all);
        assert_eq!(all.len(), 6, "{all:?}");
    }

    /// Ten warm worktrees may cost only a few MB beyond ten plain ones: the
    /// snapshot is the one thing they add, so it must stay small per file.
    #[test]
    fn a_snapshot_holds_a_file_in_under_eighty_bytes_plus_its_name() {
        let mut records = Vec::new();
        for p in 0..300 {
            records.push(rec(&format!("node_modules/pkg{p:03}"), Kind::Dir, 0o755));
            for f in 0..100 {
                records.push(rec(
                    &format!("node_modules/pkg{p:03}/f{f:05}.js"),
                    Kind::File,
                    0o644,
                ));
            }
        }
        let snap = Snapshot::build(
            1,
            records.iter().map(|r| Ok::<_, String>(r.as_ref())),
            (1, 0),
        )
        .unwrap();
        assert_eq!(snap.files.len(), 30_000);
        let names: usize = records
            .iter()
            .map(|r| r.path.rsplit(|b| *b == b'/').next().unwrap().len())
            .sum();
        let per_file = (snap.heap_bytes() - names) / 30_000;
        assert!(per_file < 80, "{per_file} bytes a file");
        assert_eq!(
            snap.find(b"node_modules/pkg123/f00042.js").map(|f| f.0),
            Some(false)
        );
    }
}
