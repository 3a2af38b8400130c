//! Human-readable tables shared by the CLI and `.control/status`.

use crate::store::WorktreeRow;

pub fn status_table(rows: &[WorktreeRow]) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:<10} {:<24} {}\n",
        "REPO", "WORKTREE", "STATE", "BRANCH", "BASE"
    );
    for w in rows {
        out.push_str(&format!(
            "{:<24} {:<24} {:<10} {:<24} {}\n",
            w.repo,
            w.name,
            w.state,
            w.branch.as_deref().unwrap_or("(detached)"),
            &w.base_commit[..w.base_commit.len().min(12)]
        ));
    }
    out
}
