//! The refs that keep the commits a worktree's checkpoints reach, so that `git gc` never
//! prunes what a rewind would bring back: `refs/worktreefs/checkpoints/<key>/<n>` while
//! checkpoint `n` is kept, `<key>` naming the worktree as `<state key>-<worktree id>` (the
//! state directory's own key: ids are each store's, and one repository may be registered
//! in two). When it goes (dropped past the limits or for the disk, or with its worktree
//! at a removal) its ref is retired to
//! `refs/worktreefs/removed/checkpoints/<key>-<n>-<secs>` (`secs`: when), beside the refs
//! removals keep their tips under, and deleted once a removal's kept copy would be
//! (`mount --keep-removed` after it was retired). Refs of the first version named the
//! worktree by its id alone (`<id>/<n>`): taken as this state directory's.
//!
//! A checkpoint reaches `HEAD`'s commit, the commits of the branches it recorded (a
//! rewind puts them back) and those of an operation under way (`MERGE_HEAD` and the
//! like); its ref names that commit when it is the only one, else a commit of
//! worktreefs's whose parents they are. Blobs only its index names (staged, never
//! committed) are not kept from `gc`. Refs are changed as the repository's owner
//! (`owner.rs`); one that cannot be is logged and the others go on.

use std::path::Path;

use git2::{Oid, Repository};

use super::error::{GitContext, GitResult};
use super::owner::as_owner_of;

/// Where the refs of kept checkpoints are.
pub const KEPT_PREFIX: &str = "refs/worktreefs/checkpoints/";
/// Where the refs of checkpoints gone are, for the removal period.
pub const RETIRED_PREFIX: &str = "refs/worktreefs/removed/checkpoints/";

/// The ref keeping what checkpoint `n` of worktree `key` reaches.
pub fn kept_ref(key: &str, n: u64) -> String {
    format!("{KEPT_PREFIX}{key}/{n}")
}

/// How worktree `id` of the state directory whose key is `refs_key` is named in refs.
pub fn worktree_key(refs_key: &str, id: i64) -> String {
    format!("{refs_key}-{id}")
}

/// The worktree id a ref's worktree part (`<key>` of a kept ref; `<key>-<n>[.k]-<secs>`
/// of a retired one, with `retired`) names, when it is this state directory's.
fn ours(part: &str, refs_key: &str, retired: bool) -> Option<i64> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let rest = match part
        .strip_prefix(refs_key)
        .and_then(|r| r.strip_prefix('-'))
    {
        Some(rest) => rest,
        // The first version's: the id alone.
        None if part.split('-').next().is_some_and(digits) => part,
        None => return None,
    };
    let mut fields = rest.split('-');
    let id = fields.next().filter(|f| digits(f))?.parse().ok()?;
    let more: Vec<&str> = fields.collect();
    let shape = if retired {
        more.len() == 2 && digits(more[1])
    } else {
        more.is_empty()
    };
    shape.then_some(id)
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
    let name = kept_ref(key, n);
    // A lock a daemon killed as it changed this ref left (the number is taken again).
    clear_dead_lock(repo, &name);
    // One left under this name (a number taken again after the newest checkpoint was
    // dropped, its ref not retired then) keeps what it kept: retired first.
    if repo
        .find_reference(&name)
        .is_ok_and(|r| r.target() != Some(target))
    {
        retire_in(repo, &name, now_secs())?;
    }
    waiting_for_locks(repo, &name, |repo| {
        repo.reference(&name, target, true, "worktreefs: checkpoint")
            .map(|_| ())
    })?;
    Ok(())
}

/// How long a change of a ref waits, each time, for a lock another holds (a `git gc`
/// packing refs holds each well under a millisecond), before it gives up: a take holds
/// its worktree's lock on changes meanwhile.
const LOCK_WAITS_MS: [u64; 5] = [5, 10, 20, 40, 80];

/// `op`, a creation or move of ref `name` in `repo` (a loose ref: libgit2 writes no
/// `packed-refs` for it; deletions go through git, `ref_delete.rs`), tried again while
/// another holds the ref's lock (a `git gc` packing refs). Waits [`LOCK_WAITS_MS`], then
/// fails naming the lock and the way out.
pub(super) fn waiting_for_locks<T>(
    repo: &Repository,
    name: &str,
    mut op: impl FnMut(&Repository) -> Result<T, git2::Error>,
) -> GitResult<T> {
    let mut waits = LOCK_WAITS_MS.iter();
    loop {
        match op(repo) {
            Err(e) if e.code() == git2::ErrorCode::Locked => match waits.next() {
                Some(ms) => std::thread::sleep(std::time::Duration::from_millis(*ms)),
                None => {
                    let lock = repo.path().join(format!("{name}.lock"));
                    return Err(e).with_context(|| {
                        format!(
                            "{} is held by another process; if no git command runs in the repository, remove it",
                            lock.display()
                        )
                    });
                }
            },
            other => return other.map_err(Into::into),
        }
    }
}

/// Since when this process is the only daemon of its state directory (it holds the
/// state directory's lock), once the daemon says so.
static SOLE_WRITER_SINCE: std::sync::OnceLock<std::time::SystemTime> = std::sync::OnceLock::new();

/// Said by the daemon once it holds its state directory's lock: no other daemon of it
/// changes its checkpoint refs from then on.
pub fn sole_writer_since(at: std::time::SystemTime) {
    let _ = SOLE_WRITER_SINCE.set(at);
}

/// Removes the lock file of this state directory's ref `name` when it was made before
/// this daemon became the state directory's only one: a daemon killed as it changed the
/// ref left it (the number is taken again by the next take). A user's `git gc` packing
/// refs holds each lock a moment; one made since is let be (a take waits for it, a
/// little: [`LOCK_WAITS_MS`]). Told by the file's change time, which no user sets (a
/// clock stepped back, or a file server's behind this one's, could make a live lock look
/// old). Runs as the repository's owner (the caller's `as_owner_of`); a link or a
/// directory there is let be.
fn clear_dead_lock(repo: &Repository, name: &str) {
    use std::os::unix::fs::MetadataExt;
    let Some(since) = SOLE_WRITER_SINCE.get() else {
        return;
    };
    let lock = repo.path().join(format!("{name}.lock"));
    let Ok(m) = std::fs::symlink_metadata(&lock) else {
        return;
    };
    let changed = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            m.ctime().max(0) as u64,
            m.ctime_nsec().clamp(0, 999_999_999) as u32,
        );
    // File times come from the kernel's coarse clock, a tick behind ours, and more on a
    // loaded machine whose tick comes late: a lock made just after this daemon started
    // is never taken for a dead one.
    if !m.file_type().is_file() || changed + coarse_tick() + LATE_TICK >= *since {
        return;
    }
    match std::fs::remove_file(&lock) {
        Ok(()) => tracing::warn!(
            "removed {}, left by a daemon killed as it changed checkpoint ref {name}",
            lock.display()
        ),
        Err(e) => tracing::warn!("removing {}: {e}", lock.display()),
    }
}

/// How much later than its time a busy machine's tick may come (seen here: a lock made
/// right after the daemon started dated before it, with two test threads per CPU).
const LATE_TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// How far behind the precise clock file times may be: the resolution of the kernel's
/// coarse clock (a tick), 10 ms when it cannot be read.
fn coarse_tick() -> std::time::Duration {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_getres writes the timespec it is given.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) };
    if rc == 0 && res.tv_sec == 0 && res.tv_nsec > 0 {
        std::time::Duration::from_nanos(res.tv_nsec as u64)
    } else {
        std::time::Duration::from_millis(10)
    }
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
    let Ok(r) = repo.find_reference(name) else {
        return Ok(false);
    };
    clear_dead_lock(repo, name);
    // Ours name a commit; a symbolic one planted under our names is let be.
    let Some(target) = r.target() else {
        return Ok(false);
    };
    for k in 0..100 {
        let suffix = if k == 0 {
            String::new()
        } else {
            format!(".{k}")
        };
        let to = format!("{RETIRED_PREFIX}{key}-{n}{suffix}-{now}");
        clear_dead_lock(repo, &to);
        // The retired name made (or there already, naming the same commit), then the
        // kept one deleted (not renamed: a rename of a packed ref whose `packed-refs` is
        // locked a moment makes the new name and leaves the old one, answering
        // success). Whatever fails, the commit stays reached.
        match repo.find_reference(&to) {
            Ok(there) if there.target() == Some(target) => {}
            Ok(_) => continue,
            Err(_) => waiting_for_locks(repo, &to, |repo| {
                repo.reference(
                    &to,
                    target,
                    false,
                    "worktreefs: checkpoint gone, kept for the removal period",
                )
                .map(|_| ())
            })?,
        }
        super::ref_delete::delete_ref(repo.path(), name, Some(target))?;
        return Ok(true);
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

/// In the repository at `gitdir`, among the refs of the state directory whose key is
/// `refs_key`: retires those of the worktrees `removed` (their ids: a removal retires
/// them here, after it or after it was cut short; a worktree the store does not know as
/// removed, made a moment ago included, is let be), then deletes those retired
/// `keep_secs` or more ago.
pub fn sweep(gitdir: &Path, refs_key: &str, removed: Vec<i64>, keep_secs: i64) -> GitResult<Swept> {
    let (dir, refs_key) = (gitdir.to_path_buf(), refs_key.to_string());
    let now = now_secs();
    as_owner_of(gitdir, move || -> GitResult<Swept> {
        let repo = Repository::open_bare(&dir)?;
        let mut swept = Swept::default();
        for name in names_under(&repo, KEPT_PREFIX)? {
            let key = name[KEPT_PREFIX.len()..].split('/').next().unwrap_or("");
            if !ours(key, &refs_key, false).is_some_and(|id| removed.contains(&id)) {
                continue;
            }
            match retire_in(&repo, &name, now) {
                Ok(done) => swept.retired += done as usize,
                Err(e) => tracing::warn!("retiring {name}: {e:#}"),
            }
        }
        let mut over = Vec::new();
        for name in names_under(&repo, RETIRED_PREFIX)? {
            if ours(&name[RETIRED_PREFIX.len()..], &refs_key, true).is_none() {
                continue; // another state directory's, or not a name this file gives
            }
            let Some(at) = name
                .rsplit_once('-')
                .and_then(|(_, s)| s.parse::<i64>().ok())
            else {
                continue;
            };
            if now - at >= keep_secs {
                clear_dead_lock(&repo, &name);
                over.extend(direct(&repo, name));
            }
        }
        swept.deleted = deleted(&dir, &over);
        Ok(swept)
    })
}

/// Deletes every checkpoint ref of the state directory whose key is `refs_key` in the
/// repository at `gitdir`, kept and retired (before it is unregistered there). Returns
/// how many went.
pub fn delete_all(gitdir: &Path, refs_key: &str) -> GitResult<usize> {
    let (dir, refs_key) = (gitdir.to_path_buf(), refs_key.to_string());
    as_owner_of(gitdir, move || -> GitResult<usize> {
        let repo = Repository::open_bare(&dir)?;
        let mut all = Vec::new();
        for (prefix, retired) in [(KEPT_PREFIX, false), (RETIRED_PREFIX, true)] {
            for name in names_under(&repo, prefix)? {
                let part = &name[prefix.len()..];
                let part = if retired {
                    part
                } else {
                    part.split('/').next().unwrap_or("")
                };
                if ours(part, &refs_key, retired).is_none() {
                    continue;
                }
                all.extend(direct(&repo, name));
            }
        }
        Ok(deleted(&dir, &all))
    })
}

/// Ref `name` with the commit it names, to delete while it still does; None for a
/// symbolic one (ours never are: one planted under our names is let be) or one gone.
fn direct(repo: &Repository, name: String) -> Option<(String, Option<Oid>)> {
    let target = repo.find_reference(&name).ok()?.target()?;
    Some((name, Some(target)))
}

/// Deletes `refs` of the repository at `gitdir` (through git: `ref_delete.rs`), each
/// failure logged; returns how many went.
fn deleted(gitdir: &Path, refs: &[(String, Option<Oid>)]) -> usize {
    let mut n = 0;
    for ((name, _), r) in refs
        .iter()
        .zip(super::ref_delete::delete_refs(gitdir, refs))
    {
        match r {
            Ok(()) => n += 1,
            Err(e) => tracing::warn!("deleting {name}: {e:#}"),
        }
    }
    n
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
pub(super) mod tests {
    use super::*;

    /// A bare repository with `n` commits (of an empty tree) that no ref names.
    pub(in crate::git) fn repo_with_commits(n: usize) -> (tempfile::TempDir, Vec<Oid>) {
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

    /// A lock made before the daemon became the state directory's only one is a dead
    /// daemon's: removed, the ref set. One made since (a `git gc` packing refs) is
    /// waited for; one held past the waits fails the take, naming it; a lock whose
    /// modification time its user set back is still one made since.
    #[test]
    fn a_dead_daemons_lock_goes_and_a_live_one_is_waited_for() {
        let (dir, c) = repo_with_commits(1);
        let repo = Repository::open_bare(dir.path()).unwrap();
        let lock = |n: u64| dir.path().join(format!("{}.lock", kept_ref("5", n)));
        std::fs::create_dir_all(lock(1).parent().unwrap()).unwrap();
        std::fs::File::create(lock(1)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        sole_writer_since(std::time::SystemTime::now());
        // A lock a user dates back is still one made since.
        std::fs::File::create(lock(4))
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH)
            .unwrap();
        keep(&repo, "5", 1, &[c[0]]).unwrap();
        assert!(!lock(1).exists());
        assert_eq!(repo.refname_to_id(&kept_ref("5", 1)).unwrap(), c[0]);

        std::fs::File::create(lock(2)).unwrap();
        let held = lock(2);
        let gc = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(60));
            std::fs::remove_file(held).unwrap();
        });
        keep(&repo, "5", 2, &[c[0]]).unwrap();
        gc.join().unwrap();
        assert_eq!(repo.refname_to_id(&kept_ref("5", 2)).unwrap(), c[0]);

        std::fs::File::create(lock(3)).unwrap();
        let e = keep(&repo, "5", 3, &[c[0]]).unwrap_err();
        assert!(format!("{e:#}").contains("remove it"), "{e:#}");
        assert!(lock(3).exists(), "a live lock was removed");
        assert!(keep(&repo, "5", 4, &[c[0]]).is_err());
        assert!(
            lock(4).exists(),
            "a lock dated back was taken for a dead one"
        );
    }

    /// A retire of a packed ref rewrites `packed-refs`, whose lock another holds a moment
    /// (a take's drop in another worktree of the repository, a `git gc`): it waits, and
    /// the ref is retired, not left kept.
    #[test]
    fn a_retire_waits_for_packed_refs_locked_a_moment() {
        let (dir, c) = repo_with_commits(1);
        let repo = Repository::open_bare(dir.path()).unwrap();
        keep(&repo, "sab-1", 1, &[c[0]]).unwrap();
        keep(&repo, "sab-1", 2, &[c[0]]).unwrap();
        let out = std::process::Command::new("git")
            .args(["pack-refs", "--all"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(!dir.path().join(kept_ref("sab-1", 1)).exists());
        let lock = dir.path().join("packed-refs.lock");
        std::fs::File::create(&lock).unwrap();
        let held = lock.clone();
        let other = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(60));
            std::fs::remove_file(held).unwrap();
        });
        retire(dir.path(), "sab-1", 1).unwrap();
        other.join().unwrap();
        assert_eq!(names(dir.path(), KEPT_PREFIX), vec![kept_ref("sab-1", 2)]);
        assert_eq!(names(dir.path(), RETIRED_PREFIX).len(), 1);
        // Held on: the retire fails, naming the lock; the ref stays kept.
        std::fs::File::create(&lock).unwrap();
        let e = retire(dir.path(), "sab-1", 2).unwrap_err();
        assert!(format!("{e:#}").contains("packed-refs.lock"), "{e:#}");
        assert_eq!(names(dir.path(), KEPT_PREFIX), vec![kept_ref("sab-1", 2)]);
    }

    #[test]
    fn retired_refs_keep_their_commit_until_the_period_is_over() {
        let (dir, c) = repo_with_commits(2);
        let repo = Repository::open_bare(dir.path()).unwrap();
        let (k7, k12) = (worktree_key("sab", 7), worktree_key("sab", 12));
        keep(&repo, &k7, 1, &[c[0]]).unwrap();
        keep(&repo, &k7, 2, &[c[1]]).unwrap();
        keep(&repo, &k12, 1, &[c[1]]).unwrap();
        // Another state directory's worktree 12, and one of the first version's.
        keep(&repo, &worktree_key("scd", 12), 1, &[c[1]]).unwrap();
        keep(&repo, "3", 1, &[c[0]]).unwrap();
        retire(dir.path(), &k7, 1).unwrap();
        // Nothing there: nothing to do.
        retire(dir.path(), &k7, 9).unwrap();
        let retired = names(dir.path(), RETIRED_PREFIX);
        assert_eq!(retired.len(), 1, "{retired:?}");
        assert!(retired[0].starts_with(&format!("{RETIRED_PREFIX}{k7}-1-")));
        assert_eq!(repo.refname_to_id(&retired[0]).unwrap(), c[0]);
        // Worktrees 12 and 3 removed (1 too, an id that is a prefix of another's): this
        // state directory's are retired, the other's let be.
        let s = sweep(dir.path(), "sab", vec![12, 1, 3], 3600).unwrap();
        assert_eq!(
            s,
            Swept {
                retired: 2,
                deleted: 0
            }
        );
        let mut kept = names(dir.path(), KEPT_PREFIX);
        kept.sort();
        assert_eq!(kept, vec![kept_ref(&k7, 2), kept_ref("scd-12", 1)]);
        assert_eq!(names(dir.path(), RETIRED_PREFIX).len(), 3);
        // The period over: this state directory's retired ones go, kept ones stay.
        keep(&repo, "scd-5", 1, &[c[0]]).unwrap();
        retire(dir.path(), "scd-5", 1).unwrap();
        let s = sweep(dir.path(), "sab", vec![], 0).unwrap();
        assert_eq!(
            s,
            Swept {
                retired: 0,
                deleted: 3
            }
        );
        assert_eq!(
            names(dir.path(), RETIRED_PREFIX).len(),
            1,
            "the other's stays"
        );
        assert_eq!(delete_all(dir.path(), "sab").unwrap(), 1);
        let mut left = names(dir.path(), "refs/worktreefs/");
        left.sort();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().all(|n| n.contains("scd-")), "{left:?}");
    }

    #[test]
    fn a_ref_left_under_a_number_taken_again_is_retired_not_overwritten() {
        let (dir, c) = repo_with_commits(2);
        let repo = Repository::open_bare(dir.path()).unwrap();
        keep(&repo, "sab-1", 4, &[c[0]]).unwrap();
        keep(&repo, "sab-1", 4, &[c[1]]).unwrap();
        assert_eq!(repo.refname_to_id(&kept_ref("sab-1", 4)).unwrap(), c[1]);
        let retired = names(dir.path(), RETIRED_PREFIX);
        assert_eq!(retired.len(), 1);
        assert_eq!(repo.refname_to_id(&retired[0]).unwrap(), c[0]);
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
