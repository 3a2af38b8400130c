//! Process-wide settings made once, before a command runs and before any thread is
//! started: how a closed pipe ends a command, logging, and libgit2's and malloc's
//! settings for a short command or the daemon.

use crate::cli::Command;
use crate::logging;

/// Makes the settings `command` runs with; `log_level` is `--log-level`.
pub fn settle(command: &Command, log_level: Option<&str>) {
    // A command that prints for a reader who may stop reading (`worktreefs list | head
    // -1`) ends by SIGPIPE as other tools do: Rust ignores the signal, and a print into a
    // closed pipe would panic. The commands that keep running for something (the daemon,
    // the MCP server, a run or a turn holding a lease, an unmount's cleanup) keep it
    // ignored and see the error.
    if !command.keeps_running() {
        // SAFETY: at startup, before any thread is made.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let is_daemon = command.is_daemon();
    let asked = log_level.is_some() || std::env::var("RUST_LOG").is_ok_and(|v| !v.is_empty());
    if is_daemon || asked {
        logging::init(log_level);
    } else {
        // A command at the default level: its warnings and errors as sentences for people
        // (`worktreefs: warning: …`); records with times and targets are the daemon's log
        // and `--log-level`'s.
        logging::init_for_people();
    }
    // Objects come from the repository's own local database: libgit2 re-hashing each one
    // on every read (its default) only costs time.
    git2::opts::strict_hash_verification(false);
    // A repository registered here may belong to another user (a root daemon with
    // --allow-other serving its users' repositories): libgit2's ownership check (git's
    // safe.directory) would refuse to open it. That check guards against running programs
    // a repository's configuration names. libgit2 runs none (no hooks, filters or
    // fsmonitor commands); the checkout filters worktreefs has git run are run as the
    // worktree's owner, and only for a repository that belongs to that owner or to root
    // (`git::checkout::Setting::trusted`). Only the state directory's owner registers
    // repositories.
    // SAFETY: set at startup, before any repository is opened.
    unsafe {
        let _ = git2::opts::set_verify_owner_validation(false);
    }
    // Memory: the daemon keeps its own cache of trees and sizes, so libgit2's object cache
    // only duplicates it; and in the daemon pack files are mapped in windows of at most
    // 16 MiB, 32 MiB in all (libgit2's defaults, 1 GiB and 8 GiB, let one big pack sit in
    // the daemon's resident memory). A command keeps the defaults: the first creation at
    // a commit reads 100,000 object headers all over a 200 MB pack, and small windows
    // had it mapping and unmapping them all the time (90-170 ms against 77-85, ad hoc).
    git2::opts::enable_caching(false);
    // Short-lived threads (a lease's holder exiting) must not each leave a malloc arena
    // of freed pages behind in the daemon's resident memory.
    // SAFETY: plain libc call at startup, before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    if is_daemon {
        // Each FUSE worker's request buffer (`fuse::session::BUFFER_SIZE`) mapped apart:
        // untouched, not resident, until a request that big comes.
        worktreefs::heap::large_blocks_apart();
        // SAFETY: set before any repository is opened, as libgit2 requires.
        unsafe {
            let _ = git2::opts::set_mwindow_size(16 << 20);
            let _ = git2::opts::set_mwindow_mapped_limit(32 << 20);
        }
    }
}
