//! Deleting snapshots no worktree shows and the contents only they held, and what a take
//! that died half-way left in the cache.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

use git2::Oid;

use crate::git::warm::Kind;
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::report::human_bytes;
use crate::state::StateDir;
use crate::store::{Store, WarmRow};

use super::cache::{blob_path, dirs_path, idents_path, lock, JOURNAL, LOCK_FILE};

/// What a [`prune`] deleted.
#[derive(Debug, Default)]
pub struct Pruned {
    pub snapshots: Vec<WarmRow>,
    /// Manifests no row named (a take that died before its row; a repository removed).
    pub orphans: usize,
    /// Journals of takes that failed or died.
    pub journals: usize,
    /// Contents deleted from the blob cache, and their bytes.
    pub blobs: usize,
    pub bytes: u64,
}

/// The blob ids of the files of the manifest `name`.
pub(super) fn manifest_blobs(state: &StateDir, name: &str) -> Result<Vec<Oid>, String> {
    let path = state.warm().join(name);
    let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let records =
        crate::git::warm::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(records
        .into_iter()
        .filter(|r| r.kind == Kind::File)
        .filter_map(|r| r.oid)
        .collect())
}

/// The blob ids a take's journal names (lines of hex; a line cut short by a crash is
/// left out: its content was never placed).
pub(super) fn journal_blobs(path: &Path) -> io::Result<Vec<Oid>> {
    let text = fs::read(path)?;
    Ok(text
        .split(|b| *b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .filter_map(|l| Oid::from_str(l).ok().filter(|_| l.len() == 40))
        .collect())
}

/// The journals takes left (a take running has one too), by name: a prune has contents to
/// look at.
pub fn journals(state: &StateDir) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = fs::read_dir(state.warm())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| n.as_encoded_bytes().ends_with(JOURNAL.as_bytes()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Deletes the snapshots nothing needs ([`Store::prune_warm`]), the manifests no row
/// names, the journals of takes that ended without their row (and the contents they
/// name), and the contents of the blob cache only those held: not one a remaining
/// snapshot holds, nor one a registered repository's object database has (the blob
/// cache fills those itself). Where that cannot be told (a remaining manifest or a
/// repository that cannot be read), no content is deleted. None: a snapshot is being
/// taken (its contents are in the cache before its row is in the store); the next prune
/// does it.
pub fn prune(state: &StateDir, store: &mut Store) -> LifecycleResult<Option<Pruned>> {
    let Some(_lock) = lock(state, libc::LOCK_EX | libc::LOCK_NB)
        .with_context(|| format!("locking {}", state.warm().join(LOCK_FILE).display()))?
    else {
        return Ok(None);
    };
    let mut out = Pruned {
        snapshots: store.prune_warm().context("pruning warm snapshots")?,
        ..Pruned::default()
    };
    let remaining = store.warm_all()?;
    let named: std::collections::HashSet<&str> =
        remaining.iter().map(|w| w.manifest.as_str()).collect();
    // A manifest a remaining row names is never doomed (two rows can never share one,
    // but nothing is deleted on that belief).
    let mut doomed: BTreeSet<String> = out
        .snapshots
        .iter()
        .map(|w| w.manifest.clone())
        .filter(|m| !named.contains(m.as_str()))
        .collect();
    let mut candidates: std::collections::HashSet<Oid> = std::collections::HashSet::new();
    let mut journals = Vec::new();
    // Whether what a content is held by could not be told: then no journal goes either.
    let mut blind = false;
    for e in fs::read_dir(state.warm())?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('.') {
            continue;
        }
        if n.ends_with(JOURNAL) {
            // Every take holds the lock shared while it runs: this one ended.
            match journal_blobs(&e.path()) {
                Ok(oids) => {
                    candidates.extend(oids);
                    journals.push(e.path());
                }
                Err(err) => tracing::warn!(
                    "pruning warm snapshots: reading {}: {err}; its contents stay",
                    e.path().display()
                ),
            }
            continue;
        }
        let base = n
            .strip_suffix(".dirs")
            .or_else(|| n.strip_suffix(".ident"))
            .unwrap_or(&n)
            .to_string();
        if !named.contains(base.as_str()) && doomed.insert(base) {
            out.orphans += 1;
        }
    }
    for m in &doomed {
        match manifest_blobs(state, m) {
            Ok(oids) => candidates.extend(oids),
            // Its contents stay in the cache: never wrong.
            Err(e) => tracing::warn!("pruning warm snapshots: {e}; its contents stay"),
        }
    }
    for w in &remaining {
        if candidates.is_empty() {
            break;
        }
        match manifest_blobs(state, &w.manifest) {
            Ok(oids) => {
                for o in oids {
                    candidates.remove(&o);
                }
            }
            Err(e) => {
                tracing::warn!("pruning warm snapshots: {e}; no content is deleted");
                candidates.clear();
                blind = true;
            }
        }
    }
    for r in store.repos()? {
        if candidates.is_empty() {
            break;
        }
        let repo = git2::Repository::open(&r.gitdir);
        let odb = match &repo {
            Ok(g) => g.odb(),
            Err(e) => Err(git2::Error::from_str(e.message())),
        };
        match odb {
            Ok(odb) => candidates.retain(|o| !odb.exists(*o)),
            Err(e) => {
                tracing::warn!(
                    "pruning warm snapshots: opening {}: {}; no content is deleted",
                    r.gitdir.display(),
                    e.message()
                );
                candidates.clear();
                blind = true;
            }
        }
    }
    for oid in candidates {
        let path = blob_path(state, oid);
        if let Ok(m) = fs::symlink_metadata(&path) {
            if m.is_file() && fs::remove_file(&path).is_ok() {
                out.blobs += 1;
                out.bytes += m.len();
            }
        }
    }
    // The journals and manifests last: one a crash leaves is read again by the next prune.
    // Blind, they all stay for the next prune: what they name is never lost track of.
    for j in journals.iter().filter(|_| !blind) {
        match fs::remove_file(j) {
            Ok(()) => out.journals += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!("pruning warm snapshots: removing {}: {e}", j.display())
            }
        }
    }
    for m in doomed.iter().filter(|_| !blind) {
        for p in [
            state.warm().join(m),
            dirs_path(state, m),
            idents_path(state, m),
        ] {
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("pruning warm snapshots: removing {}: {e}", p.display());
                }
            }
        }
    }
    if !out.snapshots.is_empty() || out.orphans > 0 || out.journals > 0 {
        tracing::info!(
            "pruned {} warm snapshot(s), {} unrecorded manifest(s) and {} journal(s) of failed takes: {} contents, {}",
            out.snapshots.len(),
            out.orphans,
            out.journals,
            out.blobs,
            human_bytes(out.bytes)
        );
    }
    Ok(Some(out))
}
