//! Names of repositories and worktrees: `[A-Za-z0-9._-]`, 1..64 characters, not starting
//! with `.` or `-` (docs/contract.md, "Namespace of a mount").

pub const MAX_NAME_LEN: usize = 64;

/// Checks a repository or worktree name; the error names the offending input and the rule.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let rule = "names use only A-Z a-z 0-9 . _ -, are 1 to 64 characters long, and do not start with '.' or '-'";
    if name.is_empty() {
        return Err(format!("{kind} name is empty: {rule}"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{kind} name '{name}' is {} characters long: {rule}",
            name.len()
        ));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(format!(
            "{kind} name '{name}' starts with '{}': {rule}",
            &name[..1]
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("{kind} name '{name}' contains {bad:?}: {rule}"));
    }
    Ok(())
}

/// Whether git takes `name` as a branch name, by the rules of `git check-ref-format
/// --branch` (refs/heads/NAME must be a valid ref): not `HEAD` nor starting with `-`; no
/// empty component (a leading, trailing or doubled `/`); no component starting with `.`
/// or ending with `.lock`; no `..`, `@{`, lone `@`, control character, space, `~ ^ : ? * [
/// \`, and no `.` at the end. The error says which rule `name` breaks.
pub fn validate_branch_name(name: &str) -> Result<(), String> {
    let refused = |why: &str| {
        Err(format!(
            "'{name}' is not a name git allows for a branch: {why}"
        ))
    };
    if name.is_empty() {
        return refused("it is empty");
    }
    if name == "HEAD" {
        return refused("HEAD names the checked-out commit");
    }
    if name.starts_with('-') {
        return refused("it starts with '-'");
    }
    if name == "@" {
        return refused("'@' alone stands for HEAD");
    }
    if name.contains("..") {
        return refused("it contains '..'");
    }
    if name.contains("@{") {
        return refused("it contains '@{'");
    }
    if name.ends_with('.') {
        return refused("it ends with '.'");
    }
    if let Some(c) = name.chars().find(|c| {
        c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
    }) {
        return refused(&format!("it contains {c:?}"));
    }
    for part in name.split('/') {
        if part.is_empty() {
            return refused("it has an empty part between '/'s (or one at its start or end)");
        }
        if part.starts_with('.') {
            return refused(&format!("its part '{part}' starts with '.'"));
        }
        if part.ends_with(".lock") {
            return refused(&format!("its part '{part}' ends with '.lock'"));
        }
    }
    Ok(())
}

/// Turns a directory name into a valid repository name (for `mount` on embedded defaults).
pub fn sanitize_name(raw: &str) -> String {
    let mut out: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    while out.starts_with('.') || out.starts_with('-') {
        out.remove(0);
    }
    out.truncate(MAX_NAME_LEN);
    if out.is_empty() {
        out = "repo".to_string();
    }
    out
}

/// The candidate closest to `want` by edit distance, when it is close enough to be what
/// was meant (at most 2 edits, or a third of the name's length for long names): for a
/// "did you mean" after a name that does not exist.
pub fn closest<'a>(want: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (want.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .filter(|c| *c != want)
        .map(|c| (edit_distance(want, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (up + 1).min(row[j] + 1).min(diag + usize::from(ca != *cb));
            diag = up;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules() {
        let cases: &[(&str, bool)] = &[
            ("a", true),
            ("feature-1.2_x", true),
            ("A0", true),
            ("", false),
            (".hidden", false),
            ("-flag", false),
            ("has space", false),
            ("slash/inside", false),
            ("dot..ok", true),
            ("ünicode", false),
            ("..", false),
            (&"x".repeat(64), true),
            (&"x".repeat(65), false),
        ];
        for (name, ok) in cases {
            assert_eq!(validate_name("worktree", name).is_ok(), *ok, "{name:?}");
        }
    }

    /// The rules agree with git's own `check-ref-format --branch` on every case.
    #[test]
    fn branch_names_are_checked_as_git_checks_them() {
        let cases = [
            "main",
            "HEAD",
            "head",
            "x.lock",
            "x.lock.y",
            "a..b",
            "a.",
            ".a",
            "a/.b",
            "a/b",
            "a//b",
            "/a",
            "a/",
            "-a",
            "a-",
            "a@b",
            "a@{b",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[b",
            "a\\b",
            "feature/x.lock/y",
            "a/b.lock",
            "dot..ok",
            "v1.2",
            "\u{7f}x",
            "",
        ];
        for name in cases {
            let by_git = std::process::Command::new("git")
                .args(["check-ref-format", "--branch", name])
                .output()
                .expect("git runs");
            assert_eq!(
                validate_branch_name(name).is_ok(),
                by_git.status.success(),
                "{name:?}: ours {:?}, git's {}",
                validate_branch_name(name),
                String::from_utf8_lossy(&by_git.stderr)
            );
        }
        // A lone '@' git's --branch reads as the current branch, so it never makes a
        // branch of that name: refused here.
        assert!(validate_branch_name("@").is_err());
        let e = validate_branch_name("HEAD").unwrap_err();
        assert!(e.contains("'HEAD'") && e.contains("checked-out"), "{e}");
    }

    #[test]
    fn error_names_the_input() {
        let err = validate_name("worktree", "bad name").unwrap_err();
        assert!(err.contains("'bad name'"), "{err}");
    }

    #[test]
    fn sanitize_makes_valid_names() {
        for raw in ["my repo", ".dot", "--x", "", "ok"] {
            let s = sanitize_name(raw);
            assert!(validate_name("repo", &s).is_ok(), "{raw:?} -> {s:?}");
        }
    }

    #[test]
    fn the_closest_name_is_offered_only_when_close() {
        let names = ["exists", "task-1", "task-2", "feature-login"];
        assert_eq!(super::closest("exist", names), Some("exists"));
        assert_eq!(super::closest("exits", names), Some("exists"));
        assert_eq!(super::closest("task-3", names), Some("task-1"));
        assert_eq!(super::closest("feature-logn", names), Some("feature-login"));
        assert_eq!(super::closest("other", names), None);
        assert_eq!(super::closest("exists", ["exists"]), None, "not itself");
        assert_eq!(super::edit_distance("", "abc"), 3);
        assert_eq!(super::edit_distance("kitten", "sitting"), 3);
    }
}
