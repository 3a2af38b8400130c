//! The git layer's error: a [`Failure`] whose kind says what it means to the caller,
//! with the words of what was being done and the cause beneath (libgit2's, the file
//! system's).

use crate::failure::Failure;

/// What a failure of the git layer means to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitErrorKind {
    /// A path is not a repository, or a revision does not resolve to a commit.
    NotFound,
    /// A worktree's admin entry was not made: nothing of it is there to undo.
    EntryNotMade,
    /// The repository's files could not be reached safely or in time (a component
    /// replaced by a symbolic link, a FIFO, a file system that hangs).
    Unreachable,
    /// libgit2 or the file system failed.
    Failed,
}

/// A failure of the git layer.
pub type GitError = Failure<GitErrorKind>;

crate::failure::context_trait!(
    /// `context` and `with_context` on results whose error becomes a [`GitError`].
    pub GitContext,
    GitErrorKind
);

/// What the git layer returns.
pub type GitResult<T> = std::result::Result<T, GitError>;

impl From<git2::Error> for GitError {
    fn from(e: git2::Error) -> Self {
        Failure::caused(GitErrorKind::Failed, e)
    }
}

impl From<std::io::Error> for GitError {
    fn from(e: std::io::Error) -> Self {
        Failure::caused(GitErrorKind::Failed, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_error_is_a_failure_of_the_layer() {
        let e: GitError = git2::Error::from_str("no such ref").into();
        assert_eq!(e.kind(), GitErrorKind::Failed);
        assert_eq!(
            e.to_string(),
            git2::Error::from_str("no such ref").to_string()
        );
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("x"));
        let e: GitError = r.with_context(|| "reading HEAD").unwrap_err();
        assert_eq!(format!("{e:#}"), "reading HEAD: x");
        assert_eq!(e.kind(), GitErrorKind::Failed);
    }
}
