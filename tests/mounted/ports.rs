//! A block of ports per worktree: unique across state directories, never one someone
//! listens on, given to what `run` starts, kept across a remount, free again at removal
//! and asked back by a restore. Mounted, real git.

use std::path::Path;

use crate::common::*;

fn env_of(state: &Path, wt: &str) -> serde_json::Value {
    serde_json::from_str(&wtfs_ok(state, &["env", wt, "--json"])).unwrap()
}

fn block(v: &serde_json::Value) -> Option<(u64, u64)> {
    Some((v["port"].as_u64()?, v["ports"].as_u64()?))
}

#[test]
fn each_worktree_gets_ports_no_other_has_and_what_runs_inside_is_told() {
    // A range of four blocks of 10 around a port someone listens on; a long grace
    // period, so what `run` leased is not cleaned up under the test.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = listener.local_addr().unwrap().port();
    let low = busy - busy % 10;
    let range = format!("{low}-{}", low + 39);
    let a = Env::new();
    let b = Env::new();
    let ma = a.mount_with(&["--ports", &range, "--port-block", "10", "--linger", "600"]);
    let mb = b.mount_with(&["--ports", &range, "--port-block", "10"]);
    wtfs_ok(&a.state(), &["new", "repo/one"]);
    wtfs_ok(&a.state(), &["new", "repo/two"]);
    wtfs_ok(&b.state(), &["new", "repo/three"]);
    let blocks: Vec<(u64, u64)> = [
        env_of(&a.state(), "repo/one"),
        env_of(&a.state(), "repo/two"),
        env_of(&b.state(), "repo/three"),
    ]
    .iter()
    .map(|v| block(v).unwrap_or_else(|| panic!("no ports: {v}")))
    .collect();
    for (i, (first, size)) in blocks.iter().enumerate() {
        assert_eq!(*size, 10);
        assert!(
            (low as u64..=low as u64 + 30).contains(first),
            "{first} outside {range}"
        );
        assert!(
            !(*first..first + size).contains(&(busy as u64)),
            "a port someone listens on was given: {blocks:?}"
        );
        for (j, (other, _)) in blocks.iter().enumerate() {
            assert!(i == j || first != other, "one block twice: {blocks:?}");
        }
    }
    // Every block taken: a worktree is made all the same, without ports.
    wtfs_ok(&a.state(), &["new", "repo/none"]);
    assert_eq!(block(&env_of(&a.state(), "repo/none")), None);

    // What runs inside is told, and the export lines source as they are.
    let one = env_of(&a.state(), "repo/one");
    let out = wtfs_ok(
        &a.state(),
        &[
            "run",
            "repo/one",
            "--",
            "sh",
            "-c",
            "echo $WORKTREEFS_PORT $WORKTREEFS_PORTS $WORKTREEFS_WORKTREE $WORKTREEFS_PATH $WORKTREEFS_SOURCE",
        ],
    );
    assert_eq!(
        out.trim(),
        format!(
            "{} 10 repo/one {} {}",
            one["port"],
            ma.wt("repo", "one").display(),
            a.repo.path().display()
        )
    );
    let lines = wtfs_ok(&a.state(), &["env", "repo/one"]);
    // Anyone inside reads the same lines through .control.
    let control = ma.mountpoint.join(".control/env");
    let listed: Vec<String> = std::fs::read_dir(&control)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(listed.contains(&"repo:one".to_string()), "{listed:?}");
    assert_eq!(
        std::fs::read_to_string(control.join("repo:one")).unwrap(),
        lines
    );
    let sourced = std::process::Command::new("bash")
        .args(["-c", &format!("{lines}\necho $WORKTREEFS_PORT")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sourced.stdout).trim(),
        one["port"].to_string(),
        "{lines}"
    );

    // Kept across a restart (an unmount that keeps named leases' worktrees).
    wtfs_ok(
        &a.state(),
        &["lease", "acquire", "repo/one", "--session", "s1"],
    );
    wtfs_ok(&a.state(), &["unmount", "--keep-sessions"]);
    ma.unmount();
    let ma = a.mount_with(&["--ports", &range, "--port-block", "10", "--linger", "600"]);
    assert_eq!(env_of(&a.state(), "repo/one"), one);

    // Free again at removal: the next worktree gets it; a restore asks for its own back.
    let two = block(&env_of(&a.state(), "repo/two")).unwrap();
    wtfs_ok(&a.state(), &["reclaim", "repo/two"]);
    wtfs_ok(&a.state(), &["new", "repo/four"]);
    assert_eq!(block(&env_of(&a.state(), "repo/four")), Some(two));
    wtfs_ok(&a.state(), &["reclaim", "repo/four"]);
    let restored: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&a.state(), &["restore", "repo/two", "--json"])).unwrap();
    assert!(
        restored["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("the block it had")),
        "{restored}"
    );
    assert_eq!(block(&env_of(&a.state(), "repo/two")), Some(two));
    drop(listener);
    ma.unmount();
    mb.unmount();
}
