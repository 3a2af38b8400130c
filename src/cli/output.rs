//! What several commands print alike: a JSON shape, where to go next, how to run this
//! program again, who is inside each worktree, a warm snapshot taken.

use std::fs;
use std::path::{Path, PathBuf};

use worktreefs::daemon;
use worktreefs::lifecycle::warm;
use worktreefs::report::shell_word;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

/// Prints `shape` as `--json` prints: pretty, its keys in alphabetical order whatever
/// order its type declares its fields in (as docs/cli.md says; through
/// `serde_json::Value`, whose objects keep their keys sorted).
pub fn print_json(shape: impl serde::Serialize) {
    println!("{:#}", worktreefs::report::shapes::value(shape));
}

/// How many processes are inside each worktree of the mount serving `state` (working
/// directory, open file…, as unmount counts them; a bare `cd` takes no lease): 0 for all
/// when nothing is mounted.
pub fn inside_counts(state: &StateDir) -> impl Fn(&worktreefs::store::WorktreeRow) -> usize {
    let found = match daemon::running_daemon(state) {
        Some(d) if !daemon::detached(state, &d) => {
            worktreefs::process::inside::processes_in_worktrees(&worktreefs::target::physical(
                &d.mountpoint,
            ))
        }
        _ => Vec::new(),
    };
    move |w| {
        let place = format!("{}/{}", w.repo, w.name);
        found.iter().filter(|(_, p, _)| *p == place).count()
    }
}

/// The SETUP column of the table of worktrees (each one's last setup run, `-` for none),
/// where some worktree has had a run.
pub fn setup_column(
    setups: &[worktreefs::store::SetupRow],
) -> Option<impl Fn(&worktreefs::store::WorktreeRow) -> String + '_> {
    (!setups.is_empty()).then_some(move |w: &worktreefs::store::WorktreeRow| {
        setups
            .iter()
            .find(|s| s.worktree_id == w.id)
            .map_or_else(|| "-".to_string(), |s| s.summary())
    })
}

/// Where to go next for a worktree just made or brought back (and, when nothing is
/// mounted, the mount to start first).
pub fn print_cd(state: &StateDir, path: &Path) {
    if daemon::running_daemon(state).is_some() {
        println!("  cd {}", shell_word(&path.display().to_string()));
    } else {
        println!(
            "  (not mounted: run `{} mount`, then cd {})",
            invocation(state),
            shell_word(&path.display().to_string())
        );
    }
}

/// The path alone on stdout (`new --print-path`); when nothing is mounted, stderr says
/// how to mount.
pub fn print_path(state: &StateDir, path: &Path) {
    println!("{}", path.display());
    if daemon::running_daemon(state).is_none() {
        eprintln!(
            "worktreefs: not mounted: run `{} mount` before going to {}",
            invocation(state),
            shell_word(&path.display().to_string())
        );
    }
}

/// How a person runs this program again, for next steps printed to be run as they are:
/// `worktreefs` when that name on `PATH` is this very program, else this program's path;
/// with `--state-dir DIR` when `state` is not the one a bare command would use.
pub fn invocation(state: &StateDir) -> String {
    invocation_for(&state.root)
}

/// As [`invocation`], for the state directory at `root`, which need not exist yet.
pub fn invocation_for(root: &Path) -> String {
    invocation_with(root, true)
}

/// As [`invocation_for`]; `--state-dir` is left out only for the state directory a bare
/// command uses with `WORKTREEFS_STATE_DIR` as it is now (`env`), or as it is when unset
/// (a shell function kept in a startup file must not depend on that variable staying).
pub fn invocation_with(root: &Path, env: bool) -> String {
    let me = std::env::current_exe()
        .ok()
        .and_then(|e| fs::canonicalize(e).ok());
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("worktreefs"))
            .find(|p| {
                use std::os::unix::fs::PermissionsExt;
                fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .and_then(|p| fs::canonicalize(p).ok())
    });
    let mut out = match &me {
        Some(me) if on_path.as_ref() != Some(me) => shell_word(&me.display().to_string()),
        _ => "worktreefs".to_string(),
    };
    let bare = StateDir::resolve(
        std::env::var_os("WORKTREEFS_STATE_DIR")
            .filter(|_| env)
            .map(PathBuf::from),
    );
    let same = match (fs::canonicalize(&bare), fs::canonicalize(root)) {
        (Ok(a), Ok(b)) => a == b,
        _ => bare == root,
    };
    if !same {
        out.push_str(" --state-dir ");
        out.push_str(&shell_word(&root.display().to_string()));
    }
    out
}

/// What a snapshot taken holds and left out.
pub fn print_taken(repo: &str, t: &warm::Taken) {
    println!(
        "took warm snapshot {} of {repo} in {:.1} s: {} files and links ({} links), {}{}",
        t.row.id,
        t.took.as_secs_f64(),
        t.row.files,
        t.links,
        worktreefs::report::human_bytes(t.row.bytes),
        match t.unchanged {
            0 => String::new(),
            n => format!("; {n} files unchanged since the last snapshot were not read again"),
        }
    );
    for p in &t.unmatched {
        println!("  pattern '{p}' matches nothing in the source checkout");
    }
    for (path, why) in t.skipped.iter().take(20) {
        println!("  skipped {path}: {why}");
    }
    if t.skipped.len() > 20 {
        println!(
            "  … and {} more skipped (`worktreefs warm {repo} --json` lists all)",
            t.skipped.len() - 20
        );
    }
}

/// `warm::prune`, its failure a warning: a snapshot taken stands either way.
pub fn prune_warm(state: &StateDir, store: &mut Store) -> Option<warm::Pruned> {
    warm::prune(state, store)
        .map_err(|e| eprintln!("worktreefs: deleting older warm snapshots: {e:#}"))
        .ok()
        .flatten()
}
