//! `worktreefs leases`: every lease and its holder.

use clap::Args;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct LeasesArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: LeasesArgs) -> Result<(), Failed> {
    let LeasesArgs { json } = args;
    let store = open_store(state)?;
    let rows = store.leases()?;
    if json {
        let v: Vec<_> = rows.iter().map(report::lease_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let now = worktreefs::store::now_secs();
        let mut t = Table::new(&["LEASE", "KIND", "HOLDER", "SINCE"]);
        for l in rows {
            t.row([
                l.entry_name(),
                l.holder_kind.clone(),
                l.holder_label().to_string(),
                report::when(l.acquired_at, now),
            ]);
        }
        print!("{}", report::listing(&t, "no leases"));
    }
    Ok(())
}
