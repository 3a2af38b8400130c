//! `worktreefs mcp` driven by a real MCP client, the Python `mcp`
//! package (`.ci/run` installs it): initialize, list the tools with their schemas,
//! create a worktree, lease it (a second exclusive lease refused as a tool error with the
//! CLI's message), run a turn, release it. Mounted, real git.

use crate::common::*;

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
        "worktree_env",
        "acquire_lease",
        "release_lease",
        "run_turn",
        "list_retained",
        "list_removed",
        "reclaim",
        "restore",
        "checkpoint",
        "rewind",
        "list_checkpoints",
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
        "worktree_env",
        "list_retained",
        "list_removed",
        "list_checkpoints",
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
        "checkpoint",
        "rewind",
    ] {
        assert_eq!(hint(t, "readOnlyHint"), false, "{t}");
    }
    for t in ["reclaim", "run_turn", "release_lease", "rewind"] {
        assert_eq!(hint(t, "destructiveHint"), true, "{t}");
    }
    for t in ["create_worktree", "acquire_lease", "restore", "checkpoint"] {
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

/// The official MCP Inspector's CLI (npm `@modelcontextprotocol/inspector-cli`, on the
/// TypeScript SDK, which checks every structured result against its tool's output schema)
/// calls each tool once with success and once refused: every call is one it can read.
/// `.ci/run` installs it and names its `build/index.js` in `WORKTREEFS_MCP_INSPECTOR`;
/// elsewhere the test says it is skipped (and fails under CI, where it must run).
#[test]
fn the_mcp_inspector_reads_every_tools_success_and_refusal() {
    let Ok(inspector) = std::env::var("WORKTREEFS_MCP_INSPECTOR") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "WORKTREEFS_MCP_INSPECTOR is not set under CI: .ci/run installs the Inspector CLI"
        );
        eprintln!("skipped: WORKTREEFS_MCP_INSPECTOR names no Inspector CLI (see .ci/run)");
        return;
    };
    let inspector = std::path::PathBuf::from(inspector);
    // The CLI looks for `../package.json` from its working directory: its install's
    // node_modules, whose parent has one.
    let cwd = inspector
        .ancestors()
        .find(|p| p.ends_with("node_modules"))
        .expect("the Inspector's index.js lies under a node_modules")
        .to_path_buf();
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/spare"]);
    let m = env.mount();
    // The server's stderr goes to a file: the CLI pipes it and never reads it.
    let server = |state: &std::path::Path, name: &str| {
        let path = env.dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec '{BIN}' --state-dir '{}' mcp 2>>'{}'\n",
                state.display(),
                env.dir.path().join("server.log").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    };
    let good = server(&env.state(), "server.sh");
    // A state directory whose database is not one: every command refuses, listings too.
    let bad = env.dir.path().join("bad-state");
    std::fs::create_dir(&bad).unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(bad.join("worktreefs.db"), vec![b'x'; 4096]).unwrap();
    let broken = server(&bad, "broken.sh");
    let call = |server: &std::path::Path, tool: &str, args: &[&str]| -> serde_json::Value {
        let mut argv = vec![
            inspector.to_str().unwrap(),
            server.to_str().unwrap(),
            "--method",
            "tools/call",
            "--tool-name",
            tool,
        ];
        for a in args {
            argv.extend(["--tool-arg", a]);
        }
        let mut full = vec!["120", "node"];
        full.extend(argv);
        let out = run("timeout", &full, &cwd);
        assert!(
            out.status.success(),
            "the Inspector could not read {tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{tool}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let ok = |v: serde_json::Value, what: &str| -> serde_json::Value {
        assert_ne!(v["isError"], true, "{what}: {v}");
        assert!(v["structuredContent"].is_object(), "{what}: {v}");
        v["structuredContent"].clone()
    };
    let refused = |v: serde_json::Value, what: &str, says: &str| -> serde_json::Value {
        assert_eq!(v["isError"], true, "{what}: {v}");
        assert!(v.get("structuredContent").is_none(), "{what}: {v}");
        let text = v["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains(says), "{what}: {text}");
        serde_json::from_str(v["content"][1]["text"].as_str().unwrap_or("null")).unwrap()
    };
    let w = "worktree=repo/insp";
    let c = ok(call(&good, "create_worktree", &[w]), "create");
    assert_eq!(c["worktree"], "repo/insp");
    refused(
        call(&good, "create_worktree", &[w]),
        "create again",
        "already exists",
    );
    let reused = ok(
        call(&good, "create_worktree", &[w, "reuse=true"]),
        "create again, reuse",
    );
    assert_eq!(reused["reused"], true, "{reused}");
    assert_eq!(reused["worktree"], "repo/insp", "{reused}");
    let l = ok(call(&good, "list_worktrees", &[]), "list");
    assert_eq!(l["items"].as_array().unwrap().len(), 2, "{l}");
    refused(
        call(&broken, "list_worktrees", &[]),
        "list, broken",
        "database",
    );
    assert_eq!(
        ok(call(&good, "show_worktree", &[w]), "show")["name"],
        "insp"
    );
    let e = ok(call(&good, "worktree_env", &[w]), "env");
    assert_eq!(e["worktree"], "repo/insp", "{e}");
    assert!(e["port"].as_u64().is_some() && e["ports"] == 10, "{e}");
    // A setup that fails: create_worktree with wait_setup says so (the worktree is made,
    // its object shows the setup), and run_turn is refused until ignore_setup.
    wtfs_ok(
        &env.state(),
        &["repo", "set", "repo", "--on-create", "exit 5"],
    );
    let made = refused(
        call(
            &good,
            "create_worktree",
            &["worktree=repo/broken", "wait_setup=true"],
        ),
        "create, its setup fails",
        "failed (exit 5)",
    );
    assert_eq!(made["setup"]["exit_code"], 5, "{made}");
    let turn = |extra: &[&str]| {
        let mut args = vec!["worktree=repo/broken", "session=s9", r#"command=["true"]"#];
        args.extend_from_slice(extra);
        call(&good, "run_turn", &args)
    };
    let r = refused(turn(&[]), "turn after a failed setup", "--ignore-setup");
    assert_eq!(r["error"], "setup-failed", "{r}");
    assert_eq!(r["setup"]["summary"], "failed (exit 5)", "{r}");
    let t = ok(turn(&["ignore_setup=true"]), "turn ignoring the setup");
    assert_eq!(t["exit_status"], 0, "{t}");
    wtfs_ok(&env.state(), &["repo", "set", "repo", "--no-on-create"]);
    let r = refused(
        call(&good, "show_worktree", &["worktree=repo/none"]),
        "show unknown",
        "does not exist",
    );
    assert_eq!(r["error"], "not-found");
    let a = ok(
        call(&good, "acquire_lease", &[w, "session=s1", "exclusive=true"]),
        "acquire",
    );
    assert_eq!(a["exclusive"], true, "{a}");
    let r = refused(
        call(&good, "acquire_lease", &[w, "session=s2", "exclusive=true"]),
        "acquire by another",
        "s1",
    );
    assert_eq!(r["error"], "occupied", "{r}");
    let t = ok(
        call(
            &good,
            "run_turn",
            &[
                w,
                "session=s1",
                r#"command=["git","rev-parse","--abbrev-ref","HEAD"]"#,
            ],
        ),
        "turn",
    );
    assert_eq!(t["stdout_tail"], "insp\n", "{t}");
    assert_eq!(t["exit_status"], 0, "{t}");
    refused(
        call(&good, "run_turn", &[w, "session=s1", "command=[]"]),
        "turn with no command",
        "command is empty",
    );
    ok(call(&good, "release_lease", &[w, "session=s1"]), "release");
    refused(
        call(&good, "release_lease", &[w, "session=s1"]),
        "release again",
        "holds no lease",
    );
    ok(call(&good, "list_retained", &[]), "retained");
    refused(
        call(&broken, "list_retained", &[]),
        "retained, broken",
        "database",
    );
    let r = ok(call(&good, "reclaim", &["worktree=repo/spare"]), "reclaim");
    assert_eq!(r["outcome"], "removed", "{r}");
    let r = refused(
        call(&good, "reclaim", &["worktree=repo/spar"]),
        "reclaim unknown",
        "repo/spar",
    );
    assert_eq!(r["error"], "not-found", "{r}");
    let k = ok(call(&good, "list_removed", &[]), "removed");
    assert!(
        k["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["worktree"] == "repo/spare"),
        "{k}"
    );
    refused(
        call(&broken, "list_removed", &[]),
        "removed, broken",
        "database",
    );
    let r = ok(call(&good, "restore", &["worktree=repo/spare"]), "restore");
    assert_eq!(r["worktree"], "repo/spare", "{r}");
    refused(
        call(&good, "restore", &["worktree=repo/never"]),
        "restore unknown",
        "repo/never",
    );
    // Checkpoints: taken, listed, rewound to; an unknown one refused.
    let c = ok(
        call(&good, "checkpoint", &["worktree=repo/spare", "label=mcp"]),
        "checkpoint",
    );
    assert_eq!(c["label"], "mcp", "{c}");
    let n = c["checkpoint"].as_u64().unwrap();
    let l = ok(
        call(&good, "list_checkpoints", &["worktree=repo/spare"]),
        "list_checkpoints",
    );
    assert!(
        l["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["label"] == "mcp"),
        "{l}"
    );
    let to = format!("to={n}");
    let r = ok(
        call(&good, "rewind", &["worktree=repo/spare", &to]),
        "rewind",
    );
    assert_eq!(r["rewound_to"]["checkpoint"].as_u64(), Some(n), "{r}");
    assert!(r["undo"]["checkpoint"].as_u64().unwrap() > n, "{r}");
    refused(
        call(&good, "rewind", &["worktree=repo/spare", "to=99"]),
        "rewind to an unknown checkpoint",
        "no checkpoint 99",
    );
    drop(m);
}
