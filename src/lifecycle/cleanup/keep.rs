//! What every removal keeps, and for how long (docs/contract.md, "Cleanup"): the worktree's
//! directory (upper layer, work directory) is parked under `<state>/removed/<id>` and
//! stays there; before it is parked, git's `HEAD` and `index` of the worktree are copied
//! into it (`kept/`) and the commit HEAD names is kept under a ref of worktreefs's own,
//! `refs/worktreefs/removed/<name>-<id>-<secs>`, so that `git gc` cannot prune it. A kept
//! copy goes after `--keep-removed` hours, or earlier, oldest first, while the state
//! directory's disk is low; `worktreefs restore` brings one back (`lifecycle/restore.rs`).

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;

use git2::{Oid, Repository};

use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{now_secs, KeptRow, NewKept, Store, StoreResult};

use super::lock::try_lock;
use super::target::Target;
use crate::git::admin::AdminDirs;
use crate::ids::WorktreeId;

/// The directory in a worktree's own directory that holds what was copied from git's
/// entry at its removal.
pub const KEPT_DIR: &str = "kept";
/// Where the tips of removed worktrees are kept in their repository.
pub const REMOVED_REF_PREFIX: &str = "refs/worktreefs/removed/";

/// A kept copy being purged: `<state>/trash/purging-<id>` (deleted at every mount).
pub const PURGING: &str = "purging-";

const META_KEEP_SECS: &str = "keep_removed_secs";
const META_MIN_FREE_PCT: &str = "keep_min_free_percent";
const META_MIN_FREE_BYTES: &str = "keep_min_free_bytes";

/// How long kept copies stay, and how much free disk they leave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepPolicy {
    /// 0: nothing is kept.
    pub keep_secs: i64,
    /// Kept copies give way while the state directory's disk has less than this share
    /// free (percent) …
    pub min_free_percent: f64,
    /// … or less than this many bytes free.
    pub min_free_bytes: u64,
}

impl Default for KeepPolicy {
    fn default() -> Self {
        KeepPolicy {
            keep_secs: 24 * 3600,
            min_free_percent: 5.0,
            min_free_bytes: 2 << 30,
        }
    }
}

impl KeepPolicy {
    /// The policy the last mount recorded (removals run by a command, without the daemon,
    /// keep by it too), else the defaults.
    pub fn of(store: &Store) -> KeepPolicy {
        let d = KeepPolicy::default();
        let get = |k: &str| store.meta_get(k).ok().flatten();
        KeepPolicy {
            keep_secs: get(META_KEEP_SECS)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.keep_secs),
            min_free_percent: get(META_MIN_FREE_PCT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.min_free_percent),
            min_free_bytes: get(META_MIN_FREE_BYTES)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.min_free_bytes),
        }
    }

    pub fn record(&self, store: &Store) -> StoreResult<()> {
        store.meta_set(META_KEEP_SECS, &self.keep_secs.to_string())?;
        store.meta_set(META_MIN_FREE_PCT, &self.min_free_percent.to_string())?;
        store.meta_set(META_MIN_FREE_BYTES, &self.min_free_bytes.to_string())
    }

    pub fn keeps(&self) -> bool {
        self.keep_secs > 0
    }

    /// Why the disk at `path` is too full for kept copies, if it is.
    pub fn low_disk(&self, path: &Path) -> Option<String> {
        let st = nix::sys::statvfs::statvfs(path).ok()?;
        let unit = st.fragment_size().max(1) as u64;
        let free = st.blocks_available() as u64 * unit;
        let total = st.blocks() as u64 * unit;
        let below_share = (free as f64) < total as f64 * self.min_free_percent / 100.0;
        (below_share || free < self.min_free_bytes).then(|| {
            format!(
                "the state directory's disk has {} free of {} (kept copies give way below {}% or {} free)",
                human_bytes(free),
                human_bytes(total),
                self.min_free_percent,
                human_bytes(self.min_free_bytes)
            )
        })
    }
}

pub use crate::report::human_bytes;

/// Disk used by everything below `dir` (never following a symlink).
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut n = m.blocks() * 512;
    if m.is_dir() {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            n += disk_usage(&e.path());
        }
    }
    n
}

/// Why keeping failed: `hard` when the entry is not this worktree's (the removal
/// stops, as parking would); otherwise the removal goes on without keeping.
struct NotKept {
    why: String,
    hard: bool,
}

fn soft(why: String) -> NotKept {
    NotKept { why, hard: false }
}

/// Whether `head` (a `HEAD` file's text) is one git writes: a branch, or a commit id.
fn head_is_plain(head: &str) -> bool {
    let h = head.trim_end_matches('\n');
    match h.strip_prefix("ref: refs/heads/") {
        Some(b) => git2::Branch::name_is_valid(b).unwrap_or(false),
        None => (h.len() == 40 || h.len() == 64) && h.bytes().all(|c| c.is_ascii_hexdigit()),
    }
}

/// git's `HEAD` and `index` of `t`'s entry, read through the entry checked as the
/// removal checks it (another worktree's entry renamed into its name is not read); an
/// entry that is gone gives the branch recorded at creation and no index.
fn read_entry(t: &Target) -> Result<(String, Option<Vec<u8>>), NotKept> {
    let name = t.admin.file_name().unwrap_or_default();
    let dirs = AdminDirs::open(&t.gitdir)
        .map_err(|e| soft(format!("opening git directory {}: {e}", t.gitdir.display())))?;
    let fallback = || match &t.branch {
        Some(b) => Ok((format!("ref: refs/heads/{b}\n"), None)),
        None => Err(soft(format!(
            "{} is gone and no branch was recorded: nothing says what HEAD was",
            t.admin.display()
        ))),
    };
    let worktrees = match dirs.worktrees(false) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return fallback(),
        Err(e) => return Err(soft(format!("reaching {}: {e}", t.admin.display()))),
    };
    let entry = match crate::git::Entry::open(worktrees.as_fd(), name) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return fallback(),
        Err(e) => return Err(soft(format!("opening {}: {e}", t.admin.display()))),
    };
    entry
        .check(
            |b| b.starts_with(crate::git::admin::ADMIN_MARKER.as_bytes()),
            &t.repo_and_name(),
            t.uid,
        )
        .map_err(|why| NotKept {
            why: format!("{} {why}; left alone", t.admin.display()),
            hard: true,
        })?;
    let head = crate::beneath::read_regular(entry.fd(), b"HEAD", 4 << 10)
        .map_err(|e| soft(format!("reading {}/HEAD: {e}", t.admin.display())))?
        .0;
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head_is_plain(&head) {
        return Err(soft(format!(
            "{}/HEAD names neither a branch nor a commit",
            t.admin.display()
        )));
    }
    let index = match crate::beneath::read_regular(entry.fd(), b"index", KEPT_INDEX_CAP) {
        Ok((b, _)) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(soft(format!("reading {}/index: {e}", t.admin.display()))),
    };
    Ok((head, index))
}

/// `read_entry` for a fork (`lifecycle::fork`): git's `HEAD` and `index` of a live
/// worktree, read through its checked entry; why not, as text.
pub(crate) fn git_files_of(t: &Target) -> Result<(String, Option<Vec<u8>>), String> {
    read_entry(t).map_err(|n| n.why)
}

/// The commit a `HEAD` file's text names, for a fork.
pub(crate) fn commit_of_head(repo: &Repository, head: &str) -> Option<Oid> {
    head_commit(repo, head)
}

/// The largest index a removal keeps (a checkout of 1,000,000 files has one of ~100 MB).
const KEPT_INDEX_CAP: u64 = 512 << 20;

/// The commit `head` (a `HEAD` file's text) names in `repo`, if any.
fn head_commit(repo: &Repository, head: &str) -> Option<Oid> {
    let oid = match head.trim().strip_prefix("ref:") {
        Some(r) => repo.refname_to_id(r.trim()).ok()?,
        None => Oid::from_str(head.trim()).ok()?,
    };
    repo.find_object(oid, None)
        .ok()?
        .peel_to_commit()
        .ok()
        .map(|c| c.id())
}

/// Keeps `tip` and every object of the index `index` under the ref `name` of the
/// repository at `gitdir`: a commit of worktreefs's whose tree is the index's (what is
/// staged is in no other object git's gc keeps once the worktree's entry is gone) and
/// whose parent is the commit `head` names (returned; None for an unborn branch); with
/// no index (nothing staged), that commit itself.
/// Done as the repository's owner: root writing objects and refs
/// there would follow the links its owner made, and leave files of root's in the owner's
/// `objects/` and `refs/`. Returns the commit the ref names.
fn keep_objects(
    gitdir: &Path,
    name: &str,
    head: &str,
    index: Option<Vec<u8>>,
    index_clean: bool,
    what: &str,
) -> LifecycleResult<Option<Oid>> {
    let (dir, name, what, head) = (
        gitdir.to_path_buf(),
        name.to_string(),
        what.to_string(),
        head.to_string(),
    );
    // Set once the caller gave up waiting: the thread, still running, then makes no ref
    // (the removal has gone on without it, and nothing would delete it).
    let gave_up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let late = gave_up.clone();
    let r = crate::git::owner::as_owner_of(gitdir, move || {
        let repo = Repository::open(&dir)?;
        // Resolved here, bounded and as the owner: a ref the owner made a FIFO blocks.
        let tip = head_commit(&repo, &head);
        let target = match (index, tip) {
            // Nothing staged beyond HEAD's commit (inspection found the index equal to
            // HEAD, and HEAD still names a commit): the ref names that commit.
            (_, Some(tip)) if index_clean => tip,
            (None, Some(tip)) => tip,
            (index, tip) => {
                let tree = match index {
                    Some(bytes) => index_tree(&repo, &bytes)?,
                    None => repo.treebuilder(None)?.write()?,
                };
                let tree = repo.find_tree(tree)?;
                let parent = tip.map(|t| repo.find_commit(t)).transpose()?;
                let sig = git2::Signature::now("worktreefs", "worktreefs@localhost")?;
                let parents: Vec<&git2::Commit> = parent.iter().collect();
                repo.commit(
                    None,
                    &sig,
                    &sig,
                    &format!("worktreefs: kept at the removal of {what} (its tree is the index)"),
                    &tree,
                    &parents,
                )?
            }
        };
        if late.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::lifecycle::error::failed(
                "given up: the removal went on without it",
            ));
        }
        repo.reference(&name, target, true, "worktreefs: kept at removal")?;
        Ok(tip)
    });
    if r.is_err() {
        gave_up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    r
}

/// The tree of the index whose bytes are `bytes`, written to `repo`: its own trees, or,
/// where it cannot be one tree (a conflict's stages), a flat tree holding every blob it
/// names. Read from a file of this thread's own identity (libgit2 reads an index from
/// a path).
fn index_tree(repo: &Repository, bytes: &[u8]) -> LifecycleResult<Oid> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = std::env::temp_dir().join(format!(
        "worktreefs-kept-index-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let r = (|| {
        f.write_all(bytes)?;
        drop(f);
        let mut index = git2::Index::open(&tmp)?;
        match index.write_tree_to(repo) {
            Ok(t) => Ok(t),
            Err(_) => {
                let mut b = repo.treebuilder(None)?;
                for e in index.iter().filter(|e| e.mode != 0o160000) {
                    let _ = b.insert(e.id.to_string(), e.id, 0o100644);
                }
                Ok(b.write()?)
            }
        }
    })();
    let _ = fs::remove_file(&tmp);
    r
}

/// Deletes the ref `name` of the repository at `gitdir`, as its owner.
fn drop_ref(gitdir: &Path, name: &str) -> LifecycleResult<()> {
    let (dir, name) = (gitdir.to_path_buf(), name.to_string());
    crate::git::owner::as_owner_of(gitdir, move || {
        let repo = Repository::open(&dir)?;
        if let Ok(mut r) = repo.find_reference(&name) {
            r.delete()?;
        }
        Ok(())
    })
}

/// Deletes the ref `name` (under [`REMOVED_REF_PREFIX`]) that keeps a removal's objects.
pub fn delete_ref(gitdir: &Path, name: &str) -> LifecycleResult<()> {
    if !(name.starts_with(REMOVED_REF_PREFIX)) {
        return Err(crate::lifecycle::error::refused(format!(
            "{name} is not a kept removal's ref"
        )));
    }
    drop_ref(gitdir, name)
}

fn read_kept(dir: &Path, name: &str) -> Option<String> {
    fs::read_to_string(dir.join(KEPT_DIR).join(name))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// The first step of a removal that keeps: `kept/` in the worktree's directory, holding
/// its git `HEAD` and `index`, and the ref that keeps its tip and staged files (named in
/// `kept/ref` before it is made, so an undo or a purge after a crash finds it). Done
/// already when the directory is parked (a removal carried on after a crash).
///
/// Fails only when git's entry is not this worktree's (parking it would fail too).
/// Anything else that keeps it from keeping (a full disk, an index libgit2 cannot read,
/// a repository that blocks) is written to `kept/failed` and the removal goes on as one
/// that keeps nothing or less: keeping is a safety net, never what stops a removal, a
/// `--discard` or the freeing of a full disk.
pub(super) fn keep(state: &StateDir, t: &Target, index_clean: bool) -> Result<(), String> {
    if !t.dir.exists() && t.parked_dir(state).exists() {
        return Ok(());
    }
    let kept = t.dir.join(KEPT_DIR);
    // A `kept/` this removal began (its ref names this worktree's id) is carried on; any
    // other (a restore killed before it removed the one it brought back) starts again.
    let ours = ref_prefix(t);
    let found = read_kept(&t.dir, "ref");
    let own = found.clone().filter(|r| r.starts_with(&ours));
    if own.is_none() {
        // A restore killed after its worktree was in place, before its ref went: that
        // ref keeps nothing anyone needs any more (one a restore leaves on purpose is
        // no longer named in its `kept/`).
        if let Some(stale) = found.filter(|r| r.starts_with(REMOVED_REF_PREFIX)) {
            if let Err(e) = delete_ref(&t.gitdir, &stale) {
                tracing::warn!("could not delete {stale}: {e:#}");
            }
        }
        let _ = fs::remove_dir_all(&kept);
    }
    let failed = |why: String| {
        tracing::warn!(worktree = %t.path.display(), "removal keeps less: {why}");
        let _ = fs::create_dir_all(&kept);
        let _ = fs::write(kept.join("failed"), format!("{why}\n"));
        Ok(())
    };
    let (head, index) = match read_entry(t) {
        Ok(x) => x,
        Err(NotKept { why, hard: true }) => return Err(why),
        Err(NotKept { why, .. }) => return failed(why),
    };
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", kept.display());
    {
        use std::os::unix::fs::DirBuilderExt;
        match fs::DirBuilder::new().mode(0o700).create(&kept) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return failed(io("creating", e))
            }
            _ => {}
        }
    }
    let _ = fs::remove_file(kept.join("failed"));
    let name = own.unwrap_or_else(|| format!("{ours}{}", now_secs()));
    let written =
        crate::durable::write_file_synced(&kept.join("ref"), format!("{name}\n").as_bytes())
            .and_then(|_| match &index {
                Some(index) => crate::durable::write_file_synced(&kept.join("index"), index),
                None => Ok(()),
            })
            // HEAD last: a kept copy is one whose HEAD is there.
            .and_then(|_| crate::durable::write_file_synced(&kept.join("HEAD"), head.as_bytes()));
    if let Err(e) = written {
        let _ = fs::remove_file(kept.join("HEAD"));
        return failed(io("writing into", e));
    }
    // An unborn or deleted branch has no commit to keep; the index's objects are kept
    // all the same.
    // Nothing staged (as inspection found): the index's objects are HEAD's, which the
    // ref keeps by naming HEAD's commit; no tree of the index is written.
    match keep_objects(
        &t.gitdir,
        &name,
        &head,
        index,
        index_clean,
        &t.repo_and_name(),
    ) {
        Ok(Some(tip)) => {
            let path = kept.join("tip");
            match crate::durable::write_file_synced(&path, format!("{tip}\n").as_bytes()) {
                Ok(()) => Ok(()),
                Err(e) => failed(io("writing into", e)),
            }
        }
        Ok(None) => Ok(()),
        // The copy is kept without it: git's gc may take its commits and staged files.
        Err(e) => failed(format!(
            "keeping its commit and staged files under {name}: {e:#}"
        )),
    }
}

/// The start of the name of the ref a removal of `t` keeps under:
/// `refs/worktreefs/removed/<name>-<id>-` (the id alone where the worktree's name is no
/// part of a valid ref name, as `a..b`).
fn ref_prefix(t: &Target) -> String {
    let named = format!("{REMOVED_REF_PREFIX}{}-{}-", t.name, t.id);
    if git2::Reference::is_valid_name(&format!("{named}0")) {
        named
    } else {
        format!("{REMOVED_REF_PREFIX}{}-", t.id)
    }
}

/// Undoes [`keep`]: the ref, then `kept/`.
pub(super) fn unkeep(t: &Target) -> Result<(), String> {
    if let Some(name) = read_kept(&t.dir, "ref") {
        delete_ref(&t.gitdir, &name).map_err(|e| format!("deleting {name}: {e:#}"))?;
    }
    let kept = t.dir.join(KEPT_DIR);
    match fs::remove_dir_all(&kept) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", kept.display()))
        }
        _ => Ok(()),
    }
}

/// What the removal of `t` kept, read back from its parked directory: Err(why) when
/// nothing restorable was kept (no HEAD; a copy without an index is restored with one
/// of HEAD's tree).
pub(super) fn kept_record(state: &StateDir, t: &Target, how: &str) -> Result<NewKept, String> {
    let dir = t.parked_dir(state);
    let failed = read_kept(&dir, "failed");
    let head = read_kept(&dir, "HEAD");
    if head.is_none() {
        return Err(failed.unwrap_or_else(|| "its HEAD could not be kept".into()));
    }
    if let Some(why) = &failed {
        tracing::warn!(worktree = %t.path.display(), "kept without everything: {why}");
    }
    Ok(NewKept {
        bytes: disk_usage(&dir) as i64,
        head: head.unwrap_or_default(),
        tip: read_kept(&dir, "tip"),
        tip_ref: read_kept(&dir, "ref"),
        how: how.to_string(),
    })
}

/// Deletes one kept copy: its directory, its ref, then its row (with an event saying
/// `why`). Under the worktree's cleanup lock (a restore of it holds that lock): Ok(false)
/// when someone holds it.
pub fn purge_kept(
    state: &StateDir,
    store: &mut Store,
    id: WorktreeId,
    why: &str,
) -> LifecycleResult<bool> {
    let Some(_lock) = try_lock(state, id) else {
        return Ok(false);
    };
    let Some(row) = store.kept_by_id(id)? else {
        return Ok(true);
    };
    // Not there because a restore killed half-way holds it: its rollback puts it back.
    if !state.removed_dir(id).exists()
        && store
            .creations()?
            .iter()
            .any(|c| c.restored_from == Some(id))
    {
        return Ok(false);
    }
    let owner = store.worktree_by_id(id)?;
    // The git entries of its submodule views (gone with the removal, unless a kill came
    // between the removal's last two steps).
    if let Some(w) = &owner {
        crate::lifecycle::submodules::remove_admin_entries(
            state,
            &state.removed_dir(id),
            &format!("{}/{}", w.repo, w.name),
            w.uid,
        );
    }
    // Out of a restore's reach first, in one rename: a purge that stops half-way (a
    // kill, a file that cannot be deleted) never leaves a partial copy to restore.
    let dir = state.removed_dir(id);
    let doomed = state.trash().join(format!("{PURGING}{id}"));
    if dir.exists() {
        let _ = fs::remove_dir_all(&doomed);
        fs::rename(&dir, &doomed).map_err(|e| {
            crate::lifecycle::error::failed(format!(
                "moving {} to {}: {e}",
                dir.display(),
                doomed.display()
            ))
        })?;
    }
    if let Some(name) = &row.tip_ref {
        let gitdir = owner
            .as_ref()
            .and_then(|w| store.repo_by_id(w.repo_id).ok().flatten())
            .map(|r| r.gitdir);
        if let Some(gitdir) = gitdir {
            if let Err(e) = delete_ref(&gitdir, name) {
                tracing::warn!("could not delete {name} in {}: {e:#}", gitdir.display());
            }
        }
    }
    store.drop_kept(id, why)?;
    if doomed.exists() {
        if let Err(e) = fs::remove_dir_all(&doomed) {
            tracing::warn!(
                "could not delete {}: {e} (deleted at the next mount)",
                doomed.display()
            );
        }
    }
    tracing::info!(
        "kept copy of {}/{} (worktree {id}) purged: {why}",
        row.repo,
        row.worktree
    );
    Ok(true)
}

/// Purges the kept copies whose time is over, then, oldest first, as many as it takes
/// for the state directory's disk to be no longer low. Returns how many went.
pub fn purge_due(state: &StateDir, store: &mut Store, policy: &KeepPolicy) -> usize {
    let now = now_secs();
    let mut n = 0;
    let mut purge = |store: &mut Store, r: &KeptRow, why: &str| match purge_kept(
        state,
        store,
        r.worktree_id,
        why,
    ) {
        Ok(done) => n += done as usize,
        Err(e) => tracing::warn!("purging the kept copy of {}/{}: {e:#}", r.repo, r.worktree),
    };
    let rows = store.kept().unwrap_or_default();
    for r in rows.iter().filter(|r| now - r.kept_at >= policy.keep_secs) {
        let why = format!(
            "kept for {} (--keep-removed {} h)",
            crate::report::age(now - r.kept_at),
            policy.keep_secs as f64 / 3600.0
        );
        purge(store, r, &why);
    }
    for r in store.kept().unwrap_or_default() {
        let Some(why) = policy.low_disk(&state.root) else {
            break;
        };
        purge(store, &r, &why);
    }
    n
}

/// Purges every kept copy of repository `repo_id` (before it is unregistered).
pub fn purge_repo(state: &StateDir, store: &mut Store, repo: &str) -> LifecycleResult<usize> {
    let mut n = 0;
    for r in store.kept()?.into_iter().filter(|r| r.repo == repo) {
        if purge_kept(
            state,
            store,
            r.worktree_id,
            "its repository is unregistered",
        )? {
            n += 1;
        } else {
            return Err(crate::lifecycle::error::refused(format!(
                "the kept copy of {}/{} is being restored or purged right now; try again in a moment",
                r.repo,
                r.worktree
            )));
        }
    }
    Ok(n)
}

/// A removal that kept nothing restorable: the ref its first step may have made goes.
pub(super) fn drop_unkept(state: &StateDir, t: &Target) {
    if let Some(name) = read_kept(&t.parked_dir(state), "ref") {
        if let Err(e) = delete_ref(&t.gitdir, &name) {
            tracing::warn!("could not delete {name}: {e:#}");
        }
    }
}
