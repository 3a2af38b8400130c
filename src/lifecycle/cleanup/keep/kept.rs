//! Keeping a removal: `kept/` in the worktree's directory (git's `HEAD` and `index`),
//! and the ref of worktreefs's own that keeps its tip and staged files from `git gc`;
//! undoing that, reading it back, dropping what kept nothing restorable.

use std::fs;
use std::path::Path;

use git2::{Oid, Repository};

use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;
use crate::store::{now_secs, NewKept};

use super::policy::disk_usage;
use crate::lifecycle::cleanup::git_files::{head_commit, read_entry, NotKept};
use crate::lifecycle::cleanup::target::Target;

/// The directory in a worktree's own directory that holds what was copied from git's
/// entry at its removal.
pub const KEPT_DIR: &str = "kept";

/// Where the tips of removed worktrees are kept in their repository.
pub const REMOVED_REF_PREFIX: &str = "refs/worktreefs/removed/";

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

/// Deletes the ref `name` of the repository at `gitdir`, as its owner (through git:
/// `git::ref_delete`).
fn drop_ref(gitdir: &Path, name: &str) -> LifecycleResult<()> {
    crate::git::ref_delete::delete_ref(gitdir, name, None)?;
    Ok(())
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
pub(crate) fn keep(state: &StateDir, t: &Target, index_clean: bool) -> Result<(), String> {
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
pub(crate) fn unkeep(t: &Target) -> Result<(), String> {
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
pub(crate) fn kept_record(state: &StateDir, t: &Target, how: &str) -> Result<NewKept, String> {
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

/// A removal that kept nothing restorable: the ref its first step may have made goes.
pub(crate) fn drop_unkept(state: &StateDir, t: &Target) {
    if let Some(name) = read_kept(&t.parked_dir(state), "ref") {
        if let Err(e) = delete_ref(&t.gitdir, &name) {
            tracing::warn!("could not delete {name}: {e:#}");
        }
    }
}
