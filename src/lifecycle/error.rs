//! The lifecycle's error for what is not a refusal of its own (`CreateError`,
//! `RequestError`, `TurnError` say those): a [`Failure`] whose kind says which part
//! failed, with the words of what was being done and the cause beneath.

use crate::failure::Failure;
use crate::git::GitError;
use crate::store::StoreError;

/// Which part of a lifecycle step failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifecycleErrorKind {
    /// Reading or writing the store.
    Store,
    /// The repository (libgit2, or git run as its owner).
    Git,
    /// The file system.
    Io,
    /// Something found is not what the step may act on (an entry not this worktree's, a
    /// kept copy being restored right now, a repository that names nothing to inherit):
    /// left alone.
    Refused,
    /// Anything else (a thread that ended, a record that does not read back).
    Failed,
}

/// A failure of a lifecycle step.
pub type LifecycleError = Failure<LifecycleErrorKind>;

crate::failure::context_trait!(
    /// `context` and `with_context` on results whose error becomes a [`LifecycleError`].
    pub Context,
    LifecycleErrorKind
);

/// What the lifecycle's steps return.
pub type LifecycleResult<T> = std::result::Result<T, LifecycleError>;

/// A failure in the lifecycle's own words.
pub(crate) fn failed(message: impl Into<String>) -> LifecycleError {
    Failure::new(LifecycleErrorKind::Failed, message)
}

/// A refusal to act on what was found, in the lifecycle's own words.
pub(crate) fn refused(message: impl Into<String>) -> LifecycleError {
    Failure::new(LifecycleErrorKind::Refused, message)
}

impl From<std::io::Error> for LifecycleError {
    fn from(e: std::io::Error) -> Self {
        Failure::caused(LifecycleErrorKind::Io, e)
    }
}

impl From<git2::Error> for LifecycleError {
    fn from(e: git2::Error) -> Self {
        Failure::caused(LifecycleErrorKind::Git, e)
    }
}

impl From<StoreError> for LifecycleError {
    fn from(e: StoreError) -> Self {
        Failure::caused(LifecycleErrorKind::Store, e)
    }
}

impl From<nix::Error> for LifecycleError {
    fn from(e: nix::Error) -> Self {
        Failure::caused(LifecycleErrorKind::Io, e)
    }
}

/// A record of the lifecycle's own (a submodule's) that does not read or write.
impl From<serde_json::Error> for LifecycleError {
    fn from(e: serde_json::Error) -> Self {
        Failure::caused(LifecycleErrorKind::Failed, e)
    }
}

impl From<GitError> for LifecycleError {
    fn from(e: GitError) -> Self {
        Failure::within(LifecycleErrorKind::Git, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_beneath_gives_its_kind_and_keeps_its_words() {
        let io: LifecycleError = std::io::Error::from_raw_os_error(libc::ENOSPC).into();
        assert_eq!(io.kind(), LifecycleErrorKind::Io);
        assert_eq!(io.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        let git: GitError = Failure::new(crate::git::GitErrorKind::NotFound, "no such ref")
            .context("resolving HEAD");
        let e: LifecycleError = git.into();
        assert_eq!(e.kind(), LifecycleErrorKind::Git);
        assert_eq!(format!("{e:#}"), "resolving HEAD: no such ref");
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("x"));
        let e: LifecycleError = r.context("moving the copy").unwrap_err();
        assert_eq!(e.kind(), LifecycleErrorKind::Io);
        assert_eq!(format!("{e:#}"), "moving the copy: x");
    }
}
