//! Writing a file so that a crash, or a second writer at the same moment, leaves the old
//! content or the new, never a part (a temporary name of the writer's own, fsync, rename).

use std::fs;
use std::io::Write;
use std::path::Path;

pub fn write_file_synced(path: &Path, content: &[u8]) -> std::io::Result<()> {
    write_synced(path, |f| f.write_all(content))
}

/// Writes a file through `write` into a temporary file next to `path`, fsyncs it and
/// renames it into place, so `path` is either absent or complete. The temporary name is
/// this writer's own (process, counter, time): two writers of one path (two creations caching
/// the same index) each rename a whole file, never one file both wrote into.
pub fn write_synced(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        "{TEMPORARY_MARK}{}-{n}-{nanos}",
        std::process::id()
    ));
    let tmp = path.with_file_name(name);
    // Only a file this writer created is removed on failure.
    let mut f = fs::File::create_new(&tmp)?;
    let result = write(&mut f).and_then(|_| f.sync_all()).and_then(|_| {
        drop(f);
        fs::rename(&tmp, path)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What `write_synced` puts in its temporary names.
pub const TEMPORARY_MARK: &str = ".worktreefs-tmp-";

/// Removes the temporary files `write_synced` left in `dir` more than an hour ago (a
/// process that died between writing and renaming).
pub fn sweep_temporaries(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old && e.file_name().to_string_lossy().contains(TEMPORARY_MARK) {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_temporary_files_older_than_an_hour_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let make = |name: &str, old: bool| {
            let f = fs::File::create(dir.path().join(name)).unwrap();
            if old {
                f.set_modified(two_hours_ago).unwrap();
            }
        };
        make("x.index.worktreefs-tmp-1-0-5", true);
        make("x.index.worktreefs-tmp-2-0-6", false);
        make("x.index", true);
        sweep_temporaries(dir.path());
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["x.index", "x.index.worktreefs-tmp-2-0-6"]);
    }

    /// Two creations at one commit may build and cache its index at the same time; a
    /// reader must only ever find a whole file, never a mix of the two writes.
    #[test]
    fn files_written_at_once_by_two_writers_are_always_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cached.index");
        let content: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mixed, seen) = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let (mut mixed, mut seen) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(read) = fs::read(&path) {
                        seen += 1;
                        mixed += (read != content) as usize;
                    }
                }
                (mixed, seen)
            });
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..40 {
                            // A writer may lose the rename to the other; what is there
                            // must still be whole.
                            let _ = write_file_synced(&path, &content);
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(seen > 0);
        assert_eq!(
            mixed, 0,
            "{mixed} of {seen} reads found a partial or mixed file"
        );
        assert_eq!(fs::read(&path).unwrap(), content);
    }
}
