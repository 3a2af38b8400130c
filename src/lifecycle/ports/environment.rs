//! What runs inside a worktree is told of it: its name, path and source, and its block of
//! ports.

use std::path::Path;

use crate::store::Store;

/// What runs inside worktree `row` (at `path`) is told of it: `WORKTREEFS_WORKTREE`
/// (`repo/name`), `WORKTREEFS_PATH`, `WORKTREEFS_SOURCE` (the registered checkout), and
/// with its block of ports `WORKTREEFS_PORT` (the first) and `WORKTREEFS_PORTS` (how
/// many).
pub fn environment(
    store: &Store,
    row: &crate::store::WorktreeRow,
    path: &Path,
) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "WORKTREEFS_WORKTREE".to_string(),
            format!("{}/{}", row.repo, row.name),
        ),
        ("WORKTREEFS_PATH".to_string(), path.display().to_string()),
    ];
    if let Ok(Some(r)) = store.repo_by_id(row.repo_id) {
        env.push(("WORKTREEFS_SOURCE".into(), r.path.display().to_string()));
    }
    if let Ok(Some(b)) = store.ports_of(row.id) {
        env.push(("WORKTREEFS_PORT".into(), b.first.to_string()));
        env.push(("WORKTREEFS_PORTS".into(), b.size.to_string()));
    }
    env
}
