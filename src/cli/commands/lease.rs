//! `worktreefs lease acquire|release`: named leases for orchestrators.

use anyhow::anyhow;
use clap::Subcommand;
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes::{AcquiredJson, ReleasedJson, WorktreeJson};
use worktreefs::state::StateDir;

use crate::cli::acquire::{acquire_named, Want};
use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::refusals::{leasable_worktree, not_found};
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Subcommand)]
pub enum LeaseCmd {
    /// Take a named lease on REPO/WT for a session (kept across daemon restarts). Refused
    /// (exit code 3, naming each holder) while another holds it exclusively.
    Acquire {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// The orchestrator's session id.
        #[arg(long)]
        session: String,
        /// Only while nobody else holds the worktree: no other session, and no process
        /// that is not this command or one of its ancestors; while held, every other
        /// session's acquisition is refused (processes may still enter).
        #[arg(long)]
        exclusive: bool,
        /// When another holder refuses the lease, wait up to SECS for it to go.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// The lease, or the refusal, as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Release a session's named lease on REPO/WT.
    Release {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// The session whose lease goes.
        #[arg(long)]
        session: String,
        /// Why the session let go (e.g. `force-killed`, `exited-with-unsaved-work`): kept
        /// with the release event, and shown with the retained entry if the worktree is
        /// retained.
        #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        reason: Option<String>,
        /// The outcome (or the refusal) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(state: &StateDir, cmd: LeaseCmd) -> Result<(), Failed> {
    let (target, session) = match &cmd {
        LeaseCmd::Acquire {
            target, session, ..
        } => (target, session),
        LeaseCmd::Release {
            target, session, ..
        } => (target, session),
    };
    worktreefs::lease::validate_session(session).map_err(|e| anyhow!(e))?;
    let target = which(state, target.as_deref(), false)?;
    let (repo, name) = split_target(&target)?;
    let mut store = open_store(state)?;
    let lease = worktreefs::store::NewLease::Session {
        id: session.clone(),
    };
    if let LeaseCmd::Acquire {
        exclusive,
        wait,
        json,
        ..
    } = cmd
    {
        let row = leasable_worktree(&store, repo, name)?;
        let reason = if exclusive {
            "named lease, exclusive"
        } else {
            "named lease"
        };
        let inserted = acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            reason,
            &Want { exclusive, wait },
        )?;
        daemon::poke(state);
        if json {
            let held = store
                .leases()?
                .into_iter()
                .find(|l| l.worktree_id == row.id && l.holder == lease.holder());
            let now = store.worktree(repo, name)?.unwrap_or(row);
            print_json(AcquiredJson {
                worktree: WorktreeJson::of(&now, &create::mountpoint_of(state, &store)),
                session: session.clone(),
                exclusive: held.as_ref().is_some_and(|l| l.exclusive),
                new: inserted,
                acquired_at: held.as_ref().map(|l| report::rfc3339(l.acquired_at)),
            });
        } else if inserted {
            println!(
                "session {session} holds {repo}/{name}{}",
                if exclusive { " exclusively" } else { "" }
            );
        } else {
            println!(
                "session {session} already holds {repo}/{name}{}",
                if exclusive { " (exclusively now)" } else { "" }
            );
        }
        return Ok(());
    }
    let LeaseCmd::Release { reason, json, .. } = &cmd else {
        unreachable!("acquire returned above")
    };
    let json = *json;
    let Some(row) = store.worktree(repo, name)? else {
        // Nothing to release: said as `not-found`, with exit 1 (nothing was asked that
        // somebody else has; see the README's exit codes).
        let mut r = not_found(&store, repo, name, Some(session));
        r.code = 1;
        return Err(r.into());
    };
    if let Some(r) = reason {
        worktreefs::lease::validate_reason(r).map_err(|e| anyhow!(e))?;
    }
    let turn = store
        .turns()?
        .into_iter()
        .find(|t| t.worktree_id == row.id && t.session == *session);
    let released = match reason {
        Some(r) => store.release_with_reason(row.id, &lease.holder(), r)?,
        None => store.release_lease(row.id, &lease.holder(), "released", "named lease released")?,
    };
    if !released {
        let message = format!(
            "session {session} holds no lease on {repo}/{name} (state {}); nothing changed (see `worktreefs leases`)",
            row.state
        );
        let at = create::mountpoint_of(state, &store);
        return Err(report::refused(&row, &at, "not-held", Some(session), message).into());
    }
    if json {
        daemon::poke(state);
        let now = store.worktree(repo, name)?.unwrap_or(row);
        print_json(ReleasedJson {
            worktree: WorktreeJson::of(&now, &create::mountpoint_of(state, &store)),
            session: session.clone(),
            reason: reason.clone(),
            turn_ended: turn.is_some(),
        });
        return Ok(());
    }
    println!("session {session} released {repo}/{name}");
    if let Some(t) = turn {
        println!(
            "its turn (pid {}: {}) ended; the command was not stopped",
            t.pid, t.command
        );
    }
    daemon::poke(state);
    Ok(())
}
