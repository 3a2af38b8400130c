//! Checkpoints and rewinds of a mounted worktree, with a real repository and the real
//! `git` binary: every file the view shows, the index, HEAD and its branch, and a merge
//! stopped on a conflict come back exactly; a rewind is undone by the checkpoint it took;
//! a turn takes one as it starts; a rewind is refused while others write there.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

fn sh(dir: &Path, script: &str) -> String {
    run_ok("sh", &["-c", &format!("set -e\n{script}")], dir)
}

fn checkpoint(env: &Env, label: &str) -> u64 {
    let out = wtfs_ok(
        &env.state(),
        &["checkpoint", "repo/w", "--label", label, "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["worktree"], "repo/w", "{out}");
    assert_eq!(v["label"], label, "{out}");
    v["checkpoint"].as_u64().unwrap()
}

/// Rewinds repo/w to `to`; the checkpoint that undoes it.
fn rewind(env: &Env, to: u64) -> u64 {
    let out = wtfs_ok(
        &env.state(),
        &["rewind", "repo/w", "--to", &to.to_string(), "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rewound_to"]["checkpoint"].as_u64(), Some(to), "{out}");
    v["undo"]["checkpoint"].as_u64().unwrap()
}

#[test]
fn a_rewind_brings_back_every_file_the_index_head_and_branch_and_is_undone() {
    let env = Env::new();
    fs::write(env.repo.path().join(".git/info/exclude"), "build/\n").unwrap();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    // Every kind of change before the checkpoint: a commit, staged, unstaged,
    // untracked, ignored, removed, moved, a mode, links.
    sh(
        &wt,
        "git config user.email a@example.com; git config user.name agent
         echo committed > committed.txt; git add committed.txt; git commit -qm 'first'
         echo staged >> README.md; git add README.md
         echo unstaged >> src/main.rs
         echo untracked > notes.txt
         mkdir -p build/obj; echo ignored > build/obj/a.o
         rm empty.txt; mv docs documents; chmod +x src/main.rs
         ln -s notes.txt notes-link; ln notes.txt notes-hard",
    );
    let (files, git_then) = (tree_listing(&wt), git_state(&wt));
    let one = checkpoint(&env, "before the havoc");

    // What an agent's turn can do: commit, reset --hard, a branch switch, deletions of
    // tracked, untracked and ignored files, a rewrite in place, a tree made and gone.
    sh(
        &wt,
        "echo more >> committed.txt; git commit -qam second
         git reset -q --hard HEAD~2
         git checkout -q -b elsewhere
         rm -rf build src; echo rewritten > README.md
         mkdir -p many; for i in $(seq 1 300); do echo $i > many/$i; done; rm -rf many
         echo new > brand-new.txt; chmod 600 brand-new.txt",
    );
    let (files_after, git_after) = (tree_listing(&wt), git_state(&wt));
    assert_ne!(files_after, files);
    let branch_w = |wt: &Path| run_ok("git", &["rev-parse", "refs/heads/w"], wt);
    let w_after = branch_w(&wt);

    let undo = rewind(&env, one);
    assert_eq!(tree_listing(&wt), files, "every file back");
    assert_eq!(git_state(&wt), git_then, "the index, HEAD and branch back");
    // The commit only the rewound-away state reached stays reachable.
    let refs = run_ok(
        "git",
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/worktreefs/checkpoints/",
        ],
        &env.repo.path(),
    );
    assert!(refs.lines().count() >= 2, "{refs}");

    // The rewind is undone by the checkpoint it took, the branch it moved (not HEAD's
    // then) moved back too.
    assert_ne!(branch_w(&wt), w_after);
    rewind(&env, undo);
    assert_eq!(tree_listing(&wt), files_after);
    assert_eq!(git_state(&wt), git_after);
    assert_eq!(branch_w(&wt), w_after);
    // And back again: every checkpoint stays good after rewinds.
    rewind(&env, one);
    assert_eq!(tree_listing(&wt), files);
    assert_eq!(git_state(&wt), git_then);

    let listed = wtfs_ok(&env.state(), &["checkpoints", "repo/w"]);
    assert!(listed.contains("before the havoc"), "{listed}");
    assert!(
        listed.contains(&format!("before the rewind to {one}")),
        "{listed}"
    );
    // .control shows them as `checkpoints --json` does.
    let control = fs::read_to_string(m.mountpoint.join(".control/checkpoints/repo:w")).unwrap();
    let control: serde_json::Value = serde_json::from_str(&control).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["checkpoints", "repo/w", "--json"])).unwrap();
    assert_eq!(control, json);
    m.unmount();
}

#[test]
fn a_merge_stopped_on_a_conflict_comes_back_stopped() {
    let env = Env::new();
    let repo = env.repo.path();
    git(&repo, &["checkout", "-q", "-b", "theirs"]);
    fs::write(repo.join("README.md"), "theirs\n").unwrap();
    git(&repo, &["commit", "-qam", "theirs"]);
    git(&repo, &["checkout", "-q", "-"]);
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    sh(
        &wt,
        "git config user.email a@example.com; git config user.name agent
         echo ours > README.md; git commit -qam ours
         git merge theirs >/dev/null 2>&1 || true
         test -f \"$(git rev-parse --git-dir)/MERGE_HEAD\"",
    );
    let (files, git_then) = (tree_listing(&wt), git_state(&wt));
    assert!(git_then[0].contains("UU README.md"), "{:?}", git_then[0]);
    let mid = checkpoint(&env, "mid-merge");
    sh(&wt, "git merge --abort; echo done > after.txt");
    assert!(!git_state(&wt)[0].contains("UU"));

    rewind(&env, mid);
    assert_eq!(tree_listing(&wt), files);
    assert_eq!(git_state(&wt), git_then);
    // Still a merge in progress, which git can finish.
    sh(
        &wt,
        "test -f \"$(git rev-parse --git-dir)/MERGE_HEAD\"
         echo merged > README.md; git add README.md; git commit -qm merged",
    );
    m.unmount();
}

#[test]
fn a_turn_takes_a_checkpoint_as_it_starts_and_a_rewind_undoes_the_turn() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    let files = tree_listing(&wt);
    // A turn that wrecks the worktree, and makes and deletes a tree of 10,000 files.
    wtfs_ok(
        &env.state(),
        &[
            "turn",
            "repo/w",
            "--session",
            "s1",
            "--",
            "sh",
            "-c",
            "mkdir t && cd t && seq 1 10000 | xargs touch && cd .. && rm -rf t src README.md",
        ],
    );
    assert_ne!(tree_listing(&wt), files);
    let listed: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["checkpoints", "repo/w", "--json"])).unwrap();
    let turn = &listed["checkpoints"][0];
    assert_eq!(turn["label"], "turn s1", "{listed}");
    rewind(&env, turn["checkpoint"].as_u64().unwrap());
    assert_eq!(tree_listing(&wt), files);
    // --no-checkpoint takes none.
    wtfs_ok(
        &env.state(),
        &[
            "turn",
            "repo/w",
            "--session",
            "s1",
            "--no-checkpoint",
            "--",
            "true",
        ],
    );
    let after: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["checkpoints", "repo/w", "--json"])).unwrap();
    assert_eq!(after["checkpoints"].as_array().unwrap().len(), 2, "{after}");
    m.unmount();
}

#[test]
fn a_rewind_is_refused_while_others_write_there_or_git_holds_the_index() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    let one = checkpoint(&env, "one");
    fs::write(wt.join("log.txt"), "x\n").unwrap();
    // A writer in a session of its own (not the caller's).
    let mut writer = std::process::Command::new("setsid")
        .args(["sh", "-c", "exec 3>>log.txt; exec sleep 60"])
        .current_dir(&wt)
        .spawn()
        .unwrap();
    let writer_pid = writer.id();
    let fd3 = format!("/proc/{writer_pid}/fd/3");
    wait_until("the writer's file is open", Duration::from_secs(10), || {
        fs::read_link(&fd3).is_ok_and(|p| p.ends_with("log.txt"))
    });
    let out = wtfs(
        &env.state(),
        &["rewind", "repo/w", "--to", &one.to_string()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("open for writing") && err.contains("log.txt"),
        "{err}"
    );
    let _ = writer.kill();
    let _ = writer.wait();
    // git's index.lock.
    let admin = run_ok("git", &["rev-parse", "--git-dir"], &wt);
    let lock = Path::new(admin.trim()).join("index.lock");
    fs::write(&lock, "").unwrap();
    let out = wtfs(
        &env.state(),
        &["rewind", "repo/w", "--to", &one.to_string()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("index.lock"), "{err}");
    fs::remove_file(&lock).unwrap();
    // An unknown checkpoint: named, exit 1.
    let out = wtfs(&env.state(), &["rewind", "repo/w", "--to", "99"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no checkpoint 99"), "{err}");
    // Now it runs.
    rewind(&env, one);
    assert!(!wt.join("log.txt").exists());
    m.unmount();
}

/// Every entry below `wt` with its type, mode and size (`.git` aside), cheaply for many
/// files: what tells two states of the crash test apart.
fn shape_of(wt: &Path) -> String {
    run_ok(
        "sh",
        &[
            "-c",
            "find . -path ./.git -prune -o -printf '%p %y %m %s\\n' | LC_ALL=C sort; cat r.txt",
        ],
        wt,
    )
}

#[test]
fn a_daemon_killed_during_a_rewind_leaves_the_worktree_all_before_or_all_after() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let mut rng = Rng::new(seed_or(0x6b69_6c6c));
    let (mut before, mut after, mut finished_at_mount) = (0, 0, 0);
    // How long a whole rewind took last (the kill lands within it, or a little before).
    let mut took = Duration::from_millis(300);
    let mut m = env.mount();
    for round in 0..5 {
        let wt = m.wt("repo", "w");
        // State A: files of its own, a commit.
        sh(
            &wt,
            &format!(
                "git config user.email a@example.com; git config user.name agent
                 rm -rf a b; mkdir a; cd a; seq 1 1500 | xargs touch; cd ..
                 echo {round} > r.txt; git add r.txt; git commit -qm r{round}"
            ),
        );
        let (shape_a, git_a) = (shape_of(&wt), git_state(&wt));
        let cp = checkpoint(&env, "A");
        // State B: those gone, others made, another commit.
        sh(
            &wt,
            "rm -rf a; mkdir b; cd b; seq 1 1500 | xargs touch; cd ..
             echo B >> r.txt; git commit -qam B",
        );
        let (shape_b, git_b) = (shape_of(&wt), git_state(&wt));
        let mut rewinding = std::process::Command::new(BIN)
            .args(["--state-dir", env.state().to_str().unwrap()])
            .args(["rewind", "repo/w", "--to", &cp.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let ms = took.as_millis() as u64;
        let wait = rng.below(ms + ms / 4 + 1);
        eprintln!("round {round}: a rewind takes {ms} ms; killed after {wait} ms");
        std::thread::sleep(Duration::from_millis(wait));
        m.kill9();
        let _ = rewinding.wait();
        m = env.mount();
        let wt = m.wt("repo", "w");
        let (shape, git_now) = (shape_of(&wt), git_state(&wt));
        // The state directory's log holds every mount's lines.
        let finishing = m
            .log()
            .matches("finishing a rewind a crash cut short")
            .count();
        if finishing > finished_at_mount {
            finished_at_mount = finishing;
        }
        if shape == shape_a {
            assert_eq!(git_now, git_a, "round {round}: the files rewound, git not");
            after += 1;
        } else {
            assert_eq!(shape, shape_b, "round {round}: neither before nor after");
            assert_eq!(
                git_now, git_b,
                "round {round}: the files not rewound, git was"
            );
            before += 1;
        }
        // The checkpoint still rewinds exactly (timed: the next kill lands within one).
        // From A or B, whichever the kill left: changes for the rewind to put back.
        sh(&wt, "rm -rf a b; mkdir b; cd b; seq 1 1500 | xargs touch");
        let started = std::time::Instant::now();
        rewind(&env, cp);
        took = started.elapsed();
        assert_eq!(shape_of(&wt), shape_a, "round {round}");
        assert_eq!(git_state(&wt), git_a, "round {round}");
    }
    eprintln!(
        "killed before the rewind began {before} times, during or after it {after} times ({finished_at_mount} finished by the next mount)"
    );
    m.unmount();
}
