//! `worktreefs run`: a command run inside a worktree, holding a lease for exactly its
//! lifetime.

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon;
use worktreefs::process::supervise::{run_below, Below};
use worktreefs::state::StateDir;

use crate::cli::acquire::{acquire_named, Want};
use crate::cli::exit::{exit_as, Failed};
use crate::cli::refusals::{not_mounted, runnable_worktree};
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct RunArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount (default: the
    /// worktree the current directory is in).
    pub target: Option<String>,
    /// Hold the lease as this named session (else as the run process).
    #[arg(long)]
    pub session: Option<String>,
    /// Only while nobody else holds the worktree (see `lease acquire --exclusive`).
    #[arg(long)]
    pub exclusive: bool,
    /// When another holder refuses the lease, wait up to SECS for it to go.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// A refusal as JSON on stderr (the command's stdout stays its own).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub setup: crate::cli::commands::setup::SetupGateArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(state: &StateDir, args: RunArgs) -> Result<(), Failed> {
    let RunArgs {
        target,
        session,
        exclusive,
        wait,
        // Where a refusal's JSON goes is the command line's (`Command::json_to`).
        json: _,
        command,
        setup,
    } = args;
    let target = which(state, target.as_deref(), false)?;
    let ask = RunAsk {
        session: session.as_deref(),
        exclusive,
        wait,
        setup,
    };
    cmd_run(state, &target, &ask, &command)
}

/// What `run` asks of its lease.
struct RunAsk<'a> {
    session: Option<&'a str>,
    exclusive: bool,
    wait: Option<u64>,
    setup: crate::cli::commands::setup::SetupGateArgs,
}

fn cmd_run(
    state: &StateDir,
    target: &str,
    ask: &RunAsk<'_>,
    command: &[String],
) -> Result<(), Failed> {
    let (repo, name) = split_target(target)?;
    let mut store = open_store(state)?;
    let row = runnable_worktree(&store, repo, name)?;
    let Some(daemon) = daemon::running_daemon(state) else {
        return Err(not_mounted(state, &store, &row, ask.session).into());
    };
    crate::cli::commands::setup::before_running(state, &store, &row, ask.setup)?;
    let dir = daemon.mountpoint.join(repo).join(name);
    let reason = if ask.exclusive {
        "worktreefs run, exclusive"
    } else {
        "worktreefs run"
    };
    // A session's plain lease this run makes exclusive is made plain again at the end.
    let mut unexclusive = None;
    let named = match ask.session {
        Some(id) => {
            worktreefs::lease::validate_session(id).map_err(|e| anyhow!(e))?;
            let lease = worktreefs::store::NewLease::Session { id: id.to_string() };
            let was_plain = store
                .leases()?
                .iter()
                .any(|l| l.worktree_id == row.id && l.holder == lease.holder() && !l.exclusive);
            let inserted = acquire_named(
                state,
                &mut store,
                (repo, name, &row),
                &lease,
                reason,
                &Want {
                    exclusive: ask.exclusive,
                    wait: ask.wait,
                },
            )?;
            if ask.exclusive && was_plain {
                unexclusive = Some(lease.holder());
            }
            // Released at the end only if this run took it.
            inserted.then_some(lease)
        }
        None => None,
    };
    if ask.session.is_none() && ask.exclusive {
        // This process's own lease, recorded exclusive before it enters (so two such runs
        // waiting for each other hold nothing meanwhile): refused while somebody other
        // than it and its ancestors holds the worktree. The daemon's first request from
        // it finds the row and watches it; the sweeper watches it if a shell inside covers
        // it, or sweeps it if this process dies before entering.
        let me = worktreefs::process::info::proc_info(std::process::id() as i32)
            .ok_or_else(|| anyhow!("reading this process's /proc/self/stat"))?;
        let lease = worktreefs::store::NewLease::Process {
            pid: me.pid,
            start: me.start,
            command: worktreefs::process::info::command_line(me.pid).unwrap_or(me.command),
        };
        acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            reason,
            &Want {
                exclusive: true,
                wait: ask.wait,
            },
        )?;
        daemon::poke(state);
    }
    // Entering the worktree and reading its .git file makes this process a lease holder
    // (the daemon notices when it exits, however it exits); the command runs below it.
    let env = worktreefs::lifecycle::ports::environment(&store, &row, &dir);
    let status = run_below(&dir, command, &env, Below::Run)
        .map(|ended| ended.status)
        .map_err(|e| Failed::from(e).within(format!("in {} (state {})", dir.display(), row.state)));
    if let Some(lease) = named {
        let _ = store.release_lease(row.id, &lease.holder(), "released", "worktreefs run ended");
    }
    if let Some(holder) = unexclusive {
        let _ = store.set_exclusive(row.id, &holder, false);
    }
    exit_as(status?)
}
