//! `worktreefs mcp` (issue 19, item 8) driven by a real MCP client, the Python `mcp`
//! package (`.ci/run` installs it): initialize, list the tools with their schemas,
//! create a worktree, lease it (a second exclusive lease refused as a tool error with the
//! CLI's message), run a turn, release it. Mounted, real git.

mod common;

use common::*;

/// The `worktreefs mcp` processes serving `state` (by their command lines).
fn servers_of(state: &std::path::Path) -> Vec<i32> {
    let want = format!("--state-dir\0{}\0mcp", state.display());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&want))
        })
        .collect()
}

#[test]
fn an_mcp_client_creates_leases_runs_a_turn_and_releases() {
    let env = Env::new();
    let m = env.mount();
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
    // Bounded: timeout(1) ends the client; a server that hangs even so (the client
    // starts it in a session of its own) is ended by pid after that, by a watchdog.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        let state = env.state();
        std::thread::spawn(move || {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(310);
            while std::time::Instant::now() < end {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            for pid in servers_of(&state) {
                // SAFETY: plain kill of a server this test's client started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    let out = run(
        "timeout",
        &["300", "python3", client, BIN, env.state().to_str().unwrap()],
        std::path::Path::new("/"),
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = watchdog.join();
    // The server ends with its client.
    wait_until(
        "the server has exited",
        std::time::Duration::from_secs(15),
        || servers_of(&env.state()).is_empty(),
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
    // The schema says what the description says: at least one second.
    assert_eq!(
        seen["tools"]["run_turn"]["input"]["properties"]["timeout_secs"]["minimum"], 1,
        "{}",
        seen["tools"]["run_turn"]
    );
    // Annotations that tell the truth: listings only read; reclaim (discard) and a turn
    // (any command) may destroy; nothing but a turn reaches beyond this machine's state.
    let hint = |t: &str, h: &str| seen["tools"][t]["annotations"][h].clone();
    for t in [
        "list_worktrees",
        "show_worktree",
        "list_retained",
        "list_removed",
    ] {
        assert_eq!(hint(t, "readOnlyHint"), true, "{t}");
    }
    for t in [
        "create_worktree",
        "acquire_lease",
        "release_lease",
        "run_turn",
        "reclaim",
        "restore",
    ] {
        assert_eq!(hint(t, "readOnlyHint"), false, "{t}");
    }
    for t in ["reclaim", "run_turn", "release_lease"] {
        assert_eq!(hint(t, "destructiveHint"), true, "{t}");
    }
    for t in ["create_worktree", "acquire_lease", "restore"] {
        assert_eq!(hint(t, "destructiveHint"), false, "{t}");
    }
    assert_eq!(hint("run_turn", "openWorldHint"), true);
    assert_eq!(hint("reclaim", "openWorldHint"), false);
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
    // No structured content on an error: clients check it against the output schema,
    // which is a success's; the typed refusal comes as the second text block.
    assert!(again["structured"].is_null(), "{again}");
    assert_eq!(again["refusal"]["error"], "failed", "{again}");
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
    assert!(other["structured"].is_null(), "{other}");
    assert_eq!(other["refusal"]["error"], "occupied", "{other}");
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
    let t = &seen["turn_swaps_report"];
    assert_eq!(t["is_error"], false, "{t}");
    assert_eq!(t["structured"]["exit_status"], 3, "{t}");
    assert_eq!(t["structured"]["stdout_tail"], "swapped\n", "{t}");
    let t = &seen["turn_bad_worktree"];
    assert_eq!(t["is_error"], true, "{t}");
    assert!(t["text"].as_str().unwrap().contains("--bogus"), "{t}");
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

/// A server whose client goes mid-turn does not leave the turn running, even when its
/// command ignores SIGTERM and has a child: killed outright (SIGKILL), the turn gets
/// SIGTERM from its parent's death and kills its command 5 s later; with its stdin
/// closed, the server ends the turn itself and exits. Either way every process of the
/// turn is gone and its lease goes. Driven by hand over newline-delimited JSON-RPC, so
/// the test holds the server's pid.
#[test]
fn a_server_killed_mid_turn_ends_the_turn() {
    server_gone_mid_turn(true);
}

#[test]
fn a_server_whose_client_closes_ends_the_turn_and_exits() {
    server_gone_mid_turn(false);
}

/// A server driven by hand over newline-delimited JSON-RPC (so the test holds its pid),
/// initialized, with a turn started through `run_turn` (request id 2) whose command
/// ignores SIGTERM and has a child: their pids once they run.
struct HandServer {
    server: std::process::Child,
    to: Option<std::process::ChildStdin>,
    from: std::io::BufReader<std::process::ChildStdout>,
    procs: Vec<i32>,
}

impl HandServer {
    fn with_a_stubborn_turn(env: &Env) -> HandServer {
        use std::io::BufRead;
        let mut server = std::process::Command::new(BIN)
            .arg("--state-dir")
            .arg(env.state())
            .arg("mcp")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let to = server.stdin.take();
        let from = std::io::BufReader::new(server.stdout.take().unwrap());
        let mut h = HandServer {
            server,
            to,
            from,
            procs: Vec::new(),
        };
        h.send(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
        );
        let mut line = String::new();
        h.from.read_line(&mut line).unwrap();
        assert!(line.contains("\"id\":1"), "{line}");
        h.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let pids = env.dir.path().join("pids");
        let script = format!(
            "trap '' TERM; sleep 600 & echo $$ $! > {}; wait",
            pids.display()
        );
        h.send(
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_turn",
            "arguments": {"worktree": "repo/agent", "session": "s1",
                          "command": ["sh", "-c", script]}}}),
        );
        wait_until(
            "the turn's command runs",
            std::time::Duration::from_secs(20),
            || std::fs::read_to_string(&pids).is_ok_and(|p| p.split_whitespace().count() == 2),
        );
        h.procs = std::fs::read_to_string(&pids)
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        h
    }

    fn send(&mut self, v: serde_json::Value) {
        use std::io::Write;
        writeln!(self.to.as_mut().expect("stdin open"), "{v}").unwrap();
    }

    /// The turn's processes still there `within` from now (SIGKILLed by the test then).
    fn left_after(&self, within: std::time::Duration) -> Vec<i32> {
        let gone = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        };
        let end = std::time::Instant::now() + within;
        while self.procs.iter().any(|p| !gone(*p)) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let left: Vec<i32> = self.procs.iter().copied().filter(|p| !gone(*p)).collect();
        for p in &left {
            // SAFETY: plain kill of a process this test's turn started.
            unsafe { libc::kill(*p, libc::SIGKILL) };
        }
        left
    }

    /// Whether the server exits within `within` (killed by the test otherwise).
    fn exits_within(&mut self, within: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + within;
        let mut exited = false;
        while !exited && std::time::Instant::now() < end {
            exited = self.server.try_wait().unwrap().is_some();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        exited
    }
}

impl Drop for HandServer {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A client's `notifications/cancelled` for a running `run_turn` ends the turn as its
/// timeout would: SIGTERM to the command, SIGKILL 5 s later when it ignores that, what
/// it left running with it, and the turn's lease goes; the server itself goes on.
#[test]
fn a_cancelled_turn_is_ended_as_at_its_timeout() {
    use std::io::BufRead;
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/agent"]);
    let m = env.mount();
    let mut h = HandServer::with_a_stubborn_turn(&env);
    h.send(
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user stopped it"}}),
    );
    let left = h.left_after(std::time::Duration::from_secs(20));
    assert!(
        left.is_empty(),
        "the cancelled turn's processes {left:?} still ran 20 s later"
    );
    wait_until(
        "the turn's lease goes",
        std::time::Duration::from_secs(10),
        || !wtfs_ok(&env.state(), &["leases"]).contains("session:s1"),
    );
    // Still serving: another call is answered.
    h.send(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "list_worktrees", "arguments": {}}}),
    );
    let mut answered = false;
    let mut line = String::new();
    while !answered && h.from.read_line(&mut line).unwrap() > 0 {
        answered = line.contains("\"id\":3");
        line.clear();
    }
    assert!(
        answered,
        "the server stopped answering after a cancellation"
    );
    drop(h);
    drop(m);
}

fn server_gone_mid_turn(kill: bool) {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/agent"]);
    let m = env.mount();
    let mut h = HandServer::with_a_stubborn_turn(&env);
    if kill {
        let _ = h.server.kill();
    } else {
        h.to = None;
    }
    let left = h.left_after(std::time::Duration::from_secs(30));
    let exited = h.exits_within(std::time::Duration::from_secs(20));
    assert!(
        left.is_empty(),
        "the turn's processes {left:?} outlived their server by 30 s"
    );
    assert!(exited, "the server did not exit once its client was gone");
    wait_until(
        "the turn's lease goes",
        std::time::Duration::from_secs(10),
        || !wtfs_ok(&env.state(), &["leases"]).contains("session:s1"),
    );
    drop(h);
    drop(m);
}
