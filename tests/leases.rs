//! Named leases and the lifecycle they drive, through the CLI and `.control`, with a real
//! daemon.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::*;

fn state_of(env: &Env, name: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .map(|w| w["state"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

fn wait_for_state(env: &Env, name: &str, want: &str, limit: Duration) {
    let end = Instant::now() + limit;
    while state_of(env, name) != want {
        assert!(
            Instant::now() < end,
            "{name} did not become {want} within {limit:?} (is {})",
            state_of(env, name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
        assert_eq!(json["holder_kind"], "session");
        assert_eq!(json["session"], "s1");
        assert!(json["acquired_at"].as_i64().unwrap() > 0);
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
    // Entered while held: the kernel caches the worktree's entry, and must forget it when
    // the worktree starts deleting.
    assert!(fs::metadata(m.wt("repo", "w").join("README.md")).is_ok());
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/w", "--session", "s2"],
    );
    assert_eq!(state_of(&env, "w"), "lingering");
    wait_for_state(&env, "w", "deleting", Duration::from_secs(4));
    // A deleting worktree is refused: a typed conflict on the CLI, EBUSY from the mount.
    let out = wtfs(
        &env.state(),
        &["lease", "acquire", "repo/w", "--session", "s3"],
    );
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("is deleting"), "{msg}");
    let err = fs::metadata(m.wt("repo", "w").join("README.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    // Every step is an event.
    let events = wtfs_ok(&env.state(), &["events", "--json"]);
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "created",
            "acquired",
            "acquired",
            "released",
            "released",
            "lingering",
            "deleting"
        ]
    );
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
            &["lease", "acquire", "repo/w", "--session", "bad id"],
            "session id 'bad id' contains",
        ),
        (
            &["lease", "release", "repo/w", "--session", "s"],
            "holds no lease on repo/w",
        ),
        (
            &["lease", "acquire", "nowhere", "--session", "s"],
            "is not REPO/NAME",
        ),
    ];
    for (args, want) in cases {
        let out = wtfs(&env.state(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains(want), "{args:?}: {msg}");
    }
    assert_eq!(state_of(&env, "w"), "ready");
    assert!(wtfs_ok(&env.state(), &["leases", "--json"]).trim() == "[]");
}
