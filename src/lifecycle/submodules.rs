//! A worktree's submodules as views of their own (`new --submodules`): each initialized
//! submodule (its repository in `<gitdir>/modules/<name>`, holding the commit the
//! superproject records) shows at its path as a linked worktree of that repository,
//! detached at that commit, made the first time the view looks at the path (creation
//! stays constant-time).
//!
//! On disk, per submodule, in the worktree's own directory:
//! `<state>/worktrees/<id>/subs/<key>/record` (written first: what was made, so cleanup
//! and a crash find it), `upper/` and `work/` (its layers), `conversions`; and git's admin
//! entry `<modules/name>/worktrees/wtfs-<worktree>-<key>`, locked like a worktree's.
//! Cleanup inspects each as a worktree of its own and counts what it holds as the
//! worktree's work; removal removes the admin entries with the worktree.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::git;
use crate::state::StateDir;

/// One submodule's view, as recorded when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRecord {
    /// Its path in the worktree.
    pub path: String,
    /// Its name in `.gitmodules`.
    pub name: String,
    /// Its repository (`<gitdir>/modules/<name>`).
    pub gitdir: PathBuf,
    /// Its git admin entry's name in that repository's `worktrees/`.
    pub admin_name: String,
    /// The commit the superproject records, and its tree.
    pub commit: String,
    pub tree: String,
    /// The stat time of its untouched entries (the commit's time).
    pub base_mtime: i64,
}

impl SubRecord {
    pub fn admin(&self) -> PathBuf {
        git::admin_dir(&self.gitdir, &self.admin_name)
    }
}

/// The name of a submodule's directory under `subs/`: from its path.
pub fn key_of(path: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(path)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every submodule view recorded in the worktree directory `dir` (live or parked), with
/// its directory.
pub fn records(dir: &Path) -> Vec<(PathBuf, SubRecord)> {
    let mut out: Vec<(PathBuf, SubRecord)> = fs::read_dir(dir.join("subs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let bytes = fs::read(e.path().join("record")).ok()?;
            Some((e.path(), serde_json::from_slice(&bytes).ok()?))
        })
        .collect();
    out.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    out
}

/// The name `.gitmodules` (its text) gives the submodule at `path`.
pub fn name_for_path(gitmodules: &str, path: &str) -> Option<String> {
    let mut section: Option<String> = None;
    for line in gitmodules.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let inner = rest.trim_end_matches(']').trim();
            section = inner
                .strip_prefix("submodule")
                .map(|s| s.trim().trim_matches('"').to_string());
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("path") {
            let value = value.trim().trim_matches('"');
            if value.trim_end_matches('/') == path {
                return section.clone();
            }
        }
    }
    None
}

/// A name git would use as a directory under `modules/` (git refuses `..` and absolute
/// names in `.gitmodules` too).
fn name_is_safe(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && name
            .split(['/', '\\'])
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The worktree a submodule view belongs to.
pub struct Parent<'a> {
    pub id: i64,
    pub repo: &'a str,
    pub name: &'a str,
    pub admin_name: &'a str,
    /// The superproject's common git dir.
    pub common_dir: &'a Path,
    pub base_tree: Oid,
    pub uid: u32,
    pub gid: u32,
    pub mountpoint: &'a Path,
}

/// The view of the submodule at `path` (gitlink `commit`) of worktree `p`: its directory
/// and record, made now if this is the first time. None when the submodule is not
/// initialized (no `.gitmodules` entry, no repository in `modules/`, or the commit not
/// in it): the path then stays an empty directory.
pub fn ensure(
    state: &StateDir,
    p: &Parent<'_>,
    path: &[u8],
    commit: Oid,
) -> anyhow::Result<Option<(PathBuf, SubRecord)>> {
    let Ok(path_s) = std::str::from_utf8(path) else {
        return Ok(None);
    };
    let key = key_of(path);
    let dir = state.subs(p.id).join(&key);
    let record_path = dir.join("record");
    let record = match fs::read(&record_path) {
        Ok(bytes) => serde_json::from_slice::<SubRecord>(&bytes)?,
        Err(_) => {
            let repo = Repository::open(p.common_dir)?;
            let tree = repo.find_tree(p.base_tree)?;
            let Some(text) = tree
                .get_path(Path::new(".gitmodules"))
                .ok()
                .and_then(|e| repo.find_blob(e.id()).ok())
                .map(|b| String::from_utf8_lossy(b.content()).into_owned())
            else {
                return Ok(None);
            };
            let Some(name) = name_for_path(&text, path_s).filter(|n| name_is_safe(n)) else {
                return Ok(None);
            };
            let gitdir = p.common_dir.join("modules").join(&name);
            let Ok(sub) = Repository::open_bare(&gitdir) else {
                return Ok(None);
            };
            let Ok(c) = sub.find_commit(commit) else {
                return Ok(None);
            };
            let record = SubRecord {
                path: path_s.to_string(),
                name,
                gitdir: git::common_dir(&sub),
                admin_name: format!("{}-{}", p.admin_name, &key[..8]),
                commit: commit.to_string(),
                tree: c.tree_id().to_string(),
                base_mtime: c
                    .committer()
                    .when()
                    .seconds()
                    .clamp(1, crate::store::now_secs() - 1),
            };
            for d in [dir.join("upper"), dir.join("work")] {
                fs::create_dir_all(&d)?;
            }
            let _ = nix::unistd::chown(
                &dir.join("upper"),
                Some(nix::unistd::Uid::from_raw(p.uid)),
                Some(nix::unistd::Gid::from_raw(p.gid)),
            );
            crate::durable::write_file_synced(&record_path, &serde_json::to_vec_pretty(&record)?)?;
            record
        }
    };
    let admin = record.admin();
    if !admin.join("HEAD").exists() {
        make_admin_entry(state, p, &dir, &record)?;
    }
    Ok(Some((dir, record)))
}

/// git's admin entry of a submodule view, with an index of its commit's tree (cached as a
/// worktree's is) and the list of what a checkout converts there.
fn make_admin_entry(
    state: &StateDir,
    p: &Parent<'_>,
    dir: &Path,
    record: &SubRecord,
) -> anyhow::Result<()> {
    let sub = Repository::open_bare(&record.gitdir)?;
    let tree = Oid::from_str(&record.tree)?;
    let setting = git::checkout::Setting::of(p.uid, p.gid, &record.gitdir);
    let index =
        super::create::cached_index(state, &sub, tree, record.base_mtime, p.uid, p.gid, &setting)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let conversions = dir.join(crate::state::CONVERSIONS_FILE);
    if !conversions.exists() {
        index.place_conversions(&conversions)?;
    }
    let worktree_path = p.mountpoint.join(p.repo).join(p.name).join(&record.path);
    let admin = record.admin();
    // A half-made entry of ours (a crash) is made again.
    if super::cleanup::is_our_admin_entry(&admin) {
        let _ = fs::remove_dir_all(&admin);
    }
    git::write_admin_entry(
        &admin,
        &record.commit,
        &worktree_path.join(".git"),
        |out| index.write_for(out, &worktree_path, &record.gitdir),
        &super::create::admin_lock_text(state),
    )
}

/// Points each submodule view's admin entry of worktree `dir` at `worktree_path` (its
/// place under the mount), at mount.
pub fn repoint(dir: &Path, worktree_path: &Path) {
    for (_, r) in records(dir) {
        let gitfile = worktree_path.join(&r.path).join(".git");
        let admin = r.admin();
        if admin.exists() {
            let _ = fs::write(admin.join("gitdir"), format!("{}\n", gitfile.display()));
        }
    }
}

/// Removes the admin entries of the submodule views recorded in the worktree directory
/// `dir` (live or parked): those worktreefs made (locked with its marker), none other.
pub fn remove_admin_entries(dir: &Path) {
    for (_, r) in records(dir) {
        let admin = r.admin();
        if super::cleanup::is_our_admin_entry(&admin) {
            if let Err(e) = fs::remove_dir_all(&admin) {
                tracing::warn!("could not remove submodule entry {}: {e}", admin.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitmodules_names_and_unsafe_ones() {
        let text = "[submodule \"lib\"]\n\tpath = vendor/lib\n\turl = x\n[submodule \"other one\"]\n\tpath = \"b c\"\n";
        assert_eq!(name_for_path(text, "vendor/lib").as_deref(), Some("lib"));
        assert_eq!(name_for_path(text, "b c").as_deref(), Some("other one"));
        assert_eq!(name_for_path(text, "nope"), None);
        assert!(name_is_safe("a/b"));
        for bad in ["../x", "/abs", "a/../b", "", "a//b"] {
            assert!(!name_is_safe(bad), "{bad}");
        }
    }
}
