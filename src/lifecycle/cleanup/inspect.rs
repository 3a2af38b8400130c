//! Inspection from the upper layer and the object database, never through the view: the
//! index and the merged view against HEAD's tree, untracked files against the ignore rules.

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, Tree};
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::decide::{Change, ChangeKind, Findings, Head};
use super::target::Target;
use crate::beneath;
use crate::git::{MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::layout::UpperDir;

/// What the mounted filesystem's fsmonitor hook would answer, asked without counting as
/// a query (the lifecycle does not name the filesystem; `fs` registers its view here).
pub trait FsmonitorAnswers: Send + Sync {
    /// The paths worktree `worktree`'s hook would report as changed since `token`; None
    /// when it would not answer exactly (a token of another instance, a journal that no
    /// longer reaches back): then git looks at every file again.
    fn changed_since(&self, worktree: i64, token: &str) -> Option<Vec<Vec<u8>>>;
}

static ANSWERS: parking_lot::RwLock<Option<std::sync::Weak<dyn FsmonitorAnswers>>> =
    parking_lot::const_rwlock(None);

/// Lets inspection ask `answers` (the mounted view, one per daemon) what git's fsmonitor
/// hook would say, so it trusts the entries git trusts.
pub fn answer_fsmonitor_from(answers: std::sync::Weak<dyn FsmonitorAnswers>) {
    *ANSWERS.write() = Some(answers);
}

/// The index entries git takes as unchanged without looking at the file: valid in the
/// index's FSMN extension and not reported by the hook since its token (git's
/// `tweak_fsmonitor` and `refresh_fsmonitor`), by path. Empty when there is no such
/// extension, no mounted view to ask, or for a submodule's view (git in a submodule uses
/// no fsmonitor of worktreefs's).
fn fsmonitor_valid(t: &Target, raw_index: &[u8], index: &git2::Index) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    if t.submodule.is_some() {
        return out;
    }
    let Some(m) = crate::git::fsmonitor::IndexMonitor::read(raw_index) else {
        return out;
    };
    // The same file as git2 read (the index may have been written again since).
    if m.entries != index.len() || !index.iter().zip(&m.paths).all(|(e, p)| e.path == *p) {
        return out;
    }
    let answers = ANSWERS.read().as_ref().and_then(|a| a.upgrade());
    let Some(changed) = answers.and_then(|a| a.changed_since(t.id, &m.token)) else {
        return out;
    };
    // A reported path is the entry of that path and everything below it.
    if changed.iter().any(|c| c.is_empty() || c.as_slice() == b"/") {
        return out;
    }
    let changed: std::collections::HashSet<&[u8]> = changed.iter().map(Vec::as_slice).collect();
    let reported = |p: &[u8]| {
        changed.contains(p)
            || p.iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && changed.contains(&p[..i]))
    };
    for (i, e) in index.iter().enumerate() {
        if e.mode == MODE_GITLINK || m.dirty(i) || reported(&e.path) {
            continue;
        }
        out.insert(e.path);
    }
    out
}

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
fn pushed_to(repo: &Repository, tip: Oid) -> Option<String> {
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

// ----- inspection -----

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

/// Inspects a worktree. Errors say what could not be read; the caller retains on any.
pub fn inspect(t: &Target) -> Result<Findings, String> {
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
        decided: std::cell::OnceCell::new(),
    };
    // git's stat rules, which decide before any content is read (see `IndexStat`).
    let index_mtime = u32::try_from(index_st.st_mtime).unwrap_or(u32::MAX);
    let valid = fsmonitor_valid(t, &raw_index, &index);
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
    let conversions = fs::read(t.dir.join(crate::state::CONVERSIONS_FILE))
        .ok()
        .and_then(|b| crate::git::checkout::Conversions::decode(&b));
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
    for (dir, r) in crate::lifecycle::submodules::records(&t.dir)? {
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
        let mut found = inspect(&sub).map_err(|e| format!("submodule {}: {e}", r.path))?;
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

/// Ignore rules are matched against paths under this made-up root.
const VROOT: &str = "/.wtfs-root";

/// A view entry at one path.
enum ViewEntry<'t> {
    /// From the upper layer: the entry (an `O_PATH` descriptor) and what it is.
    Upper(OwnedFd, beneath::Stat),
    /// From the base tree, untouched.
    Base(git2::TreeEntry<'t>),
    /// From the warm snapshot, untouched: (a directory, its number + 1).
    Warm(bool, u32),
}

/// Whether (and how) git's clean side applies, decided at the first file that needs it.
struct LazyCleanSide {
    uid: u32,
    gid: u32,
    common_dir: PathBuf,
    head_tree: Oid,
    decided: std::cell::OnceCell<Option<CleanSide>>,
}

impl LazyCleanSide {
    fn get(&self, repo: &Repository) -> Option<&CleanSide> {
        self.decided
            .get_or_init(|| {
                let setting =
                    crate::git::checkout::Setting::of(self.uid, self.gid, &self.common_dir);
                let tree = repo.find_tree(self.head_tree).ok()?;
                setting.may_clean(repo, &tree).then(|| CleanSide {
                    owner: setting.owner.clone(),
                    common_dir: self.common_dir.clone(),
                    attr_source: self.head_tree,
                })
            })
            .as_ref()
    }
}

/// How git compares a file with its blob where conversions apply: through `git
/// hash-object --path`, as the worktree's owner, with HEAD's attributes.
struct CleanSide {
    owner: crate::git::filters::Owner,
    common_dir: PathBuf,
    attr_source: Oid,
}

/// What git's index records of a file it has looked at, for git's two stat rules
/// (`ie_match_stat`): a file whose size, times and owner are what the entry records is
/// unchanged, unless the entry is racy (as new as the index itself); one whose size
/// differs from the entry's is modified. Content decides only in between. The inode
/// number cannot be compared (git saw the view's, this reads the upper layer's): times
/// are compared to the nanosecond instead, which a rewrite (a same-size edit saved by
/// rename, say) never keeps. git may compare whole seconds only: what this trusts, git
/// trusts too, never the reverse (an entry without nanoseconds is never trusted here).
///
/// A racy entry git's fsmonitor marks valid (see `fsmonitor_valid`) is not looked at
/// again either: git trusts it whatever its stat data. This trusts it only while its
/// size, times and owner are still what git recorded: a change that reached the file
/// without its path being reported (through another hard link's name, say) changes its
/// ctime, and git, fooled, would not look, but inspection does. An entry git smudged
/// (size 0: it saw content that differs) yet left valid is not trusted: its content
/// decides, even where git calls it clean.
struct IndexStat {
    fsmonitor_valid: bool,
    id: Oid,
    size: u32,
    /// Seconds and nanoseconds.
    mtime: (u32, u32),
    ctime: (u32, u32),
    uid: u32,
    gid: u32,
    racy: bool,
}

struct Walker<'r> {
    repo: &'r Repository,
    clean_side: LazyCleanSide,
    /// The worktree's warm snapshot (`git::warm`).
    warm: Option<crate::git::warm::Snapshot>,
    /// The blob cache, which holds the snapshot's contents.
    blobs: PathBuf,
    /// Stage-0 index entries git has looked at (size not 0), by path.
    index_stats: std::collections::HashMap<Vec<u8>, IndexStat>,
    whiteouts: &'r crate::layout::Whiteouts,
    changes: Vec<Change>,
    global: Option<Gitignore>,
    /// The `.gitignore` rules of each directory from the root down to the one being walked.
    stack: Vec<Option<Gitignore>>,
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

impl<'r> Walker<'r> {
    /// Whether git ignores `path` (relative to the worktree): it, or a directory above it,
    /// matches an ignore rule; the deepest `.gitignore` with a say wins, `!` re-includes,
    /// `info/exclude` and `core.excludesFile` come last. Called from the walk of `path`'s
    /// parent, so the stack holds the rules of every directory above it.
    fn ignored(&self, path: &str, is_dir: bool) -> bool {
        use ignore::Match;
        let comps: Vec<&str> = path.split('/').collect();
        for k in 1..=comps.len() {
            let abs = format!("{VROOT}/{}", comps[..k].join("/"));
            let dir = k < comps.len() || is_dir;
            let levels = &self.stack[..k.min(self.stack.len())];
            let mut verdict = None;
            for m in levels.iter().rev().flatten().chain(self.global.iter()) {
                match m.matched(&abs, dir) {
                    Match::None => continue,
                    Match::Ignore(_) => verdict = Some(true),
                    Match::Whitelist(_) => verdict = Some(false),
                }
                break;
            }
            if verdict == Some(true) {
                return true;
            }
        }
        false
    }

    /// Whether the file `fd` at `path` is blob `want` as git sees it (its clean side).
    /// A failure to ask git counts as a difference: the worktree is kept.
    fn same_through_clean_side(&self, path: &str, fd: BorrowedFd, want: Oid) -> bool {
        let Some(c) = self.clean_side.get(self.repo) else {
            return false;
        };
        let content = match beneath::reopen(fd, libc::O_RDONLY) {
            Ok(f) => f,
            Err(_) => return false,
        };
        match crate::git::filters::clean_id(
            &c.owner,
            &c.common_dir,
            c.attr_source,
            path.as_bytes(),
            content,
        ) {
            Ok(id) => id == want,
            Err(e) => {
                tracing::warn!("comparing {path} as git does: {e}; counted as modified");
                false
            }
        }
    }

    /// Whether the upper layer's file `fd` (`st` its stat data) is the snapshot's file
    /// `warm` (number + 1; 0: none) the view showed there, as it was given: a symlink of the
    /// same text, or a regular file of the same mode and content (its times aside: a
    /// `touch`, or an open for writing that wrote nothing, copies a file up unchanged).
    /// Anything unreadable counts as changed.
    fn as_inherited(&self, warm: u32, fd: BorrowedFd, st: &beneath::Stat) -> bool {
        let Some(snap) = self.warm.as_ref() else {
            return false;
        };
        let Some(file) = snap.file(warm) else {
            return false;
        };
        let ft = st.st_mode & libc::S_IFMT;
        match snap.link(file) {
            Some(target) => {
                ft == libc::S_IFLNK && beneath::readlink(fd).is_ok_and(|t| *t == *target)
            }
            None => {
                ft == libc::S_IFREG
                    && st.st_mode & 0o7777 == file.perm
                    && st.st_size as u64 == file.size
                    && blob_id(fd).is_ok_and(|o| o == file.oid)
            }
        }
    }

    /// The text of the snapshot's `.gitignore` in its directory `warm`, from the
    /// repository or the blob cache; none where it is not a regular file.
    fn warm_gitignore(&self, warm: u32) -> Option<Vec<u8>> {
        let snap = self.warm.as_ref()?;
        let (false, n) = snap.child(warm, b".gitignore")? else {
            return None;
        };
        let file = snap.file(n).filter(|f| !f.is_link())?;
        if let Ok(b) = self.repo.find_blob(file.oid) {
            return Some(b.content().to_vec());
        }
        let text = fs::read(crate::git::blobcache::path_in(&self.blobs, file.oid));
        if text.is_err() {
            tracing::warn!(
                "the inherited {} ({}) is not in the blob cache: its rules are not applied",
                ".gitignore",
                file.oid
            );
        }
        text.ok()
    }

    fn change(&mut self, kind: ChangeKind, path: String) {
        self.changes.push(Change { kind, path });
    }

    /// Compares directory `rel` of the view (`upper`, if the upper layer has it, over
    /// `base` and the snapshot's directory `warm`, number + 1, 0: none) with HEAD's `head`.
    fn dir(
        &mut self,
        rel: &str,
        upper: Option<BorrowedFd>,
        base: Option<Tree<'r>>,
        head: Option<Tree<'r>>,
        warm: u32,
    ) -> Result<(), String> {
        // The upper layer's entries, whiteouts and opaque marker.
        let mut up_names: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut whiteouts: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut opaque = false;
        if let Some(u) = upper {
            let dir =
                UpperDir::read(u, self.whiteouts).map_err(|e| format!("listing {rel:?}: {e}"))?;
            opaque = dir.opaque;
            whiteouts.extend(dir.whiteouts.iter().map(|n| n.as_bytes().to_vec()));
            up_names.extend(dir.entries.iter().map(|e| e.name.as_bytes().to_vec()));
        }
        let base = if opaque { None } else { base };
        let warm = if opaque { 0 } else { warm };
        let base_visible = |n: &[u8]| !whiteouts.contains(n);

        // This directory's .gitignore, as the view has it.
        let gi_text: Option<Vec<u8>> = if up_names.contains(b".gitignore".as_slice()) {
            upper.and_then(|u| read_small_file(u, ".gitignore"))
        } else if base_visible(b".gitignore") {
            match base.as_ref().and_then(|t| t.get_name(".gitignore")) {
                Some(e) => self
                    .repo
                    .find_blob(e.id())
                    .ok()
                    .map(|b| b.content().to_vec()),
                // Inherited: the snapshot's (a regular file; git reads no symlinked one).
                None => self.warm_gitignore(warm),
            }
        } else {
            None
        };
        let matcher = gi_text.and_then(|text| {
            let root = join(VROOT, rel);
            let mut b = GitignoreBuilder::new(root);
            for line in String::from_utf8_lossy(&text).lines() {
                let _ = b.add_line(None, line);
            }
            b.build().ok()
        });
        self.stack.push(matcher);
        let r = self.entries(rel, upper, &up_names, &base, &whiteouts, &head, warm);
        self.stack.pop();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn entries(
        &mut self,
        rel: &str,
        upper: Option<BorrowedFd>,
        up_names: &BTreeSet<Vec<u8>>,
        base: &Option<Tree<'r>>,
        whiteouts: &BTreeSet<Vec<u8>>,
        head: &Option<Tree<'r>>,
        warm: u32,
    ) -> Result<(), String> {
        let mut names: BTreeSet<Vec<u8>> = up_names.clone();
        if let Some(b) = base {
            names.extend(
                b.iter()
                    .map(|e| e.name_bytes().to_vec())
                    .filter(|n| !whiteouts.contains(n)),
            );
        }
        if let Some(h) = head {
            names.extend(h.iter().map(|e| e.name_bytes().to_vec()));
        }
        for name in names {
            if rel.is_empty() && name == b".git" {
                continue;
            }
            let name_s = String::from_utf8_lossy(&name).into_owned();
            let path = join(rel, &name_s);
            let base_e = base.as_ref().and_then(|b| b.get_name_bytes(&name));
            // Below an upper directory, the base's tree of the same name shows through.
            let below = base_e
                .as_ref()
                .filter(|e| e.filemode() as u32 == MODE_TREE)
                .map(|e| e.id());
            // The snapshot's entry of the name, where the view shows it (as
            // `Snapshot::merged`): where the base has none, or both have a directory.
            let snap_e = self
                .warm
                .as_ref()
                .and_then(|s| s.child(warm, &name))
                .filter(|(is_dir, _)| match &base_e {
                    None => true,
                    Some(b) => *is_dir && b.filemode() as u32 == MODE_TREE,
                });
            let view = if up_names.contains(&name) {
                let u = upper.ok_or("upper entry without an upper directory")?;
                let fd = beneath::entry(u, std::ffi::OsStr::from_bytes(&name))
                    .map_err(|e| format!("{path}: {e}"))?;
                let st = beneath::fstat(fd.as_fd()).map_err(|e| format!("{path}: {e}"))?;
                Some(ViewEntry::Upper(fd, st))
            } else if whiteouts.contains(&name) {
                None
            } else if let Some(b) = base_e {
                Some(ViewEntry::Base(b))
            } else {
                snap_e.map(|(is_dir, n)| ViewEntry::Warm(is_dir, n))
            };
            let head_e = head.as_ref().and_then(|h| h.get_name_bytes(&name));
            self.entry(&path, view, below, snap_e, head_e)?;
        }
        Ok(())
    }

    fn tree(&self, id: Oid) -> Result<Tree<'r>, String> {
        self.repo
            .find_tree(id)
            .map_err(|e| format!("tree {id}: {}", e.message()))
    }

    /// Compares the view's entry at `path` with HEAD's: `below` is the base tree of the
    /// name, `snap` the snapshot's entry the view shows of it (is a directory, number + 1).
    fn entry(
        &mut self,
        path: &str,
        view: Option<ViewEntry<'_>>,
        below: Option<Oid>,
        snap: Option<(bool, u32)>,
        head: Option<git2::TreeEntry<'_>>,
    ) -> Result<(), String> {
        let below_warm = snap.filter(|(d, _)| *d).map_or(0, |(_, n)| n);
        let snap_file = snap.filter(|(d, _)| !*d).map_or(0, |(_, n)| n);
        let head_mode = head.as_ref().map(|h| h.filemode() as u32);
        let head_is_dir = head_mode == Some(MODE_TREE);
        match view {
            None => {
                // Gone from the view: a HEAD entry here is deleted work.
                if head.is_some() {
                    self.change(ChangeKind::Deleted, path.to_string());
                }
            }
            Some(ViewEntry::Base(b)) => {
                let bmode = b.filemode() as u32;
                if let Some(h) = &head {
                    if h.id() == b.id() && h.filemode() == b.filemode() {
                        return Ok(()); // untouched and the same in HEAD (whole subtrees too)
                    }
                }
                match (bmode, head_mode) {
                    (MODE_TREE, Some(MODE_TREE)) => {
                        let bt = self.tree(b.id())?;
                        let ht = self.tree(head.as_ref().map(|h| h.id()).unwrap_or(b.id()))?;
                        self.dir(path, None, Some(bt), Some(ht), below_warm)?;
                    }
                    (MODE_TREE, None) => {
                        if !self.ignored(path, true) {
                            let bt = self.tree(b.id())?;
                            self.dir(path, None, Some(bt), None, below_warm)?;
                        }
                    }
                    // An unpopulated submodule: an empty directory either way.
                    (MODE_GITLINK, Some(MODE_GITLINK)) | (MODE_GITLINK, None) => {}
                    (_, None) => {
                        if !self.ignored(path, false) {
                            self.change(ChangeKind::Untracked, path.to_string());
                        }
                    }
                    _ => self.change(ChangeKind::Modified, path.to_string()),
                }
            }
            Some(ViewEntry::Warm(true, n)) => match &head {
                // Inherited and untouched, outside HEAD: not work.
                None => {}
                Some(h) if h.filemode() as u32 == MODE_TREE => {
                    let ht = self.tree(h.id())?;
                    self.dir(path, None, None, Some(ht), n)?;
                }
                Some(_) => self.change(ChangeKind::Modified, path.to_string()),
            },
            Some(ViewEntry::Warm(false, n)) => {
                // Committed as inherited (`git add -f` of an inherited file, say): the same
                // as HEAD's entry, or a change.
                if let Some(h) = &head {
                    let same = self
                        .warm
                        .as_ref()
                        .and_then(|s| s.file(n))
                        .is_some_and(|f| h.filemode() as u32 == f.mode() && h.id() == f.oid);
                    if !same {
                        self.change(ChangeKind::Modified, path.to_string());
                    }
                }
            }
            Some(ViewEntry::Upper(fd, st)) => {
                let ft = st.st_mode & libc::S_IFMT;
                if ft == libc::S_IFDIR && crate::layout::read_stub(fd.as_fd()).is_some() {
                    // A submodule's view moved here: inspected with its record, which
                    // also compares its HEAD with the gitlink HEAD has here.
                    match head_mode {
                        Some(MODE_GITLINK) => {}
                        None if self.ignored(path, true) => {}
                        None => self.change(ChangeKind::Untracked, path.to_string()),
                        Some(_) => self.change(ChangeKind::Modified, path.to_string()),
                    }
                    return Ok(());
                }
                if ft == libc::S_IFDIR {
                    match head_mode {
                        Some(MODE_TREE) | None => {
                            if head.is_none() && self.ignored(path, true) {
                                return Ok(());
                            }
                            let ht = match &head {
                                Some(h) => Some(self.tree(h.id())?),
                                None => None,
                            };
                            let bt = match below {
                                Some(id) => Some(self.tree(id)?),
                                None => None,
                            };
                            self.dir(path, Some(fd.as_fd()), bt, ht, below_warm)?;
                        }
                        Some(MODE_GITLINK) => {
                            let empty = beneath::list(fd.as_fd())
                                .map(|d| d.is_empty())
                                .unwrap_or(false);
                            if !empty {
                                self.change(ChangeKind::Modified, path.to_string());
                            }
                        }
                        Some(_) => self.change(ChangeKind::Modified, path.to_string()),
                    }
                    return Ok(());
                }
                let Some(h) = head else {
                    if !self.ignored(path, false) && !self.as_inherited(snap_file, fd.as_fd(), &st)
                    {
                        self.change(ChangeKind::Untracked, path.to_string());
                    }
                    return Ok(());
                };
                if head_is_dir {
                    self.change(ChangeKind::Modified, path.to_string());
                    return Ok(());
                }
                let same = if ft == libc::S_IFLNK {
                    let target = beneath::readlink(fd.as_fd()).map_err(|e| e.to_string())?;
                    h.filemode() as u32 == MODE_LINK
                        && Oid::hash_object(ObjectType::Blob, &target)
                            .map(|o| o == h.id())
                            .unwrap_or(false)
                } else if ft == libc::S_IFREG {
                    let mode = if st.st_mode & 0o100 != 0 {
                        MODE_EXEC
                    } else {
                        crate::git::MODE_BLOB
                    };
                    let size_matches = self
                        .repo
                        .odb()
                        .and_then(|o| o.read_header(h.id()))
                        .map(|(size, _)| size as u64 == st.st_size as u64)
                        .unwrap_or(true);
                    // As git: stat data first (for an entry of HEAD's blob), content after.
                    let ix = self
                        .index_stats
                        .get(path.as_bytes())
                        .filter(|ix| ix.id == h.id());
                    let stat_same = ix.is_some_and(|ix| {
                        ix.size == st.st_size as u32
                            && ix.mtime == (st.st_mtime as u32, st.st_mtime_nsec as u32)
                            && ix.ctime == (st.st_ctime as u32, st.st_ctime_nsec as u32)
                            && ix.uid == st.st_uid
                            && ix.gid == st.st_gid
                            && (!ix.racy || (ix.fsmonitor_valid && ix.mtime.1 != 0))
                    });
                    let size_differs = ix.is_some_and(|ix| ix.size != st.st_size as u32);
                    h.filemode() as u32 == mode
                        && (stat_same
                            || (!size_differs
                                && ((size_matches
                                    && blob_id(fd.as_fd()).is_ok_and(|o| o == h.id()))
                                    || self.same_through_clean_side(path, fd.as_fd(), h.id()))))
                } else {
                    false // a fifo or socket git cannot hold
                };
                if !same {
                    self.change(ChangeKind::Modified, path.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The content of the regular file `name` of upper directory `dir`, up to 1 MiB: nothing
/// for anything else (a FIFO a user put there is never opened, a huge file never read).
fn read_small_file(dir: BorrowedFd, name: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    const MAX: u64 = 1 << 20;
    let fd = beneath::entry(dir, std::ffi::OsStr::new(name)).ok()?;
    let st = beneath::fstat(fd.as_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > MAX {
        return None;
    }
    let f = beneath::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_NONBLOCK).ok()?;
    let mut text = Vec::new();
    f.take(MAX).read_to_end(&mut text).ok()?;
    Some(text)
}

/// The blob id of the file `fd` (an `O_PATH` descriptor of it), read through a
/// descriptor of its own and hashed as it streams.
fn blob_id(fd: BorrowedFd) -> std::io::Result<Oid> {
    use sha1::Digest;
    use std::io::Read;
    let mut f = beneath::reopen(fd, libc::O_RDONLY)?;
    let len = f.metadata()?.len();
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {len}\0").as_bytes());
    let mut buf = vec![0u8; 1 << 16];
    let mut seen = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        seen += n as u64;
        h.update(&buf[..n]);
    }
    if seen != len {
        return Err(std::io::Error::other("the file changed while it was read"));
    }
    Oid::from_bytes(h.finalize().as_slice()).map_err(std::io::Error::other)
}

// ----- running it -----
