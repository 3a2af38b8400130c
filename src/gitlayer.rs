//! The git layer: everything worktreefs asks of a repository.
//!
//! Reading base trees and blobs (through per-thread `git2::Repository` handles, so readers
//! never share a lock), resolving revisions, and writing what git needs to see a managed
//! worktree: the worktree's admin entry under `<gitdir>/worktrees/` and an index whose
//! stat data matches what the view reports.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use git2::{ObjectType, Oid, Repository};
use parking_lot::Mutex;
use sha1::{Digest, Sha1};

use crate::ino::path_ino_low;

pub const MODE_TREE: u32 = 0o040000;
pub const MODE_BLOB: u32 = 0o100644;
pub const MODE_EXEC: u32 = 0o100755;
pub const MODE_LINK: u32 = 0o120000;
pub const MODE_GITLINK: u32 = 0o160000;

thread_local! {
    static REPOS: RefCell<HashMap<PathBuf, Repository>> = RefCell::new(HashMap::new());
}

/// Runs `f` with this thread's handle on the repository at `gitdir`, opening it on first use.
pub fn with_repo<T>(
    gitdir: &Path,
    f: impl FnOnce(&Repository) -> Result<T, git2::Error>,
) -> Result<T, git2::Error> {
    REPOS.with(|cell| {
        let mut map = cell.borrow_mut();
        if !map.contains_key(gitdir) {
            let repo = Repository::open_bare(gitdir).or_else(|_| Repository::open(gitdir))?;
            map.insert(gitdir.to_path_buf(), repo);
        }
        let repo = map
            .get(gitdir)
            .ok_or_else(|| git2::Error::from_str("repo"))?;
        f(repo)
    })
}

#[derive(Debug, Clone)]
pub struct TreeEntry {
    pub name: OsString,
    pub mode: u32,
    pub oid: Oid,
}

/// One tree object, as the view needs it: entries in git order and a name index.
#[derive(Debug)]
pub struct TreeListing {
    pub entries: Vec<TreeEntry>,
    by_name: HashMap<OsString, usize>,
}

impl TreeListing {
    pub fn get(&self, name: &OsStr) -> Option<&TreeEntry> {
        self.by_name.get(name).map(|i| &self.entries[*i])
    }
}

/// Trees and blob sizes, shared by every worktree of every repository: both are keyed by
/// object id, which names the content.
#[derive(Default)]
pub struct ObjectCache {
    trees: Mutex<HashMap<Oid, Arc<TreeListing>>>,
    sizes: Mutex<HashMap<Oid, u64>>,
    seeded: Mutex<std::collections::HashSet<Oid>>,
}

impl ObjectCache {
    pub fn tree(&self, gitdir: &Path, oid: Oid) -> Result<Arc<TreeListing>, git2::Error> {
        if let Some(t) = self.trees.lock().get(&oid) {
            return Ok(t.clone());
        }
        let listing = with_repo(gitdir, |repo| {
            let tree = repo.find_tree(oid)?;
            let mut entries = Vec::with_capacity(tree.len());
            for e in tree.iter() {
                entries.push(TreeEntry {
                    name: OsStr::from_bytes(e.name_bytes()).to_os_string(),
                    mode: e.filemode() as u32,
                    oid: e.id(),
                });
            }
            Ok(entries)
        })?;
        let by_name = listing
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        let listing = Arc::new(TreeListing {
            entries: listing,
            by_name,
        });
        self.trees.lock().insert(oid, listing.clone());
        Ok(listing)
    }

    pub fn blob_size(&self, gitdir: &Path, oid: Oid) -> Result<u64, git2::Error> {
        if let Some(s) = self.sizes.lock().get(&oid) {
            return Ok(*s);
        }
        let size = with_repo(gitdir, |repo| {
            let odb = repo.odb()?;
            let (size, _kind) = odb.read_header(oid)?;
            Ok(size as u64)
        })?;
        self.sizes.lock().insert(oid, size);
        Ok(size)
    }

    /// Fills the size cache from an index worktreefs wrote for `tree` (in `index_cache`),
    /// so the first `git status` of a worktree does not read 100,000 object headers. Once
    /// per tree; a missing or unreadable index only means sizes come from the objects.
    pub fn seed_sizes_from_index_cache(&self, index_cache: &Path, tree: Oid) {
        if !self.seeded.lock().insert(tree) {
            return;
        }
        let prefix = format!("{tree}-");
        let Ok(rd) = fs::read_dir(index_cache) else {
            return;
        };
        let Some(path) = rd.flatten().map(|e| e.path()).find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&prefix) && n.ends_with(".index")
            })
        }) else {
            return;
        };
        match fs::read(&path) {
            Ok(bytes) => {
                let pairs = decode_index_sizes(&bytes);
                let mut sizes = self.sizes.lock();
                for (oid, size) in pairs {
                    sizes.insert(oid, size);
                }
            }
            Err(e) => tracing::debug!("no size seed from {}: {e}", path.display()),
        }
    }
}

/// (object id, size) of every regular file and symlink entry of an index in the layout
/// `encode_index` writes (version 2, no extensions). Stops at the first malformed entry.
pub fn decode_index_sizes(bytes: &[u8]) -> Vec<(Oid, u64)> {
    let mut out = Vec::new();
    if bytes.len() < 12 || &bytes[0..4] != b"DIRC" || bytes[4..8] != 2u32.to_be_bytes() {
        return out;
    }
    let count = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let mut pos = 12;
    for _ in 0..count {
        let Some(fixed) = bytes.get(pos..pos + 62) else {
            break;
        };
        let mode = u32::from_be_bytes([fixed[24], fixed[25], fixed[26], fixed[27]]);
        let size = u32::from_be_bytes([fixed[36], fixed[37], fixed[38], fixed[39]]);
        let Ok(oid) = Oid::from_bytes(&fixed[40..60]) else {
            break;
        };
        let Some(nul) = bytes[pos + 62..].iter().position(|b| *b == 0) else {
            break;
        };
        let len = 62 + nul;
        pos += len + (8 - len % 8);
        if mode != MODE_GITLINK {
            out.push((oid, size as u64));
        }
    }
    out
}

/// Reads a whole blob. Used to fill the blob cache, once per blob.
pub fn read_blob(gitdir: &Path, oid: Oid) -> Result<Vec<u8>, git2::Error> {
    with_repo(gitdir, |repo| {
        let odb = repo.odb()?;
        let obj = odb.read(oid)?;
        if obj.kind() != ObjectType::Blob {
            return Err(git2::Error::from_str("object is not a blob"));
        }
        Ok(obj.data().to_vec())
    })
}

/// The repository's common git directory and its work tree (None when bare).
pub fn discover(path: &Path) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let repo = Repository::open(path).with_context(|| {
        format!(
            "{} is not a git repository (or cannot be opened); pass the path of a repository's top directory",
            path.display()
        )
    })?;
    let common = common_dir(&repo);
    let common = fs::canonicalize(&common).unwrap_or(common);
    let workdir = repo
        .workdir()
        .map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
    Ok((common, workdir))
}

/// The common git directory (where refs, objects and `worktrees/` live), also when `repo`
/// was opened through a linked worktree.
pub fn common_dir(repo: &Repository) -> PathBuf {
    let path = repo.path().to_path_buf();
    match fs::read_to_string(path.join("commondir")) {
        Ok(rel) => {
            let joined = path.join(rel.trim());
            fs::canonicalize(&joined).unwrap_or(joined)
        }
        Err(_) => path,
    }
}

pub struct ResolvedBase {
    pub commit: Oid,
    pub tree: Oid,
    pub commit_time: i64,
}

pub fn resolve_base(repo: &Repository, rev: &str) -> anyhow::Result<ResolvedBase> {
    let obj = repo
        .revparse_single(rev)
        .map_err(|e| anyhow!("base revision '{rev}' does not resolve: {}", e.message()))?;
    let commit = obj
        .peel_to_commit()
        .map_err(|_| anyhow!("base revision '{rev}' does not name a commit"))?;
    let commit_time = commit.committer().when().seconds();
    Ok(ResolvedBase {
        commit: commit.id(),
        tree: commit.tree_id(),
        commit_time,
    })
}

/// One index entry, with the stat data the view will report for it.
pub struct IndexEntry {
    pub path: Vec<u8>,
    pub mode: u32,
    pub oid: Oid,
    pub size: u32,
}

/// Every blob, symlink and gitlink of `tree`, recursively, with sizes: from `known` (sizes
/// already learnt, e.g. from the index of a nearby commit) where it has them, else from the
/// object headers, read on two threads with their own repository handles.
pub fn index_entries(
    repo: &Repository,
    tree: Oid,
    known: &HashMap<Oid, u64>,
    dirs: &mut crate::untracked::TreeDirs,
) -> anyhow::Result<Vec<IndexEntry>> {
    // With no sizes known every blob's header is read: read the packs ahead at once, so
    // the walk's own tree reads find them too; otherwise once the walk has counted.
    let early = known.is_empty();
    if early {
        read_packs_ahead(repo.path());
    }
    let tree = repo.find_tree(tree)?;
    let mut out = Vec::new();
    let mut missing: Vec<usize> = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |root, entry| {
        let mode = entry.filemode() as u32;
        let mut path = root.as_bytes().to_vec();
        path.extend_from_slice(entry.name_bytes());
        if mode == MODE_TREE {
            dirs.add_dir(path);
            return git2::TreeWalkResult::Ok;
        }
        let dir = root.as_bytes();
        dirs.note_entry(
            dir.strip_suffix(b"/").unwrap_or(dir),
            entry.name_bytes(),
            mode,
            entry.id(),
        );
        let size = match (mode, known.get(&entry.id())) {
            (MODE_GITLINK, _) => 0,
            (_, Some(size)) => *size as u32,
            _ => {
                missing.push(out.len());
                0
            }
        };
        out.push(IndexEntry {
            path,
            mode,
            oid: entry.id(),
            size,
        });
        git2::TreeWalkResult::Ok
    })?;
    if !early && missing.len() >= READ_AHEAD_MIN_HEADERS {
        read_packs_ahead(repo.path());
    }
    if !missing.is_empty() {
        let gitdir = repo.path().to_path_buf();
        let oids: Vec<Oid> = missing.iter().map(|&i| out[i].oid).collect();
        let half = oids.len().div_ceil(2);
        let sizes: Vec<Result<Vec<u32>, git2::Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = oids
                .chunks(half.max(1))
                .map(|chunk| {
                    let gitdir = gitdir.clone();
                    scope.spawn(move || -> Result<Vec<u32>, git2::Error> {
                        let repo = Repository::open(&gitdir)?;
                        let odb = repo.odb()?;
                        chunk
                            .iter()
                            .map(|oid| odb.read_header(*oid).map(|(size, _)| size as u32))
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(git2::Error::from_str("header reader panicked")))
                })
                .collect()
        });
        let mut at = 0;
        for chunk in sizes {
            for size in chunk? {
                out[missing[at]].size = size;
                at += 1;
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Packs of at most this many bytes in all are read ahead when an index needs many
/// object headers.
const READ_AHEAD_LIMIT: u64 = 1 << 30;
/// How many object headers an index must need before the packs are read ahead.
const READ_AHEAD_MIN_HEADERS: usize = 10_000;

/// Asks the kernel to read the repository's packs into the page cache in the background
/// (`POSIX_FADV_WILLNEED`): building an index reads the header of every blob it does not
/// know, all over the packs, and with cold caches those reads are one random disk read
/// each, while the kernel reads a whole pack sequentially at the disk's speed. Skipped when
/// the packs are larger than `READ_AHEAD_LIMIT` in all (the page cache is not filled with
/// a big repository's history for one index).
fn read_packs_ahead(gitdir: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(dir) = fs::read_dir(gitdir.join("objects").join("pack")) else {
        return;
    };
    let packs: Vec<(PathBuf, u64)> = dir
        .flatten()
        .filter(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "pack" || x == "idx")
        })
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
        .collect();
    if packs.iter().map(|(_, len)| len).sum::<u64>() > READ_AHEAD_LIMIT {
        return;
    }
    for (path, len) in &packs {
        if let Ok(f) = fs::File::open(path) {
            // SAFETY: advice on a file descriptor this File owns; no memory is touched.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    0,
                    *len as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
    }
}

/// Stat data the view reports for untouched base entries of one worktree.
pub struct IndexStat {
    pub mtime: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Serializes an index (version 2) in git's format: header, entries sorted by path,
/// extensions, SHA-1. Written by hand so the stat fields are exactly what the view reports.
pub fn encode_index(entries: &[IndexEntry], stat: &IndexStat, extensions: &[Vec<u8>]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(12 + entries.len() * 96 + 20);
    buf.extend_from_slice(b"DIRC");
    buf.extend_from_slice(&2u32.to_be_bytes());
    buf.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        let start = buf.len();
        for v in [stat.mtime, 0, stat.mtime, 0, 0, path_ino_low(&e.path)] {
            buf.extend_from_slice(&v.to_be_bytes()); // ctime s/ns, mtime s/ns, dev, ino
        }
        let (uid, gid) = if e.mode == MODE_GITLINK {
            (0, 0)
        } else {
            (stat.uid, stat.gid)
        };
        for v in [e.mode, uid, gid, e.size] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        buf.extend_from_slice(e.oid.as_bytes());
        let flags = e.path.len().min(0xfff) as u16;
        buf.extend_from_slice(&flags.to_be_bytes());
        buf.extend_from_slice(&e.path);
        // 1 to 8 NULs so the entry length is a multiple of 8.
        let len = buf.len() - start;
        let pad = 8 - (len % 8);
        buf.extend(std::iter::repeat_n(0u8, pad));
    }
    for ext in extensions {
        buf.extend_from_slice(ext);
    }
    let digest = Sha1::digest(&buf);
    buf.extend_from_slice(&digest);
    buf
}

/// The SHA-1 of a long, fixed start, to be finished with different endings: the hash state
/// after the start's whole 64-byte blocks. A worktree's index is the cached index's body
/// (10 MB for 100,000 entries) followed by the worktree's own untracked cache and a
/// checksum of both; with this state kept next to the cached index, a creation hashes only
/// the body's last partial block and its own extension, and never reads the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sha1Prefix {
    state: [u32; 5],
    /// How many bytes `state` covers: a multiple of 64.
    len: u64,
}

impl Sha1Prefix {
    /// Length of `encode`'s output.
    pub const ENCODED_LEN: usize = 28;
    const INITIAL: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];

    /// The state after the whole 64-byte blocks of `data` (the rest is left to `finish`).
    pub fn of(data: &[u8]) -> Self {
        let mut state = Self::INITIAL;
        let len = data.len() / 64 * 64;
        Self::compress(&mut state, &data[..len]);
        Self {
            state,
            len: len as u64,
        }
    }

    /// Runs SHA-1's compression over `blocks`, a whole number of 64-byte blocks.
    fn compress(state: &mut [u32; 5], blocks: &[u8]) {
        for block in blocks.chunks_exact(64) {
            sha1::compress(
                state,
                std::slice::from_ref(sha1::digest::generic_array::GenericArray::from_slice(block)),
            );
        }
    }

    /// How many bytes of the start the state covers; the caller passes the bytes after
    /// them to `finish`.
    pub fn covered(&self) -> u64 {
        self.len
    }

    /// The SHA-1 of the covered bytes followed by `rest`, in order.
    pub fn finish(&self, rest: &[&[u8]]) -> [u8; 20] {
        let rest_len: usize = rest.iter().map(|r| r.len()).sum();
        let bits = (self.len + rest_len as u64) * 8;
        let mut tail = Vec::with_capacity(rest_len + 72);
        for r in rest {
            tail.extend_from_slice(r);
        }
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&bits.to_be_bytes());
        let mut state = self.state;
        Self::compress(&mut state, &tail);
        let mut out = [0u8; 20];
        for (o, v) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        for (o, v) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&v.to_be_bytes());
        }
        out[20..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Reads `encode`'s output back; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::ENCODED_LEN {
            return None;
        }
        let mut state = [0u32; 5];
        for (s, b) in state.iter_mut().zip(bytes.chunks_exact(4)) {
            *s = u32::from_be_bytes(b.try_into().ok()?);
        }
        let len = u64::from_be_bytes(bytes[20..].try_into().ok()?);
        (len % 64 == 0).then_some(Self { state, len })
    }
}

pub fn write_file_synced(path: &Path, content: &[u8]) -> std::io::Result<()> {
    write_synced(path, |f| f.write_all(content))
}

/// Writes a file through `write` into a temporary file next to `path`, fsyncs it and
/// renames it into place, so `path` is either absent or complete. The temporary name is
/// this writer's own (process, counter, time): two writers of one path (two creations caching
/// the same index) each rename a whole file, never one file both wrote into.
pub fn write_synced(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        "{TEMPORARY_MARK}{}-{n}-{nanos}",
        std::process::id()
    ));
    let tmp = path.with_file_name(name);
    // Only a file this writer created is removed on failure.
    let mut f = fs::File::create_new(&tmp)?;
    let result = write(&mut f).and_then(|_| f.sync_all()).and_then(|_| {
        drop(f);
        fs::rename(&tmp, path)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What `write_synced` puts in its temporary names.
pub const TEMPORARY_MARK: &str = ".worktreefs-tmp-";

/// Removes the temporary files `write_synced` left in `dir` more than an hour ago (a
/// process that died between writing and renaming).
pub fn sweep_temporaries(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old && e.file_name().to_string_lossy().contains(TEMPORARY_MARK) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Where git keeps a linked worktree's administrative files.
pub fn admin_dir(gitdir: &Path, admin_name: &str) -> PathBuf {
    gitdir.join("worktrees").join(admin_name)
}

/// Picks a free admin entry name for worktree `name`, the way git suffixes numbers.
pub fn free_admin_name(gitdir: &Path, name: &str) -> String {
    let base = format!("wtfs-{name}");
    if !admin_dir(gitdir, &base).exists() {
        return base;
    }
    (1..)
        .map(|i| format!("{base}{i}"))
        .find(|n| !admin_dir(gitdir, n).exists())
        .unwrap_or(base)
}

/// What the branch of a checked-out worktree is, for every worktree git knows of.
pub fn checked_out_branches(repo: &Repository) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(head) = repo.find_reference("HEAD") {
        if let Some(target) = head.symbolic_target() {
            out.push(("main worktree".to_string(), target.to_string()));
        }
    }
    let dir = common_dir(repo).join("worktrees");
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(head) = fs::read_to_string(e.path().join("HEAD")) {
                if let Some(r) = head.trim().strip_prefix("ref: ") {
                    out.push((e.file_name().to_string_lossy().into_owned(), r.to_string()));
                }
            }
        }
    }
    out
}

/// Writes the admin entry of a managed worktree: locked first, so that `git worktree prune`
/// never sees a half-made one.
pub fn write_admin_entry(
    dir: &Path,
    head: &str,
    worktree_gitfile: &Path,
    write_index: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
    lock_reason: &str,
) -> anyhow::Result<()> {
    if dir.exists() {
        bail!("git worktree entry {} already exists", dir.display());
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(dir.join("locked"), lock_reason)?;
    fs::write(dir.join("commondir"), "../..\n")?;
    fs::write(
        dir.join("gitdir"),
        format!("{}\n", worktree_gitfile.display()),
    )?;
    fs::write(dir.join("HEAD"), format!("{head}\n"))?;
    write_synced(&dir.join("index"), write_index)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_index_has_git_layout() {
        let entries = vec![IndexEntry {
            path: b"a.txt".to_vec(),
            mode: MODE_BLOB,
            oid: Oid::from_str("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391").unwrap(),
            size: 0,
        }];
        let buf = encode_index(
            &entries,
            &IndexStat {
                mtime: 1000,
                uid: 1,
                gid: 2,
            },
            &[],
        );
        assert_eq!(&buf[0..4], b"DIRC");
        // 12 header + (62 fixed + 5 name = 67, padded to 72) + 20 checksum.
        assert_eq!(buf.len(), 12 + 72 + 20);
        let body = &buf[..buf.len() - 20];
        assert_eq!(&buf[buf.len() - 20..], Sha1::digest(body).as_slice());
        assert_eq!(decode_index_sizes(&buf), vec![(entries[0].oid, 0)]);
    }

    /// The cached index sits among files named like it (its untracked cache, its saved
    /// hash state, a writer's temporary file); the sizes come from the index itself.
    #[test]
    fn sizes_are_seeded_from_the_cached_index_not_its_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Oid::hash_object(ObjectType::Tree, b"").unwrap();
        let entries: Vec<IndexEntry> = (0..20u32)
            .map(|i| IndexEntry {
                path: format!("f{i}").into_bytes(),
                mode: MODE_BLOB,
                oid: Oid::hash_object(ObjectType::Blob, &i.to_be_bytes()).unwrap(),
                size: 100 + i,
            })
            .collect();
        let stat = IndexStat {
            mtime: 1,
            uid: 0,
            gid: 0,
        };
        let key = format!("{tree}-1-0-0.fsmn");
        for neighbour in ["untr", "sha1", "index.worktreefs-tmp-1-0"] {
            fs::write(
                dir.path().join(format!("{key}.{neighbour}")),
                b"not an index",
            )
            .unwrap();
        }
        fs::write(
            dir.path().join(format!("{key}.index")),
            encode_index(&entries, &stat, &[]),
        )
        .unwrap();
        let cache = ObjectCache::default();
        cache.seed_sizes_from_index_cache(dir.path(), tree);
        let sizes = cache.sizes.lock();
        for e in &entries {
            assert_eq!(sizes.get(&e.oid), Some(&(e.size as u64)), "{:?}", e.path);
        }
    }

    #[test]
    fn only_temporary_files_older_than_an_hour_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let make = |name: &str, old: bool| {
            let f = fs::File::create(dir.path().join(name)).unwrap();
            if old {
                f.set_modified(two_hours_ago).unwrap();
            }
        };
        make("x.index.worktreefs-tmp-1-0-5", true);
        make("x.index.worktreefs-tmp-2-0-6", false);
        make("x.index", true);
        sweep_temporaries(dir.path());
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["x.index", "x.index.worktreefs-tmp-2-0-6"]);
    }

    /// Two creations at one commit may build and cache its index at the same time; a
    /// reader must only ever find a whole file, never a mix of the two writes.
    #[test]
    fn files_written_at_once_by_two_writers_are_always_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cached.index");
        let content: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mixed, seen) = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let (mut mixed, mut seen) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(read) = fs::read(&path) {
                        seen += 1;
                        mixed += (read != content) as usize;
                    }
                }
                (mixed, seen)
            });
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..40 {
                            // A writer may lose the rename to the other; what is there
                            // must still be whole.
                            let _ = write_file_synced(&path, &content);
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(seen > 0);
        assert_eq!(
            mixed, 0,
            "{mixed} of {seen} reads found a partial or mixed file"
        );
        assert_eq!(fs::read(&path).unwrap(), content);
    }

    #[test]
    fn a_sha1_prefix_finished_with_the_rest_is_the_sha1_of_the_whole() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for start in [0, 1, 63, 64, 65, 127, 128, 1000, 2999, 3000] {
            let prefix = Sha1Prefix::of(&data[..start]);
            assert_eq!(prefix.covered() % 64, 0);
            assert!(prefix.covered() as usize <= start && start - (prefix.covered() as usize) < 64);
            assert_eq!(Sha1Prefix::decode(&prefix.encode()), Some(prefix));
            let covered = prefix.covered() as usize;
            for split in [start, (start + 3000) / 2, 3000] {
                let got = prefix.finish(&[&data[covered..split], &data[split..]]);
                assert_eq!(
                    got.as_slice(),
                    Sha1::digest(&data).as_slice(),
                    "start {start} split {split}"
                );
            }
        }
        assert_eq!(Sha1Prefix::decode(&[0; 27]), None);
        let mut odd = Sha1Prefix::of(&data).encode();
        odd[27] = 1; // a length that is not whole blocks
        assert_eq!(Sha1Prefix::decode(&odd), None);
    }

    #[test]
    fn index_sizes_round_trip() {
        let entries: Vec<IndexEntry> = (0..50u32)
            .map(|i| IndexEntry {
                path: "x".repeat(i as usize + 1).into_bytes(),
                mode: if i == 7 { MODE_GITLINK } else { MODE_BLOB },
                oid: Oid::hash_object(ObjectType::Blob, &i.to_be_bytes()).unwrap(),
                size: i * 1000,
            })
            .collect();
        let buf = encode_index(
            &entries,
            &IndexStat {
                mtime: 1,
                uid: 0,
                gid: 0,
            },
            &[crate::fsmonitor::index_extension("t")],
        );
        let got = decode_index_sizes(&buf);
        let want: Vec<(Oid, u64)> = entries
            .iter()
            .filter(|e| e.mode != MODE_GITLINK)
            .map(|e| (e.oid, e.size as u64))
            .collect();
        assert_eq!(got, want);
    }
}
