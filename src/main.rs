//! The `worktreefs` command line. Exit codes: 0 success, 1 the request could not be carried
//! out (the message names the thing, its state and the way out), 2 bad usage; `--help`
//! ends with the rest (`cli::exit::EXIT_CODES`).
//!
//! This file only orders the start: the mount helper's arguments translated, the command
//! line parsed, the process-wide settings made, the command run and its end turned into
//! an exit code. Everything else is `cli/` (the commands), `mcp.rs` (the MCP server),
//! `completion.rs` and `logging.rs`.

mod cli;
mod completion;
mod logging;
mod mcp;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let args = match cli::mount_helper::mount_command_line(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("worktreefs: {e}");
            return ExitCode::from(worktreefs::report::EXIT_USAGE);
        }
    };
    let cli = Cli::parse_from(args);
    cli::startup::settle(&cli.command, cli.global.log_level.as_deref());
    let json_to = cli.command.json_to();
    if let Command::Turn(turn) = &cli.command {
        if let Some(path) = &turn.report {
            // As any failure of `turn`: with --json, the JSON is all stderr says.
            if let Err(e) = cli::report_file::hold_report(path) {
                return cli::exit::finish(Err(e.into()), json_to);
            }
        }
    }
    cli::exit::finish(cli::run(cli), json_to)
}
