//! Deleting refs as git does: `git update-ref --stdin` (`delete` lines), run as the
//! repository's owner.
//!
//! libgit2 (1.8) deletes a packed ref by reading `packed-refs`, then taking its lock and
//! writing back what it read less that ref, without reading it again under the lock. A
//! `git pack-refs` (or `gc`) that packs loose refs and deletes them in between has them
//! written out again as they were before: lost. Beside a `git pack-refs` started a moment
//! before, libgit2's deletion lost a loose ref in 67 of 1,500 rounds here; git's, which
//! reads `packed-refs` again under the lock, in none. So every ref the daemon deletes
//! goes through git.

use std::os::fd::AsFd;
use std::path::Path;

use git2::Oid;

use super::error::{GitError, GitErrorKind, GitResult};
use super::filters::{input, run_git_in, Owner, RunError};

/// How long one run of git may take (it waits up to a second for `packed-refs.lock`).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Deletes ref `name` of the repository whose git directory is `gitdir` (see
/// [`delete_refs`]).
pub fn delete_ref(gitdir: &Path, name: &str, old: Option<Oid>) -> GitResult<()> {
    delete_refs(gitdir, &[(name.to_string(), old)])
        .pop()
        .unwrap_or(Ok(()))
}

/// Deletes the refs `refs` of the repository whose git directory is `gitdir`, each only
/// while it names the value given with it (git checks under the ref's lock; without one,
/// a ref not there is no error, with one it is). A symbolic ref is deleted itself, never
/// the ref it names. One run of git for all (one transaction); when git refuses that
/// (one of them moved since), each alone. Returns each one's result, in order.
///
/// git runs as the owner of the directory, in it by descriptor (reached through no
/// symbolic link), with the hooks directory off (`core.hooksPath`; hooks a newer git
/// takes from config are the owner's, run as the owner, as their own git would). A git
/// directory anyone may write is refused, and one of root's its group may write: its
/// owner is not the only one who decides what git finds there.
pub fn delete_refs(gitdir: &Path, refs: &[(String, Option<Oid>)]) -> Vec<GitResult<()>> {
    if refs.is_empty() {
        return Vec::new();
    }
    let all = |r: Result<(), GitError>| -> Vec<GitResult<()>> {
        match r {
            Ok(()) => refs.iter().map(|_| Ok(())).collect(),
            Err(e) => {
                let said = format!("{e:#}");
                refs.iter()
                    .map(|_| Err(GitError::new(GitErrorKind::Failed, said.clone())))
                    .collect()
            }
        }
    };
    if let Some((name, _)) = refs
        .iter()
        .find(|(n, _)| !git2::Reference::is_valid_name(n))
    {
        return all(Err(GitError::new(
            GitErrorKind::Failed,
            format!("{name:?} is not a ref name git takes: nothing deleted"),
        )));
    }
    let (dir, owner) = match opened(gitdir) {
        Ok(o) => o,
        Err(e) => return all(Err(e)),
    };
    let failed = |refs: &[(String, Option<Oid>)], e: RunError| {
        let names: Vec<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
        GitError::new(
            GitErrorKind::Failed,
            format!(
                "git update-ref deleting {} in {}: {e}",
                names.join(", "),
                gitdir.display()
            ),
        )
    };
    match run_update_ref(&dir, &owner, refs) {
        Ok(()) => all(Ok(())),
        // git refused the transaction (a ref moved since, or is gone): each alone.
        Err(RunError::Failed(_)) if refs.len() > 1 => refs
            .iter()
            .map(|r| {
                let one = std::slice::from_ref(r);
                run_update_ref(&dir, &owner, one).map_err(|e| failed(one, e))
            })
            .collect(),
        // It could not start, or ran past its time: the same for each.
        Err(e) => all(Err(failed(refs, e))),
    }
}

/// The git directory `gitdir`, open, and its owner to run git as.
fn opened(gitdir: &Path) -> GitResult<(std::os::fd::OwnedFd, Owner)> {
    let dir = super::owner::pinned(gitdir)?;
    let st = crate::beneath::fstat(dir.as_fd()).map_err(GitError::from)?;
    let open_to = if st.st_uid == 0 { 0o022 } else { 0o002 };
    if st.st_mode & open_to != 0 {
        return Err(GitError::new(
            GitErrorKind::Failed,
            format!(
                "{} may be written by others than its owner (uid {}), so no git is run there as that owner; make it its owner's alone (`chmod go-w {}`)",
                gitdir.display(),
                st.st_uid,
                gitdir.display()
            ),
        ));
    }
    Ok((dir, Owner::of(st.st_uid, st.st_gid, LIMIT)))
}

/// `git update-ref --stdin` deleting `refs` in one transaction.
fn run_update_ref(
    dir: &std::os::fd::OwnedFd,
    owner: &Owner,
    refs: &[(String, Option<Oid>)],
) -> Result<(), RunError> {
    let mut lines = String::new();
    for (name, old) in refs {
        lines.push_str("option no-deref\n");
        match old {
            Some(o) => lines.push_str(&format!("delete {name} {o}\n")),
            None => lines.push_str(&format!("delete {name}\n")),
        }
    }
    let stdin = input(lines.as_bytes()).map_err(|e| RunError::Spawn(e.to_string()))?;
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .map_err(|e| RunError::Spawn(e.to_string()))?;
    let args: [&std::ffi::OsStr; 4] = [
        "-c".as_ref(),
        "core.hooksPath=/dev/null".as_ref(),
        "update-ref".as_ref(),
        "--stdin".as_ref(),
    ];
    run_git_in(owner, dir.as_fd(), &args, Some(stdin), null)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare repository with `n` commits that no ref names, open.
    fn bare_with_commits(n: usize) -> (tempfile::TempDir, git2::Repository, Vec<Oid>) {
        let (dir, commits) = crate::git::checkpoint_refs::tests::repo_with_commits(n);
        let repo = git2::Repository::open_bare(dir.path()).unwrap();
        (dir, repo, commits)
    }

    fn git(dir: &Path, args: &[&str]) -> std::process::Output {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        out
    }

    /// A ref deleted while `git pack-refs` packs the others: none of those is lost. With
    /// libgit2's own deletion this lost one in about one round of twenty here (so in 200
    /// rounds, all but never none).
    #[test]
    fn a_deletion_beside_pack_refs_loses_no_other_ref() {
        let (dir, repo, c) = bare_with_commits(1);
        let c = c[0];
        let mut lost = Vec::new();
        for i in 0..200u64 {
            repo.reference(&format!("refs/a/{i}"), c, true, "").unwrap();
            git(dir.path(), &["pack-refs", "--all"]);
            repo.reference(&format!("refs/keep/{i}"), c, true, "")
                .unwrap();
            let d = dir.path().to_path_buf();
            let gc = std::thread::spawn(move || git(&d, &["pack-refs", "--all"]));
            std::thread::sleep(std::time::Duration::from_micros((i * 37) % 2500));
            delete_ref(dir.path(), &format!("refs/a/{i}"), Some(c)).unwrap();
            gc.join().unwrap();
            let check = git2::Repository::open_bare(dir.path()).unwrap();
            if check.find_reference(&format!("refs/keep/{i}")).is_err() {
                lost.push(i);
            }
            assert!(check.find_reference(&format!("refs/a/{i}")).is_err());
        }
        assert!(lost.is_empty(), "refs lost in rounds {lost:?}");
    }

    /// A symbolic ref is deleted itself, never the branch it names; no hook runs; a git
    /// directory reached through a symbolic link, or one anyone may write, is refused.
    #[test]
    fn a_symbolic_ref_goes_itself_no_hook_runs_and_a_linked_or_open_dir_is_refused() {
        let (dir, repo, c) = bare_with_commits(1);
        let c = c[0];
        repo.reference("refs/heads/main", c, true, "").unwrap();
        repo.reference_symbolic("refs/worktreefs/planted", "refs/heads/main", true, "")
            .unwrap();
        let ran = dir.path().join("hook-ran");
        std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
        let hook = dir.path().join("hooks/reference-transaction");
        std::fs::write(&hook, format!("#!/bin/sh\ntouch {}\n", ran.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        delete_ref(dir.path(), "refs/worktreefs/planted", None).unwrap();
        assert!(repo.find_reference("refs/worktreefs/planted").is_err());
        assert_eq!(repo.refname_to_id("refs/heads/main").unwrap(), c);
        assert!(!ran.exists(), "a hook ran for the daemon's deletion");
        // Reached through a link: refused, nothing deleted.
        let link = dir.path().with_extension("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(delete_ref(&link, "refs/heads/main", Some(c)).is_err());
        let _ = std::fs::remove_file(&link);
        // Writable by anyone: refused, nothing deleted.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = delete_ref(dir.path(), "refs/heads/main", Some(c)).unwrap_err();
        assert!(format!("{e:#}").contains("chmod go-w"), "{e:#}");
        // Root's, writable by its group: refused too (as root, git would run there).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        let refused = delete_ref(dir.path(), "refs/heads/main", Some(c));
        assert_eq!(
            refused.is_err(),
            nix::unistd::geteuid().is_root(),
            "{refused:?}"
        );
        assert_eq!(
            repo.find_reference("refs/heads/main").is_ok(),
            refused.is_err()
        );
        // A name git would read as more than one command: refused, nothing run.
        repo.reference("refs/t/x", c, true, "").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = delete_refs(
            dir.path(),
            &[
                ("refs/t/x".to_string(), None),
                ("refs/t/y\ndelete refs/t/x".to_string(), None),
            ],
        );
        assert!(e.iter().all(|r| r.is_err()), "{e:?}");
        assert!(repo.find_reference("refs/t/x").is_ok());
    }

    /// Several in one run; one that moved since fails alone, the others go.
    #[test]
    fn of_several_one_that_moved_fails_alone() {
        let (dir, repo, c) = bare_with_commits(2);
        let (a, b) = (c[0], c[1]);
        for n in ["x", "y", "z"] {
            repo.reference(&format!("refs/t/{n}"), a, true, "").unwrap();
        }
        repo.reference("refs/t/y", b, true, "").unwrap();
        let refs: Vec<(String, Option<Oid>)> = ["x", "y", "z"]
            .iter()
            .map(|n| (format!("refs/t/{n}"), Some(a)))
            .collect();
        let done = delete_refs(dir.path(), &refs);
        assert!(
            done[0].is_ok() && done[1].is_err() && done[2].is_ok(),
            "{done:?}"
        );
        assert!(repo.find_reference("refs/t/x").is_err());
        assert_eq!(repo.refname_to_id("refs/t/y").unwrap(), b);
        assert!(repo.find_reference("refs/t/z").is_err());
    }

    /// Only while it names `old`; a ref not there is no error without one.
    #[test]
    fn a_ref_that_moved_is_kept_and_one_not_there_is_no_error() {
        let (dir, repo, c) = bare_with_commits(2);
        let (a, b) = (c[0], c[1]);
        repo.reference("refs/heads/x", b, true, "").unwrap();
        let e = delete_ref(dir.path(), "refs/heads/x", Some(a)).unwrap_err();
        assert!(format!("{e:#}").contains("refs/heads/x"), "{e:#}");
        assert!(repo.find_reference("refs/heads/x").is_ok());
        delete_ref(dir.path(), "refs/heads/x", Some(b)).unwrap();
        assert!(repo.find_reference("refs/heads/x").is_err());
        delete_ref(dir.path(), "refs/heads/x", None).unwrap();
    }
}
