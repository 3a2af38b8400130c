//! The git layer's error: which kind of failure it was, the words that say what was being
//! done, and the failure beneath (libgit2's, the file system's). Its chain prints as
//! `what: what beneath: cause`, the way the callers log and show it.

use std::error::Error as StdError;
use std::fmt;

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

type Cause = Box<dyn StdError + Send + Sync + 'static>;

enum Said {
    /// Another library's error, shown as it is.
    Cause(Cause),
    /// Words of the git layer's own.
    Message(String),
    /// What was being done, and the failure beneath it.
    Context(String, Box<GitError>),
}

/// A failure of the git layer.
pub struct GitError {
    kind: GitErrorKind,
    said: Said,
}

/// What the git layer returns.
pub type GitResult<T> = std::result::Result<T, GitError>;

impl GitError {
    /// A failure in the git layer's own words.
    pub fn new(kind: GitErrorKind, message: impl Into<String>) -> GitError {
        GitError {
            kind,
            said: Said::Message(message.into()),
        }
    }

    pub fn kind(&self) -> GitErrorKind {
        self.kind
    }

    /// This failure beneath `what` (what was being done), of the same kind.
    pub fn context(self, what: impl fmt::Display) -> GitError {
        GitError {
            kind: self.kind,
            said: Said::Context(what.to_string(), Box::new(self)),
        }
    }

    /// This failure as the kind `kind`.
    pub fn with_kind(mut self, kind: GitErrorKind) -> GitError {
        self.kind = kind;
        self
    }

    /// The file system's failure at the bottom of the chain, if that is what it was (a
    /// full disk is said as such).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match &self.said {
            Said::Cause(c) => c.downcast_ref::<std::io::Error>(),
            Said::Message(_) => None,
            Said::Context(_, inner) => inner.io_error(),
        }
    }

    fn caused(kind: GitErrorKind, cause: Cause) -> GitError {
        GitError {
            kind,
            said: Said::Cause(cause),
        }
    }
}

impl From<git2::Error> for GitError {
    fn from(e: git2::Error) -> Self {
        GitError::caused(GitErrorKind::Failed, Box::new(e))
    }
}

impl From<std::io::Error> for GitError {
    fn from(e: std::io::Error) -> Self {
        GitError::caused(GitErrorKind::Failed, Box::new(e))
    }
}

impl fmt::Display for GitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.said {
            Said::Cause(c) => c.fmt(f)?,
            Said::Message(m) | Said::Context(m, _) => f.write_str(m)?,
        }
        // `{:#}`: the whole chain, as anyhow shows one.
        if f.alternate() {
            let mut next = self.source();
            while let Some(c) = next {
                write!(f, ": {c}")?;
                next = c.source();
            }
        }
        Ok(())
    }
}

impl fmt::Debug for GitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GitError({:?}: {self}", self.kind)?;
        let mut next = self.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        f.write_str(")")
    }
}

impl StdError for GitError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.said {
            Said::Cause(c) => c.source(),
            Said::Message(_) => None,
            // A cause beneath is its own link (as a person reads it, and for whoever
            // looks for an `io::Error` in the chain).
            Said::Context(_, inner) => match &inner.said {
                Said::Cause(c) => Some(c.as_ref()),
                _ => Some(inner.as_ref()),
            },
        }
    }
}

/// `context` and `with_context` on results whose error becomes a [`GitError`].
pub trait GitContext<T> {
    fn context(self, what: impl fmt::Display) -> GitResult<T>;
    fn with_context<W: fmt::Display>(self, what: impl FnOnce() -> W) -> GitResult<T>;
}

impl<T, E: Into<GitError>> GitContext<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> GitResult<T> {
        self.map_err(|e| e.into().context(what))
    }

    fn with_context<W: fmt::Display>(self, what: impl FnOnce() -> W) -> GitResult<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How the callers show a failure: each link of the chain, as anyhow's `{:#}` does.
    fn chain(e: &GitError) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(c) = next {
            out.push_str(": ");
            out.push_str(&c.to_string());
            next = c.source();
        }
        assert_eq!(format!("{e:#}"), out, "`{{:#}}` is the chain");
        out
    }

    #[test]
    fn the_chain_reads_outermost_first_and_keeps_the_kind() {
        let make = || {
            GitError::from(std::io::Error::from_raw_os_error(libc::ENOSPC))
                .context("writing the index")
                .context("making the entry")
                .with_kind(GitErrorKind::EntryNotMade)
        };
        let e = make();
        // Through anyhow (the daemon's and the command line's), the same words.
        assert_eq!(format!("{:#}", anyhow::Error::from(make())), chain(&e));
        assert_eq!(e.kind(), GitErrorKind::EntryNotMade);
        assert_eq!(e.to_string(), "making the entry");
        assert_eq!(
            chain(&e),
            format!(
                "making the entry: writing the index: {}",
                std::io::Error::from_raw_os_error(libc::ENOSPC)
            )
        );
        // The io::Error is still found in the chain (a full disk is said as such).
        let mut next: Option<&(dyn StdError + 'static)> = Some(&e);
        let mut found = false;
        while let Some(c) = next {
            found |= c.downcast_ref::<std::io::Error>().is_some();
            next = c.source();
        }
        assert!(found);
        assert_eq!(e.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        let bare = GitError::from(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(bare.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        assert!(GitError::new(GitErrorKind::NotFound, "no")
            .io_error()
            .is_none());
    }

    #[test]
    fn a_library_error_shows_as_itself() {
        let g = git2::Error::from_str("no such ref");
        let e: GitError = g.into();
        assert_eq!(e.kind(), GitErrorKind::Failed);
        assert_eq!(
            e.to_string(),
            git2::Error::from_str("no such ref").to_string()
        );
        let r: Result<(), git2::Error> = Err(git2::Error::from_str("x"));
        let e = r.with_context(|| "reading HEAD").unwrap_err();
        assert_eq!(e.to_string(), "reading HEAD");
    }
}
