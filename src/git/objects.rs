//! Reading base trees and blobs, through per-thread `git2::Repository` handles so readers
//! never share a lock, with caches of trees and blob sizes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use git2::{ObjectType, Oid, Repository};
use parking_lot::Mutex;

use super::index::decode_index_sizes;

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
    /// Where a warm snapshot's entry (`git::warm`): its number plus one; 0 for git's.
    pub warm: u32,
}

/// One tree object, as the view needs it: entries in git order and a name index.
#[derive(Debug)]
pub struct TreeListing {
    pub entries: Vec<TreeEntry>,
    by_name: HashMap<OsString, usize>,
}

impl TreeListing {
    pub fn from_entries(entries: Vec<TreeEntry>) -> TreeListing {
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        TreeListing { entries, by_name }
    }

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
                    warm: 0,
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
        let converted = super::checkout::converted_oids_beside(&path);
        match fs::read(&path) {
            Ok(bytes) => {
                let pairs = decode_index_sizes(&bytes);
                let mut sizes = self.sizes.lock();
                for (oid, size) in pairs {
                    if !converted.contains(&oid) {
                        sizes.insert(oid, size);
                    }
                }
            }
            Err(e) => tracing::debug!("no size seed from {}: {e}", path.display()),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::index::{encode_index, IndexEntry, IndexStat};
    use crate::git::MODE_BLOB;

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
}
