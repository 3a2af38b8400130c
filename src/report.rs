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

/// A duration in seconds as people say it: `40 s`, `3 min`, `5 h`, `2 d`.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// The table `worktreefs removed` prints: each kept removal, its size, when it was
/// removed and when it goes.
pub fn kept_table(rows: &[crate::store::KeptRow], keep_secs: i64, now: i64) -> String {
    let mut out = format!(
        "{:<32} {:>5} {:>10} {:<12} {:<12} {:<24} HOW\n",
        "WORKTREE", "ID", "SIZE", "REMOVED", "GOES IN", "HEAD"
    );
    for k in rows {
        let head = k
            .head
            .trim()
            .strip_prefix("ref: refs/heads/")
            .map(str::to_string)
            .unwrap_or_else(|| k.head.trim().chars().take(12).collect());
        out.push_str(&format!(
            "{:<32} {:>5} {:>10} {:<12} {:<12} {:<24} {}\n",
            format!("{}/{}", k.repo, k.worktree),
            k.worktree_id,
            human_bytes(k.bytes.max(0) as u64),
            format!("{} ago", age(now - k.kept_at)),
            age(k.kept_at + keep_secs - now),
            head,
            k.how
        ));
    }
    out
}

/// `1.5 GiB`, `312 KiB`, `12 B`.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}
