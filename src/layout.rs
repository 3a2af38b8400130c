//! The upper layer's on-disk format, shared by the filesystem (`fs/`) and cleanup.
//!
//! * A file, symlink or directory present in the upper layer wins over the base.
//! * A whiteout for name `N` is an empty regular file `.wtfs-wh.N` in the same upper
//!   directory; it hides the base entry `N`. An upper entry `N` next to a whiteout for
//!   `N` still wins (that is how a crash between the two steps of a change resolves).
//! * An opaque directory holds an empty file `.wtfs-opaque`: nothing of the base below it
//!   shows through.
//! * Names starting with `.wtfs-` are reserved in the view (EINVAL on create).

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub const RESERVED_PREFIX: &[u8] = b".wtfs-";
pub const WHITEOUT_PREFIX: &str = ".wtfs-wh.";
pub const OPAQUE_MARKER: &str = ".wtfs-opaque";
pub fn whiteout_name(name: &OsStr) -> OsString {
    let mut s = OsString::from(WHITEOUT_PREFIX);
    s.push(name);
    s
}

/// Creates an empty marker file (whiteout or opaque). `ordered`: a later step removes or
/// moves an upper entry and must not reach the disk before this marker does, so the
/// marker is synced first. A marker with nothing after it is as durable as any other
/// unlink: until the next sync, like the filesystem underneath.
pub fn write_marker(path: &Path, ordered: bool) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) if ordered => f.sync_all(),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}
