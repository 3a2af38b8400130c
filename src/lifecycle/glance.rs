//! What each worktree holds, at a glance (`list`): the entries of its upper layer that
//! change or add to its base, its commits ahead of and behind its upstream (or its base),
//! and when it was last active; cheap on every call after the first.
//!
//! The counts come from the upper layer's directories, never from file contents: an
//! upper entry at a path the base has is "changed" (a whiteout too), one the base has
//! not is "untracked", and a directory the base has not counts once without being
//! entered (as `git status` shows an untracked directory). That is an upper bound of what
//! `git status` lists: a file copied up and written back unchanged, or an ignored one,
//! is counted; nothing git would list is missed. Each worktree's counts are kept in
//! `<state>/glance.json` with the modification time of every directory walked: a
//! directory's entries change only with its time, so a later call re-walks only the
//! worktrees where a time moved. Ahead and behind are kept there too, for the pair of
//! commits they were counted between.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Oid, Repository, Tree};
use serde::{Deserialize, Serialize};

use crate::beneath;
use crate::ids::WorktreeId;
use crate::layout::{UpperDir, Whiteouts};
use crate::state::StateDir;
use crate::store::{RepoRow, WorktreeRow};

/// What worktree holds, at a glance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glance {
    /// Upper entries at paths its base has (modified, replaced, deleted).
    pub changed: u64,
    /// Upper entries at paths its base has not (a new directory counts once).
    pub untracked: u64,
    /// Its commits against its upstream, or its base where it has none.
    pub graph: Option<Graph>,
    /// The newest modification time of a directory of its upper layer (seconds), if it
    /// has one.
    pub touched_at: Option<i64>,
}

/// Commits ahead of and behind what a worktree's HEAD is compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    pub ahead: usize,
    pub behind: usize,
    /// The upstream it was compared with (`origin/main`), or None: its base commit.
    pub upstream: Option<String>,
}

const CACHE_VERSION: u32 = 2;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Cache {
    version: u32,
    worktrees: HashMap<WorktreeId, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// Every directory the walk read, below the upper layer (`""` its root), and its
    /// modification time in nanoseconds.
    dirs: Vec<(String, i64)>,
    changed: u64,
    untracked: u64,
    /// When the walk began (nanoseconds): a directory whose time is as new as that may
    /// have changed within the same tick of the clock after it was read (see `still`).
    walked_at: i64,
    /// The two commits counted between, and what was counted.
    graph: Option<(String, String, usize, usize)>,
}

/// How close to its walk a directory's time may be and still be trusted: a file system's
/// clock ticks coarser than nanoseconds (a jiffy), so a change right after the read may
/// leave the time as it was; such a directory is read again, as git reads a racy entry.
const RACY_NS: i64 = 2_000_000_000;

/// The cache's place.
fn cache_path(state: &StateDir) -> std::path::PathBuf {
    state.root.join("glance.json")
}

/// How long one repository's worktrees may take to be looked at: libgit2 opens a FIFO a
/// user put where a ref or an object was as a file and waits on it for good, and a hung
/// file system does the same; past this, that repository's worktrees are shown without
/// their counts, and the thread left waiting ends with the command.
const REPO_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A glance at each of `rows` (those not removed), by id. Reads and rewrites the cache;
/// a worktree whose upper layer cannot be read, or whose repository does not answer
/// within [`REPO_LIMIT`] (`slow` is told its name), is left out.
pub fn glance_all(
    state: &StateDir,
    repos: &[RepoRow],
    rows: &[WorktreeRow],
    slow: &dyn Fn(&RepoRow),
) -> HashMap<WorktreeId, Glance> {
    let mut cache: Cache = std::fs::read(cache_path(state))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|c: &Cache| c.version == CACHE_VERSION)
        .unwrap_or_default();
    let mut dirty = false;
    let mut out = HashMap::new();
    // Each repository on a thread of its own, all at once, each waited for at most the
    // limit from the start.
    let started = std::time::Instant::now();
    let mut pending = Vec::new();
    for repo_row in repos {
        let mine: Vec<WorktreeRow> = rows
            .iter()
            .filter(|r| r.repo_id == repo_row.id)
            .cloned()
            .collect();
        if mine.is_empty() {
            continue;
        }
        let cached: HashMap<WorktreeId, Entry> = mine
            .iter()
            .filter_map(|r| cache.worktrees.get(&r.id).map(|e| (r.id, e.clone())))
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let (state2, repo2) = (state.clone(), repo_row.clone());
        let spawned = std::thread::Builder::new()
            .name("glance".into())
            .spawn(move || {
                let _ = tx.send(glance_repo(&state2, &repo2, &mine, cached));
            });
        if spawned.is_ok() {
            pending.push((repo_row, rx));
        }
    }
    for (repo_row, rx) in pending {
        let left = REPO_LIMIT.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(Looked {
                glances,
                entries,
                changed,
            }) => {
                out.extend(glances);
                dirty |= changed;
                for (id, e) in entries {
                    cache.worktrees.insert(id, e);
                }
            }
            Err(_) => slow(repo_row),
        }
    }
    // Worktrees gone since are dropped from it.
    let before = cache.worktrees.len();
    cache
        .worktrees
        .retain(|id, _| rows.iter().any(|r| r.id == *id));
    dirty |= cache.worktrees.len() != before;
    if dirty {
        cache.version = CACHE_VERSION;
        save(state, &cache);
    }
    out
}

/// What looking at one repository's worktrees gave: their glances, their cache entries,
/// and whether any entry is new.
struct Looked {
    glances: HashMap<WorktreeId, Glance>,
    entries: Vec<(WorktreeId, Entry)>,
    changed: bool,
}

/// Looks at worktrees `rows` of repository `repo_row`, from their cached entries.
fn glance_repo(
    state: &StateDir,
    repo_row: &RepoRow,
    rows: &[WorktreeRow],
    mut cached: HashMap<WorktreeId, Entry>,
) -> Looked {
    let opened = Repository::open_bare(&repo_row.gitdir).ok().map(|repo| {
        let upstreams = Upstreams::of(&repo);
        (repo, upstreams)
    });
    let repo = opened.as_ref().map(|(r, _)| r);
    let mut looked = Looked {
        glances: HashMap::new(),
        entries: Vec::new(),
        changed: false,
    };
    for row in rows {
        let upper = state.upper(row.id);
        let cached = cached.remove(&row.id);
        let (mut entry, newest) = match cached.as_ref().and_then(|e| still(&upper, e)) {
            Some(newest) => (cached.expect("checked"), newest),
            None => {
                let base = repo.and_then(|r| {
                    Oid::from_str(&row.base_tree)
                        .ok()
                        .and_then(|o| r.find_tree(o).ok())
                });
                match walk(&upper, &state.work(row.id), base.as_ref(), repo) {
                    Some((e, newest)) => {
                        looked.changed = true;
                        (e, newest)
                    }
                    None => continue,
                }
            }
        };
        let graph = opened.as_ref().and_then(|(r, upstreams)| {
            let (head, other, upstream) = ends(r, upstreams, repo_row, row)?;
            let (ahead, behind) = match &entry.graph {
                Some((h, o, a, b)) if *h == head.to_string() && *o == other.to_string() => (*a, *b),
                _ => {
                    let (a, b) = r.graph_ahead_behind(head, other).ok()?;
                    entry.graph = Some((head.to_string(), other.to_string(), a, b));
                    looked.changed = true;
                    (a, b)
                }
            };
            Some(Graph {
                ahead,
                behind,
                upstream,
            })
        });
        looked.glances.insert(
            row.id,
            Glance {
                changed: entry.changed,
                untracked: entry.untracked,
                graph,
                touched_at: newest.map(|ns| ns / 1_000_000_000),
            },
        );
        looked.entries.push((row.id, entry));
    }
    looked
}

/// Written whole under a temporary name, then put in place: a reader sees the old or the
/// new. Not synced: it is a cache, rebuilt when it is lost.
fn save(state: &StateDir, cache: &Cache) {
    let path = cache_path(state);
    let tmp = state
        .root
        .join(format!(".glance.json.{}", std::process::id()));
    let Ok(bytes) = serde_json::to_vec(cache) else {
        return;
    };
    // Made new, never through a link or over a file someone put there first.
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp);
    let Ok(mut f) = made else {
        return;
    };
    if f.write_all(&bytes)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The newest time of `e`'s directories when none moved since `e` was made and none was
/// too close to the walk to be trusted (Some(None): it has none), else None.
fn still(upper: &Path, e: &Entry) -> Option<Option<i64>> {
    let mut newest = None;
    for (rel, ns) in &e.dirs {
        if *ns >= e.walked_at - RACY_NS {
            return None;
        }
        let meta = std::fs::symlink_metadata(upper.join(rel)).ok()?;
        let now = mtime_ns(&meta);
        if !meta.is_dir() || now != *ns {
            return None;
        }
        newest = newest.max(Some(now));
    }
    Some(newest)
}

fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    meta.mtime() * 1_000_000_000 + meta.mtime_nsec()
}

/// Walks the upper layer at `upper` (its whiteout files in `work`) against `base`.
fn walk(
    upper: &Path,
    work: &Path,
    base: Option<&Tree<'_>>,
    repo: Option<&Repository>,
) -> Option<(Entry, Option<i64>)> {
    let root = beneath::open_root(upper).ok()?;
    let whiteouts = beneath::open_root(work)
        .and_then(|w| Whiteouts::open(w.as_fd()))
        .unwrap_or_else(|_| Whiteouts::empty());
    let walked_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut e = Entry {
        dirs: Vec::new(),
        changed: 0,
        untracked: 0,
        walked_at,
        graph: None,
    };
    let mut rel = Vec::new();
    visit(root.as_fd(), &mut rel, base, repo, &whiteouts, &mut e).ok()?;
    let newest = e.dirs.iter().map(|(_, ns)| *ns).max();
    Some((e, newest))
}

/// How deep a walk goes (a deeper directory is counted, not entered).
const MAX_DEPTH: usize = 64;

fn visit(
    dir: BorrowedFd<'_>,
    rel: &mut Vec<u8>,
    base: Option<&Tree<'_>>,
    repo: Option<&Repository>,
    whiteouts: &Whiteouts,
    e: &mut Entry,
) -> std::io::Result<()> {
    let st = beneath::fstat(dir)?;
    e.dirs.push((
        String::from_utf8_lossy(rel).into_owned(),
        st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
    ));
    let listed = UpperDir::read(dir, whiteouts)?;
    // A deleted base directory is as many deletions as it held files (git lists each);
    // an opaque directory hides every file of the base's below it.
    for name in &listed.whiteouts {
        let hidden = base
            .and_then(|t| t.get_name_bytes(name.as_bytes()))
            .filter(|b| b.kind() == Some(git2::ObjectType::Tree))
            .and_then(|b| repo.and_then(|r| files_below(r, b.id())));
        e.changed += hidden.unwrap_or(1);
    }
    if listed.opaque {
        if let (Some(t), Some(r)) = (base, repo) {
            e.changed += files_below(r, t.id()).unwrap_or(1);
        }
    }
    for entry in &listed.entries {
        let name = entry.name.as_bytes();
        let in_base = base.and_then(|t| t.get_name_bytes(name));
        let is_dir = match entry.d_type {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => beneath::stat_at(dir, &entry.name)
                .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR),
            _ => false,
        };
        let base_tree = in_base
            .as_ref()
            .filter(|b| b.kind() == Some(git2::ObjectType::Tree))
            .and_then(|b| repo?.find_tree(b.id()).ok());
        match (is_dir, in_base.is_some(), base_tree) {
            (true, _, Some(sub)) if rel.split(|&b| b == b'/').count() < MAX_DEPTH => {
                let child = beneath::open(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                let len = rel.len();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(name);
                let r = visit(child.as_fd(), rel, Some(&sub), repo, whiteouts, e);
                rel.truncate(len);
                r?;
            }
            (_, true, _) => e.changed += 1,
            (_, false, _) => e.untracked += 1,
        }
    }
    Ok(())
}

/// Each local branch's upstream (its remote-tracking ref, or a local branch for remote
/// `.`), read from one snapshot of the repository's configuration: asking libgit2 branch
/// by branch parses the whole configuration each time, which with a thousand branches
/// configured is seconds.
#[derive(Default)]
struct Upstreams {
    by_branch: HashMap<String, String>,
}

impl Upstreams {
    fn of(repo: &Repository) -> Upstreams {
        let Ok(cfg) = repo.config().and_then(|mut c| c.snapshot()) else {
            return Upstreams::default();
        };
        let mut remote_of: HashMap<String, String> = HashMap::new();
        let mut merge_of: HashMap<String, String> = HashMap::new();
        if let Ok(mut entries) = cfg.entries(Some(r"^branch\..*\.(remote|merge)$")) {
            while let Some(Ok(e)) = entries.next() {
                let (Some(name), Some(value)) = (e.name(), e.value()) else {
                    continue;
                };
                let Some((branch, key)) = name
                    .strip_prefix("branch.")
                    .and_then(|rest| rest.rsplit_once('.'))
                else {
                    continue;
                };
                let to = match key {
                    "remote" => &mut remote_of,
                    _ => &mut merge_of,
                };
                to.insert(branch.to_string(), value.to_string());
            }
        }
        let mut fetch: HashMap<String, Vec<String>> = HashMap::new();
        let mut by_branch = HashMap::new();
        for (branch, merge) in merge_of {
            let Some(remote) = remote_of.get(&branch) else {
                continue;
            };
            if remote == "." {
                by_branch.insert(branch, merge);
                continue;
            }
            let specs = fetch.entry(remote.clone()).or_insert_with(|| {
                let mut out = Vec::new();
                if let Ok(mut m) = cfg.multivar(&format!("remote.{remote}.fetch"), None) {
                    while let Some(Ok(e)) = m.next() {
                        if let Some(v) = e.value() {
                            out.push(v.to_string());
                        }
                    }
                }
                out
            });
            if let Some(tracking) = specs.iter().find_map(|spec| transform(spec, &merge)) {
                by_branch.insert(branch, tracking);
            }
        }
        Upstreams { by_branch }
    }
}

/// `name` through fetch refspec `spec` (`+refs/heads/*:refs/remotes/origin/*`), if it
/// matches the spec's source.
fn transform(spec: &str, name: &str) -> Option<String> {
    let (src, dst) = spec.trim_start_matches('+').split_once(':')?;
    match (src.split_once('*'), dst.split_once('*')) {
        (Some((sp, ss)), Some((dp, ds))) => {
            let middle = name.strip_prefix(sp)?.strip_suffix(ss)?;
            Some(format!("{dp}{middle}{ds}"))
        }
        (None, None) if src == name => Some(dst.to_string()),
        _ => None,
    }
}

/// How many files (entries that are not trees) tree `id` holds, at every depth.
fn files_below(repo: &Repository, id: Oid) -> Option<u64> {
    let tree = repo.find_tree(id).ok()?;
    let mut n = 0u64;
    tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
        if entry.kind() != Some(git2::ObjectType::Tree) {
            n += 1;
        }
        git2::TreeWalkResult::Ok
    })
    .ok()?;
    Some(n)
}

/// Worktree `row`'s HEAD and what it is compared with: its branch's upstream (named as
/// git names it: `origin/main`), else its base commit.
fn ends(
    repo: &Repository,
    upstreams: &Upstreams,
    repo_row: &RepoRow,
    row: &WorktreeRow,
) -> Option<(Oid, Oid, Option<String>)> {
    let head =
        crate::git::admin::read_head(&crate::git::admin_dir(&repo_row.gitdir, &row.admin_name))?;
    let head = head.as_str();
    let (oid, branch) = match head.strip_prefix("ref: ") {
        Some(name) => (
            repo.refname_to_id(name).ok()?,
            name.strip_prefix("refs/heads/"),
        ),
        None => (Oid::from_str(head).ok()?, None),
    };
    let upstream = branch
        .and_then(|b| upstreams.by_branch.get(b))
        .and_then(|full| {
            let target = repo.refname_to_id(full).ok()?;
            let shown = full
                .strip_prefix("refs/remotes/")
                .or_else(|| full.strip_prefix("refs/heads/"))
                .unwrap_or(full);
            Some((target, shown.to_string()))
        });
    match upstream {
        Some((other, name)) => Some((oid, other, Some(name))),
        None => Some((oid, Oid::from_str(&row.base_commit).ok()?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache on disk keys worktrees by their id as a JSON string, as when the key was
    /// a bare integer: a cache written before reads back.
    #[test]
    fn the_cache_keys_worktrees_by_their_id_as_written_before() {
        let written = r#"{"version":2,"worktrees":{"7":{"dirs":[["",1]],"changed":1,"untracked":2,"walked_at":3,"graph":null}}}"#;
        let cache: Cache = serde_json::from_str(written).unwrap();
        assert_eq!(cache.worktrees[&WorktreeId(7)].untracked, 2);
        assert_eq!(serde_json::to_string(&cache).unwrap(), written);
    }

    /// Sets `path`'s modification time `secs` seconds back.
    fn age_by(path: &Path, secs: i64) {
        let meta = std::fs::metadata(path).unwrap();
        let t = libc::timespec {
            tv_sec: std::os::unix::fs::MetadataExt::mtime(&meta) - secs,
            tv_nsec: 0,
        };
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and two valid timespecs.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) },
            0
        );
    }

    /// Counts come from the upper layer against the base (a base directory entered, a new
    /// one counted once); a second look trusts them only while no directory's time moved
    /// and none was too close to the walk.
    #[test]
    fn a_second_look_reuses_the_counts_until_a_directory_moves() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path().join("repo.git")).unwrap();
        let blob = repo.blob(b"x").unwrap();
        let mut sub = repo.treebuilder(None).unwrap();
        sub.insert("x", blob, 0o100644).unwrap();
        let sub = sub.write().unwrap();
        let mut top = repo.treebuilder(None).unwrap();
        top.insert("a", sub, 0o040000).unwrap();
        top.insert("b", blob, 0o100644).unwrap();
        let tree = repo.find_tree(top.write().unwrap()).unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir_all(upper.join("a")).unwrap();
        std::fs::create_dir_all(upper.join("newdir/deep")).unwrap();
        std::fs::write(upper.join("a/x"), "changed").unwrap();
        std::fs::write(upper.join("a/new"), "new").unwrap();
        std::fs::write(upper.join("newdir/deep/f"), "f").unwrap();
        let work = dir.path().join("work");
        let (e, _) = walk(&upper, &work, Some(&tree), Some(&repo)).unwrap();
        assert_eq!((e.changed, e.untracked), (1, 2));
        assert_eq!(
            e.dirs.len(),
            2,
            "newdir is counted, not entered: {:?}",
            e.dirs
        );
        // Just written: too close to the walk to be trusted.
        assert!(still(&upper, &e).is_none());
        age_by(&upper, 10);
        age_by(&upper.join("a"), 10);
        let (e, newest) = walk(&upper, &work, Some(&tree), Some(&repo)).unwrap();
        assert_eq!(still(&upper, &e), Some(newest));
        // A change inside a new directory moves no count and nothing walked.
        std::fs::write(upper.join("newdir/deep/g"), "g").unwrap();
        assert!(still(&upper, &e).is_some());
        // A new entry in a base directory moves its time: looked at again.
        std::fs::write(upper.join("a/more"), "m").unwrap();
        assert!(still(&upper, &e).is_none());
    }

    #[test]
    fn a_fetch_refspec_maps_a_branch_to_its_tracking_ref() {
        let spec = "+refs/heads/*:refs/remotes/origin/*";
        assert_eq!(
            transform(spec, "refs/heads/main").as_deref(),
            Some("refs/remotes/origin/main")
        );
        assert_eq!(
            transform(spec, "refs/heads/a/b").as_deref(),
            Some("refs/remotes/origin/a/b")
        );
        assert_eq!(transform(spec, "refs/tags/v1"), None);
        assert_eq!(
            transform("refs/heads/main:refs/remotes/o/main", "refs/heads/main").as_deref(),
            Some("refs/remotes/o/main")
        );
    }
}
