//! The walk of a base tree that lists the index's entries and, in the same pass, the
//! directories git's untracked cache needs.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::index::IndexEntry;
use super::{MODE_GITLINK, MODE_TREE};

/// Every blob, symlink and gitlink of `tree`, recursively, with sizes: from `known` (sizes
/// already learnt, e.g. from the index of a nearby commit) where it has them, else from the
/// object headers, read on two threads with their own repository handles.
pub fn index_entries(
    repo: &Repository,
    tree: Oid,
    known: &HashMap<Oid, u64>,
    dirs: &mut crate::git::untracked::TreeDirs,
) -> super::GitResult<Vec<IndexEntry>> {
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
        // Opened only when a regular file (a FIFO named so would hold the creation).
        if let Ok(Some(f)) = crate::beneath::open_regular_following(path) {
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
