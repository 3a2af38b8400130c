//! Cleanup after the last release (SPEC "Cleanup"): inspect a worktree, decide, then
//! remove it or retain it with the reason.
//!
//! * **Inspect** from the upper layer and the object database, never through the view:
//!   the index against HEAD's tree, and the merged view against HEAD's tree only where the
//!   two can differ (paths in the upper layer, and paths where HEAD's tree differs from the
//!   base tree; identical subtrees are skipped by object id). Untracked files count unless
//!   `.gitignore` (the view's own, read from the upper layer or the base), the
//!   repository's `info/exclude` or `core.excludesFile` ignore them.
//! * **Decide** ([`decide`], pure): removed only when nothing is uncommitted, HEAD is where
//!   creation put it, and every commit is reachable from the base commit or a
//!   remote-tracking ref. The branch goes too only when worktreefs created it and its tip
//!   is reachable from another ref (merged or pushed).
//! * **Remove** ([`execute`]): each step can be undone; a failing step undoes the ones
//!   before it and the worktree is retained with `cleanup-error: …`, files untouched. The
//!   decision is written to the store before the first step, so a daemon that dies in the
//!   middle finishes the removal at the next mount.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, Tree};
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::gitlayer::{MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::layout::{OPAQUE_MARKER, RESERVED_PREFIX, WHITEOUT_PREFIX};
use crate::lease::State;
use crate::state::StateDir;
use crate::store::{BeginError, RepoRow, Store, WorktreeRow};

/// The text of the `locked` file of every admin entry worktreefs writes starts so.
pub const ADMIN_MARKER: &str = "managed by worktreefs";
/// Where removed admin entries wait to be deleted, inside the repository's git dir (same
/// filesystem, so parking is one rename) and outside `worktrees/` (so git never sees them).
const PARKED_ADMIN_DIR: &str = "worktreefs/removing";

// ----- what cleanup looks at -----

/// Everything cleanup needs to know of one worktree.
#[derive(Debug, Clone)]
pub struct Target {
    pub id: i64,
    pub repo: String,
    pub name: String,
    /// The repository's common git dir.
    pub gitdir: PathBuf,
    /// git's admin entry for this worktree (`<gitdir>/worktrees/wtfs-<name>`).
    pub admin: PathBuf,
    /// `<state>/worktrees/<id>`: the upper layer and work directory.
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub base_commit: String,
    pub base_tree: String,
    pub branch: Option<String>,
    pub branch_created: bool,
    /// Where it is under the mount (for messages and the retained store).
    pub path: PathBuf,
}

impl Target {
    pub fn new(state: &StateDir, row: &WorktreeRow, repo: &RepoRow, mountpoint: &Path) -> Target {
        Target {
            id: row.id,
            repo: row.repo.clone(),
            name: row.name.clone(),
            gitdir: repo.gitdir.clone(),
            admin: crate::gitlayer::admin_dir(&repo.gitdir, &row.admin_name),
            dir: state.worktree_dir(row.id),
            upper: state.upper(row.id),
            base_commit: row.base_commit.clone(),
            base_tree: row.base_tree.clone(),
            branch: row.branch.clone(),
            branch_created: row.branch_created,
            path: mountpoint.join(&row.repo).join(&row.name),
        }
    }

    fn parked_admin(&self) -> PathBuf {
        let name = self
            .admin
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.gitdir
            .join(PARKED_ADMIN_DIR)
            .join(format!("{}-{name}", self.id))
    }

    fn parked_dir(&self, state: &StateDir) -> PathBuf {
        state.trash().join(self.id.to_string())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    Branch(String),
    Detached(Oid),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The index differs from HEAD.
    Staged,
    Modified,
    Deleted,
    Untracked,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub path: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.kind {
            ChangeKind::Staged => "staged",
            ChangeKind::Modified => "modified",
            ChangeKind::Deleted => "deleted",
            ChangeKind::Untracked => "untracked",
        };
        write!(f, "{code} {}", self.path)
    }
}

/// What inspection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Uncommitted changes, untracked files included, ignored files not.
    pub changes: Vec<Change>,
    pub head: Head,
    /// Commits reachable from HEAD but from neither the base commit nor a remote-tracking
    /// ref, newest first.
    pub unpushed: Vec<Oid>,
    /// HEAD's commit is reachable from a ref other than the worktree's branch (merged or
    /// pushed): deleting the branch loses nothing.
    pub tip_elsewhere: bool,
}

// ----- the decision -----

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Remove { delete_branch: bool },
    Retain(String),
}

fn list<T: fmt::Display>(items: &[T], max: usize) -> String {
    let mut s: Vec<String> = items.iter().take(max).map(|i| i.to_string()).collect();
    if items.len() > max {
        s.push(format!("and {} more", items.len() - max));
    }
    s.join(", ")
}

fn short(oid: &Oid) -> String {
    oid.to_string()[..10].to_string()
}

/// The decision, from what inspection found (or the error it met). Pure.
pub fn decide(
    recorded_branch: Option<&str>,
    branch_created: bool,
    inspected: &Result<Findings, String>,
) -> Verdict {
    let f = match inspected {
        Ok(f) => f,
        Err(e) => return Verdict::Retain(format!("cleanup-error: {e}")),
    };
    let mut reasons = Vec::new();
    if !f.changes.is_empty() {
        reasons.push(format!(
            "uncommitted-changes ({} path{}: {})",
            f.changes.len(),
            if f.changes.len() == 1 { "" } else { "s" },
            list(&f.changes, 5)
        ));
    }
    let head_ok = match (&f.head, recorded_branch) {
        (Head::Branch(b), Some(r)) => b == r,
        (Head::Detached(_), None) => true,
        _ => false,
    };
    if !head_ok {
        let now = match &f.head {
            Head::Branch(b) => format!("HEAD is on branch {b}"),
            Head::Detached(o) => format!("HEAD is detached at {}", short(o)),
        };
        let was = match recorded_branch {
            Some(b) => format!("branch {b}"),
            None => "a detached HEAD".to_string(),
        };
        reasons.push(format!("branch-moved ({now}; it was created on {was})"));
    }
    if !f.unpushed.is_empty() {
        let shorts: Vec<String> = f.unpushed.iter().map(short).collect();
        reasons.push(format!(
            "unpushed-commits ({} commit{} on no remote-tracking ref: {})",
            f.unpushed.len(),
            if f.unpushed.len() == 1 { "" } else { "s" },
            list(&shorts, 5)
        ));
    }
    if !reasons.is_empty() {
        return Verdict::Retain(reasons.join("; "));
    }
    Verdict::Remove {
        delete_branch: branch_created && recorded_branch.is_some() && f.tip_elsewhere,
    }
}

// ----- removal -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `<state>/worktrees/<id>` out of the way (one rename into `<state>/trash`).
    ParkUpper,
    /// git's admin entry out of `worktrees/` (one rename), so git no longer lists it.
    ParkAdmin,
    /// The branch, when worktreefs created it and it is merged or pushed.
    DeleteBranch,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::ParkUpper => "moving the upper layer away",
            Step::ParkAdmin => "removing git's worktree entry",
            Step::DeleteBranch => "deleting the branch",
        })
    }
}

pub fn plan(delete_branch: bool) -> Vec<Step> {
    let mut p = vec![Step::ParkUpper, Step::ParkAdmin];
    if delete_branch {
        p.push(Step::DeleteBranch);
    }
    p
}

/// Carries out the steps of a removal, and takes each back.
pub trait Remover {
    fn run(&mut self, step: Step) -> Result<(), String>;
    fn undo(&mut self, step: Step) -> Result<(), String>;
}

/// Runs `plan`; on the first failing step, undoes the steps done, newest first, and says
/// which step failed and why. An undo that fails is part of the message.
pub fn execute(plan: &[Step], r: &mut dyn Remover) -> Result<(), String> {
    for (i, step) in plan.iter().enumerate() {
        if let Err(e) = r.run(*step) {
            let mut msg = format!("{step}: {e}");
            for done in plan[..i].iter().rev() {
                if let Err(u) = r.undo(*done) {
                    tracing::error!("undoing '{done}' after a failed cleanup: {u}");
                    msg.push_str(&format!(" (and undoing '{done}' failed: {u})"));
                }
            }
            return Err(msg);
        }
    }
    Ok(())
}

/// The removal on disk and in git. Every step also succeeds when it finds its work
/// already done, so a removal a dead daemon began can be run again to its end.
struct FsRemover<'a> {
    state: &'a StateDir,
    t: &'a Target,
    /// The branch tip, once the branch is deleted (to put it back).
    deleted_tip: Option<Oid>,
}

fn is_ours(admin: &Path) -> bool {
    fs::read_to_string(admin.join("locked"))
        .map(|s| s.starts_with(ADMIN_MARKER))
        .unwrap_or(false)
}

impl Remover for FsRemover<'_> {
    fn run(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::ParkUpper => {
                let parked = self.t.parked_dir(self.state);
                if !self.t.dir.exists() && parked.exists() {
                    return Ok(());
                }
                fs::rename(&self.t.dir, &parked).map_err(|e| {
                    format!(
                        "rename {} -> {}: {e}",
                        self.t.dir.display(),
                        parked.display()
                    )
                })
            }
            Step::ParkAdmin => {
                if !self.t.admin.exists() {
                    return Ok(());
                }
                if !is_ours(&self.t.admin) {
                    return Err(format!(
                        "{} is not marked as created by worktreefs; left alone",
                        self.t.admin.display()
                    ));
                }
                let parked = self.t.parked_admin();
                if let Some(p) = parked.parent() {
                    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
                }
                let _ = fs::remove_dir_all(&parked);
                fs::rename(&self.t.admin, &parked).map_err(|e| {
                    format!(
                        "rename {} -> {}: {e}",
                        self.t.admin.display(),
                        parked.display()
                    )
                })
            }
            Step::DeleteBranch => {
                let Some(branch) = &self.t.branch else {
                    return Ok(());
                };
                let repo = Repository::open(&self.t.gitdir).map_err(|e| e.to_string())?;
                let name = format!("refs/heads/{branch}");
                let Ok(mut r) = repo.find_reference(&name) else {
                    return Ok(());
                };
                let tip = r
                    .target()
                    .ok_or_else(|| format!("{name} is not a direct reference"))?;
                // Checked again now: the branch may have moved since inspection.
                if !reachable_elsewhere(&repo, tip, Some(&name)).map_err(|e| e.to_string())? {
                    return Err(format!(
                        "{name} now points at {tip}, which no other ref reaches"
                    ));
                }
                r.delete().map_err(|e| e.to_string())?;
                self.deleted_tip = Some(tip);
                Ok(())
            }
        }
    }

    fn undo(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::ParkUpper => {
                let parked = self.t.parked_dir(self.state);
                fs::rename(&parked, &self.t.dir).map_err(|e| e.to_string())
            }
            Step::ParkAdmin => {
                let parked = self.t.parked_admin();
                if parked.exists() {
                    fs::rename(&parked, &self.t.admin).map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Step::DeleteBranch => {
                let (Some(branch), Some(tip)) = (&self.t.branch, self.deleted_tip) else {
                    return Ok(());
                };
                let repo = Repository::open(&self.t.gitdir).map_err(|e| e.to_string())?;
                repo.reference(
                    &format!("refs/heads/{branch}"),
                    tip,
                    false,
                    "worktreefs: cleanup undone",
                )
                .map(|_| ())
                .map_err(|e| e.to_string())
            }
        }
    }
}

/// Whether `tip` is reachable from some ref other than `except`: branches, tags,
/// remote-tracking refs.
fn reachable_elsewhere(
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

// ----- inspection -----

fn read_head(admin: &Path) -> Result<Head, String> {
    let text = fs::read_to_string(admin.join("HEAD"))
        .map_err(|e| format!("reading {}/HEAD: {e}", admin.display()))?;
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
    let head = read_head(&t.admin)?;
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
    let base_tree = repo
        .find_tree(Oid::from_str(&t.base_tree).map_err(|e| e.message().to_string())?)
        .map_err(|e| format!("base tree: {}", e.message()))?;

    let mut changes = Vec::new();
    // The index against HEAD.
    let index_path = t.admin.join("index");
    let index = git2::Index::open(&index_path)
        .map_err(|e| format!("reading {}: {}", index_path.display(), e.message()))?;
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
    let mut w = Walker {
        repo: &repo,
        changes: Vec::new(),
        global: global_excludes(&repo, &t.gitdir),
        stack: Vec::new(),
    };
    let upper = t.upper.is_dir().then_some(t.upper.as_path());
    if upper.is_none() {
        return Err(format!("upper layer {} is missing", t.upper.display()));
    }
    w.dir("", upper, Some(base_tree), Some(head_tree))
        .map_err(|e| format!("comparing the files with HEAD: {e}"))?;
    for c in w.changes {
        if !changes.iter().any(|x: &Change| x.path == c.path) {
            changes.push(c);
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
    let except = match &head {
        Head::Branch(b) => Some(format!("refs/heads/{b}")),
        Head::Detached(_) => None,
    };
    let tip_elsewhere = reachable_elsewhere(&repo, head_commit.id(), except.as_deref())
        .map_err(|e| e.message().to_string())?;
    Ok(Findings {
        changes,
        head,
        unpushed,
        tip_elsewhere,
    })
}

/// `info/exclude` and `core.excludesFile`, the lowest-precedence ignore rules.
fn global_excludes(repo: &Repository, gitdir: &Path) -> Option<Gitignore> {
    let mut b = GitignoreBuilder::new(VROOT);
    let mut any = false;
    if let Ok(text) = fs::read_to_string(gitdir.join("info/exclude")) {
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
    if let Some(text) = excludes.and_then(|p| fs::read_to_string(p).ok()) {
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
    /// From the upper layer: its path and what it is.
    Upper(PathBuf, fs::Metadata),
    /// From the base tree, untouched.
    Base(git2::TreeEntry<'t>),
}

struct Walker<'r> {
    repo: &'r Repository,
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

    fn change(&mut self, kind: ChangeKind, path: String) {
        self.changes.push(Change { kind, path });
    }

    /// Compares directory `rel` of the view (`upper`, if the upper layer has it, over
    /// `base`) with HEAD's `head`.
    fn dir(
        &mut self,
        rel: &str,
        upper: Option<&Path>,
        base: Option<Tree<'r>>,
        head: Option<Tree<'r>>,
    ) -> Result<(), String> {
        // The upper layer's entries, whiteouts and opaque marker.
        let mut up_names: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut whiteouts: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut opaque = false;
        if let Some(u) = upper {
            for e in fs::read_dir(u).map_err(|e| format!("listing {}: {e}", u.display()))? {
                let e = e.map_err(|e| e.to_string())?;
                let n = e.file_name().as_bytes().to_vec();
                if n == OPAQUE_MARKER.as_bytes() {
                    opaque = true;
                } else if let Some(h) = n.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                    whiteouts.insert(h.to_vec());
                } else if !n.starts_with(RESERVED_PREFIX) {
                    up_names.insert(n);
                }
            }
        }
        let base = if opaque { None } else { base };
        let base_visible = |n: &[u8]| !whiteouts.contains(n);

        // This directory's .gitignore, as the view has it.
        let gi_text: Option<Vec<u8>> = if up_names.contains(b".gitignore".as_slice()) {
            let p = upper.map(|u| u.join(".gitignore"));
            p.filter(|p| p.is_file()).and_then(|p| fs::read(p).ok())
        } else if base_visible(b".gitignore") {
            base.as_ref()
                .and_then(|t| t.get_name(".gitignore").map(|e| e.id()))
                .and_then(|id| self.repo.find_blob(id).ok())
                .map(|b| b.content().to_vec())
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
        let r = self.entries(rel, upper, &up_names, &base, &whiteouts, &head);
        self.stack.pop();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn entries(
        &mut self,
        rel: &str,
        upper: Option<&Path>,
        up_names: &BTreeSet<Vec<u8>>,
        base: &Option<Tree<'r>>,
        whiteouts: &BTreeSet<Vec<u8>>,
        head: &Option<Tree<'r>>,
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
            let view = if up_names.contains(&name) {
                let p = upper
                    .map(|u| u.join(std::ffi::OsStr::from_bytes(&name)))
                    .ok_or("upper entry without an upper directory")?;
                let m = fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                Some(ViewEntry::Upper(p, m))
            } else if whiteouts.contains(&name) {
                None
            } else {
                base_e.map(ViewEntry::Base)
            };
            let head_e = head.as_ref().and_then(|h| h.get_name_bytes(&name));
            self.entry(&path, view, below, head_e)?;
        }
        Ok(())
    }

    fn tree(&self, id: Oid) -> Result<Tree<'r>, String> {
        self.repo
            .find_tree(id)
            .map_err(|e| format!("tree {id}: {}", e.message()))
    }

    fn entry(
        &mut self,
        path: &str,
        view: Option<ViewEntry<'_>>,
        below: Option<Oid>,
        head: Option<git2::TreeEntry<'_>>,
    ) -> Result<(), String> {
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
                        self.dir(path, None, Some(bt), Some(ht))?;
                    }
                    (MODE_TREE, None) => {
                        if !self.ignored(path, true) {
                            let bt = self.tree(b.id())?;
                            self.dir(path, None, Some(bt), None)?;
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
            Some(ViewEntry::Upper(p, m)) => {
                let ft = m.file_type();
                if ft.is_dir() {
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
                            self.dir(path, Some(&p), bt, ht)?;
                        }
                        Some(MODE_GITLINK) => {
                            let empty = fs::read_dir(&p)
                                .map(|mut d| d.next().is_none())
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
                    if !self.ignored(path, false) {
                        self.change(ChangeKind::Untracked, path.to_string());
                    }
                    return Ok(());
                };
                if head_is_dir {
                    self.change(ChangeKind::Modified, path.to_string());
                    return Ok(());
                }
                let same = if ft.is_symlink() {
                    let target = fs::read_link(&p).map_err(|e| e.to_string())?;
                    h.filemode() as u32 == MODE_LINK
                        && Oid::hash_object(ObjectType::Blob, target.as_os_str().as_bytes())
                            .map(|o| o == h.id())
                            .unwrap_or(false)
                } else if ft.is_file() {
                    let mode = if m.permissions().mode() & 0o100 != 0 {
                        MODE_EXEC
                    } else {
                        crate::gitlayer::MODE_BLOB
                    };
                    let size_matches = self
                        .repo
                        .odb()
                        .and_then(|o| o.read_header(h.id()))
                        .map(|(size, _)| size as u64 == m.len())
                        .unwrap_or(true);
                    h.filemode() as u32 == mode
                        && size_matches
                        && Oid::hash_file(ObjectType::Blob, &p)
                            .map(|o| o == h.id())
                            .unwrap_or(false)
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

// ----- running it -----

/// Held by whoever runs one worktree's cleanup (the daemon's sweeper, a reclaim, the boot
/// reconcile), so two never work on the same worktree.
pub struct CleanupLock(#[allow(dead_code)] File);

pub fn try_lock(state: &StateDir, id: i64) -> Option<CleanupLock> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state.cleanup_lock(id))
        .ok()?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    (rc == 0).then_some(CleanupLock(f))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed(String),
    Retained(String),
}

fn target_of(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
    mountpoint: &Path,
) -> anyhow::Result<Target> {
    let repo = store
        .repo_by_id(row.repo_id)?
        .ok_or_else(|| anyhow::anyhow!("repository of worktree {} is gone", row.id))?;
    Ok(Target::new(state, row, &repo, mountpoint))
}

/// Removes: records the decision, runs the steps, and records the outcome.
fn remove(
    state: &StateDir,
    store: &mut Store,
    t: &Target,
    delete_branch: bool,
) -> anyhow::Result<Outcome> {
    store.set_removal(
        t.id,
        if delete_branch {
            "remove+branch"
        } else {
            "remove"
        },
    )?;
    let mut r = FsRemover {
        state,
        t,
        deleted_tip: None,
    };
    match execute(&plan(delete_branch), &mut r) {
        Ok(()) => {
            let branch = match (&t.branch, delete_branch) {
                (Some(b), true) => format!("; branch {b} deleted (merged or pushed)"),
                (Some(b), false) => format!("; branch {b} kept"),
                (None, _) => String::new(),
            };
            let detail = format!("clean and pushed{branch}");
            store.mark_removed(t.id, &detail)?;
            purge(state, t);
            tracing::info!(worktree = %t.path.display(), "removed: {detail}");
            Ok(Outcome::Removed(detail))
        }
        Err(e) => {
            let reason = format!("cleanup-error: {e}");
            store.retain(t.id, &t.path.to_string_lossy(), &reason)?;
            tracing::warn!(worktree = %t.path.display(), "retained: {reason}");
            Ok(Outcome::Retained(reason))
        }
    }
}

/// Deletes what a removal parked.
fn purge(state: &StateDir, t: &Target) {
    for p in [t.parked_dir(state), t.parked_admin()] {
        if p.exists() {
            if let Err(e) = fs::remove_dir_all(&p) {
                tracing::warn!(
                    "could not delete {}: {e} (deleted at the next mount)",
                    p.display()
                );
            }
        }
    }
}

/// Finishes a worktree in `deleting`: inspects, decides, removes or retains; or carries
/// on with a removal already decided by a daemon that died.
pub fn finish(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
) -> anyhow::Result<Outcome> {
    let t = target_of(state, store, row, mountpoint)?;
    if let Some(removal) = &row.removal {
        tracing::info!(worktree = %t.path.display(), "finishing a removal begun before ({removal})");
        return remove(state, store, &t, removal == "remove+branch");
    }
    if !t.dir.exists() && !t.parked_dir(state).exists() {
        return gone_by_hand(state, store, &t);
    }
    let inspected = inspect(&t);
    match decide(t.branch.as_deref(), t.branch_created, &inspected) {
        Verdict::Remove { delete_branch } => remove(state, store, &t, delete_branch),
        Verdict::Retain(reason) => {
            store.retain(t.id, &t.path.to_string_lossy(), &reason)?;
            tracing::info!(worktree = %t.path.display(), "retained: {reason}");
            Ok(Outcome::Retained(reason))
        }
    }
}

/// The worktree's directory in the state dir was removed by hand: nothing is left to keep.
/// Its git entry goes too when worktreefs made it; the branch stays.
fn gone_by_hand(state: &StateDir, store: &mut Store, t: &Target) -> anyhow::Result<Outcome> {
    let mut r = FsRemover {
        state,
        t,
        deleted_tip: None,
    };
    if let Err(e) = r.run(Step::ParkAdmin) {
        tracing::warn!("{}: {e}", t.admin.display());
    }
    purge(state, t);
    let detail = format!(
        "its directory {} was removed by hand; branch kept",
        t.dir.display()
    );
    store.mark_removed(t.id, &detail)?;
    tracing::warn!(worktree = %t.path.display(), "{detail}");
    Ok(Outcome::Removed(detail))
}

/// Runs cleanup for every worktree in `deleting` that nobody else is working on.
pub fn finish_all_deleting(
    state: &StateDir,
    store: &mut Store,
    mountpoint: &Path,
) -> Vec<(WorktreeRow, anyhow::Result<Outcome>)> {
    let mut out = Vec::new();
    for row in store.worktrees_in(State::Deleting).unwrap_or_default() {
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        // Read again under the lock: someone may have finished it meanwhile.
        let Ok(Some(row)) = store.worktree_by_id(row.id) else {
            continue;
        };
        if row.state != "deleting" {
            continue;
        }
        let r = finish(state, store, &row, mountpoint);
        if let Err(e) = &r {
            tracing::error!("cleanup of {}/{} failed: {e:#}", row.repo, row.name);
        }
        out.push((row, r));
    }
    out
}

/// Why a removal someone asked for did not happen.
#[derive(Debug)]
pub enum RequestError {
    /// Leased, in use, or being cleaned up: try again later.
    Busy(String),
    /// It holds work: the reason.
    HoldsWork(String),
    /// Already removed.
    Gone(String),
    Other(anyhow::Error),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Busy(m) | RequestError::HoldsWork(m) | RequestError::Gone(m) => {
                f.write_str(m)
            }
            RequestError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<anyhow::Error> for RequestError {
    fn from(e: anyhow::Error) -> Self {
        RequestError::Other(e)
    }
}

impl From<rusqlite::Error> for RequestError {
    fn from(e: rusqlite::Error) -> Self {
        RequestError::Other(e.into())
    }
}

/// What `--discard` throws away, shown before it does.
#[derive(Debug, Clone)]
pub struct Discarded {
    pub changes: Vec<Change>,
    /// Commits that no ref keeps once the worktree is gone (HEAD was detached or moved).
    pub commits: Vec<Oid>,
    /// Unpushed commits that stay on the (kept) branch.
    pub kept_on_branch: Option<(String, usize)>,
    /// Inspection failed: everything in the upper layer goes.
    pub uninspected: Option<String>,
}

/// A removal asked for by `worktreefs reclaim` or `rmdir`: only without leases and nobody
/// inside, and only when the checks pass, unless `discard` (then `show` is told what goes
/// before anything does).
pub fn request_removal(
    state: &StateDir,
    store: &mut Store,
    row: &WorktreeRow,
    mountpoint: &Path,
    discard: bool,
    show: &mut dyn FnMut(&Discarded),
) -> Result<Outcome, RequestError> {
    let label = format!("{}/{}", row.repo, row.name);
    let t = target_of(state, store, row, mountpoint)?;
    let _lock = try_lock(state, row.id).ok_or_else(|| {
        RequestError::Busy(format!(
            "worktree {label} is being cleaned up right now; try again in a moment"
        ))
    })?;
    let inside = crate::holders::describe_processes_inside(&t.path);
    if !inside.is_empty() {
        return Err(RequestError::Busy(format!(
            "worktree {label} is in use by {}; those processes must leave it first",
            inside.join(", ")
        )));
    }
    let why = if discard {
        "reclaim --discard"
    } else {
        "removal asked for"
    };
    let prev = store
        .begin_deleting(row.id, &[State::Ready, State::Lingering, State::Retained], why)
        .map_err(|e| match e {
            BeginError::Leased(n, st) => RequestError::Busy(format!(
                "worktree {label} is {st} with {n} lease{}; release {} first (see `worktreefs leases`)",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            )),
            BeginError::State(st) if st == "removed" => {
                RequestError::Gone(format!("worktree {label} is already removed"))
            }
            BeginError::State(st) => RequestError::Busy(format!(
                "worktree {label} is {st}; its cleanup is already running"
            )),
            BeginError::Db(e) => e.into(),
        })?;
    let inspected = inspect(&t);
    let verdict = decide(t.branch.as_deref(), t.branch_created, &inspected);
    match verdict {
        Verdict::Remove { delete_branch } => Ok(remove(state, store, &t, delete_branch)?),
        Verdict::Retain(reason) if !discard => {
            store.end_deleting(row.id, prev, &format!("removal refused: {reason}"))?;
            Err(RequestError::HoldsWork(reason))
        }
        Verdict::Retain(_) => {
            let d = match &inspected {
                Ok(f) => {
                    let on_branch = match &f.head {
                        Head::Branch(b) => Some(b.clone()),
                        Head::Detached(_) => None,
                    };
                    Discarded {
                        changes: f.changes.clone(),
                        commits: if on_branch.is_some() {
                            Vec::new()
                        } else {
                            f.unpushed.clone()
                        },
                        kept_on_branch: on_branch
                            .filter(|_| !f.unpushed.is_empty())
                            .map(|b| (b, f.unpushed.len())),
                        uninspected: None,
                    }
                }
                Err(e) => Discarded {
                    changes: Vec::new(),
                    commits: Vec::new(),
                    kept_on_branch: None,
                    uninspected: Some(e.clone()),
                },
            };
            show(&d);
            let delete_branch = match &inspected {
                Ok(f) => {
                    t.branch_created
                        && f.tip_elsewhere
                        && matches!((&f.head, &t.branch), (Head::Branch(h), Some(b)) if h == b)
                }
                Err(_) => false,
            };
            Ok(remove(state, store, &t, delete_branch)?)
        }
    }
}

/// At every mount, before serving: puts back or deletes what a dead cleanup parked,
/// finishes `deleting` worktrees, removes retained ones that are now clean and pushed, and
/// lets go of worktrees whose directory was removed by hand. Never touches a directory
/// worktreefs did not make.
pub fn reconcile_at_boot(state: &StateDir, mountpoint: &Path) -> anyhow::Result<()> {
    let mut store = Store::open(&state.root)?;
    restore_or_purge_parked(state, &store);
    for (row, r) in finish_all_deleting(state, &mut store, mountpoint) {
        if let Ok(o) = r {
            tracing::info!("boot reconcile: {}/{}: {o:?}", row.repo, row.name);
        }
    }
    for row in store.worktrees_in(State::Retained)? {
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        let t = target_of(state, &store, &row, mountpoint)?;
        if !t.dir.exists() {
            continue; // handled below
        }
        let inspected = inspect(&t);
        if let Verdict::Remove { delete_branch } =
            decide(t.branch.as_deref(), t.branch_created, &inspected)
        {
            if store
                .begin_deleting(
                    row.id,
                    &[State::Retained],
                    "boot reconcile: now clean and pushed",
                )
                .is_ok()
            {
                let o = remove(state, &mut store, &t, delete_branch)?;
                tracing::info!("boot reconcile: {}/{}: {o:?}", row.repo, row.name);
            }
        }
    }
    for row in store.worktrees()? {
        if row.state == "deleting" || state.worktree_dir(row.id).exists() {
            continue;
        }
        let Some(_lock) = try_lock(state, row.id) else {
            continue;
        };
        let t = target_of(state, &store, &row, mountpoint)?;
        gone_by_hand(state, &mut store, &t)?;
    }
    Ok(())
}

/// Parked directories (a worktree's state dir in `<state>/trash`, git entries in
/// `<gitdir>/worktreefs/removing`) of removals that did not finish: deleted when their
/// worktree is removed, put back when its removal was never recorded as decided.
fn restore_or_purge_parked(state: &StateDir, store: &Store) {
    let decide_for = |id: i64| -> Option<bool> {
        // Some(true): delete; Some(false): put back; None: leave (removal to finish).
        match store.worktree_by_id(id).ok()? {
            None => Some(true),
            Some(r) if r.state == "removed" => Some(true),
            Some(r) if r.state == "deleting" && r.removal.is_some() => None,
            Some(_) => Some(false),
        }
    };
    for e in fs::read_dir(state.trash()).into_iter().flatten().flatten() {
        let Some(id) = e.file_name().to_str().and_then(|n| n.parse::<i64>().ok()) else {
            continue;
        };
        match decide_for(id) {
            Some(true) => {
                let _ = fs::remove_dir_all(e.path());
            }
            Some(false) if !state.worktree_dir(id).exists() => {
                tracing::warn!(
                    "putting back {} (its removal never finished)",
                    e.path().display()
                );
                let _ = fs::rename(e.path(), state.worktree_dir(id));
            }
            _ => {}
        }
    }
    for repo in store.repos().unwrap_or_default() {
        let dir = repo.gitdir.join(PARKED_ADMIN_DIR);
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((id, admin)) = name
                .split_once('-')
                .and_then(|(i, a)| Some((i.parse::<i64>().ok()?, a.to_string())))
            else {
                continue;
            };
            match decide_for(id) {
                Some(true) => {
                    let _ = fs::remove_dir_all(e.path());
                }
                Some(false) => {
                    let back = crate::gitlayer::admin_dir(&repo.gitdir, &admin);
                    if !back.exists() {
                        tracing::warn!("putting back {}", back.display());
                        let _ = fs::rename(e.path(), back);
                    }
                }
                None => {}
            }
        }
    }
}

/// At unmount: every lease released with reason `unmount`, then cleanup for every worktree
/// left without one (the grace period does not apply: the mount is going away). Worktrees
/// never leased (`ready`) and retained ones stay as they are.
pub fn reclaim_at_unmount(state: &StateDir, mountpoint: &Path) -> anyhow::Result<()> {
    let mut store = Store::open(&state.root)?;
    let released = store.release_all_leases("unmount")?;
    let marked = store.mark_deleting_after_grace(0)?;
    tracing::info!(
        "unmount: {released} lease(s) released, {} worktree(s) to clean up",
        marked.len()
    );
    for (row, r) in finish_all_deleting(state, &mut store, mountpoint) {
        match r {
            Ok(o) => tracing::info!("unmount: {}/{}: {o:?}", row.repo, row.name),
            Err(e) => tracing::error!("unmount: {}/{}: {e:#}", row.repo, row.name),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    fn findings(
        changes: &[(ChangeKind, &str)],
        head: Head,
        unpushed: usize,
        elsewhere: bool,
    ) -> Findings {
        Findings {
            changes: changes
                .iter()
                .map(|(k, p)| Change {
                    kind: *k,
                    path: p.to_string(),
                })
                .collect(),
            head,
            unpushed: (0..unpushed as u8).map(|i| oid(i + 1)).collect(),
            tip_elsewhere: elsewhere,
        }
    }

    /// (case, recorded branch, created by worktreefs, inspection, the verdict or the start
    /// of the reason it is retained for)
    type Row = (
        &'static str,
        Option<&'static str>,
        bool,
        Result<Findings, String>,
        Result<Verdict, &'static str>,
    );

    #[test]
    fn decision_table() {
        use ChangeKind::*;
        let on = || Head::Branch("task".into());
        let remove = |b: bool| Ok::<Verdict, &str>(Verdict::Remove { delete_branch: b });
        let rows: Vec<Row> = vec![
            (
                "clean, nothing new, branch reachable from main",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "clean, pushed",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "clean, pushed, branch existed before",
                Some("task"),
                false,
                Ok(findings(&[], on(), 0, true)),
                remove(false),
            ),
            (
                "clean, no upstream, no new commit, base on no other ref",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, false)),
                remove(false),
            ),
            (
                "ignored files only (inspection reports none)",
                Some("task"),
                true,
                Ok(findings(&[], on(), 0, true)),
                remove(true),
            ),
            (
                "dirty",
                Some("task"),
                true,
                Ok(findings(&[(Modified, "a.c")], on(), 0, true)),
                Err("uncommitted-changes (1 path: modified a.c)"),
            ),
            (
                "staged only",
                Some("task"),
                true,
                Ok(findings(&[(Staged, "a.c")], on(), 0, true)),
                Err("uncommitted-changes"),
            ),
            (
                "untracked only",
                Some("task"),
                true,
                Ok(findings(&[(Untracked, "new.txt")], on(), 0, true)),
                Err("uncommitted-changes (1 path: untracked new.txt)"),
            ),
            (
                "deleted file",
                Some("task"),
                true,
                Ok(findings(&[(Deleted, "README")], on(), 0, true)),
                Err("uncommitted-changes"),
            ),
            (
                "unpushed, no upstream",
                Some("task"),
                true,
                Ok(findings(&[], on(), 2, false)),
                Err("unpushed-commits (2 commits"),
            ),
            (
                "unpushed and dirty",
                Some("task"),
                true,
                Ok(findings(&[(Modified, "x")], on(), 1, false)),
                Err("uncommitted-changes (1 path: modified x); unpushed-commits (1 commit"),
            ),
            (
                "branch moved",
                Some("task"),
                true,
                Ok(findings(&[], Head::Branch("other".into()), 0, true)),
                Err("branch-moved (HEAD is on branch other; it was created on branch task)"),
            ),
            (
                "detached",
                Some("task"),
                true,
                Ok(findings(&[], Head::Detached(oid(9)), 0, true)),
                Err("branch-moved (HEAD is detached at 0909090909"),
            ),
            (
                "detached where detached was recorded",
                None,
                false,
                Ok(findings(&[], Head::Detached(oid(9)), 0, true)),
                remove(false),
            ),
            (
                "error while inspecting",
                Some("task"),
                true,
                Err("reading index: boom".into()),
                Err("cleanup-error: reading index: boom"),
            ),
        ];
        for (case, branch, created, inspected, want) in rows {
            let got = decide(branch, created, &inspected);
            match want {
                Ok(v) => assert_eq!(got, v, "{case}"),
                Err(prefix) => match got {
                    Verdict::Retain(r) => assert!(
                        r.starts_with(prefix),
                        "{case}: {r:?} does not start with {prefix:?}"
                    ),
                    other => panic!("{case}: {other:?}, want retained"),
                },
            }
        }
    }

    /// Records what ran and was undone; fails at one step.
    struct Fake {
        fail_at: Option<Step>,
        log: Vec<String>,
    }

    impl Remover for Fake {
        fn run(&mut self, step: Step) -> Result<(), String> {
            if self.fail_at == Some(step) {
                return Err("disk full".into());
            }
            self.log.push(format!("run {step:?}"));
            Ok(())
        }
        fn undo(&mut self, step: Step) -> Result<(), String> {
            self.log.push(format!("undo {step:?}"));
            Ok(())
        }
    }

    #[test]
    fn a_failing_step_undoes_the_ones_before_it() {
        // (delete branch?, failing step, result, log)
        let rows: Vec<(bool, Option<Step>, bool, Vec<&str>)> = vec![
            (false, None, true, vec!["run ParkUpper", "run ParkAdmin"]),
            (
                true,
                None,
                true,
                vec!["run ParkUpper", "run ParkAdmin", "run DeleteBranch"],
            ),
            (true, Some(Step::ParkUpper), false, vec![]),
            (
                true,
                Some(Step::ParkAdmin),
                false,
                vec!["run ParkUpper", "undo ParkUpper"],
            ),
            (
                true,
                Some(Step::DeleteBranch),
                false,
                vec![
                    "run ParkUpper",
                    "run ParkAdmin",
                    "undo ParkAdmin",
                    "undo ParkUpper",
                ],
            ),
        ];
        for (db, fail_at, ok, log) in rows {
            let mut f = Fake {
                fail_at,
                log: Vec::new(),
            };
            let r = execute(&plan(db), &mut f);
            assert_eq!(r.is_ok(), ok, "{fail_at:?}");
            if let Err(e) = r {
                assert!(e.ends_with("disk full"), "{e}");
            }
            assert_eq!(f.log, log, "{fail_at:?}");
        }
    }
}
