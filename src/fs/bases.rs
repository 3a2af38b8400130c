//! What the bases of every worktree the view serves share: the warm snapshots in use (one
//! copy in memory however many worktrees show one), the converted files' sizes and the
//! conversions that failed (by conversion key, `fs/converted.rs`), and whether any base
//! converts at all. A worktree's [`Base`] is opened here, from its parts on disk.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use git2::Oid;
use parking_lot::Mutex;

use super::base_layer::Base;
use super::error::{FsError, FsResult};
use crate::git::checkout::Conversions;
use crate::git::warm::Snapshot;

#[derive(Default)]
pub(super) struct Bases {
    /// Warm snapshots in use, by id.
    warm: Mutex<HashMap<i64, Weak<Snapshot>>>,
    /// Sizes of converted base files, by conversion key.
    sizes: Mutex<HashMap<Oid, u64>>,
    /// The conversions that failed, by key: remembered until the daemon restarts, so a
    /// hanging filter costs its timeout once.
    failed: Mutex<HashSet<Oid>>,
    /// Whether any base opened has converted files: until then no request looks for a
    /// conversion (the common case pays nothing).
    any_converts: AtomicBool,
}

impl Bases {
    /// The base of tree `tree` in repository `gitdir`, its entries shown at `mtime`; with
    /// warm snapshot `warm` (its id and manifest) below it, and the list of converted
    /// files at `conversions` when there is one.
    pub(super) fn open(
        &self,
        gitdir: &Path,
        tree: Oid,
        mtime: SystemTime,
        warm: Option<(i64, &Path)>,
        conversions: &Path,
    ) -> FsResult<Base> {
        let conversions = read_conversions(conversions)?;
        if conversions.is_some() {
            self.any_converts.store(true, Ordering::Relaxed);
        }
        let warm = match warm {
            Some((id, manifest)) => Some(self.warm_snapshot(id, manifest)?),
            None => None,
        };
        Ok(Base::new(
            gitdir.to_path_buf(),
            tree,
            mtime,
            warm,
            conversions,
        ))
    }

    /// Whether any base opened has converted files.
    pub(super) fn any_converts(&self) -> bool {
        self.any_converts.load(Ordering::Relaxed)
    }

    /// The size of the converted content of key `key`, if known.
    pub(super) fn converted_size(&self, key: Oid) -> Option<u64> {
        self.sizes.lock().get(&key).copied()
    }

    pub(super) fn remember_size(&self, key: Oid, size: u64) {
        self.sizes.lock().insert(key, size);
    }

    /// Whether the conversion of key `key` failed.
    pub(super) fn failed(&self, key: Oid) -> bool {
        self.failed.lock().contains(&key)
    }

    pub(super) fn remember_failure(&self, key: Oid) {
        self.failed.lock().insert(key);
    }

    /// Warm snapshot `id`, read from `manifest` the first time a worktree shows it (the
    /// sizes of its files are its own: `Base::size`).
    fn warm_snapshot(&self, id: i64, manifest: &Path) -> FsResult<Arc<Snapshot>> {
        let mut map = self.warm.lock();
        if let Some(s) = map.get(&id).and_then(|w| w.upgrade()) {
            return Ok(s);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let snap = Arc::new(
            Snapshot::load(id, manifest)
                .map_err(|e| FsError::internal(format!("its warm snapshot {id}: {e}")))?,
        );
        map.insert(id, Arc::downgrade(&snap));
        drop(map);
        // Reading it took several times its size for a moment (a few milliseconds, under
        // the catalog's lock like the read itself).
        crate::heap::trim();
        Ok(snap)
    }
}

/// A worktree's list of converted base files, if it has one.
fn read_conversions(path: &Path) -> FsResult<Option<Arc<Conversions>>> {
    match Conversions::read(path) {
        Ok(list) => Ok(list.map(Arc::new)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(FsError::internal(e.to_string()))
        }
        Err(e) => Err(FsError::io(format!("reading {}", path.display()), e)),
    }
}
