//! `worktreefs mcp` (issue 19, item 8) driven by a real MCP client, the Python `mcp`
//! package (`.ci/run` installs it): initialize, list the tools with their schemas,
//! create a worktree, lease it (a second exclusive lease refused as a tool error with the
//! CLI's message), run a turn, release it. Mounted, real git.

mod common;

use common::*;

#[test]
fn an_mcp_client_creates_leases_runs_a_turn_and_releases() {
    let env = Env::new();
    let m = env.mount();
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
    let out = run(
        "python3",
        &[client, BIN, env.state().to_str().unwrap()],
        std::path::Path::new("/"),
    );
    assert!(
        out.status.success(),
        "the MCP client failed (is the Python `mcp` package installed? `pip install mcp`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every tool, each with an input and an output schema.
    for t in [
        "create_worktree",
        "list_worktrees",
        "show_worktree",
        "acquire_lease",
        "release_lease",
        "run_turn",
        "list_retained",
        "list_removed",
        "reclaim",
        "restore",
    ] {
        let tool = &seen["tools"][t];
        assert_eq!(tool["input"]["type"], "object", "{t}: {tool}");
        assert_eq!(tool["output"]["type"], "object", "{t}: {tool}");
    }
    assert!(seen["tools"]["acquire_lease"]["input"]["properties"]["exclusive"].is_object());
    let c = &seen["create"];
    assert_eq!(c["is_error"], false, "{c}");
    assert_eq!(c["structured"]["worktree"], "repo/agent", "{c}");
    assert_eq!(
        c["structured"]["path"],
        m.wt("repo", "agent").to_str().unwrap(),
        "{c}"
    );
    // A refusal is a tool result marked as an error, with the CLI's message.
    let again = &seen["create_again"];
    assert_eq!(again["is_error"], true, "{again}");
    assert!(
        again["text"]
            .as_str()
            .unwrap()
            .contains("worktree 'repo/agent' already exists"),
        "{again}"
    );
    let a = &seen["acquire"];
    assert_eq!(a["is_error"], false, "{a}");
    assert_eq!(a["structured"]["session"], "s1", "{a}");
    assert_eq!(a["structured"]["exclusive"], true, "{a}");
    let other = &seen["acquire_other"];
    assert_eq!(other["is_error"], true, "{other}");
    assert!(
        other["text"].as_str().unwrap().contains("session s1"),
        "{other}"
    );
    assert_eq!(other["structured"]["error"], "occupied", "{other}");
    // The turn ran in the worktree, on its branch; its status and output come back.
    let t = &seen["turn"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["exit_status"], 7, "{t}");
    assert_eq!(t["structured"]["timed_out"], false, "{t}");
    assert_eq!(t["structured"]["stdout_tail"], "agent\n", "{t}");
    // Past its timeout a turn is ended: SIGTERM, and SIGKILL when its command ignores
    // that; its output up to then comes back, without the turn's own JSON line.
    let t = &seen["turn_timeout"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["timed_out"], true, "{t}");
    assert_eq!(t["structured"]["exit_status"], 124, "{t}");
    assert_eq!(t["structured"]["signal"], "SIGTERM", "{t}");
    let t = &seen["turn_stubborn"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["timed_out"], true, "{t}");
    assert_eq!(t["structured"]["signal"], "SIGKILL", "{t}");
    assert_eq!(t["structured"]["stdout_tail"], "begun\n", "{t}");
    assert_eq!(t["structured"]["stderr_tail"], "said\n", "{t}");
    let secs = t["secs"].as_f64().unwrap();
    assert!(
        secs < 20.0,
        "a 1 s timeout took {secs:.1} s to end a turn that ignores SIGTERM"
    );
    let t = &seen["turn_progress"];
    assert_eq!(t["structured"]["timed_out"], true, "{t}");
    assert_eq!(t["structured"]["signal"], "SIGTERM", "{t}");
    assert_eq!(t["structured"]["stdout_tail"], "out\n", "{t}");
    assert_eq!(t["structured"]["stderr_tail"], "compiling 3/10\r", "{t}");
    let t = &seen["turn_json_stderr"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["exit_status"], 2, "{t}");
    assert_eq!(t["structured"]["timed_out"], false, "{t}");
    assert_eq!(t["structured"]["stdout_tail"], "important\n", "{t}");
    let t = &seen["turn_huge_timeout"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["exit_status"], 0, "{t}");
    assert_eq!(
        seen["show"]["structured"]["state"], "active",
        "{}",
        seen["show"]
    );
    let r = &seen["release"];
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(r["structured"]["session"], "s1", "{r}");
    let r = &seen["release_again"];
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("holds no lease"),
        "{r}"
    );
    let items = seen["list"]["structured"]["items"].as_array().unwrap();
    assert!(
        items.iter().any(|w| w["worktree"] == "repo/agent"),
        "{items:?}"
    );
    // What the tools did is what the CLI sees: no session lease is left, and the turn's
    // processes' leases end with them.
    wait_until(
        "every lease gone",
        std::time::Duration::from_secs(10),
        || wtfs_ok(&env.state(), &["leases", "--json"]).trim() == "[]",
    );
    drop(m);
}
