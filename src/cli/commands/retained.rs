//! `worktreefs retained`: the worktrees cleanup kept, with the reason.

use clap::Args;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct RetainedArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: RetainedArgs) -> Result<(), Failed> {
    let RetainedArgs { json } = args;
    let store = open_store(state)?;
    let rows = store.retained()?;
    if json {
        let v: Vec<_> = rows.iter().map(report::retained_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let now = worktreefs::store::now_secs();
        let mut t = Table::new(&["WORKTREE", "BRANCH", "SINCE", "REASON"]);
        for r in rows {
            t.row([
                format!("{}/{}", r.repo, r.worktree),
                r.branch.as_deref().unwrap_or("(detached)").to_string(),
                report::when(r.entered_at, now),
                format!(
                    "{}{}",
                    r.reason,
                    r.holder_reason
                        .as_deref()
                        .map(|h| format!(" (holder: {h})"))
                        .unwrap_or_default()
                ),
            ]);
        }
        print!("{}", report::listing(&t, "no retained worktrees"));
    }
    Ok(())
}
