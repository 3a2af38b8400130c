//! The refs that keep the commits a worktree's checkpoints reach, so that `git gc` never
//! prunes what a rewind would bring back: `refs/worktreefs/checkpoints/<worktree id>/<n>`
//! while checkpoint `n` is kept. When it goes (dropped past the limits or for the disk,
//! or with its worktree at a removal) its ref is retired to
//! `refs/worktreefs/removed/checkpoints/<worktree id>-<n>-<secs>` (`secs`: when), beside
//! the refs removals keep their tips under, and deleted once a removal's kept copy would
//! be (`mount --keep-removed` after it was retired).
//!
//! A checkpoint reaches `HEAD`'s commit and the commits of the branches it recorded (a
//! rewind puts them back); its ref names that commit when it is the only one, else a
//! commit of worktreefs's whose parents they are. Refs are changed as the repository's
//! owner (`owner.rs`).

use std::path::Path;

use git2::{Oid, Repository};

use super::error::GitResult;
use super::owner::as_owner_of;

/// Where the refs of kept checkpoints are.
pub const KEPT_PREFIX: &str = "refs/worktreefs/checkpoints/";
/// Where the refs of checkpoints gone are, for the removal period.
pub const RETIRED_PREFIX: &str = "refs/worktreefs/removed/checkpoints/";

/// The ref keeping what checkpoint `n` of worktree `key` reaches.
pub fn kept_ref(key: &str, n: u64) -> String {
    format!("{KEPT_PREFIX}{key}/{n}")
}

/// Makes checkpoint `n`'s ref name what it reaches: `commits`, `HEAD`'s first (none for
/// an unborn branch with no other branch recorded: no ref then).
pub(super) fn keep(repo: &Repository, key: &str, n: u64, commits: &[Oid]) -> GitResult<()> {
    let mut distinct: Vec<Oid> = Vec::new();
    for c in commits {
        if !distinct.contains(c) && repo.find_commit(*c).is_ok() {
            distinct.push(*c);
        }
    }
    let target = match distinct.as_slice() {
        [] => return Ok(()),
        [one] => *one,
        many => {
            let tree = repo.find_tree(repo.treebuilder(None)?.write()?)?;
            let parents: Vec<git2::Commit> = many
                .iter()
                .map(|c| repo.find_commit(*c))
                .collect::<Result<_, _>>()?;
            let parents: Vec<&git2::Commit> = parents.iter().collect();
            let sig = git2::Signature::now("worktreefs", "worktreefs@localhost")?;
            repo.commit(
                None,
                &sig,
                &sig,
                &format!(
                    "worktreefs: what checkpoint {n} of worktree {key} reaches (HEAD's commit and its branches')"
                ),
                &tree,
                &parents,
            )?
        }
    };
    repo.reference(&kept_ref(key, n), target, true, "worktreefs: checkpoint")?;
    Ok(())
}

/// Moves the ref `name` (a kept checkpoint's, `<key>/<n>` after [`KEPT_PREFIX`]) to the
/// retired ones, named for `now`. Another retired at the same second under the same name
/// (checkpoint numbers come again once every checkpoint is gone) gets a suffix.
fn retire_in(repo: &Repository, name: &str, now: i64) -> GitResult<bool> {
    let Some((key, n)) = name
        .strip_prefix(KEPT_PREFIX)
        .and_then(|rest| rest.split_once('/'))
    else {
        return Ok(false);
    };
    let Ok(mut r) = repo.find_reference(name) else {
        return Ok(false);
    };
    let target = r.target();
    for k in 0..100 {
        let suffix = if k == 0 {
            String::new()
        } else {
            format!(".{k}")
        };
        let to = format!("{RETIRED_PREFIX}{key}-{n}{suffix}-{now}");
        match repo.find_reference(&to) {
            Ok(there) if there.target() == target => {
                r.delete()?;
                return Ok(true);
            }
            Ok(_) => continue,
            Err(_) => {
                r.rename(
                    &to,
                    false,
                    "worktreefs: checkpoint gone, kept for the removal period",
                )?;
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Retires checkpoint `n`'s ref of worktree `key` in the repository at `gitdir` (nothing
/// when it has none).
pub fn retire(gitdir: &Path, key: &str, n: u64) -> GitResult<()> {
    let (dir, name) = (gitdir.to_path_buf(), kept_ref(key, n));
    let now = now_secs();
    as_owner_of(gitdir, move || -> GitResult<()> {
        let repo = Repository::open_bare(&dir)?;
        retire_in(&repo, &name, now)?;
        Ok(())
    })
}

/// What a sweep of one repository's checkpoint refs did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Refs of checkpoints whose worktree is gone, retired.
    pub retired: usize,
    /// Retired refs whose period was over, deleted.
    pub deleted: usize,
}

/// In the repository at `gitdir`: retires the refs of every worktree not in `live` (its
/// ids: removed, or a removal cut short before it retired them), then deletes the
/// retired refs retired `keep_secs` or more ago.
pub fn sweep(gitdir: &Path, live: Vec<String>, keep_secs: i64) -> GitResult<Swept> {
    let dir = gitdir.to_path_buf();
    let now = now_secs();
    as_owner_of(gitdir, move || -> GitResult<Swept> {
        let repo = Repository::open_bare(&dir)?;
        let mut swept = Swept::default();
        for name in names_under(&repo, KEPT_PREFIX)? {
            let key = name[KEPT_PREFIX.len()..].split('/').next().unwrap_or("");
            if !live.iter().any(|l| l == key) && retire_in(&repo, &name, now)? {
                swept.retired += 1;
            }
        }
        for name in names_under(&repo, RETIRED_PREFIX)? {
            let Some(at) = name
                .rsplit_once('-')
                .and_then(|(_, s)| s.parse::<i64>().ok())
            else {
                continue; // not a name this file gives
            };
            if now - at >= keep_secs {
                if let Ok(mut r) = repo.find_reference(&name) {
                    r.delete()?;
                    swept.deleted += 1;
                }
            }
        }
        Ok(swept)
    })
}

/// Deletes every checkpoint ref of the repository at `gitdir`, kept and retired (before
/// it is unregistered). Returns how many went.
pub fn delete_all(gitdir: &Path) -> GitResult<usize> {
    let dir = gitdir.to_path_buf();
    as_owner_of(gitdir, move || -> GitResult<usize> {
        let repo = Repository::open_bare(&dir)?;
        let mut n = 0;
        for prefix in [KEPT_PREFIX, RETIRED_PREFIX] {
            for name in names_under(&repo, prefix)? {
                if let Ok(mut r) = repo.find_reference(&name) {
                    r.delete()?;
                    n += 1;
                }
            }
        }
        Ok(n)
    })
}

fn names_under(repo: &Repository, prefix: &str) -> GitResult<Vec<String>> {
    let mut names = Vec::new();
    for r in repo.references_glob(&format!("{prefix}*"))? {
        if let Some(name) = r?.name() {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_with_commits(n: usize) -> (tempfile::TempDir, Vec<Oid>) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let commits = (0..n)
            .map(|i| {
                repo.commit(None, &sig, &sig, &format!("c{i}"), &tree, &[])
                    .unwrap()
            })
            .collect();
        (dir, commits)
    }

    fn names(dir: &Path, prefix: &str) -> Vec<String> {
        names_under(&Repository::open_bare(dir).unwrap(), prefix).unwrap()
    }

    #[test]
    fn a_ref_names_the_one_commit_or_one_whose_parents_are_all_of_them() {
        let (dir, c) = repo_with_commits(3);
        let repo = Repository::open_bare(dir.path()).unwrap();
        keep(&repo, "7", 1, &[c[0], c[0]]).unwrap();
        assert_eq!(repo.refname_to_id(&kept_ref("7", 1)).unwrap(), c[0]);
        keep(&repo, "7", 2, &[c[1], c[2], c[1]]).unwrap();
        let keeper = repo
            .find_commit(repo.refname_to_id(&kept_ref("7", 2)).unwrap())
            .unwrap();
        assert_eq!(keeper.parent_ids().collect::<Vec<_>>(), vec![c[1], c[2]]);
        // Nothing to reach (an unborn branch): no ref.
        keep(&repo, "7", 3, &[]).unwrap();
        assert!(repo.find_reference(&kept_ref("7", 3)).is_err());
    }

    #[test]
    fn retired_refs_keep_their_commit_until_the_period_is_over() {
        let (dir, c) = repo_with_commits(2);
        let repo = Repository::open_bare(dir.path()).unwrap();
        keep(&repo, "7", 1, &[c[0]]).unwrap();
        keep(&repo, "7", 2, &[c[1]]).unwrap();
        keep(&repo, "12", 1, &[c[1]]).unwrap();
        retire(dir.path(), "7", 1).unwrap();
        // Nothing there: nothing to do.
        retire(dir.path(), "7", 9).unwrap();
        let retired = names(dir.path(), RETIRED_PREFIX);
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert!(retired[0].starts_with(&format!("{RETIRED_PREFIX}7-1-")));
        assert_eq!(repo.refname_to_id(&retired[0]).unwrap(), c[0]);
        // Worktree 12 is gone, 7 lives (an id that is a prefix of another is not it).
        let s = sweep(dir.path(), vec!["7".into(), "1".into()], 3600).unwrap();
        assert_eq!(
            s,
            Swept {
                retired: 1,
                deleted: 0
            }
        );
        assert_eq!(names(dir.path(), KEPT_PREFIX), vec![kept_ref("7", 2)]);
        assert_eq!(names(dir.path(), RETIRED_PREFIX).len(), 2);
        // The period over: the retired ones go, the kept one stays.
        let s = sweep(dir.path(), vec!["7".into()], 0).unwrap();
        assert_eq!(
            s,
            Swept {
                retired: 0,
                deleted: 2
            }
        );
        assert_eq!(names(dir.path(), KEPT_PREFIX), vec![kept_ref("7", 2)]);
        assert_eq!(delete_all(dir.path()).unwrap(), 1);
        assert!(names(dir.path(), "refs/worktreefs/").is_empty());
    }

    #[test]
    fn the_same_checkpoint_number_retired_twice_in_a_second_keeps_both() {
        let (dir, c) = repo_with_commits(3);
        let repo = Repository::open_bare(dir.path()).unwrap();
        for commit in [c[0], c[1], c[1]] {
            keep(&repo, "7", 1, &[commit]).unwrap();
            assert!(retire_in(&repo, &kept_ref("7", 1), 1000).unwrap());
        }
        let mut retired: Vec<Oid> = names(dir.path(), RETIRED_PREFIX)
            .iter()
            .map(|n| repo.refname_to_id(n).unwrap())
            .collect();
        retired.sort();
        let mut want = vec![c[0], c[1]];
        want.sort();
        assert_eq!(retired, want, "one each, the same commit not twice");
        assert!(repo.find_reference(&kept_ref("7", 1)).is_err());
    }
}
