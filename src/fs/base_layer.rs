//! A worktree's base: the tree of its base commit in its repository, the warm snapshot
//! below it (`new --warm`) and the files a checkout converts. The rest of the view asks
//! the base for an entry's listing, size, link target, snapshot record or conversion and
//! never looks at the three parts itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use git2::Oid;

use super::error::{FsError, FsResult};
use super::overlay::{BaseRef, Overlay};
use super::types::FType;
use crate::git::checkout::Conversions;
use crate::git::convert::Conv;
use crate::git::objects::ObjectCache;
use crate::git::warm::{self, Snapshot};
use crate::git::{self, MODE_TREE};

/// What a warm snapshot gives one of its entries: the size (a symlink's target's length,
/// a directory's 4096), the mode bits and the modification time (seconds, nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Inherited {
    pub(super) size: u64,
    pub(super) perm: u32,
    pub(super) mtime: (i64, u32),
}

/// A base file's conversion: what, for which path, and the cache key of its result.
#[derive(Debug, Clone)]
pub(super) struct Converted {
    pub(super) conv: Conv,
    pub(super) path: Vec<u8>,
    pub(super) key: Oid,
}

#[derive(Debug)]
pub(super) struct Base {
    /// The repository whose objects it reads.
    pub(super) gitdir: PathBuf,
    pub(super) tree: Oid,
    /// The time base entries show (the base commit's).
    pub(super) mtime: SystemTime,
    /// The warm snapshot below its tree, shared by every worktree of it.
    warm: Option<Arc<Snapshot>>,
    /// The base files a checkout converts (none for most repositories).
    conversions: Option<Arc<Conversions>>,
    /// Whether blob sizes were seeded from the cached index of the base tree.
    sizes_seeded: AtomicBool,
}

impl Base {
    pub(super) fn new(
        gitdir: PathBuf,
        tree: Oid,
        mtime: SystemTime,
        warm: Option<Arc<Snapshot>>,
        conversions: Option<Arc<Conversions>>,
    ) -> Base {
        Base {
            gitdir,
            tree,
            mtime,
            warm,
            conversions,
            sizes_seeded: AtomicBool::new(false),
        }
    }

    /// Whether a checkout converts any of its files.
    pub(super) fn converts(&self) -> bool {
        self.conversions.is_some()
    }

    /// The base entry of its root directory.
    pub(super) fn root(&self) -> BaseRef {
        BaseRef {
            oid: self.tree,
            mode: MODE_TREE,
            warm: match self.warm {
                Some(_) => Snapshot::ROOT,
                None => 0,
            },
        }
    }

    /// Seeds `objects`' blob sizes from the cached index of its tree, the first time.
    pub(super) fn seed_sizes(&self, objects: &ObjectCache, index_cache: &std::path::Path) {
        if !self.sizes_seeded.swap(true, Ordering::Relaxed) {
            objects.seed_sizes_from_index_cache(index_cache, self.tree);
        }
    }

    /// The listing of directory `ov`, if it has a base one.
    pub(super) fn tree_of(
        &self,
        objects: &ObjectCache,
        ov: &Overlay,
    ) -> FsResult<Option<Arc<git::TreeListing>>> {
        match ov.base {
            Some(b) if b.mode == MODE_TREE && ov.ftype == FType::Dir => {
                self.listing(objects, b).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The listing of base directory `b`: its tree's, with the warm snapshot's directory
    /// merged where it has one.
    pub(super) fn listing(
        &self,
        objects: &ObjectCache,
        b: BaseRef,
    ) -> FsResult<Arc<git::TreeListing>> {
        let tree = if b.oid == warm::no_tree() {
            None
        } else {
            Some(
                objects
                    .tree(&self.gitdir, b.oid)
                    .map_err(|e| FsError::git(format!("reading tree {}", b.oid), e))?,
            )
        };
        match (&self.warm, b.warm, tree) {
            (Some(snap), w, tree) if w != 0 => Ok(snap.merged(b.oid, tree.as_deref(), w)),
            (_, _, Some(tree)) => Ok(tree),
            _ => Err(FsError::internal(
                "a directory with neither tree nor snapshot",
            )),
        }
    }

    /// What the warm snapshot says of base entry `b` when it is one the snapshot holds
    /// (a file of it, or a directory only it has): the size, mode and time the view shows.
    /// None for the entries of the base tree, which show a checkout's.
    pub(super) fn inherited(&self, b: &BaseRef) -> Option<Inherited> {
        if let Some(f) = self.warm_file(b) {
            let (size, perm) = match self.warm.as_ref().and_then(|s| s.link(f)) {
                Some(l) => (l.len() as u64, 0o777),
                None => (f.size, f.perm),
            };
            return Some(Inherited {
                size,
                perm,
                mtime: f.mtime,
            });
        }
        self.warm_dir(b).map(|d| Inherited {
            size: 4096,
            perm: d.perm,
            mtime: d.mtime,
        })
    }

    /// The warm snapshot's file behind base entry `b`, if it is one.
    fn warm_file(&self, b: &BaseRef) -> Option<&warm::File> {
        match (&self.warm, b.mode) {
            (_, MODE_TREE) => None,
            (Some(s), _) => s.file(b.warm),
            (None, _) => None,
        }
    }

    /// The target of the warm snapshot's symlink behind base entry `b`, if it is one.
    fn warm_link(&self, b: &BaseRef) -> Option<&[u8]> {
        let f = self.warm_file(b)?;
        self.warm.as_ref()?.link(f)
    }

    /// The warm snapshot's directory behind base directory `b` when only the snapshot has
    /// it (a tracked directory keeps a checkout's attributes).
    fn warm_dir(&self, b: &BaseRef) -> Option<&warm::Dir> {
        match &self.warm {
            Some(s) if b.mode == MODE_TREE && b.oid == warm::no_tree() => s.dir(b.warm),
            _ => None,
        }
    }

    /// The size of base file `b`: the warm snapshot's record, else the object's (its
    /// content is in the blob cache, not always in the repository).
    pub(super) fn size(&self, objects: &ObjectCache, b: &BaseRef) -> FsResult<u64> {
        if let Some(f) = self.warm_file(b) {
            return Ok(f.size);
        }
        objects
            .blob_size(&self.gitdir, b.oid)
            .map_err(|e| FsError::git("blob size", e))
    }

    /// A base symlink's target.
    pub(super) fn link_target(&self, b: &BaseRef) -> FsResult<Vec<u8>> {
        if let Some(link) = self.warm_link(b) {
            return Ok(link.to_vec());
        }
        git::read_blob(&self.gitdir, b.oid).map_err(|e| FsError::git("reading symlink target", e))
    }

    /// The conversion a checkout applies to the base file at `path` (blob `oid`) for the
    /// worktree's owner `uid`:`gid`, if any.
    pub(super) fn conversion(
        &self,
        path: &[u8],
        oid: Oid,
        uid: u32,
        gid: u32,
    ) -> Option<Converted> {
        let list = self.conversions.as_ref()?;
        let conv = list.get(path)?.clone();
        use sha1::Digest;
        let mut h = sha1::Sha1::new();
        h.update(b"worktreefs conversion 1\0");
        h.update(oid.as_bytes());
        h.update(conv.encode().as_bytes());
        if conv.runs_git() {
            // A program's output may depend on the path, the user and the configuration.
            h.update([0]);
            h.update(path);
            h.update(
                format!("\0{}\0{}\0{}\0{}\0", uid, gid, list.fingerprint, self.tree).as_bytes(),
            );
            h.update(self.gitdir.as_os_str().as_encoded_bytes());
        }
        let key = Oid::from_bytes(&h.finalize()[..20]).ok()?;
        Some(Converted {
            conv,
            path: path.to_vec(),
            key,
        })
    }

    /// The converted files whose blob does not survive a checkout and a clean (git
    /// lists them as modified once it looks at them).
    pub(super) fn dirty_conversions(&self) -> impl Iterator<Item = &[u8]> {
        self.conversions.iter().flat_map(|c| c.dirty())
    }
}
