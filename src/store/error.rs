//! The store's error: which kind of failure it was (a name taken, another connection's
//! lock, a full disk, no such row, the disk or file failing, anything else), with SQLite's
//! own words kept for the message. Callers decide on the kind; nothing outside `store/`
//! names the database library.

use std::fmt;

/// What a store failure means to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A constraint refused the row: the name (or other unique key) is taken.
    Taken,
    /// Another connection holds the database (busy or locked): a matter of waiting.
    Busy,
    /// The disk holding the database is full.
    DiskFull,
    /// The row asked for is not there.
    NotFound,
    /// The file could not be read, written or opened (an I/O error, a read-only file).
    Io,
    /// Anything else the database said.
    Database,
}

/// A store failure: its kind and SQLite's own error.
#[derive(Debug)]
pub struct StoreError {
    kind: ErrorKind,
    source: rusqlite::Error,
}

/// What every store call returns.
pub type StoreResult<T> = std::result::Result<T, StoreError>;

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Another connection's lock: waiting may cure it.
    pub fn is_busy(&self) -> bool {
        self.kind == ErrorKind::Busy
    }

    /// A failure that waiting may cure: the database busy or locked, its disk full, an
    /// I/O error.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Busy | ErrorKind::DiskFull | ErrorKind::Io
        )
    }

    /// SQLite's result code, for the messages that name the file's trouble.
    pub(super) fn code(&self) -> Option<rusqlite::ErrorCode> {
        match &self.source {
            rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
            _ => None,
        }
    }

    /// An error of `kind`, for tests of the callers' handling.
    #[cfg(test)]
    pub(crate) fn for_test(kind: ErrorKind) -> StoreError {
        StoreError {
            kind,
            source: rusqlite::Error::InvalidQuery,
        }
    }
}

/// A database that could not be opened, said for a person: the file, why, and what to do.
#[derive(Debug)]
pub struct OpenError {
    kind: ErrorKind,
    message: String,
}

impl OpenError {
    pub(super) fn new(e: &StoreError, message: String) -> OpenError {
        OpenError {
            kind: e.kind,
            message,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpenError {}

fn kind_of(e: &rusqlite::Error) -> ErrorKind {
    use rusqlite::ErrorCode;
    match e {
        rusqlite::Error::QueryReturnedNoRows => ErrorKind::NotFound,
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::ConstraintViolation => ErrorKind::Taken,
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => ErrorKind::Busy,
            ErrorCode::DiskFull => ErrorKind::DiskFull,
            ErrorCode::SystemIoFailure | ErrorCode::CannotOpen | ErrorCode::ReadOnly => {
                ErrorKind::Io
            }
            _ => ErrorKind::Database,
        },
        _ => ErrorKind::Database,
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(source: rusqlite::Error) -> Self {
        StoreError {
            kind: kind_of(&source),
            source,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)?;
        // `{:#}`: the whole chain, as anyhow shows one.
        if f.alternate() {
            crate::failure::write_causes(f, self)?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32) -> StoreError {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None).into()
    }

    #[test]
    fn each_sqlite_failure_has_the_kind_its_callers_decide_on() {
        use rusqlite::ffi;
        assert_eq!(failure(ffi::SQLITE_CONSTRAINT).kind(), ErrorKind::Taken);
        assert_eq!(failure(ffi::SQLITE_BUSY).kind(), ErrorKind::Busy);
        assert_eq!(failure(ffi::SQLITE_LOCKED).kind(), ErrorKind::Busy);
        assert_eq!(failure(ffi::SQLITE_FULL).kind(), ErrorKind::DiskFull);
        assert_eq!(failure(ffi::SQLITE_IOERR).kind(), ErrorKind::Io);
        assert_eq!(failure(ffi::SQLITE_READONLY).kind(), ErrorKind::Io);
        assert_eq!(failure(ffi::SQLITE_CORRUPT).kind(), ErrorKind::Database);
        let none: StoreError = rusqlite::Error::QueryReturnedNoRows.into();
        assert_eq!(none.kind(), ErrorKind::NotFound);
        assert!(failure(ffi::SQLITE_BUSY).is_busy());
        assert!(failure(ffi::SQLITE_FULL).is_transient());
        assert!(!failure(ffi::SQLITE_CONSTRAINT).is_transient());
    }

    #[test]
    fn the_message_is_sqlites_own() {
        let e: StoreError = rusqlite::Error::QueryReturnedNoRows.into();
        assert_eq!(
            e.to_string(),
            rusqlite::Error::QueryReturnedNoRows.to_string()
        );
        // `{:#}` and anyhow's `{:#}` give the whole chain, as anyhow gave it of SQLite's.
        let make = || {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                None,
            )
        };
        let e: StoreError = make().into();
        let theirs = format!("{:#}", anyhow::Error::from(make()));
        assert_eq!(format!("{e:#}"), theirs);
        assert_eq!(format!("{:#}", anyhow::Error::from(e)), theirs);
    }
}
