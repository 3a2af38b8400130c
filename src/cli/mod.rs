//! The command line: the clap types of every command (each command's options live in its
//! own file under `commands/`), the state directory a command opens, and the dispatch
//! from a parsed command line to the command's `run`.
//!
//! - `commands/`: one file per command.
//! - `target.rs`: the worktree a command means; `refusals.rs`: the typed refusals
//!   commands share; `acquire.rs`: a named acquisition with its wait.
//! - `output.rs`: what several commands print alike; `progress.rs`: a slow step said.
//! - `exit.rs`: exit codes and failures as JSON; `mount_helper.rs`: `-o` lists and
//!   mount(8)'s argument order; `startup.rs`: process-wide settings made before a command
//!   runs.

pub mod acquire;
pub mod commands;
pub mod exit;
pub mod mount_helper;
pub mod output;
pub mod progress;
pub mod refusals;
pub mod report_file;
pub mod startup;
pub mod state;
pub mod target;

use std::fs;
use std::path::PathBuf;

use anyhow::anyhow;
use clap::{Args, CommandFactory, Parser, Subcommand};
use worktreefs::state::StateDir;

use crate::cli::exit::{Failed, JsonTo};

#[derive(Parser)]
#[command(
    name = "worktreefs",
    version,
    about = "Copy-on-write git worktrees for every agent, over FUSE",
    after_help = exit::EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args)]
pub struct Global {
    /// State directory (database, upper layers, caches); one daemon per state directory.
    #[arg(long, global = true, env = "WORKTREEFS_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG takes precedence.
    #[arg(long, global = true, value_parser = crate::logging::log_level, value_name = "LEVEL")]
    pub log_level: Option<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Mount the filesystem; inside a repository with no arguments, register it and use the defaults.
    ///
    /// Mount the filesystem (in the background once ready, unless --foreground). Inside a
    /// git repository with no arguments: registers that repository and uses the defaults.
    /// `-o allow_other,threads=N,linger=SECS,…` as mount.fuse3 takes them (each option
    /// the flag of its name); as a mount helper (`mount -t fuse.worktreefs STATE_DIR
    /// MOUNTPOINT`, an fstab line) through a link named mount.fuse.worktreefs.
    Mount(commands::mount::MountArgs),
    /// Release every lease, clean up, and end the mount (`--keep-sessions` for a restart).
    ///
    /// Unmount: every lease is released (reason `unmount`), worktrees left without a lease
    /// are cleaned up (removed when clean and pushed, else retained), then the mount goes.
    /// Refused, naming them, while processes are inside, unless --lazy.
    Unmount(commands::unmount::UnmountArgs),
    /// List worktrees kept because removing them would lose work.
    ///
    /// Worktrees kept by cleanup because removing them would lose work, with the reason.
    Retained(commands::retained::RetainedArgs),
    /// Remove a retained or unused worktree when nothing would be lost.
    ///
    /// Remove REPO/WT (retained, or never leased) when cleanup's checks pass: nothing
    /// uncommitted, HEAD where it was created, every commit pushed or in the base.
    Reclaim(commands::reclaim::ReclaimArgs),
    /// Keep a worktree's whole state, to rewind to later.
    ///
    /// Take a checkpoint of REPO/WT: every file the view shows (untracked and ignored
    /// ones too), the index, HEAD and the branch it names, and a merge or rebase under
    /// way. It costs O(1); what changes after it costs what it changes.
    Checkpoint(commands::checkpoint::CheckpointArgs),
    /// Bring a worktree back to one of its checkpoints (undoable).
    ///
    /// Rewind REPO/WT to checkpoint --to ID, exactly, in time proportional to what
    /// changed since. A checkpoint of the state it leaves is taken first: rewinding to
    /// it undoes the rewind. Refused while a turn runs there, while git holds its
    /// index.lock, or while processes outside your session write there.
    Rewind(commands::checkpoint::RewindArgs),
    /// List a worktree's checkpoints.
    ///
    /// A worktree's checkpoints, oldest first: number, when taken, how many paths
    /// changed since, and label.
    Checkpoints(commands::checkpoint::CheckpointsArgs),
    /// List removed worktrees that can still be restored.
    ///
    /// Removed worktrees still restorable (every removal keeps what it removed for
    /// `mount --keep-removed` hours), with their size and when they go.
    Removed(commands::removed::RemovedArgs),
    /// Bring back a removed worktree as it was.
    ///
    /// Bring back a removed worktree REPO/WT as it was: its files, its index, HEAD on its
    /// branch (made again at the kept commit if it was deleted).
    Restore(commands::restore::RestoreArgs),
    /// Registered repositories.
    #[command(subcommand)]
    Repo(commands::repo::RepoCmd),
    /// Create a worktree: REPO/NAME.
    New(commands::new::NewArgs),
    /// Take a new warm snapshot of a repository's ignored files (node_modules/, target/, .env).
    ///
    /// Take a new warm snapshot of REPO's source checkout: the ignored and untracked files
    /// its patterns match, read with your permissions. Worktrees made before keep theirs.
    Warm(commands::warm::WarmArgs),
    /// List worktrees.
    List(commands::list::ListArgs),
    /// Print what run and turn tell their commands of a worktree (its ports too).
    ///
    /// Print what `run` and `turn` tell the commands they run about REPO/WT, as `export`
    /// lines to source (or `--json`): WORKTREEFS_WORKTREE, WORKTREEFS_PATH,
    /// WORKTREEFS_SOURCE, and its block of ports, WORKTREEFS_PORT (the first) and
    /// WORKTREEFS_PORTS (how many): unique across state directories (root's, or a
    /// user's own), so servers started in two worktrees never collide.
    Env(commands::env::EnvArgs),
    /// Run a worktree's setup command again and wait for it.
    ///
    /// Run REPO/WT's setup command (`repo set --on-create`) again, as the daemon runs it
    /// in each new worktree: as the worktree's owner, with the owner's HOME, SHELL and
    /// PATH and the worktree's variables (see `env`), bounded in time. Waits for it and
    /// exits with its status (`--no-wait`: queues it and returns).
    Setup(commands::setup::SetupArgs),
    /// Print what a worktree's last setup run printed.
    SetupLog(commands::setup::SetupLogArgs),
    /// Show the state of every worktree as a table.
    Status(commands::status::StatusArgs),
    /// Named leases for orchestrators.
    #[command(subcommand)]
    Lease(commands::lease::LeaseCmd),
    /// Run a command inside a worktree, holding a lease for its lifetime.
    ///
    /// Run a command inside REPO/WT, holding a lease for exactly its lifetime; its exit
    /// status is passed through.
    Run(commands::run::RunArgs),
    /// Run a command as a session's turn: one turn at a time per worktree.
    ///
    /// Run a command as the session's turn in REPO/WT: at most one turn runs per worktree
    /// among all its holders; another is refused (exit code 3, naming the running turn) or
    /// waits (`--wait`). Takes the session's named lease if it holds none (released at the
    /// end). The turn ends when the command exits, when the session's lease is released,
    /// or when this process is gone; the command's exit status is passed through.
    Turn(commands::turn::TurnArgs),
    /// List the running turns (`turns end` ends one).
    Turns(commands::turns::TurnsArgs),
    /// List every lease.
    Leases(commands::leases::LeasesArgs),
    /// Lease and lifecycle events, oldest first.
    Events(commands::events::EventsArgs),
    /// Check that this machine can mount and serve worktrees, with a fix for each failure.
    ///
    /// Is this machine set up? Checks /dev/fuse, fusermount3, the kernel's FUSE features
    /// (passthrough, FUSE over io_uring), the state directory's permissions and free
    /// space, stale mounts and creations, the daemon's health and each repository's
    /// config; one line per check, with what to do when it fails. Exit code 1 when one
    /// fails.
    Doctor(commands::doctor::DoctorArgs),
    /// Show the disk used in the state directory, per worktree.
    ///
    /// Disk used in the state directory: each worktree's upper layer, the kept removals,
    /// the shared caches, the database, and the total (the mount is never walked).
    Du(commands::du::DuArgs),
    /// Serve the Model Context Protocol on stdio, for agent frameworks.
    ///
    /// Serve the Model Context Protocol on stdin/stdout for agent frameworks: tools to
    /// create, list and show worktrees, acquire and release named leases, run a turn,
    /// list retained and removed worktrees, reclaim and restore (each runs the command
    /// of that name with --json; a refusal is a tool error with the CLI's message).
    Mcp,
    /// Print a shell completion script.
    ///
    /// Print a completion script for SHELL on stdout: `source <(worktreefs completions
    /// bash)`, or save it where the shell looks (bash: /etc/bash_completion.d/worktreefs;
    /// zsh: a directory on $fpath as _worktreefs; fish:
    /// ~/.config/fish/completions/worktreefs.fish). In bash, zsh and fish, REPO/WT and
    /// REPO complete from the state directory's names.
    Completions(commands::completions::CompletionsArgs),
    /// Print a shell function that goes into a worktree, making it first if needed.
    ///
    /// Print a shell function for SHELL (bash, zsh or fish) that goes into a worktree in
    /// one step: `eval "$(worktreefs shell-init bash)"` in ~/.bashrc (zsh: ~/.zshrc; fish:
    /// `worktreefs shell-init fish | source` in ~/.config/fish/config.fish), then `wtcd
    /// REPO/NAME` makes the worktree when it does not exist (`new --print-path --reuse`,
    /// taking new's options) and cds into it. `--name` names the function.
    ShellInit(commands::shell_init::ShellInitArgs),
    /// Print repository or worktree names, one a line (for the completion scripts).
    #[command(name = "__names", hide = true)]
    Names(commands::completions::NamesArgs),
    /// Write the manual pages into DIR.
    ///
    /// Write the manual pages (worktreefs.1 and one per command, worktreefs-mount.1…) into
    /// DIR, made if missing: `worktreefs man /usr/local/share/man/man1`.
    Man(commands::man::ManArgs),
}

impl Command {
    /// The daemon itself: `mount --foreground`, which serves for days.
    pub fn is_daemon(&self) -> bool {
        matches!(self, Command::Mount(a) if a.foreground)
    }

    /// Whether the command keeps running for something (the daemon, the MCP server, a
    /// run or a turn holding a lease, an unmount's cleanup) and so must see a write into
    /// a closed pipe as an error rather than end by SIGPIPE.
    pub fn keeps_running(&self) -> bool {
        matches!(
            self,
            Command::Mount(_)
                | Command::Mcp
                | Command::Run(_)
                | Command::Turn(_)
                | Command::Lease(_)
                | Command::Unmount(_)
        )
    }

    /// Where a failure's JSON goes: `--json` was given (before any `--`, after which the
    /// arguments are the command's), on stderr for `run` and `turn` (their stdout is the
    /// command's), else on stdout.
    pub fn json_to(&self) -> Option<JsonTo> {
        let asked = std::env::args()
            .skip(1)
            .take_while(|a| a != "--")
            .any(|a| a == "--json");
        if !asked {
            return None;
        }
        Some(match self {
            Command::Run(_) | Command::Turn(_) => JsonTo::Stderr,
            _ => JsonTo::Stdout,
        })
    }
}

/// Runs the command `cli` names: those that need no state directory at once, the rest
/// in the state directory they open (made by `mount` and `repo add` only, and removed
/// again when the command that made it is refused).
pub fn run(cli: Cli) -> Result<(), Failed> {
    // These need (and make) no state directory.
    match &cli.command {
        Command::Completions(_)
        | Command::Names(_)
        | Command::Man(_)
        | Command::Doctor(_)
        | Command::ShellInit(_) => {
            let root = StateDir::resolve(cli.global.state_dir.clone());
            return match cli.command {
                Command::Completions(a) => commands::completions::run(a, Cli::command()),
                Command::ShellInit(a) => commands::shell_init::run(&root, a),
                Command::Names(a) => commands::completions::run_names(&root, a),
                Command::Man(a) => commands::man::run(a, Cli::command()),
                Command::Doctor(a) => commands::doctor::run(&root, a),
                _ => unreachable!("matched above"),
            };
        }
        _ => {}
    }
    // Only these make a state directory; the rest say there is none, and leave it so.
    let makes_state = matches!(
        cli.command,
        Command::Mount(_) | Command::Repo(commands::repo::RepoCmd::Add { .. })
    );
    if !makes_state {
        let root = StateDir::resolve(cli.global.state_dir.clone());
        if let Err(e) = fs::symlink_metadata(&root) {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Err(anyhow!(
                    "state dir {} does not exist: nothing is registered or mounted there yet; start with `worktreefs mount` inside a repository (or `worktreefs repo add PATH`), or pass the state dir you use with --state-dir",
                    root.display()
                )
                .into());
            }
        }
    }
    // A state directory this command makes goes again if the command is refused: a
    // mount that could not be made leaves nothing that later commands take for one. Never
    // for a daemon (`--foreground` serves for days: its end is no refusal), and only while
    // it is still empty (another command may have started using it meanwhile).
    let daemon_itself = cli.command.is_daemon();
    let fresh = makes_state && !daemon_itself && {
        let root = StateDir::resolve(cli.global.state_dir.clone());
        fs::symlink_metadata(&root).is_err()
    };
    let state = state::open_state(cli.global.state_dir.clone())?;
    let result = run_in(cli, &state);
    if fresh && result.is_err() && state::unused(&state) {
        let _ = fs::remove_dir_all(&state.root);
    }
    result
}

/// `run`, once the state directory is open.
fn run_in(cli: Cli, state: &StateDir) -> Result<(), Failed> {
    match cli.command {
        Command::Mount(a) => commands::mount::run(state, a, cli.global.log_level.as_deref()),
        Command::Unmount(a) => commands::unmount::run(state, a),
        Command::Retained(a) => commands::retained::run(state, a),
        Command::Reclaim(a) => commands::reclaim::run(state, a),
        Command::Checkpoint(a) => commands::checkpoint::run_checkpoint(state, a),
        Command::Rewind(a) => commands::checkpoint::run_rewind(state, a),
        Command::Checkpoints(a) => commands::checkpoint::run_checkpoints(state, a),
        Command::Removed(a) => commands::removed::run(state, a),
        Command::Restore(a) => commands::restore::run(state, a),
        Command::Repo(cmd) => commands::repo::run(state, cmd),
        Command::New(a) => commands::new::run(state, a),
        Command::Warm(a) => commands::warm::run(state, a),
        Command::List(a) => commands::list::run(state, a),
        Command::Env(a) => commands::env::run(state, a),
        Command::Setup(a) => commands::setup::run(state, a),
        Command::SetupLog(a) => commands::setup::run_log(state, a),
        Command::Status(a) => commands::status::run(state, a),
        Command::Lease(cmd) => commands::lease::run(state, cmd),
        Command::Run(a) => commands::run::run(state, a),
        Command::Turn(a) => commands::turn::run(state, a),
        Command::Turns(a) => commands::turns::run(state, a),
        Command::Leases(a) => commands::leases::run(state, a),
        Command::Events(a) => commands::events::run(state, a),
        Command::Du(a) => commands::du::run(state, a),
        Command::Mcp => Ok(crate::mcp::serve(state.root.clone())?),
        Command::Completions(_)
        | Command::Man(_)
        | Command::Doctor(_)
        | Command::Names(_)
        | Command::ShellInit(_) => {
            unreachable!("answered before a state directory is opened")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every option and argument of every command says what it is in `--help`.
    #[test]
    fn every_option_and_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let here = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && !cmd.is_hide_set() {
                missing.push(format!("{here} (the command)"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{here} {id}"));
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &here, missing);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
