//! `worktreefs events`: lease and lifecycle events, oldest first; `--follow` keeps
//! printing them.

use std::time::Duration;

use clap::Args;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct EventsArgs {
    /// One JSON object per line (NDJSON) on stdout, also with --follow (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
    /// Keep printing new events as they happen.
    #[arg(long)]
    pub follow: bool,
    /// How many past events to show (0: none, so --follow shows only new ones).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub last: i64,
}

pub fn run(state: &StateDir, args: EventsArgs) -> Result<(), Failed> {
    let EventsArgs { json, follow, last } = args;
    let store = open_store(state)?;
    // `--last 0`: no past event (with --follow, only those from now on).
    let mut after = store.last_event_id()?;
    let mut batch = if last > 0 {
        store.events(0, last)?
    } else {
        Vec::new()
    };
    let mut header_said = false;
    loop {
        if json {
            for e in &batch {
                println!("{}", report::event_json(e));
            }
        } else if !batch.is_empty() {
            // Columns sized to each batch (the header once, with the first).
            let mut t = Table::new(&["AT", "EVENT", "WORKTREE", "HOLDER", "REASON"]);
            for e in &batch {
                t.row([
                    report::rfc3339(e.at),
                    e.kind.clone(),
                    format!(
                        "{}/{}",
                        e.repo.as_deref().unwrap_or("-"),
                        e.worktree.as_deref().unwrap_or("-")
                    ),
                    e.holder.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                ]);
            }
            let text = t.render();
            let skip = if header_said {
                text.find('\n').map_or(0, |i| i + 1)
            } else {
                0
            };
            print!("{}", &text[skip..]);
            header_said = true;
        }
        if let Some(e) = batch.last() {
            after = e.id;
        }
        if !follow {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
        batch = store.events(after, 10_000)?;
    }
}
