//! The snapshot cache's layout under the state directory (blobs by id, manifests, the
//! journal of a take in progress) and the lock takes and prunes share.

use std::fs;
use std::io;
use std::path::PathBuf;

use git2::Oid;

use crate::state::StateDir;
use crate::store::WarmRow;

/// The lock over taking and pruning, in `<state>/warm/`.
pub(super) const LOCK_FILE: &str = ".lock";

/// The suffix of a take's journal: the contents it put in the blob cache.
pub(super) const JOURNAL: &str = ".taking";

/// [`LOCK_FILE`], held (`flock`) while this lives.
pub(super) struct WarmLock(#[allow(dead_code)] fs::File);

/// Takes the lock `how` (`LOCK_SH`, `LOCK_EX`, with `LOCK_NB` or not): none when it is
/// held elsewhere and `LOCK_NB` says not to wait.
pub(super) fn lock(state: &StateDir, how: i32) -> io::Result<Option<WarmLock>> {
    use std::os::fd::AsRawFd;
    fs::create_dir_all(state.warm())?;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state.warm().join(LOCK_FILE))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), how) } == 0 {
        return Ok(Some(WarmLock(f)));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// The blob cache's file of content `oid` (`git::blobcache`'s name).
pub(super) fn blob_path(state: &StateDir, oid: Oid) -> PathBuf {
    crate::git::blobcache::path_in(&state.blobs(), oid)
}

/// The path of a snapshot's manifest.
pub fn manifest_path(state: &StateDir, w: &WarmRow) -> PathBuf {
    state.warm().join(&w.manifest)
}

/// Its list of directories that hold entries (NUL-separated paths; "" the top).
pub(super) fn dirs_path(state: &StateDir, manifest: &str) -> PathBuf {
    state.warm().join(format!("{manifest}.dirs"))
}

/// What it knew of each file it read (`idents.rs`).
pub(super) fn idents_path(state: &StateDir, manifest: &str) -> PathBuf {
    state.warm().join(format!("{manifest}.ident"))
}

/// Paths by component: `a/b` before `a-c` (a directory's entries right after it).
pub(super) fn path_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|c| *c == b'/').cmp(b.split(|c| *c == b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sort_parents_first() {
        let mut v: Vec<&[u8]> = vec![b"a-c", b"a/b", b"a", b"a/b/c", b"B"];
        v.sort_by(|a, b| path_order(a, b));
        assert_eq!(v, vec![&b"B"[..], b"a", b"a/b", b"a/b/c", b"a-c"]);
    }
}
