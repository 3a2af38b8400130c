//! A failure as an errno answer, logged at its kind's level with the operation's name.

use crate::fs::error::{FsError, Level};
use crate::fuse::abi;
use crate::fuse::Answer;

/// The answer to a GETXATTR or LISTXATTR.
pub(super) fn xattr_answer(op: &str, r: Result<crate::fs::xattr::Xattr, FsError>) -> Answer {
    match r {
        Ok(crate::fs::xattr::Xattr::Size(size)) => {
            Answer::XattrSize(abi::GetxattrOut { size, padding: 0 })
        }
        Ok(crate::fs::xattr::Xattr::Data(d)) => Answer::Data(d),
        Err(e) => errno(op, e),
    }
}

/// The answer to a failed request, logged at its kind's level.
pub(super) fn errno(op: &str, e: FsError) -> Answer {
    Answer::Error(logged(op, e))
}

/// The errno of a failed request, logged at its kind's level.
pub(super) fn logged(op: &str, e: FsError) -> i32 {
    let errno = e.errno();
    match e.level() {
        Level::Debug => tracing::debug!(op, errno, "{}", e.message),
        Level::Info => tracing::info!(op, errno, "{}", e.message),
        Level::Warn => tracing::warn!(op, errno, "{}", e.message),
        Level::Error => tracing::error!(op, errno, "{}", e.message),
    }
    errno
}
