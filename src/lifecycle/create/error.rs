//! What a creation (new, fork, restore) fails with, and the failures of its steps turned
//! into it: a full disk said as such, a busy database as busy, the rest internal.

use crate::git::GitError;
use crate::store::{ErrorKind, StoreError};
use std::fmt;

#[derive(Debug)]
pub enum CreateError {
    InvalidName(String),
    UnknownRepo(String),
    Exists(String),
    BadRevision(String),
    BranchConflict(String),
    /// Nothing kept to restore: what was asked for and where to look.
    NotKept(String),
    /// The worktree named (to fork) does not exist.
    NoWorktree(String),
    /// The worktree named is in a state that does not allow it (forking one that is
    /// deleting or removed): its state and the way out.
    Conflict(String),
    /// The user may not read what the request needs.
    Denied(String),
    /// The disk (the state dir's or the repository's) is full or over quota: the message
    /// and the errno (ENOSPC or EDQUOT).
    NoSpace(String, i32),
    /// Another process holds the database: try again.
    Busy(String),
    Internal(String),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidName(m)
            | CreateError::UnknownRepo(m)
            | CreateError::Exists(m)
            | CreateError::BadRevision(m)
            | CreateError::BranchConflict(m)
            | CreateError::NotKept(m)
            | CreateError::NoWorktree(m)
            | CreateError::Conflict(m)
            | CreateError::Denied(m)
            | CreateError::NoSpace(m, _)
            | CreateError::Busy(m)
            | CreateError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CreateError {}

/// A file system failure of a step: out of space is said as such (ENOSPC through the
/// mount), anything else is internal.
pub(crate) fn io_failure(context: &str) -> impl Fn(std::io::Error) -> CreateError + '_ {
    move |e| {
        if crate::git::blobcache::is_out_of_space(&e) {
            CreateError::NoSpace(
                format!("{context}: {e}; free some space and try again"),
                e.raw_os_error().unwrap_or(libc::ENOSPC),
            )
        } else {
            CreateError::Internal(format!("{context}: {e}"))
        }
    }
}

/// A failure of the git layer, judged as `io_failure` judges the file system's failure
/// at its bottom.
pub(crate) fn git_failure(context: &str) -> impl Fn(GitError) -> CreateError + '_ {
    move |e| {
        let full = e
            .io_error()
            .filter(|io| crate::git::blobcache::is_out_of_space(io))
            .and_then(|io| io.raw_os_error());
        match full {
            Some(errno) => CreateError::NoSpace(
                format!("{context}: {e:#}; free some space and try again"),
                errno,
            ),
            None => CreateError::Internal(format!("{context}: {e:#}")),
        }
    }
}

/// A store failure: a full disk is said as such.
pub(crate) fn db_failure(context: &str) -> impl Fn(StoreError) -> CreateError + '_ {
    move |e| match e.kind() {
        ErrorKind::DiskFull => CreateError::NoSpace(
            format!("{context}: {e}; free some space and try again"),
            libc::ENOSPC,
        ),
        ErrorKind::Busy => CreateError::Busy(format!(
            "{context}: another process holds the database ({e}); try again in a moment"
        )),
        _ => CreateError::Internal(format!("{context}: {e}")),
    }
}

pub(crate) fn internal(context: &str) -> impl Fn(String) -> CreateError + '_ {
    move |e| CreateError::Internal(format!("{context}: {e}"))
}
