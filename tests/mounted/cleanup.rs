//! Cleanup after the last release, the retained store, unmount and reclaim — mounted, with
//! a real repository, a real bare remote and the real `git` binary.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn rows(env: &Env) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    json.as_array().unwrap().clone()
}

fn retained(env: &Env) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["retained", "--json"])).unwrap();
    json.as_array().unwrap().clone()
}

fn reason_of(env: &Env, name: &str) -> String {
    retained(env)
        .iter()
        .find(|r| r["name"] == name)
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// A bare remote the repository pushes to, with `main` pushed.
fn add_remote(env: &Env) -> PathBuf {
    let remote = env.dir.path().join("remote.git");
    run_ok(
        "git",
        &["init", "-q", "--bare", remote.to_str().unwrap()],
        Path::new("/"),
    );
    let repo = env.repo.path();
    git(
        &repo,
        &["remote", "add", "origin", remote.to_str().unwrap()],
    );
    git(&repo, &["push", "-q", "origin", "main"]);
    remote
}

/// An agent: a shell that works inside the worktree and exits.
fn agent(dir: &Path, script: &str) {
    run_ok("sh", &["-c", script], dir);
}

/// Reads a file inside a worktree from a short-lived process (whose lease ends with it;
/// the test process itself would keep one).
fn cat(path: &Path) -> String {
    run_ok("cat", &[path.to_str().unwrap()], Path::new("/"))
}

/// Whether `git worktree list` has worktree `repo/<name>` (its path under the mount, the
/// whole line: a name is never found inside another path).
fn lists_worktree(env: &Env, name: &str) -> bool {
    let end = format!("/repo/{name}");
    worktree_list(env)
        .lines()
        .any(|l| l.starts_with("worktree ") && l.ends_with(&end))
}

fn worktree_list(env: &Env) -> String {
    git(&env.repo.path(), &["worktree", "list", "--porcelain"])
}

fn branches(env: &Env) -> String {
    git(
        &env.repo.path(),
        &["branch", "--list", "--format=%(refname:short)"],
    )
}

#[test]
fn clean_and_pushed_work_is_removed_and_everything_else_is_retained_with_the_reason() {
    let env = Env::new();
    add_remote(&env);
    for n in ["pushed", "unpushed", "edited", "ignored", "untracked"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let ids: Vec<i64> = ["pushed", "ignored"]
        .iter()
        .map(|n| id_of(&env, n))
        .collect();
    let m = env.mount_with(&["--linger", "0"]);
    let wt = |n: &str| m.wt("repo", n);

    // Commits and pushes, exits: removed, git forgets it, the pushed branch goes.
    agent(
        &wt("pushed"),
        "echo work > new.txt && git add new.txt && git commit -q -m work && git push -q origin HEAD",
    );
    wait_for_state(&env, "pushed", "removed", Duration::from_secs(10));
    assert!(!lists_worktree(&env, "pushed"), "{}", worktree_list(&env));
    assert!(
        !branches(&env).lines().any(|b| b == "pushed"),
        "{}",
        branches(&env)
    );
    assert!(!env
        .state()
        .join("worktrees")
        .join(ids[0].to_string())
        .exists());
    assert!(fs::read_dir(env.state().join("trash"))
        .unwrap()
        .next()
        .is_none());
    // The work is in the remote.
    let remote = env.dir.path().join("remote.git");
    let shown = run_ok(
        "git",
        &[
            "--git-dir",
            remote.to_str().unwrap(),
            "show",
            "pushed:new.txt",
        ],
        Path::new("/"),
    );
    assert_eq!(shown, "work\n");
    assert!(fs::symlink_metadata(wt("pushed")).is_err());

    // Only ignored build output: removed; the branch (nothing new, reachable from main) goes.
    agent(
        &wt("ignored"),
        "mkdir -p target/debug && echo bin > target/debug/app && echo o > src/main.o",
    );
    wait_for_state(&env, "ignored", "removed", Duration::from_secs(10));
    assert!(!branches(&env).lines().any(|b| b == "ignored"));
    assert!(!env
        .state()
        .join("worktrees")
        .join(ids[1].to_string())
        .exists());

    // Commits without pushing: retained, unpushed-commits; files and branch stay.
    agent(
        &wt("unpushed"),
        "echo mine > mine.txt && git add mine.txt && git commit -q -m mine",
    );
    wait_for_state(&env, "unpushed", "retained", Duration::from_secs(10));
    assert!(
        reason_of(&env, "unpushed").starts_with("unpushed-commits"),
        "{}",
        reason_of(&env, "unpushed")
    );

    // Edits without committing: retained, uncommitted-changes.
    agent(&wt("edited"), "echo more >> README.md");
    wait_for_state(&env, "edited", "retained", Duration::from_secs(10));
    let r = reason_of(&env, "edited");
    assert!(
        r.starts_with("uncommitted-changes") && r.contains("README.md"),
        "{r}"
    );

    // An untracked file only: retained too (it would be lost).
    agent(&wt("untracked"), "echo notes > notes.txt");
    wait_for_state(&env, "untracked", "retained", Duration::from_secs(10));
    assert!(reason_of(&env, "untracked").contains("untracked notes.txt"));

    // The retained store: in the CLI and under .control, with what it promises.
    let listed = retained(&env);
    assert_eq!(listed.len(), 3, "{listed:?}");
    let u = listed.iter().find(|r| r["name"] == "unpushed").unwrap();
    assert_eq!(u["worktree"], "repo/unpushed");
    assert_eq!(u["repo"], "repo");
    assert_eq!(u["branch"], "unpushed");
    assert_eq!(u["path"], wt("unpushed").to_str().unwrap());
    assert_eq!(u["base_commit"].as_str().unwrap(), env.repo.head());
    assert!(u["retained_at"].as_str().unwrap().contains('T'), "{u}");
    let mut names: Vec<String> = fs::read_dir(m.mountpoint.join(".control/retained"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["repo:edited", "repo:unpushed", "repo:untracked"]);
    let entry: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/retained/repo:edited")).unwrap(),
    )
    .unwrap();
    assert!(entry["reason"]
        .as_str()
        .unwrap()
        .starts_with("uncommitted-changes"));
    let table = wtfs_ok(&env.state(), &["retained"]);
    assert!(
        table.contains("repo/unpushed") && table.contains("unpushed-commits"),
        "{table}"
    );

    // Retained worktrees stay visible and usable; git still knows them.
    let mut in_repo: Vec<String> = fs::read_dir(m.mountpoint.join("repo"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    in_repo.sort();
    assert_eq!(in_repo, ["edited", "unpushed", "untracked"]);
    assert!(lists_worktree(&env, "unpushed"));

    // Leasing a retained worktree makes it active and takes it out of the store; its
    // work is all there.
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/edited", "--session", "s"],
    );
    assert_eq!(state_of(&env, "edited"), "active");
    assert!(reason_of(&env, "edited").is_empty());
    let readme = cat(&wt("edited").join("README.md"));
    assert!(readme.ends_with("more\n"), "{readme}");
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/edited", "--session", "s"],
    );
    wait_for_state(&env, "edited", "retained", Duration::from_secs(10));

    // Pushed by hand from the main checkout: removed at the next reconcile (next mount).
    git(&env.repo.path(), &["push", "-q", "origin", "unpushed"]);
    m.unmount();
    assert_eq!(state_of(&env, "unpushed"), "retained");
    let m = env.mount_with(&["--linger", "0"]);
    assert_eq!(state_of(&env, "unpushed"), "removed");
    assert!(!branches(&env).lines().any(|b| b == "unpushed"));
    assert!(!lists_worktree(&env, "unpushed"));
    // The others are still held for their work, across the restart.
    assert_eq!(state_of(&env, "edited"), "retained");
    assert_eq!(state_of(&env, "untracked"), "retained");
    let readme = cat(&m.wt("repo", "edited").join("README.md"));
    assert!(readme.ends_with("more\n"));
    // A removed worktree's name can be used again.
    wtfs_ok(&env.state(), &["new", "repo/again", "--branch", "again"]);
    wtfs_ok(&env.state(), &["new", "repo/ignored"]);
    assert_eq!(state_of(&env, "ignored"), "ready");
}

fn set_state_by_hand(env: &Env, id: i64, state: &str, removal: Option<&str>) {
    let db = rusqlite::Connection::open(env.state().join("worktreefs.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute(
        "UPDATE worktrees SET state = ?1, removal = ?2 WHERE id = ?3",
        rusqlite::params![state, removal, id],
    )
    .unwrap();
}

#[test]
fn a_cleanup_a_dead_daemon_left_is_finished_at_the_next_mount() {
    let env = Env::new();
    for n in ["marked", "halfway", "dirty", "byhand"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    // Directories worktreefs did not make: a plain `git worktree add`, a stray directory
    // in the state dir.
    let foreign = env.dir.path().join("foreign");
    git(
        &env.repo.path(),
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "foreign",
            foreign.to_str().unwrap(),
        ],
    );
    let stray = env.state().join("worktrees").join("9999");
    fs::create_dir_all(stray.join("upper")).unwrap();
    fs::write(stray.join("upper/file"), "not ours").unwrap();
    let m = env.mount();
    agent(&m.wt("repo", "dirty"), "echo keep > keep.txt");
    agent(&m.wt("repo", "byhand"), "echo keep > keep.txt");
    m.kill9();
    // Retained... and then its directory removed by hand.
    let byhand = id_of(&env, "byhand");
    set_state_by_hand(&env, byhand, "deleting", None);
    let m = env.mount();
    assert_eq!(state_of(&env, "byhand"), "retained");
    assert_eq!(retained(&env).len(), 1);
    m.kill9();
    fs::remove_dir_all(env.state().join("worktrees").join(byhand.to_string())).unwrap();
    // What a daemon killed between `deleting` and removal leaves: the mark alone; the
    // decision recorded and the directory already parked; a dirty worktree marked.
    let marked = id_of(&env, "marked");
    let halfway = id_of(&env, "halfway");
    let dirty = id_of(&env, "dirty");
    set_state_by_hand(&env, marked, "deleting", None);
    set_state_by_hand(&env, halfway, "deleting", Some("remove+branch"));
    fs::rename(
        env.state().join("worktrees").join(halfway.to_string()),
        env.state().join("trash").join(halfway.to_string()),
    )
    .unwrap();
    set_state_by_hand(&env, dirty, "deleting", None);

    let m = env.mount();
    assert_eq!(state_of(&env, "marked"), "removed");
    assert_eq!(state_of(&env, "halfway"), "removed");
    assert!(!env.state().join("trash").join(halfway.to_string()).exists());
    let list = worktree_list(&env);
    assert!(
        !list.contains("/marked") && !list.contains("/halfway"),
        "{list}"
    );
    assert!(!branches(&env)
        .lines()
        .any(|b| b == "halfway" || b == "marked"));
    // Nothing is lost: the dirty one is retained with its file.
    assert_eq!(state_of(&env, "dirty"), "retained");
    assert!(reason_of(&env, "dirty").contains("untracked keep.txt"));
    // The one removed by hand left the retained store; its git entry went with it.
    assert_eq!(state_of(&env, "byhand"), "removed");
    assert_eq!(
        retained(&env)
            .iter()
            .map(|r| r["name"].clone())
            .collect::<Vec<_>>(),
        ["dirty"]
    );
    assert!(!lists_worktree(&env, "byhand"));
    // Nothing foreign was adopted or deleted.
    assert!(worktree_list(&env).contains(foreign.to_str().unwrap()));
    assert_eq!(
        fs::read_to_string(stray.join("upper/file")).unwrap(),
        "not ours"
    );
    assert!(!fs::read_dir(m.mountpoint.join("repo"))
        .unwrap()
        .any(|e| e.unwrap().file_name() == "9999"));
    // (Reading it leases it, which takes it out of the retained store: last.)
    assert_eq!(cat(&m.wt("repo", "dirty").join("keep.txt")), "keep\n");
}

#[test]
fn a_plain_umount_releases_every_lease_and_runs_the_cleanup() {
    let env = Env::new();
    for n in ["clean", "dirty"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/clean", "--session", "orch"],
    );
    agent(&m.wt("repo", "dirty"), "echo x >> README.md");
    run_ok("umount", &[m.mountpoint.to_str().unwrap()], Path::new("/"));
    let end = Instant::now() + Duration::from_secs(15);
    while !wtfs_ok(&env.state(), &["status"]).contains("not mounted") {
        assert!(
            Instant::now() < end,
            "the daemon did not finish after umount"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(state_of(&env, "clean"), "removed");
    assert_eq!(state_of(&env, "dirty"), "retained");
    assert!(squeezed(&wtfs_ok(&env.state(), &["events"])).contains("session:orch unmount"));
    drop(m);
}

#[test]
fn a_deleting_worktree_answers_ebusy_until_its_cleanup_ends() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount();
    let id = id_of(&env, "w");
    // Someone else holds the cleanup (as a reclaim in progress would).
    let lock = fs::File::create(env.state().join("locks").join(id.to_string())).unwrap();
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    set_state_by_hand(&env, id, "deleting", None);
    let err = fs::metadata(m.wt("repo", "w").join("README.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    let out = wtfs(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "s"],
    );
    assert_eq!(out.status.code(), Some(3), "the typed conflict");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is deleting"));
    drop(lock);
    // The daemon's sweeper finishes it once the lock is free.
    wait_for_state(&env, "w", "removed", Duration::from_secs(10));
    let err = fs::metadata(m.wt("repo", "w")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
}

/// A process we start inside a worktree and end by pid.
struct Inside(Child);

impl Inside {
    fn start(dir: &Path, script: &str) -> Inside {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Inside(child)
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn end(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.end();
    }
}

/// A holder that has exited, or left, holds nothing by the time reclaim asks: a writer
/// that is gone, or the caller's own shell that wrote there from outside, does not make
/// reclaim refuse. One still inside is named (the caller's own shell said to be yours), a
/// session's lease with the command that releases it, and `--wait` waits for them to go.
#[test]
fn reclaim_settles_liveness_names_each_holder_and_waits() {
    let env = Env::new();
    for n in ["gone", "mine", "inside", "held"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    let bin = BIN;
    let state = env.state();
    let state = state.to_str().unwrap();
    // The writer has exited when reclaim runs.
    let wt = m.wt("repo", "gone");
    agent(Path::new("/"), &format!("echo x > '{}/f'", wt.display()));
    let out = wtfs(&env.state(), &["reclaim", "repo/gone", "--discard"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(state_of(&env, "gone"), "removed");
    // The caller's own shell wrote there, from outside, and asks.
    let wt = m.wt("repo", "mine");
    let out = run(
        "sh",
        &[
            "-c",
            &format!(
                "echo x > '{}/f' && '{bin}' --state-dir '{state}' reclaim repo/mine --discard",
                wt.display()
            ),
        ],
        Path::new("/"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(state_of(&env, "mine"), "removed");
    // The caller's shell is inside: refused as occupied, naming it as the caller's own.
    let wt = m.wt("repo", "inside");
    let out = run(
        "sh",
        &[
            "-c",
            &format!("cat README.md > /dev/null && '{bin}' --state-dir '{state}' reclaim repo/inside --json"),
        ],
        &wt,
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"], "occupied", "{v}");
    let holders = v["holders"].as_array().unwrap();
    assert!(holders.iter().any(|h| h["yours"] == true), "{v}");
    let out = run(
        "sh",
        &[
            "-c",
            &format!(
                "cat README.md > /dev/null && '{bin}' --state-dir '{state}' reclaim repo/inside"
            ),
        ],
        &wt,
    );
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("yours: this command's own shell"), "{msg}");
    assert!(msg.contains("ends by itself within two seconds"), "{msg}");
    assert!(msg.contains("cd out of the worktree"), "{msg}");
    assert_ne!(state_of(&env, "inside"), "removed");
    // A session's lease: named with the command that releases it; exit 3 as an exclusive
    // lease's refusal.
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/held", "--session", "orch"],
    );
    let out = wtfs(&env.state(), &["reclaim", "repo/held"]);
    assert_eq!(out.status.code(), Some(3));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("session orch")
            && msg.contains("worktreefs lease release repo/held --session orch"),
        "{msg}"
    );
    // --wait: a process inside for two seconds more; reclaim waits for it, then removes.
    let mut p = Inside::start(
        &m.wt("repo", "inside"),
        "cat README.md > /dev/null; sleep 2",
    );
    wait_until(
        "the process inside holds a lease",
        Duration::from_secs(10),
        || wtfs_ok(&env.state(), &["leases"]).contains(&format!("{}", p.pid())),
    );
    let started = Instant::now();
    let out = wtfs(&env.state(), &["reclaim", "repo/inside", "--wait", "30"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(state_of(&env, "inside"), "removed");
    p.end();
    drop(m);
}

/// SIGTERM, SIGINT and SIGHUP to the daemon unmount, as `worktreefs unmount` does: the
/// daemon cleans up and exits 0, and leaves no mount behind (whichever of its threads
/// the kernel gives the signal to).
#[test]
fn a_signal_to_the_daemon_unmounts_cleans_up_and_leaves_no_mount() {
    let env = Env::new();
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        let name = format!("w{}", sig as i32);
        let m = env.mount();
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
        wtfs_ok(
            &env.state(),
            &["run", &format!("repo/{name}"), "--", "true"],
        );
        let mountpoint = m.mountpoint.clone();
        // Every thread of the daemon: the signal may go to any that does not block it.
        let pid = m.pid() as i32;
        for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let tid: i32 = task.file_name().to_str().unwrap().parse().unwrap();
            let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
            let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            // The signal thread waits for them (its mask is lifted while it waits).
            if comm.trim() == "signals" {
                continue;
            }
            // A thread that ended meanwhile has nothing to say.
            let Some(blocked) = status
                .lines()
                .find_map(|l| l.strip_prefix("SigBlk:"))
                .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            else {
                continue;
            };
            assert_ne!(
                blocked & (1 << (sig as i32 - 1)),
                0,
                "thread {tid} ({}) of the daemon does not block {sig:?}: the signal kills the daemon there",
                comm.trim()
            );
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        while is_mounted(&mountpoint)
            || std::path::Path::new(&format!("/proc/{pid}/task")).exists()
                && !fs::read_to_string(format!("/proc/{pid}/stat"))
                    .unwrap_or_default()
                    .contains(") Z")
        {
            assert!(
                Instant::now() < end,
                "{sig:?}: not unmounted, or the daemon not ended: {}",
                m.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = m.log_tail();
        assert!(
            log.contains(&format!("{sig:?}: unmounting")),
            "{sig:?}: {log}"
        );
        assert_eq!(state_of(&env, &name), "removed", "{sig:?}: {log}");
        m.unmount();
    }
}

/// systemd's stop of a mount with someone inside: `unmount --keep-sessions` is refused,
/// `--keep-sessions --lazy` detaches, and SIGTERM follows while the process is still
/// inside. The sessions' named leases are kept all the same.
#[test]
fn a_signal_after_a_lazy_planned_restart_keeps_the_sessions() {
    let env = Env::new();
    for n in ["held", "busy"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/held", "--session", "orch"],
    );
    let mut inside = sit_in(&m.wt("repo", "busy"));
    wait_for_state(&env, "busy", "active", Duration::from_secs(10));
    let refused = wtfs(&env.state(), &["unmount", "--keep-sessions"]);
    assert!(!refused.status.success());
    wtfs_ok(&env.state(), &["unmount", "--keep-sessions", "--lazy"]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let _ = inside.kill();
    let _ = inside.wait();
    let log = m.log_tail();
    m.unmount();
    let leases = wtfs_ok(&env.state(), &["leases", "--json"]);
    assert!(leases.contains("session:orch"), "{leases}\n{log}");
    assert_eq!(state_of(&env, "held"), "active");
}

#[test]
fn unmount_names_the_processes_inside_releases_every_lease_and_loses_nothing() {
    let env = Env::new();
    for n in ["busy", "clean", "held"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/held", "--session", "orch"],
    );
    agent(&m.wt("repo", "clean"), "cat README.md > /dev/null");
    let mut p = Inside::start(&m.wt("repo", "busy"), "echo work > work.txt; exec sleep 60");
    let end = Instant::now() + Duration::from_secs(5);
    while !run(
        "test",
        &[
            "-e",
            m.wt("repo", "busy").join("work.txt").to_str().unwrap(),
        ],
        Path::new("/"),
    )
    .status
    .success()
    {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(20));
    }

    // A process whose working directory is a worktree it made no request in holds no
    // lease, but `list` counts it inside, as unmount does.
    let mut bare = Inside::start(&m.wt("repo", "clean"), "exec sleep 60");
    wait_until("list counts it inside", Duration::from_secs(10), || {
        rows(&env)
            .iter()
            .any(|w| w["name"] == "clean" && w["processes_inside"] == 1)
    });
    let table = wtfs_ok(&env.state(), &["list"]);
    assert!(table.lines().next().unwrap().contains("INSIDE"), "{table}");

    // Refused, naming each process and where it is, and nothing changed.
    let out = wtfs(&env.state(), &["unmount"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains(&format!(
            "{} (sleep 60) in repo/busy (working directory)",
            p.pid()
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&format!(
            "{} (sleep 60) in repo/clean (working directory)",
            bare.pid()
        )),
        "{msg}"
    );
    assert!(msg.contains("--lazy"), "{msg}");
    assert!(is_mounted(&m.mountpoint));
    assert_eq!(state_of(&env, "held"), "active");

    p.end();
    bare.end();
    let out = wtfs_ok(&env.state(), &["unmount"]);
    assert!(out.contains("unmounted"), "{out}");
    assert!(out.contains("repo/busy: retained"), "{out}");
    assert!(out.contains("repo/clean: removed"), "{out}");
    assert!(out.contains("repo/held: removed"), "{out}");
    assert!(!is_mounted(&m.mountpoint));
    drop(m);
    // Every lease went with reason `unmount`; the work is kept.
    assert!(wtfs_ok(&env.state(), &["leases", "--json"]).trim() == "[]");
    let events = squeezed(&wtfs_ok(&env.state(), &["events"]));
    assert!(events.contains("session:orch unmount"), "{events}");
    assert_eq!(state_of(&env, "busy"), "retained");
    let m = env.mount();
    assert_eq!(cat(&m.wt("repo", "busy").join("work.txt")), "work\n");

    // --lazy: detached at once, cleanup when the last process leaves.
    wtfs_ok(&env.state(), &["new", "repo/late"]);
    let mut p = Inside::start(
        &m.wt("repo", "late"),
        "cat README.md >/dev/null; exec sleep 60",
    );
    let end = Instant::now() + Duration::from_secs(5);
    while !wtfs_ok(&env.state(), &["leases"]).contains("repo:late") {
        assert!(Instant::now() < end, "no lease for the process inside");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = wtfs_ok(&env.state(), &["unmount", "--lazy"]);
    assert!(
        out.contains("still inside") && out.contains(&p.pid().to_string()),
        "{out}"
    );
    assert!(!is_mounted(&m.mountpoint));
    assert_eq!(state_of(&env, "late"), "active");
    // Meanwhile nothing is served: status and a new mount say what the daemon is doing.
    let status = wtfs_ok(&env.state(), &["status"]);
    assert!(
        !status.contains("mounted at") && status.contains("was unmounted (lazily"),
        "{status}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["status", "--json"])).unwrap();
    assert_eq!(j["mountpoint"], serde_json::Value::Null, "{j}");
    assert_eq!(j["detached"], true, "{j}");
    let again = wtfs(&env.state(), &["mount", m.mountpoint.to_str().unwrap()]);
    if again.status.success() {
        let _ = wtfs(&env.state(), &["unmount", "--lazy"]);
        panic!("a second daemon was started for the state dir");
    }
    let msg = String::from_utf8_lossy(&again.stderr).into_owned();
    assert!(
        msg.contains("was unmounted (lazily") && !msg.contains("unmount it first"),
        "{msg}"
    );
    p.end();
    let end = Instant::now() + Duration::from_secs(15);
    while !wtfs_ok(&env.state(), &["status"]).contains("not mounted") {
        assert!(
            Instant::now() < end,
            "the daemon did not finish after the last process left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(state_of(&env, "late"), "removed");
    drop(m);
}

#[test]
fn rmdir_and_reclaim_remove_only_what_holds_no_work_and_discard_says_what_it_throws_away() {
    let env = Env::new();
    for n in ["fresh", "work", "leased"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    // A ready worktree with nothing in it: rmdir removes it.
    fs::remove_dir(m.wt("repo", "fresh")).unwrap();
    assert_eq!(state_of(&env, "fresh"), "removed");
    assert!(!lists_worktree(&env, "fresh"));

    // Leased: EBUSY, nothing changes.
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/leased", "--session", "s"],
    );
    let err = fs::remove_dir(m.wt("repo", "leased")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    assert_eq!(state_of(&env, "leased"), "active");
    let out = wtfs(&env.state(), &["reclaim", "repo/leased"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by 1 holder"));

    // Holding work (lingering, grace not over): refused, files stay.
    agent(
        &m.wt("repo", "work"),
        "echo draft > draft.txt && echo more >> README.md",
    );
    let end = Instant::now() + Duration::from_secs(5);
    while state_of(&env, "work") != "lingering" {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = fs::remove_dir(m.wt("repo", "work")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY), "{err}");
    assert_eq!(state_of(&env, "work"), "lingering");
    let out = wtfs(&env.state(), &["reclaim", "repo/work"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("holds work") && msg.contains("--discard"),
        "{msg}"
    );
    assert!(
        msg.contains("untracked draft.txt") && msg.contains("modified README.md"),
        "{msg}"
    );
    assert_eq!(cat(&m.wt("repo", "work").join("draft.txt")), "draft\n");
    // (Reading it leased it, until cat exited: wait for that lease to go.)
    let end = Instant::now() + Duration::from_secs(5);
    while state_of(&env, "work") != "lingering" {
        assert!(Instant::now() < end, "{}", state_of(&env, "work"));
        std::thread::sleep(Duration::from_millis(20));
    }
    // --discard lists what it throws away, then does.
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/work", "--discard"]);
    assert!(
        out.contains("untracked draft.txt") && out.contains("modified README.md"),
        "{out}"
    );
    assert!(out.contains("removed repo/work"), "{out}");
    assert_eq!(state_of(&env, "work"), "removed");
    assert!(!lists_worktree(&env, "work"));
    // The main checkout was never touched.
    assert_eq!(git(&env.repo.path(), &["status", "--porcelain"]), "");

    // Bad targets name the thing and the way out.
    let out = wtfs(&env.state(), &["reclaim", "repo/nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    drop(m);
}

#[test]
fn inspection_agrees_with_git_status_after_random_work_through_the_mount() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/rnd"]);
    let m = env.mount();
    let wt = m.wt("repo", "rnd");
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let row = store.worktree("repo", "rnd").unwrap().unwrap();
    let repo = store.repo_by_id(row.repo_id).unwrap().unwrap();
    let target = worktreefs::lifecycle::cleanup::Target::new(&state, &row, &repo, &m.mountpoint);

    // WTFS_SEED=<n> runs another sequence.
    let seed = seed_or(0x5eed_c1ea);
    let mut rng = Rng::new(seed);
    let scripts = [
        "echo new >> notes-$N.txt",
        "echo edit >> README.md",
        "rm -f build.sh",
        "mkdir -p src/new && echo x > src/new/f$N.rs",
        "rm -rf src/lib",
        "mv src/main.rs src/moved.rs || true",
        "chmod -x build.sh 2>/dev/null || true",
        "chmod +x README.md",
        "mkdir -p target && echo o > target/out$N && echo o > obj$N.o",
        "cp README.md /tmp/wtfs-readme-$N && cat /tmp/wtfs-readme-$N > README.md && rm /tmp/wtfs-readme-$N",
        "ln -sf src link$N",
        "rm -rf docs && mkdir docs",
        "git add -A",
        "git add -A && (git commit -q -m step$N || true)",
        "git reset -q --hard && git clean -q -fd",
        "git stash -q -u || true",
    ];
    let mut clean_seen = 0;
    let mut dirty_seen = 0;
    for round in 0..14 {
        for _ in 0..1 + rng.below(3) {
            let s = rng.pick(&scripts).replace("$N", &round.to_string());
            run_ok("sh", &["-c", &s], &wt);
        }
        let truth = git_dirty_paths(&wt);
        let f = worktreefs::lifecycle::cleanup::inspect(&target).unwrap();
        let ours: Vec<String> = f.changes.iter().map(|c| c.path.clone()).collect();
        // Every path git lists is one we found (or under a directory we found), and every
        // change we found covers something git lists.
        let covers =
            |ours: &str, theirs: &str| theirs == ours || theirs.starts_with(&format!("{ours}/"));
        for t in &truth {
            assert!(
                ours.iter().any(|o| covers(o, t)),
                "round {round}: git lists {t}, inspection did not: {ours:?} vs {truth:?}"
            );
        }
        for o in &ours {
            assert!(
                truth.iter().any(|t| covers(o, t)),
                "round {round}: inspection found {o}, git did not: {ours:?} vs {truth:?}"
            );
        }
        if truth.is_empty() {
            clean_seen += 1;
        } else {
            dirty_seen += 1;
        }
    }
    assert!(
        clean_seen > 0 && dirty_seen > 0,
        "clean {clean_seen}, dirty {dirty_seen}"
    );
}

/// A split index (`core.splitIndex`, half of it in a shared file libgit2 cannot read)
/// keeps the worktree with a reason that says what it is and the way out, which works.
#[test]
fn a_split_index_is_named_with_the_way_out() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/split"]);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "split");
    run_ok("git", &["update-index", "--split-index"], &wt);
    wait_for_state(&env, "split", "lingering", Duration::from_secs(10));
    let said = reclaim_kept(&env, "repo/split", Duration::from_secs(30));
    assert!(said.contains("is split (core.splitIndex)"), "{said}");
    assert!(said.contains("git update-index --no-split-index"), "{said}");
    run_ok("git", &["update-index", "--no-split-index"], &wt);
    wait_for_state(&env, "split", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/split"]);
    assert!(out.contains("removed repo/split"), "{out}");
    m.unmount();
}

/// A removal's reason says what happened: a worktree nobody committed in has "no changes
/// since the base" (not "pushed"); an empty commit never pushed is no work either, and is
/// never called merged into some other agent's branch; a pushed one names where.
#[test]
fn removal_reasons_say_what_happened() {
    let env = Env::new();
    let remote = add_remote(&env);
    // Another agent's branch on the remote, sorted before main, at main's commit.
    git(&env.repo.path(), &["push", "-q", "origin", "main:agent-a"]);
    git(&env.repo.path(), &["fetch", "-q", "origin"]);
    let _ = remote;
    let names = ["untouched", "empty", "shipped"];
    for n in names {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", &format!("repo/{n}"), "--session", "s"],
        );
    }
    let m = env.mount_with(&["--linger", "0"]);
    agent(
        &m.wt("repo", "empty"),
        "git commit -q --allow-empty -m nothing",
    );
    agent(
        &m.wt("repo", "shipped"),
        "echo x > x.txt && git add x.txt && git commit -q -m x && git push -q origin shipped",
    );
    for n in names {
        wtfs_ok(
            &env.state(),
            &["lease", "release", &format!("repo/{n}"), "--session", "s"],
        );
    }
    for n in names {
        wait_for_state(&env, n, "removed", Duration::from_secs(20));
    }
    let reason = |name: &str| -> String {
        wtfs_ok(&env.state(), &["events", "--json"])
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|e| e["kind"] == "removed" && e["name"] == name)
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    assert!(
        reason("untouched").contains("no changes since the base"),
        "{}",
        reason("untouched")
    );
    assert!(
        !reason("untouched").contains("pushed"),
        "{}",
        reason("untouched")
    );
    let empty = reason("empty");
    assert!(
        empty.contains("no changes since the base: its one commit changes no file"),
        "{empty}"
    );
    assert!(
        !empty.contains("agent-a") && !empty.contains("squash"),
        "{empty}"
    );
    assert!(
        reason("shipped").contains("pushed: its commits are on origin/shipped"),
        "{}",
        reason("shipped")
    );
    drop(m);
}

/// Integration-aware cleanup: a worktree whose commits reached the remote's
/// main by a squash merge (so none of them is on a remote-tracking ref) is removed, the
/// removal says so, and its branch goes as a pushed one would (restorable as every
/// removal). One with a whitespace-only fix on top of what was squashed is retained.
#[test]
fn a_squash_merged_worktree_is_removed_and_says_it_was_integrated() {
    let env = Env::new();
    let remote = add_remote(&env);
    for n in ["squashed", "fixed-after"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", &format!("repo/{n}"), "--session", "s"],
        );
    }
    let m = env.mount_with(&["--linger", "0"]);
    let wt = |n: &str| m.wt("repo", n);
    agent(
        &wt("squashed"),
        "echo one > a.txt && git add a.txt && git commit -q -m one && \
         echo two > b.txt && git add b.txt && git commit -q -m two",
    );
    agent(
        &wt("fixed-after"),
        "printf 'x\\n' > c.txt && git add c.txt && git commit -q -m c",
    );
    // The remote's main takes both branches' work by squash merges, from another clone.
    let land = env.dir.path().join("land");
    run_ok(
        "git",
        &[
            "clone",
            "-q",
            "-b",
            "main",
            remote.to_str().unwrap(),
            land.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    for n in ["squashed", "fixed-after"] {
        let repo = env.repo.path();
        git(
            &land,
            &["fetch", "-q", repo.to_str().unwrap(), &format!("{n}:{n}")],
        );
        git(&land, &["merge", "-q", "--squash", n]);
        git(&land, &["commit", "-q", "-m", &format!("{n} (squashed)")]);
    }
    git(&land, &["push", "-q", "origin", "main"]);
    git(&env.repo.path(), &["fetch", "-q", "origin"]);
    // A whitespace-only fix on top: that is work the remote does not have.
    agent(
        &wt("fixed-after"),
        "printf 'x \\n' > c.txt && git commit -q -am 'whitespace'",
    );
    // None of the commits is on a remote-tracking ref.
    let on_remote = git(
        &env.repo.path(),
        &["branch", "-r", "--contains", "squashed"],
    );
    assert!(on_remote.trim().is_empty(), "{on_remote}");
    for n in ["squashed", "fixed-after"] {
        wtfs_ok(
            &env.state(),
            &["lease", "release", &format!("repo/{n}"), "--session", "s"],
        );
    }
    wait_for_state(&env, "squashed", "removed", Duration::from_secs(20));
    wait_for_state(&env, "fixed-after", "retained", Duration::from_secs(20));
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(
        events.contains("integrated: squash-merged into origin/main"),
        "{events}"
    );
    assert!(
        reason_of(&env, "fixed-after").starts_with("unpushed-commits"),
        "{}",
        reason_of(&env, "fixed-after")
    );
    // Its branch went as a pushed one's does; the removal is restorable.
    assert!(
        !branches(&env).lines().any(|b| b == "squashed"),
        "{}",
        branches(&env)
    );
    assert!(branches(&env).lines().any(|b| b == "fixed-after"));
    let removed = wtfs_ok(&env.state(), &["removed"]);
    assert!(removed.contains("repo/squashed"), "{removed}");
    drop(m);
}

/// Unmount says what cleanup does, a line per worktree; with many to clean, it says how
/// many first and numbers each line (`[3/5] repo/w3: removed (…)`), each worktree once.
#[test]
fn unmount_numbers_its_cleanup_lines_when_there_are_many() {
    let env = Env::new();
    let names = ["w1", "w2", "w3", "w4", "w5"];
    for n in names {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    for n in names {
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", &format!("repo/{n}"), "--session", "s"],
        );
    }
    agent(&m.wt("repo", "w3"), "echo notes > notes.txt");
    let out = wtfs_ok(&env.state(), &["unmount"]);
    assert!(
        out.contains("cleaning up 5 worktrees left without a lease"),
        "{out}"
    );
    let mut numbers = Vec::new();
    for n in names {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(&format!("] repo/{n}: ")))
            .collect();
        assert_eq!(lines.len(), 1, "repo/{n} once: {out}");
        let l = lines[0].trim_start();
        let k: usize = l[1..l.find('/').unwrap()].parse().unwrap();
        assert!(l[..l.find(']').unwrap()].ends_with("/5"), "{l}");
        numbers.push(k);
        let want = if n == "w3" { "retained" } else { "removed" };
        assert!(l.contains(&format!("repo/{n}: {want} (")), "{l}");
    }
    numbers.sort();
    assert_eq!(numbers, [1, 2, 3, 4, 5], "{out}");
    assert!(
        out.trim_end()
            .ends_with(&format!("unmounted {}", m.mountpoint.display())),
        "{out}"
    );
    drop(m);
}

/// `unmount --json`: refused as `in-use` naming the processes inside, then the outcome
/// with each worktree's cleanup (removed or retained, with the reason).
#[test]
fn unmount_answers_json_with_each_worktrees_cleanup() {
    let env = Env::new();
    for n in ["keep", "drop"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    for n in ["keep", "drop"] {
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", &format!("repo/{n}"), "--session", "s"],
        );
    }
    agent(&m.wt("repo", "keep"), "echo notes > notes.txt");
    let mut inside = std::process::Command::new("sleep")
        .arg("30")
        .current_dir(m.wt("repo", "drop"))
        .spawn()
        .unwrap();
    let o = wtfs(&env.state(), &["unmount", "--json"]);
    let _ = inside.kill();
    let _ = inside.wait();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["error"], "in-use", "{v}");
    assert!(
        v["inside"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains(&inside.id().to_string())),
        "{v}"
    );
    let mut v: serde_json::Value = serde_json::Value::Null;
    wait_until(
        "unmount goes through",
        std::time::Duration::from_secs(20),
        || {
            let o = wtfs(&env.state(), &["unmount", "--json"]);
            if !o.status.success() {
                return false;
            }
            v = serde_json::from_slice(&o.stdout).unwrap();
            true
        },
    );
    assert_eq!(v["outcome"], "unmounted", "{v}");
    assert_eq!(v["mountpoint"], m.mountpoint.to_str().unwrap(), "{v}");
    let cleaned = v["cleaned"].as_array().unwrap();
    let state_of = |name: &str| {
        cleaned
            .iter()
            .find(|c| c["worktree"] == format!("repo/{name}"))
            .unwrap_or_else(|| panic!("repo/{name} in {v}"))["state"]
            .clone()
    };
    assert_eq!(state_of("keep"), "retained", "{v}");
    assert_eq!(state_of("drop"), "removed", "{v}");
    assert!(
        cleaned
            .iter()
            .all(|c| c["reason"].is_string() && c["at"].is_string()),
        "{v}"
    );
    drop(m);
}

/// `rmdir` through the mount settles liveness as `reclaim` does: a reader that has
/// exited, or a shell that has left the worktree, holds nothing by the time it asks.
#[test]
fn rmdir_right_after_a_holder_exits_or_leaves_removes_the_worktree() {
    let env = Env::new();
    for n in ["exited", "left"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    // A reader that has exited when rmdir asks.
    let wt = m.wt("repo", "exited");
    run_ok(
        "sh",
        &[
            "-c",
            &format!(
                "cat '{0}/README.md' > /dev/null && rmdir '{0}'",
                wt.display()
            ),
        ],
        Path::new("/"),
    );
    assert_eq!(state_of(&env, "exited"), "removed");
    // The caller's own shell went in and came out again.
    let wt = m.wt("repo", "left");
    run_ok(
        "sh",
        &[
            "-c",
            &format!(
                "cd '{0}' && cat README.md > /dev/null && cd / && rmdir '{0}'",
                wt.display()
            ),
        ],
        Path::new("/"),
    );
    assert_eq!(state_of(&env, "left"), "removed");
    drop(m);
}

/// When `reclaim` answers that a worktree is removed, the mount no longer shows it, not
/// even by a name the kernel had cached a moment before.
#[test]
fn a_reclaimed_worktree_is_gone_from_the_mount_when_reclaim_answers() {
    let env = Env::new();
    let m = env.mount();
    for round in 0..15 {
        let name = format!("r{round}");
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
        let wt = m.wt("repo", &name);
        // The kernel knows the name and its attributes.
        assert!(fs::symlink_metadata(&wt).unwrap().is_dir());
        let out = wtfs_ok(&env.state(), &["reclaim", &format!("repo/{name}")]);
        assert!(out.contains("removed"), "round {round}: {out}");
        match fs::symlink_metadata(&wt) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => panic!(
                "round {round}: {} right after reclaim: {other:?}",
                wt.display()
            ),
        }
    }
    m.unmount();
}
