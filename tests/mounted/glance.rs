//! What `list` says each worktree holds: its upper layer's changed and untracked
//! entries (an upper bound of `git status`), its commits against its upstream or base, a
//! running turn, its last activity; and that a later call sees what changed since.

use std::fs;
use std::time::Duration;

use crate::common::*;

fn listed(env: &Env, name: &str) -> serde_json::Value {
    crate::common::listed(env, name).unwrap_or_else(|| panic!("{name} is not listed"))
}

fn commit(wt: &std::path::Path, msg: &str) {
    git(
        wt,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-am",
            msg,
        ],
    );
}

#[test]
fn list_says_what_each_worktree_holds_and_sees_what_changed_since() {
    let env = Env::new();
    let m = env.mount();
    wtfs_ok(&env.state(), &["new", "repo/g"]);
    wtfs_ok(&env.state(), &["new", "repo/idle"]);
    let wt = m.wt("repo", "g");
    // A modified file, a deleted one (deep in the tree), a new file, a new directory
    // with files in it, and two commits.
    fs::write(wt.join("README.md"), "changed\n").unwrap();
    fs::remove_file(wt.join("src/lib/util.rs")).unwrap();
    fs::write(wt.join("new.txt"), "new\n").unwrap();
    fs::create_dir_all(wt.join("newdir/deeper")).unwrap();
    fs::write(wt.join("newdir/deeper/a"), "a\n").unwrap();
    fs::write(wt.join("newdir/b"), "b\n").unwrap();
    // A base directory removed whole: one deletion for each of its three entries.
    fs::remove_dir_all(wt.join("docs")).unwrap();
    commit(&wt, "one");
    commit(&wt, "two");
    let g = listed(&env, "g");
    assert_eq!(g["changed"], 5, "{g}");
    assert_eq!(g["untracked"], 2, "{g}");
    assert_eq!(
        (g["ahead"].clone(), g["behind"].clone()),
        (2.into(), 0.into()),
        "{g}"
    );
    assert_eq!(g["compared_with"], "base", "{g}");
    assert_eq!(g["turn"], serde_json::Value::Null);
    // An upper bound of what git status lists.
    let status = git_dirty_paths(&wt);
    assert!(
        status.len() as u64 <= g["changed"].as_u64().unwrap() + g["untracked"].as_u64().unwrap(),
        "{status:?} {g}"
    );
    let idle = listed(&env, "idle");
    assert_eq!(
        (idle["changed"].clone(), idle["untracked"].clone()),
        (0.into(), 0.into())
    );

    // What changed since the last call is seen by the next (a new file deep in a
    // directory of the base, a file put back).
    fs::write(wt.join("src/lib/added.rs"), "x\n").unwrap();
    fs::write(wt.join("src/lib/util.rs"), "pub fn one() -> u32 { 1 }\n").unwrap();
    let g = listed(&env, "g");
    assert_eq!(g["untracked"], 3, "{g}");
    // util.rs is in the upper layer again, as a file instead of a whiteout: still changed.
    assert_eq!(g["changed"], 5, "{g}");

    // With an upstream, that is what it is compared with.
    let src = env.repo.path();
    git(
        &src,
        &["update-ref", "refs/remotes/origin/main", &env.repo.head()],
    );
    git(&src, &["config", "branch.g.remote", "origin"]);
    git(&src, &["config", "branch.g.merge", "refs/heads/main"]);
    git(&src, &["config", "remote.origin.url", "/nonexistent"]);
    git(
        &src,
        &[
            "config",
            "remote.origin.fetch",
            "+refs/heads/*:refs/remotes/origin/*",
        ],
    );
    let g = listed(&env, "g");
    assert_eq!(g["compared_with"], "origin/main", "{g}");
    assert_eq!(g["ahead"], 2, "{g}");

    // A running turn, and the table.
    let state = env.state();
    let turn = std::thread::spawn(move || {
        wtfs(
            &state,
            &["turn", "repo/idle", "--session", "s7", "--", "sleep", "3"],
        )
    });
    wait_until("the turn to run", Duration::from_secs(20), || {
        listed(&env, "idle")["turn"] == "s7"
    });
    let table = wtfs_ok(&env.state(), &["list"]);
    for h in ["CHANGED", "NEW", "AHEAD/BEHIND", "TURN", "ACTIVE"] {
        assert!(table.contains(h), "{table}");
    }
    assert!(table.contains("+2/-0") && table.contains("s7"), "{table}");
    assert!(turn.join().unwrap().status.success());
    let idle = listed(&env, "idle");
    let at = worktreefs::report::parse_rfc3339(idle["last_activity_at"].as_str().unwrap()).unwrap();
    assert!(worktreefs::store::now_secs() - at < 30, "{idle}");

    // A FIFO where a branch's ref was (libgit2 would wait on it for good): `list` answers
    // within its limit, saying so, the repository's worktrees without their counts.
    let head = git(&wt, &["rev-parse", "HEAD"]).trim().to_string();
    let r = src.join(".git/refs/heads/g");
    fs::remove_file(&r).unwrap();
    run_ok("mkfifo", &[r.to_str().unwrap()], std::path::Path::new("/"));
    let t = std::time::Instant::now();
    let o = wtfs(&env.state(), &["list", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("did not answer within 5 s"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let g = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "g")
        .unwrap();
    assert_eq!(g["changed"], serde_json::Value::Null, "{g}");
    // The ref put back (its blocked reader ended with the command).
    fs::remove_file(&r).unwrap();
    fs::write(&r, format!("{head}\n")).unwrap();
    assert_eq!(listed(&env, "g")["ahead"], 2);
    m.unmount();
}
