//! `worktreefs du`: the disk used in the state directory, per worktree.

use clap::Args;
use worktreefs::state::StateDir;
use worktreefs::table::Table;

use crate::cli::state::open_store;
use crate::cli::target::which;

#[derive(Args)]
pub struct DuArgs {
    /// Only this worktree: REPO/WT, or a path inside it under the mount (default:
    /// the worktree the current directory is in, else everything).
    pub target: Option<String>,
    /// As JSON on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: DuArgs) -> anyhow::Result<()> {
    cmd_du(state, args.target.as_deref(), args.json)
}

fn cmd_du(state: &StateDir, target: Option<&str>, json: bool) -> anyhow::Result<()> {
    use worktreefs::report::human_bytes;
    let given = match target {
        Some(t) => Some(which(state, Some(t), false)?),
        // Inside a worktree: that one; elsewhere: everything.
        None => which(state, None, false).ok(),
    };
    let only = given.as_deref().and_then(|t| t.split_once('/'));
    let store = open_store(state)?;
    let r = worktreefs::daemon::du::report(state, &store, only)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = Table::new(&["WORKTREE", "STATE", "DISK", "ENTRIES"])
        .right(2)
        .right(3);
    for w in &r.worktrees {
        t.row([
            w.worktree.clone(),
            w.state.to_string(),
            human_bytes(w.usage.bytes),
            w.usage.entries.to_string(),
        ]);
    }
    print!("{}", t.render());
    if only.is_some() {
        return Ok(());
    }
    let sum = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
    println!(
        "kept removals: {} in {} (`worktreefs removed`)",
        human_bytes(sum(&mut r.removed.iter().map(|k| k.usage.bytes))),
        r.removed.len()
    );
    println!(
        "shared: content store {}, warm snapshots {}, index cache {}; database {}; being deleted {}",
        human_bytes(r.blobs.bytes),
        human_bytes(r.warm.bytes),
        human_bytes(r.index_cache.bytes),
        human_bytes(r.database.bytes),
        human_bytes(r.trash.bytes)
    );
    println!(
        "total {} in {} (each file once; the mount is not counted)",
        human_bytes(r.total.bytes),
        r.state_dir.display()
    );
    Ok(())
}
