//! Whether a commit is safe elsewhere: reachable from another branch or a remote's ref.

use git2::{Oid, Repository};

/// Whether `tip` is reachable from some ref other than `except`: branches, tags,
/// remote-tracking refs.
pub(super) fn reachable_elsewhere(
    repo: &Repository,
    tip: Oid,
    except: Option<&str>,
) -> Result<bool, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(tip)?;
    let mut hidden = false;
    for r in repo.references()?.flatten() {
        let Some(name) = r.name() else { continue };
        if Some(name) == except
            || !(name.starts_with("refs/heads/")
                || name.starts_with("refs/tags/")
                || name.starts_with("refs/remotes/"))
        {
            continue;
        }
        if let Ok(c) = r.peel_to_commit() {
            walk.hide(c.id())?;
            hidden = true;
        }
    }
    if !hidden {
        return Ok(false);
    }
    Ok(walk.next().is_none())
}

/// The first remote-tracking ref (by name, short: `origin/main`) that reaches `tip`.
pub(super) fn pushed_to(repo: &Repository, tip: Oid) -> Option<String> {
    let mut refs: Vec<(String, Oid)> = repo
        .references_glob("refs/remotes/*")
        .ok()?
        .flatten()
        .filter_map(|r| Some((r.shorthand()?.to_string(), r.peel_to_commit().ok()?.id())))
        .collect();
    refs.sort();
    refs.into_iter()
        .take(64)
        .find(|(_, c)| *c == tip || repo.graph_descendant_of(*c, tip).unwrap_or(false))
        .map(|(name, _)| name)
}
