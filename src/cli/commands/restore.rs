//! `worktreefs restore`: a removed worktree brought back as it was.

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon;
use worktreefs::lifecycle::create;
use worktreefs::report::shapes::{RestoredJson, WorktreeJson};
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::{print_cd, print_json};
use crate::cli::state::open_store;
use crate::cli::target::which;

#[derive(Args)]
pub struct RestoreArgs {
    /// The removed worktree: REPO/WT, or its path under the mount (see `worktreefs
    /// removed`).
    pub target: String,
    /// Restore under this name (when REPO/WT's name is in use again).
    #[arg(long = "as", value_name = "NAME")]
    pub as_name: Option<String>,
    /// Which removal of that name (its id in `worktreefs removed`; default the newest).
    #[arg(long)]
    pub id: Option<worktreefs::ids::WorktreeId>,
    /// The restored worktree (or the refusal) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: RestoreArgs) -> Result<(), Failed> {
    let target = which(state, Some(&args.target), true)?;
    Ok(cmd_restore(
        state,
        &target,
        args.as_name.as_deref(),
        args.id,
        args.json,
    )?)
}

fn cmd_restore(
    state: &StateDir,
    target: &str,
    as_name: Option<&str>,
    id: Option<worktreefs::ids::WorktreeId>,
    json: bool,
) -> anyhow::Result<()> {
    use worktreefs::lifecycle::restore::{restore_worktree, RestoreRequest};
    let (repo, name) = target.split_once('/').ok_or_else(|| {
        anyhow!("'{target}' is not REPO/NAME; for example `worktreefs restore myrepo/task-1` (see `worktreefs removed`)")
    })?;
    let mut store = open_store(state)?;
    let done = restore_worktree(
        state,
        &mut store,
        &RestoreRequest {
            repo,
            name,
            as_name,
            id,
        },
    )?;
    daemon::poke(state);
    let mountpoint = create::mountpoint_of(state, &store);
    let path = mountpoint.join(&done.row.repo).join(&done.row.name);
    // Whether its repository's setup command runs: never for a restore, which brings back
    // what the worktree held (the setup's work with it).
    let mut notes = done.notes.clone();
    if let Some(command) = store
        .hooks_of(done.row.repo_id)
        .ok()
        .and_then(|h| h.on_create)
    {
        notes.push(format!(
            "its setup command (`{command}`) is not run: a restore brings back what the worktree held; `worktreefs setup {}/{}` runs it",
            done.row.repo, done.row.name
        ));
    }
    if json {
        print_json(RestoredJson {
            worktree: WorktreeJson::of(&done.row, &mountpoint),
            restored_from: done.from.worktree_id,
            notes,
        });
        return Ok(());
    }
    println!(
        "restored {repo}/{name} as {}/{} ({} kept, removed {} ago) on {}",
        done.row.repo,
        done.row.name,
        worktreefs::report::human_bytes(done.from.bytes.max(0) as u64),
        worktreefs::report::age(worktreefs::store::now_secs() - done.from.kept_at),
        match &done.row.branch {
            Some(b) => format!("branch {b}"),
            None => format!("a detached HEAD at {}", done.from.head.trim()),
        }
    );
    for n in &notes {
        println!("  {n}");
    }
    print_cd(state, &path);
    Ok(())
}
