//! The file a turn's outcome comes back in (`turn --report`): made new under a name
//! nobody can guess, locked while this server has it, swept when a killed server left it.

use std::path::PathBuf;

/// A file only this server made, for one turn's outcome (`turn --report`): created new
/// under a name no one can guess (never one that was there, nor through a link) with mode
/// 0600, read back through the descriptor it was made with (whatever is put at its name
/// meanwhile), removed when dropped. It is locked (flock) for as long as this server has
/// it, so a server that was killed leaves a file nobody locks, which the next one removes
/// ([`sweep_reports`]).
pub(super) struct ReportFile {
    pub(super) path: PathBuf,
    pub(super) file: std::fs::File,
}

/// How much of a turn's outcome is read: it is one JSON object of a few hundred bytes.
const REPORT_BYTES: u64 = 64 << 10;

/// The names report files have: `worktreefs-mcp-<random>.json`.
const REPORT_PREFIX: &str = "worktreefs-mcp-";
const REPORT_SUFFIX: &str = ".json";

/// A report file nobody locks is swept only once this old: a server locks its file a
/// moment after making it, never this long after.
const REPORT_SWEEP_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl ReportFile {
    pub(super) fn new() -> std::io::Result<ReportFile> {
        Self::new_in(&std::env::temp_dir())
    }

    pub(super) fn new_in(dir: &std::path::Path) -> std::io::Result<ReportFile> {
        use std::os::unix::fs::OpenOptionsExt;
        sweep_reports(dir);
        let mut tries = 0;
        loop {
            let mut bytes = [0u8; 12];
            // SAFETY: getrandom(2) into a buffer of that length.
            let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
            if n != bytes.len() as isize {
                return Err(std::io::Error::last_os_error());
            }
            let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let path = dir.join(format!("{REPORT_PREFIX}{name}{REPORT_SUFFIX}"));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    let report = ReportFile { path, file };
                    report.file.try_lock()?;
                    return Ok(report);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => {
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What the turn wrote: one JSON object, or None.
    pub(super) fn read(&self) -> Option<serde_json::Value> {
        use std::io::Read;
        std::io::Seek::rewind(&mut &self.file).ok()?;
        let mut text = String::new();
        (&self.file)
            .take(REPORT_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        serde_json::from_str(text.trim()).ok()
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes from `dir` the report files of servers that are gone: this user's regular
/// files named as report files, older than [`REPORT_SWEEP_AGE`], that no descriptor
/// locks. A link or anything else at such a name is left; nothing is followed.
fn sweep_reports(dir: &std::path::Path) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(REPORT_PREFIX) || !name.ends_with(REPORT_SUFFIX) {
            continue;
        }
        let path = e.path();
        // O_NOFOLLOW and O_NONBLOCK: never through a link, never stuck on a FIFO.
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= REPORT_SWEEP_AGE);
        if !meta.is_file() || meta.uid() != me || !old || file.try_lock().is_err() {
            continue;
        }
        // Still the file checked (the name was not replaced meanwhile: only its owner can
        // in a sticky directory, and its owner is this user).
        let same = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
        if same {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report file whose server was killed (its name left, no descriptor locking it)
    /// is removed when a later server makes one, once old enough that no server can be
    /// between making it and locking it; a live server's stays, and nothing is followed
    /// through a link.
    #[test]
    fn a_killed_servers_report_file_goes_when_the_next_one_makes_one() {
        let dir = tempfile::tempdir().unwrap();
        let age = |path: &std::path::Path| {
            let t = std::time::SystemTime::now() - 2 * REPORT_SWEEP_AGE;
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        let killed = dir
            .path()
            .join("worktreefs-mcp-0123456789abcdef01234567.json");
        std::fs::write(&killed, b"{}").unwrap();
        age(&killed);
        let live = ReportFile::new_in(dir.path()).unwrap();
        age(&live.path);
        let young = dir.path().join("worktreefs-mcp-young.json");
        std::fs::write(&young, b"").unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        age(&target);
        let link = dir.path().join("worktreefs-mcp-link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let next = ReportFile::new_in(dir.path()).unwrap();
        assert!(!killed.exists(), "a killed server's report file goes");
        assert!(next.path.exists());
        assert!(live.path.exists(), "a live server's stays, however old");
        assert!(young.exists(), "one made a moment ago stays");
        assert!(
            target.exists() && link.symlink_metadata().is_ok(),
            "a link is left"
        );
        drop(next);
        drop(live);
    }
}
