//! The walk of a worktree's upper layer against its base tree and index: what is
//! changed, untracked or ignored, each file compared through its clean side where git
//! would.

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use git2::{ObjectType, Oid, Repository, Tree};
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::decide::{Change, ChangeKind};
use crate::beneath;
use crate::git::{MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::layout::UpperDir;

/// Ignore rules are matched against paths under this made-up root.
pub(super) const VROOT: &str = "/.wtfs-root";

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
pub(super) struct LazyCleanSide {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) common_dir: PathBuf,
    pub(super) head_tree: Oid,
    /// How long one run of git for the clean side may take.
    pub(super) limit: std::time::Duration,
    pub(super) decided: std::cell::OnceCell<Option<CleanSide>>,
}

impl LazyCleanSide {
    fn get(&self, repo: &Repository) -> Option<&CleanSide> {
        self.decided
            .get_or_init(|| {
                let setting = crate::git::checkout::Setting::of(
                    self.uid,
                    self.gid,
                    &self.common_dir,
                    self.limit,
                );
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
pub(super) struct CleanSide {
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
pub(super) struct IndexStat {
    pub(super) fsmonitor_valid: bool,
    pub(super) id: Oid,
    pub(super) size: u32,
    /// Seconds and nanoseconds.
    pub(super) mtime: (u32, u32),
    pub(super) ctime: (u32, u32),
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) racy: bool,
}

pub(super) struct Walker<'r> {
    pub(super) repo: &'r Repository,
    pub(super) clean_side: LazyCleanSide,
    /// The worktree's warm snapshot (`git::warm`).
    pub(super) warm: Option<crate::git::warm::Snapshot>,
    /// The blob cache, which holds the snapshot's contents.
    pub(super) blobs: PathBuf,
    /// Stage-0 index entries git has looked at (size not 0), by path.
    pub(super) index_stats: std::collections::HashMap<Vec<u8>, IndexStat>,
    pub(super) whiteouts: &'r crate::layout::Whiteouts,
    pub(super) changes: Vec<Change>,
    pub(super) global: Option<Gitignore>,
    /// The `.gitignore` rules of each directory from the root down to the one being walked.
    pub(super) stack: Vec<Option<Gitignore>>,
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
    pub(super) fn dir(
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
