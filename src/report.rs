//! Human-readable tables shared by the CLI and `.control/status`.

use crate::store::{LeaseRow, WorktreeRow};

pub fn status_table(rows: &[WorktreeRow], leases: &[LeaseRow]) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:<10} {:<7} {:<24} {}\n",
        "REPO", "WORKTREE", "STATE", "LEASES", "BRANCH", "BASE"
    );
    for w in rows {
        let n = leases.iter().filter(|l| l.worktree_id == w.id).count();
        out.push_str(&format!(
            "{:<24} {:<24} {:<10} {:<7} {:<24} {}\n",
            w.repo,
            w.name,
            w.state,
            n,
            w.branch.as_deref().unwrap_or("(detached)"),
            &w.base_commit[..w.base_commit.len().min(12)]
        ));
    }
    if !leases.is_empty() {
        out.push_str("\nLEASE                                    HOLDER\n");
        for l in leases {
            out.push_str(&format!("{:<40} {}\n", l.entry_name(), l.holder_label()));
        }
    }
    out
}
