//! Creating a managed worktree: the git side (branch, admin entry, index), the upper layer,
//! and the row in the store. Either all of it lands or none of it does.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use git2::{BranchType, Repository};

use crate::git::{self, IndexStat};
use crate::lease::State;
use crate::names::validate_name;
use crate::state::StateDir;
use crate::store::{now_secs, NewWorktree, Store, WorktreeRow};

pub const META_MOUNTPOINT: &str = "mountpoint";

#[derive(Debug)]
pub enum CreateError {
    InvalidName(String),
    UnknownRepo(String),
    Exists(String),
    BadRevision(String),
    BranchConflict(String),
    Internal(String),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidName(m)
            | CreateError::UnknownRepo(m)
            | CreateError::Exists(m)
            | CreateError::BadRevision(m)
            | CreateError::BranchConflict(m)
            | CreateError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CreateError {}

pub struct CreateRequest<'a> {
    pub repo: &'a str,
    pub name: &'a str,
    pub base: Option<&'a str>,
    pub branch: Option<&'a str>,
    pub uid: u32,
    pub gid: u32,
}

/// The mountpoint git's admin entries point at: the one recorded by the last mount, else
/// the default one.
pub fn mountpoint_of(state: &StateDir, store: &Store) -> PathBuf {
    store
        .meta_get(META_MOUNTPOINT)
        .ok()
        .flatten()
        .map(PathBuf::from)
        .unwrap_or_else(|| state.default_mountpoint())
}

pub fn gitfile_path(mountpoint: &Path, repo: &str, name: &str) -> PathBuf {
    mountpoint.join(repo).join(name).join(".git")
}

/// Undo log for a creation in progress: whatever was made is removed on drop unless the
/// creation was committed.
struct Rollback<'r> {
    repo: &'r Repository,
    branch: Option<String>,
    dirs: Vec<PathBuf>,
    committed: bool,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for d in self.dirs.iter().rev() {
            if let Err(e) = fs::remove_dir_all(d) {
                tracing::warn!("rollback: could not remove {}: {e}", d.display());
            }
        }
        if let Some(b) = &self.branch {
            if let Ok(mut br) = self.repo.find_branch(b, BranchType::Local) {
                if let Err(e) = br.delete() {
                    tracing::warn!("rollback: could not delete branch {b}: {e}");
                }
            }
        }
    }
}

fn internal(context: &str) -> impl Fn(String) -> CreateError + '_ {
    move |e| CreateError::Internal(format!("{context}: {e}"))
}

/// Creates worktree `repo/name`. On any error nothing is left behind: no row, no
/// directory, no git worktree entry, no branch that was not there before.
pub fn create_worktree(
    state: &StateDir,
    store: &mut Store,
    req: &CreateRequest<'_>,
) -> Result<WorktreeRow, CreateError> {
    validate_name("worktree", req.name).map_err(CreateError::InvalidName)?;
    let repo_row = store
        .repo_by_name(req.repo)
        .map_err(|e| internal("reading repositories")(e.to_string()))?
        .ok_or_else(|| {
            CreateError::UnknownRepo(format!(
                "repository '{}' is not registered; add it with `worktreefs repo add PATH --name {}` (see `worktreefs repo list`)",
                req.repo, req.repo
            ))
        })?;
    if let Some(existing) = store
        .worktree(req.repo, req.name)
        .map_err(|e| internal("reading worktrees")(e.to_string()))?
        .filter(|w| w.state != State::Removed)
    {
        return Err(CreateError::Exists(format!(
            "worktree '{}/{}' already exists (state: {}); pick another name",
            req.repo, req.name, existing.state
        )));
    }
    if let Some(b) = req.branch {
        if git2::Branch::name_is_valid(b).ok() != Some(true) {
            return Err(CreateError::InvalidName(format!(
                "branch name '{b}' is not a valid git branch name"
            )));
        }
    }

    let repo = Repository::open(&repo_row.gitdir).map_err(|e| {
        CreateError::Internal(format!(
            "repository '{}' at {} cannot be opened: {}; check the path or `worktreefs repo remove {}`",
            repo_row.name,
            repo_row.gitdir.display(),
            e.message(),
            repo_row.name
        ))
    })?;

    // Branch and base.
    let branch_name = req.branch.unwrap_or(req.name).to_string();
    let existing_branch = repo.find_branch(&branch_name, BranchType::Local).ok();
    let base_rev = match (req.base, &existing_branch) {
        (Some(b), _) => b.to_string(),
        (None, Some(_)) => format!("refs/heads/{branch_name}"),
        (None, None) => "HEAD".to_string(),
    };
    let base = git::resolve_base(&repo, &base_rev).map_err(|e| {
        CreateError::BadRevision(format!(
            "{e}; pass --base with a commit, branch or tag that exists"
        ))
    })?;
    if let Some(br) = &existing_branch {
        if req.branch.is_none() {
            return Err(CreateError::BranchConflict(format!(
                "branch '{branch_name}' already exists in repository '{}'; pass --branch {branch_name} to work on it, or choose another worktree name",
                req.repo
            )));
        }
        let tip = br.get().target();
        if tip != Some(base.commit) {
            return Err(CreateError::BranchConflict(format!(
                "branch '{branch_name}' exists at {} but --base resolves to {}; drop --base to start from the branch, or pick a new branch name",
                tip.map(|t| t.to_string()).unwrap_or_default(),
                base.commit
            )));
        }
        let full = format!("refs/heads/{branch_name}");
        if let Some((holder, _)) = git::checked_out_branches(&repo)
            .into_iter()
            .find(|(_, r)| *r == full)
        {
            return Err(CreateError::BranchConflict(format!(
                "branch '{branch_name}' is already checked out in {holder}; choose another branch"
            )));
        }
    }

    // Index, built once per (tree, stat data) and kept in the state dir's cache.
    let base_mtime = base.commit_time.clamp(1, now_secs() - 1);
    let index = cached_index(state, &repo, base.tree, base_mtime, req.uid, req.gid)?;

    let mut rollback = Rollback {
        repo: &repo,
        branch: None,
        dirs: Vec::new(),
        committed: false,
    };
    if existing_branch.is_none() {
        let commit = repo
            .find_commit(base.commit)
            .map_err(|e| internal("reading base commit")(e.message().to_string()))?;
        repo.branch(&branch_name, &commit, false).map_err(|e| {
            CreateError::BranchConflict(format!(
                "cannot create branch '{branch_name}': {}",
                e.message()
            ))
        })?;
        rollback.branch = Some(branch_name.clone());
    }

    let gitdir = git::common_dir(&repo);
    let admin_name = git::free_admin_name(&gitdir, req.name);
    let admin = git::admin_dir(&gitdir, &admin_name);
    let mountpoint = mountpoint_of(state, store);
    let worktree_path = mountpoint.join(req.repo).join(req.name);
    rollback.dirs.push(admin.clone());
    git::write_admin_entry(
        &admin,
        &format!("ref: refs/heads/{branch_name}"),
        &gitfile_path(&mountpoint, req.repo, req.name),
        |out| index.write_for(out, &worktree_path, &gitdir),
        &format!(
            "managed by worktreefs (state dir {})\n",
            state.root.display()
        ),
    )
    .map_err(|e| internal("writing the git worktree entry")(format!("{e:#}")))?;

    // The upper layer gets its final id-based path once the row exists; create it under a
    // temporary name first so a failed insert leaves nothing.
    let staging =
        state
            .root
            .join("worktrees")
            .join(format!(".new-{}-{}", std::process::id(), admin_name));
    rollback.dirs.push(staging.clone());
    fs::create_dir_all(staging.join("upper"))
        .and_then(|_| fs::create_dir_all(staging.join("work")))
        .map_err(|e| internal("creating the upper layer")(e.to_string()))?;
    let uid_gid = (req.uid, req.gid);
    let _ = nix::unistd::chown(
        &staging.join("upper"),
        Some(nix::unistd::Uid::from_raw(uid_gid.0)),
        Some(nix::unistd::Gid::from_raw(uid_gid.1)),
    );

    let commit_s = base.commit.to_string();
    let tree_s = base.tree.to_string();
    let id = store
        .insert_worktree(&NewWorktree {
            repo_id: repo_row.id,
            name: req.name,
            branch: Some(&branch_name),
            branch_created: existing_branch.is_none(),
            base_commit: &commit_s,
            base_tree: &tree_s,
            base_mtime,
            uid: req.uid,
            gid: req.gid,
            admin_name: &admin_name,
        })
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                CreateError::Exists(format!(
                    "worktree '{}/{}' was created by someone else just now; pick another name",
                    req.repo, req.name
                ))
            }
            other => internal("recording the worktree")(other.to_string()),
        })?;
    let final_dir = state.worktree_dir(id);
    if let Err(e) = fs::rename(&staging, &final_dir) {
        // The row exists but its directory does not: remove the row too.
        let _ = store.delete_worktree_row(id);
        return Err(internal("placing the upper layer")(e.to_string()));
    }
    rollback.committed = true;
    store
        .worktree(req.repo, req.name)
        .map_err(|e| internal("reading back the worktree")(e.to_string()))?
        .ok_or_else(|| CreateError::Internal("worktree row vanished".into()))
}

/// A cached index on disk and what a creation needs to copy it: the worktree-independent
/// part of its untracked cache, and its body's hash state, so that a creation neither
/// reads nor hashes the 10 MB body.
struct CachedIndex {
    body: IndexBody,
    /// The body's length: the cached index without its checksum.
    body_len: u64,
    prefix: git::Sha1Prefix,
    /// The body's bytes after the blocks `prefix` covers (fewer than 64).
    tail: Vec<u8>,
    untr: Vec<u8>,
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
        })
    }

    /// Writes the index of the worktree at `worktree_path` to `out`: the body, this
    /// worktree's untracked cache (git ties that cache to the path) and the checksum of both.
    fn write_for(
        &self,
        out: &mut fs::File,
        worktree_path: &Path,
        common_dir: &Path,
    ) -> std::io::Result<()> {
        use std::io::{Read, Seek, Write};
        let ext = crate::git::untracked::extension(worktree_path, common_dir, &self.untr);
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

/// Returns the index for `tree` with the given stat data, building and caching it on first
/// use. The cache makes creation cost independent of the repository's size after the first
/// worktree at a commit.
fn cached_index(
    state: &StateDir,
    repo: &Repository,
    tree: git2::Oid,
    mtime: i64,
    uid: u32,
    gid: u32,
) -> Result<CachedIndex, CreateError> {
    let key = state
        .index_cache()
        .join(format!("{tree}-{mtime}-{uid}-{gid}.fsmn.index"));
    let untr_key = key.with_extension("untr");
    let state_key = key.with_extension("sha1");
    if let Ok(untr) = fs::read(&untr_key) {
        match CachedIndex::open(&key, &state_key, untr) {
            Ok(cached) => return Ok(cached),
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
    let entries = git::index_entries(repo, tree, &known, &mut dirs)
        .map_err(|e| internal("reading the base tree")(format!("{e:#}")))?;
    let index = git::encode_index(
        &entries,
        &stat,
        &[crate::git::fsmonitor::index_extension(
            crate::git::fsmonitor::CREATED_TOKEN,
        )],
    );
    let untr = crate::git::untracked::directories_part(&dirs, &stat);
    let mut cached = CachedIndex::from_bytes(index, untr);
    let IndexBody::Bytes(index) = &cached.body else {
        unreachable!("built in memory")
    };
    let checksum = &index[cached.body_len as usize..];
    let saved = [&cached.prefix.encode()[..], checksum].concat();
    let mut written = true;
    for (path, bytes) in [
        (&untr_key, &cached.untr),
        (&state_key, &saved),
        (&key, index),
    ] {
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
    match newest.and_then(|(_, path)| fs::read(path).ok()) {
        Some(bytes) => git::decode_index_sizes(&bytes).into_iter().collect(),
        None => Default::default(),
    }
}

/// Points every managed worktree's git admin entry at `mountpoint` (called at mount, since
/// the absolute path of each worktree's `.git` depends on where the filesystem is mounted).
pub fn repoint_admin_entries(store: &Store, mountpoint: &Path) -> anyhow::Result<()> {
    for w in store.worktrees()? {
        let Some(repo) = store.repo_by_id(w.repo_id)? else {
            continue;
        };
        let admin = git::admin_dir(&repo.gitdir, &w.admin_name);
        let file = admin.join("gitdir");
        let want = format!("{}\n", gitfile_path(mountpoint, &w.repo, &w.name).display());
        if fs::read_to_string(&file).ok().as_deref() != Some(want.as_str()) && file.exists() {
            fs::write(&file, want)?;
            retarget_index(&admin, &mountpoint.join(&w.repo).join(&w.name));
        }
    }
    Ok(())
}

/// The untracked cache names the worktree's path; when the mountpoint moved, an index
/// still as worktreefs wrote it gets the new path (under git's `index.lock`), so the
/// first `git status` there still lists no directory. An index git has rewritten since is
/// left to git, which rebuilds its cache once.
fn retarget_index(admin: &Path, worktree_path: &Path) {
    let index_path = admin.join("index");
    let Ok(index) = fs::read(&index_path) else {
        return;
    };
    let Some(updated) = crate::git::untracked::retarget(&index, worktree_path) else {
        return;
    };
    let lock = admin.join("index.lock");
    let Ok(mut f) = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&lock)
    else {
        return; // someone holds the index: leave it
    };
    let written = std::io::Write::write_all(&mut f, &updated)
        .and_then(|_| f.sync_all())
        .and_then(|_| fs::rename(&lock, &index_path));
    if let Err(e) = written {
        tracing::warn!("could not update {}: {e}", index_path.display());
        let _ = fs::remove_file(&lock);
    }
}
