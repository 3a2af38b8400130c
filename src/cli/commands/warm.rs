//! `worktreefs warm`: a new warm snapshot of a repository's source checkout.

use anyhow::anyhow;
use clap::Args;
use worktreefs::lifecycle::warm;
use worktreefs::report::shapes::{SkippedJson, SnapshotJson, WarmJson};
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::{print_json, print_taken, prune_warm};
use crate::cli::progress::Meter;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct WarmArgs {
    /// The registered repository (see `worktreefs repo list`).
    pub repo: String,
    /// The snapshot (its size, what was skipped, patterns that matched nothing) as JSON on
    /// stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: WarmArgs) -> Result<(), Failed> {
    let WarmArgs { repo, json } = args;
    let mut store = open_store(state)?;
    let row = store.repo_by_name(&repo)?.ok_or_else(|| {
        anyhow!("repository '{repo}' is not registered (see `worktreefs repo list`)")
    })?;
    let meter = Meter::new(format!("taking the warm snapshot of {repo}"));
    let tell = |c| meter.tell(c);
    let taken = warm::take(
        state,
        &mut store,
        &row,
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
        Some(&tell),
    );
    drop(meter);
    let taken = taken?;
    // The snapshot it supersedes goes now if no worktree shows it.
    let pruned = prune_warm(state, &mut store);
    if json {
        print_json(WarmJson {
            snapshot: SnapshotJson::of(&taken.row),
            links: taken.links,
            unchanged: taken.unchanged,
            patterns: taken.patterns.clone(),
            unmatched: taken.unmatched.clone(),
            skipped: taken
                .skipped
                .iter()
                .map(|(path, reason)| SkippedJson {
                    path: path.clone(),
                    reason: reason.clone(),
                })
                .collect(),
            deleted: pruned
                .as_ref()
                .map(|p| p.snapshots.iter().map(|w| w.id).collect())
                .unwrap_or_default(),
        });
    } else {
        print_taken(&repo, &taken);
        println!("worktrees made from now on with --warm show it; those made before keep theirs");
        if let Some(p) = pruned.filter(|p| !p.snapshots.is_empty()) {
            println!(
                "deleted {} older snapshot(s) no worktree shows ({} contents, {})",
                p.snapshots.len(),
                p.blobs,
                worktreefs::report::human_bytes(p.bytes)
            );
        }
    }
    Ok(())
}
