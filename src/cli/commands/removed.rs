//! `worktreefs removed`: the kept removals that `restore` can bring back.

use clap::Args;
use worktreefs::lifecycle::cleanup::keep::KeepPolicy;
use worktreefs::report;
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct RemovedArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: RemovedArgs) -> Result<(), Failed> {
    Ok(cmd_removed(state, args.json)?)
}

/// The kept removals as JSON objects: the row and where the copy is, when it goes.
fn kept_json(
    state: &StateDir,
    rows: &[worktreefs::store::KeptRow],
    keep_secs: i64,
) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|k| report::kept_json(k, keep_secs, Some(&state.removed_dir(k.worktree_id))))
        .collect()
}

fn cmd_removed(state: &StateDir, json: bool) -> anyhow::Result<()> {
    let store = open_store(state)?;
    let rows = store.kept()?;
    let policy = KeepPolicy::of(&store);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&kept_json(state, &rows, policy.keep_secs))?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no removed worktree is kept");
        return Ok(());
    }
    print!(
        "{}",
        worktreefs::report::kept_table(&rows, policy.keep_secs, worktreefs::store::now_secs())
    );
    println!(
        "restore one with `worktreefs restore REPO/WT` (--as NAME if the name is in use again)"
    );
    Ok(())
}
