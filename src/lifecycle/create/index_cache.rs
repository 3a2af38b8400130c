//! The index cache: the index of a tree, built once per (tree, stat data, checkout
//! setting) and copied into every worktree made at it, so a creation costs the same
//! whatever the repository's size.

use std::fs;
use std::path::{Path, PathBuf};

use git2::Repository;

use crate::git::{self, IndexStat};
use crate::state::StateDir;

use super::error::{internal, CreateError};

/// A cached index on disk and what a creation needs to copy it: the worktree-independent
/// part of its untracked cache, and its body's hash state, so that a creation neither
/// reads nor hashes the 10 MB body.
pub(crate) struct CachedIndex {
    body: IndexBody,
    /// The body's length: the cached index without its checksum.
    body_len: u64,
    prefix: git::Sha1Prefix,
    /// The body's bytes after the blocks `prefix` covers (fewer than 64).
    tail: Vec<u8>,
    pub(crate) untr: Vec<u8>,
    /// The tree's converted files (`git::checkout`), if any: the cache's file, or its
    /// bytes when it could not be cached.
    conversions: Option<Conversions>,
}

enum Conversions {
    File(PathBuf),
    Bytes(Vec<u8>),
}

enum IndexBody {
    /// The cached file, copied into each worktree by the kernel (`copy_file_range`).
    File(fs::File),
    /// In memory, when the cache could not be written.
    Bytes(Vec<u8>),
}

impl CachedIndex {
    fn from_bytes(index: Vec<u8>, untr: Vec<u8>) -> Self {
        let body_len = index.len().saturating_sub(20);
        let prefix = git::Sha1Prefix::of(&index[..body_len]);
        let tail = index[prefix.covered() as usize..body_len].to_vec();
        CachedIndex {
            body: IndexBody::Bytes(index),
            body_len: body_len as u64,
            prefix,
            tail,
            untr,
            conversions: None,
        }
    }

    /// Opens the cached index at `path` with its hash state from `state_path`, computing
    /// (and storing) the state when it is missing or belongs to other content.
    fn open(path: &Path, state_path: &Path, untr: Vec<u8>) -> std::io::Result<Self> {
        use std::os::unix::fs::FileExt;
        let file = fs::File::open(path)?;
        let len = file.metadata()?.len();
        if len < 32 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "cached index too short",
            ));
        }
        let body_len = len - 20;
        // The state file ends with the cached index's own checksum, which names the content.
        let mut checksum = [0u8; 20];
        file.read_exact_at(&mut checksum, body_len)?;
        let saved = fs::read(state_path).ok().and_then(|b| {
            let (state, sum) = b.split_at_checked(git::Sha1Prefix::ENCODED_LEN)?;
            let prefix = git::Sha1Prefix::decode(state)?;
            (sum == checksum && prefix.covered() == body_len / 64 * 64).then_some(prefix)
        });
        let prefix = match saved {
            Some(prefix) => prefix,
            None => {
                // From the file opened above (whose checksum was read), not the path,
                // which another writer may have replaced since.
                let mut bytes = vec![0u8; body_len as usize];
                file.read_exact_at(&mut bytes, 0)?;
                let prefix = git::Sha1Prefix::of(&bytes);
                let saved = [&prefix.encode()[..], &checksum].concat();
                if let Err(e) = crate::durable::write_file_synced(state_path, &saved) {
                    tracing::warn!("could not cache {}: {e}", state_path.display());
                }
                prefix
            }
        };
        let mut tail = vec![0u8; (body_len - prefix.covered()) as usize];
        file.read_exact_at(&mut tail, prefix.covered())?;
        Ok(CachedIndex {
            body: IndexBody::File(file),
            body_len,
            prefix,
            tail,
            untr,
            conversions: None,
        })
    }

    /// Writes the index of the worktree at `worktree_path` to `out`: the body, this
    /// worktree's untracked cache (git ties that cache to the path) and the checksum of both.
    pub(crate) fn write_for(
        &self,
        out: &mut fs::File,
        worktree_path: &Path,
        common_dir: &Path,
        untr: Option<&[u8]>,
    ) -> std::io::Result<()> {
        use std::io::{Read, Seek, Write};
        let untr = untr.unwrap_or(&self.untr);
        let ext = crate::git::untracked::extension(worktree_path, common_dir, untr);
        let checksum = self.prefix.finish(&[&self.tail, &ext]);
        match &self.body {
            IndexBody::File(file) => {
                // A file-to-file copy: the standard library uses copy_file_range.
                let mut file = file;
                file.seek(std::io::SeekFrom::Start(0))?;
                let copied = std::io::copy(&mut Read::take(file, self.body_len), out)?;
                if copied != self.body_len {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the cached index shrank while it was copied",
                    ));
                }
            }
            IndexBody::Bytes(bytes) => out.write_all(&bytes[..self.body_len as usize])?,
        }
        out.write_all(&ext)?;
        out.write_all(&checksum)
    }

    /// Puts the tree's conversions at `to` (a worktree's `conversions`): a link to the
    /// cache's file, so a creation's cost does not grow with the list.
    pub(crate) fn place_conversions(&self, to: &Path) -> std::io::Result<()> {
        match &self.conversions {
            None => Ok(()),
            Some(Conversions::File(from)) => fs::hard_link(from, to)
                .or_else(|_| crate::durable::write_file_synced(to, &fs::read(from)?)),
            Some(Conversions::Bytes(bytes)) => crate::durable::write_file_synced(to, bytes),
        }
    }
}

/// Whether `file` has `index`'s length and ends with its checksum (which covers the rest).
fn same_content(file: &fs::File, index: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut checksum = [0u8; 20];
    index.len() >= 20
        && file.metadata().is_ok_and(|m| m.len() == index.len() as u64)
        && file
            .read_exact_at(&mut checksum, index.len() as u64 - 20)
            .is_ok()
        && checksum[..] == index[index.len() - 20..]
}

/// The mtime and ctime an untouched view reports for every file of a commit made at
/// `commit_time`, seen at `now`: one second before the commit. That is older than any index
/// written once the commit exists (git reads the content of a file whose mtime is not older
/// than its index, taking it as racily clean), and it depends on the commit alone, so the
/// index cache finds the index of a commit made a moment ago on every later creation too.
/// A commit dated ahead of this machine's clock gets one second before `now` instead: its
/// index is then built afresh for each creation, never wrong.
pub(crate) fn view_mtime(commit_time: i64, now: i64) -> i64 {
    (commit_time - 1).min(now - 1).max(1)
}

/// Where `cached_index` keeps the index of `tree` (with this stat data and setting); it
/// was made already when the `untr` file beside it is there.
pub(crate) fn index_cache_key(
    state: &StateDir,
    tree: git2::Oid,
    mtime: i64,
    uid: u32,
    gid: u32,
    setting: &crate::git::checkout::Setting,
) -> PathBuf {
    // Each setting has keys of its own (and indexes cached before conversions were
    // decided are not used: they have no list beside them; nor those cached before blobs
    // that do not survive a checkout were found: `r2`).
    let setting_part = format!("-c{}-r2", setting.fingerprint());
    state.index_cache().join(format!(
        "{tree}-{mtime}-{uid}-{gid}{setting_part}.fsmn.index"
    ))
}

/// Returns the index for `tree` with the given stat data, building and caching it on first
/// use. The cache makes creation cost independent of the repository's size after the first
/// worktree at a commit.
pub(crate) fn cached_index(
    state: &StateDir,
    repo: &Repository,
    tree: git2::Oid,
    mtime: i64,
    uid: u32,
    gid: u32,
    setting: &crate::git::checkout::Setting,
) -> Result<CachedIndex, CreateError> {
    let key = index_cache_key(state, tree, mtime, uid, gid, setting);
    let untr_key = key.with_extension("untr");
    let state_key = key.with_extension("sha1");
    let conv_key = key.with_extension("conv");
    if let Ok(untr) = fs::read(&untr_key) {
        match CachedIndex::open(&key, &state_key, untr) {
            Ok(mut cached) => {
                cached.conversions = conv_key.exists().then_some(Conversions::File(conv_key));
                return Ok(cached);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("rebuilding the cached index {}: {e}", key.display()),
        }
    }
    let stat = IndexStat {
        mtime: mtime as u32,
        uid,
        gid,
    };
    crate::durable::sweep_temporaries(&state.index_cache());
    let known = sizes_from_newest_cached_index(state);
    let mut dirs = crate::git::untracked::TreeDirs::default();
    let mut entries = git::index_entries(repo, tree, &known, &mut dirs)
        .map_err(|e| internal("reading the base tree")(format!("{e:#}")))?;
    let conversions = setting
        .decide(repo, &git::common_dir(repo), tree, &mut entries)
        .map_err(|e| internal("deciding what a checkout converts")(format!("{e:#}")))?;
    let index = git::encode_index(
        &entries,
        &stat,
        &[crate::git::fsmonitor::index_extension(
            crate::git::fsmonitor::CREATED_TOKEN,
        )],
    );
    let untr = crate::git::untracked::directories_part(&dirs, &stat);
    let mut cached = CachedIndex::from_bytes(index, untr);
    let mut written = true;
    if let Some(c) = &conversions {
        tracing::info!(
            "tree {tree}: a checkout converts {} file(s) (attributes, filters)",
            c.len()
        );
        let bytes = c.encode();
        // Before the index: a cached index is taken as complete, conversions included.
        if let Err(e) = crate::durable::write_file_synced(&conv_key, &bytes) {
            tracing::warn!("could not cache {}: {e}", conv_key.display());
            written = false;
            cached.conversions = Some(Conversions::Bytes(bytes));
        } else {
            cached.conversions = Some(Conversions::File(conv_key.clone()));
        }
    } else {
        // A list left by an earlier build that was cut short is not this one's.
        let _ = fs::remove_file(&conv_key);
    }
    let IndexBody::Bytes(index) = &cached.body else {
        unreachable!("built in memory")
    };
    let checksum = &index[cached.body_len as usize..];
    let saved = [&cached.prefix.encode()[..], checksum].concat();
    for (path, bytes) in [
        (&untr_key, &cached.untr),
        (&state_key, &saved),
        (&key, index),
    ] {
        if !written {
            break;
        }
        if let Err(e) = crate::durable::write_file_synced(path, bytes) {
            tracing::warn!("could not cache {}: {e}", path.display());
            written = false;
        }
    }
    // Copied from the file just written, this worktree's index is written as the next
    // ones will be (the kernel's copy is several times faster than a write from memory);
    // unless the file there is not the one built here (another writer's, since).
    if written {
        if let Ok(file) = fs::File::open(&key) {
            if same_content(&file, index) {
                cached.body = IndexBody::File(file);
            }
        }
    }
    Ok(cached)
}

/// Blob sizes from the most recently written cached index: usually the same repository a
/// few commits back, so most of a new commit's blobs are known without reading objects.
fn sizes_from_newest_cached_index(state: &StateDir) -> std::collections::HashMap<git2::Oid, u64> {
    let newest = fs::read_dir(state.index_cache())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".index"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max();
    let Some((_, path)) = newest else {
        return Default::default();
    };
    let converted = crate::git::checkout::converted_oids_beside(&path);
    match fs::read(&path) {
        Ok(bytes) => git::decode_index_sizes(&bytes)
            .into_iter()
            .filter(|(oid, _)| !converted.contains(oid))
            .collect(),
        Err(_) => Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::view_mtime;

    #[test]
    fn a_commits_view_mtime_does_not_move_with_the_clock() {
        // A commit made this very second, created from now and again two seconds later:
        // the same stat data, so the second creation finds the first one's cached index.
        let made = 1_700_000_000;
        assert_eq!(view_mtime(made, made), view_mtime(made, made + 2));
        assert_eq!(view_mtime(made, made + 1), view_mtime(made, made + 3600));
        // Always older than an index written at `now` or later.
        assert!(view_mtime(made, made) < made);
        // A commit dated ahead of the clock still gets a time in the past.
        assert_eq!(view_mtime(made + 60, made), made - 1);
        // An epoch-dated commit keeps a positive time.
        assert_eq!(view_mtime(0, made), 1);
    }
}
