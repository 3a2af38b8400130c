//! `worktreefs completions` and the hidden `__names` the completion scripts call.

use std::path::Path;

use clap::Args;

use crate::completion;

use crate::cli::exit::Failed;

#[derive(Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

#[derive(Args)]
pub struct NamesArgs {
    /// What to list: worktrees, removed (restorable) worktrees, or repos.
    pub kind: completion::Names,
}

/// `cli`: the whole command line's definition, which the script completes.
pub fn run(args: CompletionsArgs, mut cli: clap::Command) -> Result<(), Failed> {
    let mut clap_script = Vec::new();
    clap_complete::generate(args.shell, &mut cli, "worktreefs", &mut clap_script);
    print!(
        "{}",
        completion::script(
            args.shell,
            String::from_utf8_lossy(&clap_script).into_owned()
        )
    );
    Ok(())
}

/// `__names`: the names the completion scripts offer, from the state directory `root`
/// (nothing when there is none).
pub fn run_names(root: &Path, args: NamesArgs) -> Result<(), Failed> {
    completion::print_names(root, args.kind);
    Ok(())
}
