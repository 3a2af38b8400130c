//! Where each worktree's setup log is, reading its end, and removing it.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::ids::WorktreeId;
use crate::state::StateDir;
use crate::store::WorktreeRow;

/// Where worktree `row`'s setup log is: `<state>/setup/<id>-<made at>.log` (an id a
/// worktree made later may be given again; its time is its own).
pub fn log_path(state: &StateDir, row: &WorktreeRow) -> PathBuf {
    log_at(state, row.id, row.created_at)
}

fn log_at(state: &StateDir, id: WorktreeId, created_at: i64) -> PathBuf {
    state
        .root
        .join("setup")
        .join(format!("{id}-{created_at}.log"))
}

/// The most of a setup log kept: past it, what the command prints is counted, not kept.
pub const LOG_LIMIT: u64 = 16 << 20;

/// The most of a log read at once (`.control/setup-log`, `setup-log`): its end.
pub const READ_LIMIT: u64 = 1 << 20;

/// Reads the end of worktree `row`'s setup log, at most [`READ_LIMIT`] bytes of it (a line
/// before them says how much comes before, and where); empty when there is none yet.
pub fn read_log(state: &StateDir, row: &WorktreeRow) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let path = log_path(state, row);
    let mut f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r?,
    };
    let len = f.metadata()?.len();
    let mut out = Vec::new();
    if len > READ_LIMIT {
        out.extend_from_slice(
            format!(
                "[worktreefs: the first {} bytes of this log are only in {}]\n",
                len - READ_LIMIT,
                path.display()
            )
            .as_bytes(),
        );
        f.seek(SeekFrom::Start(len - READ_LIMIT))?;
    }
    f.take(READ_LIMIT).read_to_end(&mut out)?;
    Ok(out)
}

/// Removes the setup log of worktree `id` made at `created_at` (its row goes).
pub fn remove_log(state: &StateDir, id: WorktreeId, created_at: i64) {
    let _ = fs::remove_file(log_at(state, id, created_at));
}
