//! Names of repositories and worktrees: `[A-Za-z0-9._-]`, 1..64 characters, not starting
//! with `.` or `-` (SPEC "Namespace").

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
