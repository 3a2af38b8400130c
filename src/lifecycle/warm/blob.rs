//! A file's content copied into the blob cache under its blob id, kept only when the file
//! did not change while it was copied.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;

use git2::Oid;

use crate::beneath::{self, Stat};
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::state::StateDir;

use super::cache::blob_path;
use super::journal::Journal;

/// Copies `src` (whose stat was `st`) into the blob cache: its blob id, or none when it
/// changed while it was copied. A content not yet in the cache is written down in
/// `journal` before it is placed.
pub(super) fn store_blob(
    state: &StateDir,
    journal: &mut Journal,
    src: &fs::File,
    st: &Stat,
) -> LifecycleResult<Option<Oid>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = state
        .blobs_tmp()
        .join(format!("warm-{}-{n}", std::process::id()));
    let result = (|| -> LifecycleResult<Option<Oid>> {
        let dst = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        crate::filecopy::clone_or_copy(src, &dst)
            .with_context(|| format!("copying into {}", tmp.display()))?;
        #[cfg(test)]
        DURING_COPY.with(|h| {
            if let Some(h) = h.borrow_mut().as_mut() {
                h()
            }
        });
        let after = beneath::fstat(src.as_fd())?;
        if !same(st, &after) {
            return Ok(None);
        }
        dst.sync_all()?;
        drop(dst);
        let oid = Oid::hash_file(git2::ObjectType::Blob, &tmp).map_err(|e| {
            crate::lifecycle::error::failed(format!("hashing {}: {}", tmp.display(), e.message()))
        })?;
        let path = blob_path(state, oid);
        let present =
            fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == st.st_size as u64);
        if !present {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o400))?;
            journal.note(oid)?;
            fs::rename(&tmp, &path).with_context(|| format!("placing {}", path.display()))?;
        }
        Ok(Some(oid))
    })();
    let _ = fs::remove_file(&tmp);
    result
}

/// Whether the stat data `a` and `b` say the same content (inode, size, modification and
/// change times).
fn same(a: &Stat, b: &Stat) -> bool {
    (
        a.st_ino,
        a.st_size,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_ino,
        b.st_size,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

#[cfg(test)]
thread_local! {
    /// Runs between a content's copy and the look at its file after it (set by tests).
    pub(super) static DURING_COPY: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
        const { std::cell::RefCell::new(None) };
}
