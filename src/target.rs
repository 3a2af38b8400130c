//! Which worktree a command means: `REPO/WT`, a path inside the mount, or (given
//! nothing) the worktree the current directory is in. Resolved as text against the
//! mountpoint, never by looking at the mount: a lookup there would take a lease for the
//! command's process, and a mount whose daemon hangs would hang the command.

use std::path::{Component, Path, PathBuf};

/// `path` made absolute against `cwd` and normalized as text: `.` dropped, `..` taking
/// off the component before it (never above `/`).
pub fn lexical(cwd: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Where `path` is under one of `mountpoints`: None when under none of them; else the
/// components below the mountpoint (empty for the mountpoint itself).
fn below<'a>(path: &'a Path, mountpoints: &[PathBuf]) -> Option<(&'a Path, Vec<String>)> {
    mountpoints.iter().find_map(|m| {
        let rest = path.strip_prefix(m).ok()?;
        let parts = rest
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        Some((path, parts))
    })
}

/// The worktree (`REPO/WT`) that `path` (absolute, normalized) is in, under one of
/// `mountpoints`; Ok(None) when it is under none. An error says what it is instead (the
/// mount's top, a repository's directory, `.control`).
pub fn worktree_at(path: &Path, mountpoints: &[PathBuf]) -> Result<Option<String>, String> {
    let Some((path, parts)) = below(path, mountpoints) else {
        return Ok(None);
    };
    match parts.as_slice() {
        [] => Err(format!(
            "{} is the mount's top, not inside a worktree",
            path.display()
        )),
        [c, ..] if c == ".control" => Err(format!(
            "{} is in .control, not inside a worktree",
            path.display()
        )),
        [repo] => Err(format!(
            "{} is repository {repo}'s directory, not inside a worktree",
            path.display()
        )),
        [repo, wt, ..] => Ok(Some(format!("{repo}/{wt}"))),
    }
}

/// What the command was given, as `REPO/WT`.
///
/// - `REPO/WT` itself: text with exactly one `/`, not starting with `/` or `.`, whose
///   first part `is_repo` knows (else, inside the mount, it is read as a relative path).
/// - a path (absolute, or relative to `cwd`) inside a mountpoint.
/// - nothing: the worktree `cwd` is in, when `here` allows it.
///
/// The error names what was given or where the command runs, and the way out.
pub fn resolve(
    given: Option<&str>,
    cwd: Option<&Path>,
    mountpoints: &[PathBuf],
    is_repo: &dyn Fn(&str) -> bool,
) -> Result<String, String> {
    let shown = mountpoints
        .first()
        .map(|m| m.display().to_string())
        .unwrap_or_else(|| "the mount".into());
    let Some(given) = given else {
        let Some(cwd) = cwd else {
            return Err(
                "no worktree given, and the current directory cannot be read; give REPO/WT".into(),
            );
        };
        return match worktree_at(cwd, mountpoints)? {
            Some(t) => Ok(t),
            None => Err(format!(
                "no worktree given, and the current directory {} is not inside one (the mount is {shown}); give REPO/WT or a path inside the mount, or run it from inside the worktree",
                cwd.display()
            )),
        };
    };
    let one_slash = given.split('/').count() == 2
        && !given.starts_with('/')
        && !given.starts_with('.')
        && !given.ends_with('/');
    if one_slash {
        let (repo, _) = given.split_once('/').unwrap_or_default();
        let inside = cwd.is_some_and(|c| below(c, mountpoints).is_some());
        if is_repo(repo) || !inside {
            return Ok(given.to_string());
        }
    }
    if !one_slash && !given.contains('/') && given != "." && given != ".." {
        // A bare word: not a path anyone means, and not REPO/WT.
        return Err(format!(
            "'{given}' is not REPO/WT (nor a path inside the mount {shown}); for example myrepo/task-1"
        ));
    }
    let path = lexical(cwd.unwrap_or(Path::new("/")), Path::new(given));
    let found = worktree_at(&path, mountpoints);
    // Text that starts with a repository's name and is not a path inside the mount:
    // REPO/WT with a slash too many or none after it.
    if !matches!(found, Ok(Some(_))) && !given.starts_with('/') && !given.starts_with('.') {
        if let Some((repo, rest)) = given.split_once('/') {
            if is_repo(repo) {
                let rest = rest.trim_end_matches('/');
                if rest.is_empty() {
                    return Err(format!(
                        "'{given}' names repository {repo} but no worktree; give {repo}/NAME, for example {repo}/task-1"
                    ));
                }
                if !rest.contains('/') {
                    return Ok(format!("{repo}/{rest}"));
                }
                return Err(format!(
                    "'{given}' is not REPO/WT: a worktree's name is one part, with no '/' (here '{rest}'); for example {repo}/{}",
                    rest.replace('/', "-")
                ));
            }
        }
    }
    match found {
        Ok(Some(t)) => Ok(t),
        Ok(None) if one_slash => Ok(given.to_string()),
        Ok(None) => Err(format!(
            "'{given}' ({}) is not inside the mount {shown}; give REPO/WT or a path inside the mount",
            path.display()
        )),
        Err(e) => Err(format!("'{given}': {e}; give REPO/WT or a path inside a worktree")),
    }
}

/// `m` as the kernel names it in a working directory: its parent resolved (symlinks),
/// its own name kept as is, so the mount itself is never looked at.
pub fn physical(m: &Path) -> PathBuf {
    match (m.parent(), m.file_name()) {
        (Some(p), Some(n)) => std::fs::canonicalize(p)
            .map(|p| p.join(n))
            .unwrap_or_else(|_| m.to_path_buf()),
        _ => m.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mnt() -> Vec<PathBuf> {
        vec![PathBuf::from("/m/wtfs")]
    }

    fn repo(r: &str) -> bool {
        r == "repo"
    }

    fn r(given: Option<&str>, cwd: &str) -> Result<String, String> {
        resolve(given, Some(Path::new(cwd)), &mnt(), &repo)
    }

    #[test]
    fn names_and_paths_resolve_as_text() {
        assert_eq!(r(Some("repo/t"), "/home/u").unwrap(), "repo/t");
        // Unknown repository outside the mount: still REPO/WT (the command says it is not
        // registered).
        assert_eq!(r(Some("other/t"), "/home/u").unwrap(), "other/t");
        assert_eq!(r(Some("/m/wtfs/repo/t"), "/").unwrap(), "repo/t");
        assert_eq!(r(Some("/m/wtfs/repo/t/src/lib.rs"), "/").unwrap(), "repo/t");
        assert_eq!(r(Some("/m/wtfs/repo/t/"), "/").unwrap(), "repo/t");
        assert_eq!(r(Some("/m/wtfs/./repo/x/../t"), "/").unwrap(), "repo/t");
        assert_eq!(r(Some("."), "/m/wtfs/repo/t/src").unwrap(), "repo/t");
        assert_eq!(r(Some(".."), "/m/wtfs/repo/t/src").unwrap(), "repo/t");
        assert_eq!(r(Some("../../u"), "/m/wtfs/repo/t/src").unwrap(), "repo/u");
        assert_eq!(r(Some("./t"), "/m/wtfs/repo").unwrap(), "repo/t");
        // Inside the mount, REPO/WT of a known repository is still REPO/WT…
        assert_eq!(r(Some("repo/t"), "/m/wtfs/repo/u/src").unwrap(), "repo/t");
        // …and one slash naming no repository is a path relative to where you are.
        assert_eq!(r(Some("src/lib"), "/m/wtfs/repo/u").unwrap(), "repo/u");
    }

    #[test]
    fn nothing_given_means_the_worktree_you_are_in() {
        assert_eq!(r(None, "/m/wtfs/repo/t").unwrap(), "repo/t");
        assert_eq!(r(None, "/m/wtfs/repo/t/a/b/c").unwrap(), "repo/t");
        let e = r(None, "/home/u").unwrap_err();
        assert!(
            e.contains("/home/u") && e.contains("/m/wtfs") && e.contains("REPO/WT"),
            "{e}"
        );
        let e = r(None, "/m/wtfs/repo").unwrap_err();
        assert!(e.contains("repository repo's directory"), "{e}");
        let e = r(None, "/m/wtfs").unwrap_err();
        assert!(e.contains("top"), "{e}");
        let e = r(None, "/m/wtfs/.control/leases").unwrap_err();
        assert!(e.contains(".control"), "{e}");
        let e = resolve(None, None, &mnt(), &repo).unwrap_err();
        assert!(e.contains("give REPO/WT"), "{e}");
    }

    #[test]
    fn what_is_neither_is_refused_naming_it() {
        let e = r(Some("task-1"), "/home/u").unwrap_err();
        assert!(e.contains("'task-1' is not REPO/WT"), "{e}");
        let e = r(Some("/tmp/x/y"), "/home/u").unwrap_err();
        assert!(e.contains("not inside the mount /m/wtfs"), "{e}");
        let e = r(Some("../.."), "/m/wtfs/repo/t").unwrap_err();
        assert!(e.contains("top"), "{e}");
        // A known repository's name with a slash too many, or nothing after it.
        let e = r(Some("repo/a/b"), "/home/u").unwrap_err();
        assert!(
            e.contains("'repo/a/b' is not REPO/WT") && e.contains("repo/a-b"),
            "{e}"
        );
        let e = r(Some("repo/"), "/home/u").unwrap_err();
        assert!(e.contains("names repository repo but no worktree"), "{e}");
        assert_eq!(r(Some("repo/t/"), "/home/u").unwrap(), "repo/t");
        // A mountpoint's sibling with the same prefix is not inside it.
        let e = r(Some("/m/wtfs2/repo/t"), "/").unwrap_err();
        assert!(e.contains("not inside"), "{e}");
        assert_eq!(
            lexical(Path::new("/"), Path::new("../../x")),
            PathBuf::from("/x")
        );
    }
}
