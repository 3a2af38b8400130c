//! One error type for the core: an errno, a message a person can act on, and the source.
//!
//! Every error that reaches the FUSE adapter carries an explicit errno; nothing becomes
//! `EIO` silently. `expected` errors (a lookup of a name that does not exist) are logged
//! at debug, everything else at warn.

use std::fmt;
use std::io;

#[derive(Debug)]
pub struct FsError {
    pub errno: i32,
    pub message: String,
    pub expected: bool,
    /// For ENOENT from a lookup: how long the kernel may remember that the name is absent
    /// (a negative entry), when only requests through the kernel can create it.
    pub negative_ttl: Option<std::time::Duration>,
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        FsError {
            errno,
            message: message.into(),
            expected: false,
            negative_ttl: None,
            source: None,
        }
    }

    /// An outcome the caller asked for and that is normal (ENOENT on lookup, EEXIST, …).
    pub fn expected(errno: i32, message: impl Into<String>) -> Self {
        FsError {
            expected: true,
            ..FsError::new(errno, message)
        }
    }

    pub fn not_found(what: impl fmt::Display) -> Self {
        FsError::expected(libc::ENOENT, format!("{what}: no such entry"))
    }

    /// An io::Error with context. The errno is taken from the OS code; an io::Error without
    /// one (from a library) becomes EIO, and the message says so.
    pub fn io(context: impl Into<String>, err: io::Error) -> Self {
        let errno = err.raw_os_error().unwrap_or(libc::EIO);
        let expected = matches!(
            errno,
            libc::ENOENT | libc::EEXIST | libc::ENOTEMPTY | libc::ENOTDIR | libc::EISDIR
        );
        FsError {
            errno,
            message: format!("{}: {err}", context.into()),
            expected,
            negative_ttl: None,
            source: Some(Box::new(err)),
        }
    }

    pub fn git(context: impl Into<String>, err: git2::Error) -> Self {
        FsError {
            errno: libc::EIO,
            message: format!("{}: git: {}", context.into(), err.message()),
            expected: false,
            negative_ttl: None,
            source: Some(Box::new(err)),
        }
    }

    pub fn store(context: impl Into<String>, err: rusqlite::Error) -> Self {
        FsError {
            errno: libc::EIO,
            message: format!("{}: sqlite: {err}", context.into()),
            expected: false,
            negative_ttl: None,
            source: Some(Box::new(err)),
        }
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for FsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
    }
}

impl From<nix::Error> for FsError {
    fn from(e: nix::Error) -> Self {
        FsError::io("system call", io::Error::from_raw_os_error(e as i32))
    }
}
