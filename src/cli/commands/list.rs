//! `worktreefs list`: every worktree, its state, leases and the processes inside.

use clap::Args;
use worktreefs::lifecycle::create;
use worktreefs::report::shapes::{SetupJson, WorktreeJson};
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::{inside_counts, print_json};
use crate::cli::state::open_store;

#[derive(Args)]
pub struct ListArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: ListArgs) -> Result<(), Failed> {
    let ListArgs { json } = args;
    let store = open_store(state)?;
    let rows = store.worktrees()?;
    let mountpoint = create::mountpoint_of(state, &store);
    let inside = inside_counts(state);
    if json {
        let setups = store.setups()?;
        let out: Vec<_> = rows
            .iter()
            .map(|w| WorktreeJson {
                processes_inside: Some(inside(w) as u64),
                setup: setups
                    .iter()
                    .find(|s| s.worktree_id == w.id)
                    .map(SetupJson::of),
                ..WorktreeJson::of(w, &mountpoint)
            })
            .collect();
        print_json(out);
    } else {
        print!(
            "{}",
            worktreefs::report::status_table(
                &rows,
                &store.leases()?,
                Some(&inside),
                &store.setups()?,
            )
        );
    }
    Ok(())
}
