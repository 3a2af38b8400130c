//! The shared content-addressed blob cache: `<state>/blobs/<2 hex>/<38 hex>`.
//!
//! Its files are the owner's only (0400, in the private state directory).
//!
//! A base file's content is materialized here the first time any worktree opens it, and
//! read from here afterwards by every worktree. A blob is written to `blobs/tmp`, then
//! renamed into place, so a reader never sees a partial file; a file whose size does not
//! match the object (a crash between write and rename on some filesystems) is rewritten.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use git2::Oid;
use parking_lot::Mutex;

use crate::git;

const STRIPES: usize = 64;

pub struct BlobCache {
    dir: PathBuf,
    tmp: PathBuf,
    /// One fill at a time per stripe of object ids: a blob is materialized at most once.
    fill_locks: Vec<Mutex<()>>,
    /// One conversion at a time per key (a filter may run for minutes: no stripe shared
    /// with other files).
    conv_locks: Mutex<std::collections::HashMap<Oid, std::sync::Arc<Mutex<()>>>>,
    pub fills: AtomicU64,
}

impl BlobCache {
    pub fn new(dir: PathBuf, tmp: PathBuf) -> BlobCache {
        BlobCache {
            dir,
            tmp,
            fill_locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            conv_locks: Mutex::new(Default::default()),
            fills: AtomicU64::new(0),
        }
    }

    pub fn path(&self, oid: Oid) -> PathBuf {
        path_in(&self.dir, oid)
    }

    fn present(path: &Path, size: u64) -> bool {
        fs::symlink_metadata(path)
            .map(|m| m.is_file() && m.len() == size)
            .unwrap_or(false)
    }

    /// The path of the cached content of `oid`, filling the cache first if needed.
    pub fn ensure(&self, gitdir: &Path, oid: Oid, size: u64) -> std::io::Result<PathBuf> {
        let path = self.path(oid);
        if Self::present(&path, size) {
            return Ok(path);
        }
        let _fill = self.fill_locks[oid.as_bytes()[0] as usize % STRIPES].lock();
        if Self::present(&path, size) {
            return Ok(path);
        }
        let data = git::read_blob(gitdir, oid).map_err(|e| {
            std::io::Error::other(format!(
                "reading blob {oid} from {}: {}",
                gitdir.display(),
                e.message()
            ))
        })?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let tmp = self.tmp.join(format!(
            "{oid}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(&data)?;
            drop(f);
            let mut perms = fs::metadata(&tmp)?.permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o400);
            fs::set_permissions(&tmp, perms)?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            // A full disk leaves no partial blob behind in tmp.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.fills.fetch_add(1, Ordering::Relaxed);
        Ok(path)
    }

    /// The content of `oid`, opened for reading: from the cache (filled first if needed),
    /// or, when the cache cannot be written (its disk is full), from an anonymous
    /// in-memory file, so a base file can still be read.
    pub fn open(&self, gitdir: &Path, oid: Oid, size: u64) -> std::io::Result<File> {
        match self.ensure(gitdir, oid, size) {
            Ok(path) => File::open(path),
            Err(e) if is_out_of_space(&e) && size <= MAX_IN_MEMORY => {
                tracing::warn!(
                    "the blob cache cannot be written ({e}): serving blob {oid} from memory"
                );
                let data = git::read_blob(gitdir, oid).map_err(|e| {
                    std::io::Error::other(format!("reading blob {oid}: {}", e.message()))
                })?;
                in_memory(&data)
            }
            Err(e) => Err(e),
        }
    }
}

impl BlobCache {
    /// Where converted content `key` (a hash of the blob and its conversion) is kept.
    pub fn converted_path(&self, key: Oid) -> PathBuf {
        let hex = key.to_string();
        self.dir.join("conv").join(&hex[..2]).join(&hex[2..])
    }

    /// The converted content `key`, opened for reading: from the cache, or made by `fill`
    /// (which writes it to the file it is given) and cached first; in memory when the
    /// cache's disk is full and `memory_ok` allows it (content of a known, bounded size).
    /// `fill`'s error is returned as it is and nothing is kept.
    pub fn open_converted(
        &self,
        key: Oid,
        memory_ok: bool,
        fill: &dyn Fn(File) -> std::io::Result<()>,
    ) -> std::io::Result<File> {
        let path = self.converted_path(key);
        if let Ok(f) = File::open(&path) {
            return Ok(f);
        }
        let lock = self.conv_locks.lock().entry(key).or_default().clone();
        let r = self.make_converted(key, &path, &lock, memory_ok, fill);
        let mut locks = self.conv_locks.lock();
        if std::sync::Arc::strong_count(&lock) == 2 {
            locks.remove(&key);
        }
        r
    }

    fn make_converted(
        &self,
        key: Oid,
        path: &Path,
        lock: &Mutex<()>,
        memory_ok: bool,
        fill: &dyn Fn(File) -> std::io::Result<()>,
    ) -> std::io::Result<File> {
        let _fill = lock.lock();
        if let Ok(f) = File::open(path) {
            return Ok(f);
        }
        let tmp = self.tmp.join(format!(
            "conv-{key}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let made = (|| {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            let f = File::create(&tmp)?;
            fill(f.try_clone()?)?;
            f.sync_data()?;
            let mut perms = f.metadata()?.permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o400);
            fs::set_permissions(&tmp, perms)?;
            fs::rename(&tmp, path)
        })();
        match made {
            Ok(()) => {
                self.fills.fetch_add(1, Ordering::Relaxed);
                File::open(path)
            }
            Err(e) if is_out_of_space(&e) && memory_ok => {
                let _ = fs::remove_file(&tmp);
                tracing::warn!(
                    "the blob cache cannot be written ({e}): serving converted content {key} from memory"
                );
                let mut f = in_memory(&[])?;
                fill(f.try_clone()?)?;
                std::io::Seek::rewind(&mut f)?;
                Ok(f)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// The largest blob served from memory when the cache cannot be written (a larger one
/// fails to read until there is room again).
const MAX_IN_MEMORY: u64 = 64 << 20;

/// The file of content `oid` in the blob cache directory `dir`.
pub fn path_in(dir: &Path, oid: Oid) -> PathBuf {
    let hex = oid.to_string();
    dir.join(&hex[..2]).join(&hex[2..])
}

/// ENOSPC or EDQUOT: no room left for this user on that disk.
pub fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// An anonymous in-memory file holding `data`, positioned at its start.
fn in_memory(data: &[u8]) -> std::io::Result<File> {
    memfd(c"wtfs-blob", data)
}

/// An anonymous in-memory file named `name` (in /proc) holding `data`, at its start.
pub fn memfd(name: &std::ffi::CStr, data: &[u8]) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the descriptor returned is ours.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nothing else.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(data)?;
    std::io::Seek::rewind(&mut f)?;
    Ok(f)
}
