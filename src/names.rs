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
}
