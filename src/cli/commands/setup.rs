//! `worktreefs setup REPO/WT` (its repository's setup command run again, waited for),
//! `worktreefs setup-log REPO/WT` (what the last run printed), and what `new`, `run` and
//! `turn` ask of a worktree's setup before they go on. The runners the daemon starts
//! (`setup --runner`, `setup --teardown`) are `setup_runner.rs`.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon;
use worktreefs::lifecycle::setup;
use worktreefs::report;
use worktreefs::report::shapes::{self, SetupFailedJson, SetupJson};
use worktreefs::state::StateDir;
use worktreefs::store::{SetupRow, SetupState, Store, WorktreeRow};

use crate::cli::exit::{Failed, Status};
use crate::cli::output::print_json;
use crate::cli::refusals::{leasable_worktree, runnable_worktree};
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct SetupArgs {
    /// REPO/WT (or a path inside the mount; default: the worktree the current directory
    /// is in).
    pub target: Option<String>,
    /// Queue the run and return at once (`list` shows how it went).
    #[arg(long)]
    pub no_wait: bool,
    /// The run as one JSON object on stdout (its `setup`), once it ended.
    #[arg(long)]
    pub json: bool,
    /// Run the queued setup here, as the daemon does (not for people).
    #[arg(long, hide = true, conflicts_with = "teardown")]
    pub runner: bool,
    /// Run the repository's teardown command here, as the daemon does before a removal
    /// (not for people).
    #[arg(long, hide = true)]
    pub teardown: bool,
    /// The teardown's limit in seconds.
    #[arg(long, hide = true, value_name = "SECS", default_value_t = 60)]
    pub limit: u64,
}

/// What `run` and `turn` do about a worktree's setup command.
#[derive(Args, Clone, Copy, Default)]
pub struct SetupGateArgs {
    /// Go ahead while the worktree's setup command is still running (by default the
    /// command waits for it to end).
    #[arg(long)]
    pub no_wait_setup: bool,
    /// Go ahead even though the worktree's setup command failed (by default refused:
    /// `setup-failed`, exit 3).
    #[arg(long)]
    pub ignore_setup: bool,
}

#[derive(Args)]
pub struct SetupLogArgs {
    /// REPO/WT (or a path inside the mount; default: the worktree the current directory
    /// is in).
    pub target: Option<String>,
}

pub fn run(state: &StateDir, args: SetupArgs) -> Result<(), Failed> {
    let target = which(state, args.target.as_deref(), false)?;
    let (repo, name) = split_target(&target)?;
    if args.runner {
        return super::setup_runner::runner(state, repo, name);
    }
    if args.teardown {
        return super::setup_runner::teardown_runner(state, repo, name, args.limit);
    }
    let store = open_store(state)?;
    let row = runnable_worktree(&store, repo, name)?;
    let hooks = store.hooks_of(row.repo_id)?;
    let Some(command) = hooks.on_create else {
        return Err(anyhow!(
            "repository '{repo}' has no setup command; give it one with `worktreefs repo set {repo} --on-create CMD`"
        )
        .into());
    };
    let timeout = hooks
        .create_timeout
        .unwrap_or(setup::DEFAULT_TIMEOUT.as_secs());
    if !store.queue_setup(row.id, &command, timeout)? {
        eprintln!("worktreefs: the setup of {repo}/{name} is under way already: waiting for it");
    }
    daemon::poke(state);
    if args.no_wait {
        if daemon::running_daemon(state).is_none() {
            eprintln!(
                "worktreefs: the setup of {repo}/{name} is queued; it runs once the state dir is mounted (`worktreefs mount`)"
            );
        }
        return Ok(());
    }
    let ended = wait_for(state, &store, &row)?.unwrap_or_else(|| unreachable_run(&row));
    finish(state, &row, &ended, args.json)
}

/// A run that was queued is there to wait for; one that is not is a failure to say.
fn unreachable_run(row: &WorktreeRow) -> SetupRow {
    SetupRow {
        worktree_id: row.id,
        command: String::new(),
        timeout: 0,
        state: SetupState::Failed,
        exit_code: None,
        detail: Some("its run is not recorded".into()),
        pid: None,
        pid_start: None,
        queued_at: 0,
        started_at: None,
        ended_at: None,
    }
}

/// Says how the run of `row`'s setup ended and exits as it did: 0 when it went well, its
/// exit code (else 1) when not.
pub fn finish(
    state: &StateDir,
    row: &WorktreeRow,
    run: &SetupRow,
    json: bool,
) -> Result<(), Failed> {
    if json {
        print_json(SetupJson::of(run));
    } else {
        eprintln!(
            "worktreefs: setup of {}/{}: {}{}",
            row.repo,
            row.name,
            run.summary(),
            if run.state == SetupState::Ok {
                String::new()
            } else {
                format!(
                    "; its output: `worktreefs setup-log {}/{}` ({})",
                    row.repo,
                    row.name,
                    setup::log_path(state, row).display()
                )
            }
        );
    }
    match run.state {
        SetupState::Ok => Ok(()),
        _ => Err(Status::of(run.exit_code.unwrap_or(1)).into()),
    }
}

/// Waits for `row`'s setup to end and returns how it did; None when it has none. A run
/// queued while nothing is mounted is refused: nothing would ever start it.
pub fn wait_for(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
) -> Result<Option<SetupRow>, Failed> {
    let started = Instant::now();
    let mut said = false;
    loop {
        let Some(run) = store.setup_of(row.id)? else {
            return Ok(None);
        };
        if !run.state.in_progress() {
            return Ok(Some(run));
        }
        if daemon::running_daemon(state).is_none() {
            if run.state == SetupState::Pending {
                return Err(anyhow!(
                    "the setup of {}/{} is queued and nothing is mounted for state dir {} to run it; start it with `worktreefs mount`",
                    row.repo,
                    row.name,
                    state.root.display()
                )
                .into());
            }
            // Running with no daemon to notice its runner die: looked at here (from the
            // daemon's pid namespace alone: from another, every pid looks gone).
            if daemon::leases_in_this_pid_namespace(state) {
                if let Ok(mut own) = Store::open(&state.root) {
                    setup::fail_orphaned(&mut own);
                }
            }
        }
        if !said && started.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "worktreefs: waiting for the setup of {}/{} ({}: `{}`); its output: `worktreefs setup-log {}/{}`",
                row.repo, row.name, run.state.as_str(), run.command, row.repo, row.name
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `run` and `turn` ask before they go on: a setup under way is waited for (unless
/// `--no-wait-setup`), and one that failed refuses them (`setup-failed`) unless
/// `--ignore-setup`.
pub fn before_running(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
    gate: SetupGateArgs,
) -> Result<(), Failed> {
    let run = match store.setup_of(row.id)? {
        Some(run) if run.state.in_progress() && !gate.no_wait_setup => {
            // Nothing mounted: the command's own refusal (not mounted) says what to do.
            if daemon::running_daemon(state).is_none() {
                return Ok(());
            }
            wait_for(state, store, row)?
        }
        other => other,
    };
    match run {
        Some(run) if run.state == SetupState::Failed && !gate.ignore_setup => {
            Err(setup_failed(row, &run).into())
        }
        _ => Ok(()),
    }
}

/// The refusal of a command in worktree `row`, whose setup failed.
fn setup_failed(row: &WorktreeRow, run: &SetupRow) -> report::Refusal {
    report::Refusal {
        message: format!(
            "the setup of {}/{} {}: see its output with `worktreefs setup-log {}/{}`, run it again with `worktreefs setup {}/{}`, or go ahead without it with --ignore-setup",
            row.repo,
            row.name,
            run.summary(),
            row.repo,
            row.name,
            row.repo,
            row.name
        ),
        json: shapes::value(SetupFailedJson {
            error: "setup-failed".into(),
            worktree: format!("{}/{}", row.repo, row.name),
            repo: row.repo.clone(),
            name: row.name.clone(),
            setup: SetupJson::of(run),
        }),
        code: report::EXIT_CONFLICT,
    }
}

pub fn run_log(state: &StateDir, args: SetupLogArgs) -> Result<(), Failed> {
    let target = which(state, args.target.as_deref(), false)?;
    let (repo, name) = split_target(&target)?;
    let store = open_store(state)?;
    // A removed worktree's too: its teardown's output is there.
    let row = leasable_worktree(&store, repo, name)?;
    if store.setup_of(row.id)?.is_none() && !setup::log_path(state, &row).exists() {
        return Err(anyhow!(
            "{repo}/{name} has run no setup or teardown command, so it has no setup log (see `worktreefs repo set {repo} --on-create CMD`)"
        )
        .into());
    }
    let log = setup::read_log(state, &row)
        .map_err(|e| anyhow!("reading {}: {e}", setup::log_path(state, &row).display()))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&log)
        .and_then(|_| out.flush())
        .map_err(|e| anyhow!("writing the log: {e}"))?;
    Ok(())
}
