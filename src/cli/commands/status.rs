//! `worktreefs status`: the mount and every worktree's state.

use clap::Args;
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::report::shapes;
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::inside_counts;
use crate::cli::state::open_store;

#[derive(Args)]
pub struct StatusArgs {
    /// As JSON on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: StatusArgs) -> Result<(), Failed> {
    let StatusArgs { json } = args;
    let store = open_store(state)?;
    let rows = store.worktrees()?;
    let daemon = daemon::running_daemon(state);
    let detached = daemon.as_ref().is_some_and(|d| daemon::detached(state, d));
    if json {
        let at = create::mountpoint_of(state, &store);
        let v = shapes::value(shapes::StatusJson {
            state_dir: state.root.clone(),
            mountpoint: daemon
                .as_ref()
                .filter(|_| !detached)
                .map(|d| d.mountpoint.clone()),
            detached,
            daemon_pid: daemon.as_ref().map(|d| d.pid),
            worktrees: rows
                .iter()
                .map(|w| shapes::WorktreeJson::of(w, &at))
                .collect(),
            leases: store.leases()?.iter().map(shapes::LeaseJson::of).collect(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        match daemon {
            Some(d) if detached => println!("{}", daemon::detached_message(&d)),
            Some(d) => println!(
                "mounted at {} (daemon pid {})",
                d.mountpoint.display(),
                d.pid
            ),
            None => println!("not mounted (state dir {})", state.root.display()),
        }
        let inside = inside_counts(state);
        print!("{}", {
            let setups = store.setups()?;
            let setup = crate::cli::output::setup_column(&setups);
            let extra: Vec<worktreefs::report::Column<'_>> = setup
                .as_ref()
                .map(|f| worktreefs::report::Column {
                    header: "SETUP",
                    right: false,
                    cell: f,
                })
                .into_iter()
                .collect();
            worktreefs::report::status_table(&rows, &store.leases()?, Some(&inside), &extra)
        });
    }
    Ok(())
}
