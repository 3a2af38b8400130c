//! Acting on a repository's files as its owner: the repository is its owner's to make
//! anything, and root that writes there through libgit2 follows whatever links its
//! owner made.

use std::path::Path;

use super::error::{GitContext, GitError, GitErrorKind, GitResult};

/// The registered git directory `gitdir` (recorded as its real path), opened through no
/// symbolic link: its owner may have replaced `.git`, or a directory above it, with a
/// link to another user's repository, whose files root would then write, and as whose
/// owner.
pub(crate) fn pinned(gitdir: &Path) -> GitResult<std::os::fd::OwnedFd> {
    crate::beneath::open_real_dir(gitdir).map_err(|e| {
        GitError::from(e)
            .context(format!(
                "the git directory {} cannot be reached through no symbolic link (a component of it was replaced by one?); register the repository again with `worktreefs repo add`",
                gitdir.display()
            ))
            .with_kind(GitErrorKind::Unreachable)
    })
}

/// How long reading and writing a repository's config may take (a FIFO there blocks).
const CONFIG_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `f` on a thread of its own whose file-system identity (`setfsuid`, `setfsgid`:
/// the calling thread's alone) is the owner of the directory `gitdir`, bounded by
/// `CONFIG_LIMIT`. The repository's config is its owner's to make anything, and libgit2
/// writes it through a symlink (its lock file and rename follow one): as root, that
/// replaced whatever file the link named. As the owner, it can reach only what the
/// owner can (the kernel drops a thread's file capabilities when its fsuid leaves 0).
/// A thread still blocked at the limit is left to end by itself. `f`'s error is the
/// caller's; this one's own failures become it.
pub(crate) fn as_owner_of<T, E>(
    gitdir: &Path,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<GitError> + Send + 'static,
{
    let owner = crate::beneath::fstat(std::os::fd::AsFd::as_fd(&pinned(gitdir)?))
        .with_context(|| format!("reading the owner of {}", gitdir.display()))?;
    let (uid, gid) = (owner.st_uid, owner.st_gid);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("as-repo-owner".into())
        .spawn(move || {
            let became = become_identity(uid, gid, &[gid]);
            let r = if became || nix::unistd::geteuid().as_raw() != 0 {
                f()
            } else {
                Err(GitError::new(
                    GitErrorKind::Failed,
                    format!("could not take the identity {uid}:{gid}"),
                )
                .into())
            };
            let _ = tx.send(r);
        })
        .map_err(GitError::from)?;
    match rx.recv_timeout(CONFIG_LIMIT) {
        Ok(r) => r,
        Err(_) => Err(GitError::new(
            GitErrorKind::Unreachable,
            format!(
                "the files of {} were not read or written within {} s (a FIFO or a file of a filesystem that hangs?)",
                gitdir.display(),
                CONFIG_LIMIT.as_secs()
            ),
        )
        .into()),
    }
}

/// Gives the calling thread the file-system identity `uid`:`gid` with supplementary
/// groups `groups` (`setfsuid`, `setfsgid` and the raw `setgroups` call: this thread's
/// alone); whether it took (read back). Without root the thread keeps its own identity.
pub(crate) fn become_identity(uid: u32, gid: u32, groups: &[u32]) -> bool {
    // SAFETY: plain syscalls on this thread's own credentials; they cannot fail in a way
    // that matters: checked by reading the value back. The groups are set by the raw
    // system call, which changes this thread's alone (the libc wrapper changes every
    // thread's): root's supplementary groups would let the identity reach files only
    // root's groups may.
    unsafe {
        // The 32-bit group ids' call where the plain one takes 16-bit ones.
        #[cfg(any(target_arch = "x86", target_arch = "arm"))]
        let call = libc::SYS_setgroups32;
        #[cfg(not(any(target_arch = "x86", target_arch = "arm")))]
        let call = libc::SYS_setgroups;
        let grouped = nix::unistd::geteuid().as_raw() != 0
            || libc::syscall(call, groups.len(), groups.as_ptr()) == 0;
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        grouped && libc::setfsgid(u32::MAX) as u32 == gid && libc::setfsuid(u32::MAX) as u32 == uid
    }
}
