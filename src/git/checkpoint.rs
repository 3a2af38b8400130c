//! git's own state of a linked worktree at a checkpoint: its `HEAD`, its index, the
//! files of a merge, cherry-pick, revert, rebase or bisect under way, and its own refs
//! (`refs/bisect/` and the like), config and sparse-checkout, kept beside them in
//! its admin entry (`<admin>/worktreefs-checkpoints/<n>/`; the index as a hard link: git
//! only ever replaces it by a rename, so the link keeps the old one, in O(1)); the
//! branches a rewind may move, with their commits, kept in the daemon's own checkpoint
//! directory (the worktree's user writes its admin entry, never that); and a ref that
//! keeps `HEAD`'s commit and those branches' reachable (`checkpoint_refs.rs`).
//!
//! The admin entry is its worktree's user's: every file there is reached by descriptor,
//! through no symbolic link, read only when it is a regular file (a FIFO is never
//! opened), and written as a new file renamed into place (never through what a name
//! holds), given the entry's owner. Refs are changed as the repository's owner
//! (`owner.rs`), and only branches (`refs/heads/`). Shared refs (other branches,
//! remote-tracking refs, `refs/stash`) are never touched; the reflogs are appended to,
//! never rewound.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::{GitContext, GitResult};
use super::owner::{as_owner_of, pinned};
use crate::beneath;

/// The directory in a worktree's admin entry holding its checkpoints' git state.
pub const DIR: &str = "worktreefs-checkpoints";
/// Written last: the state of a checkpoint is complete.
const COMPLETE: &str = "complete";
/// The per-worktree files git keeps in the admin entry that a checkpoint keeps.
const FILES: [&str; 19] = [
    "HEAD",
    "ORIG_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_AUTOSTASH",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "SQUASH_MSG",
    "BISECT_LOG",
    "BISECT_START",
    "BISECT_TERMS",
    "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK",
    "BISECT_NAMES",
    "BISECT_RUN",
    // The worktree's own config (`extensions.worktreeConfig`).
    "config.worktree",
];
/// The files among those that name commits of an operation under way.
const OPERATION_HEADS: [&str; 5] = [
    "ORIG_HEAD",
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
];
/// The per-worktree directories: of an operation under way, the worktree's own refs
/// (`refs/bisect/`, `refs/worktree/`, `refs/rewritten/`), and `info/` (its
/// `sparse-checkout`).
const DIRS: [&str; 5] = ["rebase-merge", "rebase-apply", "sequencer", "refs", "info"];
const INDEX: &str = "index";
/// In the daemon's checkpoint directory: `<ref> <commit or ->` per branch.
const BRANCHES: &str = "git-branches";
/// The most a kept file of git's may hold (a MERGE_MSG, a rebase's todo list).
const CAP: u64 = 4 << 20;
/// The most entries a kept directory of git's may hold (a rebase's state).
const DIR_ENTRIES: usize = 10_000;

/// Where a worktree's git state is: its repository, its admin entry's name there, and
/// the daemon's directory of the checkpoint in question.
pub struct Place<'a> {
    pub gitdir: &'a Path,
    pub admin_name: &'a str,
    /// The worktree as `<repo>/<name>` (a mount's path below its mountpoint), and its
    /// owner: the entry must be this worktree's (its `gitdir` names it, and it is the
    /// owner's or the daemon's), not another's renamed into its name.
    pub worktree: String,
    pub uid: u32,
}

fn n_name(n: u64) -> OsString {
    OsString::from(n.to_string())
}

impl Place<'_> {
    /// The admin entry, reached from the registered git directory through no link, and
    /// checked to be this worktree's.
    fn admin(&self) -> io::Result<OwnedFd> {
        let git = pinned(self.gitdir).map_err(|e| io::Error::other(format!("{e:#}")))?;
        let fd = beneath::dir(
            git.as_fd(),
            format!("worktrees/{}", self.admin_name).as_bytes(),
        )?;
        let st = beneath::fstat(fd.as_fd())?;
        let me = nix::unistd::geteuid().as_raw();
        let names_it = beneath::read_regular(fd.as_fd(), b"gitdir", 64 << 10)
            .is_ok_and(|(b, _)| b.ends_with(format!("/{}/.git\n", self.worktree).as_bytes()));
        if (st.st_uid != self.uid && st.st_uid != me) || !names_it {
            return Err(io::Error::other(format!(
                "git's entry worktrees/{} is not worktree {}'s (renamed there from another?)",
                self.admin_name, self.worktree
            )));
        }
        Ok(fd)
    }

    /// The admin entry's directory of checkpoint `n`'s files, if it is there.
    fn state_of(&self, admin: BorrowedFd, n: u64) -> io::Result<OwnedFd> {
        beneath::dir(admin, format!("{DIR}/{n}").as_bytes())
    }

    /// Whether checkpoint `n`'s git state is kept whole.
    pub fn is_saved(&self, n: u64) -> bool {
        self.admin()
            .and_then(|a| self.state_of(a.as_fd(), n))
            .and_then(|d| beneath::stat_at(d.as_fd(), OsStr::new(COMPLETE)))
            .is_ok()
    }

    /// Whether the admin entry is there at all.
    pub fn exists(&self) -> bool {
        self.admin().is_ok()
    }
}

/// A new file `name` in `dir` holding `bytes`, owned as `owner`: made beside the name
/// (`O_EXCL`, never following) and renamed over whatever the name holds.
fn write_at(dir: BorrowedFd, name: &OsStr, bytes: &[u8], owner: (u32, u32)) -> io::Result<()> {
    use std::io::Write;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = OsString::from(".worktreefs-");
    tmp.push(format!("{}-{n}-", std::process::id()));
    tmp.push(name);
    let fd = beneath::open(
        dir,
        tmp.as_bytes(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o644,
    )?;
    let mut f = std::fs::File::from(fd);
    let done = f
        .write_all(bytes)
        .and_then(|_| own(f.as_fd(), owner))
        .and_then(|_| beneath::rename_at(dir, &tmp, dir, name, 0));
    if done.is_err() {
        let _ = beneath::unlink_at(dir, &tmp, false);
    }
    done
}

fn own(fd: BorrowedFd, (uid, gid): (u32, u32)) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    if unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The regular file `name` of `dir` when it is one of the entry's owner's own (`owner`):
/// a FIFO, a link, or a file of someone else's linked there reads as none (what the
/// daemon copies out of the entry is only what its owner could have written).
fn read_at(dir: BorrowedFd, name: &str, owner: (u32, u32)) -> io::Result<Option<Vec<u8>>> {
    match beneath::read_regular(dir, name.as_bytes(), CAP) {
        Ok((b, st)) if st.st_uid == owner.0 && st.st_nlink == 1 => Ok(Some(b)),
        Ok(_) => Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT)) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(None),
        Err(e) => Err(e),
    }
}

/// Copies the directory `name` of `from` into `to` (made), regular files and
/// directories only, through no link.
fn copy_dir(from: BorrowedFd, to: BorrowedFd, name: &OsStr, owner: (u32, u32)) -> io::Result<()> {
    let mut stack: Vec<(OwnedFd, OwnedFd)> = Vec::new();
    let src = beneath::dir(from, name.as_bytes())?;
    beneath::mkdir_at(to, name, 0o755)?;
    let dst = beneath::dir(to, name.as_bytes())?;
    own(
        beneath::reopen(dst.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?.as_fd(),
        owner,
    )?;
    stack.push((src, dst));
    let mut seen = 0;
    while let Some((src, dst)) = stack.pop() {
        for e in beneath::list(src.as_fd())? {
            seen += 1;
            if seen > DIR_ENTRIES {
                return Err(io::Error::other(format!(
                    "{} holds more than {DIR_ENTRIES} entries: not git's state",
                    name.to_string_lossy()
                )));
            }
            let st = beneath::stat_at(src.as_fd(), &e.name)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => {
                    beneath::mkdir_at(dst.as_fd(), &e.name, 0o755)?;
                    let (s, d) = (
                        beneath::dir(src.as_fd(), e.name.as_bytes())?,
                        beneath::dir(dst.as_fd(), e.name.as_bytes())?,
                    );
                    own(
                        beneath::reopen(d.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?.as_fd(),
                        owner,
                    )?;
                    stack.push((s, d));
                }
                libc::S_IFREG => {
                    if let Some(b) = read_at(src.as_fd(), &e.name.to_string_lossy(), owner)? {
                        write_at(dst.as_fd(), &e.name, &b, owner)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The commit a `HEAD` file's text names (none for an unborn branch).
fn head_commit(repo: &git2::Repository, head: &str) -> Option<git2::Oid> {
    let h = head.trim_end();
    match h.strip_prefix("ref: ") {
        Some(r) => repo.find_reference(r).ok()?.target(),
        None => git2::Oid::from_str(h).ok(),
    }
}

/// The branch a `HEAD` file's text names, when it names one.
fn head_branch(head: &str) -> Option<&str> {
    head.trim_end()
        .strip_prefix("ref: ")
        .filter(|r| r.starts_with("refs/heads/"))
}

/// Keeps the git state of the worktree at `at` as checkpoint `n`'s: its files in its
/// admin entry, the branch its `HEAD` names (with `also`, branches a rewind about to run
/// will move) in `daemon_dir`, and the ref that keeps `HEAD`'s commit (`key` naming the
/// worktree).
pub fn save(at: &Place, daemon_dir: &Path, key: &str, n: u64, also: &[String]) -> GitResult<()> {
    let what = format!(
        "keeping git's state of worktree entry {} as checkpoint {n}",
        at.admin_name
    );
    (|| -> GitResult<()> {
        let admin = at.admin()?;
        let st = beneath::fstat(admin.as_fd())?;
        let owner = (st.st_uid, st.st_gid);
        match beneath::mkdir_at(admin.as_fd(), OsStr::new(DIR), 0o755) {
            Ok(()) => own(
                beneath::reopen(
                    beneath::dir(admin.as_fd(), DIR.as_bytes())?.as_fd(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                )?
                .as_fd(),
                owner,
            )?,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let all = beneath::dir(admin.as_fd(), DIR.as_bytes())?;
        beneath::remove_tree(all.as_fd(), &n_name(n))?;
        beneath::mkdir_at(all.as_fd(), &n_name(n), 0o755)?;
        let to = beneath::dir(all.as_fd(), n.to_string().as_bytes())?;
        for f in FILES {
            if let Some(b) = read_at(admin.as_fd(), f, owner)? {
                write_at(to.as_fd(), OsStr::new(f), &b, owner)?;
            }
        }
        let index = OsStr::new(INDEX);
        if beneath::stat_at(admin.as_fd(), index)
            .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFREG && s.st_uid == owner.0)
        {
            beneath::link_at(admin.as_fd(), index, to.as_fd(), index)?;
        }
        for d in DIRS {
            if beneath::stat_at(admin.as_fd(), OsStr::new(d))
                .is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR)
            {
                copy_dir(admin.as_fd(), to.as_fd(), OsStr::new(d), owner)?;
            }
        }
        let head =
            String::from_utf8_lossy(&read_at(admin.as_fd(), "HEAD", owner)?.unwrap_or_default())
                .into_owned();
        let mut branches: Vec<String> =
            head_branch(&head).map(str::to_string).into_iter().collect();
        branches.extend(
            also.iter()
                .filter(|b| b.starts_with("refs/heads/"))
                .cloned(),
        );
        branches.sort();
        branches.dedup();
        // The commits of an operation under way (a merge's other heads, the commit being
        // picked or reverted, the rebase's): a rewind brings them back too.
        let mut under_way: Vec<git2::Oid> = Vec::new();
        for f in OPERATION_HEADS {
            if let Some(b) = read_at(admin.as_fd(), f, owner)? {
                under_way.extend(
                    String::from_utf8_lossy(&b)
                        .split_whitespace()
                        .filter_map(|w| git2::Oid::from_str(w).ok()),
                );
            }
        }
        let (gitdir, key2, head2) = (at.gitdir.to_path_buf(), key.to_string(), head.clone());
        let lines = as_owner_of(at.gitdir, move || -> GitResult<String> {
            let repo = git2::Repository::open_bare(&gitdir)?;
            let mut lines = String::new();
            let mut reached: Vec<git2::Oid> = head_commit(&repo, &head2).into_iter().collect();
            for b in branches {
                let oid = repo.find_reference(&b).ok().and_then(|r| r.target());
                reached.extend(oid);
                let oid = oid.map_or("-".to_string(), |o| o.to_string());
                lines.push_str(&format!("{b} {oid}\n"));
            }
            reached.extend(under_way);
            super::checkpoint_refs::keep(&repo, &key2, n, &reached)?;
            Ok(lines)
        })?;
        crate::durable::write_file_synced(&daemon_dir.join(BRANCHES), lines.as_bytes())?;
        write_at(to.as_fd(), OsStr::new(COMPLETE), b"", owner)?;
        Ok(())
    })()
    .with_context(|| what)
}

/// The branches checkpoint `n` (its daemon directory `daemon_dir`) recorded.
pub fn branches_of(daemon_dir: &Path) -> Vec<String> {
    std::fs::read_to_string(daemon_dir.join(BRANCHES))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(b, _)| b.to_string()))
        .collect()
}

/// Puts checkpoint `n`'s git state back: the files of the admin entry (those it did not
/// have removed), the index, and the branches it recorded at their commits then;
/// `HEAD`'s reflog and each branch's get a line saying so.
pub fn restore(at: &Place, daemon_dir: &Path, n: u64) -> GitResult<()> {
    let what = format!(
        "putting back git's state of worktree entry {} at checkpoint {n}",
        at.admin_name
    );
    (|| -> GitResult<()> {
        let admin = at.admin()?;
        let st = beneath::fstat(admin.as_fd())?;
        let owner = (st.st_uid, st.st_gid);
        let from = at.state_of(admin.as_fd(), n)?;
        if beneath::stat_at(from.as_fd(), OsStr::new(COMPLETE)).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("git's state of checkpoint {n} is not complete"),
            )
            .into());
        }
        let before =
            String::from_utf8_lossy(&read_at(admin.as_fd(), "HEAD", owner)?.unwrap_or_default())
                .into_owned();
        for f in FILES {
            match read_at(from.as_fd(), f, owner)? {
                Some(b) => write_at(admin.as_fd(), OsStr::new(f), &b, owner)?,
                None => match beneath::unlink_at(admin.as_fd(), OsStr::new(f), false) {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e.into()),
                    _ => {}
                },
            }
        }
        let index = OsStr::new(INDEX);
        if beneath::stat_at(from.as_fd(), index).is_ok() {
            let tmp = OsString::from(format!(".worktreefs-{}-index", std::process::id()));
            let _ = beneath::unlink_at(admin.as_fd(), &tmp, false);
            beneath::link_at(from.as_fd(), index, admin.as_fd(), &tmp)?;
            beneath::rename_at(admin.as_fd(), &tmp, admin.as_fd(), index, 0)?;
        } else {
            match beneath::unlink_at(admin.as_fd(), index, false) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e.into()),
                _ => {}
            }
        }
        for d in DIRS {
            beneath::remove_tree(admin.as_fd(), OsStr::new(d))?;
            if beneath::stat_at(from.as_fd(), OsStr::new(d)).is_ok() {
                copy_dir(from.as_fd(), admin.as_fd(), OsStr::new(d), owner)?;
            }
        }
        let after =
            String::from_utf8_lossy(&read_at(admin.as_fd(), "HEAD", owner)?.unwrap_or_default())
                .into_owned();
        let message = format!("worktreefs: rewind to checkpoint {n}");
        let branches = std::fs::read_to_string(daemon_dir.join(BRANCHES)).unwrap_or_default();
        let gitdir = at.gitdir.to_path_buf();
        let message2 = message.clone();
        let this_entry = at.admin_name.to_string();
        let (old, new) = as_owner_of(at.gitdir, move || -> GitResult<_> {
            let repo = git2::Repository::open_bare(&gitdir)?;
            let old = head_commit(&repo, &before);
            // A branch another worktree has checked out is its: never moved from here.
            let elsewhere: Vec<String> = super::admin::checked_out_branches(&repo)
                .into_iter()
                .filter(|(holder, _)| *holder != this_entry)
                .map(|(_, r)| r)
                .collect();
            for line in branches.lines() {
                let Some((name, oid)) = line.split_once(' ') else {
                    continue;
                };
                if !name.starts_with("refs/heads/") || !git2::Reference::is_valid_name(name) {
                    continue;
                }
                if elsewhere.iter().any(|r| r == name) {
                    tracing::warn!("{name} is checked out in another worktree: not moved back");
                    continue;
                }
                match git2::Oid::from_str(oid) {
                    Ok(oid) => {
                        super::checkpoint_refs::waiting_for_locks(&repo, name, |repo| {
                            repo.reference(name, oid, true, &message2).map(|_| ())
                        })?;
                    }
                    Err(_) => {
                        // Unborn then: the branch goes (its reflog with it, as git's).
                        // While it names what it was read to name (a commit made
                        // meanwhile keeps it).
                        if let Ok(r) = repo.find_reference(name) {
                            super::ref_delete::delete_ref(&gitdir, name, r.target())?;
                        }
                    }
                }
            }
            Ok((old, head_commit(&repo, &after)))
        })?;
        append_head_log(admin.as_fd(), old, new, &message, owner)?;
        Ok(())
    })()
    .with_context(|| what)
}

/// A line in the worktree's `HEAD` reflog, as git writes one.
fn append_head_log(
    admin: BorrowedFd,
    old: Option<git2::Oid>,
    new: Option<git2::Oid>,
    message: &str,
    owner: (u32, u32),
) -> io::Result<()> {
    use std::io::Write;
    let zero = git2::Oid::zero();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let line = format!(
        "{} {} worktreefs <worktreefs@localhost> {now} +0000\t{message}\n",
        old.unwrap_or(zero),
        new.unwrap_or(zero)
    );
    match beneath::mkdir_at(admin, OsStr::new("logs"), 0o755) {
        Ok(()) => own(
            beneath::reopen(
                beneath::dir(admin, b"logs")?.as_fd(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )?
            .as_fd(),
            owner,
        )?,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    // An existing log is written only when it is a plain file of the owner's (opened
    // without blocking: a FIFO there holds nobody); a new one is made and given to him.
    let not_written = |why: &str| {
        tracing::warn!("the HEAD reflog of a worktree entry {why}: no line written");
        Ok(())
    };
    let fd = match beneath::open(
        admin,
        b"logs/HEAD",
        libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK,
        0,
    ) {
        Ok(fd) => {
            let st = beneath::fstat(fd.as_fd())?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG
                || st.st_uid != owner.0
                || st.st_nlink != 1
            {
                return not_written("is not a plain file of its owner's");
            }
            fd
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let fd = beneath::open(
                admin,
                b"logs/HEAD",
                libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL,
                0o644,
            )?;
            own(fd.as_fd(), owner)?;
            fd
        }
        Err(_) => return not_written("cannot be opened as a file"),
    };
    std::fs::File::from(fd).write_all(line.as_bytes())
}

/// Removes checkpoint `n`'s git state. Its ref is not this one's to move: the caller
/// retires it (`checkpoint_refs::retire`), for the removal period.
pub fn drop(at: &Place, n: u64) -> GitResult<()> {
    let admin = at.admin()?;
    let all = match beneath::dir(admin.as_fd(), DIR.as_bytes()) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    beneath::remove_tree(all.as_fd(), &n_name(n))?;
    Ok(())
}

/// Where `place`'s admin entry is, for messages.
pub fn admin_path(gitdir: &Path, admin_name: &str) -> PathBuf {
    super::admin::admin_dir(gitdir, admin_name)
}
