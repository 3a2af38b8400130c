//! `worktreefs env [REPO/WT]`: what `run` and `turn` tell the commands they run about
//! the worktree (its name, path, source checkout, block of ports), as `export` lines to
//! source or as JSON.

use clap::Args;
use worktreefs::lifecycle::{create, ports};
use worktreefs::report::shapes::EnvJson;
use worktreefs::report::shell_word;
use worktreefs::state::StateDir;

use crate::cli::exit::Failed;
use crate::cli::output::print_json;
use crate::cli::refusals::runnable_worktree;
use crate::cli::state::open_store;
use crate::cli::target::{split_target, which};

#[derive(Args)]
pub struct EnvArgs {
    /// REPO/WT (or a path inside the mount; default: the worktree the current directory
    /// is in).
    pub target: Option<String>,
    /// As one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: EnvArgs) -> Result<(), Failed> {
    let target = which(state, args.target.as_deref(), false)?;
    let (repo, name) = split_target(&target)?;
    let store = open_store(state)?;
    let row = runnable_worktree(&store, repo, name)?;
    let path = create::mountpoint_of(state, &store).join(repo).join(name);
    let env = ports::environment(&store, &row, &path);
    if args.json {
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        print_json(EnvJson {
            worktree: format!("{repo}/{name}"),
            path: path.display().to_string(),
            source: get("WORKTREEFS_SOURCE"),
            port: get("WORKTREEFS_PORT").and_then(|p| p.parse().ok()),
            ports: get("WORKTREEFS_PORTS").and_then(|p| p.parse().ok()),
        });
        return Ok(());
    }
    for (k, v) in &env {
        println!("export {k}={}", shell_word(v));
    }
    Ok(())
}
