//! Which transport carries the requests: FUSE over io_uring where the kernel offers it
//! (`--uring auto`, the default), `/dev/fuse` with `--uring off`, and `--uring on`
//! refused before anything is mounted where it cannot be had. The same work gives the
//! same results on both, and `.control/stats` says which one a mount uses.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// Whether this machine's kernel offers io_uring (its fuse module's switch is on).
fn uring_here() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y" || v.trim() == "1")
}

/// Work an agent does: files made, written, renamed, listed, removed; git sees it.
fn work(wt: &Path) -> String {
    run_ok(
        "sh",
        &[
            "-c",
            "set -e
             mkdir -p d/e && for i in 1 2 3 4 5; do echo $i > d/e/f$i; done
             dd if=/dev/urandom of=big bs=64k count=40 status=none
             cp big big2 && cmp big big2
             mv d/e/f1 d/moved && rm d/e/f2 && ln -s moved d/link
             cat d/link d/e/f3
             ls -la d d/e | wc -l
             git add -A && git -c user.email=a@b -c user.name=a commit -qm work
             git status --porcelain | wc -l
             git log --oneline | wc -l
             stat -c %s big",
        ],
        wt,
    )
}

#[test]
fn each_transport_does_the_same_work_and_says_which_it_is() {
    let mut sides = vec![
        ("off", "/dev/fuse"),
        (
            "auto",
            if uring_here() {
                "io_uring"
            } else {
                "/dev/fuse"
            },
        ),
    ];
    if uring_here() {
        sides.push(("on", "io_uring"));
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI turns the kernel's enable_uring on"
        );
    }
    let mut results = Vec::new();
    for (uring, want) in sides {
        let env = Env::new();
        wtfs_ok(&env.state(), &["new", "repo/w"]);
        let m = env.mount_with(&["--uring", uring]);
        let got = m.stats()["transport"].as_str().unwrap_or("").to_string();
        assert_eq!(got, want, "--uring {uring}");
        results.push((uring, work(&m.wt("repo", "w"))));
        drop(m);
    }
    let first = &results[0].1;
    for (uring, r) in &results {
        assert_eq!(r, first, "--uring {uring} did the work otherwise");
    }
}

/// `--uring on` where the kernel will not offer it: refused before anything is mounted,
/// saying how to turn it on. (The switch read is a test's own file: a test must not
/// change the machine's.)
#[test]
fn uring_on_where_the_kernel_has_it_off_is_refused_with_the_way_to_turn_it_on() {
    let env = Env::new();
    let switch = env.dir.path().join("enable_uring");
    std::fs::write(&switch, "N\n").unwrap();
    std::fs::create_dir_all(env.mountpoint()).unwrap();
    let out = Command::new("timeout")
        .args(["60", BIN, "--state-dir"])
        .arg(env.state())
        .arg("mount")
        .arg(env.mountpoint())
        .args(["--uring", "on"])
        .env("WORKTREEFS_URING_SWITCH", &switch)
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{msg}");
    assert!(msg.contains("--uring on"), "{msg}");
    assert!(
        msg.contains(&format!("echo 1 > {}", switch.display())),
        "{msg}"
    );
    assert!(msg.contains("options fuse enable_uring=1"), "{msg}");
    assert!(!is_mounted(&env.mountpoint()), "nothing is mounted");
    // doctor says the same, and which transport a mount would use.
    let out = Command::new(BIN)
        .arg("--state-dir")
        .arg(env.state())
        .args(["doctor", "--json"])
        .env("WORKTREEFS_URING_SWITCH", &switch)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernel = v
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "kernel")
        .unwrap()
        .clone();
    assert!(
        kernel["detail"]
            .as_str()
            .unwrap()
            .contains("through /dev/fuse"),
        "{kernel}"
    );
    assert!(
        kernel["fix"]
            .as_str()
            .unwrap()
            .contains("options fuse enable_uring=1"),
        "{kernel}"
    );
}

/// The CPUs a process may run on, as /proc/PID/status lists them (`Cpus_allowed_list`).
fn cpus_allowed(status: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// A checkout filter that a read of a base file runs (git's smudge, started by the thread
/// that answers the read) may run on every CPU the daemon may: over io_uring that thread
/// is pinned to the caller's CPU, and what it starts must not inherit the pin.
#[test]
fn a_filter_run_for_a_read_may_use_every_cpu() {
    let env = Env::new();
    let repo = env.repo.path();
    let seen = env.dir.path().join("filter-cpus");
    let policies = env.dir.path().join("filter-policies");
    let filter = format!(
        "sh -c 'grep Cpus_allowed_list /proc/self/status >> {}; cut -d\" \" -f41 /proc/$$/stat >> {}; tr a-z A-Z'",
        seen.display(),
        policies.display()
    );
    git(&repo, &["config", "filter.up.smudge", &filter]);
    git(&repo, &["config", "filter.up.clean", "tr A-Z a-z"]);
    std::fs::write(repo.join(".gitattributes"), "*.up filter=up\n").unwrap();
    std::fs::write(repo.join("a.up"), "hello\n").unwrap();
    std::fs::write(repo.join("b.up"), "world\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "filtered"]);
    wtfs_ok(&env.state(), &["new", "repo/f"]);
    let m = env.mount();
    let wt = m.wt("repo", "f");
    for cpu in ["0", "1"] {
        // From each CPU in turn (where there are two), so that each queue serves one.
        let _ = Command::new("taskset")
            .args(["-c", cpu, "cat", "a.up", "b.up"])
            .current_dir(&wt)
            .output();
    }
    assert_eq!(std::fs::read_to_string(wt.join("a.up")).unwrap(), "HELLO\n");
    let ours = cpus_allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    let lists = std::fs::read_to_string(&seen).unwrap_or_default();
    assert!(!lists.is_empty(), "the filter never ran");
    for l in lists.lines() {
        assert_eq!(cpus_allowed(l), ours, "a filter ran on {l:?}; {}", m.log());
    }
    // Nor the policy a queue thread takes while it waits (SCHED_IDLE, 5): a request
    // someone waits for is served at the daemon's own (SCHED_OTHER, 0).
    let policies = std::fs::read_to_string(&policies).unwrap_or_default();
    assert!(!policies.is_empty(), "the filter never ran");
    for p in policies.lines() {
        assert_eq!(p.trim(), "0", "a filter ran with policy {p}; {}", m.log());
    }
    drop(m);
}

/// A thread's scheduling policy (the 41st field of its /proc stat line).
fn policy_in(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(41 - 3)?.parse().ok()
}

/// Over io_uring, each queue thread yields its CPU to the caller it answers: it turns
/// SCHED_IDLE until the next request someone waits for (see fuse/yielding.rs), and none
/// stays so once requests stop.
#[test]
fn queue_threads_yield_and_none_is_left_idle_once_requests_stop() {
    if !uring_here() {
        assert!(std::env::var_os("CI").is_none(), "CI turns enable_uring on");
        eprintln!("io_uring is off in this kernel: nothing to check");
        return;
    }
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/y"]);
    let m = env.mount();
    if m.stats()["transport"] != "io_uring" {
        eprintln!("requests go over /dev/fuse here (--uring off): nothing yields");
        drop(m);
        return;
    }
    if m.stats()["yield_cpu"] != true {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI's daemons yield: {}",
            m.log()
        );
        eprintln!("this daemon cannot yield here: {}", m.log());
        drop(m);
        return;
    }
    let wt = m.wt("repo", "y");
    let tasks = format!("/proc/{}/task", m.pid());
    // The policy (41st field of /proc/PID/task/TID/stat) of each queue thread.
    let queue_policies = || -> Vec<Option<u32>> {
        let mut seen = Vec::new();
        for t in std::fs::read_dir(&tasks).unwrap().flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            if stat.contains("(fuse-q") {
                seen.push(policy_in(&stat));
            }
        }
        seen
    };
    // Requests come from a thread of their own while this one looks at the queue
    // threads, until it has seen one idle (SCHED_IDLE, 5) or 3 s passed.
    let done = std::sync::atomic::AtomicBool::new(false);
    let saw_idle = std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let f = wt.join(format!("f{}", i % 200));
                std::fs::write(&f, "x").unwrap();
                std::fs::read(&f).unwrap();
                i += 1;
            }
        });
        let start = std::time::Instant::now();
        let mut saw = false;
        while !saw && start.elapsed() < Duration::from_secs(3) {
            saw = queue_policies().contains(&Some(5));
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        saw
    });
    assert!(
        saw_idle,
        "no queue thread was seen idle while requests came"
    );
    // Every queue thread has its own policy back soon after (1 ms, and the watchdog's
    // sleep): none is left idle.
    wait_until("no queue thread left idle", Duration::from_secs(2), || {
        queue_policies().iter().all(|p| *p == Some(0))
    });
    drop(m);
}
