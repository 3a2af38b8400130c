//! A repository's setup command, run in each new worktree by the daemon: as the
//! worktree's owner with the owner's environment, its output in a log, its state in
//! `list`, what `run` and `turn` do about it, its limit, and what it left running.

use std::fs;
use std::time::{Duration, Instant};

use crate::common::*;

/// The worktree's setup run as `list --json` shows it (null: none).
fn setup_of(env: &Env, name: &str) -> serde_json::Value {
    listed(env, name)
        .map(|w| w["setup"].clone())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until the setup of `name` has ended, and returns it.
fn ended_setup(env: &Env, name: &str, limit: Duration) -> serde_json::Value {
    let end = Instant::now() + limit;
    loop {
        let s = setup_of(env, name);
        if matches!(s["state"].as_str(), Some("ok" | "failed")) {
            return s;
        }
        assert!(
            Instant::now() < end,
            "the setup of {name} did not end within {limit:?}: {s}; log:\n{}",
            String::from_utf8_lossy(
                &wtfs(&env.state(), &["setup-log", &format!("repo/{name}")]).stdout
            )
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn set_setup(env: &Env, args: &[&str]) {
    let mut all = vec!["repo", "set", "repo"];
    all.extend_from_slice(args);
    wtfs_ok(&env.state(), &all);
}

/// Where a teardown test's command writes: `{o}` in `command` (the command of
/// `--on-remove`, with `extra` options of `repo set`) is this directory.
fn set_teardown(env: &Env, command: &str, extra: &[&str]) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let command = command.replace("{o}", &out.path().display().to_string());
    let mut args = vec!["--on-remove", command.as_str()];
    args.extend_from_slice(extra);
    set_setup(env, &args);
    out
}

/// What worktree `name`'s teardown wrote to `<out>/<name>.read` (empty: nothing).
fn teardown_read(out: &tempfile::TempDir, name: &str) -> String {
    fs::read_to_string(out.path().join(format!("{name}.read"))).unwrap_or_default()
}

fn code(o: &std::process::Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A worktree made by `mkdir` runs the setup; in one of nobody's it runs as nobody, with
/// nobody's HOME and the worktree's variables and nothing of the daemon's environment;
/// its output is in the log (CLI and `.control`), `list` says `ok`, the worktree is
/// `ready` afterwards, and what the command left running in the background is ended.
#[test]
fn a_new_worktree_runs_the_setup_as_its_owner_and_is_ready_after() {
    let env = Env::new();
    set_setup(
        &env,
        &[
            "--on-create",
            "echo to-out; echo to-err >&2; \
             printf '%s|%s|%s|%s|%s\\n' \"$(id -u)\" \"$HOME\" \"$WORKTREEFS_WORKTREE\" \"$WORKTREEFS_PORT\" \"${LEAKED:-none}\" > seen.txt; \
             sleep 300 & echo $! > bg.pid",
        ],
    );
    create_owned_by(&env, "w", NOBODY, false);
    // What it writes is ignored: the worktree is `ready` after it (work a setup leaves
    // retains the worktree; see a_setup_that_leaves_work_retains_its_worktree_with_the_reason).
    fs::write(
        env.repo.path().join(".git/info/exclude"),
        "seen.txt\nbg.pid\n",
    )
    .unwrap();
    let m = Mounted::start_with_envs(
        &env.state(),
        &env.mountpoint(),
        &["--linger", "600", "--allow-other"],
        &[("LEAKED", std::ffi::OsStr::new("from-the-daemon"))],
    );
    // Made by mkdir (as root, who owns the repository): its setup runs.
    fs::create_dir(m.mountpoint.join("repo/m")).unwrap();
    assert_eq!(
        ended_setup(&env, "m", Duration::from_secs(30))["state"],
        "ok"
    );
    // One of nobody's, its setup run (again) by `worktreefs setup`: as nobody.
    let o = wtfs(&env.state(), &["setup", "repo/w"]);
    assert_eq!(
        code(&o),
        0,
        "{}{}",
        text(&o),
        wtfs_ok(&env.state(), &["setup-log", "repo/w"])
    );
    let s = ended_setup(&env, "w", Duration::from_secs(30));
    assert_eq!(s["state"], "ok", "{s}");
    assert_eq!(s["summary"], "ok");
    assert_eq!(s["exit_code"], 0);
    assert_eq!(state_of(&env, "w"), "ready", "setup starts no lifecycle");
    let wt = m.wt("repo", "w");
    let port: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["env", "repo/w", "--json"])).unwrap();
    let nobody_home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(NOBODY))
        .unwrap()
        .unwrap()
        .dir;
    assert_eq!(
        fs::read_to_string(wt.join("seen.txt")).unwrap(),
        format!(
            "{NOBODY}|{}|repo/w|{}|none\n",
            nobody_home.display(),
            port["port"]
        )
    );
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/w"]);
    assert!(log.contains("to-out") && log.contains("to-err"), "{log}");
    assert!(log.contains("ended") && log.contains(": ok;"), "{log}");
    let through_control =
        fs::read_to_string(m.mountpoint.join(".control/setup-log/repo:w")).unwrap();
    assert_eq!(through_control, log);
    // Its owner reads it by name; another's log and the listing are not theirs to read.
    let control = m.mountpoint.join(".control/setup-log");
    let own = as_nobody(&control, "cat repo:w");
    assert_eq!(String::from_utf8_lossy(&own.stdout), log, "{}", text(&own));
    let other = as_nobody(&control, "cat repo:m");
    assert!(!other.status.success(), "{}", text(&other));
    let listed = as_nobody(&control, "ls .");
    assert!(!listed.status.success(), "{}", text(&listed));
    // What it left running went with it (as a turn's leftovers do).
    let bg: i32 = fs::read_to_string(wt.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until(
        "the setup's background process to end",
        Duration::from_secs(10),
        || {
            fs::read_to_string(format!("/proc/{bg}/cmdline"))
                .map(|c| !c.contains("sleep"))
                .unwrap_or(true)
        },
    );
    let list = wtfs_ok(&env.state(), &["list"]);
    assert!(list.contains("SETUP") && list.contains(" ok"), "{list}");
    m.unmount();
}

/// A setup that fails leaves the worktree in place, marked: `new --wait-setup` exits
/// with its code, `run` and `turn` are refused (`setup-failed`, exit 3, JSON too) until
/// `--ignore-setup`, and `worktreefs setup` runs it again.
#[test]
fn a_failed_setup_marks_the_worktree_and_refuses_commands_until_ignored_or_fixed() {
    let env = Env::new();
    set_setup(&env, &["--on-create", "echo broken >&2; exit 7"]);
    let m = env.mount_with(&["--linger", "600"]);
    let o = wtfs(&env.state(), &["new", "repo/f", "--wait-setup"]);
    assert_eq!(code(&o), 7, "{}", text(&o));
    assert!(text(&o).contains("failed (exit 7)"), "{}", text(&o));
    assert_eq!(state_of(&env, "f"), "ready");
    assert!(m.wt("repo", "f").join("README.md").exists());
    assert_eq!(setup_of(&env, "f")["summary"], "failed (exit 7)");
    assert!(wtfs_ok(&env.state(), &["setup-log", "repo/f"]).contains("broken"));

    let o = wtfs(&env.state(), &["run", "repo/f", "--", "true"]);
    assert_eq!(code(&o), 3, "{}", text(&o));
    assert!(text(&o).contains("--ignore-setup"), "{}", text(&o));
    let o = wtfs(&env.state(), &["run", "repo/f", "--json", "--", "true"]);
    let refusal: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(refusal["error"], "setup-failed", "{refusal}");
    assert_eq!(refusal["setup"]["exit_code"], 7);
    let o = wtfs(
        &env.state(),
        &["turn", "repo/f", "--session", "s", "--", "true"],
    );
    assert_eq!(code(&o), 3, "{}", text(&o));
    wtfs_ok(
        &env.state(),
        &["run", "repo/f", "--ignore-setup", "--", "true"],
    );
    wtfs_ok(
        &env.state(),
        &[
            "turn",
            "repo/f",
            "--session",
            "s",
            "--ignore-setup",
            "--",
            "true",
        ],
    );

    // Fixed and run again: commands go ahead.
    set_setup(&env, &["--on-create", "echo fixed > fixed.txt"]);
    let o = wtfs(&env.state(), &["setup", "repo/f"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert_eq!(setup_of(&env, "f")["state"], "ok");
    assert_eq!(
        wtfs_ok(&env.state(), &["run", "repo/f", "--", "cat", "fixed.txt"]),
        "fixed\n"
    );
    m.unmount();
}

/// `run` waits for a setup that is running (its files are there when the command
/// starts), `--no-wait-setup` does not; a setup past its limit is ended and said so.
#[test]
fn run_waits_for_a_running_setup_and_one_past_its_limit_is_ended() {
    let env = Env::new();
    set_setup(&env, &["--on-create", "sleep 2; echo done > done.txt"]);
    let m = env.mount_with(&["--linger", "600"]);
    wtfs_ok(&env.state(), &["new", "repo/a"]);
    assert_eq!(
        wtfs_ok(&env.state(), &["run", "repo/a", "--", "cat", "done.txt"]),
        "done\n"
    );
    wtfs_ok(&env.state(), &["new", "repo/b"]);
    let t = Instant::now();
    let o = wtfs(
        &env.state(),
        &[
            "run",
            "repo/b",
            "--no-wait-setup",
            "--",
            "test",
            "!",
            "-e",
            "done.txt",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        t.elapsed() < Duration::from_millis(1800),
        "{:?}",
        t.elapsed()
    );

    set_setup(&env, &["--on-create", "sleep 100", "--setup-timeout", "1"]);
    let t = Instant::now();
    let o = wtfs(&env.state(), &["new", "repo/c", "--wait-setup"]);
    assert_ne!(code(&o), 0, "{}", text(&o));
    assert!(text(&o).contains("timed out after 1 s"), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(state_of(&env, "c"), "ready");
    m.unmount();
}

/// Without a mount the run is queued (`new` says so, `--wait-setup` refuses at once) and
/// starts at the next mount; `--no-setup` runs none; two `setup` commands at once share
/// one run; bad input is refused naming a way out and changes nothing.
#[test]
fn a_setup_queued_without_a_mount_runs_at_the_next_and_bad_input_is_refused() {
    let env = Env::new();
    set_setup(&env, &["--on-create", "echo queued > q.txt"]);
    let o = wtfs(&env.state(), &["new", "repo/q"]);
    assert!(
        text(&o).contains("runs once the state dir is mounted"),
        "{}",
        text(&o)
    );
    let o = wtfs(&env.state(), &["new", "repo/r", "--wait-setup"]);
    assert_ne!(code(&o), 0);
    assert!(text(&o).contains("worktreefs mount"), "{}", text(&o));
    let o = wtfs(&env.state(), &["new", "repo/n", "--no-setup"]);
    assert!(text(&o).contains("not run (--no-setup"), "{}", text(&o));
    assert_eq!(setup_of(&env, "n"), serde_json::Value::Null);

    let m = env.mount_with(&["--linger", "600"]);
    assert_eq!(
        ended_setup(&env, "q", Duration::from_secs(30))["state"],
        "ok"
    );
    assert_eq!(
        fs::read_to_string(m.wt("repo", "q").join("q.txt")).unwrap(),
        "queued\n"
    );
    // Two at once: one run, both wait for it and exit with it.
    set_setup(&env, &["--on-create", "sleep 1; echo x >> runs.txt"]);
    let state = env.state();
    let twice: Vec<_> = (0..2)
        .map(|_| {
            let state = state.clone();
            std::thread::spawn(move || wtfs(&state, &["setup", "repo/n"]))
        })
        .collect();
    for t in twice {
        let o = t.join().unwrap();
        assert_eq!(code(&o), 0, "{}", text(&o));
    }
    let runs = fs::read_to_string(m.wt("repo", "n").join("runs.txt")).unwrap();
    assert!(runs == "x\n" || runs == "x\nx\n", "{runs:?}");

    // Bad input.
    let o = wtfs(&env.state(), &["repo", "set", "repo", "--on-create", " "]);
    assert_ne!(code(&o), 0);
    assert!(text(&o).contains("--no-on-create"), "{}", text(&o));
    let o = wtfs(
        &env.state(),
        &["repo", "set", "repo", "--setup-timeout", "0"],
    );
    assert_ne!(code(&o), 0);
    let repo: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["repo", "list", "--json"])).unwrap();
    assert_eq!(repo[0]["on_create"], "sleep 1; echo x >> runs.txt");
    set_setup(&env, &["--no-on-create"]);
    let o = wtfs(&env.state(), &["setup", "repo/n"]);
    assert_ne!(code(&o), 0);
    assert!(text(&o).contains("--on-create CMD"), "{}", text(&o));
    let o = wtfs(&env.state(), &["setup-log", "repo/q2"]);
    assert_ne!(code(&o), 0);
    m.unmount();
}

/// A removal runs the repository's teardown command first, in the worktree (its files
/// and ports there), as its owner, while nobody else may enter; it is bounded, and its
/// failure or timeout is logged and the removal goes on. Through reclaim, rmdir and the
/// cleanup after the last lease alike.
#[test]
fn a_removal_runs_the_teardown_in_the_worktree_first_and_goes_on_whatever_it_does() {
    let env = Env::new();
    let out = set_teardown(
        &env,
        "cat README.md > {o}/$(basename $PWD).read; echo $WORKTREEFS_PORT > {o}/$(basename $PWD).port; \
                 touch {o}/$(basename $PWD).begun; sleep 2; echo later > {o}/$(basename $PWD).done",
        &[],
    );
    let m = env.mount_with(&["--linger", "1"]);
    for name in ["t", "r", "c"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    }
    let port: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["env", "repo/t", "--json"])).unwrap();
    // reclaim: while the teardown runs, nobody else gets in.
    let state = env.state();
    let reclaim = std::thread::spawn(move || wtfs(&state, &["reclaim", "repo/t"]));
    wait_until("the teardown has begun", Duration::from_secs(20), || {
        out.path().join("t.begun").exists()
    });
    let wrote = fs::write(m.wt("repo", "t").join("intruder"), "x");
    assert!(wrote.is_err(), "wrote into a worktree being torn down");
    let read = fs::read(m.wt("repo", "t").join("README.md"));
    assert!(read.is_err(), "entered a worktree being torn down");
    let o = reclaim.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        fs::read_to_string(out.path().join("t.read")).unwrap(),
        fs::read_to_string(env.repo.path().join("README.md")).unwrap()
    );
    assert_eq!(
        fs::read_to_string(out.path().join("t.port")).unwrap(),
        format!("{}\n", port["port"])
    );
    assert!(
        out.path().join("t.done").exists(),
        "the removal did not wait"
    );
    assert_eq!(state_of(&env, "t"), "removed");
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/t"]);
    assert!(
        log.contains("teardown of repo/t") && log.contains(": ok"),
        "{log}"
    );
    // rmdir: answered once the worktree is found removable (the kernel holds the
    // repository directory meanwhile, which the teardown's way in needs); the teardown
    // and the removal follow.
    fs::remove_dir(m.wt("repo", "r")).unwrap();
    wait_for_state(&env, "r", "removed", Duration::from_secs(30));
    assert!(out.path().join("r.done").exists());
    // The cleanup after the last lease (a run came and went).
    wtfs_ok(&env.state(), &["run", "repo/c", "--", "true"]);
    wait_for_state(&env, "c", "removed", Duration::from_secs(40));
    assert!(out.path().join("c.done").exists());

    // One that fails and one past its limit: the removal goes on.
    set_setup(
        &env,
        &["--on-remove", "sleep 100", "--teardown-timeout", "1"],
    );
    wtfs_ok(&env.state(), &["new", "repo/slow"]);
    let t = Instant::now();
    let o = wtfs(&env.state(), &["reclaim", "repo/slow"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    assert!(wtfs_ok(&env.state(), &["setup-log", "repo/slow"]).contains("timed out"));
    set_setup(&env, &["--on-remove", "exit 9"]);
    wtfs_ok(&env.state(), &["new", "repo/bad"]);
    let o = wtfs(&env.state(), &["reclaim", "repo/bad"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(state_of(&env, "bad"), "removed");
    assert!(wtfs_ok(&env.state(), &["setup-log", "repo/bad"]).contains("failed (exit 9)"));
    m.unmount();
}

/// The pid of worktree `name`'s setup runner, from its lease.
fn runner_pid(env: &Env, name: &str) -> Option<i32> {
    let leases: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["leases", "--json"])).unwrap();
    leases.as_array().unwrap().iter().find_map(|l| {
        (l["worktree"] == format!("repo/{name}")
            && l["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("worktreefs setup")))
        .then(|| l["pid"].as_i64().unwrap() as i32)
    })
}

/// A runner killed mid-setup: what it started goes with it, its run fails saying so, and
/// the worktree is `ready` (its lease passed to nobody, no cleanup started, even with a
/// grace period of a second).
#[test]
fn a_runner_killed_mid_setup_fails_its_run_and_leaves_the_worktree_ready() {
    let env = Env::new();
    set_setup(&env, &["--on-create", "sleep 60 & sleep 60"]);
    let m = env.mount_with(&["--linger", "1"]);
    wtfs_ok(&env.state(), &["new", "repo/k"]);
    let mut pid = None;
    wait_until(
        "the runner to take its lease",
        Duration::from_secs(20),
        || {
            pid = runner_pid(&env, "k");
            pid.is_some()
        },
    );
    let pid = pid.unwrap();
    // SAFETY: plain kill of the runner this test's daemon started for it.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let s = ended_setup(&env, "k", Duration::from_secs(20));
    assert_eq!(s["state"], "failed", "{s}");
    assert!(
        s["summary"]
            .as_str()
            .unwrap()
            .contains("before it could say"),
        "{s}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(state_of(&env, "k"), "ready");
    let listed: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    assert_eq!(listed[0]["processes_inside"], 0, "{listed}");
    m.unmount();
}

/// What the command gets of the runner: its standard streams and nothing else open; and
/// a command that prints more than a log keeps has the rest counted, not kept.
#[test]
fn a_setup_command_holds_nothing_of_the_daemons_and_its_log_is_bounded() {
    let env = Env::new();
    set_setup(&env, &["--on-create", "exec ls -1 /proc/self/fd"]);
    let m = env.mount_with(&["--linger", "600"]);
    wtfs_ok(&env.state(), &["new", "repo/fds", "--wait-setup"]);
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/fds"]);
    let fds: Vec<&str> = log
        .lines()
        .filter(|l| !l.starts_with("worktreefs:"))
        .collect();
    // ls's own: its standard streams and the directory it reads.
    assert_eq!(fds, ["0", "1", "2", "3"], "{log}");

    set_setup(
        &env,
        &[
            "--on-create",
            "head -c 20000000 /dev/zero | tr '\\000' x; echo; echo the-end",
        ],
    );
    wtfs_ok(&env.state(), &["new", "repo/big", "--wait-setup"]);
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/big"]);
    assert!(log.len() < 2 << 20, "{}", log.len());
    assert!(
        log.starts_with("[worktreefs: the first "),
        "{}",
        &log[..200]
    );
    assert!(
        log.contains("more bytes of output were not kept"),
        "{}",
        &log[log.len() - 300..]
    );
    let through_control =
        fs::read_to_string(m.mountpoint.join(".control/setup-log/repo:big")).unwrap();
    assert_eq!(through_control.len(), log.len());
    m.unmount();
}

/// A teardown that commits: the removal does not go on (what it committed was never
/// inspected), and says why; `new --wait-setup` with nothing mounted makes nothing.
#[test]
fn a_teardown_that_moves_head_keeps_the_worktree_and_a_wait_without_a_mount_makes_nothing() {
    let env = Env::new();
    set_setup(
        &env,
        &[
            "--on-remove",
            "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m late",
        ],
    );
    let m = env.mount_with(&["--linger", "600"]);
    wtfs_ok(&env.state(), &["new", "repo/h"]);
    let o = wtfs(&env.state(), &["reclaim", "repo/h"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("moved HEAD"), "{}", text(&o));
    assert_ne!(state_of(&env, "h"), "removed");
    let log = git(&m.wt("repo", "h"), &["log", "--format=%s", "-1"]);
    assert_eq!(log.trim(), "late");
    m.unmount();

    set_setup(&env, &["--no-on-remove", "--on-create", "true"]);
    let o = wtfs(&env.state(), &["new", "repo/nowait", "--wait-setup"]);
    assert_ne!(code(&o), 0);
    assert!(text(&o).contains("nothing was made"), "{}", text(&o));
    let listed = wtfs_ok(&env.state(), &["list", "--json"]);
    assert!(!listed.contains("nowait"), "{listed}");
}

/// A teardown that takes a while holds up nothing else the daemon does: a setup queued
/// meanwhile starts and ends at once.
#[test]
fn a_long_teardown_holds_up_no_setup() {
    let env = Env::new();
    set_setup(&env, &["--on-remove", "sleep 8", "--on-create", "true"]);
    let m = env.mount_with(&["--linger", "600"]);
    wtfs_ok(&env.state(), &["new", "repo/slow", "--no-setup"]);
    // rmdir leaves the teardown and the removal to the daemon's cleanup.
    fs::remove_dir(m.wt("repo", "slow")).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let o = wtfs(&env.state(), &["new", "repo/quick", "--wait-setup"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    wait_for_state(&env, "slow", "removed", Duration::from_secs(30));
    m.unmount();
}

/// `worktreefs unmount` cleans up the worktrees with a teardown command while the mount
/// still serves them: their teardowns run inside them side by side (each begins before
/// any ends), each bounded by its limit; `--keep-sessions` leaves one a named lease
/// holds, `--lazy` one a process is in (left `deleting` once it leaves, for the next
/// mount, which runs its teardown first), and a full unmount (here a SIGTERM's) tears the
/// session's down too.
#[test]
fn an_unmount_runs_the_teardowns_together_while_the_mount_still_serves() {
    let env = Env::new();
    let out = set_teardown(
        &env,
        "n=$(basename $PWD); cat README.md > {o}/$n.read; touch {o}/$n.begun; \
                 case $n in slow*) sleep 100;; *) sleep 5;; esac; touch {o}/$n.done",
        &["--teardown-timeout", "10"],
    );
    let m = env.mount_with(&["--linger", "600"]);
    for name in ["a", "b", "slow1", "slow2", "kept", "fresh", "busy"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    }
    // Lingering after a visit; `kept` held by a session; `fresh` never entered (`ready`,
    // which no unmount cleans up).
    for name in ["a", "b", "slow1", "slow2"] {
        wtfs_ok(
            &env.state(),
            &["run", &format!("repo/{name}"), "--", "true"],
        );
    }
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/kept", "--session", "s"],
    );
    let mut inside = sit_in(&m.wt("repo", "busy"));
    wait_for_state(&env, "busy", "active", Duration::from_secs(10));
    let t = Instant::now();
    let u = wtfs(&env.state(), &["unmount", "--keep-sessions", "--lazy"]);
    let took = t.elapsed();
    let _ = inside.kill();
    let _ = inside.wait();
    assert!(u.status.success(), "{}\n{}", text(&u), m.log_tail());
    assert!(!text(&u).contains("warning"), "{}", text(&u));
    assert!(text(&u).contains("detached"), "{}", text(&u));
    m.unmount();
    // The one a process was in: its cleanup waits for a mount to run its teardown.
    assert!(!out.path().join("busy.begun").exists());
    assert_eq!(state_of(&env, "busy"), "deleting");
    let readme = fs::read_to_string(env.repo.path().join("README.md")).unwrap();
    for name in ["a", "b", "slow1", "slow2"] {
        assert_eq!(
            teardown_read(&out, name),
            readme,
            "{name}'s teardown did not read its worktree"
        );
        assert_eq!(state_of(&env, name), "removed", "{name}");
    }
    // Side by side: every teardown had begun before the quick ones ended.
    let begun = |n: &str| {
        fs::metadata(out.path().join(format!("{n}.begun")))
            .unwrap()
            .modified()
            .unwrap()
    };
    let ended = |n: &str| {
        fs::metadata(out.path().join(format!("{n}.done")))
            .unwrap()
            .modified()
            .unwrap()
    };
    for quick in ["a", "b"] {
        for other in ["a", "b", "slow1", "slow2"] {
            assert!(
                begun(other) <= ended(quick),
                "{other} began after {quick} ended"
            );
        }
    }
    // The slow ones were ended at their limit, together: not 10 s each.
    assert!(!out.path().join("slow1.done").exists());
    assert!(took < Duration::from_secs(40), "{took:?}");
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/slow1"]);
    assert!(log.contains("timed out"), "{log}");
    for name in ["kept", "fresh"] {
        assert!(!out.path().join(format!("{name}.begun")).exists(), "{name}");
    }
    assert_eq!(state_of(&env, "kept"), "active");
    assert_eq!(state_of(&env, "fresh"), "ready");

    // The next mount's cleanup runs the waiting one's teardown, inside it, then removes
    // it.
    let m = env.mount_with(&["--linger", "600"]);
    wait_for_state(&env, "busy", "removed", Duration::from_secs(30));
    assert_eq!(
        fs::read_to_string(out.path().join("busy.read")).unwrap_or_default(),
        readme
    );
    // A SIGTERM's unmount is a reclaim: the session's lease goes, its teardown runs.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mountpoint = m.mountpoint.clone();
    let end = Instant::now() + Duration::from_secs(60);
    while is_mounted(&mountpoint) {
        assert!(Instant::now() < end, "still mounted: {}", m.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = m.log_tail();
    m.unmount();
    assert!(out.path().join("kept.done").exists(), "{log}");
    assert_eq!(state_of(&env, "kept"), "removed");
    assert_eq!(state_of(&env, "fresh"), "ready");
}

/// A removal with a teardown command never goes without it: `reclaim` with nothing
/// mounted is refused (`not-mounted`), leaving the worktree as it was; at a mount, a
/// worktree a daemon that died left `deleting` and a retained one found clean since are
/// removed once the mount serves them, their teardowns run inside them first.
#[test]
fn a_removal_with_a_teardown_waits_for_a_mount_to_run_it() {
    let env = Env::new();
    let out = set_teardown(&env, "cat README.md > {o}/$(basename $PWD).read", &[]);
    for name in ["idle", "marked", "settled"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    }
    let r = wtfs(&env.state(), &["reclaim", "repo/idle", "--json"]);
    assert_eq!(code(&r), 1, "{}", text(&r));
    let said: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(said["error"], "not-mounted", "{said}");
    assert!(
        text(&r).contains("worktreefs mount") && text(&r).contains("--no-on-remove"),
        "{}",
        text(&r)
    );
    assert_eq!(state_of(&env, "idle"), "ready");
    // What a daemon that died left, and a worktree retained before and clean now.
    let db = rusqlite::Connection::open(env.state().join("worktreefs.db")).unwrap();
    for (name, state) in [("marked", "deleting"), ("settled", "retained")] {
        let id = listed(&env, name).unwrap()["id"].as_i64().unwrap();
        db.execute(
            "UPDATE worktrees SET state = ?1 WHERE id = ?2",
            rusqlite::params![state, id],
        )
        .unwrap();
    }
    drop(db);
    let m = env.mount();
    let readme = fs::read_to_string(env.repo.path().join("README.md")).unwrap();
    for name in ["marked", "settled"] {
        wait_for_state(&env, name, "removed", Duration::from_secs(30));
        assert_eq!(
            teardown_read(&out, name),
            readme,
            "{name}: its teardown did not run inside it: {}",
            m.log_tail()
        );
    }
    let r = wtfs(&env.state(), &["reclaim", "repo/idle"]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(out.path().join("idle.read").exists());
    m.unmount();
}

/// A setup that leaves work cleanup would keep (a changed tracked file, a new file nothing
/// ignores) retains the new worktree with the reason rather than leaving it `ready`; a
/// later lease makes it active as any retained worktree. One whose leavings are ignored
/// leaves it `ready`.
#[test]
fn a_setup_that_leaves_work_retains_its_worktree_with_the_reason() {
    let env = Env::new();
    fs::write(env.repo.path().join(".git/info/exclude"), "build/\n").unwrap();
    set_setup(
        &env,
        &[
            "--on-create",
            "echo more >> README.md; mkdir -p build; echo x > build/out",
        ],
    );
    let m = env.mount_with(&["--linger", "600"]);
    let o = wtfs(&env.state(), &["new", "repo/dirty", "--wait-setup"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(state_of(&env, "dirty"), "retained");
    let retained = wtfs_ok(&env.state(), &["retained", "--json"]);
    assert!(
        retained.contains("its setup command left work") && retained.contains("README.md"),
        "{retained}"
    );
    let log = wtfs_ok(&env.state(), &["setup-log", "repo/dirty"]);
    assert!(
        log.contains("the worktree is retained (what the setup left"),
        "{log}"
    );
    wtfs_ok(&env.state(), &["run", "repo/dirty", "--", "true"]);
    assert_ne!(state_of(&env, "dirty"), "retained");

    set_setup(&env, &["--on-create", "mkdir -p build; echo x > build/out"]);
    let o = wtfs(&env.state(), &["new", "repo/tidy", "--wait-setup"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(state_of(&env, "tidy"), "ready");
    assert!(m.wt("repo", "tidy").join("build/out").exists());
    // Only what the command left: a fork of a changed worktree holds its parent's work
    // before its setup runs, and is not retained for it.
    wtfs_ok(&env.state(), &["new", "repo/parent", "--no-setup"]);
    fs::write(m.wt("repo", "parent").join("notes.txt"), "mine\n").unwrap();
    let o = wtfs(
        &env.state(),
        &["new", "repo/child", "--from", "repo/parent", "--wait-setup"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(state_of(&env, "child"), "ready");
    assert_eq!(
        fs::read_to_string(m.wt("repo", "child").join("notes.txt")).unwrap(),
        "mine\n"
    );
    // A restore says that it runs none.
    wtfs_ok(&env.state(), &["reclaim", "repo/tidy"]);
    let said = wtfs_ok(&env.state(), &["restore", "repo/tidy", "--json"]);
    assert!(
        said.contains("is not run: a restore brings back what the worktree held"),
        "{said}"
    );
    m.unmount();
}

/// An unmount the daemon learns of only once the mount has gone (`umount`): a worktree
/// found removable is left `deleting` for the next mount, which runs its teardown first;
/// one that holds work is retained as ever. With nothing mounted, `reclaim` of one left
/// so is refused while its repository has a teardown, and finishes it once it has none.
#[test]
fn after_a_bare_umount_a_removal_with_a_teardown_waits_for_the_next_mount() {
    let env = Env::new();
    let out = set_teardown(&env, "cat README.md > {o}/$(basename $PWD).read", &[]);
    let m = env.mount_with(&["--linger", "600"]);
    for name in ["clean", "dirty", "later"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
        wtfs_ok(
            &env.state(),
            &["run", &format!("repo/{name}"), "--", "true"],
        );
    }
    wtfs_ok(
        &env.state(),
        &[
            "run",
            "repo/dirty",
            "--",
            "sh",
            "-c",
            "echo mine > work.txt",
        ],
    );
    let mountpoint = m.mountpoint.clone();
    nix::mount::umount2(&mountpoint, nix::mount::MntFlags::empty()).unwrap();
    m.unmount();
    assert_eq!(state_of(&env, "clean"), "deleting");
    assert_eq!(state_of(&env, "later"), "deleting");
    assert_eq!(state_of(&env, "dirty"), "retained");
    assert!(!out.path().join("clean.read").exists());
    // With nothing mounted: refused while the teardown is there.
    let r = wtfs(&env.state(), &["reclaim", "repo/later", "--json"]);
    assert_eq!(code(&r), 1, "{}", text(&r));
    assert!(text(&r).contains("not-mounted"), "{}", text(&r));
    // The next mount: teardown, then removal.
    let m = env.mount_with(&["--linger", "600"]);
    wait_for_state(&env, "clean", "removed", Duration::from_secs(30));
    assert_eq!(
        fs::read_to_string(out.path().join("clean.read")).unwrap_or_default(),
        fs::read_to_string(env.repo.path().join("README.md")).unwrap()
    );
    wait_for_state(&env, "later", "removed", Duration::from_secs(30));
    // Left again by a bare umount, then its teardown taken away: `reclaim` finishes it.
    wtfs_ok(&env.state(), &["new", "repo/again"]);
    wtfs_ok(&env.state(), &["run", "repo/again", "--", "true"]);
    nix::mount::umount2(&mountpoint, nix::mount::MntFlags::empty()).unwrap();
    m.unmount();
    assert_eq!(state_of(&env, "again"), "deleting");
    set_setup(&env, &["--no-on-remove"]);
    let r = wtfs(&env.state(), &["reclaim", "repo/again"]);
    assert!(r.status.success(), "{}", text(&r));
    assert_eq!(state_of(&env, "again"), "removed");
    assert!(!out.path().join("again.read").exists());
}

/// A cleanup round of the daemon's under way when the mount is detached (`umount -l`
/// during a teardown): the teardown under way finishes inside its worktree and the
/// removal follows; the rest wait `deleting` for the next mount, which tears them down
/// first (the detached mount lives on meanwhile: a process is in another worktree).
#[test]
fn a_cleanup_round_cut_off_by_a_lazy_umount_leaves_the_rest_for_the_next_mount() {
    let env = Env::new();
    let out = set_teardown(
        &env,
        "n=$(basename $PWD); touch {o}/$n.begun; sleep 3; cat README.md > {o}/$n.read",
        &[],
    );
    let m = env.mount_with(&["--linger", "600"]);
    for name in ["first", "second", "third"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    }
    let mut inside = sit_in(&m.wt("repo", "third"));
    fs::remove_dir(m.wt("repo", "first")).unwrap();
    wait_until("the first teardown begins", Duration::from_secs(20), || {
        out.path().join("first.begun").exists()
    });
    fs::remove_dir(m.wt("repo", "second")).unwrap();
    let mountpoint = m.mountpoint.clone();
    nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH).unwrap();
    // The first teardown ends (3 s); the daemon serves the detached mount for a while
    // after.
    wait_until("the first teardown ends", Duration::from_secs(20), || {
        out.path().join("first.read").exists()
    });
    std::thread::sleep(Duration::from_secs(3));
    let _ = inside.kill();
    let _ = inside.wait();
    let log = m.log_tail();
    m.unmount();
    let readme = fs::read_to_string(env.repo.path().join("README.md")).unwrap();
    assert_eq!(
        fs::read_to_string(out.path().join("first.read")).unwrap_or_default(),
        readme,
        "{log}"
    );
    assert_eq!(state_of(&env, "first"), "removed");
    assert_eq!(state_of(&env, "second"), "deleting");
    assert!(!out.path().join("second.begun").exists());
    let m = env.mount_with(&["--linger", "600"]);
    wait_for_state(&env, "second", "removed", Duration::from_secs(30));
    assert_eq!(
        fs::read_to_string(out.path().join("second.read")).unwrap_or_default(),
        readme
    );
    m.unmount();
}
