//! `turn --report FILE`: the file a turn's outcome is written into, apart from its
//! command's output (`worktreefs mcp` reads it). Opened before anything else happens and
//! written through that one descriptor at the end.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context};

/// `turn --report FILE`, opened at the start (see `main`).
pub static REPORT: std::sync::OnceLock<fs::File> = std::sync::OnceLock::new();

/// Opens a `--report` file: one that exists, a regular file of this user's that it may
/// write, found without following a link and without opening it for writing (so no FIFO
/// is waited on, and a file inside the turn's own worktree is no writer there that a
/// `--guard` would wait for): an `O_PATH` descriptor, reopened for writing at the end.
fn open_report(path: &Path) -> anyhow::Result<fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| {
            format!(
                "--report {}: not an existing file; make it first (it is not created); nothing was started",
                path.display()
            )
        })?;
    let m = f.metadata()?;
    if !m.file_type().is_file() || m.uid() != nix::unistd::geteuid().as_raw() {
        bail!(
            "--report {}: not a regular file of this user's (uid {}; a link is not followed); nothing was started",
            path.display(),
            nix::unistd::geteuid()
        );
    }
    // Writable: tried now, through the descriptor (the same file), and closed at once.
    reopen_report(&f).with_context(|| {
        format!(
            "--report {}: cannot be written; nothing was started",
            path.display()
        )
    })?;
    Ok(f)
}

/// The `--report` file opened for writing, through its `O_PATH` descriptor.
fn reopen_report(f: &fs::File) -> std::io::Result<fs::File> {
    use std::os::fd::AsRawFd;
    fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Writes a turn's outcome into its `--report` file, if it has one (a failure to is said,
/// not fatal: the exit status still tells).
pub fn write_report(v: &serde_json::Value) {
    use std::os::unix::fs::FileExt;
    let Some(f) = REPORT.get() else {
        return;
    };
    let text = format!("{v}\n");
    let written = reopen_report(f).and_then(|w| {
        w.set_len(0)
            .and_then(|()| w.write_all_at(text.as_bytes(), 0))
    });
    if let Err(e) = written {
        eprintln!("worktreefs: writing the turn's outcome to its --report file: {e}");
    }
}

/// Opens `turn --report FILE` before anything else happens (before the turn enters the
/// worktree, so a relative path is the caller's); it is written through that one
/// descriptor at the end, whatever becomes of the name meanwhile.
pub fn hold_report(path: &Path) -> anyhow::Result<()> {
    let _ = REPORT.set(open_report(path)?);
    Ok(())
}
