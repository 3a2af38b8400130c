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

/// Reads a manifest written by `encode`.
pub fn decode(bytes: &[u8]) -> Result<Vec<Record>, String> {
    let rest = bytes
        .strip_prefix(HEADER)
        .ok_or("not a warm snapshot manifest (no header)")?;
    let mut fields = rest.split(|b| *b == 0);
    let mut out = Vec::new();
    while let Some(head) = fields.next() {
        if head.is_empty() {
            break;
        }
        let tab = head
            .iter()
            .position(|b| *b == b'\t')
            .ok_or("a record without a path")?;
        let (meta, path) = (&head[..tab], &head[tab + 1..]);
        let meta = std::str::from_utf8(meta).map_err(|_| "a record's fields are not text")?;
        let f: Vec<&str> = meta.split(' ').collect();
        let [kind, perm, size, sec, nsec, oid] = f[..] else {
            return Err(format!("a record with {} fields", f.len()));
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
            fields.next().ok_or_else(|| bad("link target"))?.to_vec()
        } else {
            Vec::new()
        };
        if path.is_empty()
            || path.starts_with(b"/")
            || path
                .split(|b| *b == b'/')
                .any(|c| c.is_empty() || c == b"." || c == b"..")
        {
            return Err(bad("path"));
        }
        out.push(Record {
            path: path.to_vec(),
            kind,
            perm: u32::from_str_radix(perm, 8).map_err(|_| bad("mode"))? & 0o7777,
            size: size.parse().map_err(|_| bad("size"))?,
            mtime: (
                sec.parse().map_err(|_| bad("time"))?,
                nsec.parse().map_err(|_| bad("time"))?,
            ),
            oid,
            target,
        });
    }
    Ok(out)
}

/// A directory of a snapshot.
#[derive(Debug)]
pub struct Dir {
    pub perm: u32,
    pub mtime: (i64, u32),
    /// By name, sorted.
    entries: Vec<(Box<[u8]>, Entry)>,
}

#[derive(Debug, Clone, Copy)]
enum Entry {
    Dir(u32),
    File(u32),
}

/// A file or symlink of a snapshot.
#[derive(Debug)]
pub struct File {
    pub perm: u32,
    pub size: u64,
    pub mtime: (i64, u32),
    pub oid: Oid,
    /// A symlink's target.
    pub link: Option<Box<[u8]>>,
}

impl File {
    /// Its git mode: a symlink, an executable or a plain file.
    pub fn mode(&self) -> u32 {
        match (&self.link, self.perm & 0o111) {
            (Some(_), _) => MODE_LINK,
            (None, 0) => MODE_BLOB,
            _ => MODE_EXEC,
        }
    }
}

/// A snapshot in memory, shared by every worktree made from it. A view names its
/// directories and files by number: `TreeEntry::warm` and `BaseRef::warm` hold the
/// number plus one (0: none), a directory's for `MODE_TREE`, a file's otherwise.
pub struct Snapshot {
    pub id: i64,
    dirs: Vec<Dir>,
    files: Vec<File>,
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
    /// 0755 and time `made`).
    pub fn build(id: i64, records: Vec<Record>, made: (i64, u32)) -> Snapshot {
        let mut dirs = vec![Dir {
            perm: 0o755,
            mtime: made,
            entries: Vec::new(),
        }];
        let mut files = Vec::new();
        let mut by_path: HashMap<Vec<u8>, u32> = HashMap::from([(Vec::new(), 0)]);
        fn dir_of(
            path: &[u8],
            dirs: &mut Vec<Dir>,
            by_path: &mut HashMap<Vec<u8>, u32>,
            made: (i64, u32),
        ) -> u32 {
            if let Some(&d) = by_path.get(path) {
                return d;
            }
            let (parent, name) = split(path);
            let p = dir_of(parent, dirs, by_path, made);
            let d = dirs.len() as u32;
            dirs.push(Dir {
                perm: 0o755,
                mtime: made,
                entries: Vec::new(),
            });
            dirs[p as usize].entries.push((name.into(), Entry::Dir(d)));
            by_path.insert(path.to_vec(), d);
            d
        }
        for r in records {
            match r.kind {
                Kind::Dir => {
                    let d = dir_of(&r.path, &mut dirs, &mut by_path, made);
                    dirs[d as usize].perm = r.perm;
                    dirs[d as usize].mtime = r.mtime;
                }
                Kind::File | Kind::Link => {
                    let (parent, name) = split(&r.path);
                    let p = dir_of(parent, &mut dirs, &mut by_path, made);
                    let f = files.len() as u32;
                    files.push(File {
                        perm: r.perm,
                        size: r.size,
                        mtime: r.mtime,
                        oid: r.oid.unwrap_or_else(no_tree),
                        link: (r.kind == Kind::Link).then(|| r.target.into_boxed_slice()),
                    });
                    dirs[p as usize].entries.push((name.into(), Entry::File(f)));
                }
            }
        }
        for d in &mut dirs {
            d.entries.sort_by(|a, b| a.0.cmp(&b.0));
            // A name recorded twice (a hand-edited manifest): the first stays.
            d.entries.dedup_by(|a, b| a.0 == b.0);
        }
        Snapshot {
            id,
            dirs,
            files,
            merged: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the manifest at `path`.
    pub fn load(id: i64, path: &Path) -> Result<Snapshot, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let made = std::fs::metadata(path)
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or((0, 0), |d| (d.as_secs() as i64, d.subsec_nanos()));
        let records = decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Snapshot::build(id, records, made))
    }

    /// The number (plus one) of the top directory.
    pub const ROOT: u32 = 1;

    pub fn dir(&self, warm: u32) -> Option<&Dir> {
        self.dirs.get((warm as usize).checked_sub(1)?)
    }

    pub fn file(&self, warm: u32) -> Option<&File> {
        self.files.get((warm as usize).checked_sub(1)?)
    }

    /// Every file's (content id, size), to seed the blob sizes the view asks for.
    pub fn sizes(&self) -> impl Iterator<Item = (Oid, u64)> + '_ {
        self.files
            .iter()
            .filter(|f| f.link.is_none())
            .map(|f| (f.oid, f.size))
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
            for (name, entry) in &dir.entries {
                let name = OsStr::from_bytes(name);
                if let Some(&i) = by_name.get(name) {
                    if let (Entry::Dir(d), MODE_TREE) = (entry, entries[i].mode) {
                        entries[i].warm = d + 1;
                    }
                    continue;
                }
                let e = match *entry {
                    Entry::Dir(d) => TreeEntry {
                        name: name.to_os_string(),
                        mode: MODE_TREE,
                        oid: no_tree(),
                        warm: d + 1,
                    },
                    Entry::File(f) => {
                        let file = &self.files[f as usize];
                        TreeEntry {
                            name: name.to_os_string(),
                            mode: file.mode(),
                            oid: file.oid,
                            warm: f + 1,
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
        for (name, entry) in &dir.entries {
            let mut p = prefix.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            match entry {
                Entry::Dir(d) => {
                    out.push((p.clone(), true));
                    self.walk(d + 1, &p, out);
                }
                Entry::File(_) => out.push((p, false)),
            }
        }
    }

    /// The entry `name` of directory `warm`: (is a directory, number + 1).
    pub fn child(&self, warm: u32, name: &[u8]) -> Option<(bool, u32)> {
        let dir = self.dir(warm)?;
        let i = dir.entries.binary_search_by(|e| (*e.0).cmp(name)).ok()?;
        Some(match dir.entries[i].1 {
            Entry::Dir(d) => (true, d + 1),
            Entry::File(f) => (false, f + 1),
        })
    }

    /// The entry at `path` (`/`-separated) below the top: (is a directory, number + 1).
    pub fn find(&self, path: &[u8]) -> Option<(bool, u32)> {
        let mut at = Self::ROOT;
        if path.is_empty() {
            return Some((true, at));
        }
        let mut parts = path.split(|b| *b == b'/').peekable();
        while let Some(part) = parts.next() {
            let dir = self.dir(at)?;
            let i = dir.entries.binary_search_by(|e| (*e.0).cmp(part)).ok()?;
            match dir.entries[i].1 {
                Entry::Dir(d) => at = d + 1,
                Entry::File(f) => {
                    return parts.peek().is_none().then_some((false, f + 1));
                }
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
        let snap = Snapshot::build(
            1,
            vec![
                rec("src/gen.rs", Kind::File, 0o644),
                rec("README", Kind::File, 0o600),
                rec(".env", Kind::File, 0o600),
                rec("bin/tool", Kind::File, 0o755),
            ],
            (1, 0),
        );
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
}
