//! The `worktreefs` command line. Exit codes: 0 success, 1 the request could not be carried
//! out (the message names the thing, its state and the way out), 2 bad usage.

mod completion;
mod logging;
mod mcp;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use worktreefs::daemon::{self, MountRequest};
use worktreefs::git;
use worktreefs::lease::State;
use worktreefs::lifecycle::cleanup::keep::KeepPolicy;
use worktreefs::lifecycle::create::{self, CreateRequest};
use worktreefs::lifecycle::warm;
use worktreefs::names::{sanitize_name, validate_name};
use worktreefs::process::supervise::{exit_code, run_below, signal_name, Below, Ended, RunError};
use worktreefs::process::tree;
use worktreefs::report;
use worktreefs::report::shell_word;
use worktreefs::state::StateDir;
use worktreefs::store::Store;
use worktreefs::table::Table;

/// The exit codes, as `--help` ends with them (and the README gives them).
const EXIT_CODES: &str = "Exit codes: 0 success; 1 the request could not be carried out (the message names the thing, its state and the way out); 2 bad usage; 3 a typed conflict: the worktree cannot be had now (lease acquire, run, turn: somebody else holds it, another turn runs there, processes outside a guarded turn write there, or it is deleting, removed or unknown). run and turn otherwise exit with their command's status (127 not found, 126 not executable, 128+N ended by signal N); 124 a turn's command ran past turn --timeout and was ended.";

#[derive(Parser)]
#[command(
    name = "worktreefs",
    version,
    about = "Copy-on-write git worktrees for every agent, over FUSE",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// State directory (database, upper layers, caches); one daemon per state directory.
    #[arg(long, global = true, env = "WORKTREEFS_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG takes precedence.
    #[arg(long, global = true, value_parser = logging::log_level, value_name = "LEVEL")]
    log_level: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Mount the filesystem; inside a repository with no arguments, register it and use the defaults.
    ///
    /// Mount the filesystem (in the background once ready, unless --foreground). Inside a
    /// git repository with no arguments: registers that repository and uses the defaults.
    /// `-o allow_other,threads=N,linger=SECS,…` as mount.fuse3 takes them (each option
    /// the flag of its name); as a mount helper (`mount -t fuse.worktreefs STATE_DIR
    /// MOUNTPOINT`, an fstab line) through a link named mount.fuse.worktreefs.
    Mount {
        /// Where to mount (default: `<state dir>-mnt`, ~/.local/state/worktreefs-mnt).
        mountpoint: Option<PathBuf>,
        /// Stay in the foreground and log to stderr (for systemd or a terminal); else the
        /// daemon backgrounds once the mount is ready and logs to <state>/daemon.log.
        #[arg(short, long)]
        foreground: bool,
        /// Once the mount is ready, one JSON object on stdout: the mountpoint, the daemon's
        /// pid, the state dir and the repositories (see docs/cli.md). Not with
        /// --foreground, which tells systemd instead (sd_notify).
        #[arg(long, conflicts_with = "foreground")]
        json: bool,
        /// FUSE worker threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Seconds a worktree stays `lingering` after its last lease before cleanup.
        #[arg(long, default_value_t = 5)]
        linger: u64,
        /// Do not track process leases (for measuring their cost; named leases still work).
        #[arg(long, hide = true)]
        no_lease_tracking: bool,
        /// Serve file data through the daemon even where the kernel offers FUSE passthrough.
        #[arg(long)]
        no_passthrough: bool,
        /// List directories without the entries' attributes (READDIRPLUS): cheaper for
        /// walks that only read names (`find`), dearer for those that stat or open what
        /// they list (`ls -l`, `grep -r`).
        #[arg(long)]
        no_readdirplus: bool,
        /// FUSE over io_uring: `auto` uses it where the kernel offers it (its fuse module's
        /// enable_uring on: see `worktreefs doctor`), `off` never, `on` requires it (the
        /// mount fails saying why it cannot be had). Requests then reach the daemon on the
        /// caller's CPU, without a read of /dev/fuse each.
        #[arg(
            long,
            env = "WORKTREEFS_URING",
            default_value = "auto",
            value_name = "auto|off|on"
        )]
        uring: worktreefs::fs::mount::Uring,
        /// Keep `user.` extended attributes on files and directories of worktrees. Off by
        /// default: with attributes served, the kernel asks each file's
        /// security.capability before every write(2), one more round trip per write.
        #[arg(long)]
        xattr: bool,
        /// Inodes the daemon keeps before it asks the kernel to drop its caches of
        /// worktrees nobody holds (worktrees in use are never dropped).
        #[arg(long, default_value_t = 150_000)]
        cache_nodes: usize,
        /// Let other users use the mount (FUSE's allow_other; without root it needs
        /// `user_allow_other` in /etc/fuse.conf). Without it the mount is private to the
        /// user who mounted it. With it, each worktree belongs to the user who created it
        /// and a repository's worktrees are no more readable than its own directory.
        #[arg(long)]
        allow_other: bool,
        /// Seconds one checkout filter (a `filter.<name>` command, git-lfs…) may run for a
        /// file before it is ended and the file's read fails (or, for a filter that is not
        /// `required`, shows the blob as committed).
        #[arg(long, default_value_t = 120.0)]
        filter_timeout: f64,
        /// Seconds cleanup's inspection of one worktree may take (reading the index, the
        /// upper layer, the repository's refs and objects) before it is given up and the
        /// worktree retained with the reason: something in the repository that blocks a
        /// read (a FIFO where a ref was) then holds no removal after it.
        #[arg(long, default_value_t = 600.0)]
        inspect_timeout: f64,
        /// Hours every removal keeps what it removed (upper layer, index, branch tip) for
        /// `worktreefs restore`; 0 keeps nothing.
        #[arg(long, default_value_t = 24.0)]
        keep_removed: f64,
        /// Kept removals give way, oldest first, while the state directory's disk has less
        /// than this share free (percent) …
        #[arg(long, default_value_t = 5.0)]
        keep_min_free_percent: f64,
        /// … or less than this many GiB free.
        #[arg(long, default_value_t = 2.0)]
        keep_min_free_gib: f64,
        /// What an unmount by `umount` or `fusermount3 -u` (an fstab mount at shutdown)
        /// does: keep named leases and their worktrees for the next mount, as
        /// `worktreefs unmount --keep-sessions` does, instead of releasing every lease.
        #[arg(long)]
        umount_keeps_sessions: bool,
    },
    /// Release every lease, clean up, and end the mount (`--keep-sessions` for a restart).
    ///
    /// Unmount: every lease is released (reason `unmount`), worktrees left without a lease
    /// are cleaned up (removed when clean and pushed, else retained), then the mount goes.
    /// Refused, naming them, while processes are inside, unless --lazy.
    Unmount {
        /// Detach now even with processes inside; the daemon finishes the cleanup in the
        /// background once they have left.
        #[arg(long)]
        lazy: bool,
        /// A planned restart, not a reclaim: named leases and their worktrees are kept for
        /// the next mount; only process leases are released (and what nobody then holds
        /// is cleaned up). The systemd units stop this way.
        #[arg(long)]
        keep_sessions: bool,
        /// The outcome as one JSON object on stdout, with each worktree's cleanup (see
        /// docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// List worktrees kept because removing them would lose work.
    ///
    /// Worktrees kept by cleanup because removing them would lose work, with the reason.
    Retained {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Remove a retained or unused worktree when nothing would be lost.
    ///
    /// Remove REPO/WT (retained, or never leased) when cleanup's checks pass: nothing
    /// uncommitted, HEAD where it was created, every commit pushed or in the base.
    Reclaim {
        /// The worktree: REPO/WT, or a path inside it under the mount; always given (your
        /// own shell may be inside the one you are in).
        target: String,
        /// Throw away what it holds (listed first): the one way to lose work on purpose.
        #[arg(long)]
        discard: bool,
        /// Wait up to SECS for its holders to go (sessions to release, processes to leave).
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// The outcome (removed, with what it says; or why not) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// List removed worktrees that can still be restored.
    ///
    /// Removed worktrees still restorable (every removal keeps what it removed for
    /// `mount --keep-removed` hours), with their size and when they go.
    Removed {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Bring back a removed worktree as it was.
    ///
    /// Bring back a removed worktree REPO/WT as it was: its files, its index, HEAD on its
    /// branch (made again at the kept commit if it was deleted).
    Restore {
        /// The removed worktree: REPO/WT, or its path under the mount (see `worktreefs
        /// removed`).
        target: String,
        /// Restore under this name (when REPO/WT's name is in use again).
        #[arg(long = "as", value_name = "NAME")]
        as_name: Option<String>,
        /// Which removal of that name (its id in `worktreefs removed`; default the newest).
        #[arg(long)]
        id: Option<i64>,
        /// The restored worktree (or the refusal) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Registered repositories.
    #[command(subcommand)]
    Repo(RepoCmd),
    /// Create a worktree: REPO/NAME.
    New {
        /// REPO/NAME: the registered repository and the new worktree's name (or the path
        /// it will have under the mount).
        target: String,
        /// Base revision (default: HEAD of the repository, or the branch's tip with --branch).
        #[arg(long)]
        base: Option<String>,
        /// Branch to check out (default: a new branch named after the worktree).
        #[arg(long)]
        branch: Option<String>,
        /// Show each initialized submodule (`.git/modules/<name>`) at its recorded commit
        /// as a view of its own repository, made when it is first looked at; without it
        /// (and without `git config worktreefs.submodules true` in the repository) a
        /// submodule is an empty directory, as in a fresh `git worktree add`.
        #[arg(long)]
        submodules: bool,
        /// Fork this worktree (PARENT, or REPO/PARENT of the same repository): a new
        /// branch at its HEAD, with its index and a copy of every uncommitted, untracked
        /// and ignored change it has (it keeps running; the copy costs what it changed).
        #[arg(long, value_name = "PARENT", conflicts_with_all = ["base", "submodules"])]
        from: Option<String>,
        /// Show the repository's warm snapshot (its source checkout's files that
        /// `.worktreeinclude` or `repo set --include` name: node_modules/, target/, .env),
        /// copy-on-write; the first one takes the snapshot (`worktreefs warm REPO`).
        #[arg(long, conflicts_with_all = ["from", "cold"])]
        warm: bool,
        /// Without the warm snapshot, where the repository is warm by default.
        #[arg(long)]
        cold: bool,
        /// The new worktree as JSON on stdout (its path, state, branch, base; for --from
        /// what was copied; for a warm one the snapshot, and whether it was taken now).
        #[arg(long)]
        json: bool,
    },
    /// Take a new warm snapshot of a repository's ignored files (node_modules/, target/, .env).
    ///
    /// Take a new warm snapshot of REPO's source checkout: the ignored and untracked files
    /// its patterns match, read with your permissions. Worktrees made before keep theirs.
    Warm {
        /// The registered repository (see `worktreefs repo list`).
        repo: String,
        /// The snapshot (its size, what was skipped, patterns that matched nothing) as JSON on
        /// stdout.
        #[arg(long)]
        json: bool,
    },
    /// List worktrees.
    List {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Show the state of every worktree as a table.
    Status {
        /// As JSON on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Named leases for orchestrators.
    #[command(subcommand)]
    Lease(LeaseCmd),
    /// Run a command inside a worktree, holding a lease for its lifetime.
    ///
    /// Run a command inside REPO/WT, holding a lease for exactly its lifetime; its exit
    /// status is passed through.
    Run {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// Hold the lease as this named session (else as the run process).
        #[arg(long)]
        session: Option<String>,
        /// Only while nobody else holds the worktree (see `lease acquire --exclusive`).
        #[arg(long)]
        exclusive: bool,
        /// When another holder refuses the lease, wait up to SECS for it to go.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// A refusal as JSON on stderr (the command's stdout stays its own).
        #[arg(long)]
        json: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command as a session's turn: one turn at a time per worktree.
    ///
    /// Run a command as the session's turn in REPO/WT: at most one turn runs per worktree
    /// among all its holders; another is refused (exit code 3, naming the running turn) or
    /// waits (`--wait`). Takes the session's named lease if it holds none (released at the
    /// end). The turn ends when the command exits, when the session's lease is released,
    /// or when this process is gone; the command's exit status is passed through.
    Turn {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// The orchestrator's session id the turn is for.
        #[arg(long)]
        session: String,
        /// The filesystem refuses (EBUSY) every change inside the worktree by a process
        /// outside the turn's process tree while it runs; reads stay open. Does not start
        /// while processes outside it have files there open for writing.
        #[arg(long)]
        guard: bool,
        /// When another turn runs (or, with --guard, processes outside write files there),
        /// wait up to SECS for it to end.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// End the command when it runs longer than SECS: SIGTERM, then SIGKILL 5 s later
        /// if it is still there (and what it left running ends with the turn); the turn
        /// then exits 124, as timeout(1) does.
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
        timeout: Option<u64>,
        /// A refusal (and a timeout) as JSON on stderr (the command's stdout stays its own).
        #[arg(long)]
        json: bool,
        /// Also write the turn's outcome as one JSON object into FILE, apart from the
        /// command's output: the refusal or failure, `timed-out`, or `ended` with the exit
        /// status (for `worktreefs mcp`).
        #[arg(long, value_name = "FILE", hide = true)]
        report: Option<PathBuf>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List the running turns (`turns end` ends one).
    Turns {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<TurnsCmd>,
    },
    /// List every lease.
    Leases {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Lease and lifecycle events, oldest first.
    Events {
        /// One JSON object per line (NDJSON) on stdout, also with --follow (see docs/cli.md).
        #[arg(long)]
        json: bool,
        /// Keep printing new events as they happen.
        #[arg(long)]
        follow: bool,
        /// How many past events to show (0: none, so --follow shows only new ones).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
        last: i64,
    },
    /// Check that this machine can mount and serve worktrees, with a fix for each failure.
    ///
    /// Is this machine set up? Checks /dev/fuse, fusermount3, the kernel's FUSE features
    /// (passthrough, FUSE over io_uring), the state directory's permissions and free
    /// space, stale mounts and creations, the daemon's health and each repository's
    /// config; one line per check, with what to do when it fails. Exit code 1 when one
    /// fails.
    Doctor {
        /// The checks as a JSON array on stdout (check, status ok|warn|fail, detail, fix).
        #[arg(long)]
        json: bool,
    },
    /// Show the disk used in the state directory, per worktree.
    ///
    /// Disk used in the state directory: each worktree's upper layer, the kept removals,
    /// the shared caches, the database, and the total (the mount is never walked).
    Du {
        /// Only this worktree: REPO/WT, or a path inside it under the mount (default:
        /// the worktree the current directory is in, else everything).
        target: Option<String>,
        /// As JSON on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Serve the Model Context Protocol on stdio, for agent frameworks.
    ///
    /// Serve the Model Context Protocol on stdin/stdout for agent frameworks: tools to
    /// create, list and show worktrees, acquire and release named leases, run a turn,
    /// list retained and removed worktrees, reclaim and restore (each runs the command
    /// of that name with --json; a refusal is a tool error with the CLI's message).
    Mcp,
    /// Print a shell completion script.
    ///
    /// Print a completion script for SHELL on stdout: `source <(worktreefs completions
    /// bash)`, or save it where the shell looks (bash: /etc/bash_completion.d/worktreefs;
    /// zsh: a directory on $fpath as _worktreefs; fish:
    /// ~/.config/fish/completions/worktreefs.fish). In bash, zsh and fish, REPO/WT and
    /// REPO complete from the state directory's names.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print repository or worktree names, one a line (for the completion scripts).
    #[command(name = "__names", hide = true)]
    Names {
        /// What to list: worktrees, removed (restorable) worktrees, or repos.
        kind: completion::Names,
    },
    /// Write the manual pages into DIR.
    ///
    /// Write the manual pages (worktreefs.1 and one per command, worktreefs-mount.1…) into
    /// DIR, made if missing: `worktreefs man /usr/local/share/man/man1`.
    Man {
        /// Where the pages go.
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum TurnsCmd {
    /// End the turn running on REPO/WT: its `turn` process gets SIGTERM (passed on to its
    /// command) and this waits for the turn to end. Says so, changing nothing, when no turn
    /// runs there or (with --session) it is another session's.
    End {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// Only if the running turn is this session's.
        #[arg(long)]
        session: Option<String>,
        /// How long to wait for the turn to end.
        #[arg(long, value_name = "SECS", default_value_t = 10)]
        wait: u64,
        /// The outcome (or why not) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum LeaseCmd {
    /// Take a named lease on REPO/WT for a session (kept across daemon restarts). Refused
    /// (exit code 3, naming each holder) while another holds it exclusively.
    Acquire {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// The orchestrator's session id.
        #[arg(long)]
        session: String,
        /// Only while nobody else holds the worktree: no other session, and no process
        /// that is not this command or one of its ancestors; while held, every other
        /// session's acquisition is refused (processes may still enter).
        #[arg(long)]
        exclusive: bool,
        /// When another holder refuses the lease, wait up to SECS for it to go.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// The lease, or the refusal, as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Release a session's named lease on REPO/WT.
    Release {
        /// The worktree: REPO/WT, or a path inside it under the mount (default: the
        /// worktree the current directory is in).
        target: Option<String>,
        /// The session whose lease goes.
        #[arg(long)]
        session: String,
        /// Why the session let go (e.g. `force-killed`, `exited-with-unsaved-work`): kept
        /// with the release event, and shown with the retained entry if the worktree is
        /// retained.
        #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        reason: Option<String>,
        /// The outcome (or the refusal) as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum RepoCmd {
    /// Register a repository.
    Add {
        /// The repository: its checkout, or any directory inside it.
        path: PathBuf,
        /// The name its worktrees go under (default: the checkout directory's name).
        #[arg(long)]
        name: Option<String>,
        /// What warm worktrees inherit from the checkout (gitignore patterns, besides its
        /// `.worktreeinclude`).
        #[arg(long, num_args = 1.., value_name = "PATTERN")]
        include: Vec<String>,
        /// Make every new worktree warm (`new --cold` for one that is not).
        #[arg(long)]
        warm_default: bool,
        /// The repository as one JSON object on stdout, as `repo list --json` gives it.
        #[arg(long)]
        json: bool,
    },
    /// Change a registered repository's warm settings.
    Set {
        /// The registered repository (see `worktreefs repo list`).
        name: String,
        /// Replace the include patterns (gitignore syntax).
        #[arg(long, num_args = 1.., value_name = "PATTERN", conflicts_with = "no_include")]
        include: Vec<String>,
        /// Clear the include patterns (`.worktreeinclude` still counts).
        #[arg(long)]
        no_include: bool,
        /// Whether new worktrees are warm without `--warm`.
        #[arg(long, value_name = "BOOL")]
        warm_default: Option<bool>,
        /// The repository as one JSON object on stdout, as `repo list --json` gives it.
        #[arg(long)]
        json: bool,
    },
    /// List registered repositories.
    List {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Unregister a repository that has no worktrees.
    Remove {
        /// The registered repository (see `worktreefs repo list`).
        name: String,
        /// The repository removed as one JSON object on stdout (with `purged`, the kept
        /// removals that went with it).
        #[arg(long)]
        json: bool,
    },
}

/// The `-o` options `mount` takes (as `mount.fuse3` and fstab give them), each with the
/// flag it stands for; `=` after a name: it takes a value.
const MOUNT_OPTIONS: &[(&str, &str)] = &[
    ("allow_other", "--allow-other"),
    ("threads=", "--threads"),
    ("linger=", "--linger"),
    ("cache_nodes=", "--cache-nodes"),
    ("no_passthrough", "--no-passthrough"),
    ("no_readdirplus", "--no-readdirplus"),
    ("uring=", "--uring"),
    ("xattr", "--xattr"),
    ("filter_timeout=", "--filter-timeout"),
    ("inspect_timeout=", "--inspect-timeout"),
    ("keep_removed=", "--keep-removed"),
    ("keep_min_free_percent=", "--keep-min-free-percent"),
    ("keep_min_free_gib=", "--keep-min-free-gib"),
    ("state_dir=", "--state-dir"),
    ("log_level=", "--log-level"),
    ("umount_keeps_sessions", "--umount-keeps-sessions"),
];

/// Options mount(8) and fstab pass that mean nothing here (or what worktreefs always
/// does: nosuid, nodev): accepted and ignored.
fn generic_mount_option(o: &str) -> bool {
    matches!(
        o,
        "rw" | "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "user"
            | "users"
            | "nouser"
            | "_netdev"
            | "nosuid"
            | "nodev"
            | "exec"
            | "noexec"
            | "atime"
            | "noatime"
            | "relatime"
            | "default_permissions"
    ) || o.starts_with("x-")
        || o.starts_with("comment=")
}

/// One `-o` list as the flags it stands for.
fn mount_option_flags(list: &str) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    for o in list.split(',').filter(|o| !o.is_empty()) {
        if generic_mount_option(o) {
            continue;
        }
        if o == "ro" {
            return Err("mount option 'ro': a worktreefs mount is always read-write (worktrees are for writing); leave it out".into());
        }
        let (key, value) = match o.split_once('=') {
            Some((k, v)) => (format!("{k}="), Some(v)),
            None => (o.to_string(), None),
        };
        let Some((_, flag)) = MOUNT_OPTIONS.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = MOUNT_OPTIONS
                .iter()
                .map(|(k, _)| k.trim_end_matches('='))
                .collect();
            return Err(format!(
                "unknown mount option '{o}'; worktreefs takes {} (and ignores mount(8)'s generic ones: rw, defaults, noauto, nofail, x-…)",
                known.join(", ")
            ));
        };
        flags.push(flag.to_string());
        if let Some(v) = value {
            if v.is_empty() {
                return Err(format!("mount option '{o}' needs a value"));
            }
            flags.push(v.to_string());
        }
    }
    Ok(flags)
}

/// The command line as clap should read it. `mount -o LIST` (and `-oLIST`) becomes the
/// flags it stands for. Run as a mount helper — as `mount.fuse.worktreefs` (or
/// `mount.worktreefs`), which mount(8) runs for `-t fuse.worktreefs` and fstab lines, or
/// as `worktreefs SOURCE MOUNTPOINT [-o …]`, as `mount.fuse3` runs a filesystem — the
/// arguments are `SOURCE MOUNTPOINT [-o LIST] [-s -f -n -v -w] [-t TYPE]`, SOURCE the
/// state directory (`worktreefs` or `none`: the default one).
fn mount_command_line(args: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    use std::ffi::OsString;
    let Some(argv0) = args.first().cloned() else {
        return Ok(args);
    };
    let base = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let helper_name = base == "mount.fuse.worktreefs" || base == "mount.worktreefs";
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let as_mount_fuse = first
        .as_deref()
        .is_some_and(|f| (f.starts_with('/') || f.starts_with('.')) && args.len() >= 3);
    let mut out: Vec<OsString> = vec![argv0];
    let mut rest = args.into_iter().skip(1).peekable();
    if helper_name || as_mount_fuse {
        let (Some(source), Some(mountpoint)) = (rest.next(), rest.next()) else {
            return Err("as a mount helper: SOURCE MOUNTPOINT [-o OPTIONS] (SOURCE: the state directory, or `worktreefs` for the default one)".into());
        };
        out.push("mount".into());
        out.push(mountpoint);
        if source != "worktreefs" && source != "none" {
            out.push("--state-dir".into());
            out.push(source);
        }
        while let Some(a) = rest.next() {
            let a = a.to_string_lossy().into_owned();
            match a.as_str() {
                // mount(8)'s own: sloppy, fake, no mtab, verbose, read-write.
                "-s" | "-f" | "-n" | "-v" | "-w" => {}
                "-r" => return Err("mount option 'ro': a worktreefs mount is always read-write; leave it out".into()),
                "-t" => {
                    rest.next();
                }
                "-N" => return Err("mount -N (another mount namespace) is not supported: run the mount inside that namespace".into()),
                "-o" => {
                    let list = rest.next().ok_or("-o needs a list of options")?;
                    for f in mount_option_flags(&list.to_string_lossy())? {
                        out.push(f.into());
                    }
                }
                o if o.starts_with("-o") => {
                    for f in mount_option_flags(&o[2..])? {
                        out.push(f.into());
                    }
                }
                other => return Err(format!("as a mount helper: unexpected argument '{other}'")),
            }
        }
        return Ok(out);
    }
    // `worktreefs [GLOBAL…] mount … -o LIST …`: the options after `mount` expanded.
    let mut in_mount = false;
    while let Some(a) = rest.next() {
        let s = a.to_string_lossy().into_owned();
        if !in_mount {
            in_mount = s == "mount";
            out.push(a);
            continue;
        }
        if s == "--" {
            out.push(a);
            out.extend(rest);
            break;
        }
        if s == "-o" {
            let list = rest.next().ok_or("mount -o needs a list of options")?;
            out.extend(
                mount_option_flags(&list.to_string_lossy())?
                    .into_iter()
                    .map(OsString::from),
            );
        } else if let Some(list) = s.strip_prefix("-o") {
            out.extend(mount_option_flags(list)?.into_iter().map(OsString::from));
        } else {
            out.push(a);
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match mount_command_line(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("worktreefs: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    // A command that prints for a reader who may stop reading (`worktreefs list | head
    // -1`) ends by SIGPIPE as other tools do: Rust ignores the signal, and a print into a
    // closed pipe would panic. The commands that keep running for something (the daemon,
    // the MCP server, a run or a turn holding a lease, an unmount's cleanup) keep it
    // ignored and see the error.
    if !matches!(
        cli.command,
        Command::Mount { .. }
            | Command::Mcp
            | Command::Run { .. }
            | Command::Turn { .. }
            | Command::Lease(_)
            | Command::Unmount { .. }
    ) {
        // SAFETY: at startup, before any thread is made.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let is_daemon = matches!(
        cli.command,
        Command::Mount {
            foreground: true,
            ..
        }
    );
    let asked =
        cli.global.log_level.is_some() || std::env::var("RUST_LOG").is_ok_and(|v| !v.is_empty());
    if is_daemon || asked {
        logging::init(cli.global.log_level.as_deref());
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
        // Each FUSE worker's 16 MiB request buffer mapped apart: untouched, not resident,
        // until a request that big comes.
        worktreefs::heap::large_blocks_apart();
        // SAFETY: set before any repository is opened, as libgit2 requires.
        unsafe {
            let _ = git2::opts::set_mwindow_size(16 << 20);
            let _ = git2::opts::set_mwindow_mapped_limit(32 << 20);
        }
    }
    let json_to = json_wanted(&cli.command);
    // `turn --report FILE` is opened before anything else happens (before the turn enters
    // the worktree, so a relative path is the caller's), and written through that one
    // descriptor at the end, whatever becomes of the name meanwhile.
    if let Command::Turn {
        report: Some(path), ..
    } = &cli.command
    {
        match open_report(path) {
            Ok(f) => {
                let _ = REPORT.set(f);
            }
            Err(e) => {
                // As any failure of `turn`: with --json, the JSON is all stderr says.
                let message = report::for_people(&format!("{e:#}"));
                if json_to.is_some() {
                    eprintln!(
                        "{:#}",
                        serde_json::json!({"error": "failed", "message": message})
                    );
                } else {
                    eprintln!("worktreefs: {message}");
                }
                return ExitCode::from(1);
            }
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Any other failure of a command asked for JSON is JSON too: `failed`, with
            // the message people get (a typed refusal says more, with its own `error`).
            let failed;
            let mut refusal = e.downcast_ref::<report::Refusal>();
            if refusal.is_none() && json_to.is_some() {
                let message = report::for_people(&format!("{e:#}"));
                failed = report::Refusal {
                    json: serde_json::json!({"error": "failed", "message": message}),
                    message,
                    json_to,
                    code: e
                        .downcast_ref::<RunError>()
                        .and_then(RunError::shell_code)
                        .unwrap_or(1),
                };
                refusal = Some(&failed);
            }
            // A refusal as JSON on stderr (`run --json`) is all stderr says: parseable.
            if refusal.is_none_or(|r| r.json_to != Some(report::JsonTo::Stderr)) {
                tracing::debug!("{e:#}");
                eprintln!("worktreefs: {}", report::for_people(&format!("{e:#}")));
            }
            if REPORT.get().is_some() {
                let v = match refusal {
                    Some(r) if !r.json.is_null() => r.json.clone(),
                    _ => serde_json::json!({
                        "error": "failed",
                        "message": report::for_people(&format!("{e:#}")),
                    }),
                };
                write_report(&v);
            }
            match refusal {
                Some(r) => {
                    match r.json_to {
                        Some(report::JsonTo::Stdout) => println!("{:#}", r.json),
                        Some(report::JsonTo::Stderr) => eprintln!("{:#}", r.json),
                        None => {}
                    }
                    ExitCode::from(r.code)
                }
                None => ExitCode::from(
                    e.downcast_ref::<RunError>()
                        .and_then(RunError::shell_code)
                        .unwrap_or(1),
                ),
            }
        }
    }
}

/// Where a failure's JSON goes: `--json` was given (before any `--`, after which the
/// arguments are the command's), on stderr for `run` and `turn` (their stdout is the
/// command's), else on stdout.
fn json_wanted(command: &Command) -> Option<report::JsonTo> {
    let asked = std::env::args()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if !asked {
        return None;
    }
    Some(match command {
        Command::Run { .. } | Command::Turn { .. } => report::JsonTo::Stderr,
        _ => report::JsonTo::Stdout,
    })
}

fn open_state(global: &Global) -> anyhow::Result<StateDir> {
    let root = StateDir::resolve(global.state_dir.clone());
    if fs::metadata(&root).is_ok_and(|m| !m.is_dir()) {
        bail!(
            "state dir {} is a file, not a directory; give --state-dir (or WORKTREEFS_STATE_DIR) a directory, or move the file away",
            root.display()
        );
    }
    StateDir::open(&root).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            anyhow!(
                "state dir {} cannot be used by this user (uid {}): {e}; run as its owner, or use a state dir of your own with --state-dir",
                root.display(),
                nix::unistd::geteuid()
            )
        } else {
            anyhow!("opening state dir {}: {e}", root.display())
        }
    })
}

fn open_store(state: &StateDir) -> anyhow::Result<Store> {
    Store::open_described(&state.root)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Neither needs (nor makes) a state directory.
    match &cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            let mut clap_script = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "worktreefs", &mut clap_script);
            print!(
                "{}",
                completion::script(*shell, String::from_utf8_lossy(&clap_script).into_owned())
            );
            return Ok(());
        }
        Command::Names { kind } => {
            completion::print_names(&StateDir::resolve(cli.global.state_dir.clone()), *kind);
            return Ok(());
        }
        Command::Man { dir } => return write_man_pages(dir),
        Command::Doctor { json } => {
            return cmd_doctor(&StateDir::resolve(cli.global.state_dir.clone()), *json)
        }
        _ => {}
    }
    // Only these make a state directory; the rest say there is none, and leave it so.
    let makes_state = matches!(
        cli.command,
        Command::Mount { .. } | Command::Repo(RepoCmd::Add { .. })
    );
    if !makes_state {
        let root = StateDir::resolve(cli.global.state_dir.clone());
        if let Err(e) = fs::symlink_metadata(&root) {
            if e.kind() == std::io::ErrorKind::NotFound {
                bail!(
                    "state dir {} does not exist: nothing is registered or mounted there yet; start with `worktreefs mount` inside a repository (or `worktreefs repo add PATH`), or pass the state dir you use with --state-dir",
                    root.display()
                );
            }
        }
    }
    // A state directory this command makes goes again if the command is refused: a
    // mount that could not be made leaves nothing that later commands take for one. Never
    // for a daemon (`--foreground` serves for days: its end is no refusal), and only while
    // it is still empty (another command may have started using it meanwhile).
    let daemon_itself = matches!(
        cli.command,
        Command::Mount {
            foreground: true,
            ..
        }
    );
    let fresh = makes_state && !daemon_itself && {
        let root = StateDir::resolve(cli.global.state_dir.clone());
        fs::symlink_metadata(&root).is_err()
    };
    let state = open_state(&cli.global)?;
    let result = run_in(cli, &state);
    if fresh && result.is_err() && unused(&state) {
        let _ = fs::remove_dir_all(&state.root);
    }
    result
}

/// Whether state directory `state` holds nothing of anyone's: no daemon serves it, and
/// its database (if any) has no repository and no worktree.
fn unused(state: &StateDir) -> bool {
    if daemon::running_daemon(state).is_some() {
        return false;
    }
    if !state.root.join(worktreefs::store::DB_FILE).exists() {
        return true;
    }
    Store::open(&state.root).is_ok_and(|s| {
        s.repos().is_ok_and(|r| r.is_empty()) && s.worktrees().is_ok_and(|w| w.is_empty())
    })
}

/// `run`, once the state directory is open.
fn run_in(cli: Cli, state: &StateDir) -> anyhow::Result<()> {
    let state = state.clone();
    match cli.command {
        Command::Mount {
            mountpoint,
            foreground,
            json,
            threads,
            linger,
            no_lease_tracking,
            no_passthrough,
            no_readdirplus,
            uring,
            xattr,
            cache_nodes,
            allow_other,
            filter_timeout,
            inspect_timeout,
            keep_removed,
            keep_min_free_percent,
            keep_min_free_gib,
            umount_keeps_sessions,
        } => cmd_mount(
            &state,
            mountpoint,
            (foreground, json),
            MountTuning {
                threads,
                linger,
                track_leases: !no_lease_tracking,
                passthrough: !no_passthrough,
                readdirplus: !no_readdirplus,
                uring,
                xattrs: xattr,
                cache_nodes,
                allow_other,
                filter_timeout,
                inspect_timeout,
                keep: (keep_removed, keep_min_free_percent, keep_min_free_gib),
                umount_keeps_sessions,
            },
            cli.global.log_level.as_deref(),
        ),
        Command::Unmount {
            lazy,
            keep_sessions,
            json,
        } => cmd_unmount(&state, lazy, keep_sessions, json),
        Command::Retained { json } => {
            let store = open_store(&state)?;
            let rows = store.retained()?;
            if json {
                let v: Vec<_> = rows.iter().map(report::retained_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let now = worktreefs::store::now_secs();
                let mut t = Table::new(&["WORKTREE", "BRANCH", "SINCE", "REASON"]);
                for r in rows {
                    t.row([
                        format!("{}/{}", r.repo, r.worktree),
                        r.branch.as_deref().unwrap_or("(detached)").to_string(),
                        report::when(r.entered_at, now),
                        format!(
                            "{}{}",
                            r.reason,
                            r.holder_reason
                                .as_deref()
                                .map(|h| format!(" (holder: {h})"))
                                .unwrap_or_default()
                        ),
                    ]);
                }
                print!("{}", report::listing(&t, "no retained worktrees"));
            }
            Ok(())
        }
        Command::Reclaim {
            target,
            discard,
            wait,
            json,
        } => cmd_reclaim(
            &state,
            &which(&state, Some(&target), true)?,
            discard,
            wait,
            json,
        ),
        Command::Removed { json } => cmd_removed(&state, json),
        Command::Restore {
            target,
            as_name,
            id,
            json,
        } => cmd_restore(
            &state,
            &which(&state, Some(&target), true)?,
            as_name.as_deref(),
            id,
            json,
        ),
        Command::Repo(RepoCmd::Add {
            path,
            name,
            include,
            warm_default,
            json,
        }) => {
            let store = open_store(&state)?;
            let row = add_repo(&store, &path, name.as_deref())?;
            if !include.is_empty() || warm_default {
                store.set_repo_warm(
                    row.id,
                    (!include.is_empty()).then_some(&include[..]),
                    Some(warm_default),
                )?;
            }
            daemon::enable_fsmonitor(&store);
            daemon::poke(&state);
            if json {
                let row = store.repo_by_id(row.id)?.unwrap_or(row);
                println!("{:#}", report::repo_json(&row));
                return Ok(());
            }
            println!(
                "registered repository '{}' -> {}",
                row.name,
                row.path.display()
            );
            Ok(())
        }
        Command::Repo(RepoCmd::Set {
            name,
            include,
            no_include,
            warm_default,
            json,
        }) => {
            let store = open_store(&state)?;
            let repo = store.repo_by_name(&name)?.ok_or_else(|| {
                anyhow!("repository '{name}' is not registered (see `worktreefs repo list`)")
            })?;
            if include.is_empty() && !no_include && warm_default.is_none() {
                bail!("nothing to set for '{name}': give --include PATTERN…, --no-include or --warm-default true|false");
            }
            let patterns = (!include.is_empty() || no_include).then_some(&include[..]);
            store.set_repo_warm(repo.id, patterns, warm_default)?;
            let repo = store.repo_by_id(repo.id)?.expect("just set");
            if json {
                println!("{:#}", report::repo_json(&repo));
                return Ok(());
            }
            println!(
                "repository '{name}': include {}; new worktrees are {} by default (a new snapshot: `worktreefs warm {name}`)",
                if repo.include.is_empty() {
                    "only what .worktreeinclude names".to_string()
                } else {
                    repo.include.join(" ")
                },
                if repo.warm_default { "warm" } else { "cold" }
            );
            Ok(())
        }
        Command::Warm { repo, json } => {
            let mut store = open_store(&state)?;
            let row = store.repo_by_name(&repo)?.ok_or_else(|| {
                anyhow!("repository '{repo}' is not registered (see `worktreefs repo list`)")
            })?;
            let taken = warm::take(
                &state,
                &mut store,
                &row,
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )?;
            // The snapshot it supersedes goes now if no worktree shows it.
            let pruned = prune_warm(&state, &mut store);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "snapshot": report::snapshot_json(&taken.row),
                        "links": taken.links,
                        "patterns": taken.patterns,
                        "unmatched": taken.unmatched,
                        "skipped": taken.skipped.iter().map(|(path, reason)| serde_json::json!({"path": path, "reason": reason})).collect::<Vec<_>>(),
                        "deleted": pruned.as_ref().map(|p| p.snapshots.iter().map(|w| w.id).collect::<Vec<_>>()).unwrap_or_default(),
                    }))?
                );
            } else {
                print_taken(&repo, &taken);
                println!(
                    "worktrees made from now on with --warm show it; those made before keep theirs"
                );
                if let Some(p) = pruned.filter(|p| !p.snapshots.is_empty()) {
                    println!(
                        "deleted {} older snapshot(s) no worktree shows ({} contents, {})",
                        p.snapshots.len(),
                        p.blobs,
                        worktreefs::report::human_bytes(p.bytes)
                    );
                }
            }
            Ok(())
        }
        Command::Repo(RepoCmd::List { json }) => {
            let store = open_store(&state)?;
            let repos = store.repos()?;
            if json {
                let v: Vec<_> = repos.iter().map(report::repo_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = Table::new(&["REPO", "PATH"]);
                for r in repos {
                    t.row([r.name, r.path.display().to_string()]);
                }
                print!(
                    "{}",
                    report::listing(
                        &t,
                        "no repositories (register one with `worktreefs repo add PATH`)"
                    )
                );
            }
            Ok(())
        }
        Command::Repo(RepoCmd::Remove { name, json }) => {
            let mut store = open_store(&state)?;
            let repo = store.repo_by_name(&name)?.ok_or_else(|| {
                anyhow!("repository '{name}' is not registered (see `worktreefs repo list`)")
            })?;
            let n = store.worktree_count(repo.id)?;
            if n > 0 {
                let left: Vec<String> = store
                    .worktrees()?
                    .into_iter()
                    .filter(|w| w.repo_id == repo.id && w.state != State::Removed)
                    .map(|w| format!("{}/{} ({})", w.repo, w.name, w.state))
                    .collect();
                let mut v = report::repo_json(&repo);
                v["error"] = "has-worktrees".into();
                v["worktrees"] = left.clone().into();
                return Err(report::Refusal {
                    message: format!(
                        "repository '{name}' still has {n} worktree{}: {}; remove {} first (`worktreefs reclaim REPO/WT`, `--discard` to throw away what one holds), then `worktreefs repo remove {name}` again",
                        if n == 1 { "" } else { "s" },
                        left.join(", "),
                        if n == 1 { "it" } else { "them" }
                    ),
                    json: v,
                    json_to: json.then_some(report::JsonTo::Stdout),
                    code: 1,
                }
                .into());
            }
            let purged =
                worktreefs::lifecycle::cleanup::keep::purge_repo(&state, &mut store, &name)?;
            if purged > 0 && !json {
                println!("purged {purged} kept removal(s) of '{name}'");
            }
            store.remove_repo(repo.id)?;
            // Its warm snapshots' manifests (`<repo id>-<uid>-<ns>`, and `.dirs`) no row
            // names now: a prune deletes them with the contents only they held. While a
            // snapshot is being taken a prune waits for the next: the manifests go now,
            // their contents stay in the cache.
            if prune_warm(&state, &mut store).is_none() {
                if let Ok(rd) = fs::read_dir(state.warm()) {
                    let prefix = format!("{}-", repo.id);
                    for e in rd.flatten() {
                        if e.file_name().to_string_lossy().starts_with(&prefix) {
                            let _ = fs::remove_file(e.path());
                        }
                    }
                }
            }
            if let Err(e) = worktreefs::git::fsmonitor::disable_for_repo(&repo.gitdir) {
                eprintln!(
                    "worktreefs: could not remove the fsmonitor include from {}/config: {e:#}; remove the includeIf section naming {}/worktreefs by hand",
                    repo.gitdir.display(),
                    repo.gitdir.display()
                );
            }
            daemon::poke(&state);
            if json {
                let mut v = report::repo_json(&repo);
                v["removed"] = true.into();
                v["purged"] = purged.into();
                println!("{v:#}");
                return Ok(());
            }
            println!("unregistered repository '{name}'");
            Ok(())
        }
        Command::New {
            target,
            base,
            branch,
            submodules,
            from,
            warm,
            cold,
            json,
        } => {
            let target = which(&state, Some(&target), true)?;
            let (repo, name) = target.split_once('/').ok_or_else(|| {
                anyhow!("'{target}' is not REPO/NAME; for example `worktreefs new myrepo/task-1`")
            })?;
            if let Some(from) = from {
                return cmd_fork(&state, repo, name, &from, branch.as_deref(), json);
            }
            let mut store = open_store(&state)?;
            let (uid, gid) = (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            );
            let repo_row = store.repo_by_name(repo)?;
            let mut took_snapshot = None;
            let snapshot = match repo_row {
                Some(r) if warm || (r.warm_default && !cold) => {
                    let (snap, taken) = warm::ensure(&state, &mut store, &r, uid, gid)?;
                    if let Some(t) = taken.as_ref().filter(|_| !json) {
                        print_taken(repo, t);
                    }
                    took_snapshot = taken.map(|t| t.took);
                    Some(snap)
                }
                _ => None,
            };
            let slow = Slow::start(format!("creating {repo}/{name}"));
            let note = |phase: &str| slow.note(phase);
            let row = create::create_worktree(
                &state,
                &mut store,
                &CreateRequest {
                    repo,
                    name,
                    base: base.as_deref(),
                    branch: branch.as_deref(),
                    uid: nix::unistd::geteuid().as_raw(),
                    gid: nix::unistd::getegid().as_raw(),
                    submodules,
                    warm: snapshot.as_ref(),
                    progress: Some(&note),
                },
            );
            slow.finish(row.is_ok());
            let row = row?;
            daemon::poke(&state);
            let mountpoint = create::mountpoint_of(&state, &store);
            if json {
                let mut v = report::worktree_json(&row, &mountpoint);
                if let Some(s) = &snapshot {
                    v["warm_snapshot_files"] = s.files.into();
                    v["warm_snapshot_bytes"] = s.bytes.into();
                    v["warm_snapshot_took_ms"] = took_snapshot.map(|d| d.as_millis() as u64).into();
                }
                println!("{v:#}");
                return Ok(());
            }
            println!(
                "created {}/{} on branch {} at {}{}",
                row.repo,
                row.name,
                row.branch.as_deref().unwrap_or("(detached)"),
                &row.base_commit[..12],
                match &snapshot {
                    Some(s) => format!(
                        " with warm snapshot {} ({} files, {})",
                        s.id,
                        s.files,
                        worktreefs::report::human_bytes(s.bytes)
                    ),
                    None => String::new(),
                }
            );
            print_cd(&state, &mountpoint.join(&row.repo).join(&row.name));
            Ok(())
        }
        Command::List { json } => {
            let store = open_store(&state)?;
            let rows = store.worktrees()?;
            let mountpoint = create::mountpoint_of(&state, &store);
            let inside = inside_counts(&state);
            if json {
                let out: Vec<_> = rows
                    .iter()
                    .map(|w| {
                        let mut v = report::worktree_json(w, &mountpoint);
                        v["processes_inside"] = inside(w).into();
                        v
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                print!(
                    "{}",
                    worktreefs::report::status_table(&rows, &store.leases()?, Some(&inside))
                );
            }
            Ok(())
        }
        Command::Lease(cmd) => cmd_lease(&state, cmd),
        Command::Run {
            target,
            session,
            exclusive,
            wait,
            json,
            command,
        } => cmd_run(
            &state,
            &which(&state, target.as_deref(), false)?,
            &RunAsk {
                session: session.as_deref(),
                exclusive,
                wait,
                json,
            },
            &command,
        ),
        Command::Turn {
            target,
            session,
            guard,
            wait,
            timeout,
            json,
            command,
            ..
        } => cmd_turn(
            &state,
            &which(&state, target.as_deref(), false)?,
            &TurnAsk {
                session: &session,
                guard,
                wait,
                timeout,
                json,
            },
            &command,
        ),
        Command::Turns {
            action:
                Some(TurnsCmd::End {
                    target,
                    session,
                    wait,
                    json,
                }),
            ..
        } => cmd_turn_end(
            &state,
            &which(&state, target.as_deref(), false)?,
            session.as_deref(),
            wait,
            json,
        ),
        Command::Turns { json, action: None } => {
            let store = open_store(&state)?;
            let rows = store.turns()?;
            let mountpoint = create::mountpoint_of(&state, &store);
            if json {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|t| report::turn_json(t, &mountpoint))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let now = worktreefs::store::now_secs();
                let mut table =
                    Table::new(&["WORKTREE", "SESSION", "PID", "GUARD", "SINCE", "COMMAND"])
                        .right(2);
                for t in rows {
                    table.row([
                        format!("{}/{}", t.repo, t.worktree),
                        t.session.clone(),
                        t.pid.to_string(),
                        if t.guard { "yes" } else { "no" }.to_string(),
                        report::when(t.started_at, now),
                        t.command.clone(),
                    ]);
                }
                print!("{}", report::listing(&table, "no turns running"));
            }
            Ok(())
        }
        Command::Leases { json } => {
            let store = open_store(&state)?;
            let rows = store.leases()?;
            if json {
                let v: Vec<_> = rows.iter().map(report::lease_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let now = worktreefs::store::now_secs();
                let mut t = Table::new(&["LEASE", "KIND", "HOLDER", "SINCE"]);
                for l in rows {
                    t.row([
                        l.entry_name(),
                        l.holder_kind.clone(),
                        l.holder_label().to_string(),
                        report::when(l.acquired_at, now),
                    ]);
                }
                print!("{}", report::listing(&t, "no leases"));
            }
            Ok(())
        }
        Command::Completions { .. }
        | Command::Man { .. }
        | Command::Doctor { .. }
        | Command::Names { .. } => {
            unreachable!("answered above")
        }
        Command::Mcp => mcp::serve(state.root.clone()),
        Command::Du { target, json } => cmd_du(&state, target.as_deref(), json),
        Command::Events { json, follow, last } => {
            let store = open_store(&state)?;
            // `--last 0`: no past event (with --follow, only those from now on).
            let mut after = store.last_event_id()?;
            let mut batch = if last > 0 {
                store.events(0, last)?
            } else {
                Vec::new()
            };
            let mut header_said = false;
            loop {
                if json {
                    for e in &batch {
                        println!("{}", report::event_json(e));
                    }
                } else if !batch.is_empty() {
                    // Columns sized to each batch (the header once, with the first).
                    let mut t = Table::new(&["AT", "EVENT", "WORKTREE", "HOLDER", "REASON"]);
                    for e in &batch {
                        t.row([
                            report::rfc3339(e.at),
                            e.kind.clone(),
                            format!(
                                "{}/{}",
                                e.repo.as_deref().unwrap_or("-"),
                                e.worktree.as_deref().unwrap_or("-")
                            ),
                            e.holder.clone().unwrap_or_default(),
                            e.reason.clone().unwrap_or_default(),
                        ]);
                    }
                    let text = t.render();
                    let skip = if header_said {
                        text.find('\n').map_or(0, |i| i + 1)
                    } else {
                        0
                    };
                    print!("{}", &text[skip..]);
                    header_said = true;
                }
                if let Some(e) = batch.last() {
                    after = e.id;
                }
                if !follow {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(200));
                batch = store.events(after, 10_000)?;
            }
        }
        Command::Status { json } => {
            let store = open_store(&state)?;
            let rows = store.worktrees()?;
            let daemon = daemon::running_daemon(&state);
            let detached = daemon.as_ref().is_some_and(|d| daemon::detached(&state, d));
            if json {
                let at = create::mountpoint_of(&state, &store);
                let v = serde_json::json!({
                    "state_dir": state.root,
                    "mountpoint": daemon.as_ref().filter(|_| !detached).map(|d| d.mountpoint.clone()),
                    "detached": detached,
                    "daemon_pid": daemon.as_ref().map(|d| d.pid),
                    "worktrees": rows.iter().map(|w| report::worktree_json(w, &at)).collect::<Vec<_>>(),
                    "leases": store.leases()?.iter().map(report::lease_json).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                match daemon {
                    Some(d) if detached => println!("{}", daemon::detached_message(&d)),
                    Some(d) => println!(
                        "mounted at {} (daemon pid {})",
                        d.mountpoint.display(),
                        d.pid
                    ),
                    None => println!("not mounted (state dir {})", state.root.display()),
                }
                let inside = inside_counts(&state);
                print!(
                    "{}",
                    worktreefs::report::status_table(&rows, &store.leases()?, Some(&inside))
                );
            }
            Ok(())
        }
    }
}

/// How many processes are inside each worktree of the mount serving `state` (working
/// directory, open file…, as unmount counts them; a bare `cd` takes no lease): 0 for all
/// when nothing is mounted.
fn inside_counts(state: &StateDir) -> impl Fn(&worktreefs::store::WorktreeRow) -> usize {
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

fn cmd_doctor(root: &Path, json: bool) -> anyhow::Result<()> {
    use worktreefs::daemon::doctor::{self, Status};
    let checks = doctor::run(root);
    if json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for c in &checks {
            println!("{:<4} {:<16} {}", c.status.as_str(), c.check, c.detail);
            if let Some(f) = &c.fix {
                println!("{:<21} fix: {f}", "");
            }
        }
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.check.as_str())
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    // Said already, check by check: the exit code is what is left to say.
    Err(report::Refusal {
        message: format!("{} check(s) failed: {}", failed.len(), failed.join(", ")),
        json: serde_json::Value::Null,
        json_to: None,
        code: 1,
    }
    .into())
}

fn cmd_du(state: &StateDir, target: Option<&str>, json: bool) -> anyhow::Result<()> {
    use worktreefs::report::human_bytes;
    let given = match target {
        Some(t) => Some(which(state, Some(t), false)?),
        // Inside a worktree: that one; elsewhere: everything.
        None => which(state, None, false).ok(),
    };
    let only = given.as_deref().and_then(|t| t.split_once('/'));
    let store = open_store(state)?;
    let r = worktreefs::daemon::du::report(state, &store, only)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = Table::new(&["WORKTREE", "STATE", "DISK", "ENTRIES"])
        .right(2)
        .right(3);
    for w in &r.worktrees {
        t.row([
            w.worktree.clone(),
            w.state.to_string(),
            human_bytes(w.usage.bytes),
            w.usage.entries.to_string(),
        ]);
    }
    print!("{}", t.render());
    if only.is_some() {
        return Ok(());
    }
    let sum = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
    println!(
        "kept removals: {} in {} (`worktreefs removed`)",
        human_bytes(sum(&mut r.removed.iter().map(|k| k.usage.bytes))),
        r.removed.len()
    );
    println!(
        "shared: content store {}, warm snapshots {}, index cache {}; database {}; being deleted {}",
        human_bytes(r.blobs.bytes),
        human_bytes(r.warm.bytes),
        human_bytes(r.index_cache.bytes),
        human_bytes(r.database.bytes),
        human_bytes(r.trash.bytes)
    );
    println!(
        "total {} in {} (each file once; the mount is not counted)",
        human_bytes(r.total.bytes),
        r.state_dir.display()
    );
    Ok(())
}

fn cmd_unmount(
    state: &StateDir,
    lazy: bool,
    keep_sessions: bool,
    json: bool,
) -> anyhow::Result<()> {
    let store = open_store(state)?;
    let since = store.last_event_id()?;
    drop(store);
    // What cleanup does, a line per worktree as it goes (read from the events the daemon
    // writes meanwhile), numbered when there are many; with --json, kept for the outcome.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = {
        let stop = stop.clone();
        let root = state.root.clone();
        std::thread::spawn(move || {
            let mut cleaned = Vec::new();
            let Ok(store) = Store::open(&root) else {
                return cleaned;
            };
            let (mut after, mut to_clean, mut done) = (since, 0usize, 0usize);
            loop {
                let last = stop.load(std::sync::atomic::Ordering::SeqCst);
                for e in store.events(after, 10_000).unwrap_or_default() {
                    after = e.id;
                    let target = format!(
                        "{}/{}",
                        e.repo.as_deref().unwrap_or("-"),
                        e.worktree.as_deref().unwrap_or("-")
                    );
                    if e.kind == State::Deleting.as_str() {
                        to_clean += 1;
                    } else if json
                        && (e.kind == State::Removed.as_str() || e.kind == State::Retained.as_str())
                    {
                        cleaned.push(serde_json::json!({
                            "worktree": target,
                            "repo": e.repo,
                            "name": e.worktree,
                            "state": e.kind,
                            "reason": e.reason,
                            "at": report::rfc3339(e.at),
                        }));
                    } else if e.kind == State::Removed.as_str()
                        || e.kind == State::Retained.as_str()
                    {
                        if done == 0 && to_clean >= PROGRESS_FROM {
                            println!("cleaning up {to_clean} worktrees left without a lease");
                        }
                        done += 1;
                        let count = if to_clean >= PROGRESS_FROM {
                            format!("[{done}/{}] ", to_clean.max(done))
                        } else {
                            String::new()
                        };
                        println!(
                            "  {count}{target}: {} ({})",
                            e.kind,
                            e.reason.as_deref().unwrap_or("")
                        );
                    }
                }
                if last {
                    return cleaned;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Its refusals (`not-mounted`, `in-use`) are typed: JSON on stdout with --json.
    let outcome = daemon::unmount(
        state,
        lazy,
        daemon::AtUnmount::from_keep_sessions(keep_sessions),
        Duration::from_secs(300),
    )
    .map_err(|e| match e.downcast::<report::Refusal>() {
        Ok(mut r) => {
            r.json_to = json.then_some(report::JsonTo::Stdout);
            r.into()
        }
        Err(e) => e,
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let cleaned = progress.join().unwrap_or_default();
    if json {
        let v = match outcome? {
            daemon::Unmounted::Done(m) => serde_json::json!({
                "outcome": "unmounted",
                "mountpoint": m,
                "inside": [],
                "cleaned": cleaned,
            }),
            daemon::Unmounted::Detached(m, inside) => serde_json::json!({
                "outcome": "detached",
                "mountpoint": m,
                "inside": inside,
                "cleaned": cleaned,
            }),
        };
        println!("{v:#}");
        return Ok(());
    }
    match outcome? {
        daemon::Unmounted::Done(m) => println!("unmounted {}", m.display()),
        daemon::Unmounted::Detached(m, inside) => {
            println!(
                "detached {}; {} process(es) still inside: {}",
                m.display(),
                inside.len(),
                inside.join(", ")
            );
            println!("  cleanup runs in the background once they leave (see `worktreefs events`)");
        }
    }
    Ok(())
}

/// Says on stderr what a step that has taken over a second (`WORKTREEFS_PROGRESS_AFTER_MS`)
/// is doing, and each next thing it does, so long work is not silent; nothing when it is
/// quick.
struct Slow {
    what: String,
    started: std::time::Instant,
    after: Duration,
    shared: std::sync::Arc<parking_lot::Mutex<SlowState>>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct SlowState {
    phase: Option<String>,
    said: Option<String>,
    done: bool,
}

impl Slow {
    fn start(what: String) -> Slow {
        let after = std::env::var("WORKTREEFS_PROGRESS_AFTER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(1), Duration::from_millis);
        let started = std::time::Instant::now();
        let shared = std::sync::Arc::new(parking_lot::Mutex::new(SlowState::default()));
        let watcher = {
            let shared = shared.clone();
            let what = what.clone();
            std::thread::spawn(move || loop {
                {
                    let mut s = shared.lock();
                    if s.done {
                        return;
                    }
                    if started.elapsed() >= after && s.phase.is_some() && s.phase != s.said {
                        eprintln!("worktreefs: {what}: {}…", s.phase.as_deref().unwrap_or(""));
                        s.said = s.phase.clone();
                    }
                }
                // Woken at once by `finish` (a creation must not wait out the tick).
                std::thread::park_timeout(Duration::from_millis(20));
            })
        };
        Slow {
            what,
            started,
            after,
            shared,
            watcher: Some(watcher),
        }
    }

    /// What it does now: said at once when past the threshold, else by the watcher if
    /// it is still doing it then.
    fn note(&self, phase: &str) {
        let mut s = self.shared.lock();
        s.phase = Some(phase.to_string());
        if self.started.elapsed() >= self.after {
            eprintln!("worktreefs: {}: {phase}…", self.what);
            s.said = s.phase.clone();
        }
    }

    /// Ends the watcher; says how long it took if it said anything.
    fn finish(mut self, ok: bool) {
        self.shared.lock().done = true;
        if let Some(w) = self.watcher.take() {
            w.thread().unpark();
            let _ = w.join();
        }
        if ok && self.shared.lock().said.is_some() {
            eprintln!(
                "worktreefs: {}: done in {:.1} s",
                self.what,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// From how many worktrees to clean up unmount numbers its lines (`[3/14] …`).
const PROGRESS_FROM: usize = 4;

fn cmd_reclaim(
    state: &StateDir,
    target: &str,
    discard: bool,
    wait: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    use worktreefs::daemon::socket::Answer;
    let (repo, name) = split_target(target)?;
    let mut store = open_store(state)?;
    let mountpoint = create::mountpoint_of(state, &store);
    // Nobody may hold it: refused as an exclusive lease is, naming each holder, once the
    // leases of holders that have exited or left are released (and after `--wait`).
    if let Some(row) = store
        .worktree(repo, name)?
        .filter(|w| w.state != State::Removed)
    {
        use worktreefs::lifecycle::occupancy;
        let path = worktreefs::target::physical(&mountpoint)
            .join(repo)
            .join(name);
        // With no daemon, nobody else releases the leases of holders that are gone: this
        // command does, where it can tell (the leases' pid namespace is its own).
        let no_daemon =
            daemon::running_daemon(state).is_none() && daemon::leases_in_this_pid_namespace(state);
        let me = std::process::id() as i32;
        let started = std::time::Instant::now();
        let deadline = started
            .checked_add(Duration::from_secs(wait.unwrap_or(0)))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400));
        loop {
            let held = occupancy::holders_now(&mut store, &row, &path, me, no_daemon)?;
            if held.is_empty() {
                break;
            }
            if std::time::Instant::now() < deadline {
                std::thread::sleep(WAIT_POLL);
                continue;
            }
            let mut r = occupancy::refusal(
                repo,
                name,
                &held,
                wait.map(|_| started.elapsed().as_secs()),
                worktreefs::store::now_secs(),
            );
            r.json_to = json.then_some(report::JsonTo::Stdout);
            return Err(r.into());
        }
    }
    // Through the live daemon when one serves this state dir (it alone sees the leases
    // it keeps in memory), else here.
    let mut result = None;
    let mut discarded = Vec::new();
    daemon::socket::reclaim(state, repo, name, discard, &mut |a| match a {
        Answer::Discarding { lines } => {
            if json {
                discarded.extend(lines.iter().cloned());
            } else {
                println!("discarding from {repo}/{name}:");
                for l in lines {
                    println!("  {l}");
                }
            }
        }
        other => result = Some(other.clone()),
    })?;
    daemon::poke(state);
    // The outcome as JSON: the worktree as it is now, what happened, and why.
    let outcome = |what: &str, detail: Option<&str>| {
        let mut v = match store.worktree(repo, name).ok().flatten() {
            Some(w) => report::worktree_json(&w, &mountpoint),
            None => serde_json::json!({
                "worktree": format!("{repo}/{name}"),
                "repo": repo,
                "name": name,
                "path": null,
                "state": null,
            }),
        };
        v["outcome"] = what.into();
        v["detail"] = detail.into();
        if discard {
            v["discarded"] = discarded.clone().into();
        }
        v
    };
    let refusal = |what: &str, detail: &str, message: String| -> anyhow::Error {
        let mut v = outcome(what, Some(detail));
        v["error"] = what.into();
        report::Refusal {
            message,
            json: v,
            json_to: json.then_some(report::JsonTo::Stdout),
            code: 1,
        }
        .into()
    };
    match &result {
        Some(Answer::Removed { detail }) => {
            if json {
                println!("{:#}", outcome("removed", Some(detail)));
            } else {
                println!("removed {repo}/{name}: {detail}");
            }
            Ok(())
        }
        Some(Answer::Retained { reason }) => Err(refusal("retained", reason, format!(
            "worktree '{repo}/{name}' could not be removed and is retained with its files: {reason}; see {}",
            state.log_file().display()
        ))),
        Some(Answer::HoldsWork { reason }) => Err(refusal("holds-work", reason, format!(
            "worktree '{repo}/{name}' holds work and stays: {reason}; commit and push it (cd {}), or throw it away with `worktreefs reclaim {repo}/{name} --discard`",
            mountpoint.join(repo).join(name).display()
        ))),
        // Named as every other command names them: `not-found` (with the close name in
        // `did_you_mean`) or `removed`; nothing to reclaim is not a conflict (exit 1).
        Some(Answer::Gone { message }) => {
            let now = open_store(state)?;
            let removed = now
                .worktree(repo, name)?
                .is_some_and(|w| w.state == State::Removed);
            if removed {
                let e = refusal("removed", message, format!(
                    "worktree '{repo}/{name}' is already removed, so there is nothing to reclaim; bring it back with `worktreefs restore {repo}/{name}` (see `worktreefs removed`)"
                ));
                // `error` as every command names a removed worktree; `outcome` never
                // reads as this call's removal.
                let mut r = e.downcast::<report::Refusal>().expect("a refusal");
                r.json["outcome"] = "already-removed".into();
                r.json["detail"] = format!("worktree {repo}/{name} is already removed").into();
                return Err(r.into());
            }
            let hint = did_you_mean(&now, repo, name);
            let e = refusal("not-found", message, format!(
                "worktree '{repo}/{name}' does not exist{hint}; see `worktreefs list` and `worktreefs retained`"
            ));
            if hint.is_empty() {
                return Err(e);
            }
            let mut r = e.downcast::<report::Refusal>().expect("a refusal");
            r.json["did_you_mean"] = did_you_mean_field(&hint).into();
            Err(r.into())
        }
        Some(Answer::Busy { message }) => Err(refusal("busy", message, message.clone())),
        Some(Answer::Error { message }) => Err(refusal("error", message, message.clone())),
        Some(Answer::Discarding { .. }) | None => {
            bail!("reclaim of {repo}/{name} ended without an answer")
        }
    }
}

/// The kept removals as JSON objects: the row and where the copy is, when it goes.
fn kept_json(
    state: &StateDir,
    rows: &[worktreefs::store::KeptRow],
    keep_secs: i64,
) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|k| report::kept_json(k, keep_secs, Some(&state.removed_dir(k.worktree_id))))
        .collect()
}

fn cmd_removed(state: &StateDir, json: bool) -> anyhow::Result<()> {
    let store = open_store(state)?;
    let rows = store.kept()?;
    let policy = KeepPolicy::of(&store);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&kept_json(state, &rows, policy.keep_secs))?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no removed worktree is kept");
        return Ok(());
    }
    print!(
        "{}",
        worktreefs::report::kept_table(&rows, policy.keep_secs, worktreefs::store::now_secs())
    );
    println!(
        "restore one with `worktreefs restore REPO/WT` (--as NAME if the name is in use again)"
    );
    Ok(())
}

fn cmd_restore(
    state: &StateDir,
    target: &str,
    as_name: Option<&str>,
    id: Option<i64>,
    json: bool,
) -> anyhow::Result<()> {
    use worktreefs::lifecycle::restore::{restore_worktree, RestoreRequest};
    let (repo, name) = target.split_once('/').ok_or_else(|| {
        anyhow!("'{target}' is not REPO/NAME; for example `worktreefs restore myrepo/task-1` (see `worktreefs removed`)")
    })?;
    let mut store = open_store(state)?;
    let done = restore_worktree(
        state,
        &mut store,
        &RestoreRequest {
            repo,
            name,
            as_name,
            id,
        },
    )?;
    daemon::poke(state);
    let mountpoint = create::mountpoint_of(state, &store);
    let path = mountpoint.join(&done.row.repo).join(&done.row.name);
    if json {
        let mut v = report::worktree_json(&done.row, &mountpoint);
        v["restored_from"] = done.from.worktree_id.into();
        v["notes"] = done.notes.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "restored {repo}/{name} as {}/{} ({} kept, removed {} ago) on {}",
        done.row.repo,
        done.row.name,
        worktreefs::lifecycle::cleanup::keep::human_bytes(done.from.bytes.max(0) as u64),
        worktreefs::report::age(worktreefs::store::now_secs() - done.from.kept_at),
        match &done.row.branch {
            Some(b) => format!("branch {b}"),
            None => format!("a detached HEAD at {}", done.from.head.trim()),
        }
    );
    for n in &done.notes {
        println!("  {n}");
    }
    print_cd(state, &path);
    Ok(())
}

/// Where to go next for a worktree just made or brought back.
/// `new REPO/NAME --from PARENT`.
fn cmd_fork(
    state: &StateDir,
    repo: &str,
    name: &str,
    from: &str,
    branch: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let parent = match from.split_once('/') {
        Some((r, p)) if r == repo => p,
        Some((r, _)) => bail!(
            "--from {from} is a worktree of repository '{r}', not '{repo}'; a fork stays in its parent's repository: `worktreefs new {r}/{name} --from {from}`"
        ),
        None => from,
    };
    let mut store = open_store(state)?;
    let forked = worktreefs::lifecycle::fork::fork_worktree(
        state,
        &mut store,
        &worktreefs::lifecycle::fork::ForkRequest {
            repo,
            name,
            from: parent,
            branch,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
    )?;
    daemon::poke(state);
    let c = &forked.copied;
    if json {
        let mountpoint = create::mountpoint_of(state, &store);
        let mut v = report::worktree_json(&forked.row, &mountpoint);
        v["forked_from"] = format!("{repo}/{parent}").into();
        v["head"] = forked.head.to_string().into();
        v["copied"] = serde_json::json!({
            "files": c.files,
            "bytes": c.bytes,
            "dirs": c.dirs,
            "other": c.other,
            "took_ms": c.took.as_millis() as u64,
        });
        v["notes"] = forked.notes.clone().into();
        println!("{v:#}");
        return Ok(());
    }
    println!(
        "forked {repo}/{parent} as {}/{} on branch {} at {} (copied {} file(s), {}, {} dir(s), {} other entries, in {} ms)",
        forked.row.repo,
        forked.row.name,
        forked.row.branch.as_deref().unwrap_or("(detached)"),
        &forked.head.to_string()[..12],
        c.files,
        worktreefs::report::human_bytes(c.bytes),
        c.dirs,
        c.other,
        c.took.as_millis()
    );
    for n in &forked.notes {
        println!("  note: {n}");
    }
    let mountpoint = create::mountpoint_of(state, &store);
    print_cd(
        state,
        &mountpoint.join(&forked.row.repo).join(&forked.row.name),
    );
    Ok(())
}

fn print_cd(state: &StateDir, path: &Path) {
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

/// How a person runs this program again, for next steps printed to be run as they are:
/// `worktreefs` when that name on `PATH` is this very program, else this program's path;
/// with `--state-dir DIR` when `state` is not the one a bare command would use.
fn invocation(state: &StateDir) -> String {
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
    let bare = StateDir::resolve(std::env::var_os("WORKTREEFS_STATE_DIR").map(PathBuf::from));
    if fs::canonicalize(&bare).ok().as_ref() != Some(&state.root) {
        out.push_str(" --state-dir ");
        out.push_str(&shell_word(&state.root.display().to_string()));
    }
    out
}

/// The worktree a command means, as REPO/WT: `given` as such, or a path inside the mount
/// (read as text, never looked at there), or with nothing given the worktree the current
/// directory is in (`worktreefs::target`). `names_first`: one `/` is always REPO/WT (for
/// `new`, `reclaim` and `restore`, where a path must say it is one).
fn which(state: &StateDir, given: Option<&str>, names_first: bool) -> anyhow::Result<String> {
    use worktreefs::target;
    // Not a path, nor REPO/WT: the command's own check says what it takes.
    if names_first && given.is_some_and(|g| !g.contains('/')) {
        return Ok(given.unwrap_or_default().to_string());
    }
    let store = open_store(state)?;
    let recorded = create::mountpoint_of(state, &store);
    let mut mounts = vec![target::physical(&recorded), recorded];
    if let Some(d) = daemon::running_daemon(state) {
        mounts.push(target::physical(&d.mountpoint));
        mounts.push(d.mountpoint);
    }
    mounts.dedup();
    let repos: Vec<String> = store.repos()?.into_iter().map(|r| r.name).collect();
    let cwd = std::env::current_dir().ok();
    target::resolve(given, cwd.as_deref(), &mounts, &|r| {
        names_first || repos.iter().any(|x| x == r)
    })
    .map_err(|e| anyhow!(e))
}

fn split_target(target: &str) -> anyhow::Result<(&str, &str)> {
    target
        .split_once('/')
        .ok_or_else(|| anyhow!("'{target}' is not REPO/NAME; for example `worktreefs lease acquire myrepo/task-1 --session s1`"))
}

/// What a named acquisition asks: exclusive or not, how long to wait for the holders to
/// go, and where a refusal's JSON goes.
#[derive(Clone, Copy)]
struct Want {
    exclusive: bool,
    wait: Option<u64>,
    json_to: Option<report::JsonTo>,
}

/// How often a `--wait` looks again.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// A named acquisition of `row` (`repo/name`) by `lease`, as the `lease acquire` and
/// `run` commands ask it: refused for occupancy, after waiting up to `wait` seconds for
/// the holders to go, or for the worktree's state (deleting, removed), each a typed
/// refusal. Ok(false): the holder already had it.
fn acquire_named(
    state: &StateDir,
    store: &mut Store,
    (repo, name, row): (&str, &str, &worktreefs::store::WorktreeRow),
    lease: &worktreefs::store::NewLease,
    reason: &str,
    want: &Want,
) -> anyhow::Result<bool> {
    use worktreefs::store::{Ask, LeaseError};
    let Want {
        exclusive,
        wait,
        json_to,
    } = *want;
    let liveness = worktreefs::process::info::liveness_for(std::process::id() as i32);
    let ask = Ask {
        exclusive,
        liveness: &liveness,
    };
    let started = std::time::Instant::now();
    let deadline = wait.map(|s| {
        started
            .checked_add(Duration::from_secs(s))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400))
    });
    loop {
        match store.acquire_named(row.id, lease, reason, &ask) {
            Ok(inserted) => return Ok(inserted),
            Err(LeaseError::Occupied(mut o)) => {
                if deadline.is_some_and(|d| std::time::Instant::now() < d) {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                // A process holder's last activity is the daemon's (in memory).
                if let Some(d) = daemon::running_daemon(state) {
                    let dir = d.mountpoint.join(".control").join("leases");
                    for x in &mut o {
                        let at = fs::read_to_string(dir.join(x.lease.entry_name()))
                            .ok()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                            .and_then(|v| {
                                v["last_active_at"].as_str().and_then(report::parse_rfc3339)
                            });
                        if at.is_some() {
                            x.lease.active_at = at;
                        }
                    }
                }
                let command_now = |pid: i64| worktreefs::process::info::command_line(pid as i32);
                let mut r = report::occupied(
                    repo,
                    name,
                    &o,
                    exclusive,
                    wait.map(|_| started.elapsed().as_secs()),
                    worktreefs::store::now_secs(),
                    &command_now,
                );
                r.json_to = json_to;
                return Err(r.into());
            }
            Err(LeaseError::Conflict(_, st)) => {
                let mut r = report::unleasable(repo, name, Some(st));
                r.json_to = json_to;
                return Err(r.into());
            }
            Err(LeaseError::Db(e)) => return Err(e.into()),
        }
    }
}

/// " (did you mean REPO/W?)" when a worktree of `repo` that is not removed has a name
/// close to `name`, else "".
fn did_you_mean(store: &Store, repo: &str, name: &str) -> String {
    let rows = store.worktrees().unwrap_or_default();
    let names = rows
        .iter()
        .filter(|w| w.repo == repo && w.state != State::Removed)
        .map(|w| w.name.as_str());
    match worktreefs::names::closest(name, names) {
        Some(c) => format!(" (did you mean {repo}/{c}?)"),
        None => String::new(),
    }
}

/// The refusal of `repo/name`, which does not exist: `not-found`, with the closest name.
fn not_found(store: &Store, repo: &str, name: &str) -> report::Refusal {
    let mut r = report::unleasable(repo, name, None);
    let hint = did_you_mean(store, repo, name);
    if !hint.is_empty() {
        r.message = format!("worktree '{repo}/{name}' does not exist{hint}; see `worktreefs list`, or create it with `worktreefs new {repo}/{name}`");
        r.json["did_you_mean"] = did_you_mean_field(&hint).into();
    }
    r
}

/// The REPO/W of a [`did_you_mean`] hint, for JSON's `did_you_mean`.
fn did_you_mean_field(hint: &str) -> &str {
    hint.trim_start_matches(" (did you mean ")
        .trim_end_matches("?)")
}

/// The worktree `repo/name` for `run` or `turn`: refused as `lease acquire` refuses it
/// when it does not exist, is removed or is being deleted, before anything else is asked
/// (a mount would not help).
fn runnable_worktree(
    store: &Store,
    repo: &str,
    name: &str,
    json_to: Option<report::JsonTo>,
) -> anyhow::Result<worktreefs::store::WorktreeRow> {
    let row = leasable_worktree(store, repo, name, json_to)?;
    if matches!(row.state, State::Removed | State::Deleting) {
        let mut r = report::unleasable(repo, name, Some(row.state));
        r.json_to = json_to;
        return Err(r.into());
    }
    Ok(row)
}

/// The worktree `repo/name`, or a typed refusal naming the way out.
fn leasable_worktree(
    store: &Store,
    repo: &str,
    name: &str,
    json_to: Option<report::JsonTo>,
) -> anyhow::Result<worktreefs::store::WorktreeRow> {
    match store.worktree(repo, name)? {
        Some(row) => Ok(row),
        None => {
            let mut r = not_found(store, repo, name);
            r.json_to = json_to;
            Err(r.into())
        }
    }
}

fn cmd_lease(state: &StateDir, cmd: LeaseCmd) -> anyhow::Result<()> {
    let (target, session) = match &cmd {
        LeaseCmd::Acquire {
            target, session, ..
        } => (target, session),
        LeaseCmd::Release {
            target, session, ..
        } => (target, session),
    };
    worktreefs::lease::validate_session(session).map_err(|e| anyhow!(e))?;
    let target = which(state, target.as_deref(), false)?;
    let (repo, name) = split_target(&target)?;
    let mut store = open_store(state)?;
    let lease = worktreefs::store::NewLease::Session {
        id: session.clone(),
    };
    if let LeaseCmd::Acquire {
        exclusive,
        wait,
        json,
        ..
    } = cmd
    {
        let json_to = json.then_some(report::JsonTo::Stdout);
        let row = leasable_worktree(&store, repo, name, json_to)?;
        let reason = if exclusive {
            "named lease, exclusive"
        } else {
            "named lease"
        };
        let inserted = acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            reason,
            &Want {
                exclusive,
                wait,
                json_to,
            },
        )?;
        daemon::poke(state);
        if json {
            let held = store
                .leases()?
                .into_iter()
                .find(|l| l.worktree_id == row.id && l.holder == lease.holder());
            let now = store.worktree(repo, name)?.unwrap_or(row);
            let mut v = report::worktree_json(&now, &create::mountpoint_of(state, &store));
            v["session"] = session.as_str().into();
            v["exclusive"] = held.as_ref().is_some_and(|l| l.exclusive).into();
            v["new"] = inserted.into();
            v["acquired_at"] = held.as_ref().map(|l| report::rfc3339(l.acquired_at)).into();
            println!("{v:#}");
        } else if inserted {
            println!(
                "session {session} holds {repo}/{name}{}",
                if exclusive { " exclusively" } else { "" }
            );
        } else {
            println!(
                "session {session} already holds {repo}/{name}{}",
                if exclusive { " (exclusively now)" } else { "" }
            );
        }
        return Ok(());
    }
    let LeaseCmd::Release { reason, json, .. } = &cmd else {
        unreachable!("acquire returned above")
    };
    let json = *json;
    let Some(row) = store.worktree(repo, name)? else {
        // Nothing to release: said as `not-found`, with exit 1 (nothing was asked that
        // somebody else has; see the README's exit codes).
        let mut r = not_found(&store, repo, name);
        r.json["session"] = session.as_str().into();
        r.json_to = json.then_some(report::JsonTo::Stdout);
        r.code = 1;
        return Err(r.into());
    };
    if let Some(r) = reason {
        worktreefs::lease::validate_reason(r).map_err(|e| anyhow!(e))?;
    }
    let turn = store
        .turns()?
        .into_iter()
        .find(|t| t.worktree_id == row.id && t.session == *session);
    let released = match reason {
        Some(r) => store.release_with_reason(row.id, &lease.holder(), r)?,
        None => store.release_lease(row.id, &lease.holder(), "released", "named lease released")?,
    };
    if !released {
        let message = format!(
            "session {session} holds no lease on {repo}/{name} (state {}); nothing changed (see `worktreefs leases`)",
            row.state
        );
        let at = create::mountpoint_of(state, &store);
        let json_to = json.then_some(report::JsonTo::Stdout);
        return Err(report::refused(&row, &at, "not-held", Some(session), message, json_to).into());
    }
    if json {
        daemon::poke(state);
        let now = store.worktree(repo, name)?.unwrap_or(row);
        let mut v = report::worktree_json(&now, &create::mountpoint_of(state, &store));
        v["session"] = session.as_str().into();
        v["reason"] = reason.clone().into();
        v["turn_ended"] = turn.is_some().into();
        println!("{v:#}");
        return Ok(());
    }
    println!("session {session} released {repo}/{name}");
    if let Some(t) = turn {
        println!(
            "its turn (pid {}: {}) ended; the command was not stopped",
            t.pid, t.command
        );
    }
    daemon::poke(state);
    Ok(())
}

/// What `run` asks of its lease.
struct RunAsk<'a> {
    session: Option<&'a str>,
    exclusive: bool,
    wait: Option<u64>,
    json: bool,
}

fn cmd_run(
    state: &StateDir,
    target: &str,
    ask: &RunAsk<'_>,
    command: &[String],
) -> anyhow::Result<()> {
    let (repo, name) = split_target(target)?;
    let mut store = open_store(state)?;
    let json_to = ask.json.then_some(report::JsonTo::Stderr);
    let row = runnable_worktree(&store, repo, name, json_to)?;
    let Some(daemon) = daemon::running_daemon(state) else {
        return Err(not_mounted(state, &store, &row, ask.session, json_to).into());
    };
    let dir = daemon.mountpoint.join(repo).join(name);
    let reason = if ask.exclusive {
        "worktreefs run, exclusive"
    } else {
        "worktreefs run"
    };
    // A session's plain lease this run makes exclusive is made plain again at the end.
    let mut unexclusive = None;
    let named = match ask.session {
        Some(id) => {
            worktreefs::lease::validate_session(id).map_err(|e| anyhow!(e))?;
            let lease = worktreefs::store::NewLease::Session { id: id.to_string() };
            let was_plain = store
                .leases()?
                .iter()
                .any(|l| l.worktree_id == row.id && l.holder == lease.holder() && !l.exclusive);
            let inserted = acquire_named(
                state,
                &mut store,
                (repo, name, &row),
                &lease,
                reason,
                &Want {
                    exclusive: ask.exclusive,
                    wait: ask.wait,
                    json_to,
                },
            )?;
            if ask.exclusive && was_plain {
                unexclusive = Some(lease.holder());
            }
            // Released at the end only if this run took it.
            inserted.then_some(lease)
        }
        None => None,
    };
    if ask.session.is_none() && ask.exclusive {
        // This process's own lease, recorded exclusive before it enters (so two such runs
        // waiting for each other hold nothing meanwhile): refused while somebody other
        // than it and its ancestors holds the worktree. The daemon's first request from
        // it finds the row and watches it; the sweeper watches it if a shell inside covers
        // it, or sweeps it if this process dies before entering.
        let me = worktreefs::process::info::proc_info(std::process::id() as i32)
            .ok_or_else(|| anyhow!("reading this process's /proc/self/stat"))?;
        let lease = worktreefs::store::NewLease::Process {
            pid: me.pid,
            start: me.start,
            command: worktreefs::process::info::command_line(me.pid).unwrap_or(me.command),
        };
        acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            reason,
            &Want {
                exclusive: true,
                wait: ask.wait,
                json_to,
            },
        )?;
        daemon::poke(state);
    }
    // Entering the worktree and reading its .git file makes this process a lease holder
    // (the daemon notices when it exits, however it exits); the command runs below it.
    let status = run_below(&dir, command, Below::Run)
        .map(|ended| ended.status)
        .with_context(|| format!("in {} (state {})", dir.display(), row.state));
    if let Some(lease) = named {
        let _ = store.release_lease(row.id, &lease.holder(), "released", "worktreefs run ended");
    }
    if let Some(holder) = unexclusive {
        let _ = store.set_exclusive(row.id, &holder, false);
    }
    exit_as(status?)
}

/// The refusal of `run` or `turn` when no daemon serves the state dir: `not-mounted`, the
/// worktree object with the session asked for.
fn not_mounted(
    state: &StateDir,
    store: &Store,
    row: &worktreefs::store::WorktreeRow,
    session: Option<&str>,
    json_to: Option<report::JsonTo>,
) -> report::Refusal {
    let at = create::mountpoint_of(state, store);
    report::refused(
        row,
        &at,
        "not-mounted",
        session,
        format!(
            "nothing is mounted for state dir {}, so nothing can run in {}/{}; start it with `worktreefs mount`",
            state.root.display(),
            row.repo,
            row.name
        ),
        json_to,
    )
}

/// What `turn` asks.
struct TurnAsk<'a> {
    session: &'a str,
    guard: bool,
    wait: Option<u64>,
    /// Seconds the command may run (`--timeout`).
    timeout: Option<u64>,
    json: bool,
}

/// Ends this process's turn on worktree `id` and gives back the lease it took, telling
/// the daemon. Ok(false): the turn had ended already (its session's lease released).
fn end_own_turn(
    state: &StateDir,
    store: &mut Store,
    id: i64,
    me: &worktreefs::process::info::ProcInfo,
    reason: &str,
) -> anyhow::Result<bool> {
    // The lease it took goes with the turn, in the same transaction.
    let ended = store.end_turn(id, (me.pid as i64, me.start as i64), reason)?;
    daemon::poke(state);
    Ok(ended)
}

fn cmd_turn(
    state: &StateDir,
    target: &str,
    ask: &TurnAsk<'_>,
    command: &[String],
) -> anyhow::Result<()> {
    use worktreefs::lifecycle::turns::writers_inside;
    use worktreefs::process::info::Liveness;
    use worktreefs::store::{NewLease, NewTurn, TurnError};
    let (repo, name) = split_target(target)?;
    worktreefs::lease::validate_session(ask.session).map_err(|e| anyhow!(e))?;
    let mut store = open_store(state)?;
    let json_to = ask.json.then_some(report::JsonTo::Stderr);
    let row = runnable_worktree(&store, repo, name, json_to)?;
    let at = create::mountpoint_of(state, &store);
    let plain = |error: &str, message: String| -> anyhow::Error {
        report::refused(&row, &at, error, Some(ask.session), message, json_to).into()
    };
    let Some(daemon) = daemon::running_daemon(state) else {
        return Err(not_mounted(state, &store, &row, Some(ask.session), json_to).into());
    };
    same_pid_namespace(&daemon).map_err(|e| plain("other-namespace", e.to_string()))?;
    let dir = daemon.mountpoint.join(repo).join(name);
    let me = worktreefs::process::info::proc_info(std::process::id() as i32)
        .ok_or_else(|| anyhow!("reading this process's /proc/self/stat"))?;
    let liveness = worktreefs::process::info::liveness_for(me.pid);
    let started = std::time::Instant::now();
    let deadline = ask.wait.map(|s| {
        started
            .checked_add(Duration::from_secs(s))
            .unwrap_or(started + Duration::from_secs(100 * 365 * 86_400))
    });
    let waiting = || deadline.is_some_and(|d| std::time::Instant::now() < d);
    let waited = || ask.wait.map(|_| started.elapsed().as_secs());
    let refuse = |mut r: report::Refusal| -> anyhow::Error {
        r.json_to = json_to;
        r.into()
    };
    let busy = |t: &worktreefs::store::TurnRow, unchecked: Option<&str>| {
        refuse(report::busy(
            t,
            unchecked,
            waited(),
            worktreefs::store::now_secs(),
            Some(&daemon.mountpoint),
        ))
    };
    let lease = NewLease::Session {
        id: ask.session.to_string(),
    };
    let reason = format!(
        "worktreefs turn{}",
        if ask.guard { ", guarded" } else { "" }
    );
    // Waiting holds nothing: no lease taken, no turn begun, so a turn killed while it
    // waits leaves nothing behind, and a wait for another turn of the same session sees
    // that turn give back the lease it took.
    loop {
        let running = store.turns()?.into_iter().find(|t| t.worktree_id == row.id);
        if let Some(t) = running {
            match liveness(t.pid, t.pid_start) {
                Liveness::Gone => {} // begin_turn ends it
                l => {
                    if waiting() {
                        std::thread::sleep(WAIT_POLL);
                        continue;
                    }
                    let why = match &l {
                        Liveness::Unknown(why) => Some(why.as_str()),
                        _ => None,
                    };
                    return Err(busy(&t, why));
                }
            }
        }
        if ask.guard {
            let writers = writers_inside(&dir, me.pid);
            if !writers.is_empty() {
                if waiting() {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                return Err(refuse(writers_refusal(repo, name, &writers, 0, waited())));
            }
        }
        let left = deadline.map(|d| {
            d.saturating_duration_since(std::time::Instant::now())
                .as_secs()
        });
        let took = acquire_named(
            state,
            &mut store,
            (repo, name, &row),
            &lease,
            &reason,
            &Want {
                exclusive: false,
                wait: left,
                json_to,
            },
        )?;
        let turn = NewTurn {
            session: ask.session.to_string(),
            pid: me.pid,
            start: me.start,
            command: command.join(" "),
            guard: ask.guard,
            took_lease: took,
        };
        let give_back = |store: &mut Store| {
            if took {
                let _ = store.release_lease(
                    row.id,
                    &lease.holder(),
                    "released",
                    "its turn did not start",
                );
                daemon::poke(state);
            }
        };
        match store.begin_turn(row.id, &turn, &liveness) {
            Ok(_) => break,
            Err(TurnError::Busy {
                turn: running,
                unchecked,
            }) => {
                give_back(&mut store);
                if waiting() {
                    std::thread::sleep(WAIT_POLL);
                    continue;
                }
                return Err(busy(&running, unchecked.as_deref()));
            }
            Err(TurnError::NotHeld) => {
                give_back(&mut store);
                return Err(plain("not-held", format!("session {} lost its lease on {repo}/{name} while its turn was starting (released by someone else); nothing was started — take it again with `worktreefs lease acquire {repo}/{name} --session {}`", ask.session, ask.session)));
            }
            Err(TurnError::State(st)) => {
                give_back(&mut store);
                return Err(refuse(report::unleasable(repo, name, Some(st))));
            }
            Err(TurnError::Db(e)) => {
                give_back(&mut store);
                return Err(e.into());
            }
        }
    }
    if !ask.guard {
        daemon::poke(state);
    } else if let Err(e) = guard_in_place(&daemon.mountpoint, (repo, name), &dir, me.pid) {
        // Nothing was started: the turn ends (and gives back the lease it took).
        end_own_turn(
            state,
            &mut store,
            row.id,
            &me,
            "its guard could not be put in place",
        )?;
        return Err(match e {
            GuardNotReady::Writers(writers, through_mount) => refuse(writers_refusal(
                repo,
                name,
                &writers,
                through_mount,
                waited(),
            )),
            GuardNotReady::Other(msg) => anyhow!(
                "the guard of this turn on {repo}/{name} could not be put in place: {msg}; nothing was started — see the daemon's log ({}), or run the turn without --guard",
                state.root.join("daemon.log").display()
            ),
        });
    }
    let limit = ask.timeout.map(Duration::from_secs);
    let ended = run_below(&dir, command, Below::Turn { limit });
    let why = match &ended {
        Ok(Ended {
            ended_with: Some(sig),
            ..
        }) => format!(
            "its command ran past its timeout of {} s and was ended with {}",
            ask.timeout.unwrap_or(0),
            signal_name(*sig)
        ),
        Ok(e) => format!("its command ended ({})", e.status),
        Err(e) => format!("its command could not start: {e:#}"),
    };
    // The command's status is what this exits with, whatever the bookkeeping meets.
    match end_own_turn(state, &mut store, row.id, &me, &why) {
        Ok(true) => {}
        Ok(false) if ended.is_ok() => eprintln!(
            "worktreefs: the turn of session {} on {repo}/{name} had ended before its command did (its session's lease was released)",
            ask.session
        ),
        Ok(false) => {}
        Err(e) => eprintln!(
            "worktreefs: ending the turn of session {} on {repo}/{name} failed ({e:#}); the daemon ends it within a second of this process's exit",
            ask.session
        ),
    }
    let ended = ended?;
    if let Some(sig) = ended.ended_with {
        // Past its timeout: said on stderr (the JSON last, on a line of its own), exit 124.
        let secs = ask.timeout.unwrap_or(0);
        let how = match sig {
            libc::SIGKILL => format!(
                "SIGKILL, {} s after a SIGTERM it ignored",
                tree::KILL_AFTER.as_secs()
            ),
            _ => signal_name(sig).to_string(),
        };
        let message = format!(
            "the turn of session {} on {repo}/{name} ran past its timeout of {secs} s: its command was ended with {how}, and what it left running with it",
            ask.session,
        );
        let row = store.worktree(repo, name).ok().flatten().unwrap_or(row);
        let mut v = report::worktree_json(&row, &at);
        v["error"] = "timed-out".into();
        v["session"] = ask.session.into();
        v["timeout_secs"] = secs.into();
        v["signal"] = signal_name(sig).into();
        v["exit_status"] = EXIT_TIMED_OUT.into();
        v["message"] = message.clone().into();
        write_report(&v);
        if ask.json {
            // On a line of its own whatever the command's last output was (a line it
            // did not end, a progress bar's `\r`).
            eprintln!("\n{v}");
        } else {
            eprintln!("worktreefs: {message}");
        }
        std::process::exit(EXIT_TIMED_OUT);
    }
    write_report(&serde_json::json!({"outcome": "ended", "exit_status": exit_code(ended.status)}));
    exit_as(ended.status)
}

/// `turn --report FILE`, opened at the start (see `main`).
static REPORT: std::sync::OnceLock<fs::File> = std::sync::OnceLock::new();

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
fn write_report(v: &serde_json::Value) {
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

/// What `turn` exits with when its command ran past `--timeout` (timeout(1)'s code).
const EXIT_TIMED_OUT: i32 = 124;

/// `turns end`: SIGTERM to the running turn's process, then waits for its turn to end.
fn cmd_turn_end(
    state: &StateDir,
    target: &str,
    session: Option<&str>,
    wait: u64,
    json: bool,
) -> anyhow::Result<()> {
    let (repo, name) = split_target(target)?;
    if let Some(s) = session {
        worktreefs::lease::validate_session(s).map_err(|e| anyhow!(e))?;
    }
    let mut store = open_store(state)?;
    let json_to = json.then_some(report::JsonTo::Stdout);
    // Nothing to end is exit 1, as for a release (not a conflict: nothing was asked that
    // somebody else has).
    let row = leasable_worktree(&store, repo, name, json_to).map_err(|e| match e
        .downcast::<report::Refusal>()
    {
        Ok(mut r) => {
            r.code = 1;
            anyhow::Error::from(r)
        }
        Err(e) => e,
    })?;
    let at = create::mountpoint_of(state, &store);
    let not = |error: &str, message: String| -> anyhow::Error {
        report::refused(&row, &at, error, session, message, json_to).into()
    };
    let Some(turn) = store.turns()?.into_iter().find(|t| t.worktree_id == row.id) else {
        return Err(not(
            "not-running",
            format!("no turn runs on {repo}/{name}; nothing changed (see `worktreefs turns`)"),
        ));
    };
    if session.is_some_and(|s| s != turn.session) {
        return Err(not(
            "other-session",
            format!(
                "the turn running on {repo}/{name} is session {}'s, not {}'s; nothing changed",
                turn.session,
                session.unwrap_or_default()
            ),
        ));
    }
    let key = (turn.pid, turn.pid_start);
    let same = |store: &Store| {
        store
            .turns()
            .ok()
            .and_then(|v| v.into_iter().find(|t| t.worktree_id == row.id))
            .is_some_and(|t| (t.pid, t.pid_start) == key)
    };
    if worktreefs::process::info::liveness(turn.pid, turn.pid_start)
        == worktreefs::process::info::Liveness::Gone
    {
        // Its process is gone already: the gate opens now.
        store.end_turn(
            row.id,
            key,
            "ended by `worktreefs turns end` (its process was gone)",
        )?;
    } else {
        // Through a pidfd of the recorded process (its start time checked after the pidfd
        // is open), so a pid reused meanwhile is never signalled.
        match worktreefs::process::pidfd::signal(turn.pid, turn.pid_start, libc::SIGTERM) {
            Ok(_) => {} // gone meanwhile: the turn ends below
            Err(e) => {
                return Err(not(
                    "cannot-signal",
                    format!(
                        "cannot signal the turn's process {} ({e}); nothing changed — end it as its owner, or release its session (`worktreefs lease release {repo}/{name} --session {}`)",
                        turn.pid, turn.session
                    ),
                ));
            }
        }
        let now = std::time::Instant::now();
        let end = now
            .checked_add(Duration::from_secs(wait))
            .unwrap_or(now + Duration::from_secs(100 * 365 * 86_400));
        while same(&store) && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    daemon::poke(state);
    if same(&store) {
        return Err(not(
            "still-running",
            format!(
                "the turn of session {} on {repo}/{name} is still running {wait} s after its process {} got SIGTERM (its command may ignore it); wait longer (`--wait SECS`), `kill -9 {}` (the gate opens within a second), or release its session",
                turn.session, turn.pid, turn.pid
            ),
        ));
    }
    if json {
        let mut v = report::turn_json(&turn, &at);
        v["ended"] = true.into();
        println!("{v:#}");
    } else {
        println!(
            "ended the turn of session {} on {repo}/{name} (pid {}: {})",
            turn.session, turn.pid, turn.command
        );
    }
    Ok(())
}

/// Why a guarded turn's gate is not in place.
enum GuardNotReady {
    /// Processes outside write there (named), and how many files are open for writing
    /// through the mount (the daemon's count, which sees other users' and namespaces').
    Writers(Vec<report::Writer>, usize),
    Other(String),
}

/// Puts a guarded turn's gate in place before its command starts: the daemon re-reads
/// the store and waits for every change request that began before the guard to end (its
/// refresh answers ENOENT once they have, EBUSY if they do not), shows the turn as this
/// process's, and nothing outside has a file there open for writing or mapped (their
/// writes would never reach the gate): by the daemon's handle table and by `/proc`.
fn guard_in_place(
    mountpoint: &Path,
    (repo, name): (&str, &str),
    dir: &Path,
    pid: i32,
) -> Result<(), GuardNotReady> {
    let control = mountpoint.join(worktreefs::fs::CONTROL_NAME);
    match fs::symlink_metadata(control.join(worktreefs::fs::REFRESH_NAME)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(GuardNotReady::Other(format!(
                "the daemon did not confirm that changes begun before it ended ({e})"
            )))
        }
        Ok(_) => {
            return Err(GuardNotReady::Other(
                "the daemon answered its refresh unexpectedly".into(),
            ))
        }
    }
    let entry = control.join("turns").join(format!("{repo}:{name}"));
    let shown = fs::read_to_string(&entry)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let Some(shown) = shown.filter(|v| v["pid"].as_i64() == Some(pid as i64)) else {
        return Err(GuardNotReady::Other(format!(
            "the daemon does not show it in {}",
            entry.display()
        )));
    };
    let through_mount = shown["open_for_writing"].as_u64().unwrap_or(0) as usize;
    let writers = worktreefs::lifecycle::turns::writers_inside(dir, pid);
    if through_mount > 0 || !writers.is_empty() {
        return Err(GuardNotReady::Writers(writers, through_mount));
    }
    Ok(())
}

/// The refusal of a guarded turn while `writers` (and `through_mount` files the daemon
/// counts open for writing) write there.
fn writers_refusal(
    repo: &str,
    name: &str,
    writers: &[report::Writer],
    through_mount: usize,
    waited: Option<u64>,
) -> report::Refusal {
    let mut r = report::writers_inside(repo, name, writers);
    if through_mount > 0 {
        r.message.push_str(&format!(
            "\n({through_mount} file(s) there are open for writing through the mount, by the daemon's count{})",
            if writers.is_empty() {
                ", by processes this command cannot see (another user, another namespace)"
            } else {
                ""
            }
        ));
        r.json["open_for_writing"] = through_mount.into();
    }
    if let Some(w) = waited {
        r.message
            .push_str(&format!("\n(waited {w} s for them to close those files)"));
        r.json["waited_secs"] = w.into();
    }
    r
}

/// A turn's process must be one the daemon can see as it does (same pid namespace): its
/// guard compares the pids FUSE gives with the turn's, and its sweeper checks the turn's
/// process by pid.
fn same_pid_namespace(daemon: &daemon::Holder) -> anyhow::Result<()> {
    let daemon_pid = daemon.pid;
    let ns = |pid: &str| {
        fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .map(|l| l.to_string_lossy().into_owned())
    };
    let same = match &daemon.pid_ns {
        // The namespace the daemon wrote down: whatever its program is called (installed
        // as `mount.fuse.worktreefs`, copied elsewhere).
        Some(theirs) => ns("self").is_some_and(|mine| mine == *theirs),
        // A daemon of a version that did not write it: the pid must be a worktreefs
        // process in this namespace.
        None => {
            let cmd = fs::read(format!("/proc/{daemon_pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmd).contains("worktreefs");
            ours && ns("self").is_some() && ns("self") == ns(&daemon_pid.to_string())
        }
    };
    if same {
        return Ok(());
    }
    bail!(
        "this command does not run in the pid namespace of the daemon (pid {daemon_pid}), so the daemon could not tell the turn's processes; run `worktreefs turn` where the daemon runs (not inside a container of its own)"
    )
}

/// Exits with the command's status: its code, or 128 + the signal that ended it.
fn exit_as(status: std::process::ExitStatus) -> anyhow::Result<()> {
    match exit_code(status) {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

fn add_repo(
    store: &Store,
    path: &Path,
    name: Option<&str>,
) -> anyhow::Result<worktreefs::store::RepoRow> {
    if let Some(n) = name {
        validate_name("repository", n).map_err(|e| anyhow!(e))?;
    }
    let (gitdir, workdir) = git::discover(path)?;
    let top = workdir.clone().unwrap_or_else(|| gitdir.clone());
    let name = match name {
        Some(n) => n.to_string(),
        None => {
            let raw = top
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".git").to_string())
                .unwrap_or_default();
            sanitize_name(&raw)
        }
    };
    // A worktree is a view of a commit: a repository with none has nothing to show.
    let has_commit = git2::Repository::open(&gitdir).is_ok_and(|r| {
        r.head().is_ok_and(|h| h.peel_to_commit().is_ok())
            || r.branches(Some(git2::BranchType::Local))
                .is_ok_and(|mut b| b.next().is_some())
    });
    if !has_commit {
        bail!(
            "repository {} has no commit yet, and a worktree is a view of a commit; commit something first (`git -C {} commit --allow-empty -m init`), then register it",
            top.display(),
            shell_word(&top.display().to_string())
        );
    }
    if let Some(existing) = store.repo_by_gitdir(&gitdir)? {
        bail!(
            "repository {} is already registered as '{}'",
            top.display(),
            existing.name
        );
    }
    if let Some(existing) = store.repo_by_name(&name)? {
        bail!(
            "the name '{name}' is already used by repository {}; pass --name with another name",
            existing.path.display()
        );
    }
    Ok(store.add_repo(&name, &top, &gitdir)?)
}

/// `repo add` of the repository at `path` for `mount`'s embedded defaults, which take no
/// `--name`: its directory's name, or with `-2`, `-3`… when another repository has it.
fn add_repo_here(store: &Store, path: &Path) -> anyhow::Result<worktreefs::store::RepoRow> {
    let (gitdir, workdir) = git::discover(path)?;
    let top = workdir.unwrap_or(gitdir);
    let base = sanitize_name(
        top.file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".git").to_string())
            .as_deref()
            .unwrap_or_default(),
    );
    let mut name = base.clone();
    for n in 2..100 {
        if store.repo_by_name(&name)?.is_none() {
            break;
        }
        let suffix = format!("-{n}");
        name = format!(
            "{}{suffix}",
            &base[..base
                .len()
                .min(worktreefs::names::MAX_NAME_LEN - suffix.len())]
        );
    }
    add_repo(store, path, Some(&name))
}

struct MountTuning {
    threads: usize,
    linger: u64,
    track_leases: bool,
    passthrough: bool,
    readdirplus: bool,
    uring: worktreefs::fs::mount::Uring,
    xattrs: bool,
    cache_nodes: usize,
    allow_other: bool,
    filter_timeout: f64,
    inspect_timeout: f64,
    /// `--keep-removed` hours, `--keep-min-free-percent`, `--keep-min-free-gib`.
    keep: (f64, f64, f64),
    umount_keeps_sessions: bool,
}

/// The keep policy from `mount`'s options, each checked.
fn keep_policy((hours, percent, gib): (f64, f64, f64)) -> anyhow::Result<KeepPolicy> {
    if !(hours.is_finite() && (0.0..=1e6).contains(&hours)) {
        bail!("--keep-removed {hours} is not a number of hours from 0 up; pass e.g. --keep-removed 24 (0 keeps nothing)");
    }
    if !(percent.is_finite() && (0.0..=100.0).contains(&percent)) {
        bail!("--keep-min-free-percent {percent} is not a share from 0 to 100; pass e.g. --keep-min-free-percent 5");
    }
    if !(gib.is_finite() && (0.0..=1e9).contains(&gib)) {
        bail!("--keep-min-free-gib {gib} is not a number of GiB from 0 up; pass e.g. --keep-min-free-gib 2");
    }
    Ok(KeepPolicy {
        // A part of an hour keeps at least a second.
        keep_secs: if hours == 0.0 {
            0
        } else {
            ((hours * 3600.0).round() as i64).max(1)
        },
        min_free_percent: percent,
        min_free_bytes: (gib * (1u64 << 30) as f64) as u64,
    })
}

/// `(foreground, json)`: how `mount` was asked to run and to answer.
fn cmd_mount(
    state: &StateDir,
    mountpoint: Option<PathBuf>,
    (foreground, json): (bool, bool),
    tuning: MountTuning,
    log_level: Option<&str>,
) -> anyhow::Result<()> {
    let MountTuning {
        threads,
        linger,
        track_leases,
        passthrough,
        readdirplus,
        uring,
        xattrs,
        cache_nodes,
        allow_other,
        filter_timeout,
        inspect_timeout,
        keep,
        umount_keeps_sessions,
    } = tuning;
    let seconds = |flag: &str, v: f64, e: &str| {
        if v.is_finite() && v > 0.0 && v < 1e9 {
            Ok(std::time::Duration::from_secs_f64(v))
        } else {
            Err(anyhow!(
                "--{flag} {v} is not a number of seconds above 0; pass e.g. --{flag} {e}"
            ))
        }
    };
    let filter_timeout = seconds("filter-timeout", filter_timeout, "120")?;
    let inspect_timeout = seconds("inspect-timeout", inspect_timeout, "600")?;
    let keep = keep_policy(keep)?;
    if foreground {
        let req = MountRequest {
            state: state.clone(),
            mountpoint,
            threads,
            linger,
            track_leases,
            passthrough,
            readdirplus,
            uring,
            xattrs,
            cache_nodes,
            allow_other,
            filter_timeout,
            inspect_timeout,
            keep,
            on_umount: daemon::AtUnmount::from_keep_sessions(umount_keeps_sessions),
        };
        return daemon::serve(req, daemon::ready_fd_from_env());
    }
    let req = MountRequest {
        state: state.clone(),
        mountpoint: mountpoint.clone(),
        threads,
        linger,
        track_leases,
        passthrough,
        readdirplus,
        uring,
        xattrs,
        cache_nodes,
        allow_other,
        filter_timeout,
        inspect_timeout,
        keep,
        on_umount: daemon::AtUnmount::from_keep_sessions(umount_keeps_sessions),
    };
    // Served already, at that mountpoint: this directory's repository is registered (as
    // `repo add .` does) and the next steps printed; at another, refused, naming where.
    if let Some(h) = daemon::running_daemon(state).filter(|h| !daemon::detached(state, h)) {
        // A daemon that does not answer (stopped, hung) is said so at once.
        daemon::answers(&h, Duration::from_secs(5)).map_err(|e| anyhow!("{e}"))?;
        let there = mountpoint
            .as_ref()
            .is_none_or(|m| fs::canonicalize(m).ok().as_ref() == Some(&h.mountpoint));
        if !there {
            bail!(
                "state dir {} is served already, by daemon pid {} at {}; a state dir is served at one mountpoint: use {}, or end that mount first (`{} unmount`), or give this mount a state dir of its own (--state-dir)",
                state.root.display(),
                h.pid,
                h.mountpoint.display(),
                h.mountpoint.display(),
                invocation(state)
            );
        }
        let cwd = std::env::current_dir().ok();
        let Some((gitdir, _)) = cwd.as_deref().and_then(|c| git::discover(c).ok()) else {
            bail!(
                "already mounted at {} (daemon pid {}), and {} is not inside a git repository, so there is nothing to add; run `{} mount` inside the repository to register, or `{} repo add PATH`",
                h.mountpoint.display(),
                h.pid,
                cwd.as_deref().unwrap_or(Path::new("?")).display(),
                invocation(state),
                invocation(state)
            );
        };
        let store = open_store(state)?;
        let (row, added) = match store.repo_by_gitdir(&gitdir)? {
            Some(r) => (r, false),
            None => {
                let r = add_repo_here(&store, cwd.as_deref().unwrap_or(Path::new(".")))?;
                daemon::enable_fsmonitor(&store);
                daemon::poke(state);
                (r, true)
            }
        };
        return print_mounted(state, h.pid, Some(row), added, json);
    }
    // A default mountpoint this command makes goes again if the mount fails.
    let made_mountpoint = (mountpoint.is_none()
        && fs::symlink_metadata(state.default_mountpoint()).is_err())
    .then(|| state.default_mountpoint());
    let mounted = mount_in_background(state, &req, mountpoint.is_none(), log_level, json);
    if mounted.is_err() {
        if let Some(m) = made_mountpoint {
            let _ = fs::remove_dir(m);
        }
    }
    mounted
}

/// `mount` in the background: checks, registers this directory's repository when no
/// mountpoint was given (undone if the daemon does not start), starts the daemon and
/// says where it mounted.
fn mount_in_background(
    state: &StateDir,
    req: &MountRequest,
    defaults: bool,
    log_level: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    daemon::prepare(req)?;
    // Embedded defaults: inside a git repository, register it if it is not yet — once the
    // mount can be made, and undone if the daemon does not start, so a failed mount
    // leaves no registration behind.
    let mut registered = None;
    let mut added = None;
    if defaults {
        if let Ok(cwd) = std::env::current_dir() {
            if let Ok((gitdir, _)) = git::discover(&cwd) {
                let store = open_store(state)?;
                registered = Some(match store.repo_by_gitdir(&gitdir)? {
                    Some(r) => r,
                    None => {
                        let r = add_repo_here(&store, &cwd)?;
                        added = Some(r.id);
                        r
                    }
                });
            }
        }
    }
    let pid = match daemon::spawn_background(req, log_level) {
        Ok(pid) => pid,
        Err(e) => {
            if let Some(id) = added {
                let mut store = open_store(state)?;
                store.remove_repo(id)?;
            }
            return Err(e);
        }
    };
    print_mounted(state, pid, registered, added.is_some(), json)
}

/// What `mount` says once a daemon serves `state` (pid `pid`): where, the repositories
/// (`registered` the one this command's directory is, `added` when it registered it now),
/// and next steps that run as printed; or, with `json`, one object.
fn print_mounted(
    state: &StateDir,
    pid: i32,
    registered: Option<worktreefs::store::RepoRow>,
    added: bool,
    json: bool,
) -> anyhow::Result<()> {
    let store = open_store(state)?;
    let mp = create::mountpoint_of(state, &store);
    let mp = fs::canonicalize(&mp).unwrap_or(mp);
    if json {
        let repos: Vec<_> = store.repos()?.iter().map(report::repo_json).collect();
        println!(
            "{:#}",
            serde_json::json!({
                "mountpoint": mp,
                "pid": pid,
                "state_dir": state.root,
                "repos": repos,
                "registered": registered.filter(|_| added).map(|r| r.name),
            })
        );
        return Ok(());
    }
    println!(
        "worktreefs: mounted at {} (daemon pid {pid}, state dir {})",
        mp.display(),
        state.root.display()
    );
    let repos = store.repos()?;
    let mut t = Table::new(&["REPOSITORY", "PATH"]);
    for r in &repos {
        t.row([r.name.clone(), r.path.display().to_string()]);
    }
    for line in t.render().lines().skip(1) {
        println!("  {line}");
    }
    if let Some(r) = registered.as_ref().filter(|_| added) {
        println!("registered repository '{}' (this directory's)", r.name);
    }
    let example = registered
        .map(|r| r.name)
        .or_else(|| repos.first().map(|r| r.name.clone()));
    let me = invocation(state);
    let mpw = shell_word(&mp.display().to_string());
    let mut steps = Table::new(&["STEP", "WHY"]);
    match example {
        Some(repo) => {
            steps.row([
                format!("{me} new {repo}/task-1"),
                format!("# or: mkdir {mpw}/{repo}/task-1"),
            ]);
            steps.row([
                format!("cd {mpw}/{repo}/task-1"),
                "# work there: edit, build, git commit, git push".to_string(),
            ]);
            steps.row([
                format!("{me} list"),
                "# every worktree and its state".to_string(),
            ]);
            steps.row([
                format!("cd && {me} unmount"),
                "# when you are done, from outside the mount".to_string(),
            ]);
        }
        None => {
            steps.row([
                format!("{me} repo add PATH"),
                "# register a repository".to_string(),
            ]);
            steps.row([format!("{me} unmount"), "# when you are done".to_string()]);
        }
    }
    println!("next:");
    for line in steps.render().lines().skip(1) {
        println!("  {line}");
    }
    Ok(())
}

/// `warm::prune`, its failure a warning: a snapshot taken stands either way.
fn prune_warm(state: &StateDir, store: &mut Store) -> Option<warm::Pruned> {
    warm::prune(state, store)
        .map_err(|e| eprintln!("worktreefs: deleting older warm snapshots: {e:#}"))
        .ok()
        .flatten()
}

/// What a snapshot taken holds and left out.
fn print_taken(repo: &str, t: &warm::Taken) {
    println!(
        "took warm snapshot {} of {repo} in {:.1} s: {} files and links ({} links), {}",
        t.row.id,
        t.took.as_secs_f64(),
        t.row.files,
        t.links,
        worktreefs::report::human_bytes(t.row.bytes)
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

/// The manual pages, generated from the command definitions: `worktreefs.1`, and one per
/// command and subcommand (`worktreefs-lease-acquire.1`), as `git` names its pages.
/// The sections every manual page ends with: EXIT STATUS, ENVIRONMENT, FILES and
/// EXAMPLES (the page `name`'s own examples, else the main page's), in roff.
fn man_sections(name: &str) -> String {
    let esc = |t: &str| {
        t.replace('\\', "\\e")
            .replace('-', "\\-")
            .lines()
            .map(|l| {
                if l.starts_with('.') || l.starts_with('\'') {
                    format!("\\&{l}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let section = |title: &str, items: &[(&str, &str)]| {
        let mut out = format!(".SH \"{title}\"\n");
        for (tag, text) in items {
            if tag.is_empty() {
                out.push_str(&format!(".PP\n{}\n", esc(text)));
            } else {
                out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", esc(tag), esc(text)));
            }
        }
        out
    };
    let mut out = section(
        "EXIT STATUS",
        &[
            ("0", "Success."),
            ("1", "The request could not be carried out; the message names the thing, its state and the way out."),
            ("2", "Bad usage."),
            ("3", "A typed conflict: the worktree cannot be had now (somebody holds it, another turn runs there, it is deleting or removed)."),
            ("124", "turn: its command ran past --timeout and was ended."),
            ("126, 127, 128+N", "run and turn: the command could not be run, was not found, or was ended by signal N; otherwise they exit with their command's status."),
        ],
    );
    out.push_str(&section(
        "ENVIRONMENT",
        &[
            ("WORKTREEFS_STATE_DIR", "The state directory, as --state-dir gives it."),
            ("XDG_STATE_HOME", "Where the default state directory is (XDG_STATE_HOME/worktreefs), else ~/.local/state/worktreefs."),
            ("RUST_LOG", "Log filter for the daemon and for commands (as --log-level; it takes precedence)."),
            ("WORKTREEFS_PROGRESS_AFTER_MS", "How long a creation may take before it says what it is doing (default 1000)."),
            ("NOTIFY_SOCKET", "Set by systemd for a Type=notify unit: mount --foreground reports readiness there."),
        ],
    ));
    out.push_str(&section(
        "FILES",
        &[
            ("~/.local/state/worktreefs/", "The default state directory (0700): the SQLite database worktreefs.db, every worktree's upper layer under worktrees/, the content store, caches, daemon.log and daemon.sock."),
            ("~/.local/state/worktreefs-mnt/", "The default mountpoint."),
            ("REPO/.git/worktreefs/", "The fsmonitor hook and the config that managed worktrees include (includeIf in REPO/.git/config)."),
            ("REPO/.worktreeinclude", "What warm worktrees inherit from the checkout (gitignore syntax)."),
        ],
    ));
    let examples: &[(&str, &str)] = match name {
        "worktreefs-mount" => &[
            ("worktreefs mount", "Inside a repository: register it, mount at the default place, and print the next steps."),
            ("worktreefs mount /srv/worktrees --allow-other", "Mount where given, open to other users."),
            ("mount -t fuse.worktreefs -o allow_other,umount_keeps_sessions /var/lib/worktreefs /srv/worktrees", "The same through mount(8) (link /sbin/mount.fuse.worktreefs to the binary)."),
        ],
        "worktreefs-unmount" => &[
            ("worktreefs unmount", "Release every lease, clean up, unmount: an admin's reclaim."),
            ("worktreefs unmount --keep-sessions", "A planned restart: named leases and their worktrees are kept."),
        ],
        "worktreefs-new" => &[
            ("worktreefs new myrepo/task-1", "A worktree on a new branch task-1 at HEAD."),
            ("worktreefs new myrepo/task-2 --warm", "With the repository's warm snapshot (node_modules/, target/, .env)."),
            ("worktreefs new myrepo/try --from task-1", "A fork of task-1 with its uncommitted changes."),
        ],
        "worktreefs-reclaim" => &[
            ("worktreefs reclaim myrepo/task-1 --wait 30", "Remove it when nothing would be lost, waiting up to 30 s for its holders to go."),
            ("worktreefs reclaim myrepo/task-1 --discard", "Throw its work away (listed first)."),
        ],
        "worktreefs-lease-acquire" | "worktreefs-lease-release" | "worktreefs-lease" => &[
            ("worktreefs lease acquire myrepo/task-1 --session s1 --exclusive", "Hold it for session s1, alone."),
            ("worktreefs lease release myrepo/task-1 --session s1 --reason done", "Let it go; cleanup runs after the grace period."),
        ],
        "worktreefs-turn" => &[
            ("worktreefs turn myrepo/task-1 --session s1 --timeout 600 -- make test", "Run make test as s1's turn, ended after ten minutes."),
        ],
        "worktreefs-run" => &[
            ("worktreefs run myrepo/task-1 -- cargo build", "Build inside, holding a lease while it runs."),
        ],
        _ => &[
            ("worktreefs mount", "Inside a repository: register it and mount."),
            ("worktreefs new myrepo/task-1 && cd ~/.local/state/worktreefs-mnt/myrepo/task-1", "Make a worktree and work in it."),
            ("worktreefs list", "Every worktree, its state, its leases and the processes inside."),
            ("cd && worktreefs unmount", "When you are done, from outside the mount."),
        ],
    };
    out.push_str(&section("EXAMPLES", examples));
    out
}

fn write_man_pages(dir: &Path) -> anyhow::Result<()> {
    use clap::CommandFactory;
    fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let cmd = Cli::command().name("worktreefs");
    let mut written = Vec::new();
    fn walk(
        cmd: clap::Command,
        prefix: &str,
        dir: &Path,
        written: &mut Vec<PathBuf>,
    ) -> anyhow::Result<()> {
        let name = if prefix.is_empty() {
            cmd.get_name().to_string()
        } else {
            format!("{prefix}-{}", cmd.get_name())
        };
        let page = cmd
            .clone()
            .name(name.clone())
            .bin_name(name.replace('-', " "));
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        out.extend_from_slice(man_sections(&name).as_bytes());
        let path = dir.join(format!("{name}.1"));
        fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        for sub in cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            walk(sub.clone(), &name, dir, written)?;
        }
        Ok(())
    }
    let mut cmd = cmd;
    cmd.build();
    walk(cmd, "", dir, &mut written)?;
    println!(
        "wrote {} manual pages to {} (`man worktreefs`, once it is on MANPATH)",
        written.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod cli_tests {
    use super::*;
    use clap::CommandFactory;

    fn line(args: &[&str]) -> Result<Vec<String>, String> {
        mount_command_line(args.iter().map(std::ffi::OsString::from).collect())
            .map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    /// mount.fuse3's conventions: `-o` lists, the helper's argument order, fstab's options.
    #[test]
    fn mount_options_and_the_helpers_arguments_become_flags() {
        let ok = |args: &[&str], want: &[&str]| assert_eq!(line(args).unwrap(), want, "{args:?}");
        ok(
            &[
                "worktreefs",
                "mount",
                "/m",
                "-o",
                "allow_other,linger=3",
                "-othreads=4",
            ],
            &[
                "worktreefs",
                "mount",
                "/m",
                "--allow-other",
                "--linger",
                "3",
                "--threads",
                "4",
            ],
        );
        ok(
            &[
                "worktreefs",
                "--state-dir",
                "/s",
                "mount",
                "-o",
                "rw,nofail,x-systemd.after=x",
            ],
            &["worktreefs", "--state-dir", "/s", "mount"],
        );
        ok(&["worktreefs", "list", "-o"], &["worktreefs", "list", "-o"]);
        ok(
            &[
                "/sbin/mount.fuse.worktreefs",
                "/var/lib/wt",
                "/mnt/wt",
                "-n",
                "-o",
                "rw,allow_other,threads=3",
            ],
            &[
                "/sbin/mount.fuse.worktreefs",
                "mount",
                "/mnt/wt",
                "--state-dir",
                "/var/lib/wt",
                "--allow-other",
                "--threads",
                "3",
            ],
        );
        ok(
            &[
                "mount.worktreefs",
                "worktreefs",
                "/mnt/wt",
                "-t",
                "fuse.worktreefs",
            ],
            &["mount.worktreefs", "mount", "/mnt/wt"],
        );
        ok(
            &["worktreefs", "/var/lib/wt", "/mnt/wt", "-o", "linger=1"],
            &[
                "worktreefs",
                "mount",
                "/mnt/wt",
                "--state-dir",
                "/var/lib/wt",
                "--linger",
                "1",
            ],
        );
        for (args, want) in [
            (
                &["worktreefs", "mount", "-o", "bogus"][..],
                "unknown mount option 'bogus'",
            ),
            (&["worktreefs", "mount", "-o", "ro"], "always read-write"),
            (&["worktreefs", "mount", "-o", "linger="], "needs a value"),
            (&["mount.fuse.worktreefs", "/s"], "SOURCE MOUNTPOINT"),
            (
                &["mount.fuse.worktreefs", "/s", "/m", "-N", "1"],
                "namespace",
            ),
        ] {
            let e = line(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    /// Every option and argument of every command says what it is in `--help`.
    #[test]
    fn every_option_and_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let here = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && !cmd.is_hide_set() {
                missing.push(format!("{here} (the command)"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{here} {id}"));
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &here, missing);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
