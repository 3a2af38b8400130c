//! One error type for the filesystem core: what went wrong (a kind), a message a person
//! can act on, and the source.
//!
//! Every error is built through a constructor that names its kind; the errno the kernel
//! is answered with and the level it is logged at come from the kind alone
//! ([`ErrorKind::errno`], [`ErrorKind::level`]), so there is one place to change either.
//! Domain errors (a creation refused, a lease conflict, a removal refused) are mapped to a
//! kind here too. Nothing becomes `EIO` without a kind that says why and a log line at
//! warn or error: a git, store or I/O error keeps its source.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::ino::Ino;
use crate::lease::Conflict;
use crate::lifecycle::cleanup::RequestError;
use crate::lifecycle::create::CreateError;
use crate::store::{LeaseError, StoreError};

/// What kind of failure an error is. Expected outcomes of what the caller asked come
/// first, then refusals of what this filesystem does not allow, then faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// No such entry (a lookup of a missing name, a worktree that is gone).
    NotFound,
    /// The name is taken.
    Exists,
    /// A directory that is not empty, or a worktree that holds work.
    NotEmpty,
    /// A directory was needed.
    NotDir,
    /// Not a directory was needed.
    IsDir,
    /// In use: a worktree leased, deleting, or with processes inside.
    Busy,
    /// The kernel named an inode this daemon no longer knows: it looks again.
    Stale,
    /// A rename or link between two parts of the mount that are isolated from each other
    /// (two worktrees, a worktree and `.control`), as between two filesystems.
    CrossDevice,
    /// A bad argument: a name, a flag, a query.
    Invalid,
    /// A name longer than the filesystem allows.
    NameTooLong,
    /// An operation this filesystem does not allow here (EPERM).
    NotPermitted,
    /// Writing where only reading is allowed (EACCES).
    Denied,
    /// A file handle that is not open, or not open for this.
    BadHandle,
    /// An operating-system error, with the errno the system call gave.
    Os(i32),
    /// Reading the object database failed.
    Git,
    /// Reading or writing the SQLite store failed.
    Store,
    /// Something this code relies on did not hold (an encoding failed, a node without the
    /// object it must have).
    Internal,
}

/// How loudly an error is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// An outcome the caller asked for and that is normal.
    Debug,
    /// A request refused for a reason the caller can act on.
    Info,
    /// A fault: the request failed for a reason of the system's.
    Warn,
    /// A fault that means this code is wrong.
    Error,
}

impl ErrorKind {
    /// The errno the kernel is answered with.
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Exists => libc::EEXIST,
            ErrorKind::NotEmpty => libc::ENOTEMPTY,
            ErrorKind::NotDir => libc::ENOTDIR,
            ErrorKind::IsDir => libc::EISDIR,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::Stale => libc::ESTALE,
            ErrorKind::CrossDevice => libc::EXDEV,
            ErrorKind::Invalid => libc::EINVAL,
            ErrorKind::NameTooLong => libc::ENAMETOOLONG,
            ErrorKind::NotPermitted => libc::EPERM,
            ErrorKind::Denied => libc::EACCES,
            ErrorKind::BadHandle => libc::EBADF,
            ErrorKind::Os(errno) => errno,
            ErrorKind::Git | ErrorKind::Store | ErrorKind::Internal => libc::EIO,
        }
    }

    /// The level the error is logged at.
    pub fn level(self) -> Level {
        match self {
            ErrorKind::NotFound
            | ErrorKind::Exists
            | ErrorKind::NotEmpty
            | ErrorKind::NotDir
            | ErrorKind::IsDir
            | ErrorKind::Stale
            | ErrorKind::CrossDevice => Level::Debug,
            ErrorKind::Busy
            | ErrorKind::Invalid
            | ErrorKind::NameTooLong
            | ErrorKind::NotPermitted
            | ErrorKind::Denied
            | ErrorKind::BadHandle => Level::Info,
            // ENXIO: an lseek to data or a hole past the end; EOPNOTSUPP: a fallocate mode
            // or a copy the upper filesystem lacks (the kernel then copies itself);
            // ENODATA, ERANGE: an attribute a file does not have, or a buffer too small
            // for it (the kernel asks `security.capability` of files written to).
            ErrorKind::Os(
                libc::ENOENT
                | libc::EEXIST
                | libc::ENOTEMPTY
                | libc::ENOTDIR
                | libc::EISDIR
                | libc::ENXIO
                | libc::EOPNOTSUPP
                | libc::ENODATA
                | libc::ERANGE,
            ) => Level::Debug,
            ErrorKind::Os(_) | ErrorKind::Git | ErrorKind::Store => Level::Warn,
            ErrorKind::Internal => Level::Error,
        }
    }
}

#[derive(Debug)]
pub struct FsError {
    pub kind: ErrorKind,
    pub message: String,
    /// For ENOENT from a lookup: how long the kernel may remember that the name is absent
    /// (a negative entry), when only requests through the kernel can create it.
    pub negative_ttl: Option<Duration>,
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        FsError {
            kind,
            message: message.into(),
            negative_ttl: None,
            source: None,
        }
    }

    fn with_source(
        kind: ErrorKind,
        message: String,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        FsError {
            source: Some(source.into()),
            ..FsError::new(kind, message)
        }
    }

    /// The errno the kernel is answered with.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    pub fn level(&self) -> Level {
        self.kind.level()
    }

    pub fn not_found(what: impl fmt::Display) -> Self {
        FsError::new(ErrorKind::NotFound, format!("{what}: no such entry"))
    }

    pub fn exists(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::Exists, message)
    }

    pub fn not_empty(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::NotEmpty, message)
    }

    pub fn not_dir() -> Self {
        FsError::new(ErrorKind::NotDir, "not a directory")
    }

    pub fn is_dir() -> Self {
        FsError::new(ErrorKind::IsDir, "is a directory")
    }

    pub fn busy(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::Busy, message)
    }

    /// An inode the kernel named that this daemon does not know (any more).
    pub fn stale(ino: Ino) -> Self {
        FsError::new(ErrorKind::Stale, format!("inode {ino} is not known"))
    }

    pub fn cross_device(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::CrossDevice, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::Invalid, message)
    }

    pub fn name_too_long(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::NameTooLong, message)
    }

    pub fn not_permitted(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::NotPermitted, message)
    }

    pub fn denied(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::Denied, message)
    }

    pub fn bad_handle(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::BadHandle, message)
    }

    /// Something this code relies on did not hold.
    pub fn internal(message: impl Into<String>) -> Self {
        FsError::new(ErrorKind::Internal, message)
    }

    /// An encoding or other library failure with no errno of its own (answered EIO).
    pub fn internal_from(
        context: impl fmt::Display,
        err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        let err = err.into();
        FsError::with_source(ErrorKind::Internal, format!("{context}: {err}"), err)
    }

    /// An io::Error with context. The errno is the OS code; an io::Error without one (from
    /// a library) is an internal fault (EIO), and the message says so.
    pub fn io(context: impl Into<String>, err: io::Error) -> Self {
        let kind = match err.raw_os_error() {
            Some(errno) => ErrorKind::Os(errno),
            None => ErrorKind::Internal,
        };
        FsError::with_source(kind, format!("{}: {err}", context.into()), err)
    }

    /// An I/O failure answered EIO whatever its errno (the only errno a read may give).
    pub fn eio(context: impl Into<String>, err: io::Error) -> Self {
        FsError::with_source(
            ErrorKind::Os(libc::EIO),
            format!("{}: {err}", context.into()),
            err,
        )
    }

    /// An errno from a system call made through nix.
    pub fn sys(context: impl Into<String>, err: nix::Error) -> Self {
        FsError::io(context, io::Error::from_raw_os_error(err as i32))
    }

    /// A failure to answer from the store, or to re-read it.
    pub fn store(context: impl Into<String>, err: StoreError) -> Self {
        // The whole chain, as a person reads it.
        let message = format!("{}: {err:#}", context.into());
        FsError::with_source(ErrorKind::Store, message, err)
    }

    pub fn git(context: impl Into<String>, err: git2::Error) -> Self {
        let message = format!("{}: git: {}", context.into(), err.message());
        FsError::with_source(ErrorKind::Git, message, err)
    }

    /// A worktree creation (mkdir) the lifecycle refused, or that failed.
    pub fn creation(context: impl fmt::Display, err: CreateError) -> Self {
        let kind = match &err {
            CreateError::InvalidName(_) | CreateError::BadRevision(_) => ErrorKind::Invalid,
            CreateError::UnknownRepo(_) | CreateError::NotKept(_) | CreateError::NoWorktree(_) => {
                ErrorKind::NotFound
            }
            CreateError::Exists(_) | CreateError::BranchConflict(_) => ErrorKind::Exists,
            CreateError::NoSpace(_, errno) => ErrorKind::Os(*errno),
            CreateError::Busy(_) | CreateError::Conflict(_) => ErrorKind::Busy,
            CreateError::Denied(_) => ErrorKind::Denied,
            CreateError::Internal(_) => ErrorKind::Internal,
        };
        FsError::with_source(kind, format!("{context}: {err}"), err)
    }

    /// A lease the lifecycle refused (docs/contract.md: EBUSY for deleting, ENOENT for removed).
    pub fn conflict(message: impl Into<String>, c: Conflict) -> Self {
        let kind = match c {
            Conflict::Deleting => ErrorKind::Busy,
            Conflict::Removed => ErrorKind::NotFound,
        };
        FsError::new(kind, message)
    }

    /// A lease that could not be taken: refused, or not recorded.
    pub fn lease(context: impl fmt::Display, err: LeaseError) -> Self {
        match err {
            LeaseError::Conflict(c, state) => {
                FsError::conflict(format!("{context}: the worktree is {state}"), c)
            }
            LeaseError::Occupied(o) => FsError::new(
                ErrorKind::Busy,
                format!("{context}: {} other holder(s) refuse it", o.len()),
            ),
            LeaseError::Db(e) => FsError::store(format!("{context}: recording the lease"), e),
        }
    }

    /// A removal (rmdir of a worktree) the lifecycle refused, or that failed. `label` is
    /// the worktree's `repo/name`.
    pub fn removal(label: &str, err: RequestError) -> Self {
        match err {
            RequestError::Busy(m) => FsError::busy(format!("rmdir {label}: {m}")),
            RequestError::HoldsWork(m) => FsError::not_empty(format!(
                "rmdir {label}: refused, it holds work: {m}; commit and push it, or throw it away with `worktreefs reclaim {label} --discard`"
            )),
            RequestError::Gone(m) => FsError::not_found(m),
            RequestError::Other(e) => FsError::with_source(
                ErrorKind::Internal,
                format!("rmdir {label}: {e:#}"),
                e,
            ),
        }
    }

    /// A removal that ran but could not finish: the worktree is retained with its files.
    pub fn removal_failed(label: &str, reason: &str) -> Self {
        FsError::new(
            ErrorKind::Internal,
            format!("rmdir {label}: removal failed, worktree retained with its files: {reason}"),
        )
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno())
    }
}

impl std::error::Error for FsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind: its errno and its level (one row each).
    #[test]
    fn each_kind_has_one_errno_and_one_level() {
        use ErrorKind::*;
        let rows = [
            (NotFound, libc::ENOENT, Level::Debug),
            (Exists, libc::EEXIST, Level::Debug),
            (NotEmpty, libc::ENOTEMPTY, Level::Debug),
            (NotDir, libc::ENOTDIR, Level::Debug),
            (IsDir, libc::EISDIR, Level::Debug),
            (Stale, libc::ESTALE, Level::Debug),
            (CrossDevice, libc::EXDEV, Level::Debug),
            (Busy, libc::EBUSY, Level::Info),
            (Invalid, libc::EINVAL, Level::Info),
            (NameTooLong, libc::ENAMETOOLONG, Level::Info),
            (NotPermitted, libc::EPERM, Level::Info),
            (Denied, libc::EACCES, Level::Info),
            (BadHandle, libc::EBADF, Level::Info),
            (Os(libc::ENOENT), libc::ENOENT, Level::Debug),
            (Os(libc::ENOTEMPTY), libc::ENOTEMPTY, Level::Debug),
            (Os(libc::ENOSPC), libc::ENOSPC, Level::Warn),
            (Os(libc::EIO), libc::EIO, Level::Warn),
            (Git, libc::EIO, Level::Warn),
            (Store, libc::EIO, Level::Warn),
            (Internal, libc::EIO, Level::Error),
        ];
        for (kind, errno, level) in rows {
            assert_eq!(kind.errno(), errno, "{kind:?}");
            assert_eq!(kind.level(), level, "{kind:?}");
        }
    }

    /// An EIO never comes without a level that logs it (warn or error).
    #[test]
    fn every_eio_is_logged_as_a_fault() {
        let eio = [
            FsError::io("read", io::Error::from_raw_os_error(libc::EIO)),
            FsError::io("a library's error", io::Error::other("no errno")),
            FsError::git("reading tree", git2::Error::from_str("corrupt")),
            FsError::store(
                "reading leases",
                crate::store::StoreError::for_test(crate::store::ErrorKind::Database),
            ),
            FsError::internal_from("encoding", "bad"),
            FsError::creation("mkdir r/w", CreateError::Internal("disk".into())),
            FsError::removal(
                "r/w",
                RequestError::Other(crate::lifecycle::error::failed("boom")),
            ),
            FsError::removal_failed("r/w", "parking failed"),
        ];
        for e in eio {
            assert_eq!(e.errno(), libc::EIO, "{e}");
            assert!(matches!(e.level(), Level::Warn | Level::Error), "{e}");
        }
    }

    /// Domain errors map as docs/contract.md says; the source is kept.
    #[test]
    fn domain_errors_map_to_their_errno() {
        use std::error::Error;
        assert_eq!(
            FsError::conflict("enter", Conflict::Deleting).errno(),
            libc::EBUSY
        );
        assert_eq!(
            FsError::conflict("enter", Conflict::Removed).errno(),
            libc::ENOENT
        );
        let rows = [
            (CreateError::InvalidName("n".into()), libc::EINVAL),
            (CreateError::BadRevision("r".into()), libc::EINVAL),
            (CreateError::UnknownRepo("r".into()), libc::ENOENT),
            (CreateError::Exists("w".into()), libc::EEXIST),
            (CreateError::BranchConflict("b".into()), libc::EEXIST),
            (CreateError::Internal("x".into()), libc::EIO),
        ];
        for (err, errno) in rows {
            let e = FsError::creation("mkdir r/w", err);
            assert_eq!(e.errno(), errno, "{e}");
            assert!(e.source().is_some(), "{e}");
        }
        let rows = [
            (RequestError::Busy("leased".into()), libc::EBUSY),
            (RequestError::HoldsWork("1 file".into()), libc::ENOTEMPTY),
            (RequestError::Gone("r/w".into()), libc::ENOENT),
        ];
        for (err, errno) in rows {
            assert_eq!(FsError::removal("r/w", err).errno(), errno);
        }
        let e = FsError::lease(
            "enter",
            LeaseError::Db(crate::store::StoreError::for_test(
                crate::store::ErrorKind::Database,
            )),
        );
        assert_eq!((e.errno(), e.kind), (libc::EIO, ErrorKind::Store));
        assert!(e.source().is_some());
    }
}
