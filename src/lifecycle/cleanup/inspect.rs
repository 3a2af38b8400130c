//! Inspection from the upper layer and the object database, never through the view: the
//! index and the merged view against HEAD's tree, untracked files against the ignore rules.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository, Tree};
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::decide::{Change, ChangeKind, Findings, Head};
use super::fsmonitor::{fsmonitor_valid, FsmonitorAnswers};
use super::reach::{pushed_to, reachable_elsewhere};
use super::target::Target;
use super::walk::{IndexStat, LazyCleanSide, Walker, VROOT};
use crate::beneath;
use crate::git::MODE_GITLINK;
use std::sync::Weak;

/// The largest index read (git's own are far below: 100 MB for a tree of two million
/// files).
const INDEX_CAP: u64 = 2 << 30;

/// A file of git's entry of the worktree, which its user may have made anything (see
/// [`beneath::read_regular`]): with the way out when it is not what git writes.
fn admin_file(t: &Target, name: &str, cap: u64) -> Result<(Vec<u8>, beneath::Stat), String> {
    let read = match t.admin.strip_prefix(&t.gitdir) {
        Ok(rel) => beneath::read_regular_in(&t.gitdir, &rel.join(name), cap),
        Err(_) => beneath::read_regular_in(&t.admin, Path::new(name), cap),
    };
    read.map_err(|e| {
        let path = t.admin.join(name);
        let way_out = match (e.kind(), name) {
            (std::io::ErrorKind::InvalidData, "index") => {
                "; git writes its index there as a file: remove it and run `git read-tree HEAD` in the worktree, then reclaim"
            }
            (std::io::ErrorKind::InvalidData, "HEAD") => {
                "; git writes HEAD there as a file naming the branch: write `ref: refs/heads/<branch>` back, then reclaim"
            }
            _ => "",
        };
        format!("reading {}: {e}{way_out}", path.display())
    })
}

fn read_head(t: &Target) -> Result<Head, String> {
    let (bytes, _) = admin_file(t, "HEAD", 64 << 10)?;
    let text = String::from_utf8_lossy(&bytes);
    let admin = &t.admin;
    let text = text.trim();
    if let Some(r) = text.strip_prefix("ref: ") {
        return Ok(Head::Branch(
            r.strip_prefix("refs/heads/").unwrap_or(r).to_string(),
        ));
    }
    Oid::from_str(text)
        .map(Head::Detached)
        .map_err(|_| format!("{}/HEAD holds {text:?}", admin.display()))
}

/// Inspects a worktree, with no mounted view to ask what git's fsmonitor hook would say
/// (every racily clean entry is looked at). Errors say what could not be read; the caller
/// retains on any.
pub fn inspect(t: &Target) -> Result<Findings, String> {
    inspect_asking(t, None, crate::git::filters::DEFAULT_TIMEOUT)
}

/// [`inspect`], trusting the index entries git trusts by what `answers` (the mounted
/// view) says its fsmonitor hook would answer; each run of git (the clean side of a file
/// a checkout converts) may take `filters`.
pub fn inspect_asking(
    t: &Target,
    answers: Option<&Weak<dyn FsmonitorAnswers>>,
    filters: std::time::Duration,
) -> Result<Findings, String> {
    let repo = Repository::open(&t.gitdir)
        .map_err(|e| format!("opening {}: {}", t.gitdir.display(), e.message()))?;
    if !t.admin.exists() {
        return Err(format!(
            "git's worktree entry {} is missing",
            t.admin.display()
        ));
    }
    let head = read_head(t)?;
    let head_commit = match &head {
        Head::Branch(b) => repo
            .find_reference(&format!("refs/heads/{b}"))
            .and_then(|r| r.peel_to_commit())
            .map_err(|e| format!("HEAD names branch {b}: {}", e.message()))?,
        Head::Detached(o) => repo
            .find_commit(*o)
            .map_err(|e| format!("HEAD names commit {o}: {}", e.message()))?,
    };
    let head_tree = head_commit.tree().map_err(|e| e.message().to_string())?;
    let base_commit = Oid::from_str(&t.base_commit).map_err(|e| e.message().to_string())?;
    let base_tree_id = Oid::from_str(&t.base_tree).map_err(|e| e.message().to_string())?;
    let base_tree = repo
        .find_tree(Oid::from_str(&t.base_tree).map_err(|e| e.message().to_string())?)
        .map_err(|e| format!("base tree: {}", e.message()))?;

    let mut changes = Vec::new();
    // The index against HEAD.
    // One snapshot of the index, read safely, is what libgit2, the fsmonitor bits and
    // the racy rule below all look at.
    let index_path = t.admin.join("index");
    let (raw_index, index_st) = admin_file(t, "index", INDEX_CAP)?;
    if crate::git::fsmonitor::has_extension(&raw_index, b"link") {
        // libgit2 reads no split index (its entries are half in a shared file).
        return Err(format!(
            "the index {} is split (core.splitIndex), which cleanup cannot read; run `git config core.splitIndex false && git update-index --no-split-index` in the worktree, then reclaim",
            index_path.display()
        ));
    }
    let index =
        index_from(&raw_index).map_err(|e| format!("reading {}: {e}", index_path.display()))?;
    let staged = repo
        .diff_tree_to_index(Some(&head_tree), Some(&index), None)
        .map_err(|e| format!("comparing the index with HEAD: {}", e.message()))?;
    for d in staged.deltas() {
        let p = d.new_file().path().or(d.old_file().path());
        changes.push(Change {
            kind: ChangeKind::Staged,
            path: p.map(|p| p.display().to_string()).unwrap_or_default(),
        });
    }
    // The view against HEAD.
    let upper = beneath::open_root(&t.upper)
        .map_err(|e| format!("upper layer {}: {e}", t.upper.display()))?;
    let work = t.dir.join("work");
    let whiteouts = beneath::open_root(&work)
        .and_then(|w| crate::layout::Whiteouts::open(w.as_fd()))
        .map_err(|e| format!("work directory {}: {e}", work.display()))?;
    // Where attributes or configuration may make git's clean side differ from a file's
    // bytes, a file that differs from HEAD is compared as git compares it: decided when a
    // file first differs (a clean worktree costs no look at the configuration or HEAD's
    // attributes).
    let clean_side = LazyCleanSide {
        uid: t.uid,
        gid: t.gid,
        common_dir: t.gitdir.clone(),
        head_tree: head_tree.id(),
        limit: filters,
        decided: std::cell::OnceCell::new(),
    };
    // git's stat rules, which decide before any content is read (see `IndexStat`).
    let index_mtime = u32::try_from(index_st.st_mtime).unwrap_or(u32::MAX);
    let valid = fsmonitor_valid(t, &raw_index, &index, answers);
    let index_stats = index
        .iter()
        .filter(|e| (e.flags >> 12) & 3 == 0 && e.file_size != 0)
        .map(|e| {
            (
                e.path.clone(),
                IndexStat {
                    fsmonitor_valid: valid.contains(&e.path),
                    id: e.id,
                    size: e.file_size,
                    mtime: (e.mtime.seconds() as u32, e.mtime.nanoseconds()),
                    ctime: (e.ctime.seconds() as u32, e.ctime.nanoseconds()),
                    uid: e.uid,
                    gid: e.gid,
                    racy: index_mtime <= e.mtime.seconds() as u32 || e.mtime.nanoseconds() == 0,
                },
            )
        })
        .collect();
    let mut w = Walker {
        repo: &repo,
        clean_side,
        // The view shows the snapshot's entries where the base tree has none of the
        // name, so the walk does too: its `.gitignore` files rule as git's do, and a file
        // copied up from it and still as inherited is not work. One that cannot be read
        // leaves the walk blind to both: the worktree is kept.
        warm: match &t.warm {
            Some(path) => Some(
                crate::git::warm::Snapshot::load(0, path)
                    .map_err(|e| format!("reading its warm snapshot: {e}"))?,
            ),
            None => None,
        },
        blobs: t.blobs.clone(),
        index_stats,
        changes: Vec::new(),
        global: global_excludes(&repo, &t.gitdir),
        stack: Vec::new(),
        whiteouts: &whiteouts,
    };
    let top = if w.warm.is_some() {
        crate::git::warm::Snapshot::ROOT
    } else {
        0
    };
    w.dir(
        "",
        Some(upper.as_fd()),
        Some(base_tree.clone()),
        Some(head_tree.clone()),
        top,
    )
    .map_err(|e| format!("comparing the files with HEAD: {e}"))?;
    for c in w.changes {
        if !changes.iter().any(|x: &Change| x.path == c.path) {
            changes.push(c);
        }
    }
    // Base files whose blob does not survive a checkout and a clean (a CRLF blob under
    // `text eol=crlf`, a foreign `$Id: … $`, a blob a clean filter changes), untouched
    // here: git lists them as modified once it looks at them, as in a checkout whose
    // files were touched, and so does cleanup. Only while the index still holds the
    // base's blob for them (what git compares with).
    let conversions =
        crate::git::checkout::Conversions::read(&t.dir.join(crate::state::CONVERSIONS_FILE))
            .ok()
            .flatten();
    for path in conversions.iter().flat_map(|c| c.dirty()) {
        let rel = String::from_utf8_lossy(path).into_owned();
        let touched = changes
            .iter()
            .any(|c: &Change| c.path == rel || rel.starts_with(&format!("{}/", c.path)))
            || beneath::open(upper.as_fd(), path, libc::O_PATH | libc::O_NOFOLLOW, 0).is_ok();
        let base_blob = base_tree
            .get_path(Path::new(std::ffi::OsStr::from_bytes(path)))
            .ok()
            .map(|e| e.id());
        let indexed = index.get_path(Path::new(std::ffi::OsStr::from_bytes(path)), 0);
        if !touched && base_blob.is_some() && indexed.map(|e| e.id) == base_blob {
            changes.push(Change {
                kind: ChangeKind::Modified,
                path: rel,
            });
        }
    }

    // Commits only here.
    let mut walk = repo.revwalk().map_err(|e| e.message().to_string())?;
    walk.push(head_commit.id())
        .map_err(|e| e.message().to_string())?;
    if repo.find_commit(base_commit).is_ok() {
        walk.hide(base_commit)
            .map_err(|e| e.message().to_string())?;
    }
    for r in repo
        .references_glob("refs/remotes/*")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(c) = r.peel_to_commit() {
            let _ = walk.hide(c.id());
        }
    }
    let unpushed: Vec<Oid> = walk
        .collect::<Result<_, _>>()
        .map_err(|e| format!("walking commits: {}", e.message()))?;
    // Commits on no remote-tracking ref whose content is upstream all the same (a squash
    // or rebase merge). A check that fails counts as not integrated: the worktree is kept.
    // Looked at only when it can decide (nothing uncommitted), and never for a
    // submodule's view: the superproject's upstream records a gitlink, which names the
    // submodule's commit itself.
    let no_change = head_commit.tree_id() == base_tree_id;
    let integrated = if unpushed.is_empty() || !changes.is_empty() || t.submodule.is_some() {
        None
    } else if no_change {
        // Commits that change no file (empty ones, or a change and its revert): nothing
        // of them is work, whichever ref a merge would call them part of.
        Some(match unpushed.len() {
            1 => "no changes since the base: its one commit changes no file".to_string(),
            n => format!("no changes since the base: its {n} commits change no file"),
        })
    } else {
        match crate::git::integrated::integrated_as_owner(&t.gitdir, head_commit.id(), &unpushed) {
            Ok(i) => i.map(|i| i.to_string()),
            Err(e) => {
                tracing::warn!(
                    worktree = %t.path.display(),
                    "checking whether its commits are upstream by content: {e}"
                );
                None
            }
        }
    };
    let except = match &head {
        Head::Branch(b) => Some(format!("refs/heads/{b}")),
        Head::Detached(_) => None,
    };
    let tip_elsewhere = reachable_elsewhere(&repo, head_commit.id(), except.as_deref())
        .map_err(|e| e.message().to_string())?;
    // Why nothing is lost when every commit is the base's or on a remote-tracking ref.
    let settled = unpushed.is_empty().then(|| {
        if head_commit.id() == base_commit || no_change {
            "no changes since the base".to_string()
        } else {
            match pushed_to(&repo, head_commit.id()) {
                Some(r) => format!("pushed: its commits are on {r}"),
                None => "its commits are all in the base".to_string(),
            }
        }
    });
    // Each submodule view, inspected as a worktree of its own; one whose HEAD is not the
    // commit HEAD's tree records is a change of the superproject (git lists it so).
    let mut submodules: Vec<(String, Findings)> = Vec::new();
    // Each shown submodule's repository and HEAD, by path.
    let mut heads: std::collections::HashMap<String, (PathBuf, Option<Oid>)> =
        std::collections::HashMap::new();
    for (dir, r) in crate::layout::submodules::records(&t.dir)? {
        // Recorded but its git entry never made (a crash just after the record): nothing
        // can have been done in it, unless its layer holds something.
        if !r.admin().join("index").exists()
            && fs::read_dir(dir.join("upper")).is_ok_and(|mut d| d.next().is_none())
        {
            continue;
        }
        let sub = Target {
            submodule: Some(r.path.clone()),
            id: t.id,
            repo: t.repo.clone(),
            name: format!("{}/{}", t.name, r.path),
            gitdir: r.gitdir.clone(),
            admin: r.admin(),
            upper: dir.join("upper"),
            dir,
            base_commit: r.commit.clone(),
            base_tree: r.tree.clone(),
            branch: None,
            branch_created: false,
            path: t.path.join(&r.path),
            uid: t.uid,
            gid: t.gid,
            // A submodule's view inherits nothing.
            warm: None,
            blobs: t.blobs.clone(),
        };
        // Removed, and its repository or git entry deleted since (`rm -rf .git/modules/…`
        // after `git rm`, the usual recipe): nothing of it is left to keep.
        if r.removed && !(r.gitdir.is_dir() && r.admin().is_dir()) {
            continue;
        }
        let mut found = inspect_asking(&sub, answers, filters)
            .map_err(|e| format!("submodule {}: {e}", r.path))?;
        let at = match &found.head {
            Head::Detached(o) => Some(*o),
            Head::Branch(b) => Repository::open(&r.gitdir)
                .ok()
                .and_then(|s| s.refname_to_id(&format!("refs/heads/{b}")).ok()),
        };
        if r.removed {
            // Its files went with its directory, a change of the superproject's (git lists
            // the path there); its commits, and anything else it holds (staged in its
            // index, left in its layer by a crash), are still work.
            found.changes.retain(|c| c.kind != ChangeKind::Deleted);
            submodules.push((r.path.clone(), found));
            continue;
        }
        heads.insert(r.path.clone(), (r.gitdir.clone(), at));
        // What the view it is in records at its path: the worktree's HEAD, or for a
        // submodule's own submodule the HEAD of that submodule (whose change it then is,
        // as `git status` there lists it). Records come parents first (sorted by path).
        let (recorded, rel, into) = match &r.within {
            None => (gitlink_at(&head_tree, &r.path), r.path.clone(), None),
            Some(w) => {
                let Some((gitdir, above)) = heads.get(w) else {
                    submodules.push((r.path.clone(), found));
                    continue;
                };
                let rel = r
                    .path
                    .strip_prefix(w.as_str())
                    .and_then(|p| p.strip_prefix('/'))
                    .unwrap_or(&r.path)
                    .to_string();
                let recorded = Repository::open(gitdir).ok().and_then(|repo| {
                    let tree = repo.find_commit((*above)?).ok()?.tree().ok()?;
                    gitlink_at(&tree, &rel)
                });
                (recorded, rel, Some(w.clone()))
            }
        };
        if at.is_none() || at != recorded {
            let list = match into.and_then(|w| submodules.iter_mut().find(|(p, _)| *p == w)) {
                Some((_, f)) => &mut f.changes,
                None => &mut changes,
            };
            if !list.iter().any(|c: &Change| c.path == rel) {
                list.push(Change {
                    kind: ChangeKind::Modified,
                    path: rel,
                });
            }
        }
        submodules.push((r.path.clone(), found));
    }
    Ok(Findings {
        changes,
        head,
        unpushed,
        tip_elsewhere,
        integrated,
        settled,
        submodules,
    })
}

/// The commit `tree` records at `path` as a gitlink.
fn gitlink_at(tree: &Tree<'_>, path: &str) -> Option<Oid> {
    tree.get_path(Path::new(path))
        .ok()
        .filter(|e| e.filemode() as u32 == MODE_GITLINK)
        .map(|e| e.id())
}

/// libgit2's reading of the index `raw` (it reads only from a file: an anonymous one in
/// memory, so what it reads is the snapshot and nothing a user can swap in between).
fn index_from(raw: &[u8]) -> Result<git2::Index, String> {
    use std::io::Write;
    // SAFETY: a NUL-terminated name and flags; the descriptor is owned from here.
    let fd = unsafe { libc::memfd_create(c"wtfs-index".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    let mut f = fs::File::from(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    f.write_all(raw).map_err(|e| format!("copying it: {e}"))?;
    let path = PathBuf::from(format!("/proc/self/fd/{fd}"));
    git2::Index::open(&path).map_err(|e| e.message().to_string())
}

/// An ignore file's text (`info/exclude`, `core.excludesFile`), read as git reads it
/// (through symlinks: dotfiles are often links) but opened only when it is a regular
/// file (a FIFO would hold the inspection; a device has effects of its own). None when
/// missing or not a file (a log line says which).
fn ignore_text(path: &Path) -> Option<String> {
    match beneath::read_regular_following(path, 64 << 20) {
        Ok(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        Ok(None) => {
            tracing::warn!(
                "ignore rules {} not read: not a regular file",
                path.display()
            );
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("ignore rules {} not read: {e}", path.display());
            None
        }
    }
}

/// `info/exclude` and `core.excludesFile`, the lowest-precedence ignore rules.
fn global_excludes(repo: &Repository, gitdir: &Path) -> Option<Gitignore> {
    let mut b = GitignoreBuilder::new(VROOT);
    let mut any = false;
    if let Some(text) = ignore_text(&gitdir.join("info/exclude")) {
        for line in text.lines() {
            any |= b.add_line(None, line).is_ok();
        }
    }
    let excludes = repo
        .config()
        .ok()
        .and_then(|c| c.get_path("core.excludesFile").ok())
        .or_else(|| {
            let base = std::env::var_os("XDG_CONFIG_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
            Some(base.join("git/ignore"))
        });
    if let Some(text) = excludes.and_then(|p| ignore_text(&p)) {
        for line in text.lines() {
            any |= b.add_line(None, line).is_ok();
        }
    }
    any.then(|| b.build().ok()).flatten()
}
