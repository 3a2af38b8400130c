//! Forks of a live worktree: `new REPO/CHILD --from REPO/PARENT` — mounted,
//! with a real repository and the real `git` binary.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;

/// An agent: a shell that works inside the worktree and exits.
fn agent(dir: &Path, script: &str) -> String {
    run_ok("sh", &["-c", script], dir)
}

fn upper_of(env: &Env, name: &str) -> PathBuf {
    env.state()
        .join("worktrees")
        .join(id_of(env, name).to_string())
        .join("upper")
}

#[test]
fn a_fork_holds_its_parents_staged_unstaged_untracked_and_ignored_changes_then_goes_its_own_way() {
    let env = Env::new();
    let repo = env.repo.path();
    fs::write(repo.join(".git/info/exclude"), "build/\n").unwrap();
    wtfs_ok(&env.state(), &["new", "repo/parent"]);
    let m = env.mount();
    let parent = m.wt("repo", "parent");
    // A commit of the parent's own, then every kind of change on top of it.
    agent(
        &parent,
        "set -e
         git config user.email a@example.com; git config user.name agent
         echo committed > committed.txt; git add committed.txt; git commit -qm 'parent work'
         echo staged >> README.md; git add README.md
         echo unstaged >> src/main.rs
         echo 'staged then changed' > both.txt; git add both.txt; echo again >> both.txt
         echo untracked > notes.txt
         mkdir -p build/obj; echo ignored > build/obj/a.o; echo 'x' > main.o
         rm empty.txt; git rm -q --cached src/lib/util.rs; rm src/lib/util.rs
         mv docs documents
         chmod +x src/main.rs
         ln -s notes.txt notes-link
         mkdir emptydir
         ln notes.txt notes-hard",
    );
    let before_files = tree_listing(&parent);
    let before_git = git_state(&parent);
    let parent_head = run_ok("git", &["rev-parse", "HEAD"], &parent);

    let out = wtfs_ok(
        &env.state(),
        &["new", "repo/child", "--from", "repo/parent"],
    );
    assert!(
        out.contains("forked repo/parent as repo/child on branch child"),
        "{out}"
    );
    let child = m.wt("repo", "child");
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(events.contains("forked from repo/parent"), "{events}");

    // Equal to its parent, byte for byte, and to git.
    assert_eq!(tree_listing(&child), before_files);
    let child_git = git_state(&child);
    // All but the branch HEAD names.
    assert_eq!(
        child_git[..4],
        before_git[..4],
        "git sees the fork as its parent"
    );
    assert_eq!(
        run_ok("git", &["rev-parse", "--abbrev-ref", "HEAD"], &child).trim(),
        "child"
    );
    assert_eq!(run_ok("git", &["rev-parse", "HEAD"], &child), parent_head);
    // The parent is as it was.
    assert_eq!(tree_listing(&parent), before_files);
    assert_eq!(git_state(&parent), before_git);
    assert_eq!(
        run_ok("git", &["rev-parse", "--abbrev-ref", "HEAD"], &parent).trim(),
        "parent"
    );
    // No file of the child's layer is one of the parent's (two names of one file in the
    // parent are two names of one file of the child's own).
    let (pu, cu) = (upper_of(&env, "parent"), upper_of(&env, "child"));
    for rel in ["notes.txt", "src/main.rs", "README.md", "build/obj/a.o"] {
        let (p, c) = (
            fs::symlink_metadata(pu.join(rel)).unwrap(),
            fs::symlink_metadata(cu.join(rel)).unwrap(),
        );
        assert_ne!((p.dev(), p.ino()), (c.dev(), c.ino()), "{rel} shared");
        assert_eq!(p.mode(), c.mode(), "{rel}");
    }
    assert_eq!(
        fs::metadata(cu.join("notes.txt")).unwrap().ino(),
        fs::metadata(cu.join("notes-hard")).unwrap().ino()
    );

    // Each goes its own way: writes, commits and the index of one never show in the other.
    agent(
        &child,
        "set -e
         git config user.email c@example.com; git config user.name child
         echo child-only >> notes.txt; echo new > child.txt
         git add -A; git commit -qm 'child work'",
    );
    agent(&parent, "echo parent-only >> notes-hard; rm main.o");
    assert_eq!(
        fs::read_to_string(parent.join("notes.txt")).unwrap(),
        "untracked\nparent-only\n"
    );
    assert!(!parent.join("child.txt").exists());
    assert_eq!(
        fs::read_to_string(child.join("notes.txt")).unwrap(),
        "untracked\nchild-only\n"
    );
    assert!(child.join("main.o").exists());
    assert_eq!(
        run_ok("git", &["rev-parse", "HEAD"], &parent),
        parent_head,
        "the parent's branch did not move"
    );
    assert_eq!(
        run_ok("git", &["log", "-1", "--format=%s"], &child).trim(),
        "child work"
    );
    assert_eq!(
        git_state(&parent)[1],
        before_git[1],
        "the parent's index is its own"
    );
    m.unmount();
}

#[test]
fn a_file_the_parent_keeps_replacing_while_it_is_forked_is_whole_in_the_fork() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/busy"]);
    let m = env.mount();
    let busy = m.wt("repo", "busy");
    // The parent replaces hot.bin (4 MiB, one letter throughout) again and again, each
    // version whole at every instant (written aside, renamed over: the names change under
    // the fork's walk), and appends to a log. (A file rewritten in place during its copy
    // is `lifecycle::fork`'s unit tests' case: there the writes land at a chosen moment.)
    agent(&busy, "head -c 4194304 /dev/zero | tr '\\0' a > hot.bin");
    let writer = std::process::Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 400 ]; do
               l=$(printf \"\\\\$(printf %o $((98 + i % 20)))\")
               head -c 4194304 /dev/zero | tr '\\0' \"$l\" > hot.tmp && mv hot.tmp hot.bin
               echo line $i >> log.txt
               i=$((i+1))
             done",
        ])
        .current_dir(&busy)
        .spawn()
        .unwrap();
    let mut writer = scopeguard(writer);
    std::thread::sleep(Duration::from_millis(300));
    let out = wtfs_ok(&env.state(), &["new", "repo/snap", "--from", "busy"]);
    let still_running = writer.0.try_wait().unwrap().is_none();
    let snap = m.wt("repo", "snap");
    let hot = fs::read(snap.join("hot.bin")).unwrap();
    assert_eq!(hot.len(), 4 << 20, "{out}");
    assert!(
        hot.iter().all(|b| *b == hot[0]),
        "the fork holds one version of hot.bin whole ({out})"
    );
    let log = fs::read_to_string(snap.join("log.txt")).unwrap_or_default();
    for (i, line) in log.lines().enumerate() {
        assert_eq!(
            line,
            format!("line {i}"),
            "the log is a prefix of the parent's"
        );
    }
    let _ = writer.0.wait();
    assert!(
        still_running,
        "the parent was still writing when the fork ended, as the test means it to"
    );
    m.unmount();
}

/// Kills and reaps the child on drop (a failing assertion must not leave it running).
struct Guarded(std::process::Child);
impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
fn scopeguard(c: std::process::Child) -> Guarded {
    Guarded(c)
}

#[test]
fn a_fork_that_cannot_be_made_says_why_and_leaves_nothing() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/parent"]);
    wtfs_ok(&env.state(), &["new", "repo/taken"]);
    wtfs_ok(&env.state(), &["new", "repo/gone"]);
    let m = env.mount_with(&["--linger", "1"]);
    agent(&m.wt("repo", "parent"), "echo work > w.txt");
    let repo = env.repo.path();
    let branches = || {
        git(
            &repo,
            &["for-each-ref", "--format=%(refname)", "refs/heads"],
        )
    };
    let before = branches();
    let entries = || {
        let mut v: Vec<_> = fs::read_dir(repo.join(".git/worktrees"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let entries_before = entries();
    let refused = |args: &[&str], says: &[&str]| {
        let out = wtfs(&env.state(), args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} was not refused");
        for s in says {
            assert!(err.contains(s), "{args:?}: {err:?} does not say {s:?}");
        }
    };
    refused(
        &["new", "repo/c1", "--from", "nosuch"],
        &["'repo/nosuch' does not exist", "worktreefs list"],
    );
    refused(
        &["new", "repo/taken", "--from", "parent"],
        &["'repo/taken' already exists"],
    );
    refused(
        &["new", "repo/c2", "--from", "parent", "--branch", "taken"],
        &["branch 'taken' already exists", "--branch NEW-BRANCH"],
    );
    refused(
        &["new", "repo/c3", "--from", "other/parent"],
        &["repository 'other', not 'repo'"],
    );
    refused(
        &["new", "repo/c4", "--from", "parent", "--base", "HEAD"],
        &["cannot be used with"],
    );
    // A parent being cleaned up (its cleanup lock held) and one removed.
    let pid = id_of(&env, "parent");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(env.state().join("locks").join(pid.to_string()))
        .unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        },
        0
    );
    refused(
        &["new", "repo/c5", "--from", "parent"],
        &[
            "'repo/parent' is being cleaned up right now",
            "fork another",
        ],
    );
    drop(lock);
    wtfs_ok(&env.state(), &["reclaim", "repo/gone"]);
    refused(
        &["new", "repo/c6", "--from", "gone"],
        &["'repo/gone' is removed", "worktreefs restore repo/gone"],
    );
    // Nothing was left of any of them.
    assert_eq!(branches(), before.replace("refs/heads/gone\n", ""));
    assert_eq!(entries(), {
        let mut e = entries_before.clone();
        e.retain(|n| !n.to_string_lossy().contains("gone"));
        e
    });
    let list = wtfs_ok(&env.state(), &["list", "--json"]);
    for c in ["c1", "c2", "c3", "c4", "c5", "c6"] {
        assert!(!list.contains(&format!("\"{c}\"")), "{c} in {list}");
    }
    let leftovers: Vec<_> = fs::read_dir(env.state().join("worktrees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".new-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The parent was never disturbed, and still forks.
    let out = wtfs_ok(&env.state(), &["new", "repo/c7", "--from", "parent"]);
    assert!(out.contains("forked"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !m.wt("repo", "c7").join("w.txt").exists() {
        assert!(Instant::now() < deadline, "c7 does not show w.txt");
        std::thread::sleep(Duration::from_millis(100));
    }
    m.unmount();
}
