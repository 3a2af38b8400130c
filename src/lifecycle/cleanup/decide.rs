//! The decision (pure): removed, or retained with the reason, from what inspection found;
//! one row of `decision_table` per case.

use std::fmt;

use git2::Oid;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    Branch(String),
    Detached(Oid),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The index differs from HEAD.
    Staged,
    Modified,
    Deleted,
    Untracked,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub path: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.kind {
            ChangeKind::Staged => "staged",
            ChangeKind::Modified => "modified",
            ChangeKind::Deleted => "deleted",
            ChangeKind::Untracked => "untracked",
        };
        write!(f, "{code} {}", self.path)
    }
}

/// What inspection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Uncommitted changes, untracked files included, ignored files not.
    pub changes: Vec<Change>,
    pub head: Head,
    /// Commits reachable from HEAD but from neither the base commit nor a remote-tracking
    /// ref, newest first.
    pub unpushed: Vec<Oid>,
    /// HEAD's commit is reachable from a ref other than the worktree's branch (merged or
    /// pushed): deleting the branch loses nothing.
    pub tip_elsewhere: bool,
    /// When there are `unpushed` commits: their content is upstream all the same (merging
    /// HEAD into that remote-tracking ref would leave its tree unchanged, as after a
    /// squash or rebase merge), and how (`integrated: squash-merged into origin/main`).
    pub integrated: Option<String>,
    /// When no commit is `unpushed`: why nothing is lost, for the removal to say (`no
    /// changes since the base`, `pushed: its commits are on origin/main`).
    pub settled: Option<String>,
    /// What each submodule view (`new --submodules`) holds, by path.
    pub submodules: Vec<(String, Findings)>,
}

// ----- the decision -----

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `integrated`: HEAD's commits are on no remote-tracking ref but their content is
    /// upstream (the removal says so).
    Remove {
        delete_branch: bool,
        integrated: Option<String>,
    },
    Retain(String),
}

fn list<T: fmt::Display>(items: &[T], max: usize) -> String {
    let mut s: Vec<String> = items.iter().take(max).map(|i| i.to_string()).collect();
    if items.len() > max {
        s.push(format!("and {} more", items.len() - max));
    }
    s.join(", ")
}

fn short(oid: &Oid) -> String {
    oid.to_string()[..10].to_string()
}

/// `uncommitted-changes<place> (N paths: …)`.
fn changes_reason(place: &str, changes: &[Change]) -> String {
    format!(
        "uncommitted-changes{place} ({} path{}: {})",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" },
        list(changes, 5)
    )
}

/// `unpushed-commits<place> (N commits on no remote-tracking ref: …)`.
fn unpushed_reason(place: &str, commits: &[Oid]) -> String {
    let shorts: Vec<String> = commits.iter().map(short).collect();
    format!(
        "unpushed-commits{place} ({} commit{} on no remote-tracking ref: {})",
        commits.len(),
        if commits.len() == 1 { "" } else { "s" },
        list(&shorts, 5)
    )
}

/// The decision, from what inspection found (or the error it met). Pure.
pub fn decide(
    recorded_branch: Option<&str>,
    branch_created: bool,
    inspected: &Result<Findings, String>,
) -> Verdict {
    let f = match inspected {
        Ok(f) => f,
        Err(e) => return Verdict::Retain(format!("cleanup-error: {e}")),
    };
    let mut reasons = Vec::new();
    if !f.changes.is_empty() {
        reasons.push(changes_reason("", &f.changes));
    }
    let head_ok = match (&f.head, recorded_branch) {
        (Head::Branch(b), Some(r)) => b == r,
        (Head::Detached(_), None) => true,
        _ => false,
    };
    if !head_ok {
        let now = match &f.head {
            Head::Branch(b) => format!("HEAD is on branch {b}"),
            Head::Detached(o) => format!("HEAD is detached at {}", short(o)),
        };
        let was = match recorded_branch {
            Some(b) => format!("branch {b}"),
            None => "a detached HEAD".to_string(),
        };
        reasons.push(format!("branch-moved ({now}; it was created on {was})"));
    }
    // Upstream by content (a squash or rebase merge) is pushed.
    if !f.unpushed.is_empty() && f.integrated.is_none() {
        reasons.push(unpushed_reason("", &f.unpushed));
    }
    // A submodule's own changes and commits are the worktree's work too (its HEAD is
    // detached by nature: where it points is the superproject's business, seen there).
    for (path, s) in &f.submodules {
        let place = format!(" in submodule {path}");
        if !s.changes.is_empty() {
            reasons.push(changes_reason(&place, &s.changes));
        }
        if !s.unpushed.is_empty() && s.integrated.is_none() {
            reasons.push(unpushed_reason(&place, &s.unpushed));
        }
    }
    if !reasons.is_empty() {
        return Verdict::Retain(reasons.join("; "));
    }
    let integrated = f.integrated.clone().filter(|_| !f.unpushed.is_empty());
    Verdict::Remove {
        delete_branch: branch_created
            && recorded_branch.is_some()
            && (f.tip_elsewhere || integrated.is_some()),
        integrated,
    }
}

// ----- removal -----

#[cfg(test)]
mod tests {
    use super::*;
    use git2::Oid;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    fn findings(
        changes: &[(ChangeKind, &str)],
        head: Head,
        unpushed: usize,
        elsewhere: bool,
    ) -> Findings {
        Findings {
            changes: changes
                .iter()
                .map(|(k, p)| Change {
                    kind: *k,
                    path: p.to_string(),
                })
                .collect(),
            head,
            unpushed: (0..unpushed as u8).map(|i| oid(i + 1)).collect(),
            tip_elsewhere: elsewhere,
            integrated: None,
            settled: None,
            submodules: Vec::new(),
        }
    }

    fn integrated(f: Findings) -> Findings {
        Findings {
            integrated: Some("integrated: squash-merged into origin/main".into()),
            ..f
        }
    }

    /// (case, recorded branch, created by worktreefs, inspection, the verdict or the start
    /// of the reason it is retained for)
    type Row = (
        &'static str,
        Option<&'static str>,
        bool,
        Result<Findings, String>,
        Result<Verdict, &'static str>,
    );

    #[test]
    fn decision_table() {
        use ChangeKind::*;
        let on = || Head::Branch("task".into());
        let remove = |b: bool| {
            Ok::<Verdict, &str>(Verdict::Remove {
                delete_branch: b,
                integrated: None,
            })
        };
        let remove_integrated = |b: bool| {
            Ok::<Verdict, &str>(Verdict::Remove {
                delete_branch: b,
                integrated: Some("integrated: squash-merged into origin/main".into()),
            })
        };
        let rows: Vec<Row> = vec![
            (
                "clean, nothing new, branch reachable from main",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "clean, pushed",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "clean, pushed, branch existed before",
                Some("task"),
                false,
                Ok(findings(&[], on(), 0, true)),
                remove(false),
            ),
            (
                "clean, no upstream, no new commit, base on no other ref",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, false)),
                remove(false),
            ),
            (
                "ignored files only (inspection reports none)",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "dirty",
                Some("task"),
                true,
                Ok(findings(&[(Modified, "a.c")], on(), 0, true)),
                Err("uncommitted-changes (1 path: modified a.c)"),
            ),
            (
                "staged only",
                Some("task"),
                true,
                Ok(findings(&[(Staged, "a.c")], on(), 0, true)),
                Err("uncommitted-changes"),
            ),
            (
                "untracked only",
                Some("task"),
                true,
                Ok(findings(&[(Untracked, "new.txt")], on(), 0, true)),
                Err("uncommitted-changes (1 path: untracked new.txt)"),
            ),
            (
                "deleted file",
                Some("task"),
                true,
                Ok(findings(&[(Deleted, "README")], on(), 0, true)),
                Err("uncommitted-changes"),
            ),
            (
                "unpushed, no upstream",
                Some("task"),
                true,
                Ok(findings(&[], on(), 2, false)),
                Err("unpushed-commits (2 commits"),
            ),
            (
                "unpushed, but squash-merged upstream: removed, its branch deleted",
                Some("task"),
                true,
                Ok(integrated(findings(&[], on(), 2, false))),
                remove_integrated(true),
            ),
            (
                "squash-merged upstream, branch existed before: kept",
                Some("task"),
                false,
                Ok(integrated(findings(&[], on(), 2, false))),
                remove_integrated(false),
            ),
            (
                "squash-merged upstream, but dirty",
                Some("task"),
                true,
                Ok(integrated(findings(&[(Modified, "x")], on(), 1, false))),
                Err("uncommitted-changes (1 path: modified x)"),
            ),
            (
                "squash-merged upstream, but HEAD moved to another branch",
                Some("task"),
                true,
                Ok(integrated(findings(
                    &[],
                    Head::Branch("other".into()),
                    1,
                    false,
                ))),
                Err("branch-moved"),
            ),
            (
                "nothing unpushed: an integration found says nothing",
                Some("task"),
                true,
                Ok(integrated(findings(&[], on(), 0, true))),
                remove(true),
            ),
            (
                "unpushed and dirty",
                Some("task"),
                true,
                Ok(findings(&[(Modified, "x")], on(), 1, false)),
                Err("uncommitted-changes (1 path: modified x); unpushed-commits (1 commit"),
            ),
            (
                "branch moved",
                Some("task"),
                true,
                Ok(findings(&[], Head::Branch("other".into()), 0, true)),
                Err("branch-moved (HEAD is on branch other; it was created on branch task)"),
            ),
            (
                "detached",
                Some("task"),
                true,
                Ok(findings(&[], Head::Detached(oid(9)), 0, true)),
                Err("branch-moved (HEAD is detached at 0909090909"),
            ),
            (
                "detached where detached was recorded",
                None,
                false,
                Ok(findings(&[], Head::Detached(oid(9)), 0, true)),
                remove(false),
            ),
            (
                "error while inspecting",
                Some("task"),
                true,
                Err("reading index: boom".into()),
                Err("cleanup-error: reading index: boom"),
            ),
        ];
        for (case, branch, created, inspected, want) in rows {
            let got = decide(branch, created, &inspected);
            match want {
                Ok(v) => assert_eq!(got, v, "{case}"),
                Err(prefix) => match got {
                    Verdict::Retain(r) => assert!(
                        r.starts_with(prefix),
                        "{case}: {r:?} does not start with {prefix:?}"
                    ),
                    other => panic!("{case}: {other:?}, want retained"),
                },
            }
        }
    }
}
