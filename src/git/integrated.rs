//! Whether a worktree's commits are upstream by content (docs/contract.md, "Cleanup", condition 3):
//! merging its HEAD into a remote-tracking ref would leave that ref's tree unchanged, as
//! after a squash or rebase merge. Not patch-ids alone (they ignore whitespace: a
//! whitespace-only fix would count as integrated); patch-ids only say which kind of merge
//! it was.
//!
//! The merge is computed in memory: the repository's object database gets an in-memory
//! backend of top priority for this check, so the merged blobs and trees it writes never
//! reach the disk (the daemon runs as root; the repository is a user's).

use std::collections::HashSet;
use std::path::Path;

use git2::{Oid, ReferenceType, Repository};

/// How HEAD's work is upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Integration {
    /// The remote-tracking ref, short (`origin/main`).
    pub into: String,
    /// Every commit of HEAD's has a patch-equivalent there (a rebase merge), or not (a
    /// squash merge).
    pub rebased: bool,
}

impl std::fmt::Display for Integration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "integrated: {} into {}",
            if self.rebased {
                "rebase-merged"
            } else {
                "squash-merged"
            },
            self.into
        )
    }
}

/// How many commits of a remote-tracking ref since the merge base are looked at for
/// patch-ids (only to name the kind of merge).
const PATCH_ID_WINDOW: usize = 2000;

/// How many remote-tracking refs are merged into at most (the rest count as not
/// integrated: a worktree found so is kept, never removed).
const MAX_REFS: usize = 64;

/// [`integrated`] on a thread whose file-system identity is the repository's owner (the
/// merge's writes go to memory, but libgit2 first "freshens" an object that exists by
/// setting its times, through whatever link the owner put in its place), bounded in
/// time: a check that fails or takes too long says not integrated.
pub fn integrated_as_owner(
    gitdir: &Path,
    head: Oid,
    commits: &[Oid],
) -> Result<Option<Integration>, String> {
    let (dir, commits) = (gitdir.to_path_buf(), commits.to_vec());
    super::owner::as_owner_of(gitdir, move || {
        integrated(&dir, head, &commits).map_err(|e| {
            super::error::GitError::new(super::error::GitErrorKind::Failed, e.message())
        })
    })
    .map_err(|e| format!("{e:#}"))
}

/// The first remote-tracking ref (by name) that HEAD `head`'s work `commits` (HEAD's
/// commits on no remote-tracking ref) is integrated into: the merge of `head` into it
/// has no conflict and its tree is the ref's own. None when there is none.
pub fn integrated(
    gitdir: &Path,
    head: Oid,
    commits: &[Oid],
) -> Result<Option<Integration>, git2::Error> {
    let repo = Repository::open(gitdir)?;
    let odb = repo.odb()?;
    // Everything the merge writes goes here, in memory, and goes with it.
    let mempack = odb.add_new_mempack_backend(1000)?;
    let head_commit = repo.find_commit(head)?;
    let mut refs: Vec<(String, Oid)> = Vec::new();
    for r in repo.references_glob("refs/remotes/*")? {
        let r = r?;
        if r.kind() == Some(ReferenceType::Symbolic) {
            continue; // origin/HEAD names another
        }
        let Ok(c) = r.peel_to_commit() else {
            continue;
        };
        let name = r.shorthand().unwrap_or("?").to_string();
        refs.push((name, c.id()));
    }
    refs.sort();
    for (name, tip) in refs.into_iter().take(MAX_REFS) {
        // Histories that share nothing are no merge (libgit2 would merge against an empty
        // base, and HEAD's deletions would look upstream).
        if repo.merge_base(tip, head).is_err() {
            continue;
        }
        // What the last merge wrote goes (memory stays bounded).
        mempack.reset()?;
        let upstream = repo.find_commit(tip)?;
        let mut index = match repo.merge_commits(&upstream, &head_commit, None) {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!("merging {head} into {name} for the integration check: {e}");
                continue;
            }
        };
        if index.has_conflicts() {
            continue;
        }
        if index.write_tree_to(&repo)? != upstream.tree_id() {
            continue;
        }
        let rebased = all_patch_equivalent(&repo, tip, head, commits).unwrap_or(false);
        return Ok(Some(Integration {
            into: name,
            rebased,
        }));
    }
    Ok(None)
}

/// The patch-id of commit `c` against its first parent (None for a merge or a root).
fn patch_id(repo: &Repository, c: Oid) -> Option<Oid> {
    let commit = repo.find_commit(c).ok()?;
    if commit.parent_count() != 1 {
        return None;
    }
    let parent = commit.parent(0).ok()?.tree().ok()?;
    let diff = repo
        .diff_tree_to_tree(Some(&parent), Some(&commit.tree().ok()?), None)
        .ok()?;
    diff.patchid(None).ok()
}

/// Whether each of `commits` has a patch-equivalent among `upstream`'s commits since its
/// merge base with `head`.
fn all_patch_equivalent(
    repo: &Repository,
    upstream: Oid,
    head: Oid,
    commits: &[Oid],
) -> Result<bool, git2::Error> {
    let base = repo.merge_base(upstream, head)?;
    let mut walk = repo.revwalk()?;
    walk.push(upstream)?;
    walk.hide(base)?;
    let theirs: HashSet<Oid> = walk
        .take(PATCH_ID_WINDOW)
        .filter_map(|c| c.ok())
        .filter_map(|c| patch_id(repo, c))
        .collect();
    Ok(!commits.is_empty()
        && commits
            .iter()
            .all(|c| patch_id(repo, *c).is_some_and(|p| theirs.contains(&p))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .env("GIT_AUTHOR_NAME", "T")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "T")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn write(dir: &Path, path: &str, text: &str) {
        std::fs::write(dir.join(path), text).unwrap();
    }

    /// A clone `work` of a bare `remote` with main at two commits, and a branch `task` at
    /// main with the work of each case to follow.
    fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let remote = d.path().join("remote.git");
        let work = d.path().join("work");
        git(
            d.path(),
            &["init", "-q", "--bare", "-b", "main", "remote.git"],
        );
        git(d.path(), &["clone", "-q", "remote.git", "work"]);
        write(&work, "a.txt", "one\ntwo\nthree\n");
        write(&work, "b.txt", "b\n");
        git(&work, &["add", "."]);
        git(&work, &["commit", "-q", "-m", "first"]);
        git(&work, &["push", "-q", "origin", "HEAD:main"]);
        git(&work, &["checkout", "-q", "-b", "task"]);
        (d, remote, work)
    }

    fn commit(work: &Path, path: &str, text: &str, msg: &str) {
        write(work, path, text);
        git(work, &["add", "."]);
        git(work, &["commit", "-q", "-m", msg]);
    }

    /// The task's commits on no remote-tracking ref, newest first.
    fn unpushed(work: &Path) -> Vec<Oid> {
        git(work, &["rev-list", "HEAD", "--not", "--remotes"])
            .lines()
            .map(|l| Oid::from_str(l).unwrap())
            .collect()
    }

    fn check(work: &Path) -> Option<Integration> {
        let head = Oid::from_str(&git(work, &["rev-parse", "HEAD"])).unwrap();
        integrated(&work.join(".git"), head, &unpushed(work)).unwrap()
    }

    /// Lands `task`'s work on the remote's main as `how` does, through a second clone.
    fn land(remote: &Path, work: &Path, how: &str) {
        let other = remote.parent().unwrap().join(format!("land-{how}"));
        git(
            remote.parent().unwrap(),
            &["clone", "-q", "remote.git", other.to_str().unwrap()],
        );
        git(
            &other,
            &["fetch", "-q", work.to_str().unwrap(), "task:task"],
        );
        match how {
            "squash" => {
                git(&other, &["merge", "-q", "--squash", "task"]);
                git(&other, &["commit", "-q", "-m", "task (squashed)"]);
            }
            "rebase" => {
                git(&other, &["rebase", "-q", "main", "task"]);
                git(&other, &["checkout", "-q", "main"]);
                git(&other, &["merge", "-q", "--ff-only", "task"]);
            }
            _ => unreachable!(),
        }
        git(&other, &["push", "-q", "origin", "main"]);
        git(work, &["fetch", "-q", "origin"]);
    }

    fn loose_objects(gitdir: &Path) -> usize {
        walkdir(gitdir.join("objects"))
    }

    fn walkdir(p: std::path::PathBuf) -> usize {
        std::fs::read_dir(&p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        if e.file_type().unwrap().is_dir() {
                            walkdir(e.path())
                        } else {
                            1
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    #[test]
    fn integration_table() {
        // (case, what the task does and how it lands, integrated into origin/main as)
        type Case = (&'static str, fn(&Path, &Path), Option<bool>);
        let cases: Vec<Case> = vec![
            (
                "squash-merged upstream, main moved on after",
                |remote, work| {
                    commit(work, "a.txt", "one\nTWO\nthree\n", "t1");
                    commit(work, "c.txt", "new\n", "t2");
                    land(remote, work, "squash");
                    // Upstream moves on in a file the task never touched.
                    let other = remote.parent().unwrap().join("land-squash");
                    commit(&other, "b.txt", "b2\n", "later");
                    git(&other, &["push", "-q", "origin", "main"]);
                    git(work, &["fetch", "-q", "origin"]);
                },
                Some(false),
            ),
            (
                "rebase-merged upstream over another commit",
                |remote, work| {
                    commit(work, "c.txt", "new\n", "t1");
                    commit(work, "d.txt", "more\n", "t2");
                    // Main moves first, so the rebase makes new commits.
                    let other = remote.parent().unwrap().join("moving");
                    git(
                        remote.parent().unwrap(),
                        &["clone", "-q", "remote.git", other.to_str().unwrap()],
                    );
                    commit(&other, "b.txt", "b2\n", "elsewhere");
                    git(&other, &["push", "-q", "origin", "main"]);
                    land(remote, work, "rebase");
                },
                Some(true),
            ),
            (
                "a remote branch of unrelated history that holds the same files",
                |remote, work| {
                    commit(work, "c.txt", "new\n", "t1");
                    // An orphan branch whose tree is the task's without one file.
                    let other = remote.parent().unwrap().join("orphan");
                    git(
                        remote.parent().unwrap(),
                        &["clone", "-q", "remote.git", other.to_str().unwrap()],
                    );
                    git(&other, &["checkout", "-q", "--orphan", "lone"]);
                    write(&other, "c.txt", "new\n");
                    git(&other, &["add", "."]);
                    git(&other, &["commit", "-q", "-m", "lone"]);
                    git(&other, &["push", "-q", "origin", "lone"]);
                    git(work, &["fetch", "-q", "origin"]);
                },
                None,
            ),
            (
                "not landed at all",
                |_, work| commit(work, "c.txt", "new\n", "t1"),
                None,
            ),
            (
                "not landed, and main moved on elsewhere (the merge is a new tree)",
                |remote, work| {
                    commit(work, "a.txt", "one\nTWO\nthree\n", "t1");
                    let other = remote.parent().unwrap().join("moving");
                    git(
                        remote.parent().unwrap(),
                        &["clone", "-q", "remote.git", other.to_str().unwrap()],
                    );
                    commit(&other, "a.txt", "one\ntwo\nthree\nfour\n", "elsewhere");
                    git(&other, &["push", "-q", "origin", "main"]);
                    git(work, &["fetch", "-q", "origin"]);
                },
                None,
            ),
            (
                "half landed: one commit of two squashed upstream",
                |remote, work| {
                    commit(work, "c.txt", "new\n", "t1");
                    land(remote, work, "squash");
                    commit(work, "d.txt", "more\n", "t2");
                },
                None,
            ),
            (
                "landed, then a whitespace-only fix on top",
                |remote, work| {
                    commit(work, "c.txt", "new\n", "t1");
                    land(remote, work, "squash");
                    commit(work, "c.txt", "new \n", "whitespace");
                },
                None,
            ),
            (
                "upstream took it and changed it further (a conflict)",
                |remote, work| {
                    commit(work, "a.txt", "one\nTWO\nthree\n", "t1");
                    land(remote, work, "squash");
                    let other = remote.parent().unwrap().join("land-squash");
                    commit(&other, "a.txt", "one\nDEUX\nthree\n", "reworded");
                    git(&other, &["push", "-q", "origin", "main"]);
                    git(work, &["fetch", "-q", "origin"]);
                },
                None,
            ),
            (
                "upstream reverted it after the squash",
                |remote, work| {
                    commit(work, "c.txt", "new\n", "t1");
                    land(remote, work, "squash");
                    let other = remote.parent().unwrap().join("land-squash");
                    git(&other, &["rm", "-q", "c.txt"]);
                    git(&other, &["commit", "-q", "-m", "revert"]);
                    git(&other, &["push", "-q", "origin", "main"]);
                    git(work, &["fetch", "-q", "origin"]);
                },
                None,
            ),
        ];
        for (case, prepare, want) in cases {
            let (_d, remote, work) = setup();
            prepare(&remote, &work);
            assert!(
                !unpushed(&work).is_empty(),
                "{case}: the task has unpushed commits"
            );
            let before = loose_objects(&work.join(".git"));
            let got = check(&work);
            assert_eq!(
                loose_objects(&work.join(".git")),
                before,
                "{case}: the check wrote nothing to the repository"
            );
            match (want, &got) {
                (None, None) => {}
                (Some(rebased), Some(i)) => {
                    assert_eq!(i.into, "origin/main", "{case}");
                    assert_eq!(i.rebased, rebased, "{case}: {i}");
                }
                _ => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn an_integration_says_how_and_where() {
        let i = Integration {
            into: "origin/main".into(),
            rebased: false,
        };
        assert_eq!(i.to_string(), "integrated: squash-merged into origin/main");
    }
}
