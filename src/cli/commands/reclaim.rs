//! `worktreefs reclaim`: remove a worktree when nothing would be lost (or, with
//! `--discard`, what it holds thrown away), through the daemon when one serves.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon;
use worktreefs::lease::State;
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes::{self, ReclaimJson, UnknownWorktreeJson, WorktreeJson};
use worktreefs::state::StateDir;

use crate::cli::acquire::WAIT_POLL;
use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::refusals::{did_you_mean, hint};
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct ReclaimArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount; always given (your
    /// own shell may be inside the one you are in).
    pub target: String,
    /// Throw away what it holds (listed first): the one way to lose work on purpose.
    #[arg(long)]
    pub discard: bool,
    /// Wait up to SECS for its holders to go (sessions to release, processes to leave).
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// The outcome (removed, with what it says; or why not) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: ReclaimArgs) -> Result<(), Failed> {
    let target = which(state, Some(&args.target), true)?;
    cmd_reclaim(state, &target, args.discard, args.wait, args.json)
}

fn cmd_reclaim(
    state: &StateDir,
    target: &str,
    discard: bool,
    wait: Option<u64>,
    json: bool,
) -> Result<(), Failed> {
    use worktreefs::daemon::socket::Answer;
    let (repo, name) = split_target(target)?;
    let mut store = open_store(state)?;
    let mountpoint = create::mountpoint_of(state, &store);
    // Nobody may hold it: refused as an exclusive lease is, naming each holder, once the
    // leases of holders that have exited or left are released (and after `--wait`).
    if let Some(row) = store
        .worktree(repo, name)?
        .filter(|w| w.state != State::Removed)
    {
        use worktreefs::lifecycle::occupancy;
        let path = worktreefs::target::physical(&mountpoint)
            .join(repo)
            .join(name);
        // With no daemon, nobody else releases the leases of holders that are gone: this
        // command does, where it can tell (the leases' pid namespace is its own).
        let no_daemon =
            daemon::running_daemon(state).is_none() && daemon::leases_in_this_pid_namespace(state);
        let me = std::process::id() as i32;
        let started = std::time::Instant::now();
        let deadline = started
            .checked_add(Duration::from_secs(wait.unwrap_or(0)))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400));
        loop {
            let held = occupancy::holders_now(&mut store, &row, &path, me, no_daemon)?;
            if held.is_empty() {
                break;
            }
            if std::time::Instant::now() < deadline {
                std::thread::sleep(WAIT_POLL);
                continue;
            }
            return Err(occupancy::refusal(
                repo,
                name,
                &held,
                wait.map(|_| started.elapsed().as_secs()),
                worktreefs::store::now_secs(),
            )
            .into());
        }
    }
    // Through the live daemon when one serves this state dir (it alone sees the leases
    // it keeps in memory), else here.
    let mut result = None;
    let mut discarded = Vec::new();
    daemon::socket::reclaim(state, repo, name, discard, &mut |a| match a {
        Answer::Discarding { lines } => {
            if json {
                discarded.extend(lines.iter().cloned());
            } else {
                println!("discarding from {repo}/{name}:");
                for l in lines {
                    println!("  {l}");
                }
            }
        }
        other => result = Some(other.clone()),
    })?;
    daemon::poke(state);
    // The outcome as JSON: what happened and why (`said`), about the worktree as it is
    // now, or only its names when there is none.
    let said = |what: &str, detail: &str| ReclaimJson {
        worktree: (),
        outcome: what.into(),
        detail: detail.into(),
        discarded: discard.then(|| discarded.clone()),
        error: None,
        did_you_mean: None,
    };
    let outcome = |said: ReclaimJson<()>| match store.worktree(repo, name).ok().flatten() {
        Some(w) => shapes::value(said.about(WorktreeJson::of(&w, &mountpoint))),
        None => shapes::value(said.about(UnknownWorktreeJson {
            worktree: format!("{repo}/{name}"),
            repo: repo.to_string(),
            name: name.to_string(),
            path: None,
            state: None,
        })),
    };
    // A refusal names itself in `error`, the word of its `outcome` unless said otherwise.
    let refusal = |said: ReclaimJson<()>, message: String| -> Failed {
        let error = said.error.clone().unwrap_or_else(|| said.outcome.clone());
        report::Refusal {
            message,
            json: outcome(ReclaimJson {
                error: Some(error),
                ..said
            }),
            code: report::EXIT_FAILED,
        }
        .into()
    };
    match &result {
        Some(Answer::Removed { detail }) => {
            if json {
                print_json(outcome(said("removed", detail)));
            } else {
                println!("removed {repo}/{name}: {detail}");
            }
            Ok(())
        }
        Some(Answer::Retained { reason }) => Err(refusal(said("retained", reason), format!(
            "worktree '{repo}/{name}' could not be removed and is retained with its files: {reason}; see {}",
            state.log_file().display()
        ))),
        Some(Answer::HoldsWork { reason }) => Err(refusal(said("holds-work", reason), format!(
            "worktree '{repo}/{name}' holds work and stays: {reason}; commit and push it (cd {}), or throw it away with `worktreefs reclaim {repo}/{name} --discard`",
            mountpoint.join(repo).join(name).display()
        ))),
        // Named as every other command names them: `not-found` (with the close name in
        // `did_you_mean`) or `removed`; nothing to reclaim is not a conflict (exit 1).
        Some(Answer::Gone { message }) => {
            let now = open_store(state)?;
            let removed = now
                .worktree(repo, name)?
                .is_some_and(|w| w.state == State::Removed);
            if removed {
                // `error` as every command names a removed worktree; `outcome` never
                // reads as this call's removal.
                let already = format!("worktree {repo}/{name} is already removed");
                return Err(refusal(
                    ReclaimJson {
                        error: Some("removed".into()),
                        ..said("already-removed", &already)
                    },
                    format!(
                        "worktree '{repo}/{name}' is already removed, so there is nothing to reclaim; bring it back with `worktreefs restore {repo}/{name}` (see `worktreefs removed`)"
                    ),
                ));
            }
            let close = did_you_mean(&now, repo, name);
            let message_for_people = format!(
                "worktree '{repo}/{name}' does not exist{}; see `worktreefs list` and `worktreefs retained`",
                hint(close.as_deref())
            );
            Err(refusal(
                ReclaimJson {
                    did_you_mean: close,
                    ..said("not-found", message)
                },
                message_for_people,
            ))
        }
        Some(Answer::Busy { message }) => Err(refusal(said("busy", message), message.clone())),
        Some(Answer::NotMounted { message }) => {
            Err(refusal(said("not-mounted", message), message.clone()))
        }
        Some(Answer::Error { message }) => Err(refusal(said("error", message), message.clone())),
        Some(
            Answer::Discarding { .. }
            | Answer::BeforeUnmountBegun
            | Answer::CleanedBeforeUnmount { .. }
            | Answer::Checkpoint { .. }
            | Answer::Rewound { .. }
            | Answer::Refused { .. },
        )
        | None => {
            Err(anyhow!("reclaim of {repo}/{name} ended without an answer").into())
        }
    }
}
