//! Named leases and the lifecycle they drive, through the CLI and `.control`, with a real
//! daemon.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn named_leases_are_listed_survive_a_restart_and_drive_the_lifecycle() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    {
        let m = env.mount_with(&["--linger", "1"]);
        assert_eq!(state_of(&env, "w"), "ready");
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", "repo/w", "--session", "s1"],
        );
        wtfs_ok(
            &env.state(),
            &["lease", "acquire", "repo/w", "--session", "s2"],
        );
        assert_eq!(state_of(&env, "w"), "active");
        let leases = m.mountpoint.join(".control/leases");
        let mut names: Vec<String> = fs::read_dir(&leases)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec!["repo:w@session:s1", "repo:w@session:s2"]);
        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(leases.join("repo:w@session:s1")).unwrap())
                .unwrap();
        assert_eq!(json["kind"], "session");
        assert_eq!(json["worktree"], "repo/w");
        assert_eq!(json["session"], "s1");
        assert!(
            json["acquired_at"].as_str().unwrap().contains('T'),
            "{json}"
        );
        // The daemon dies (an unmount would release them: that is tested with cleanup).
        m.kill9();
    }
    // A named lease survives the daemon.
    let m = env.mount_with(&["--linger", "1"]);
    let listed: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    // One holder goes: still active. The last goes: lingering, then deleting after the grace.
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/w", "--session", "s1"],
    );
    assert_eq!(state_of(&env, "w"), "active");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        state_of(&env, "w"),
        "active",
        "a held worktree never starts cleanup"
    );
    // Entered while held, by a short-lived process (which takes a lease of its own and
    // gives it back when it exits): the kernel caches the worktree's entry, and must forget
    // it when the worktree starts deleting.
    run_ok(
        "cat",
        &[m.wt("repo", "w").join("README.md").to_str().unwrap()],
        Path::new("/"),
    ); // Its lease goes when it exits (well within a second).
    let end = Instant::now() + Duration::from_secs(2);
    while wtfs_ok(&env.state(), &["leases"]).contains("pid:") {
        assert!(
            Instant::now() < end,
            "the cat process's lease was not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/w", "--session", "s2"],
    );
    assert_eq!(state_of(&env, "w"), "lingering");
    // Deleting, then (clean, nothing new on its branch) removed at once.
    wait_for_state(&env, "w", "removed", Duration::from_secs(4));
    // A removed worktree is refused: a typed conflict on the CLI, ENOENT from the mount
    // (EBUSY while deleting is tested in cleanup.rs).
    let out = wtfs(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "s3"],
    );
    assert_eq!(out.status.code(), Some(3));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("is removed") || msg.contains("does not exist"),
        "{msg}"
    );
    let err = fs::metadata(m.wt("repo", "w").join("README.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    // Every step is an event.
    let events = wtfs_ok(&env.state(), &["events", "--json"]);
    let rows: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seq: Vec<String> = rows
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["kind"].as_str().unwrap(),
                e["holder"].as_str().unwrap_or("")
            )
        })
        .collect();
    let cat = seq
        .iter()
        .position(|e| e.starts_with("acquired pid:"))
        .expect("the cat process took a lease");
    assert!(seq[cat + 1].starts_with("released pid:"), "{seq:?}");
    let sessions: Vec<&String> = seq.iter().filter(|e| !e.contains("pid:")).collect();
    assert_eq!(
        sessions,
        [
            "created ",
            "acquired session:s1",
            "acquired session:s2",
            "released session:s1",
            "released session:s2",
            "lingering ",
            "deleting ",
            "removed "
        ]
    );
}

/// A planned restart is not a reclaim: `unmount --keep-sessions` ends the mount, releases
/// process leases and cleans up what nobody holds, but keeps named leases and their
/// worktrees for the next mount. A mount with `-o umount_keeps_sessions` does the same
/// when `umount` ends it; plain `worktreefs unmount` stays the admin's reclaim.
#[test]
fn a_planned_restart_keeps_named_leases_and_an_admins_unmount_reclaims() {
    let env = Env::new();
    for n in ["kept", "used"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let sessions = || -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| {
                format!(
                    "{} {}",
                    l["worktree"].as_str().unwrap(),
                    l["holder"].as_str().unwrap()
                )
            })
            .collect()
    };
    // A long grace: `used`, left by its one process, is lingering at the unmount.
    let m = env.mount_with(&["--linger", "600"]);
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/kept", "--session", "orch"],
    );
    run_ok(
        "cat",
        &[m.wt("repo", "used").join("README.md").to_str().unwrap()],
        Path::new("/"),
    );
    wait_for_state(&env, "used", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["unmount", "--keep-sessions"]);
    assert!(out.contains("unmounted"), "{out}");
    drop(m);
    assert_eq!(sessions(), ["repo/kept session:orch"]);
    assert_eq!(state_of(&env, "kept"), "active");
    assert_eq!(
        state_of(&env, "used"),
        "removed",
        "nobody held it: cleaned up"
    );
    // The next mount has it, still held, files and all.
    let m = env.mount_with(&["-o", "umount_keeps_sessions"]);
    assert_eq!(sessions(), ["repo/kept session:orch"]);
    assert!(m.wt("repo", "kept").join("README.md").exists());
    // umount(8) of a mount made with umount_keeps_sessions keeps them too.
    run_ok("umount", &[m.mountpoint.to_str().unwrap()], Path::new("/"));
    wait_until("the daemon has exited", Duration::from_secs(30), || {
        let v: serde_json::Value =
            serde_json::from_str(&wtfs_ok(&env.state(), &["status", "--json"])).unwrap();
        v["daemon_pid"].is_null()
    });
    drop(m);
    assert_eq!(sessions(), ["repo/kept session:orch"]);
    // Plain `worktreefs unmount` is the admin's reclaim, whatever the mount's option.
    let m = env.mount_with(&["-o", "umount_keeps_sessions"]);
    let out = wtfs_ok(&env.state(), &["unmount"]);
    assert!(out.contains("unmounted"), "{out}");
    drop(m);
    assert!(sessions().is_empty(), "{:?}", sessions());
    assert_eq!(state_of(&env, "kept"), "removed");
    let events = squeezed(&wtfs_ok(&env.state(), &["events"]));
    assert!(events.contains("session:orch unmount"), "{events}");
}

/// A second unmount while the first is still finishing (its daemon slow: here stopped)
/// is refused, and never changes what the first asked: `--keep-sessions` keeps the named
/// leases even when a plain `unmount` comes after it.
#[test]
fn a_second_unmount_does_not_undo_the_first_ones_keep_sessions() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/kept"]);
    let m = env.mount();
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/kept", "--session", "orch"],
    );
    let pid = nix::unistd::Pid::from_raw(m.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The first unmount unmounts, then waits for the (stopped) daemon: given up on.
    let mut first = std::process::Command::new(BIN)
        .arg("--state-dir")
        .arg(env.state())
        .args(["unmount", "--keep-sessions"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while is_mounted(&m.mountpoint) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = first.kill();
    let _ = first.wait();
    let second = wtfs(&env.state(), &["unmount"]);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(second.status.code(), Some(1));
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("is being unmounted already"), "{said}");
    wait_until("the daemon has exited", Duration::from_secs(30), || {
        let v: serde_json::Value =
            serde_json::from_str(&wtfs_ok(&env.state(), &["status", "--json"])).unwrap();
        v["daemon_pid"].is_null()
    });
    drop(m);
    let leases = wtfs_ok(&env.state(), &["leases", "--json"]);
    assert!(leases.contains("session:orch"), "{leases}");
}

#[test]
fn a_lease_in_the_grace_period_keeps_the_worktree() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let _m = env.mount_with(&["--linger", "2"]);
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "a"],
    );
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/w", "--session", "a"],
    );
    assert_eq!(state_of(&env, "w"), "lingering");
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "b"],
    );
    assert_eq!(state_of(&env, "w"), "active");
    std::thread::sleep(Duration::from_millis(2600));
    assert_eq!(state_of(&env, "w"), "active");
}

#[test]
fn lease_commands_refuse_bad_input() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let cases: &[(&[&str], &str)] = &[
        (
            &["lease", "acquire", "repo/nope", "--session", "s"],
            "worktree 'repo/nope' does not exist",
        ),
        (
            &[
                "lease",
                "acquire",
                "repo/w",
                "--session",
                "s",
                "--wait",
                "x",
            ],
            "invalid value 'x'",
        ),
        (
            &["lease", "acquire", "repo/w", "--session", "bad id"],
            "session id 'bad id' contains",
        ),
        (
            &["lease", "release", "repo/w", "--session", "s"],
            "holds no lease on repo/w",
        ),
        (
            &["lease", "acquire", "nowhere", "--session", "s"],
            "'nowhere' is not REPO/WT",
        ),
    ];
    for (args, want) in cases {
        let out = wtfs(&env.state(), args);
        // An unknown worktree is the typed conflict (3), a bad value a usage error (2).
        let code = if want.contains("does not exist") {
            3
        } else if want.contains("invalid value") {
            2
        } else {
            1
        };
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains(want), "{args:?}: {msg}");
    }
    // Releasing on a worktree that does not exist: exit 1 (nothing to release), and with
    // --json the refusal on stdout.
    let out = wtfs(
        &env.state(),
        &["lease", "release", "repo/nope", "--session", "s", "--json"],
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["error"], "not-found");
    assert_eq!(v["worktree"], "repo/nope");
    assert_eq!(v["session"], "s");
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    assert_eq!(state_of(&env, "w"), "ready");
    assert!(wtfs_ok(&env.state(), &["leases", "--json"]).trim() == "[]");
}

/// The process leases on `repo/<name>`: (pid, holder) pairs.
fn process_leases(env: &Env, name: &str) -> Vec<(i64, String)> {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .filter(|l| l["name"] == name && l["kind"] == "process")
        .map(|l| {
            (
                l["pid"].as_i64().unwrap(),
                l["holder"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sh(script: &str) -> std::process::Child {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_process_that_enters_holds_the_worktree_until_it_exits() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/p"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "p");
    // cd plus a command, and a subshell with children: one lease, the shell's.
    let mut child = sh(&format!(
        "cd '{}' && cat README.md && (cat src/main.rs; sh -c 'cat build.sh') && sleep 1",
        wt.display()
    ));
    let pid = child.id() as i64;
    wait_until("the shell's lease", Duration::from_secs(5), || {
        process_leases(&env, "p").iter().any(|(p, _)| *p == pid)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        process_leases(&env, "p").len(),
        1,
        "children are covered by the shell's lease"
    );
    assert_eq!(state_of(&env, "p"), "active");
    let entry = format!("repo:p@pid:{pid}:");
    let listed: Vec<String> = fs::read_dir(m.mountpoint.join(".control/leases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let name = listed
        .iter()
        .find(|n| n.starts_with(&entry))
        .expect("listed under .control/leases");
    let json: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/leases").join(name)).unwrap(),
    )
    .unwrap();
    assert!(json["command"].as_str().unwrap().contains("cd '"), "{json}");
    child.wait().unwrap();
    let exited = Instant::now();
    wait_until("release after exit", Duration::from_secs(2), || {
        process_leases(&env, "p").is_empty()
    });
    assert!(
        exited.elapsed() < Duration::from_secs(1),
        "released {:?} after exit",
        exited.elapsed()
    );
    assert_eq!(state_of(&env, "p"), "lingering");
}

#[test]
fn a_shell_named_in_bytes_that_are_not_utf8_holds_its_lease() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    /// The shell, ended and reaped however the test ends.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/n"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "n");
    // A process's name is the file name it was started by, any bytes (and the kernel cuts
    // it at 15, in the middle of a character too): here a link to sh named in bytes that
    // are not UTF-8. A link, not a copy: a copy still open for writing in another test's
    // child would fail the exec (ETXTBSY); argv[0] stays "sh" for a busybox sh.
    let dir = tempfile::tempdir().unwrap();
    let shell = dir.path().join(std::ffi::OsStr::from_bytes(b"sh-\xff\xfe"));
    std::os::unix::fs::symlink("/bin/sh", &shell).unwrap();
    let mut child = Reaped(
        std::process::Command::new(&shell)
            .arg0("sh")
            .arg("-c")
            .arg(format!("cd '{}' && cat README.md && sleep 2", wt.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id() as i64;
    // Its cat's request finds the shell inside, the outermost: the shell holds the lease.
    wait_until("the shell's lease", Duration::from_secs(5), || {
        process_leases(&env, "n").iter().any(|(p, _)| *p == pid)
    });
    assert!(child.0.wait().unwrap().success());
    wait_until("release after exit", Duration::from_secs(3), || {
        process_leases(&env, "n").is_empty()
    });
}

#[test]
fn a_process_left_inside_inherits_the_lease_and_independent_ones_get_their_own() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/q"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "q");
    // A process sits inside (its working directory) without having asked anything; another
    // one reads a file from outside and exits: the lease passes to the one inside.
    let mut sitter = sh(&format!("cd '{}' && exec sleep 30", wt.display()));
    let sitter_pid = sitter.id() as i64;
    wait_until("the sitter is inside", Duration::from_secs(5), || {
        fs::read_link(format!("/proc/{sitter_pid}/cwd"))
            .map(|p| p == wt)
            .unwrap_or(false)
    });
    run_ok(
        "cat",
        &[wt.join("README.md").to_str().unwrap()],
        Path::new("/"),
    );
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        let l = process_leases(&env, "q");
        if l.len() == 1 && l[0].0 == sitter_pid {
            break;
        }
        assert!(
            Instant::now() < end,
            "the lease did not pass to the process inside: {l:?}\n{}",
            wtfs_ok(&env.state(), &["events"])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(events.contains("passed"), "{events}");
    assert_eq!(state_of(&env, "q"), "active");
    // A shell that leaves a background process inside and exits: still held, by a process
    // inside that is not the shell.
    let mut parent = sh(&format!(
        "cd '{}' && cat build.sh && (sleep 30 &)",
        wt.display()
    ));
    let parent_pid = parent.id() as i64;
    parent.wait().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    for (pid, _) in process_leases(&env, "q") {
        assert_ne!(pid, parent_pid, "the exited shell still holds a lease");
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).unwrap();
        assert!(cwd.starts_with(&wt), "holder {pid} is not inside");
    }
    let heir = sitter_pid;
    // Two independent sessions: one lease each.
    let mut a = sh(&format!(
        "cd '{}' && cat README.md && sleep 2",
        wt.display()
    ));
    let mut b = sh(&format!(
        "cd '{}' && cat empty.txt && sleep 2",
        wt.display()
    ));
    wait_until("two more leases", Duration::from_secs(5), || {
        process_leases(&env, "q").len() >= 3
    });
    // End what this test started: the sitter, the shell's background sleep (found by its
    // lease), and the two sessions.
    sitter.kill().unwrap();
    sitter.wait().unwrap();
    for (pid, _) in process_leases(&env, "q") {
        if pid != heir && pid != a.id() as i64 && pid != b.id() as i64 {
            // SAFETY: a process this test's shell started, read from its lease.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    a.wait().unwrap();
    b.wait().unwrap();
    wait_until("all released", Duration::from_secs(3), || {
        process_leases(&env, "q").is_empty()
    });
    assert_eq!(state_of(&env, "q"), "lingering");
}

#[test]
fn dead_process_leases_are_swept_at_boot() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/s"]);
    let m = env.mount_with(&["--linger", "30"]);
    let mut holder = sh(&format!(
        "cd '{}' && cat README.md && sleep 30",
        m.wt("repo", "s").display()
    ));
    wait_until("a lease", Duration::from_secs(5), || {
        !process_leases(&env, "s").is_empty()
    });
    // The daemon dies with the lease recorded; the holder dies while no daemon watches.
    m.kill9();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(process_leases(&env, "s").len(), 1);
    let _m = env.mount_with(&["--linger", "30"]);
    assert!(
        process_leases(&env, "s").is_empty(),
        "the dead holder's lease was swept"
    );
    assert!(wtfs_ok(&env.state(), &["events"]).contains("swept"));
}

#[test]
fn fifty_processes_entering_and_leaving_at_once_leave_no_lease_behind() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/many"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "many");
    let children: Vec<_> = (0..50)
        .map(|i| {
            sh(&format!(
                "cd '{}' && cat README.md > /dev/null && ls src > /dev/null; exit {}",
                wt.display(),
                i % 2
            ))
        })
        .collect();
    for mut c in children {
        c.wait().unwrap();
    }
    wait_until("every lease released", Duration::from_secs(5), || {
        process_leases(&env, "many").is_empty()
    });
    let events = wtfs_ok(&env.state(), &["events", "--json", "--last", "1000"]);
    // Per holder, every acquire is matched by one release (a lease that passed on counts as
    // released by its old holder); and no lease row is left.
    let mut balance: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for line in events.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let holder = e["holder"].as_str().unwrap_or("").to_string();
        match e["kind"].as_str().unwrap() {
            "acquired" => {
                let b = balance.entry(holder).or_default();
                *b += 1;
                assert_eq!(*b, 1, "a holder acquired a lease it already held");
            }
            "released" | "passed" => *balance.entry(holder).or_default() -= 1,
            _ => {}
        }
    }
    assert!(balance.values().all(|b| *b == 0), "{balance:?}");
    let acquired: Vec<&String> = balance.keys().collect();
    assert!(!acquired.is_empty());
}

#[test]
fn run_holds_a_lease_for_the_commands_lifetime_and_passes_its_status() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/r"]);
    let m = env.mount_with(&["--linger", "30"]);
    // The command runs inside the worktree, sees its session's lease, and its status comes back.
    let leases = m.mountpoint.join(".control/leases");
    let script = format!(
        "test -f README.md && ls '{}' | grep -q 'repo:r@session:job-1' && exit 7",
        leases.display()
    );
    let out = wtfs(
        &env.state(),
        &[
            "run",
            "repo/r",
            "--session",
            "job-1",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Afterwards: no session lease, and the run process's own lease goes with it.
    wait_until("run's leases released", Duration::from_secs(3), || {
        let json: serde_json::Value =
            serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
        json.as_array().unwrap().is_empty()
    });
    assert_eq!(state_of(&env, "r"), "lingering");
    let ok = wtfs(&env.state(), &["run", "repo/r", "--", "true"]);
    assert!(ok.status.success());
    wait_until(
        "the second run's lease released",
        Duration::from_secs(3),
        || process_leases(&env, "r").is_empty(),
    );
    let missing = wtfs(&env.state(), &["run", "repo/none", "--", "true"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));
    let status = fs::read_to_string(m.mountpoint.join(".control/status")).unwrap();
    assert!(
        status.contains("LEASES") && status.contains("lingering"),
        "{status}"
    );
}

/// A process whose only hold on a worktree is a shared writable mapping of a file there
/// (its descriptor closed, its working directory elsewhere, no request the daemon sees)
/// is inside: when the holder that opened the file exits, the lease passes to it, and its
/// stores are the worktree's work, not lost to a removal under it.
#[test]
fn a_process_writing_through_a_shared_mapping_holds_the_worktree() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/mm"]);
    let m = env.mount_with(&["--linger", "1"]);
    let file = m.wt("repo", "mm").join("README.md");
    let go = env.dir.path().join("go");
    // The opener maps the file, closes it, leaves, forks the writer and exits.
    let script = format!(
        r#"
import ctypes, os, sys, time
# libc's mmap itself: Python's mmap module keeps a descriptor of its own open.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open("{file}", os.O_RDWR)
size = os.fstat(fd).st_size
addr = libc.mmap(None, size, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)
os.chdir("/")
pid = os.fork()
if pid == 0:
    os.close(1)
    os.close(2)
    while not os.path.exists("{go}"):
        time.sleep(0.05)
    ctypes.memmove(addr, b"X", 1)
    libc.msync(ctypes.c_void_p(addr), ctypes.c_size_t(size), 4)  # MS_SYNC
    os._exit(0)
print(pid, flush=True)
"#,
        file = file.display(),
        go = go.display()
    );
    let out = run("python3", &["-c", &script], Path::new("/"));
    assert!(out.status.success(), "{out:?}");
    let writer: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // Past the opener's exit and the linger: a worktree thought empty would be gone.
    std::thread::sleep(Duration::from_secs(3));
    let held = state_of(&env, "mm");
    let leases = wtfs_ok(&env.state(), &["leases"]);
    fs::write(&go, b"").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    // Alive until it is gone or a zombie (whoever adopted it may be slow to reap).
    let alive = || {
        fs::read_to_string(format!("/proc/{writer}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| !r.trim_start().starts_with('Z'))
            })
            .unwrap_or(false)
    };
    while alive() {
        if Instant::now() > end {
            // SAFETY: ends the writer this test started, by pid.
            unsafe { libc::kill(writer, libc::SIGKILL) };
            panic!("the writer did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        held, "active",
        "the mapping's process holds no lease: {leases}"
    );
    assert!(leases.contains(&format!("pid:{writer}:")), "{leases}");
    wait_for_state(&env, "mm", "retained", Duration::from_secs(15));
    let retained = wtfs_ok(&env.state(), &["retained"]);
    assert!(retained.contains("modified README.md"), "{retained}");
    m.unmount();
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Sessions racing for one exclusive lease: exactly one wins, each loser is refused
/// (exit 3) naming the winner, since when and the ways out; while it is held every other
/// session is refused, exclusive or not; `--wait` waits for the holder to go, and says
/// how long it waited when it does not.
#[test]
fn sessions_racing_for_an_exclusive_lease_exactly_one_wins_and_losers_name_it() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/x"]);
    let _m = env.mount_with(&["--linger", "30"]);
    let racers: Vec<_> = (0..4)
        .map(|i| {
            let state = env.state();
            std::thread::spawn(move || {
                let s = format!("racer-{i}");
                let o = wtfs(
                    &state,
                    &[
                        "lease",
                        "acquire",
                        "repo/x",
                        "--session",
                        &s,
                        "--exclusive",
                        "--json",
                    ],
                );
                (s, o)
            })
        })
        .collect();
    let outs: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    let winners: Vec<&String> = outs
        .iter()
        .filter(|(_, o)| o.status.success())
        .map(|(s, _)| s)
        .collect();
    assert_eq!(winners.len(), 1, "{outs:?}");
    let winner = winners[0].clone();
    // The winner's outcome is the worktree object every command gives, plus the lease.
    let won = &outs.iter().find(|(s, _)| *s == winner).unwrap().1;
    let json: serde_json::Value = serde_json::from_slice(&won.stdout).unwrap();
    let listed: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    let row = &listed[0];
    assert_eq!(json["worktree"], "repo/x");
    for key in ["repo", "name", "path", "state", "branch", "base_commit"] {
        assert_eq!(json[key], row[key], "{key}: {json:#} vs {row:#}");
    }
    assert!(json.get("warm_snapshot").is_some(), "{json:#}");
    for key in ["created_at", "state_changed_at", "acquired_at"] {
        assert!(json[key].as_str().unwrap().contains('T'), "{key}: {json:#}");
    }
    assert_eq!(json["session"], winner.as_str());
    assert_eq!(json["exclusive"], true);
    assert_eq!(json["new"], true);
    for (s, o) in outs.iter().filter(|(s, _)| *s != winner) {
        assert_eq!(o.status.code(), Some(3), "{s}: {}", stderr(o));
        let msg = stderr(o);
        assert!(msg.contains(&format!("session {winner}")), "{msg}");
        assert!(
            msg.contains("since ") && msg.contains("last active "),
            "{msg}"
        );
        assert!(
            msg.contains("worktreefs new repo/<name>")
                && msg.contains(&format!(
                    "worktreefs lease release repo/x --session {winner}"
                ))
                && msg.contains("--wait SECS"),
            "{msg}"
        );
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(json["error"], "occupied");
        assert_eq!(json["holders"][0]["session"], winner.as_str());
        assert!(json["holders"][0]["acquired_at"]
            .as_str()
            .unwrap()
            .contains('T'));
    }
    let leases: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    assert_eq!(leases.as_array().unwrap().len(), 1, "{leases}");
    assert_eq!(leases[0]["exclusive"], true);
    // Held exclusively: a plain acquisition is refused too.
    let o = wtfs(
        &env.state(),
        &["lease", "acquire", "repo/x", "--session", "late"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("exclusively"), "{}", stderr(&o));
    // --wait: the holder goes after a second, and the waiter gets it.
    let state = env.state();
    let w = winner.clone();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1000));
        wtfs_ok(&state, &["lease", "release", "repo/x", "--session", &w]);
    });
    let t = Instant::now();
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "acquire",
            "repo/x",
            "--session",
            "late",
            "--wait",
            "20",
        ],
    );
    release.join().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // Not exclusive: an exclusive ask waits a second and is refused, saying so.
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "acquire",
            "repo/x",
            "--session",
            "y",
            "--exclusive",
            "--wait",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("session late") && stderr(&o).contains("waited 1 s"),
        "{}",
        stderr(&o)
    );
    // A removed or deleting worktree, or an unknown one: the typed conflict.
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "acquire",
            "repo/none",
            "--session",
            "y",
            "--exclusive",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(3));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["error"], "not-found");
}

/// A process inside refuses an exclusive lease (named by pid and command), unless it is
/// the asker's own ancestor (`cd wt && worktreefs … --exclusive`). `run --exclusive`
/// holds the worktree exclusively for its command's lifetime: its own children may still
/// take leases, others are refused, and the lease ends with the run.
#[test]
fn an_exclusive_lease_is_refused_for_a_process_inside_but_not_for_the_askers_own_shell() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/e"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "e");
    // A shell inside, active again two seconds after it came in.
    let mut inside = sh(&format!(
        "cd '{}' && cat README.md && sleep 2 && cat README.md && exec sleep 30",
        wt.display()
    ));
    let pid = inside.id() as i64;
    wait_until("the shell's lease", Duration::from_secs(5), || {
        process_leases(&env, "e").iter().any(|(p, _)| *p == pid)
    });
    wait_until("its command now", Duration::from_secs(10), || {
        fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.starts_with("sleep\u{0}30"))
    });
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "acquire",
            "repo/e",
            "--session",
            "s",
            "--exclusive",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("pid {pid} (sleep 30)")),
        "named with its command now: {}",
        stderr(&o)
    );
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let h = &json["holders"][0];
    assert_eq!(h["pid"], pid, "{json}");
    assert!(
        h["last_active_at"].as_str().unwrap() > h["acquired_at"].as_str().unwrap(),
        "the second read is its last activity: {json}"
    );
    let _ = inside.kill();
    inside.wait().unwrap();
    wait_until(
        "the sleeper's lease released",
        Duration::from_secs(3),
        || process_leases(&env, "e").is_empty(),
    );
    // The asker's own shell inside is not somebody else.
    let script = format!(
        "cd '{}' && cat README.md >/dev/null && {BIN} --state-dir '{}' lease acquire repo/e --session own --exclusive",
        wt.display(),
        env.state().display()
    );
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/e", "--session", "own"],
    );
    // run --exclusive from a shell inside: its child takes a lease, an outsider cannot,
    // and once it ends the outsider can.
    let marker = env.state().join("inside-run");
    let script = format!(
        "cd '{wt}' && cat README.md >/dev/null && {BIN} --state-dir '{st}' run repo/e --exclusive -- sh -c '{BIN} --state-dir {st} lease acquire repo/e --session child && {BIN} --state-dir {st} lease release repo/e --session child && touch {mk} && sleep 2'",
        wt = wt.display(),
        st = env.state().display(),
        mk = marker.display()
    );
    let mut run = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "the run's child took its lease",
        Duration::from_secs(10),
        || marker.exists(),
    );
    let o = wtfs(
        &env.state(),
        &["lease", "acquire", "repo/e", "--session", "out"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("exclusive"), "{}", stderr(&o));
    let status = run.wait().unwrap();
    assert!(status.success(), "the run failed");
    wait_until(
        "the run's exclusive lease ended",
        Duration::from_secs(3),
        || {
            wtfs(
                &env.state(),
                &["lease", "acquire", "repo/e", "--session", "out"],
            )
            .status
            .success()
        },
    );
}

/// Two `run --exclusive` at once, neither inside: one runs, the other waits for it
/// (`--wait`) and runs after; neither holds anything while it waits, so they never lock
/// each other out. A plain lease a run made exclusive is plain again after it.
#[test]
fn two_exclusive_runs_at_once_take_turns() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let _m = env.mount_with(&["--linger", "30"]);
    let log = env.state().join("turns.log");
    let script = format!(
        "echo start >> '{l}'; sleep 1; echo end >> '{l}'",
        l = log.display()
    );
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (state, script) = (env.state(), script.clone());
            std::thread::spawn(move || {
                wtfs(
                    &state,
                    &[
                        "run",
                        "repo/t",
                        "--exclusive",
                        "--wait",
                        "20",
                        "--",
                        "sh",
                        "-c",
                        &script,
                    ],
                )
            })
        })
        .collect();
    for r in runs {
        let o = r.join().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        "start\nend\nstart\nend\n",
        "one after the other"
    );
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/t", "--session", "s"],
    );
    let o = wtfs(
        &env.state(),
        &[
            "run",
            "repo/t",
            "--session",
            "s",
            "--exclusive",
            "--",
            "true",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let leases: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    let s = leases
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["session"] == "s")
        .expect("the session keeps its lease");
    assert_eq!(s["exclusive"], false, "{leases}");
}

/// The holder's reason (`lease release --reason`): kept with the release event and shown
/// with the retained entry next to the inspection's reason, in `retained` and
/// `.control/retained`. A release by a session that holds nothing says so and changes
/// nothing; a bad reason is refused before anything changes.
#[test]
fn a_release_reason_is_shown_with_the_retained_entry() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount_with(&["--linger", "1"]);
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "s1"],
    );
    // Written by a process that then exits (this one would keep a lease).
    run_ok("sh", &["-c", "echo work > unsaved.txt"], &m.wt("repo", "w"));
    // Bad input first: nothing changes.
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "release",
            "repo/w",
            "--session",
            "s1",
            "--reason",
            "",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "release",
            "repo/w",
            "--session",
            "s1",
            "--reason",
            "a\nb",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("reason"), "{}", stderr(&o));
    let o = wtfs(
        &env.state(),
        &[
            "lease",
            "release",
            "repo/w",
            "--session",
            "nobody",
            "--reason",
            "x",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds no lease"), "{}", stderr(&o));
    assert_eq!(state_of(&env, "w"), "active");
    wtfs_ok(
        &env.state(),
        &[
            "lease",
            "release",
            "repo/w",
            "--session",
            "s1",
            "--reason",
            "force-killed",
        ],
    );
    wait_for_state(&env, "w", "retained", Duration::from_secs(15));
    let table = wtfs_ok(&env.state(), &["retained"]);
    assert!(table.contains("force-killed"), "{table}");
    assert!(table.contains("unsaved.txt"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["retained", "--json"])).unwrap();
    assert_eq!(
        json[0]["holder_reason"], "session s1: force-killed",
        "{json}"
    );
    let entry: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/retained/repo:w")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        entry["holder_reason"], "session s1: force-killed",
        "{entry}"
    );
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(events.contains("force-killed"), "{events}");
    // A new session's lease starts afresh: its plain release leaves no old reason.
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "s2"],
    );
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/w", "--session", "s2"],
    );
    wait_for_state(&env, "w", "retained", Duration::from_secs(15));
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["retained", "--json"])).unwrap();
    assert_eq!(json[0]["holder_reason"], serde_json::Value::Null, "{json}");
    drop(m);
}

/// Last close: a long-lived shell that `cd`s into a worktree holds a lease
/// while it is there, also while idle, and loses it within two seconds of `cd`ing out
/// (it does not exit); the worktree is then cleaned up after its grace period. A child
/// it left inside keeps the lease while it lives.
#[test]
fn a_shell_that_leaves_a_worktree_lets_go_within_two_seconds() {
    use std::io::Write as _;
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    wtfs_ok(&env.state(), &["new", "repo/v"]);
    let m = env.mount_with(&["--linger", "1"]);
    let mut sh = std::process::Command::new("sh")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = sh.id();
    let mut input = sh.stdin.take().unwrap();
    let holds = |name: &str| {
        wtfs_ok(&env.state(), &["leases"])
            .lines()
            .any(|l| l.contains(&format!("repo:{name}@pid:{pid}:")))
    };
    let wt = m.wt("repo", "w");
    writeln!(input, "cd '{}' && ls > /dev/null", wt.display()).unwrap();
    wait_until("the shell holds a lease", Duration::from_secs(10), || {
        holds("w")
    });
    // Idle inside: kept.
    std::thread::sleep(Duration::from_secs(3));
    assert!(holds("w"), "an idle shell inside keeps its lease");
    assert_eq!(state_of(&env, "w"), "active");
    // A child left running inside, the shell gone out: kept while the child lives.
    writeln!(input, "sleep 4 & cd /").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(holds("w"), "its child is still inside");
    // The child ends: let go within two seconds (the shell lives on).
    let gone = Instant::now();
    wait_until("the lease goes", Duration::from_secs(6), || !holds("w"));
    eprintln!("let go {:?} after the child's end was due", gone.elapsed());
    assert!(
        sh.try_wait().unwrap().is_none(),
        "the shell is still running"
    );
    wait_for_state(&env, "w", "removed", Duration::from_secs(15));
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(
        events.contains("left (nothing of its process tree is inside)"),
        "{events}"
    );
    // And straight out, no child: within two seconds.
    writeln!(
        input,
        "cd '{}' && ls > /dev/null",
        m.wt("repo", "v").display()
    )
    .unwrap();
    wait_until("the shell holds v", Duration::from_secs(10), || holds("v"));
    writeln!(input, "cd /").unwrap();
    let t = Instant::now();
    wait_until("the lease on v goes", Duration::from_secs(5), || {
        !holds("v")
    });
    assert!(
        t.elapsed() < Duration::from_millis(2600),
        "{:?}",
        t.elapsed()
    );
    drop(input);
    let _ = sh.wait();
    drop(m);
}

/// `--json` outcomes: `new`, `new --from`, `lease release`, `reclaim`
/// print the worktree, its path and state, and what happened or why not, with RFC 3339
/// times; a refusal is JSON too, with the same exit code as without.
#[test]
fn new_release_and_reclaim_say_what_happened_as_json() {
    let env = Env::new();
    let m = env.mount();
    let parse = |o: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
    };
    let o = wtfs(&env.state(), &["new", "repo/j", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse(&o);
    assert_eq!(v["worktree"], "repo/j");
    assert_eq!(v["state"], "ready");
    assert_eq!(v["branch"], "j");
    assert_eq!(
        v["path"].as_str().unwrap(),
        m.wt("repo", "j").to_str().unwrap()
    );
    let at = v["created_at"].as_str().unwrap();
    assert!(
        at.len() == 25 && at.as_bytes()[10] == b'T' && (at.contains('+') || at.contains('-')),
        "RFC 3339 with an offset: {at}"
    );
    run_ok("sh", &["-c", "echo work > w.txt"], &m.wt("repo", "j"));
    let o = wtfs(&env.state(), &["new", "repo/k", "--from", "j", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse(&o);
    assert_eq!(v["forked_from"], "repo/j");
    assert!(v["copied"]["files"].as_u64().unwrap() >= 1, "{v}");
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/j", "--session", "s"],
    );
    let o = wtfs(
        &env.state(),
        &["lease", "release", "repo/j", "--session", "s", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse(&o);
    assert_eq!(v["session"], "s");
    assert_eq!(v["turn_ended"], false);
    let o = wtfs(
        &env.state(),
        &["lease", "release", "repo/j", "--session", "s", "--json"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(parse(&o)["error"], "not-held");
    // Reclaim: one holding work stays (and says why), a clean one goes.
    let o = wtfs(&env.state(), &["reclaim", "repo/k", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = parse(&o);
    assert_eq!(v["outcome"], "holds-work", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("w.txt"), "{v}");
    wtfs_ok(&env.state(), &["new", "repo/clean"]);
    let o = wtfs(&env.state(), &["reclaim", "repo/clean", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse(&o);
    assert_eq!(v["outcome"], "removed", "{v}");
    assert_eq!(v["state"], "removed", "{v}");
    let o = wtfs(&env.state(), &["reclaim", "repo/clean", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(parse(&o)["error"], "removed");
    assert_eq!(parse(&o)["outcome"], "already-removed");
    drop(m);
}

/// Last close lets go only of an idle holder: a shell outside the worktree that writes
/// into it through absolute paths, a request every 100 ms, keeps its one lease throughout.
#[test]
fn a_holder_at_work_through_absolute_paths_keeps_its_lease() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/w"]);
    let m = env.mount_with(&["--linger", "30"]);
    let wt = m.wt("repo", "w");
    let script = format!(
        "for i in $(seq 1 35); do echo $i > '{}/f'$i; sleep 0.1; done",
        wt.display()
    );
    run_ok("sh", &["-c", &script], Path::new("/"));
    let events = squeezed(&wtfs_ok(&env.state(), &["events"]));
    let acquired = events
        .lines()
        .filter(|l| l.contains(" acquired ") && l.contains("repo/w pid:"))
        .count();
    assert_eq!(acquired, 1, "one lease for the whole loop: {events}");
    assert!(!events.contains("left (nothing"), "{events}");
    drop(m);
}
