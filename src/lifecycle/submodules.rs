//! A worktree's submodules as views of their own (`new --submodules`): each initialized
//! submodule (its repository in `<gitdir>/modules/<name>`, holding the commit the
//! superproject records) shows at its path as a linked worktree of that repository,
//! detached at that commit, made the first time the view looks at the path (creation
//! stays constant-time).
//!
//! On disk, per submodule: its record and layers in the worktree's own directory (the
//! format is `layout::submodules`), and git's admin entry
//! `<modules/name>/worktrees/wtfs-<worktree>-<key>`, locked like a worktree's.
//! Cleanup inspects each as a worktree of its own and counts what it holds as the
//! worktree's work; removal removes the admin entries with the worktree.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use crate::git;
use crate::ids::WorktreeId;
use crate::layout::submodules::{full_path, key_of, readable_records, SubRecord};
use crate::lifecycle::error::LifecycleResult;
use crate::state::StateDir;

impl SubRecord {
    pub fn admin(&self) -> PathBuf {
        git::admin_dir(&self.gitdir, &self.admin_name)
    }
}

/// What is at `r`'s git entry's name.
enum EntryIs {
    Absent,
    /// The one this state directory made for the view at the place asked (see
    /// [`git::Entry::check`]); complete once it has its index (written last).
    Ours(git::Entry, bool),
    /// Anything else (why, as [`git::Entry::check`] says it).
    Other(String),
}

/// What `r`'s git entry is: reached through no symlink from the submodule's git directory
/// (its owner's to make anything of), and this state directory's only when its lock says
/// so word for word, it is the worktree's owner's (`uid`) and its `gitdir` names the view
/// at its path in the worktree at `place` (`<repo>/<name>` under the mount; or the path
/// it is being moved from): the superproject's owner can rename any entry there, another
/// worktree's view's among them, into this one's name.
fn entry_is(
    state: &StateDir,
    r: &SubRecord,
    place: &str,
    uid: u32,
) -> (Option<std::os::fd::OwnedFd>, EntryIs) {
    let Some(w) = git::worktrees_dir(&r.gitdir) else {
        return (None, EntryIs::Absent);
    };
    let is = match git::Entry::open(w.as_fd(), std::ffi::OsStr::new(&r.admin_name)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => EntryIs::Absent,
        Err(e) => EntryIs::Other(format!("cannot be opened: {e}")),
        Ok(entry) => {
            let lock = crate::git::admin::admin_lock_text(&state.root);
            let ours = |b: &[u8]| b == lock.as_bytes();
            // Under its path, or (a move not finished) the one it was moved from.
            let mut checked = entry.check(ours, &format!("{place}/{}", r.path), uid);
            if let Some(from) = &r.moving_from {
                checked = checked.or_else(|_| entry.check(ours, &format!("{place}/{from}"), uid));
            }
            match checked {
                Ok(()) => {
                    let complete =
                        crate::beneath::stat_at(entry.fd(), std::ffi::OsStr::new("index")).is_ok();
                    EntryIs::Ours(entry, complete)
                }
                Err(why) => EntryIs::Other(why.to_string()),
            }
        }
    };
    (Some(w), is)
}

/// Removes `r`'s git entry when it is this state directory's own for the view at `place`
/// (see [`entry_is`]), the directory it checked and nothing renamed into its name since.
fn remove_if_ours(state: &StateDir, r: &SubRecord, place: &str, uid: u32) -> std::io::Result<()> {
    match entry_is(state, r, place, uid) {
        (Some(w), EntryIs::Ours(entry, _)) => {
            entry.remove(w.as_fd(), std::ffi::OsStr::new(&r.admin_name))
        }
        (_, EntryIs::Other(why)) => {
            tracing::warn!("{} {why}; left alone", r.admin().display());
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The submodule repository `<common>/modules/<name>`, reached without following a
/// symbolic link, every directory on the way the superproject owner's, and a repository
/// of its own (no `commondir` pointing elsewhere). None otherwise.
fn module_dir(common_dir: &Path, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let owner = fs::symlink_metadata(common_dir).ok()?.uid();
    let mut dir = common_dir.join("modules");
    let check = |d: &Path| {
        fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_dir() && m.uid() == owner)
    };
    if !check(&dir) {
        return None;
    }
    for c in name.split('/') {
        dir.push(c);
        if !check(&dir) {
            return None;
        }
    }
    if fs::symlink_metadata(dir.join("commondir")).is_ok() {
        return None;
    }
    Some(dir)
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

/// The view a submodule view is in: a worktree, or a submodule's view.
pub struct Parent<'a> {
    /// The worktree's id, repository and name (of the worktree, for a nested one too).
    pub id: WorktreeId,
    pub repo: &'a str,
    pub name: &'a str,
    /// For a submodule's view: its path in the worktree.
    pub within: Option<&'a str>,
    pub admin_name: &'a str,
    /// The superproject's common git dir.
    pub common_dir: &'a Path,
    pub base_tree: Oid,
    pub uid: u32,
    pub gid: u32,
    pub mountpoint: &'a Path,
    /// How long one run of git as the owner may take (`mount --filter-timeout`).
    pub filter_timeout: std::time::Duration,
}

/// The view of the submodule at `path` (gitlink `commit`) of the view `p`: its directory
/// and record, made now if this is the first time. None when the submodule is not
/// initialized (no `.gitmodules` entry, no repository in `modules/`, or the commit not
/// in it): the path then stays an empty directory. `origin` is the path it was made at
/// (`path` itself, unless it was moved since: its record and its name in `.gitmodules`
/// go by it); found through a stub (`via_stub`), a record still naming another path is
/// moved to `path` (a rename the daemon did not see to its end), and found at its
/// gitlink, a view moved elsewhere is not shown.
pub fn ensure(
    state: &StateDir,
    p: &Parent<'_>,
    origin: &[u8],
    path: &[u8],
    commit: Oid,
    via_stub: bool,
) -> LifecycleResult<Option<(PathBuf, SubRecord)>> {
    let (Ok(origin_s), Ok(path_s)) = (std::str::from_utf8(origin), std::str::from_utf8(path))
    else {
        return Ok(None);
    };
    let full = full_path(p.within, path_s);
    let key = key_of(full_path(p.within, origin_s).as_bytes());
    let dir = state.subs(p.id).join(&key);
    let record_path = dir.join("record");
    let record = match fs::read(&record_path) {
        Ok(bytes) => {
            let r = serde_json::from_slice::<SubRecord>(&bytes)?;
            // Checked again at each use: the repository's directories may have been
            // replaced (by a symlink, say) since the view was made.
            if module_dir(p.common_dir, &r.name).as_deref() != Some(r.gitdir.as_path()) {
                return Err(crate::lifecycle::error::refused(format!(
                    "the submodule's repository {} is no longer a directory of the repository's owner under modules/",
                    r.gitdir.display()
                )));
            }
            if r.removed {
                return Ok(None);
            }
            let place = format!("{}/{}", p.repo, p.name);
            if r.path == full && r.moving_from.is_none() {
                r
            } else if via_stub || r.path == full {
                // Found where its stub is (a move the daemon did not see to its end), or
                // a move to here not finished: its record and entry say so now.
                move_view(state, p.mountpoint, &place, p.uid, &dir, r, &full)?
            } else {
                // Its gitlink's path, but the view was moved elsewhere (its stub is
                // there): not shown here.
                return Ok(None);
            }
        }
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
            let Some(name) = name_for_path(&text, origin_s).filter(|n| name_is_safe(n)) else {
                return Ok(None);
            };
            let Some(gitdir) = module_dir(p.common_dir, &name) else {
                return Ok(None);
            };
            let Ok(sub) = Repository::open_bare(&gitdir) else {
                return Ok(None);
            };
            let Ok(c) = sub.find_commit(commit) else {
                return Ok(None);
            };
            let record = SubRecord {
                path: full.clone(),
                within: p.within.map(str::to_string),
                name,
                gitdir: gitdir.clone(),
                // The worktree's id in it: a worktree made later under the same name
                // never meets an entry of this one's.
                admin_name: format!("{}-{}-{}", p.admin_name, p.id, &key[..8]),
                commit: commit.to_string(),
                tree: c.tree_id().to_string(),
                base_mtime: super::create::index_cache::view_mtime(
                    c.committer().when().seconds(),
                    crate::store::now_secs(),
                ),
                removed: false,
                moving_from: None,
                origin: Some(full_path(p.within, origin_s)),
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
    // Complete (its index is written last) and this state directory's: used as it is.
    // Half made by us (a crash): made again. Someone else's: refused.
    let place = format!("{}/{}", p.repo, p.name);
    match entry_is(state, &record, &place, p.uid).1 {
        EntryIs::Ours(_, true) => {}
        EntryIs::Ours(_, false) | EntryIs::Absent => {
            make_admin_entry(state, p, &dir, &record, &place)?
        }
        EntryIs::Other(why) => {
            return Err(crate::lifecycle::error::refused(format!(
                "{} exists and is not this worktree's entry ({why}); it is left alone",
                admin.display()
            )))
        }
    }
    Ok(Some((dir, record)))
}

/// Moves the submodule view recorded in `dir` (of the worktree at `place`, `<repo>/<name>`
/// under `mountpoint`, owned by `uid`) to the path `to` in the worktree: the record says
/// so first, keeping the path it was at (`moving_from`), then git's entry is pointed at
/// the new place (checked as this view's under either), then the record lets the old
/// path go. A crash anywhere in between is finished by the next move (see [`ensure`]).
/// Returns the record as it now is.
pub fn move_view(
    state: &StateDir,
    mountpoint: &Path,
    place: &str,
    uid: u32,
    dir: &Path,
    mut r: SubRecord,
    to: &str,
) -> LifecycleResult<SubRecord> {
    let record_path = dir.join("record");
    let write = |r: &SubRecord| -> LifecycleResult<()> {
        crate::durable::write_file_synced(&record_path, &serde_json::to_vec_pretty(r)?)?;
        Ok(())
    };
    let mut named: Vec<String> = std::iter::once(r.path.clone())
        .chain(r.moving_from.clone())
        .collect();
    named.dedup();
    if r.path != to {
        r.moving_from = Some(r.path.clone());
        r.path = to.to_string();
        write(&r)?;
    }
    let new = format!("{place}/{to}");
    if let Some(w) = git::worktrees_dir(&r.gitdir) {
        match git::Entry::open(w.as_fd(), std::ffi::OsStr::new(&r.admin_name)) {
            Ok(entry) => {
                let lock = crate::git::admin::admin_lock_text(&state.root);
                let ours = |b: &[u8]| b == lock.as_bytes();
                let mut checked = entry.check(ours, &new, uid);
                for p in &named {
                    checked = checked.or_else(|_| entry.check(ours, &format!("{place}/{p}"), uid));
                }
                checked.map_err(|why| {
                    crate::lifecycle::error::refused(format!(
                        "{} {why}; left alone",
                        r.admin().display()
                    ))
                })?;
                let gitfile = mountpoint.join(&new).join(".git");
                crate::beneath::replace_file_at(
                    entry.fd(),
                    std::ffi::OsStr::new("gitdir"),
                    format!("{}\n", gitfile.display()).as_bytes(),
                    0o644,
                )
                .map_err(|e| {
                    crate::lifecycle::error::failed(format!(
                        "pointing {} at {new}: {e}",
                        r.admin().display()
                    ))
                })?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(crate::lifecycle::error::failed(format!(
                    "opening {}: {e}",
                    r.admin().display()
                )))
            }
        }
    }
    if let Some(from) = r.moving_from.take() {
        write(&r)?;
        tracing::info!("submodule view {place}/{from}: moved to {new}");
    }
    Ok(r)
}

/// Whether the git entry of the view recorded as `r` (of the worktree at `place`, owned
/// by `uid`) is this state directory's own for it (or absent): checked before the view
/// moves, so that a move that cannot be finished changes nothing.
pub fn entry_is_ours(
    state: &StateDir,
    r: &SubRecord,
    place: &str,
    uid: u32,
) -> LifecycleResult<()> {
    match entry_is(state, r, place, uid).1 {
        EntryIs::Other(why) => Err(crate::lifecycle::error::refused(format!(
            "{} {why}; left alone",
            r.admin().display()
        ))),
        _ => Ok(()),
    }
}

/// Records that the submodule view at `path` of worktree `id` had its directory removed
/// (durably, before the directory leaves the worktree: a crash between the two shows an
/// empty directory, and loses nothing), or, with `removed` false, takes that back.
///
/// `origin` is the path in the worktree the view was made at (which names its record).
pub fn mark_removed(
    state: &StateDir,
    id: WorktreeId,
    origin: &[u8],
    removed: bool,
) -> LifecycleResult<()> {
    set_removed(&state.subs(id).join(key_of(origin)), removed)
}

/// As [`mark_removed`], for the view whose directory (under `subs/`) is `dir`.
pub fn set_removed(dir: &Path, removed: bool) -> LifecycleResult<()> {
    let record_path = dir.join("record");
    let mut r: SubRecord = serde_json::from_slice(&fs::read(&record_path)?)?;
    if r.removed != removed {
        r.removed = removed;
        crate::durable::write_file_synced(&record_path, &serde_json::to_vec_pretty(&r)?)?;
    }
    Ok(())
}

/// git's admin entry of a submodule view, with an index of its commit's tree (cached as a
/// worktree's is) and the list of what a checkout converts there.
fn make_admin_entry(
    state: &StateDir,
    p: &Parent<'_>,
    dir: &Path,
    record: &SubRecord,
    place: &str,
) -> LifecycleResult<()> {
    let sub = Repository::open_bare(&record.gitdir)?;
    let tree = Oid::from_str(&record.tree)?;
    let setting = git::checkout::Setting::of(p.uid, p.gid, &record.gitdir, p.filter_timeout);
    let index = super::create::index_cache::cached_index(
        state,
        &sub,
        tree,
        record.base_mtime,
        p.uid,
        p.gid,
        &setting,
    )
    .map_err(|e| crate::lifecycle::error::failed(format!("{e}")))?;
    let conversions = dir.join(crate::state::CONVERSIONS_FILE);
    if !conversions.exists() {
        index.place_conversions(&conversions)?;
    }
    // Where the view is now: a directory above it may have moved while this ran (its
    // record was then moved with it).
    let now = fs::read(dir.join("record"))
        .ok()
        .and_then(|b| serde_json::from_slice::<SubRecord>(&b).ok())
        .map(|r| r.path)
        .unwrap_or_else(|| record.path.clone());
    let worktree_path = p.mountpoint.join(p.repo).join(p.name).join(&now);
    // A half-made entry of ours (a crash) is made again.
    let _ = remove_if_ours(state, record, place, p.uid);
    // The owner's, as the entry `worktreefs new` makes for them: git inside writes its
    // index, HEAD and refs' logs there (a `worktrees/` made for it is the repository
    // owner's).
    git::write_admin_entry(
        &record.gitdir,
        &record.admin_name,
        (p.uid, p.gid),
        &record.commit,
        &worktree_path.join(".git"),
        |out| index.write_for(out, &worktree_path, &record.gitdir, None),
        &crate::git::admin::admin_lock_text(&state.root),
    )?;
    Ok(())
}

/// Points each submodule view's admin entry of worktree `dir` at `worktree_path` (its
/// place under the mount), at mount.
pub fn repoint(state: &StateDir, dir: &Path, place: &str, uid: u32, worktree_path: &Path) {
    let lock = crate::git::admin::admin_lock_text(&state.root);
    for (sub_dir, r) in readable_records(dir) {
        if r.moving_from.is_some() {
            // A move not finished (a crash): finished now, pointing the entry here.
            let mountpoint = worktree_path
                .ancestors()
                .nth(place.split('/').count())
                .unwrap_or(worktree_path);
            let to = r.path.clone();
            if let Err(e) = move_view(state, mountpoint, place, uid, &sub_dir, r, &to) {
                tracing::warn!("submodule view {place}/{to}: {e:#}");
            }
            continue;
        }
        let gitfile = worktree_path.join(&r.path).join(".git");
        crate::git::admin::point_admin_entry(
            &r.gitdir,
            &r.admin_name,
            |b| b == lock.as_bytes(),
            &format!("{place}/{}", r.path),
            uid,
            &format!("{}\n", gitfile.display()),
        );
    }
}

/// Removes the git entries of the submodule views of the worktree whose records are gone
/// (its directory in the state dir was removed by hand): found by name in the
/// `worktrees/` of every submodule repository below `<gitdir>/modules` (reached through
/// no symlink), each removed only when it is this state directory's entry for a view of
/// the worktree at `place` (`<repo>/<name>`, owned by `uid`): its name starts with
/// `<admin_name>-<id>-`, and [`git::Entry::check`] holds for the view path its
/// `gitdir` names below `place`.
pub fn remove_entries_by_name(
    state: &StateDir,
    gitdir: &Path,
    admin_name: &str,
    id: WorktreeId,
    place: &str,
    worktree_path: &Path,
    uid: u32,
) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(top) = crate::beneath::open_root(gitdir) else {
        return;
    };
    let Ok(modules) = crate::beneath::dir(top.as_fd(), b"modules") else {
        return;
    };
    let Ok(dev) = crate::beneath::fstat(modules.as_fd()).map(|st| st.st_dev) else {
        return;
    };
    let prefix = format!("{admin_name}-{id}-");
    // Exactly a view's name: `<admin>-<id>-<key>`, nested `…-<key>-<id>-<key>`.
    let ours_by_name = |n: &[u8]| -> bool {
        let Some(rest) = n.strip_prefix(prefix.as_bytes()) else {
            return false;
        };
        let Ok(rest) = std::str::from_utf8(rest) else {
            return false;
        };
        let parts: Vec<&str> = rest.split('-').collect();
        let key = |k: &str| k.len() == 8 && k.bytes().all(|b| b.is_ascii_hexdigit());
        parts.len() % 2 == 1
            && parts.iter().enumerate().all(|(i, p)| {
                if i % 2 == 0 {
                    key(p)
                } else {
                    *p == id.to_string()
                }
            })
    };
    let lock = crate::git::admin::admin_lock_text(&state.root);
    let lead = format!("{}/", worktree_path.display());
    // Directories to look in: a repository's own `worktrees/` and `modules/` are looked
    // in, anything else is walked through (the parts of a module name such as
    // `vendor/lib`), on this filesystem only.
    let mut todo = vec![(modules, 0u32)];
    while let Some((dir, depth)) = todo.pop() {
        if depth > 16 {
            continue;
        }
        let is_repo = crate::beneath::stat_at(dir.as_fd(), std::ffi::OsStr::new("HEAD")).is_ok()
            && crate::beneath::dir(dir.as_fd(), b"objects").is_ok();
        if is_repo {
            if let Ok(w) = crate::beneath::dir(dir.as_fd(), b"worktrees") {
                for e in crate::beneath::list(w.as_fd()).unwrap_or_default() {
                    if !ours_by_name(e.name.as_bytes()) {
                        continue;
                    }
                    let Ok(entry) = git::Entry::open(w.as_fd(), &e.name) else {
                        continue;
                    };
                    // The view's path, from a `gitdir` that names a place in this worktree.
                    let named = entry.read("gitdir").ok().and_then(|b| {
                        let t = String::from_utf8(b).ok()?;
                        Some(t.strip_prefix(&lead)?.strip_suffix("/.git\n")?.to_string())
                    });
                    let Some(path) = named else {
                        tracing::warn!(
                            "submodule entry {} does not name a view of {place}; left alone",
                            e.name.to_string_lossy()
                        );
                        continue;
                    };
                    match entry.check(|b| b == lock.as_bytes(), &format!("{place}/{path}"), uid) {
                        Ok(()) => {
                            if let Err(err) = entry.remove(w.as_fd(), &e.name) {
                                tracing::warn!(
                                    "could not remove submodule entry {}: {err}",
                                    e.name.to_string_lossy()
                                );
                            }
                        }
                        Err(why) => tracing::warn!(
                            "submodule entry {} {why}; left alone",
                            e.name.to_string_lossy()
                        ),
                    }
                }
            }
            if let Ok(m) = crate::beneath::dir(dir.as_fd(), b"modules") {
                todo.push((m, depth + 1));
            }
            continue;
        }
        for e in crate::beneath::list(dir.as_fd()).unwrap_or_default() {
            if e.is_dir(dir.as_fd()) {
                if let Ok(d) = crate::beneath::dir(dir.as_fd(), e.name.as_bytes()) {
                    if crate::beneath::fstat(d.as_fd()).is_ok_and(|st| st.st_dev == dev) {
                        todo.push((d, depth + 1));
                    }
                }
            }
        }
    }
}

/// Removes the admin entries of the submodule views recorded in the directory `dir`
/// (live or parked) of the worktree at `place` (`<repo>/<name>`): those this state
/// directory made for them (see [`entry_is`]), none other.
pub fn remove_admin_entries(state: &StateDir, dir: &Path, place: &str, uid: u32) {
    for (_, r) in readable_records(dir) {
        if let Err(e) = remove_if_ours(state, &r, place, uid) {
            tracing::warn!(
                "could not remove submodule entry {}: {e}",
                r.admin().display()
            );
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
