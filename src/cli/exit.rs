//! How a command ends: its exit code and, when JSON was asked for, its failure as JSON.

use std::process::ExitCode;

use worktreefs::process::supervise::{exit_code, RunError};
use worktreefs::report;

use crate::cli::report_file::{write_report, REPORT};

/// The exit codes, as `--help` ends with them (and the README gives them).
pub const EXIT_CODES: &str = "Exit codes: 0 success; 1 the request could not be carried out (the message names the thing, its state and the way out); 2 bad usage; 3 a typed conflict: the worktree cannot be had now (lease acquire, run, turn: somebody else holds it, another turn runs there, processes outside a guarded turn write there, or it is deleting, removed or unknown). run and turn otherwise exit with their command's status (127 not found, 126 not executable, 128+N ended by signal N); 124 a turn's command ran past turn --timeout and was ended.";

/// Exits with the command's status: its code, or 128 + the signal that ended it.
pub fn exit_as(status: std::process::ExitStatus) -> anyhow::Result<()> {
    match exit_code(status) {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

/// The exit code of a command that ended with `result`; a failure said on stderr as a
/// sentence, or as JSON where `json_to` says (a typed refusal with its own JSON, any
/// other failure as `failed`), and written into a turn's `--report` file.
pub fn finish(result: anyhow::Result<()>, json_to: Option<report::JsonTo>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Any other failure of a command asked for JSON is JSON too: `failed`, with
            // the message people get (a typed refusal says more, with its own `error`).
            let failed;
            let mut refusal = e.downcast_ref::<report::Refusal>();
            if refusal.is_none() && json_to.is_some() {
                let message = report::for_people(&format!("{e:#}"));
                failed = report::Refusal {
                    json: serde_json::json!({"error": "failed", "message": message}),
                    message,
                    json_to,
                    code: e
                        .downcast_ref::<RunError>()
                        .and_then(RunError::shell_code)
                        .unwrap_or(1),
                };
                refusal = Some(&failed);
            }
            // A refusal as JSON on stderr (`run --json`) is all stderr says: parseable.
            if refusal.is_none_or(|r| r.json_to != Some(report::JsonTo::Stderr)) {
                tracing::debug!("{e:#}");
                eprintln!("worktreefs: {}", report::for_people(&format!("{e:#}")));
            }
            if REPORT.get().is_some() {
                let v = match refusal {
                    Some(r) if !r.json.is_null() => r.json.clone(),
                    _ => serde_json::json!({
                        "error": "failed",
                        "message": report::for_people(&format!("{e:#}")),
                    }),
                };
                write_report(&v);
            }
            match refusal {
                Some(r) => {
                    match r.json_to {
                        Some(report::JsonTo::Stdout) => println!("{:#}", r.json),
                        Some(report::JsonTo::Stderr) => eprintln!("{:#}", r.json),
                        None => {}
                    }
                    ExitCode::from(r.code)
                }
                None => ExitCode::from(
                    e.downcast_ref::<RunError>()
                        .and_then(RunError::shell_code)
                        .unwrap_or(1),
                ),
            }
        }
    }
}
