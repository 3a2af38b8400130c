//! `worktreefs turn`: a command run as a session's turn, one turn at a time per
//! worktree; its guard, its timeout and its `--report` file.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::process::supervise::{exit_code, run_below, signal_name, Below, Ended};
use worktreefs::process::tree;
use worktreefs::report;
use worktreefs::report::shapes;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::acquire::{acquire_named, Want, WAIT_POLL};
use crate::cli::exit::{exit_as, Failed, Status};
use crate::cli::refusals::{not_mounted, runnable_worktree};
use crate::cli::report_file::write_report;
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct TurnArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount (default: the
    /// worktree the current directory is in).
    pub target: Option<String>,
    /// The orchestrator's session id the turn is for.
    #[arg(long)]
    pub session: String,
    /// The filesystem refuses (EBUSY) every change inside the worktree by a process
    /// outside the turn's process tree while it runs; reads stay open. Does not start
    /// while processes outside it have files there open for writing.
    #[arg(long)]
    pub guard: bool,
    /// When another turn runs (or, with --guard, processes outside write files there),
    /// wait up to SECS for it to end.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// End the command when it runs longer than SECS: SIGTERM, then SIGKILL 5 s later
    /// if it is still there (and what it left running ends with the turn); the turn
    /// then exits 124, as timeout(1) does.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
    /// A refusal (and a timeout) as JSON on stderr (the command's stdout stays its own).
    #[arg(long)]
    pub json: bool,
    /// Take no checkpoint when the turn starts (by default one is, labelled `turn
    /// SESSION`: `worktreefs rewind` brings the worktree back to it).
    #[arg(long)]
    pub no_checkpoint: bool,
    /// Also write the turn's outcome as one JSON object into FILE, apart from the
    /// command's output: the refusal or failure, `timed-out`, or `ended` with the exit
    /// status (for `worktreefs mcp`).
    #[arg(long, value_name = "FILE", hide = true)]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub setup: crate::cli::commands::setup::SetupGateArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(state: &StateDir, args: TurnArgs) -> Result<(), Failed> {
    let TurnArgs {
        target,
        session,
        guard,
        wait,
        timeout,
        json,
        command,
        setup,
        no_checkpoint,
        ..
    } = args;
    let target = which(state, target.as_deref(), false)?;
    let ask = TurnAsk {
        session: &session,
        guard,
        wait,
        timeout,
        json,
        setup,
        checkpoint: !no_checkpoint,
    };
    cmd_turn(state, &target, &ask, &command)
}

/// What `turn` asks.
struct TurnAsk<'a> {
    session: &'a str,
    guard: bool,
    wait: Option<u64>,
    /// Seconds the command may run (`--timeout`).
    timeout: Option<u64>,
    json: bool,
    setup: crate::cli::commands::setup::SetupGateArgs,
    /// Take a checkpoint as it starts.
    checkpoint: bool,
}

/// The checkpoint a turn takes as it starts, labelled with its session, by the daemon
/// serving the worktree.
fn take_turn_checkpoint(
    state: &StateDir,
    (repo, name): (&str, &str),
    session: &str,
) -> Result<u64, String> {
    use worktreefs::daemon::socket::{ask, Answer, Request};
    let request = Request::Checkpoint {
        repo: repo.into(),
        name: name.into(),
        label: Some(format!("turn {session}")),
    };
    match ask(state, &request) {
        Ok(Answer::Checkpoint { checkpoint }) => Ok(checkpoint.id),
        Ok(Answer::Error { message } | Answer::Gone { message } | Answer::Refused { message }) => {
            Err(message)
        }
        Ok(other) => Err(format!("the daemon answered {other:?}")),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Ends this process's turn on worktree `id` and gives back the lease it took, telling
/// the daemon. Ok(false): the turn had ended already (its session's lease released).
fn end_own_turn(
    state: &StateDir,
    store: &mut Store,
    id: worktreefs::ids::WorktreeId,
    me: &worktreefs::process::info::ProcInfo,
    reason: &str,
) -> anyhow::Result<bool> {
    // The lease it took goes with the turn, in the same transaction.
    let ended = store.end_turn(id, (me.pid as i64, me.start as i64), reason)?;
    daemon::poke(state);
    Ok(ended)
}

fn cmd_turn(
    state: &StateDir,
    target: &str,
    ask: &TurnAsk<'_>,
    command: &[String],
) -> Result<(), Failed> {
    use worktreefs::lifecycle::turns::writers_inside;
    use worktreefs::process::info::Liveness;
    use worktreefs::store::{NewLease, NewTurn, TurnError};
    let (repo, name) = split_target(target)?;
    worktreefs::lease::validate_session(ask.session).map_err(|e| anyhow!(e))?;
    let mut store = open_store(state)?;
    let row = runnable_worktree(&store, repo, name)?;
    let at = create::mountpoint_of(state, &store);
    let plain = |error: &str, message: String| -> Failed {
        report::refused(&row, &at, error, Some(ask.session), message).into()
    };
    let Some(daemon) = daemon::running_daemon(state) else {
        return Err(not_mounted(state, &store, &row, Some(ask.session)).into());
    };
    crate::cli::commands::setup::before_running(state, &store, &row, ask.setup)?;
    same_pid_namespace(&daemon).map_err(|e| plain("other-namespace", e.to_string()))?;
    let dir = daemon.mountpoint.join(repo).join(name);
    let me = worktreefs::process::info::proc_info(std::process::id() as i32)
        .ok_or_else(|| anyhow!("reading this process's /proc/self/stat"))?;
    let liveness = worktreefs::process::info::liveness_for(me.pid);
    let started = std::time::Instant::now();
    let deadline = ask.wait.map(|s| {
        started
            .checked_add(Duration::from_secs(s))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400))
    });
    let waiting = || deadline.is_some_and(|d| std::time::Instant::now() < d);
    let waited = || ask.wait.map(|_| started.elapsed().as_secs());
    let busy = |t: &worktreefs::store::TurnRow, unchecked: Option<&str>| -> Failed {
        report::busy(
            t,
            unchecked,
            waited(),
            worktreefs::store::now_secs(),
            Some(&daemon.mountpoint),
        )
        .into()
    };
    let lease = NewLease::Session {
        id: ask.session.to_string(),
    };
    let reason = format!(
        "worktreefs turn{}",
        if ask.guard { ", guarded" } else { "" }
    );
    // Waiting holds nothing: no lease taken, no turn begun, so a turn killed while it
    // waits leaves nothing behind, and a wait for another turn of the same session sees
    // that turn give back the lease it took.
    loop {
        let running = store.turns()?.into_iter().find(|t| t.worktree_id == row.id);
        if let Some(t) = running {
            match liveness(t.pid, t.pid_start) {
                Liveness::Gone => {} // begin_turn ends it
                l => {
                    if waiting() {
                        std::thread::sleep(WAIT_POLL);
                        continue;
                    }
                    let why = match &l {
                        Liveness::Unknown(why) => Some(why.as_str()),
                        _ => None,
                    };
                    return Err(busy(&t, why));
                }
            }
        }
        if ask.guard {
            let writers = writers_inside(&dir, me.pid);
            if !writers.is_empty() {
                if waiting() {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                return Err(report::writers_inside(repo, name, &writers, 0, waited()).into());
            }
        }
        let left = deadline.map(|d| {
            d.saturating_duration_since(std::time::Instant::now())
                .as_secs()
        });
        let took = acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            &reason,
            &Want {
                exclusive: false,
                wait: left,
            },
        )?;
        let turn = NewTurn {
            session: ask.session.to_string(),
            pid: me.pid,
            start: me.start,
            command: command.join(" "),
            guard: ask.guard,
            took_lease: took,
        };
        let give_back = |store: &mut Store| {
            if took {
                let _ = store.release_lease(
                    row.id,
                    &lease.holder(),
                    "released",
                    "its turn did not start",
                );
                daemon::poke(state);
            }
        };
        match store.begin_turn(row.id, &turn, &liveness) {
            Ok(_) => break,
            Err(TurnError::Busy {
                turn: running,
                unchecked,
            }) => {
                give_back(&mut store);
                if waiting() {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                return Err(busy(&running, unchecked.as_deref()));
            }
            Err(TurnError::NotHeld) => {
                give_back(&mut store);
                return Err(plain("not-held", format!("session {} lost its lease on {repo}/{name} while its turn was starting (released by someone else); nothing was started — take it again with `worktreefs lease acquire {repo}/{name} --session {}`", ask.session, ask.session)));
            }
            Err(TurnError::State(st)) => {
                give_back(&mut store);
                return Err(report::unleasable(repo, name, Some(st)).into());
            }
            Err(TurnError::Db(e)) => {
                give_back(&mut store);
                return Err(e.into());
            }
        }
    }
    if !ask.guard {
        daemon::poke(state);
    } else if let Err(e) = guard_in_place(&daemon.mountpoint, (repo, name), &dir, me.pid) {
        // Nothing was started: the turn ends (and gives back the lease it took).
        end_own_turn(
            state,
            &mut store,
            row.id,
            &me,
            "its guard could not be put in place",
        )?;
        return Err(match e {
            GuardNotReady::Writers(writers, through_mount) => {
                report::writers_inside(repo, name, &writers, through_mount, waited()).into()
            }
            GuardNotReady::Other(msg) => anyhow!(
                "the guard of this turn on {repo}/{name} could not be put in place: {msg}; nothing was started — see the daemon's log ({}), or run the turn without --guard",
                state.root.join("daemon.log").display()
            )
            .into(),
        });
    }
    if ask.checkpoint {
        if let Err(why) = take_turn_checkpoint(state, (repo, name), ask.session) {
            end_own_turn(
                state,
                &mut store,
                row.id,
                &me,
                "its checkpoint could not be taken",
            )?;
            return Err(anyhow!(
                "the checkpoint a turn takes as it starts could not be taken of {repo}/{name}: {why}; nothing was started — run the turn with --no-checkpoint to go without one"
            )
            .into());
        }
    }
    let limit = ask.timeout.map(Duration::from_secs);
    let env = worktreefs::lifecycle::ports::environment(&store, &row, &dir);
    let ended = run_below(&dir, command, &env, Below::Turn { limit });
    let why = match &ended {
        Ok(Ended {
            ended_with: Some(sig),
            ..
        }) => format!(
            "its command ran past its timeout of {} s and was ended with {}",
            ask.timeout.unwrap_or(0),
            signal_name(*sig)
        ),
        Ok(e) => format!("its command ended ({})", e.status),
        Err(e) => format!("its command could not start: {e:#}"),
    };
    // The command's status is what this exits with, whatever the bookkeeping meets.
    match end_own_turn(state, &mut store, row.id, &me, &why) {
        Ok(true) => {}
        Ok(false) if ended.is_ok() => eprintln!(
            "worktreefs: the turn of session {} on {repo}/{name} had ended before its command did (its session's lease was released)",
            ask.session
        ),
        Ok(false) => {}
        Err(e) => eprintln!(
            "worktreefs: ending the turn of session {} on {repo}/{name} failed ({e:#}); the daemon ends it within a second of this process's exit",
            ask.session
        ),
    }
    let ended = ended?;
    if let Some(sig) = ended.ended_with {
        // Past its timeout: said on stderr (the JSON last, on a line of its own), exit 124.
        let secs = ask.timeout.unwrap_or(0);
        let how = match sig {
            libc::SIGKILL => format!(
                "SIGKILL, {} s after a SIGTERM it ignored",
                tree::KILL_AFTER.as_secs()
            ),
            _ => signal_name(sig).to_string(),
        };
        let message = format!(
            "the turn of session {} on {repo}/{name} ran past its timeout of {secs} s: its command was ended with {how}, and what it left running with it",
            ask.session,
        );
        let row = store.worktree(repo, name).ok().flatten().unwrap_or(row);
        let v = shapes::value(shapes::TimedOutJson {
            worktree: shapes::WorktreeJson::of(&row, &at),
            error: "timed-out".into(),
            session: ask.session.to_string(),
            timeout_secs: secs,
            signal: signal_name(sig).to_string(),
            exit_status: report::EXIT_TIMED_OUT,
            message: message.clone(),
        });
        write_report(&v);
        if ask.json {
            // On a line of its own whatever the command's last output was (a line it
            // did not end, a progress bar's `\r`).
            eprintln!("\n{v}");
        } else {
            eprintln!("worktreefs: {message}");
        }
        return Err(Status::of(report::EXIT_TIMED_OUT).into());
    }
    write_report(&shapes::value(shapes::TurnOutcomeJson {
        outcome: "ended".into(),
        exit_status: exit_code(ended.status),
    }));
    exit_as(ended.status)
}

/// Why a guarded turn's gate is not in place.
enum GuardNotReady {
    /// Processes outside write there (named), and how many files are open for writing
    /// through the mount (the daemon's count, which sees other users' and namespaces').
    Writers(Vec<report::Writer>, usize),
    Other(String),
}

/// Puts a guarded turn's gate in place before its command starts: the daemon re-reads
/// the store and waits for every change request that began before the guard to end (its
/// refresh answers ENOENT once they have, EBUSY if they do not), shows the turn as this
/// process's, and nothing outside has a file there open for writing or mapped (their
/// writes would never reach the gate): by the daemon's handle table and by `/proc`.
fn guard_in_place(
    mountpoint: &Path,
    (repo, name): (&str, &str),
    dir: &Path,
    pid: i32,
) -> Result<(), GuardNotReady> {
    let control = mountpoint.join(worktreefs::fs::CONTROL_NAME);
    match fs::symlink_metadata(control.join(worktreefs::fs::REFRESH_NAME)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(GuardNotReady::Other(format!(
                "the daemon did not confirm that changes begun before it ended ({e})"
            )))
        }
        Ok(_) => {
            return Err(GuardNotReady::Other(
                "the daemon answered its refresh unexpectedly".into(),
            ))
        }
    }
    let entry = control.join("turns").join(format!("{repo}:{name}"));
    let shown = fs::read_to_string(&entry)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let Some(shown) = shown.filter(|v| v["pid"].as_i64() == Some(pid as i64)) else {
        return Err(GuardNotReady::Other(format!(
            "the daemon does not show it in {}",
            entry.display()
        )));
    };
    let through_mount = shown["open_for_writing"].as_u64().unwrap_or(0) as usize;
    let writers = worktreefs::lifecycle::turns::writers_inside(dir, pid);
    if through_mount > 0 || !writers.is_empty() {
        return Err(GuardNotReady::Writers(writers, through_mount));
    }
    Ok(())
}

/// A turn's process must be one the daemon can see as it does (same pid namespace): its
/// guard compares the pids FUSE gives with the turn's, and its sweeper checks the turn's
/// process by pid.
fn same_pid_namespace(daemon: &daemon::Holder) -> anyhow::Result<()> {
    let daemon_pid = daemon.pid;
    let ns = |pid: &str| {
        fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .map(|l| l.to_string_lossy().into_owned())
    };
    let same = match &daemon.pid_ns {
        // The namespace the daemon wrote down: whatever its program is called (installed
        // as `mount.fuse.worktreefs`, copied elsewhere).
        Some(theirs) => ns("self").is_some_and(|mine| mine == *theirs),
        // A daemon of a version that did not write it: the pid must be a worktreefs
        // process in this namespace.
        None => {
            let cmd = fs::read(format!("/proc/{daemon_pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmd).contains("worktreefs");
            ours && ns("self").is_some() && ns("self") == ns(&daemon_pid.to_string())
        }
    };
    if same {
        return Ok(());
    }
    bail!(
        "this command does not run in the pid namespace of the daemon (pid {daemon_pid}), so the daemon could not tell the turn's processes; run `worktreefs turn` where the daemon runs (not inside a container of its own)"
    )
}
