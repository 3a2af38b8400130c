//! Finding a repository, resolving a revision, and the admin entry of a linked worktree
//! under `<gitdir>/worktrees/`.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::error::{GitContext, GitError, GitErrorKind, GitResult};

/// The repository's common git directory and its work tree (None when bare).
pub fn discover(path: &Path) -> GitResult<(PathBuf, Option<PathBuf>)> {
    let repo = Repository::open(path).map_err(|e| {
        GitError::from(e)
            .context(format!(
                "{} is not a git repository (or cannot be opened); pass the path of a repository's top directory",
                path.display()
            ))
            .with_kind(GitErrorKind::NotFound)
    })?;
    let common = common_dir(&repo);
    let common = fs::canonicalize(&common).unwrap_or(common);
    let workdir = repo
        .workdir()
        .map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
    Ok((common, workdir))
}

/// The common git directory (where refs, objects and `worktrees/` live), also when `repo`
/// was opened through a linked worktree.
pub fn common_dir(repo: &Repository) -> PathBuf {
    let path = repo.path().to_path_buf();
    // Opened only when a regular file (a FIFO there would hold whoever asks).
    let commondir = crate::beneath::read_regular_following(&path.join("commondir"), 64 << 10)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    match commondir.ok_or(()) {
        Ok(rel) => {
            let joined = path.join(rel.trim());
            fs::canonicalize(&joined).unwrap_or(joined)
        }
        Err(_) => path,
    }
}

pub struct ResolvedBase {
    pub commit: Oid,
    pub tree: Oid,
    pub commit_time: i64,
}

pub fn resolve_base(repo: &Repository, rev: &str) -> GitResult<ResolvedBase> {
    let not_found = |m: String| GitError::new(GitErrorKind::NotFound, m);
    let obj = repo.revparse_single(rev).map_err(|e| {
        not_found(format!(
            "base revision '{rev}' does not resolve: {}",
            e.message()
        ))
    })?;
    let commit = obj
        .peel_to_commit()
        .map_err(|_| not_found(format!("base revision '{rev}' does not name a commit")))?;
    let commit_time = commit.committer().when().seconds();
    Ok(ResolvedBase {
        commit: commit.id(),
        tree: commit.tree_id(),
        commit_time,
    })
}

/// The branch worktree entry `admin` is on now, when it is branch `recorded` renamed by
/// git (`git branch -m OLD NEW` moves a worktree's HEAD with it): HEAD names another
/// branch, `recorded` is gone, and that branch's reflog says it was renamed from it.
/// Everything is read as regular files of bounded size, never through libgit2 (a ref the
/// repository's owner made a FIFO must not hold the daemon), and HEAD first: a worktree
/// still on its branch costs one small read.
pub fn renamed_branch(gitdir: &Path, admin: &Path, recorded: &str) -> Option<String> {
    let (head, _) = crate::beneath::read_regular_in(admin, Path::new("HEAD"), 4096).ok()?;
    let head = String::from_utf8(head).ok()?;
    let now = head.trim().strip_prefix("ref: refs/heads/")?.to_string();
    // git renames only to a name it allows: anything else there was written by hand.
    if now == recorded || crate::names::validate_branch_name(&now).is_err() {
        return None;
    }
    // The recorded branch is gone: no loose ref (looked at, never opened), and not in
    // packed-refs.
    if std::fs::symlink_metadata(gitdir.join("refs/heads").join(recorded)).is_ok() {
        return None;
    }
    let packed = format!(" refs/heads/{recorded}\n");
    if crate::beneath::read_regular_in(gitdir, Path::new("packed-refs"), 64 << 20)
        .is_ok_and(|(b, _)| String::from_utf8_lossy(&b).contains(&packed))
    {
        return None;
    }
    let (log, _) =
        crate::beneath::read_regular_in(gitdir, &Path::new("logs/refs/heads").join(&now), 16 << 20)
            .ok()?;
    // A rename moves the branch's reflog and adds `Branch: renamed refs/heads/A to
    // refs/heads/B`: the renames since `recorded` (one or several) are all in `now`'s.
    let log = String::from_utf8_lossy(&log);
    let renamed_from: std::collections::HashMap<&str, &str> = log
        .lines()
        .filter_map(|l| {
            l.split_once("\tBranch: renamed refs/heads/")
                .map(|(_, r)| r)
        })
        .filter_map(|r| r.split_once(" to refs/heads/"))
        .map(|(from, to)| (to, from))
        .collect();
    let mut at = now.as_str();
    for _ in 0..32 {
        match renamed_from.get(at) {
            Some(&from) if from == recorded => return Some(now),
            Some(&from) => at = from,
            None => return None,
        }
    }
    None
}

/// The `HEAD` file of admin entry `admin`, read as it is (`ref: refs/heads/b` or a
/// commit id), never through a symlink, never waiting on a FIFO, at most 4 KiB.
pub fn read_head(admin: &Path) -> Option<String> {
    use std::os::fd::AsFd;
    let dir = std::fs::File::open(admin).ok()?;
    let (bytes, _) = crate::beneath::read_regular(dir.as_fd(), b"HEAD", 4096).ok()?;
    Some(String::from_utf8(bytes).ok()?.trim().to_string())
}

/// The commit worktree `admin_name`'s HEAD is at (through its branch, when it is on one).
pub fn head_and_tip(gitdir: &Path, admin_name: &str) -> Option<git2::Oid> {
    let head = read_head(&admin_dir(gitdir, admin_name))?;
    match head.strip_prefix("ref: ") {
        Some(name) => Repository::open_bare(gitdir).ok()?.refname_to_id(name).ok(),
        None => git2::Oid::from_str(&head).ok(),
    }
}

/// Where git keeps a linked worktree's administrative files.
pub fn admin_dir(gitdir: &Path, admin_name: &str) -> PathBuf {
    gitdir.join("worktrees").join(admin_name)
}

/// Picks a free admin entry name for worktree `name`, the way git suffixes numbers.
pub fn free_admin_name(gitdir: &Path, name: &str) -> String {
    free_admin_name_except(gitdir, name, &[])
}

/// As `free_admin_name`, also passing over the names in `taken` (creations in progress).
pub fn free_admin_name_except(gitdir: &Path, name: &str, taken: &[String]) -> String {
    let base = format!("wtfs-{name}");
    let free = |n: &String| !admin_dir(gitdir, n).exists() && !taken.contains(n);
    if free(&base) {
        return base;
    }
    (1..)
        .map(|i| format!("{base}{i}"))
        .find(free)
        .unwrap_or(base)
}

/// Where branch `branch` (a short name) is checked out, if anywhere.
pub fn checked_out_in(repo: &Repository, branch: &str) -> Option<String> {
    let full = format!("refs/heads/{branch}");
    checked_out_branches(repo)
        .into_iter()
        .find(|(_, r)| *r == full)
        .map(|(holder, _)| holder)
}

/// What the branch of a checked-out worktree is, for every worktree git knows of.
pub fn checked_out_branches(repo: &Repository) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(head) = repo.find_reference("HEAD") {
        if let Some(target) = head.symbolic_target() {
            out.push(("main worktree".to_string(), target.to_string()));
        }
    }
    let dir = common_dir(repo).join("worktrees");
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            // Read as a file its user may have made anything (a FIFO would hold `new`).
            let head = crate::beneath::read_regular_in(&e.path(), Path::new("HEAD"), 64 << 10)
                .map(|(b, _)| String::from_utf8_lossy(&b).into_owned());
            if let Ok(head) = head {
                if let Some(r) = head.trim().strip_prefix("ref: ") {
                    out.push((e.file_name().to_string_lossy().into_owned(), r.to_string()));
                }
            }
        }
    }
    out
}

/// The directory `<gitdir>/worktrees`, reached through no symlink; None when there is
/// none (or it cannot be used: nothing worktreefs made can be in it then).
pub fn worktrees_dir(gitdir: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let top = crate::beneath::open_root(gitdir).ok()?;
    crate::beneath::dir(top.as_fd(), b"worktrees").ok()
}

/// `worktrees/` in the git directory `top` (a descriptor), reached through no symlink;
/// made when missing, and given to the git directory's owner, as git would have made it.
pub fn worktrees_made(top: std::os::fd::BorrowedFd) -> std::io::Result<std::os::fd::OwnedFd> {
    use crate::beneath;
    use std::os::fd::AsFd;
    match beneath::dir(top, b"worktrees") {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            match beneath::mkdir_at(top, std::ffi::OsStr::new("worktrees"), 0o755) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            let d = beneath::dir(top, b"worktrees")?;
            let st = beneath::fstat(top)?;
            let _ = beneath::chown(d.as_fd(), Some(st.st_uid), Some(st.st_gid));
            Ok(d)
        }
        other => other,
    }
}

/// Writes git's entry `admin_name` of a managed worktree in `<gitdir>/worktrees/`,
/// locked first, so that `git worktree prune` never sees a half-made one, and its index
/// last (synced), so an entry with an index is complete. It belongs to `owner` (git
/// inside writes its index and HEAD there); a `worktrees/` made here to the repository's
/// owner, as git would have made it.
///
/// The repository is its owner's, who may have made anything of it: every directory is
/// reached without following a symlink (one to a directory of root's is refused, never
/// written in), the entry is made here or refused (never one someone else made in the
/// meantime: [`GitErrorKind::EntryNotMade`], as every failure before the directory was
/// made, with the causes beneath saying why), each
/// file is made new (`O_EXCL`, never following) and given its owner through its own
/// descriptor, and the directory is given its owner last (until then nobody else can
/// put anything in it).
pub fn write_admin_entry(
    gitdir: &Path,
    admin_name: &str,
    owner: (u32, u32),
    head: &str,
    worktree_gitfile: &Path,
    write_index: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
    lock_reason: &str,
) -> GitResult<()> {
    use crate::beneath;
    use std::ffi::OsStr;
    use std::io::Write;
    use std::os::fd::AsFd;
    let worktrees_path = gitdir.join("worktrees");
    let dir_path = worktrees_path.join(admin_name);
    let not_made = |e: GitError| {
        e.context("git's worktree entry was not made")
            .with_kind(GitErrorKind::EntryNotMade)
    };
    let top = beneath::open_root(gitdir)
        .with_context(|| format!("opening git directory {}", gitdir.display()))
        .map_err(not_made)?;
    let unusable = |e: std::io::Error| {
        let what = match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) => {
                " (a symbolic link, or not a directory: not followed)"
            }
            _ => "",
        };
        not_made(GitError::from(e).context(format!(
            "git's worktrees directory {} cannot be used{what}; make it a plain directory (or remove it: it is made again), then retry",
            worktrees_path.display()
        )))
    };
    let worktrees = worktrees_made(top.as_fd()).map_err(unusable)?;
    beneath::mkdir_at(worktrees.as_fd(), OsStr::new(admin_name), 0o755)
        .with_context(|| {
            format!(
                "creating git worktree entry {} (it may exist already)",
                dir_path.display()
            )
        })
        .map_err(not_made)?;
    let dir = beneath::dir(worktrees.as_fd(), admin_name.as_bytes())
        .with_context(|| format!("opening {}", dir_path.display()))?;
    let (uid, gid) = owner;
    let give = |fd: std::os::fd::BorrowedFd, what: &str| -> GitResult<()> {
        match beneath::chown(fd, Some(uid), Some(gid)) {
            // A daemon that may not chown (not root) leaves its own.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
            r => r.with_context(|| {
                format!("giving {} to {uid}:{gid}", dir_path.join(what).display())
            }),
        }
    };
    let make = |name: &str| -> GitResult<fs::File> {
        let fd = beneath::open(
            dir.as_fd(),
            name.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )
        .with_context(|| format!("creating {}", dir_path.join(name).display()))?;
        give(fd.as_fd(), name)?;
        Ok(fs::File::from(fd))
    };
    make("locked")?.write_all(lock_reason.as_bytes())?;
    make("commondir")?.write_all(b"../..\n")?;
    make("gitdir")?.write_all(format!("{}\n", worktree_gitfile.display()).as_bytes())?;
    make("HEAD")?.write_all(format!("{head}\n").as_bytes())?;
    let mut index = make("index.wtfs-new")?;
    write_index(&mut index)
        .and_then(|_| index.sync_all())
        .and_then(|_| {
            beneath::rename_at(
                dir.as_fd(),
                OsStr::new("index.wtfs-new"),
                dir.as_fd(),
                OsStr::new("index"),
                0,
            )
        })
        .and_then(|_| beneath::reopen(dir.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?.sync_all())
        .with_context(|| format!("writing {}", dir_path.join("index").display()))?;
    give(dir.as_fd(), "")?;
    Ok(())
}

/// One of git's worktree entries (`worktrees/<name>`), opened once through no symlink, so
/// that what is checked, rewritten, moved or deleted is this one directory whatever is
/// renamed meanwhile: the repository's owner owns `worktrees/` and can rename any entry
/// there into any name, another user's worktree's among them, at any moment.
pub struct Entry {
    fd: std::os::fd::OwnedFd,
    st: crate::beneath::Stat,
}

impl Entry {
    /// The entry `name` in `dir` (a directory, not a symlink to one).
    pub fn open(dir: std::os::fd::BorrowedFd, name: &std::ffi::OsStr) -> std::io::Result<Entry> {
        use std::os::fd::AsFd;
        use std::os::unix::ffi::OsStrExt;
        let fd = crate::beneath::dir(dir, name.as_bytes())?;
        let st = crate::beneath::fstat(fd.as_fd())?;
        Ok(Entry { fd, st })
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Its owner's uid.
    pub fn owner(&self) -> u32 {
        self.st.st_uid
    }

    /// Its file `name`, read as a file its owner may have made anything of.
    pub fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        crate::beneath::read_regular(self.fd(), name.as_bytes(), 64 << 10).map(|(b, _)| b)
    }

    /// Whether it is the entry worktreefs made for the worktree at `place` under the mount
    /// (`<repo>/<name>`, a submodule view's path after it) whose owner is `uid`: its lock
    /// says so (`lock_ok`), it is `uid`'s (or the daemon's: entries made before they were
    /// given to their owner), and its `gitdir` names `<mountpoint>/<place>/.git`
    /// (whatever the mountpoint: it may have moved since). Half made by this daemon (a
    /// crash: still the daemon's, and without the index it writes last), its `gitdir` may
    /// be missing or partial, and it is still its maker's. Err says what it is instead.
    pub fn check(
        &self,
        lock_ok: impl Fn(&[u8]) -> bool,
        place: &str,
        uid: u32,
    ) -> Result<(), String> {
        if !self.read("locked").is_ok_and(|b| lock_ok(&b)) {
            return Err("is not marked as created by worktreefs".into());
        }
        let me = nix::unistd::geteuid().as_raw();
        if self.st.st_uid != uid && self.st.st_uid != me {
            return Err(format!(
                "is not this worktree's entry (it is uid {}'s, the worktree uid {uid}'s)",
                self.st.st_uid
            ));
        }
        let half_made = self.st.st_uid == me
            && crate::beneath::stat_at(self.fd(), std::ffi::OsStr::new("index"))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        match self.read("gitdir") {
            Ok(b) if b.ends_with(format!("/{place}/.git\n").as_bytes()) => Ok(()),
            _ if half_made => Ok(()),
            Ok(_) => Err("is not this worktree's entry (its gitdir names another worktree)".into()),
            Err(e) => Err(format!(
                "cannot be told to be this worktree's entry: its gitdir cannot be read ({e}); make it a file naming the worktree's .git (git worktree repair, run in the worktree, does)"
            )),
        }
    }

    /// Whether `name` in `dir` is this entry (not something renamed there since).
    pub fn is_at(&self, dir: std::os::fd::BorrowedFd, name: &std::ffi::OsStr) -> bool {
        crate::beneath::stat_at(dir, name)
            .is_ok_and(|s| s.st_dev == self.st.st_dev && s.st_ino == self.st.st_ino)
    }

    /// Deletes it: what it holds, through its own descriptor; then its name `name` in
    /// `dir` when that still is this entry (else it is left, empty, wherever it went).
    pub fn remove(
        self,
        dir: std::os::fd::BorrowedFd,
        name: &std::ffi::OsStr,
    ) -> std::io::Result<()> {
        for e in crate::beneath::list(self.fd())? {
            crate::beneath::remove_tree(self.fd(), &e.name)?;
        }
        if !self.is_at(dir, name) {
            return Ok(());
        }
        match crate::beneath::unlink_at(dir, name, true) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }
}

/// The text of the `locked` file of every admin entry worktreefs writes starts so.
pub const ADMIN_MARKER: &str = "managed by worktreefs";

/// The `locked` file of an admin entry the worktreefs of the state directory at
/// `state_root` writes.
pub fn admin_lock_text(state_root: &Path) -> String {
    format!("{ADMIN_MARKER} (state dir {})\n", state_root.display())
}

/// Writes `want` into the `gitdir` file of git's entry `admin_name` of the repository
/// whose git directory is `gitdir`, when it holds something else; true when it did. The
/// entry is in the repository's owner's hands: what is there now is read only when it is
/// a regular file reached through no symlink (a FIFO would hold the mount), and it is
/// replaced, never written through (a symlink to a file of root's stays untouched). An
/// entry that is gone is left gone.
pub fn point_admin_entry(
    gitdir: &Path,
    admin_name: &str,
    lock_ok: impl Fn(&[u8]) -> bool,
    place: &str,
    uid: u32,
    want: &str,
) -> Option<Entry> {
    let path = admin_dir(gitdir, admin_name);
    let worktrees = worktrees_dir(gitdir)?;
    let entry = match Entry::open(worktrees.as_fd(), std::ffi::OsStr::new(admin_name)) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!("could not open git's entry {}: {e}", path.display());
            return None;
        }
    };
    if entry.read("gitdir").is_ok_and(|now| now == want.as_bytes()) {
        return None;
    }
    // Only this worktree's own entry: one renamed into its name (another worktree's, say)
    // pointed here would pass for this one's, and its removal would take it.
    if let Err(why) = entry.check(lock_ok, place, uid) {
        tracing::warn!(
            "git's entry {} {why}; not pointed at the mount (if it is another worktree's, rename it back to that worktree's entry name)",
            path.display()
        );
        return None;
    }
    match crate::beneath::replace_file_at(
        entry.fd(),
        std::ffi::OsStr::new("gitdir"),
        want.as_bytes(),
        0o644,
    ) {
        Ok(()) => Some(entry),
        Err(e) => {
            tracing::warn!(
                "could not point git's entry {} at the mount: {e}",
                path.display()
            );
            None
        }
    }
}

/// Where removed admin entries wait to be deleted, inside the repository's git dir (same
/// filesystem, so parking is one rename) and outside `worktrees/` (so git never sees them).
pub const PARKED_ADMIN_DIR: &str = "worktreefs/removing";

/// git's entries (`<gitdir>/worktrees`) and where removals park them
/// (`<gitdir>/worktreefs/removing`), reached beneath the repository's git directory
/// through no symlink: its owner may have made anything of them, and root renames and
/// deletes there.
pub struct AdminDirs {
    top: std::os::fd::OwnedFd,
}

impl AdminDirs {
    pub fn open(gitdir: &Path) -> std::io::Result<AdminDirs> {
        Ok(AdminDirs {
            top: crate::beneath::open_root(gitdir)?,
        })
    }

    /// `worktrees/`; made when `make` and missing (the repository owner's, as git makes it).
    pub fn worktrees(&self, make: bool) -> std::io::Result<std::os::fd::OwnedFd> {
        if make {
            worktrees_made(self.top.as_fd())
        } else {
            crate::beneath::dir(self.top.as_fd(), b"worktrees")
        }
    }

    /// The parking directory; made (as root's, like the files in it) when `make`.
    pub fn removing(&self, make: bool) -> std::io::Result<std::os::fd::OwnedFd> {
        if make {
            for d in ["worktreefs", "worktreefs/removing"] {
                let (parent, name) = d.rsplit_once('/').unwrap_or(("", d));
                let p = crate::beneath::dir(self.top.as_fd(), parent.as_bytes())?;
                match crate::beneath::mkdir_at(p.as_fd(), std::ffi::OsStr::new(name), 0o755) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
            }
        }
        let d = crate::beneath::dir(self.top.as_fd(), PARKED_ADMIN_DIR.as_bytes())?;
        // Only what this daemon put there may be in it: one the repository's owner made
        // (or renamed into its place) could hold anything, another user's entry among
        // them, and what is parked there is deleted.
        let st = crate::beneath::fstat(d.as_fd())?;
        let me = nix::unistd::geteuid().as_raw();
        if !(st.st_uid == 0 || st.st_uid == me) || st.st_mode & 0o022 != 0 {
            return Err(std::io::Error::other(format!(
                "it is not worktreefs's own (owned by uid {}, mode {:o}); remove it (it is made again)",
                st.st_uid,
                st.st_mode & 0o7777
            )));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn write_entry(
        gitdir: &Path,
        name: &str,
        index: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
    ) -> GitResult<()> {
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        write_admin_entry(
            gitdir,
            name,
            me,
            "ref: refs/heads/b",
            Path::new("/m/.git"),
            index,
            "managed",
        )
    }

    /// The caller undoes an entry only when it was made: an entry of that name already
    /// there (someone else's) is "not made", a failure after the directory was made is
    /// not, and the cause (a full disk, say) stays readable beneath either.
    #[test]
    fn an_entry_not_made_is_told_from_one_half_made() {
        let d = tempfile::tempdir().unwrap();
        let gitdir = d.path();
        write_entry(gitdir, "wtfs-a", |f| f.write_all(b"index")).unwrap();
        assert_eq!(
            fs::read(gitdir.join("worktrees/wtfs-a/index")).unwrap(),
            b"index"
        );
        let taken = write_entry(gitdir, "wtfs-a", |_| Ok(())).unwrap_err();
        assert_eq!(taken.kind(), GitErrorKind::EntryNotMade, "{taken:#}");
        assert!(
            format!("{taken:#}").contains("may exist already"),
            "{taken:#}"
        );
        let full = write_entry(gitdir, "wtfs-b", |_| {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert_eq!(full.kind(), GitErrorKind::Failed, "{full:#}");
        assert_eq!(
            full.io_error().and_then(|e| e.raw_os_error()),
            Some(libc::ENOSPC)
        );
        assert!(gitdir.join("worktrees/wtfs-b").is_dir(), "half made");
        let not_found = discover(&d.path().join("nowhere")).unwrap_err();
        assert_eq!(not_found.kind(), GitErrorKind::NotFound);
    }

    /// `worktrees/` with the entries `mine` (for `repo/mine`) and `theirs`.
    fn entries() -> (tempfile::TempDir, std::os::fd::OwnedFd) {
        let d = tempfile::tempdir().unwrap();
        for name in ["mine", "theirs"] {
            let e = d.path().join(name);
            fs::create_dir(&e).unwrap();
            fs::write(e.join("locked"), b"managed by worktreefs\n").unwrap();
            fs::write(e.join("gitdir"), format!("/mnt/repo/{name}/.git\n")).unwrap();
            fs::write(e.join("HEAD"), name).unwrap();
            fs::write(e.join("index"), b"DIRC").unwrap();
        }
        let fd = crate::beneath::open_root(d.path()).unwrap();
        (d, fd)
    }

    fn swap(d: &Path) {
        fs::rename(d.join("mine"), d.join("away")).unwrap();
        fs::rename(d.join("theirs"), d.join("mine")).unwrap();
    }

    #[test]
    fn an_entry_is_checked_by_its_lock_and_its_gitdir() {
        let (d, w) = entries();
        let marked = |b: &[u8]| b.starts_with(b"managed by worktreefs");
        let mine = Entry::open(w.as_fd(), OsStr::new("mine")).unwrap();
        assert_eq!(mine.check(marked, "repo/mine", 0), Ok(()));
        let err = mine.check(marked, "repo/theirs", 0).unwrap_err();
        assert!(err.contains("names another worktree"), "{err}");
        assert!(mine.check(|_| false, "repo/mine", 0).is_err());
        // Another user's: not this worktree's, whatever it says.
        let path = d.path().join("mine");
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let mine = Entry::open(w.as_fd(), OsStr::new("mine")).unwrap();
        let err = mine.check(marked, "repo/mine", 1000).unwrap_err();
        assert!(err.contains("uid 65534's"), "{err}");
        assert_eq!(mine.check(marked, "repo/mine", 65534), Ok(()));
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        // Half made by the daemon (no index yet): its maker's, whatever its gitdir holds.
        fs::remove_file(path.join("index")).unwrap();
        fs::write(path.join("gitdir"), b"/mnt/re").unwrap();
        let mine = Entry::open(w.as_fd(), OsStr::new("mine")).unwrap();
        assert_eq!(mine.check(marked, "repo/mine", 1000), Ok(()));
        // A symlink as its gitdir: whose it is cannot be told.
        let theirs = d.path().join("theirs");
        fs::remove_file(theirs.join("gitdir")).unwrap();
        std::os::unix::fs::symlink(d.path().join("mine/gitdir"), theirs.join("gitdir")).unwrap();
        let t = Entry::open(w.as_fd(), OsStr::new("theirs")).unwrap();
        let err = t.check(marked, "repo/mine", 0).unwrap_err();
        assert!(err.contains("cannot be read"), "{err}");
        // A symlink as the entry is not opened.
        std::os::unix::fs::symlink(d.path().join("mine"), d.path().join("link")).unwrap();
        assert!(Entry::open(w.as_fd(), OsStr::new("link")).is_err());
    }

    /// Another entry renamed into the name after the check is not what is removed: the
    /// one checked is emptied wherever it went, the other is untouched.
    #[test]
    fn removing_an_entry_removes_the_one_checked() {
        let (d, w) = entries();
        let mine = Entry::open(w.as_fd(), OsStr::new("mine")).unwrap();
        assert!(mine.is_at(w.as_fd(), OsStr::new("mine")));
        swap(d.path());
        assert!(!mine.is_at(w.as_fd(), OsStr::new("mine")));
        mine.remove(w.as_fd(), OsStr::new("mine")).unwrap();
        assert_eq!(fs::read(d.path().join("mine/HEAD")).unwrap(), b"theirs");
        assert_eq!(fs::read_dir(d.path().join("away")).unwrap().count(), 0);
        // Not swapped: it goes whole.
        let t = Entry::open(w.as_fd(), OsStr::new("mine")).unwrap();
        t.remove(w.as_fd(), OsStr::new("mine")).unwrap();
        assert!(!d.path().join("mine").exists());
    }
}
