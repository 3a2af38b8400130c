//! `worktreefs doctor` and `worktreefs du`: checks that name what to
//! do, a hung daemon that fails its check within the time limit, a dead mount found, and
//! disk use counted per worktree without ever walking the mount. Mounted, real git.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

fn doctor(state: &Path) -> (Option<i32>, Vec<serde_json::Value>) {
    let o = wtfs(state, &["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code(), v.as_array().unwrap().clone())
}

/// Doctor passed, all but `stale-mounts` over mounts of other tests: that check looks at
/// the whole machine, where a test running alongside may have just killed its daemon
/// (the kill -9 tests), its mount stale until that test unmounts it. `ours` is this
/// test's mountpoint, never to be among them.
fn passed(code: Option<i32>, checks: &[serde_json::Value], ours: &Path) -> bool {
    let failed: Vec<&serde_json::Value> = checks.iter().filter(|c| c["status"] == "fail").collect();
    let others_stale = failed.iter().all(|c| {
        c["check"] == "stale-mounts"
            && !c["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(&*ours.to_string_lossy())
    });
    others_stale && (code == Some(0)) == failed.is_empty()
}

fn find<'a>(checks: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
}

#[test]
fn doctor_checks_the_machine_the_daemon_and_each_repository() {
    // No state dir yet: fine, and doctor makes none.
    let empty = tempfile::tempdir().unwrap();
    let none = empty.path().join("state");
    let (code, checks) = doctor(&none);
    assert!(passed(code, &checks, &none), "{checks:?}");
    assert!(find(&checks, "state-dir")["detail"]
        .as_str()
        .unwrap()
        .contains("does not exist yet"));
    assert!(!none.exists(), "doctor made the state dir");
    assert_eq!(find(&checks, "fuse-device")["status"], "ok", "{checks:?}");
    assert!(find(&checks, "kernel")["detail"]
        .as_str()
        .unwrap()
        .contains("FUSE over io_uring"));

    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let (code, checks) = doctor(&env.state());
    assert!(passed(code, &checks, &env.mountpoint()), "{checks:?}");
    let d = find(&checks, "daemon");
    assert_eq!(d["status"], "ok", "{d}");
    assert!(d["detail"].as_str().unwrap().contains("answers"), "{d}");
    assert!(
        d["detail"].as_str().unwrap().contains(&m.pid().to_string()),
        "{d}"
    );
    assert_eq!(find(&checks, "repo repo")["status"], "ok", "{checks:?}");
    assert_eq!(find(&checks, "state-dir")["status"], "ok", "{checks:?}");
    // The table: one line per check, what to do under a failing one.
    let text = String::from_utf8_lossy(&wtfs(&env.state(), &["doctor"]).stdout).into_owned();
    assert!(text.lines().any(|l| l.starts_with("ok   daemon")), "{text}");

    // Bad settings are named with the way out.
    fs::set_permissions(env.state(), fs::Permissions::from_mode(0o755)).unwrap();
    let gitdir = env.repo.path().join(".git");
    git(
        &env.repo.path(),
        &[
            "config",
            "--remove-section",
            &format!("includeIf.gitdir:{}/worktrees/wtfs-*", gitdir.display()),
        ],
    );
    let (code, checks) = doctor(&env.state());
    assert!(
        passed(code, &checks, &env.mountpoint()),
        "warnings are not failures: {checks:?}"
    );
    let s = find(&checks, "state-dir");
    assert_eq!(s["status"], "warn", "{s}");
    assert!(s["fix"].as_str().unwrap().contains("chmod 700"), "{s}");
    let r = find(&checks, "repo repo");
    assert_eq!(r["status"], "warn", "{r}");
    assert!(r["fix"].as_str().unwrap().contains("mount again"), "{r}");
    fs::set_permissions(env.state(), fs::Permissions::from_mode(0o700)).unwrap();

    // A daemon that hangs fails its check within the limit; doctor does not hang.
    let pid = nix::unistd::Pid::from_raw(m.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    let (code, checks) = doctor(&env.state());
    let took = started.elapsed();
    // `mount` over it (inside its repository, as a newcomer would) says it is stopped and
    // how to go on, and exits: it does not hang, nor say the daemon serves.
    let started = Instant::now();
    let mounted = std::process::Command::new("timeout")
        .args([
            "60",
            BIN,
            "--state-dir",
            env.state().to_str().unwrap(),
            "mount",
        ])
        .current_dir(env.repo.path())
        .output()
        .unwrap();
    let mount_took = started.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let said = String::from_utf8_lossy(&mounted.stderr);
    assert_eq!(mounted.status.code(), Some(1), "{said}");
    assert!(
        said.contains("is stopped") && said.contains(&format!("kill -CONT {}", m.pid())),
        "{said}"
    );
    assert!(
        mount_took < Duration::from_secs(30),
        "mount took {mount_took:?}"
    );
    assert_eq!(code, Some(1), "{checks:?}");
    let d = find(&checks, "daemon");
    assert_eq!(d["status"], "fail", "{d}");
    assert!(
        d["detail"].as_str().unwrap().contains("has not answered"),
        "{d}"
    );
    assert!(took < Duration::from_secs(30), "doctor took {took:?}");

    // A daemon killed: its mount is found dead, with the way out.
    let mountpoint = m.mountpoint.clone();
    m.kill9();
    let (code, checks) = doctor(&env.state());
    assert_eq!(code, Some(1), "{checks:?}");
    let s = find(&checks, "stale-mounts");
    assert_eq!(s["status"], "fail", "{s}");
    assert!(
        s["detail"]
            .as_str()
            .unwrap()
            .contains(mountpoint.to_str().unwrap()),
        "{s}"
    );
    assert!(
        s["fix"].as_str().unwrap().contains("worktreefs unmount"),
        "{s}"
    );
    let o = wtfs(&env.state(), &["unmount"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn du_counts_each_worktree_and_never_walks_the_mount() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/big"]);
    wtfs_ok(&env.state(), &["new", "repo/small"]);
    // The mountpoint inside the state directory, as the default one is.
    let m = Mounted::start(&env.state(), &env.state().join("mnt"));
    // Written and synced, so no write-back reaches the daemon while it is measured.
    for (wt, name, len) in [("big", "data.bin", 3usize << 20), ("small", "note.txt", 1)] {
        let mut f = fs::File::create(m.wt("repo", wt).join(name)).unwrap();
        std::io::Write::write_all(&mut f, &vec![7u8; len]).unwrap();
        f.sync_all().unwrap();
    }
    // Reading the counters costs requests of its own, more when the kernel's cached
    // entries for them expired meanwhile: du's interval is compared with an idle one at
    // least as long, read the same way, with a slack of two requests of a kind (the
    // kernel's own revalidations, seen once under load: 4 getattrs against 3). A walk of
    // the mount costs tens (a `find` during du: 44 getattrs against 3).
    let before = m.stats();
    let started = Instant::now();
    let v: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["du", "--json"])).unwrap();
    let took = started.elapsed();
    let after = m.stats();
    std::thread::sleep(took + Duration::from_millis(100));
    let idle = m.stats();
    let delta = |k: &str, a: &serde_json::Value, b: &serde_json::Value| {
        b[k].as_u64().unwrap() - a[k].as_u64().unwrap()
    };
    let of = |name: &str| {
        v["worktrees"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["worktree"] == name)
            .unwrap_or_else(|| panic!("{name}: {v:#}"))
            .clone()
    };
    let big = of("repo/big");
    assert!(big["apparent_bytes"].as_u64().unwrap() >= 3 << 20, "{big}");
    assert!(big["bytes"].as_u64().unwrap() >= 3 << 20, "{big}");
    let small = of("repo/small");
    assert!(small["bytes"].as_u64().unwrap() < 1 << 20, "{small}");
    // The total counts the upper layer once, and not the mount (which shows every
    // worktree's base files on top): the base tree's contents were never read.
    let total = v["total"]["apparent_bytes"].as_u64().unwrap();
    assert!((3 << 20..(3 << 20) + (64 << 20)).contains(&total), "{v:#}");
    for k in ["lookups", "getattrs", "opendirs", "readdirs"] {
        assert!(
            delta(k, &before, &after) <= delta(k, &after, &idle) + 2,
            "du looked into the mount ({k}: {} while du ran {took:?}, {} idle as long)",
            delta(k, &before, &after),
            delta(k, &after, &idle)
        );
    }
    // One worktree: by name, by a path inside it, or from inside it.
    let one: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["du", "repo/big", "--json"])).unwrap();
    assert_eq!(one["worktrees"].as_array().unwrap().len(), 1, "{one:#}");
    let o = run(
        BIN,
        &["--state-dir", env.state().to_str().unwrap(), "du"],
        &m.wt("repo", "small"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("repo/small") && !text.contains("repo/big"),
        "{text}"
    );
    let o = wtfs(&env.state(), &["du", "repo/nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("'repo/nope' is not in use"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The table for people.
    let text = wtfs_ok(&env.state(), &["du"]);
    assert!(
        text.contains("repo/big") && text.contains("3.0 MiB"),
        "{text}"
    );
    assert!(text.contains("the mount is not counted"), "{text}");
    // Its daemon stopped: du still answers (it never asks the mount anything).
    let pid = nix::unistd::Pid::from_raw(m.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let o = std::process::Command::new("timeout")
        .args([
            "20",
            BIN,
            "--state-dir",
            env.state().to_str().unwrap(),
            "du",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        o.status.success(),
        "du with the daemon stopped: {:?} {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    drop(m);
}

/// A branch a worktree was given before names were checked as git checks them (`HEAD`):
/// doctor finds it and says how to rename it; the rename, run as printed, mends it, and
/// the worktree follows its branch (cleanup removes it as clean, not `branch-moved`).
#[test]
fn doctor_finds_a_branch_git_forbids_and_its_rename_is_followed() {
    let env = Env::new();
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/legacy"]);
    // As an older worktreefs made it: its branch is refs/heads/HEAD.
    git(
        &repo,
        &["update-ref", "refs/heads/HEAD", "refs/heads/legacy"],
    );
    let admin = fs::read_dir(repo.join(".git/worktrees"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("wtfs-legacy")
        })
        .unwrap();
    fs::write(admin.join("HEAD"), "ref: refs/heads/HEAD\n").unwrap();
    git(&repo, &["update-ref", "-d", "refs/heads/legacy"]);
    {
        let store = worktreefs::store::Store::open(&env.state()).unwrap();
        let row = store.worktree("repo", "legacy").unwrap().unwrap();
        store.set_worktree_branch(row.id, "HEAD").unwrap();
    }
    let (_, checks) = doctor(&env.state());
    let c = find(&checks, "branch repo/legacy");
    assert_eq!(c["status"], "warn", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("'HEAD'"), "{c}");
    let fix = c["fix"].as_str().unwrap();
    let command = fix
        .split('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no command in {fix}"));
    assert!(command.contains("branch -m HEAD wt-HEAD"), "{command}");
    run_ok("sh", &["-c", command], Path::new("/"));
    // Renamed once more: still followed.
    git(&repo, &["branch", "-m", "wt-HEAD", "legacy-2"]);
    let (_, checks) = doctor(&env.state());
    assert!(
        !checks.iter().any(|c| c["check"] == "branch repo/legacy"),
        "{checks:?}"
    );
    // Cleanup follows the rename: clean, removed.
    let m = env.mount_with(&["--linger", "0"]);
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/legacy", "--session", "s"],
    );
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/legacy", "--session", "s"],
    );
    wait_for_state(&env, "legacy", "removed", Duration::from_secs(20));
    drop(m);
    let head = git(&repo, &["rev-parse", "--abbrev-ref", "HEAD"]);
    assert_eq!(head.trim(), "main");
}
