//! Turns: at most one running turn per worktree among all its holders,
//! ended by its command's exit, its session's release or its process's death; `--guard`
//! makes the filesystem refuse writes from outside the turn's process tree. Mounted, real
//! processes, real git.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A `turn` running in the background, killed (SIGKILL, by pid) if the test ends first.
struct Background(Option<Child>);

impl Background {
    fn start(state: &Path, args: &[&str]) -> Background {
        let child = Command::new(BIN)
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .current_dir("/")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "Test")
            .env("GIT_AUTHOR_EMAIL", "test@example.com")
            .env("GIT_COMMITTER_NAME", "Test")
            .env("GIT_COMMITTER_EMAIL", "test@example.com")
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worktreefs turn");
        Background(Some(child))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Waits (bounded) for it to exit.
    fn finish(mut self, limit: Duration) -> std::process::Output {
        let mut child = self.0.take().unwrap();
        let end = Instant::now() + limit;
        loop {
            if child.try_wait().unwrap().is_some() {
                return child.wait_with_output().unwrap();
            }
            if Instant::now() > end {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "the turn did not end within {limit:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn turns_listed(m: &Mounted) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(m.mountpoint.join(".control/turns"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn wait_for_turn(m: &Mounted) {
    wait_until("the turn is listed", Duration::from_secs(10), || {
        !turns_listed(m).is_empty()
    });
}

/// Whether process `pid` has exited (gone, or a zombie).
fn holders_gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Two sessions sharing one worktree start turns at the same moment: exactly one runs,
/// the other is refused at once (exit 3) with a busy naming the running turn's session
/// and command. `.control/turns` lists the running one.
#[test]
fn two_sessions_starting_turns_at_once_one_runs_and_the_other_is_busy() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/t", "--session", "a"],
    );
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let runs: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|s| {
            let (state, barrier) = (env.state(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let script = format!("echo {s} >> turns.log; sleep 2");
                (
                    s,
                    wtfs(
                        &state,
                        &["turn", "repo/t", "--session", s, "--", "sh", "-c", &script],
                    ),
                )
            })
        })
        .collect();
    // While one runs, it is listed.
    wait_for_turn(&m);
    let listed = turns_listed(&m);
    assert_eq!(listed, vec!["repo:t".to_string()]);
    let entry: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/turns/repo:t")).unwrap(),
    )
    .unwrap();
    let outcomes: Vec<_> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    let won: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| o.status.success())
        .collect();
    let lost: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| !o.status.success())
        .collect();
    assert_eq!(won.len(), 1, "exactly one turn runs: {outcomes:?}");
    assert_eq!(lost.len(), 1, "{outcomes:?}");
    let (winner, _) = won[0];
    let (_, lost) = lost[0];
    assert_eq!(
        lost.status.code(),
        Some(3),
        "a typed busy: {}",
        stderr(lost)
    );
    let msg = stderr(lost);
    assert!(msg.contains("busy"), "{msg}");
    assert!(msg.contains(&format!("session {winner}")), "{msg}");
    assert!(msg.contains("sleep 2") || msg.contains("sh -c"), "{msg}");
    assert_eq!(entry["session"], *winner, "{entry}");
    let log = fs::read_to_string(m.wt("repo", "t").join("turns.log")).unwrap();
    assert_eq!(log, format!("{winner}\n"), "only the winner ran");
    // Session a held its lease before: it still does. Session b's lease (if it won, the
    // turn took it) is gone with its turn.
    let leases = wtfs_ok(&env.state(), &["leases"]);
    assert!(leases.contains("session:a"), "{leases}");
    assert!(!leases.contains("session:b"), "{leases}");
    assert!(turns_listed(&m).is_empty());
    // --json: the busy as JSON on stderr, the command's stdout its own.
    let bg = Background::start(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sleep", "3"],
    );
    wait_for_turn(&m);
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "b",
            "--json",
            "--",
            "echo",
            "hi",
        ],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stderr).expect("JSON on stderr");
    assert_eq!(j["error"], "busy", "{j}");
    assert_eq!(j["turn"]["session"], "a", "{j}");
    assert_eq!(j["turn"]["pid"], bg.pid(), "{j}");
    // The ways out as the occupancy refusal gives them: one release per holder.
    assert_eq!(
        j["ways_out"]["release"][0], "worktreefs lease release repo/t --session a",
        "{j}"
    );
    assert!(
        j["turn"]["started_at"].as_str().unwrap().contains('T'),
        "{j}"
    );
    // --wait: waits for the running turn, then runs.
    let t = Instant::now();
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "b",
            "--wait",
            "20",
            "--",
            "echo",
            "hi",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    assert!(t.elapsed() >= Duration::from_millis(500), "it waited");
    assert!(bg.finish(Duration::from_secs(10)).status.success());
    drop(m);
}

/// A turn whose process is killed with SIGKILL leaves no gate: the daemon notices within
/// a second, and a daemon that was down meanwhile clears it at boot.
#[test]
fn a_turn_killed_with_sigkill_opens_the_gate_within_a_second_and_after_a_restart() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    {
        let m = env.mount();
        let bg = Background::start(
            &env.state(),
            &["turn", "repo/t", "--session", "a", "--", "sleep", "60"],
        );
        wait_for_turn(&m);
        let children = fs::read_to_string(format!("/proc/{0}/task/{0}/children", bg.pid()))
            .unwrap_or_default();
        let command: i32 = children
            .split_whitespace()
            .next()
            .expect("the turn's command runs")
            .parse()
            .unwrap();
        // SAFETY: a pid this test started.
        unsafe { libc::kill(bg.pid() as i32, libc::SIGKILL) };
        let killed = Instant::now();
        wait_until(
            "the daemon ends the dead turn",
            Duration::from_millis(2500),
            || turns_listed(&m).is_empty(),
        );
        eprintln!("gate open after {:?}", killed.elapsed());
        let events = wtfs_ok(&env.state(), &["events"]);
        assert!(events.contains("turn-ended"), "{events}");
        // The turn took session a's lease: it went with the killed turn.
        let leases = wtfs_ok(&env.state(), &["leases"]);
        assert!(!leases.contains("session:a"), "{leases}");
        assert!(
            events.contains("its turn, which took it, ended"),
            "{events}"
        );
        // The killed turn's command went with it (it dies with its parent).
        wait_until(
            "the command dies with its turn",
            Duration::from_secs(2),
            || holders_gone(command),
        );
        let o = wtfs(
            &env.state(),
            &["turn", "repo/t", "--session", "b", "--", "true"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        drop(bg);
    }
    // A daemon that dies with a turn running; the turn dies while it is down.
    wtfs_ok(&env.state(), &["new", "repo/t2"]);
    let m = env.mount();
    let bg = Background::start(
        &env.state(),
        &["turn", "repo/t2", "--session", "a", "--", "sleep", "60"],
    );
    wait_for_turn(&m);
    m.kill9();
    drop(bg);
    let m = env.mount();
    assert!(turns_listed(&m).is_empty(), "boot reconcile cleared it");
    let turns = wtfs_ok(&env.state(), &["turns", "--json"]);
    let turns: serde_json::Value = serde_json::from_str(&turns).unwrap();
    assert_eq!(turns, serde_json::json!([]));
    drop(m);
}

/// `--guard`: while the turn runs, a write, create, namespace change or setattr inside
/// the worktree from a process outside its tree answers EBUSY (with an event naming the
/// turn); reads stay open; the turn's own children (git among them, and what they leave
/// running) are never refused.
#[test]
fn a_guarded_turn_refuses_writes_from_outside_and_allows_reads_and_its_own_children() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let wt = m.wt("repo", "t");
    fs::write(wt.join("shared.txt"), "before\n").unwrap();
    let go = env.state().join("go");
    let script = format!(
        "(sh -c 'sleep 0.3; echo orphan > orphan.txt' &); \
         echo mine > own.txt && git add own.txt && git commit -q -m 'in the turn' && \
         while [ ! -e '{go}' ]; do sleep 0.05; done; echo later >> own.txt; mkdir made; \
         mv made made2; chmod 600 own.txt; \
         while [ ! -e orphan.txt ]; do sleep 0.05; done",
        go = go.display()
    );
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--guard",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for_turn(&m);
    wait_until("the turn committed", Duration::from_secs(20), || {
        git(&wt, &["log", "-1", "--format=%s"]).trim() == "in the turn"
    });
    // Reads are open to all.
    assert_eq!(
        fs::read_to_string(wt.join("shared.txt")).unwrap(),
        "before\n"
    );
    assert!(fs::read_dir(&wt).unwrap().count() > 0);
    git(&wt, &["status", "--porcelain"]);
    // Writes from outside are refused with EBUSY.
    let busy = Some(libc::EBUSY);
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .append(true)
                .open(wt.join("shared.txt"))
        ),
        busy,
        "open for writing"
    );
    assert_eq!(errno_of(fs::write(wt.join("new.txt"), "x")), busy, "create");
    assert_eq!(errno_of(fs::create_dir(wt.join("dir"))), busy, "mkdir");
    assert_eq!(
        errno_of(fs::remove_file(wt.join("shared.txt"))),
        busy,
        "unlink"
    );
    assert_eq!(
        errno_of(fs::rename(wt.join("shared.txt"), wt.join("moved.txt"))),
        busy,
        "rename"
    );
    assert_eq!(
        errno_of(fs::hard_link(wt.join("shared.txt"), wt.join("linked.txt"))),
        busy,
        "link"
    );
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("shared.txt", wt.join("sym"))),
        busy,
        "symlink"
    );
    assert_eq!(
        errno_of(fs::set_permissions(
            wt.join("shared.txt"),
            fs::Permissions::from_mode(0o600)
        )),
        busy,
        "setattr"
    );
    // An outsider's process that is a child of the test: also outside.
    let o = run("sh", &["-c", "echo x > shared.txt"], &wt);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        fs::read_to_string(wt.join("shared.txt")).unwrap(),
        "before\n"
    );
    // Another holder's process (session b's `run`) is outside too.
    let o = wtfs(
        &env.state(),
        &[
            "run",
            "repo/t",
            "--session",
            "b",
            "--",
            "sh",
            "-c",
            "echo b > by-b.txt",
        ],
    );
    assert!(!o.status.success(), "session b's write went through");
    assert!(stderr(&o).contains("busy"), "{}", stderr(&o));
    assert!(!wt.join("by-b.txt").exists());
    // Another worktree is not gated.
    wtfs_ok(&env.state(), &["new", "repo/other"]);
    fs::write(m.wt("repo", "other").join("free.txt"), "free").unwrap();
    // The refusal is an event naming the turn.
    let events = wtfs_ok(&env.state(), &["events", "--json"]);
    let refused: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "turn-refused")
        .collect();
    assert!(!refused.is_empty(), "{events}");
    let reason = refused[0]["reason"].as_str().unwrap();
    assert!(reason.contains("session a"), "{reason}");
    assert!(reason.contains(&std::process::id().to_string()), "{reason}");
    // The turn's own tree goes on writing.
    fs::write(&go, "").unwrap();
    let out = bg.finish(Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(wt.join("own.txt")).unwrap(),
        "mine\nlater\n"
    );
    assert!(wt.join("made2").is_dir());
    // What the command left running (orphaned, double-forked) stayed inside the turn.
    assert_eq!(
        fs::read_to_string(wt.join("orphan.txt")).unwrap(),
        "orphan\n"
    );
    // The turn over, the gate is open.
    fs::write(wt.join("shared.txt"), "after\n").unwrap();
    assert!(turns_listed(&m).is_empty());
    drop(m);
}

/// A guarded turn does not start while a process outside it holds a file in the
/// worktree open for writing (its writes would never reach the gate): refused, naming
/// the process; it starts once the file is closed.
#[test]
fn a_guarded_turn_does_not_start_while_an_outsider_holds_a_file_open_for_writing() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let wt = m.wt("repo", "t");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(wt.join("log.txt"))
        .unwrap();
    f.write_all(b"open\n").unwrap();
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--guard", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let msg = stderr(&o);
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");
    assert!(msg.contains("log.txt"), "{msg}");
    assert!(msg.contains("open for writing"), "{msg}");
    assert!(turns_listed(&m).is_empty(), "nothing half-done");
    let leases = wtfs_ok(&env.state(), &["leases"]);
    assert!(
        !leases.contains("session:a"),
        "the lease it took went: {leases}"
    );
    // The daemon counts it too (its handle table sees descriptors of every user and
    // namespace, which /proc may not show this command).
    let bg = Background::start(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sleep", "30"],
    );
    wait_for_turn(&m);
    let entry: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/turns/repo:t")).unwrap(),
    )
    .unwrap();
    assert_eq!(entry["open_for_writing"], 1, "{entry}");
    drop(bg);
    wait_until("the killed turn is gone", Duration::from_secs(3), || {
        turns_listed(&m).is_empty()
    });
    // Without --guard the open file is no obstacle.
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "true"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    drop(f);
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--guard", "--", "true"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    drop(m);
}

/// Releasing the session's lease ends its turn: the gate opens for the next.
#[test]
fn releasing_the_sessions_lease_ends_its_turn() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--guard",
            "--",
            "sleep",
            "60",
        ],
    );
    wait_for_turn(&m);
    wtfs_ok(
        &env.state(),
        &["lease", "release", "repo/t", "--session", "a"],
    );
    assert!(turns_listed(&m).is_empty(), "{:?}", turns_listed(&m));
    // Unguarded now.
    fs::write(m.wt("repo", "t").join("x"), "x").unwrap();
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "b", "--", "true"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(events.contains("turn-ended"), "{events}");
    drop(bg);
    drop(m);
}

/// Bad input: a turn on a worktree that is unknown or removed is the usual typed
/// conflict; `--wait` is bounded and says what it waited for; a command that does not
/// exist leaves no turn.
#[test]
fn turns_refuse_bad_input_clearly_and_leave_nothing_behind() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let o = wtfs(
        &env.state(),
        &["turn", "repo/nope", "--session", "a", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("repo/nope"), "{}", stderr(&o));
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "bad id!", "--", "true"],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("session"), "{}", stderr(&o));
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "/nonexistent/cmd"],
    );
    assert_eq!(o.status.code(), Some(127), "not found, as a shell says");
    assert!(stderr(&o).contains("/nonexistent/cmd"), "{}", stderr(&o));
    assert!(turns_listed(&m).is_empty());
    let leases = wtfs_ok(&env.state(), &["leases"]);
    assert!(
        !leases.contains("session:a"),
        "the lease it took went: {leases}"
    );
    let bg = Background::start(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sleep", "30"],
    );
    wait_for_turn(&m);
    let t = Instant::now();
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "b",
            "--wait",
            "1",
            "--",
            "true",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(stderr(&o).contains("waited 1 s"), "{}", stderr(&o));
    // `turns end`: another session's turn is not ended; this session's is.
    let o = wtfs(&env.state(), &["turns", "end", "repo/t", "--session", "b"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("session a's, not b's"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        turns_listed(&m),
        vec!["repo:t".to_string()],
        "nothing changed"
    );
    let o = wtfs(
        &env.state(),
        &["turns", "end", "repo/t", "--session", "a", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ended"], true);
    let out = bg.finish(Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "its command got SIGTERM"
    );
    assert!(turns_listed(&m).is_empty());
    let o = wtfs(&env.state(), &["turns", "end", "repo/t"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no turn runs"), "{}", stderr(&o));
    let o = wtfs(&env.state(), &["turns", "end", "repo/nope", "--json"]);
    assert_eq!(o.status.code(), Some(1), "nothing to end is not a conflict");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["error"], "not-found", "{j}");
    let o = wtfs(&env.state(), &["turns", "end", "repo/t", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["error"], "not-running", "{j}");
    assert_eq!(j["worktree"], "repo/t", "{j}");
    assert!(j["state"].is_string(), "{j}");
    assert_eq!(
        j["path"].as_str(),
        Some(env.mountpoint().join("repo/t").to_str().unwrap()),
        "{j}"
    );
    // A removed worktree: the usual typed conflict.
    wtfs_ok(&env.state(), &["new", "repo/gone"]);
    wtfs_ok(&env.state(), &["reclaim", "repo/gone"]);
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/gone",
            "--session",
            "a",
            "--json",
            "--",
            "true",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(j["error"], "removed", "{j}");
    drop(m);
}

/// Two turns of the same session, the second waiting: when the first ends (giving back
/// the lease it took), the second takes the lease itself and runs. A SIGTERM to `turn`
/// reaches its command, whose status `turn` exits with.
#[test]
fn a_second_turn_of_the_session_waits_and_a_sigterm_reaches_the_command() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let first = Background::start(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sleep", "1"],
    );
    wait_for_turn(&m);
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--wait",
            "20",
            "--",
            "echo",
            "second",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "second\n");
    assert!(first.finish(Duration::from_secs(10)).status.success());
    // What a turn's command leaves running ends with the turn.
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--",
            "sh",
            "-c",
            "sleep 60 & echo $! > left.pid",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let left: i32 = fs::read_to_string(m.wt("repo", "t").join("left.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until(
        "what it left running is ended",
        Duration::from_secs(5),
        || holders_gone(left),
    );
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--",
            "sh",
            "-c",
            "trap 'echo got > term.txt; exit 7' TERM; echo ready > ready.txt; \
             while :; do sleep 0.05; done",
        ],
    );
    let wt = m.wt("repo", "t");
    wait_until("the command is ready", Duration::from_secs(10), || {
        wt.join("ready.txt").exists()
    });
    // SAFETY: a pid this test started.
    unsafe { libc::kill(bg.pid() as i32, libc::SIGTERM) };
    let out = bg.finish(Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_to_string(wt.join("term.txt")).unwrap(), "got\n");
    assert!(turns_listed(&m).is_empty());
    drop(m);
}

/// A daemon run from a binary of another name (installed as `mount.fuse.worktreefs`, or
/// copied) still serves turns: the pid namespace is compared with the one the daemon
/// wrote down, not guessed from its command line.
#[test]
fn a_turn_runs_under_a_daemon_whose_program_has_another_name() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let bin = env.dir.path().join("wtfsd");
    fs::copy(BIN, &bin).unwrap();
    let m = Mounted::start_program(
        &bin,
        &env.state(),
        &env.mountpoint(),
        Duration::from_secs(120),
        &["--linger", "600"],
        "worktreefs=debug",
    );
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "true"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    drop(m);
}

/// What a turn's command leaves running is ended with the turn, down to the last
/// descendant: a leftover that ignores SIGTERM is killed, and so is the child it leaves
/// to the turn when it dies (adopted by the turn's process, a subreaper).
#[test]
fn a_turn_ends_every_leftover_even_those_adopted_after_the_first_kill() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let dir = env.dir.path().join("pids");
    fs::create_dir(&dir).unwrap();
    let script = dir.join("leftover.sh");
    fs::write(
        &script,
        format!(
            "exec >/dev/null 2>&1 </dev/null\ntrap '' TERM\nsh -c 'trap \"\" TERM; echo $$ > {d}/c.pid; while :; do sleep 1; done' &\necho $$ > {d}/d.pid\nwhile :; do sleep 1; done\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let cmd = format!(
        "sh {} & while [ ! -s {d}/c.pid ] || [ ! -s {d}/d.pid ]; do sleep 0.05; done; exit 0",
        script.display(),
        d = dir.display()
    );
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sh", "-c", &cmd],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = |f: &str| -> i32 {
        fs::read_to_string(dir.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (d, c) = (pid("d.pid"), pid("c.pid"));
    let alive = |p: i32| {
        fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    let end = Instant::now() + Duration::from_secs(2);
    while (alive(d) || alive(c)) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (d_alive, c_alive) = (alive(d), alive(c));
    for p in [d, c] {
        // SAFETY: plain kill of a leftover this test started (if the turn did not).
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(
        !d_alive,
        "the leftover that ignores SIGTERM outlived its turn"
    );
    assert!(
        !c_alive,
        "its child, adopted by the turn after the kill, outlived the turn"
    );
    drop(m);
}

/// A guarded turn's refusal is recorded as an event, but never on the request's path:
/// while another connection holds SQLite's write lock, a write from outside the turn is
/// still refused with EBUSY at once (not after the store's busy timeout), and the event
/// is written once the lock is released.
#[test]
fn a_guarded_refusal_answers_at_once_while_the_database_is_locked() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let wt = m.wt("repo", "t");
    fs::write(wt.join("shared.txt"), "before\n").unwrap();
    let go = env.state().join("go");
    let script = format!(
        "while [ ! -e '{go}' ]; do sleep 0.05; done",
        go = go.display()
    );
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--guard",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for_turn(&m);
    // Another writer takes the database's write lock and keeps it.
    let db = rusqlite::Connection::open(env.state().join("worktreefs.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let r = fs::write(wt.join("outsider.txt"), "x");
    let took = started.elapsed();
    assert_eq!(errno_of(r), Some(libc::EBUSY));
    assert!(
        took < Duration::from_secs(3),
        "the refusal waited {took:?} for the database"
    );
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    wait_until("the refusal is an event", Duration::from_secs(20), || {
        wtfs_ok(&env.state(), &["events", "--json"])
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|e| e["kind"] == "turn-refused")
    });
    fs::write(&go, "").unwrap();
    let out = bg.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    drop(m);
}

/// `turn --timeout SECS` ends a command that runs past it: SIGTERM, then SIGKILL when it
/// ignores that, and everything it left running (one that made a session of its own too)
/// ends with the turn. The turn exits 124, as timeout(1) does, its refusal-style JSON on
/// stderr says `timed-out` and with which signal, and the lease it took is given back.
#[test]
fn a_turn_past_its_timeout_is_ended_even_when_its_command_ignores_sigterm() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let dir = env.dir.path().join("pids");
    fs::create_dir(&dir).unwrap();
    // Every process of the command writes nowhere the test reads from, so the test's pipes
    // close with the turn whatever is left running.
    let cmd = format!(
        "exec >/dev/null 2>&1 </dev/null; trap '' TERM; echo $$ > {d}/c.pid; \
         setsid sh -c 'trap \"\" TERM; echo $$ > {d}/g.pid; while :; do sleep 1; done' & \
         while :; do sleep 1; done",
        d = dir.display()
    );
    let started = Instant::now();
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--timeout",
            "1",
            "--json",
            "--",
            "sh",
            "-c",
            &cmd,
        ],
    );
    let out = bg.finish(Duration::from_secs(30));
    let took = started.elapsed();
    let pid = |f: &str| -> i32 {
        fs::read_to_string(dir.join(f))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let (c, g) = (pid("c.pid"), pid("g.pid"));
    let alive = |p: i32| p > 0 && !holders_gone(p);
    let (c_alive, g_alive) = (alive(c), alive(g));
    for p in [c, g] {
        if p > 0 {
            // SAFETY: plain kill of a process this test's turn started (if it did not end it).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(c > 0 && g > 0, "the command ran: {}", stderr(&out));
    assert!(
        !c_alive,
        "the command that ignores SIGTERM outlived its timeout"
    );
    assert!(
        !g_alive,
        "what it started in a session of its own outlived the turn"
    );
    assert!(
        took < Duration::from_secs(20),
        "the turn took {took:?} to end after a 1 s timeout"
    );
    let last = stderr(&out).lines().last().unwrap_or_default().to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_else(|e| {
        panic!(
            "the last line of stderr is not JSON ({e}): {}",
            stderr(&out)
        )
    });
    assert_eq!(v["error"], "timed-out", "{v}");
    assert_eq!(v["worktree"], "repo/t", "{v}");
    assert_eq!(v["session"], "a", "{v}");
    assert_eq!(v["timeout_secs"], 1, "{v}");
    assert_eq!(v["signal"], "SIGKILL", "{v}");
    assert!(turns_listed(&m).is_empty());
    let leases = wtfs_ok(&env.state(), &["leases"]);
    assert!(
        !leases.contains("session:a"),
        "the lease it took went: {leases}"
    );
    // A command that ends at SIGTERM is ended by it, and says so; without --json the
    // message is for people.
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--timeout",
            "1",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_eq!(o.status.code(), Some(124), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ran past its timeout of 1 s") && stderr(&o).contains("SIGTERM"),
        "{}",
        stderr(&o)
    );
    // One that finishes in time is not touched.
    let o = wtfs(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--timeout",
            "30",
            "--",
            "sh",
            "-c",
            "exit 5",
        ],
    );
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    drop(m);
}

/// Past its timeout a command that stopped itself still gets to act on SIGTERM (a SIGCONT
/// goes with it, as timeout(1) sends), instead of SIGKILL 5 s later.
#[test]
fn a_stopped_command_past_its_timeout_still_handles_sigterm() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let started = Instant::now();
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--timeout",
            "1",
            "--",
            "sh",
            "-c",
            "trap 'echo cleanup > cleanup.txt; exit 3' TERM; kill -STOP $$",
        ],
    );
    let out = bg.finish(Duration::from_secs(30));
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ended with SIGTERM"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        fs::read_to_string(m.wt("repo", "t").join("cleanup.txt")).unwrap_or_default(),
        "cleanup\n",
        "its SIGTERM trap did not run"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(m);
}

/// What a turn's command leaves running ends with the turn however it tries to outlive
/// it: a leftover's child adopted after its parent ended still gets SIGTERM first, and a
/// chain of processes each forking the next and exiting (faster than one kill round)
/// is ended all the same.
#[test]
fn leftovers_adopted_late_get_sigterm_and_a_forking_chain_cannot_outrun_the_end() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let dir = env.dir.path().join("left");
    fs::create_dir(&dir).unwrap();
    // A grandchild that handles SIGTERM: it is adopted only once its parent is gone.
    fs::write(
        dir.join("l2.sh"),
        format!(
            "exec >/dev/null 2>&1 </dev/null\ntrap 'echo term > {d}/l2.term; exit 0' TERM\necho $$ > {d}/l2.pid\nwhile :; do sleep 0.05; done\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let cmd = format!(
        "sh -c 'sh {d}/l2.sh & wait' & while [ ! -s {d}/l2.pid ]; do sleep 0.02; done; exit 0",
        d = dir.display()
    );
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sh", "-c", &cmd],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let l2: i32 = fs::read_to_string(dir.join("l2.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let l2_alive = !holders_gone(l2);
    if l2_alive {
        // SAFETY: plain kill of a leftover this test started (if the turn did not end it).
        unsafe { libc::kill(l2, libc::SIGKILL) };
    }
    assert!(!l2_alive, "the grandchild outlived the turn");
    assert!(
        dir.join("l2.term").exists(),
        "the grandchild, adopted after its parent ended, never got SIGTERM"
    );
    // The chain: each process ignores SIGTERM, forks the next and exits at once. A stop
    // file ends it in any case when the test is over.
    fs::write(
        dir.join("hop.sh"),
        format!(
            "exec >/dev/null 2>&1 </dev/null\ntrap '' TERM\n[ -e {d}/stop ] && exit 0\necho $$ >> {d}/hops\nsh {d}/hop.sh &\nsleep 0.01\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let cmd = format!("sh {d}/hop.sh & sleep 0.3; exit 0", d = dir.display());
    let started = Instant::now();
    let o = wtfs(
        &env.state(),
        &["turn", "repo/t", "--session", "a", "--", "sh", "-c", &cmd],
    );
    let took = started.elapsed();
    let hops = || {
        fs::read_to_string(dir.join("hops"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let at_end = hops();
    std::thread::sleep(Duration::from_secs(1));
    let later = hops();
    fs::write(dir.join("stop"), "").unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(at_end > 1, "the chain did not run: {at_end} hops");
    assert_eq!(
        later, at_end,
        "the chain went on after the turn ended ({took:?}): {at_end} hops then {later}"
    );
    drop(m);
}

/// `turn --report FILE` (for `worktreefs mcp`): the outcome as JSON through the file
/// opened at the start, even for a relative path once the turn is in the worktree; a
/// report that is not an existing regular file of the user's (missing, a link, a FIFO) is
/// refused at once and nothing is started.
#[test]
fn a_turns_report_is_written_through_the_file_opened_at_the_start_and_never_a_link() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let dir = env.dir.path().join("rep");
    fs::create_dir(&dir).unwrap();
    // worktreefs ARGS, run from `dir` (where relative report paths are).
    let here = |args: &[&str]| {
        std::process::Command::new(BIN)
            .arg("--state-dir")
            .arg(env.state())
            .args(args)
            .current_dir(&dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap()
    };
    let turn = |report: &str, cmd: &str| {
        here(&[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--report",
            report,
            "--",
            "sh",
            "-c",
            cmd,
        ])
    };
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(fs::read_to_string(dir.join(name)).unwrap().trim()).unwrap()
    };
    fs::write(dir.join("out.json"), "").unwrap();
    let o = turn("out.json", "touch ran; exit 5");
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(
        read("out.json"),
        serde_json::json!({"outcome": "ended", "exit_status": 5})
    );
    assert!(m.wt("repo", "t").join("ran").exists());
    assert!(
        !m.wt("repo", "t").join("out.json").exists(),
        "written in the worktree"
    );
    // A refusal goes there too, as the --json object.
    let o = here(&[
        "turn",
        "repo/nope",
        "--session",
        "a",
        "--report",
        "out.json",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(read("out.json")["error"], "not-found");
    // Not a file of the user's: refused before anything runs.
    std::os::unix::fs::symlink(dir.join("target.txt"), dir.join("link.json")).unwrap();
    fs::write(dir.join("target.txt"), "untouched").unwrap();
    nix::unistd::mkfifo(&dir.join("fifo.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (report, says) in [
        ("missing.json", "not an existing file"),
        ("link.json", "not a regular file"),
        ("fifo.json", "not a regular file"),
    ] {
        let started = Instant::now();
        let o = turn(report, "touch started-anyway");
        assert_eq!(o.status.code(), Some(1), "{report}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{report}: {}", stderr(&o));
        assert!(started.elapsed() < Duration::from_secs(10), "{report}");
    }
    assert!(!m.wt("repo", "t").join("started-anyway").exists());
    // With --json the refusal of a bad report is JSON, all stderr says.
    let o = here(&[
        "turn",
        "repo/t",
        "--session",
        "a",
        "--report",
        "missing.json",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stderr(&o)));
    assert_eq!(v["error"], "failed", "{v}");
    // A report inside the turn's own worktree is no writer there: a guarded turn starts.
    let inside = m.wt("repo", "t").join("report.json");
    fs::write(&inside, "").unwrap();
    let inside_s = inside.to_str().unwrap();
    let o = here(&[
        "turn",
        "repo/t",
        "--session",
        "a",
        "--guard",
        "--report",
        inside_s,
        "--",
        "true",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        fs::read_to_string(&inside).unwrap().trim(),
        r#"{"exit_status":0,"outcome":"ended"}"#
    );
    assert!(!dir.join("missing.json").exists());
    assert_eq!(
        fs::read_to_string(dir.join("target.txt")).unwrap(),
        "untouched"
    );
    drop(m);
}

/// `turns end` of a turn whose command ignores SIGTERM: the turn kills it 5 s after
/// passing SIGTERM on, with what it runs, so the turn ends within the wait.
#[test]
fn turns_end_of_a_command_ignoring_sigterm_kills_it_five_seconds_later() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let pids = env.dir.path().join("pids");
    let script = format!(
        "exec >/dev/null 2>&1; trap '' TERM; sleep 600 & echo $$ $! > {}; wait",
        pids.display()
    );
    let bg = Background::start(
        &env.state(),
        &[
            "turn",
            "repo/t",
            "--session",
            "a",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_until("the command runs", Duration::from_secs(20), || {
        fs::read_to_string(&pids).is_ok_and(|p| p.split_whitespace().count() == 2)
    });
    let started = Instant::now();
    let o = wtfs(
        &env.state(),
        &[
            "turns",
            "end",
            "repo/t",
            "--session",
            "a",
            "--wait",
            "20",
            "--json",
        ],
    );
    let took = started.elapsed();
    let out = bg.finish(Duration::from_secs(30));
    let procs: Vec<i32> = fs::read_to_string(&pids)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let left: Vec<i32> = procs
        .iter()
        .copied()
        .filter(|p| !holders_gone(*p))
        .collect();
    for p in &left {
        // SAFETY: plain kill of a process this test's turn started.
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(15)).contains(&took),
        "turns end took {took:?}"
    );
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    assert!(left.is_empty(), "{left:?} outlived the turn");
    drop(m);
}
