//! git's own state of a linked worktree at a checkpoint: its `HEAD`, its index and the
//! files of a merge, cherry-pick, revert or rebase under way, kept beside them in its
//! admin directory (`<admin>/worktreefs-checkpoints/<n>/`; the index as a hard link:
//! git only ever replaces it by a rename, so the link keeps the old one, in O(1)); the
//! branch `HEAD` names and its commit; and a ref that keeps `HEAD`'s commit reachable
//! while the checkpoint is kept. Everything is done as the repository's owner (see
//! `owner.rs`). Shared refs (other branches, remote-tracking refs, `refs/stash`) are
//! never touched; the reflogs are appended to, never rewound.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::error::{GitContext, GitResult};
use super::owner::as_owner_of;

/// The directory in a worktree's admin entry holding its checkpoints' git state.
pub const DIR: &str = "worktreefs-checkpoints";
/// Written last: the state of a checkpoint is complete.
const COMPLETE: &str = "complete";
/// The per-worktree files git keeps in the admin entry that a checkpoint keeps.
const FILES: [&str; 8] = [
    "HEAD",
    "ORIG_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
];
/// The per-worktree directories of an operation under way.
const DIRS: [&str; 3] = ["rebase-merge", "rebase-apply", "sequencer"];
const INDEX: &str = "index";
const BRANCH: &str = "branch";

/// The ref keeping checkpoint `n`'s `HEAD` commit of worktree `key` reachable.
pub fn keep_ref(key: &str, n: u64) -> String {
    format!("refs/worktreefs/checkpoints/{key}/{n}")
}

fn state_dir(admin: &Path, n: u64) -> PathBuf {
    admin.join(DIR).join(n.to_string())
}

/// Whether checkpoint `n`'s git state is kept whole.
pub fn is_saved(admin: &Path, n: u64) -> bool {
    state_dir(admin, n).join(COMPLETE).is_file()
}

fn is_file(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        } else if t.is_file() {
            fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// Keeps the git state of the worktree whose admin entry is `admin` (of the repository
/// `gitdir`) as checkpoint `n`'s, `key` naming the worktree in the ref that keeps its
/// commit.
pub fn save(gitdir: &Path, admin: &Path, key: &str, n: u64) -> GitResult<()> {
    let (gitdir, admin, key) = (gitdir.to_path_buf(), admin.to_path_buf(), key.to_string());
    let what = format!(
        "keeping git's state of {} as checkpoint {n}",
        admin.display()
    );
    as_owner_of(&gitdir.clone(), move || -> GitResult<()> {
        let to = state_dir(&admin, n);
        if to.exists() {
            fs::remove_dir_all(&to)?;
        }
        fs::create_dir_all(&to)?;
        for f in FILES {
            if is_file(&admin.join(f)) {
                fs::copy(admin.join(f), to.join(f))?;
            }
        }
        if is_file(&admin.join(INDEX)) && fs::hard_link(admin.join(INDEX), to.join(INDEX)).is_err()
        {
            fs::copy(admin.join(INDEX), to.join(INDEX))?;
        }
        for d in DIRS {
            if admin.join(d).is_dir() {
                copy_tree(&admin.join(d), &to.join(d))?;
            }
        }
        let head = fs::read_to_string(admin.join("HEAD")).unwrap_or_default();
        let repo = git2::Repository::open_bare(&gitdir)?;
        if let Some(branch) = head.trim_end().strip_prefix("ref: ") {
            let oid = repo
                .find_reference(branch)
                .ok()
                .and_then(|r| r.target())
                .map_or("-".to_string(), |o| o.to_string());
            fs::write(to.join(BRANCH), format!("{branch} {oid}\n"))?;
        }
        if let Some(commit) = head_commit(&repo, &head) {
            repo.reference(&keep_ref(&key, n), commit, true, "worktreefs: checkpoint")?;
        }
        fs::write(to.join(COMPLETE), b"")?;
        Ok(())
    })
    .with_context(|| what)
}

/// The commit a `HEAD` file's text names (none for an unborn branch).
fn head_commit(repo: &git2::Repository, head: &str) -> Option<git2::Oid> {
    let h = head.trim_end();
    match h.strip_prefix("ref: ") {
        Some(r) => repo.find_reference(r).ok()?.target(),
        None => git2::Oid::from_str(h).ok(),
    }
}

/// Puts checkpoint `n`'s git state back: the files of the admin entry (those it did not
/// have removed), the index, and the branch `HEAD` named at its commit then; `HEAD`'s
/// reflog and the branch's get a line saying so.
pub fn restore(gitdir: &Path, admin: &Path, n: u64) -> GitResult<()> {
    let (gitdir, admin) = (gitdir.to_path_buf(), admin.to_path_buf());
    let what = format!(
        "putting back git's state of {} at checkpoint {n}",
        admin.display()
    );
    as_owner_of(&gitdir.clone(), move || -> GitResult<()> {
        let from = state_dir(&admin, n);
        if !from.join(COMPLETE).is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not complete", from.display()),
            )
            .into());
        }
        let repo = git2::Repository::open_bare(&gitdir)?;
        let before = fs::read_to_string(admin.join("HEAD")).unwrap_or_default();
        let old = head_commit(&repo, &before);
        let tmp = |f: &str| admin.join(format!("{f}.worktreefs-tmp"));
        for f in FILES {
            if is_file(&from.join(f)) {
                fs::copy(from.join(f), tmp(f))?;
                fs::rename(tmp(f), admin.join(f))?;
            } else if is_file(&admin.join(f)) {
                fs::remove_file(admin.join(f))?;
            }
        }
        if is_file(&from.join(INDEX)) {
            let _ = fs::remove_file(tmp(INDEX));
            if fs::hard_link(from.join(INDEX), tmp(INDEX)).is_err() {
                fs::copy(from.join(INDEX), tmp(INDEX))?;
            }
            fs::rename(tmp(INDEX), admin.join(INDEX))?;
        } else if is_file(&admin.join(INDEX)) {
            fs::remove_file(admin.join(INDEX))?;
        }
        for d in DIRS {
            if admin.join(d).is_dir() {
                fs::remove_dir_all(admin.join(d))?;
            }
            if from.join(d).is_dir() {
                copy_tree(&from.join(d), &admin.join(d))?;
            }
        }
        let message = format!("worktreefs: rewind to checkpoint {n}");
        if let Ok(line) = fs::read_to_string(from.join(BRANCH)) {
            if let Some((name, oid)) = line.trim_end().split_once(' ') {
                match git2::Oid::from_str(oid) {
                    Ok(oid) => {
                        repo.reference(name, oid, true, &message)?;
                    }
                    Err(_) => {
                        if let Ok(mut r) = repo.find_reference(name) {
                            r.delete()?;
                        }
                    }
                }
            }
        }
        let after = fs::read_to_string(admin.join("HEAD")).unwrap_or_default();
        let new = head_commit(&repo, &after);
        append_head_log(&admin, old, new, &message)?;
        Ok(())
    })
    .with_context(|| what)
}

/// A line in the worktree's `HEAD` reflog, as git writes one.
fn append_head_log(
    admin: &Path,
    old: Option<git2::Oid>,
    new: Option<git2::Oid>,
    message: &str,
) -> io::Result<()> {
    use std::io::Write;
    let zero = git2::Oid::zero();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let line = format!(
        "{} {} worktreefs <worktreefs@localhost> {now} +0000\t{message}\n",
        old.unwrap_or(zero),
        new.unwrap_or(zero)
    );
    fs::create_dir_all(admin.join("logs"))?;
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(admin.join("logs").join("HEAD"))?
        .write_all(line.as_bytes())
}

/// Removes checkpoint `n`'s git state. Its ref stays: the commit it keeps goes only when
/// a removal's kept refs would (nothing a checkpoint reached is lost with it).
pub fn drop(gitdir: &Path, admin: &Path, n: u64) -> GitResult<()> {
    let (gitdir, admin) = (gitdir.to_path_buf(), admin.to_path_buf());
    as_owner_of(&gitdir, move || -> GitResult<()> {
        let d = state_dir(&admin, n);
        if d.exists() {
            fs::remove_dir_all(d)?;
        }
        Ok(())
    })
}
