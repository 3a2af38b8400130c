//! Finding a repository, resolving a revision, and the admin entry of a linked worktree
//! under `<gitdir>/worktrees/`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use git2::{Oid, Repository};

use crate::durable::write_synced;

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

/// Where git keeps a linked worktree's administrative files.
pub fn admin_dir(gitdir: &Path, admin_name: &str) -> PathBuf {
    gitdir.join("worktrees").join(admin_name)
}

/// Picks a free admin entry name for worktree `name`, the way git suffixes numbers.
pub fn free_admin_name(gitdir: &Path, name: &str) -> String {
    free_admin_name_except(gitdir, name, &[])
}

/// As `free_admin_name`, also passing over the names in `taken` (creations in progress).
pub fn free_admin_name_except(gitdir: &Path, name: &str, taken: &[String]) -> String {
    let base = format!("wtfs-{name}");
    let free = |n: &String| !admin_dir(gitdir, n).exists() && !taken.contains(n);
    if free(&base) {
        return base;
    }
    (1..)
        .map(|i| format!("{base}{i}"))
        .find(free)
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
            // Read as a file its user may have made anything (a FIFO would hold `new`).
            let head = crate::beneath::read_regular_in(&e.path(), Path::new("HEAD"), 64 << 10)
                .map(|(b, _)| String::from_utf8_lossy(&b).into_owned());
            if let Ok(head) = head {
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
    // Made here or refused: never an entry someone else made in the meantime.
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::create_dir(dir).with_context(|| {
        format!(
            "creating git worktree entry {} (it may exist already)",
            dir.display()
        )
    })?;
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
