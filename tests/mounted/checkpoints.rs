//! Checkpoints and rewinds of a mounted worktree, with a real repository and the real
//! `git` binary: every file the view shows, the index, HEAD and its branch, and a merge
//! stopped on a conflict come back exactly; a rewind is undone by the checkpoint it took;
//! a turn takes one as it starts; a rewind is refused while others write there; a kill
//! -9 while one is taken, while changes are kept or while a rewind runs leaves every
//! checkpoint good; what a checkpoint gone reached is kept for the removal period;
//! checkpoints give way when the disk is low.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

fn sh(dir: &Path, script: &str) -> String {
    run_ok("sh", &["-c", &format!("set -e\n{script}")], dir)
}

fn checkpoint(env: &Env, label: &str) -> u64 {
    checkpoint_of(env, "repo/w", label)
}

fn checkpoint_of(env: &Env, target: &str, label: &str) -> u64 {
    let out = wtfs_ok(
        &env.state(),
        &["checkpoint", target, "--label", label, "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["worktree"], target, "{out}");
    assert_eq!(v["label"], label, "{out}");
    v["checkpoint"].as_u64().unwrap()
}

/// The ids of `target`'s checkpoints, oldest first.
fn checkpoint_ids(env: &Env, target: &str) -> Vec<u64> {
    let out = wtfs_ok(&env.state(), &["checkpoints", target, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checkpoint"].as_u64().unwrap())
        .collect()
}

/// The refs under `prefix` of the repository, each with the commit it names.
fn refs_under(env: &Env, prefix: &str) -> Vec<(String, String)> {
    run_ok(
        "git",
        &["for-each-ref", "--format=%(refname) %(objectname)", prefix],
        &env.repo.path(),
    )
    .lines()
    .map(|l| {
        let (r, o) = l.split_once(' ').unwrap();
        (r.to_string(), o.to_string())
    })
    .collect()
}

/// The refs keeping the checkpoints of worktree `id` (`<state key>-<id>/<n>`).
fn kept_refs_of(env: &Env, id: i64) -> Vec<(String, String)> {
    refs_under(env, "refs/worktreefs/checkpoints/")
        .into_iter()
        .filter(|(r, _)| r.contains(&format!("-{id}/")))
        .collect()
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

/// A bisect under way (its `refs/bisect/*`, the worktree's own refs), the worktree's own
/// config and its sparse-checkout patterns come back with a rewind.
#[test]
fn a_bisect_the_worktree_config_and_sparse_patterns_come_back() {
    let env = Env::new();
    git(
        &env.repo.path(),
        &["config", "extensions.worktreeConfig", "true"],
    );
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    sh(
        &wt,
        "git config user.email a@example.com; git config user.name agent
         for i in 1 2 3 4; do echo $i > n.txt; git add n.txt; git commit -qm c$i; done
         git bisect start HEAD HEAD~3 >/dev/null
         git config --worktree wt.setting kept
         p=$(git rev-parse --git-path info/sparse-checkout)
         mkdir -p \"$(dirname \"$p\")\"; echo '/src/' > \"$p\"",
    );
    let bisect = |wt: &Path| {
        run_ok(
            "git",
            &[
                "for-each-ref",
                "--format=%(refname) %(objectname)",
                "refs/bisect/",
            ],
            wt,
        )
    };
    let sparse = |wt: &Path| {
        let p = run_ok(
            "git",
            &["rev-parse", "--git-path", "info/sparse-checkout"],
            wt,
        );
        fs::read_to_string(wt.join(p.trim())).unwrap_or_default()
    };
    let config = |wt: &Path| run_ok("git", &["config", "--worktree", "--list"], wt);
    let then = (bisect(&wt), config(&wt), sparse(&wt), git_state(&wt));
    assert!(then.0.contains("refs/bisect/bad"), "{}", then.0);
    assert!(then.1.contains("wt.setting=kept"), "{}", then.1);
    assert_eq!(then.2, "/src/\n");
    let one = checkpoint(&env, "bisecting");
    sh(
        &wt,
        "git bisect reset >/dev/null
         git config --worktree wt.setting changed
         rm -f \"$(git rev-parse --git-path info/sparse-checkout)\"",
    );
    assert_ne!(
        (bisect(&wt), config(&wt), sparse(&wt)),
        (then.0.clone(), then.1.clone(), then.2.clone())
    );
    rewind(&env, one);
    assert_eq!(
        (bisect(&wt), config(&wt), sparse(&wt), git_state(&wt)),
        then
    );
    run_ok("git", &["bisect", "log"], &wt);
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

/// A checkpoint that goes (past the count kept, or with its worktree) leaves what it
/// reached under `refs/worktreefs/removed/checkpoints/` for the removal period: a commit
/// only it reached survives `git gc`, and the ref goes once the period is over.
#[test]
fn a_checkpoint_gone_keeps_its_commits_for_the_removal_period() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    wtfs_ok(&env.state(), &["new", "repo/other"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    sh(
        &wt,
        "git config user.email a@example.com; git config user.name agent
         echo only > only.txt; git add only.txt; git commit -qm only-here",
    );
    let only = run_ok("git", &["rev-parse", "HEAD"], &wt)
        .trim()
        .to_string();
    let first = checkpoint(&env, "reaches only-here");
    sh(&wt, "git reset -q --hard HEAD~1");
    let (w, other) = (id_of(&env, "w"), id_of(&env, "other"));
    // One more than the count kept: the first goes.
    for i in 0..50 {
        checkpoint(&env, &format!("c{i}"));
    }
    let ids = checkpoint_ids(&env, "repo/w");
    assert_eq!(ids.len(), 50, "{ids:?}");
    assert!(!ids.contains(&first), "{ids:?}");
    let kept = kept_refs_of(&env, w);
    assert_eq!(kept.len(), 50, "{kept:?}");
    let retired = refs_under(&env, "refs/worktreefs/removed/checkpoints/");
    assert_eq!(retired.len(), 1, "{retired:?}");
    assert!(
        retired[0].0.contains(&format!("-{w}-{first}-")),
        "{retired:?}"
    );
    assert_eq!(retired[0].1, only);
    // git's gc keeps what only the retired ref reaches.
    let repo = env.repo.path();
    run_ok("git", &["reflog", "expire", "--expire=now", "--all"], &repo);
    run_ok("git", &["gc", "-q", "--prune=now"], &repo);
    run_ok("git", &["cat-file", "-e", &only], &repo);

    // A removed worktree's checkpoints go with it; their refs are retired (here by the
    // next mount's reconcile; a running daemon's sweeper does it within a minute).
    checkpoint_of(&env, "repo/other", "o1");
    checkpoint_of(&env, "repo/other", "o2");
    assert_eq!(kept_refs_of(&env, other).len(), 2);
    fs::remove_dir(m.wt("repo", "other")).unwrap();
    // Work of its own keeps w from the unmount's cleanup (its checkpoints are no work).
    fs::write(wt.join("work.txt"), "work").unwrap();
    m.unmount();
    let m = env.mount();
    assert!(kept_refs_of(&env, other).is_empty());
    let retired = refs_under(&env, "refs/worktreefs/removed/checkpoints/");
    assert_eq!(retired.len(), 3, "{retired:?}");
    assert_eq!(
        retired
            .iter()
            .filter(|(r, _)| r.contains(&format!("-{other}-")))
            .count(),
        2,
        "{retired:?}"
    );
    // The live worktree's stay as they were.
    assert_eq!(kept_refs_of(&env, w).len(), 50);
    m.unmount();

    // The period over (`--keep-removed 0`: nothing is kept): the retired refs go, the
    // kept checkpoints' stay.
    let m = env.mount_with(&["--keep-removed", "0"]);
    assert!(refs_under(&env, "refs/worktreefs/removed/checkpoints/").is_empty());
    assert_eq!(kept_refs_of(&env, w).len(), 50);
    m.unmount();
}

/// While the state directory's disk is low, the checkpoints of every worktree give way,
/// oldest first, each worktree keeping its newest; what they reached is retired, not lost.
#[test]
fn checkpoints_give_way_across_worktrees_while_the_disk_is_low() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    wtfs_ok(&env.state(), &["new", "repo/v"]);
    let m = env.mount();
    for i in 0..3 {
        fs::write(m.wt("repo", "w").join("f.txt"), format!("{i}")).unwrap();
        checkpoint_of(&env, "repo/w", &format!("w{i}"));
        fs::write(m.wt("repo", "v").join("f.txt"), format!("{i}")).unwrap();
        checkpoint_of(&env, "repo/v", &format!("v{i}"));
    }
    let (w, v) = (
        checkpoint_ids(&env, "repo/w"),
        checkpoint_ids(&env, "repo/v"),
    );
    assert_eq!((w.len(), v.len()), (3, 3));
    m.unmount();
    let m = env.mount_with(&["--keep-min-free-gib", "100000000"]);
    wait_until(
        "checkpoints dropped for the disk",
        Duration::from_secs(30),
        || checkpoint_ids(&env, "repo/w").len() == 1 && checkpoint_ids(&env, "repo/v").len() == 1,
    );
    assert_eq!(checkpoint_ids(&env, "repo/w"), vec![w[2]]);
    assert_eq!(checkpoint_ids(&env, "repo/v"), vec![v[2]]);
    assert_eq!(
        refs_under(&env, "refs/worktreefs/removed/checkpoints/").len(),
        4
    );
    assert!(m
        .log()
        .contains("checkpoint dropped: the state directory's disk has"));
    // The newest still rewinds exactly.
    fs::write(m.wt("repo", "w").join("f.txt"), "later").unwrap();
    rewind(&env, w[2]);
    assert_eq!(
        fs::read_to_string(m.wt("repo", "w").join("f.txt")).unwrap(),
        "2"
    );
    m.unmount();
}

/// What a rewind put back is what the next open of its path sees, however soon: the
/// kernel's cached names and attributes are dropped before the rewind answers.
#[test]
fn a_file_opened_right_after_a_rewind_is_the_one_it_put_back() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let f = m.wt("repo", "w").join("f.txt");
    fs::write(&f, "a").unwrap();
    let mut back = checkpoint(&env, "a");
    fs::write(&f, "b").unwrap();
    for round in 0..30 {
        // The kernel knows the name and the inode the rewind replaces.
        let was = fs::read_to_string(&f).unwrap();
        back = rewind(&env, back);
        let want = if was == "a" { "b" } else { "a" };
        match fs::read_to_string(&f) {
            Ok(now) => assert_eq!(now, want, "round {round}"),
            Err(e) => panic!("round {round}: f.txt right after the rewind: {e}"),
        }
    }
    m.unmount();
}

/// The lock file a daemon killed while it changed a checkpoint's ref leaves (the number
/// it held is taken again next) is removed by the next take of this state directory;
/// another state directory's is let be.
#[test]
fn a_lock_file_a_killed_daemon_left_on_its_ref_is_removed_by_the_next_take() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    fs::write(m.wt("repo", "w").join("f.txt"), "one").unwrap();
    let one = checkpoint(&env, "one");
    m.unmount();
    let refs = env.repo.path().join(".git/refs/worktreefs/checkpoints");
    let kept = kept_refs_of(&env, 1);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let dir = kept[0].0.rsplit_once('/').unwrap().0.to_string();
    let key = dir.rsplit('/').next().unwrap().to_string();
    let dead = refs.join(format!("{key}/{}.lock", one + 1));
    let others = refs.join("s0123456789ab-1/2.lock");
    for f in [&dead, &others] {
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(f, "").unwrap();
    }
    // Its daemon killed a moment before the next started.
    std::thread::sleep(Duration::from_millis(100));
    let m = env.mount();
    fs::write(m.wt("repo", "w").join("f.txt"), "two").unwrap();
    let two = checkpoint(&env, "two");
    assert_eq!(two, one + 1);
    assert_eq!(kept_refs_of(&env, 1).len(), 2);
    assert!(!dead.exists());
    assert!(
        others.exists(),
        "another state directory's lock was removed"
    );
    assert!(m
        .log()
        .contains("left by a daemon killed as it changed checkpoint ref"));
    m.unmount();
}

/// A take stalled in one worktree (its repository's owner made `packed-refs` a FIFO, so
/// the take's ref change waits for a writer) holds up that worktree's changes, not
/// another's: each worktree has its own lock on changes (while the stalled worktree's
/// requests leave the transport workers to serve others: see docs/design/locks.md).
#[test]
fn a_take_stalled_in_one_worktree_holds_up_no_other_worktrees_changes() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    wtfs_ok(&env.state(), &["new", "repo/v"]);
    let m = env.mount();
    fs::write(m.wt("repo", "w").join("f.txt"), "w").unwrap();
    let packed = env.repo.path().join(".git/packed-refs");
    let aside = env.repo.path().join(".git/packed-refs.aside");
    let had = packed.exists();
    if had {
        fs::rename(&packed, &aside).unwrap();
    }
    nix::unistd::mkfifo(&packed, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    // Whatever happens below, the FIFO's reader is let go and packed-refs put back.
    struct PutBack(std::path::PathBuf, std::path::PathBuf, bool);
    impl Drop for PutBack {
        fn drop(&mut self) {
            release_fifo(&self.0);
            let _ = fs::remove_file(&self.0);
            if self.2 {
                let _ = fs::rename(&self.1, &self.0);
            }
        }
    }
    let put_back = PutBack(packed.clone(), aside, had);
    let mut take = std::process::Command::new(BIN)
        .args(["--state-dir", env.state().to_str().unwrap()])
        .args(["checkpoint", "repo/w", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The take is at its ref change, as the repository's owner, stalled on the FIFO.
    let stalled = || thread_named(m.pid(), "as-repo-owner");
    wait_until(
        "the take reaches its refs",
        Duration::from_secs(20),
        stalled,
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(stalled(), "the take did not stall on the FIFO");
    // A change in repo/w waits for its take.
    let blocked = {
        let f = m.wt("repo", "w").join("blocked.txt");
        std::thread::spawn(move || fs::write(f, "w"))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !blocked.is_finished(),
        "repo/w's create did not wait for its take"
    );
    let started = std::time::Instant::now();
    let v = m.wt("repo", "v");
    for i in 0..20 {
        fs::write(v.join(format!("n{i}.txt")), "v").unwrap();
        fs::rename(v.join(format!("n{i}.txt")), v.join(format!("m{i}.txt"))).unwrap();
    }
    let took = started.elapsed();
    assert!(
        take.try_wait().unwrap().is_none(),
        "the take finished before the other worktree's changes did"
    );
    assert!(
        took < Duration::from_secs(5),
        "repo/v's creates and renames waited {took:?} for repo/w's take"
    );
    drop(put_back);
    blocked.join().unwrap().unwrap();
    let out = take.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(m.wt("repo", "w").join("f.txt"), "later").unwrap();
    let n: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    rewind(&env, n["checkpoint"].as_u64().unwrap());
    assert_eq!(
        fs::read_to_string(m.wt("repo", "w").join("f.txt")).unwrap(),
        "w"
    );
    m.unmount();
}

/// Lets a reader blocked in opening the FIFO `path` go on (it then reads nothing).
fn release_fifo(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
}

/// Whether process `pid` has a thread named `name`.
fn thread_named(pid: u32, name: &str) -> bool {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
}

/// A fork starts with no checkpoints, and says so; its parent keeps its own.
#[test]
fn a_fork_copies_no_checkpoints_and_says_so() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    fs::write(m.wt("repo", "w").join("f.txt"), "one").unwrap();
    let one = checkpoint(&env, "one");
    fs::remove_file(m.wt("repo", "w").join("f.txt")).unwrap();
    let out = wtfs_ok(&env.state(), &["new", "repo/f", "--from", "w"]);
    assert!(
        out.contains("the checkpoints of repo/w are not copied"),
        "{out}"
    );
    assert!(checkpoint_ids(&env, "repo/f").is_empty());
    assert!(!m.wt("repo", "f").join("f.txt").exists());
    rewind(&env, one);
    assert_eq!(
        fs::read_to_string(m.wt("repo", "w").join("f.txt")).unwrap(),
        "one"
    );
    m.unmount();
}

/// `shape_of` and the bytes of `big.bin`: what the crash tests of takes and keeps compare.
fn fingerprint(wt: &Path) -> String {
    format!(
        "{}{}",
        shape_of(wt),
        run_ok("sh", &["-c", "md5sum big.bin 2>&1 || true"], wt)
    )
}

/// A shell of the test's own in a process group of its own, the group ended (by its
/// id: the shell's pid) when dropped, the commands it started with it.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: a signal to the process group this test made.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn spawn_in(dir: &Path, script: &str) -> Child {
    Child(
        std::os::unix::process::CommandExt::process_group(
            std::process::Command::new("sh")
                .args(["-c", script])
                .current_dir(dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
            0,
        )
        .spawn()
        .unwrap(),
    )
}

/// Waits until process `pid` has a file named `name` open.
fn wait_open(pid: u32, name: &str) {
    wait_until(
        &format!("pid {pid} opens {name}"),
        Duration::from_secs(20),
        || {
            fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| fs::read_link(e.path()).is_ok_and(|l| l.ends_with(name)))
        },
    );
}

/// kill -9 of the daemon while it takes a checkpoint (made long by a file of 64 MiB
/// open for writing, which a take copies): the next mount shows the worktree as it was
/// (a take changes nothing of it), and every checkpoint there, the one cut short too
/// when it is listed, rewinds exactly.
#[test]
fn a_daemon_killed_while_it_takes_a_checkpoint_leaves_every_checkpoint_good() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let mut rng = Rng::new(seed_or(0x7461_6b65));
    let mut m = env.mount();
    let (mut listed_after, mut not_listed) = (0, 0);
    let mut took = Duration::ZERO;
    for round in 0..4 {
        let wt = m.wt("repo", "w");
        sh(
            &wt,
            &format!(
                "git config user.email a@example.com; git config user.name agent
                 rm -rf a; mkdir a; cd a; seq 1 300 | xargs touch; cd ..
                 head -c 67108864 /dev/urandom > big.bin
                 echo {round} > r.txt; git add r.txt; git commit -qm r{round}"
            ),
        );
        let (print_a, git_a) = (fingerprint(&wt), git_state(&wt));
        let cp_a = checkpoint(&env, "A");
        sh(
            &wt,
            "rm -rf a; echo B >> r.txt; git commit -qam B
             dd if=/dev/zero of=big.bin bs=4096 count=1 seek=3 conv=notrunc 2>/dev/null",
        );
        let (print_b, git_b) = (fingerprint(&wt), git_state(&wt));
        let holder = spawn_in(&wt, "exec 3>>big.bin; sleep 60");
        wait_open(holder.0.id(), "big.bin");
        if took.is_zero() {
            let started = std::time::Instant::now();
            checkpoint(&env, "timed");
            took = started.elapsed();
        }
        let mut taking = std::process::Command::new(BIN)
            .args(["--state-dir", env.state().to_str().unwrap()])
            .args(["checkpoint", "repo/w", "--label", "cut short"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let ms = took.as_millis() as u64;
        let wait = rng.below(ms + 1);
        eprintln!("round {round}: a take copying 64 MiB takes {ms} ms; killed after {wait} ms");
        std::thread::sleep(Duration::from_millis(wait));
        m.kill9();
        let _ = taking.wait();
        drop(holder);
        m = env.mount();
        let wt = m.wt("repo", "w");
        assert_eq!(
            fingerprint(&wt),
            print_b,
            "round {round}: a take changed files"
        );
        assert_eq!(git_state(&wt), git_b, "round {round}: a take changed git");
        let ids = checkpoint_ids(&env, "repo/w");
        assert!(ids.contains(&cp_a), "round {round}: {ids:?}");
        let cut = ids.iter().copied().filter(|&i| i > cp_a).max();
        if let Some(cut) = cut {
            listed_after += 1;
            sh(&wt, "rm -f big.bin; echo C > r.txt");
            rewind(&env, cut);
            assert_eq!(fingerprint(&wt), print_b, "round {round}");
            assert_eq!(git_state(&wt), git_b, "round {round}");
        } else {
            not_listed += 1;
        }
        rewind(&env, cp_a);
        assert_eq!(fingerprint(&wt), print_a, "round {round}");
        assert_eq!(git_state(&wt), git_a, "round {round}");
    }
    eprintln!(
        "the checkpoint cut short was there after the crash {listed_after} times, gone {not_listed} times"
    );
    m.unmount();
}

/// kill -9 of the daemon while a turn changes the worktree (each first change keeping
/// what it changes: a tree removed, files made, a file of 64 MiB copied at its first
/// open for writing, a rename): the checkpoint taken before still rewinds exactly.
#[test]
fn a_daemon_killed_while_changes_are_kept_leaves_the_checkpoint_good() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let mut rng = Rng::new(seed_or(0x6b65_6570));
    let mut m = env.mount();
    let changes = "rm -rf a; mkdir b; cd b; seq 1 1500 | xargs touch; cd ..
                   dd if=/dev/zero of=big.bin bs=4096 count=1 seek=7 conv=notrunc 2>/dev/null
                   mv r.txt r2.txt; echo changed > r2.txt; chmod 600 r2.txt";
    let mut took = Duration::from_millis(500);
    for round in 0..4 {
        let wt = m.wt("repo", "w");
        sh(
            &wt,
            &format!(
                "git config user.email a@example.com; git config user.name agent
                 rm -rf a b r2.txt; mkdir a; cd a; seq 1 1500 | xargs touch; cd ..
                 head -c 67108864 /dev/urandom > big.bin
                 echo {round} > r.txt; git add r.txt; git commit -qm r{round}"
            ),
        );
        let (print_a, git_a) = (fingerprint(&wt), git_state(&wt));
        let cp = checkpoint(&env, "A");
        let changer = spawn_in(&wt, changes);
        let ms = took.as_millis() as u64;
        let wait = rng.below(ms + 1);
        eprintln!("round {round}: the changes take {ms} ms; killed after {wait} ms");
        std::thread::sleep(Duration::from_millis(wait));
        m.kill9();
        drop(changer);
        m = env.mount();
        let wt = m.wt("repo", "w");
        rewind(&env, cp);
        assert_eq!(fingerprint(&wt), print_a, "round {round}");
        assert_eq!(git_state(&wt), git_a, "round {round}");
        // Timed whole: the next kill lands within the changes.
        let started = std::time::Instant::now();
        sh(&wt, changes);
        took = started.elapsed();
        rewind(&env, cp);
        assert_eq!(fingerprint(&wt), print_a, "round {round}");
    }
    m.unmount();
}
