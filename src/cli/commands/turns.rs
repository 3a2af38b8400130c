//! `worktreefs turns`: the running turns; `turns end` ends one.

use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes::{TurnEndedJson, TurnJson};
use worktreefs::state::StateDir;
use worktreefs::store::Store;
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::refusals::not_found;
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct TurnsArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<TurnsCmd>,
}

pub fn run(state: &StateDir, args: TurnsArgs) -> Result<(), Failed> {
    let TurnsArgs { json, action } = args;
    if let Some(TurnsCmd::End {
        target,
        session,
        wait,
        json,
    }) = action
    {
        let target = which(state, target.as_deref(), false)?;
        return cmd_turn_end(state, &target, session.as_deref(), wait, json);
    }
    let store = open_store(state)?;
    let rows = store.turns()?;
    let mountpoint = create::mountpoint_of(state, &store);
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|t| TurnJson::of(t, Some(&mountpoint)))
            .collect();
        print_json(v);
    } else {
        let now = worktreefs::store::now_secs();
        let mut table =
            Table::new(&["WORKTREE", "SESSION", "PID", "GUARD", "SINCE", "COMMAND"]).right(2);
        for t in rows {
            table.row([
                format!("{}/{}", t.repo, t.worktree),
                t.session.clone(),
                t.pid.to_string(),
                if t.guard { "yes" } else { "no" }.to_string(),
                report::when(t.started_at, now),
                t.command.clone(),
            ]);
        }
        print!("{}", report::listing(&table, "no turns running"));
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum TurnsCmd {
    /// End the turn running on REPO/WT: its `turn` process gets SIGTERM (passed on to its
    /// command) and this waits for the turn to end. Says so, changing nothing, when no turn
    /// runs there or (with --session) it is another session's.
    End {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// Only if the running turn is this session's.
        #[arg(long)]
        session: Option<String>,
        /// How long to wait for the turn to end.
        #[arg(long, value_name = "SECS", default_value_t = 10)]
        wait: u64,
        /// The outcome (or why not) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// `turns end`: SIGTERM to the running turn's process, then waits for its turn to end.
fn cmd_turn_end(
    state: &StateDir,
    target: &str,
    session: Option<&str>,
    wait: u64,
    json: bool,
) -> Result<(), Failed> {
    let (repo, name) = split_target(target)?;
    if let Some(s) = session {
        worktreefs::lease::validate_session(s).map_err(|e| anyhow!(e))?;
    }
    let mut store = open_store(state)?;
    // Nothing to end is exit 1, as for a release (not a conflict: nothing was asked that
    // somebody else has).
    let Some(row) = store.worktree(repo, name)? else {
        let mut r = not_found(&store, repo, name, None);
        r.code = 1;
        return Err(r.into());
    };
    let at = create::mountpoint_of(state, &store);
    let not = |error: &str, message: String| -> Failed {
        report::refused(&row, &at, error, session, message).into()
    };
    let Some(turn) = store.turns()?.into_iter().find(|t| t.worktree_id == row.id) else {
        return Err(not(
            "not-running",
            format!("no turn runs on {repo}/{name}; nothing changed (see `worktreefs turns`)"),
        ));
    };
    if session.is_some_and(|s| s != turn.session) {
        return Err(not(
            "other-session",
            format!(
                "the turn running on {repo}/{name} is session {}'s, not {}'s; nothing changed",
                turn.session,
                session.unwrap_or_default()
            ),
        ));
    }
    let key = (turn.pid, turn.pid_start);
    let same = |store: &Store| {
        store
            .turns()
            .ok()
            .and_then(|v| v.into_iter().find(|t| t.worktree_id == row.id))
            .is_some_and(|t| (t.pid, t.pid_start) == key)
    };
    if worktreefs::process::info::liveness(turn.pid, turn.pid_start)
        == worktreefs::process::info::Liveness::Gone
    {
        // Its process is gone already: the gate opens now.
        store.end_turn(
            row.id,
            key,
            "ended by `worktreefs turns end` (its process was gone)",
        )?;
    } else {
        // Through a pidfd of the recorded process (its start time checked after the pidfd
        // is open), so a pid reused meanwhile is never signalled.
        match worktreefs::process::info::signal(turn.pid, turn.pid_start, libc::SIGTERM) {
            Ok(_) => {} // gone meanwhile: the turn ends below
            Err(e) => {
                return Err(not(
                    "cannot-signal",
                    format!(
                        "cannot signal the turn's process {} ({e}); nothing changed — end it as its owner, or release its session (`worktreefs lease release {repo}/{name} --session {}`)",
                        turn.pid, turn.session
                    ),
                ));
            }
        }
        let now = std::time::Instant::now();
        let end = now
            .checked_add(Duration::from_secs(wait))
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400));
        while same(&store) && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    daemon::poke(state);
    if same(&store) {
        return Err(not(
            "still-running",
            format!(
                "the turn of session {} on {repo}/{name} is still running {wait} s after its process {} got SIGTERM (its command may ignore it); wait longer (`--wait SECS`), `kill -9 {}` (the gate opens within a second), or release its session",
                turn.session, turn.pid, turn.pid
            ),
        ));
    }
    if json {
        print_json(TurnEndedJson {
            turn: TurnJson::of(&turn, Some(&at)),
            ended: true,
        });
    } else {
        println!(
            "ended the turn of session {} on {repo}/{name} (pid {}: {})",
            turn.session, turn.pid, turn.command
        );
    }
    Ok(())
}
