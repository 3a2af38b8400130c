//! `worktreefs checkpoint`, `rewind` and `checkpoints`: a worktree's whole state kept
//! and brought back. Taking one and rewinding are done by the daemon serving the
//! worktree (`daemon::checkpoints`); the list is read from the state directory.

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon::checkpoints::CheckpointInfo;
use worktreefs::daemon::socket::{self, Answer, Request};
use worktreefs::lifecycle::create;
use worktreefs::report;
use worktreefs::report::shapes::{
    self, CheckpointJson, CheckpointTakenJson, CheckpointsJson, FailedJson, RewoundJson,
    WorktreeJson,
};
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::refusals::not_found;
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct CheckpointArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount (default: the one the
    /// current directory is in).
    pub target: Option<String>,
    /// Words to know it by in `checkpoints`.
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// The worktree and the checkpoint taken as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct RewindArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount (default: the one the
    /// current directory is in).
    pub target: Option<String>,
    /// The checkpoint to go back to (its number in `checkpoints`).
    #[arg(long, value_name = "ID")]
    pub to: u64,
    /// The worktree, the checkpoint it is back at and the one that undoes the rewind, as
    /// JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CheckpointsArgs {
    /// The worktree: REPO/WT, or a path inside it under the mount (default: the one the
    /// current directory is in).
    pub target: Option<String>,
    /// As JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn json_of(c: &CheckpointInfo, changed_since: Option<usize>) -> CheckpointJson {
    CheckpointJson::of(
        c.id,
        c.label.clone(),
        c.taken_at,
        (c.copied_open, c.copied_bytes),
        changed_since,
    )
}

/// The worktree `target` names, as a row that is not removed.
fn live(
    state: &StateDir,
    target: Option<&str>,
) -> Result<(worktreefs::store::Store, worktreefs::store::WorktreeRow), Failed> {
    let target = which(state, target, false)?;
    let (repo, name) = split_target(&target)?;
    let store = open_store(state)?;
    match store
        .worktree(repo, name)?
        .filter(|w| w.state != worktreefs::lease::State::Removed)
    {
        Some(row) => Ok((store, row)),
        None => Err(not_found(&store, repo, name, None).into()),
    }
}

/// A refusal or failure the daemon answered, as this command ends with it.
fn answered(a: Answer, what: &str) -> Failed {
    let (error, message, code) = match a {
        Answer::Refused { message } => ("refused", message, report::EXIT_CONFLICT),
        Answer::Gone { message } => ("not-found", message, report::EXIT_FAILED),
        Answer::Error { message } => ("failed", message, report::EXIT_FAILED),
        other => (
            "failed",
            format!("the daemon answered {other:?} to {what}"),
            report::EXIT_FAILED,
        ),
    };
    report::Refusal {
        json: shapes::value(FailedJson {
            error: error.into(),
            message: message.clone(),
        }),
        message,
        code,
    }
    .into()
}

pub fn run_checkpoint(state: &StateDir, args: CheckpointArgs) -> Result<(), Failed> {
    let (store, row) = live(state, args.target.as_deref())?;
    let label = args.label.filter(|l| !l.is_empty());
    let a = socket::ask(
        state,
        &Request::Checkpoint {
            repo: row.repo.clone(),
            name: row.name.clone(),
            label,
        },
    )?;
    let Answer::Checkpoint { checkpoint } = a else {
        return Err(answered(a, "a checkpoint"));
    };
    if args.json {
        print_json(CheckpointTakenJson {
            worktree: WorktreeJson::of(&row, &create::mountpoint_of(state, &store)),
            checkpoint: json_of(&checkpoint, None),
        });
    } else {
        let copied = match checkpoint.copied_open {
            0 => String::new(),
            n => format!(
                " ({n} file{} open for writing copied, {} B)",
                if n == 1 { "" } else { "s" },
                checkpoint.copied_bytes
            ),
        };
        println!(
            "checkpoint {} of {}/{} taken{copied}; `worktreefs rewind {}/{} --to {}` brings this state back",
            checkpoint.id, row.repo, row.name, row.repo, row.name, checkpoint.id
        );
    }
    Ok(())
}

pub fn run_rewind(state: &StateDir, args: RewindArgs) -> Result<(), Failed> {
    let (store, row) = live(state, args.target.as_deref())?;
    let a = socket::ask(
        state,
        &Request::Rewind {
            repo: row.repo.clone(),
            name: row.name.clone(),
            to: args.to,
        },
    )?;
    let Answer::Rewound {
        to,
        before,
        changed,
    } = a
    else {
        return Err(answered(a, "a rewind"));
    };
    if args.json {
        print_json(RewoundJson {
            worktree: WorktreeJson::of(&row, &create::mountpoint_of(state, &store)),
            rewound_to: json_of(&to, None),
            undo: json_of(&before, None),
            changed,
        });
    } else {
        println!(
            "{}/{} is back at checkpoint {} ({changed} path{} put back); checkpoint {} holds the state it left: `worktreefs rewind {}/{} --to {}` undoes this",
            row.repo,
            row.name,
            to.id,
            if changed == 1 { "" } else { "s" },
            before.id,
            row.repo,
            row.name,
            before.id
        );
    }
    Ok(())
}

pub fn run_checkpoints(state: &StateDir, args: CheckpointsArgs) -> Result<(), Failed> {
    let (_, row) = live(state, args.target.as_deref())?;
    let kept = worktreefs::checkpoint::Checkpoints::read(&state.checkpoints(row.id))
        .map_err(|e| anyhow!("reading the checkpoints of {}/{}: {e}", row.repo, row.name))?;
    let listed: Vec<CheckpointJson> = kept
        .into_iter()
        .map(|(info, changed)| json_of(&CheckpointInfo::from(info), Some(changed)))
        .collect();
    if args.json {
        print_json(CheckpointsJson {
            worktree: format!("{}/{}", row.repo, row.name),
            checkpoints: listed,
        });
        return Ok(());
    }
    if listed.is_empty() {
        println!(
            "{}/{} keeps no checkpoint; `worktreefs checkpoint {}/{}` takes one",
            row.repo, row.name, row.repo, row.name
        );
        return Ok(());
    }
    let now = worktreefs::store::now_secs();
    let mut table = worktreefs::table::Table::new(&["ID", "TAKEN", "CHANGED SINCE", "LABEL"])
        .right(0)
        .right(2);
    for c in &listed {
        let at = report::parse_rfc3339(&c.taken_at).unwrap_or(now);
        table.row([
            c.checkpoint.to_string(),
            report::when(at, now),
            c.changed_since.unwrap_or(0).to_string(),
            c.label.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}
