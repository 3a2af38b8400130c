//! `worktreefs doctor`: is this machine set up to mount and serve worktrees; a fix for
//! each failure.

use std::path::Path;

use clap::Args;
use worktreefs::report;

#[derive(Args)]
pub struct DoctorArgs {
    /// The checks as a JSON array on stdout (check, status ok|warn|fail, detail, fix).
    #[arg(long)]
    pub json: bool,
}

pub fn run(root: &Path, args: DoctorArgs) -> anyhow::Result<()> {
    use worktreefs::daemon::doctor::{self, Status};
    let json = args.json;
    let checks = doctor::run(root);
    if json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for c in &checks {
            println!("{:<4} {:<16} {}", c.status.as_str(), c.check, c.detail);
            if let Some(f) = &c.fix {
                println!("{:<21} fix: {f}", "");
            }
        }
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.check.as_str())
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    // Said already, check by check: the exit code is what is left to say.
    Err(report::Refusal {
        message: format!("{} check(s) failed: {}", failed.len(), failed.join(", ")),
        json: serde_json::Value::Null,
        json_to: None,
        code: 1,
    }
    .into())
}
