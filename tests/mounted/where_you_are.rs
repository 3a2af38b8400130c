//! Where you are: every command that takes REPO/WT also takes a path
//! inside the mount, read as text (the mount is never looked at for it, so the command
//! takes no lease), and with no target means the worktree the current directory is in;
//! `reclaim` always needs one. Mounted, real git.

use std::fs;
use std::path::Path;

use crate::common::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `worktreefs ARGS` run from `cwd`.
fn wtfs_in(state: &Path, cwd: &Path, args: &[&str]) -> std::process::Output {
    let mut full = vec!["--state-dir", state.to_str().unwrap()];
    full.extend_from_slice(args);
    run(BIN, &full, cwd)
}

fn sessions_holding(env: &Env, wt: &str) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    let mut s: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["worktree"] == wt && l["kind"] == "session")
        .map(|l| l["session"].as_str().unwrap().to_string())
        .collect();
    s.sort();
    s
}

#[test]
fn a_path_inside_the_mount_or_the_current_directory_names_the_worktree() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    wtfs_ok(&env.state(), &["new", "repo/u"]);
    let m = env.mount();
    let t = m.wt("repo", "t");
    // A path deep inside, given from outside the mount: resolved as text, so the command
    // itself never enters (no process lease is ever taken for it).
    let deep = t.join("src/lib/x.txt");
    let o = wtfs_in(
        &env.state(),
        Path::new("/"),
        &[
            "lease",
            "acquire",
            deep.to_str().unwrap(),
            "--session",
            "by-path",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(sessions_holding(&env, "repo/t"), ["by-path"]);
    let events = wtfs_ok(&env.state(), &["events", "--json", "--last", "1000"]);
    assert!(
        !events
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|e| e["kind"] == "acquired"
                && e["holder"].as_str().unwrap_or("").starts_with("pid:")),
        "resolving the path entered the mount: {events}"
    );
    // No target, from a subdirectory of the worktree: that worktree.
    let sub = t.join("src/lib");
    let o = wtfs_in(
        &env.state(),
        &sub,
        &["lease", "acquire", "--session", "here"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(sessions_holding(&env, "repo/t"), ["by-path", "here"]);
    // A relative path from inside another worktree.
    let o = wtfs_in(
        &env.state(),
        &sub,
        &[
            "lease",
            "acquire",
            "../../../u",
            "--session",
            "rel",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["worktree"], "repo/u", "{j}");
    // `run` with no target runs in the worktree you are in.
    let o = wtfs_in(
        &env.state(),
        &sub,
        &["run", "--", "git", "rev-parse", "--show-toplevel"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        t.to_str().unwrap()
    );
    // Releases by path and by where you are.
    let o = wtfs_in(
        &env.state(),
        &sub,
        &["lease", "release", "--session", "here"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = wtfs_in(
        &env.state(),
        Path::new("/"),
        &[
            "lease",
            "release",
            t.to_str().unwrap(),
            "--session",
            "by-path",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(sessions_holding(&env, "repo/t").is_empty());
    // Outside every worktree with no target: says where you are and the way out.
    let o = wtfs_in(
        &env.state(),
        Path::new("/"),
        &["lease", "acquire", "--session", "x"],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("no worktree given") && e.contains("give REPO/WT"),
        "{e}"
    );
    let o = wtfs_in(
        &env.state(),
        &m.mountpoint.join("repo"),
        &["lease", "acquire", "--session", "x"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("repository repo's directory"),
        "{}",
        stderr(&o)
    );
    // reclaim never defaults: the caller's own shell would be inside.
    let o = wtfs_in(&env.state(), &sub, &["reclaim"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // …but takes a path.
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/u", "--session", "rel"],
    );
    let o = wtfs_in(
        &env.state(),
        Path::new("/"),
        &["reclaim", m.wt("repo", "u").to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["worktree"], "repo/u", "{j}");
    assert_eq!(j["outcome"], "removed", "{j}");
    assert!(
        !fs::exists(m.wt("repo", "u")).unwrap(),
        "repo/u is still there"
    );
    drop(m);
}
