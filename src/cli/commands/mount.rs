//! `worktreefs mount`: the daemon in the background (or the foreground), the embedded
//! defaults inside a repository, and the next steps it prints.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;
use worktreefs::daemon::{self, MountRequest};
use worktreefs::git;
use worktreefs::lifecycle::cleanup::keep::KeepPolicy;
use worktreefs::lifecycle::create;
use worktreefs::report::shapes::{MountJson, RepoJson};
use worktreefs::report::shell_word;
use worktreefs::state::StateDir;
use worktreefs::table::Table;

use crate::cli::commands::repo::add_repo_here;
use crate::cli::exit::Failed;
use crate::cli::output::{invocation, print_json};
use crate::cli::state::open_store;

#[derive(Args)]
pub struct MountArgs {
    /// Where to mount (default: `<state dir>-mnt`, ~/.local/state/worktreefs-mnt).
    pub mountpoint: Option<PathBuf>,
    /// Stay in the foreground and log to stderr (for systemd or a terminal); else the
    /// daemon backgrounds once the mount is ready and logs to <state>/daemon.log.
    #[arg(short, long)]
    pub foreground: bool,
    /// Once the mount is ready, one JSON object on stdout: the mountpoint, the daemon's
    /// pid, the state dir and the repositories (see docs/cli.md). Not with
    /// --foreground, which tells systemd instead (sd_notify).
    #[arg(long, conflicts_with = "foreground")]
    pub json: bool,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seconds a worktree stays `lingering` after its last lease before cleanup.
    #[arg(long, default_value_t = 5)]
    pub linger: u64,
    /// Do not track process leases (for measuring their cost; named leases still work).
    #[arg(long, hide = true)]
    pub no_lease_tracking: bool,
    /// Serve file data through the daemon even where the kernel offers FUSE passthrough.
    #[arg(long)]
    pub no_passthrough: bool,
    /// List directories without the entries' attributes (READDIRPLUS): cheaper for
    /// walks that only read names (`find`), dearer for those that stat or open what
    /// they list (`ls -l`, `grep -r`).
    #[arg(long)]
    pub no_readdirplus: bool,
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
    pub uring: worktreefs::fs::mount::Uring,
    /// Over io_uring, each answer yields its CPU to the caller: the queue thread turns
    /// SCHED_IDLE until the next request (1 ms at most), so the caller wakes on its own
    /// CPU instead of an idle one. `auto` where the daemon has a scheduling group of
    /// its own (a service's control group, or, where CPU control groups do not split
    /// users' sessions, a session of its own as in the background), `off` never,
    /// `always` in a group shared with other programs too (each wait about 1 ms).
    #[arg(
        long,
        env = "WORKTREEFS_YIELD_CPU",
        default_value = "auto",
        value_name = "auto|off|always"
    )]
    pub yield_cpu: worktreefs::fs::mount::YieldCpu,
    /// Keep `user.` extended attributes on files and directories of worktrees. Off by
    /// default: with attributes served, the kernel asks each file's
    /// security.capability before every write(2), one more round trip per write.
    #[arg(long)]
    pub xattr: bool,
    /// Inodes the daemon keeps before it asks the kernel to drop its caches of
    /// worktrees nobody holds (worktrees in use are never dropped).
    #[arg(long, default_value_t = 150_000)]
    pub cache_nodes: usize,
    /// Let other users use the mount (FUSE's allow_other; without root it needs
    /// `user_allow_other` in /etc/fuse.conf). Without it the mount is private to the
    /// user who mounted it. With it, each worktree belongs to the user who created it
    /// and a repository's worktrees are no more readable than its own directory.
    #[arg(long)]
    pub allow_other: bool,
    /// Seconds one checkout filter (a `filter.<name>` command, git-lfs…) may run for a
    /// file before it is ended and the file's read fails (or, for a filter that is not
    /// `required`, shows the blob as committed).
    #[arg(long, default_value_t = 120.0)]
    pub filter_timeout: f64,
    /// Seconds cleanup's inspection of one worktree may take (reading the index, the
    /// upper layer, the repository's refs and objects) before it is given up and the
    /// worktree retained with the reason: something in the repository that blocks a
    /// read (a FIFO where a ref was) then holds no removal after it.
    #[arg(long, default_value_t = 600.0)]
    pub inspect_timeout: f64,
    /// Hours every removal keeps what it removed (upper layer, index, branch tip) for
    /// `worktreefs restore`; 0 keeps nothing.
    #[arg(long, default_value_t = 24.0)]
    pub keep_removed: f64,
    /// Kept removals give way, oldest first, while the state directory's disk has less
    /// than this share free (percent) …
    #[arg(long, default_value_t = 5.0)]
    pub keep_min_free_percent: f64,
    /// … or less than this many GiB free.
    #[arg(long, default_value_t = 2.0)]
    pub keep_min_free_gib: f64,
    /// What an unmount by `umount` or `fusermount3 -u` (an fstab mount at shutdown)
    /// does: keep named leases and their worktrees for the next mount, as
    /// `worktreefs unmount --keep-sessions` does, instead of releasing every lease.
    #[arg(long)]
    pub umount_keeps_sessions: bool,
    /// The ports worktrees get blocks of (LOW-HIGH; below the kernel's ephemeral
    /// ports), each block unique across state directories (root's, or this user's),
    /// given to `run` and `turn` as
    /// WORKTREEFS_PORT (its first port) and WORKTREEFS_PORTS (how many).
    #[arg(long, default_value = "20000-29999", value_name = "LOW-HIGH")]
    pub ports: String,
    /// How many ports each worktree's block has.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub port_block: u16,
}

pub fn run(state: &StateDir, args: MountArgs, log_level: Option<&str>) -> Result<(), Failed> {
    let req = request(state, &args)?;
    if args.foreground {
        return Ok(daemon::serve(req, daemon::ready_fd_from_env())?);
    }
    Ok(cmd_mount(state, req, args.json, log_level)?)
}

/// What `args` ask of the daemon, each value checked.
fn request(state: &StateDir, args: &MountArgs) -> anyhow::Result<MountRequest> {
    let seconds = |flag: &str, v: f64, e: &str| {
        if v.is_finite() && v > 0.0 && v < 1e9 {
            Ok(std::time::Duration::from_secs_f64(v))
        } else {
            Err(anyhow!(
                "--{flag} {v} is not a number of seconds above 0; pass e.g. --{flag} {e}"
            ))
        }
    };
    Ok(MountRequest {
        state: state.clone(),
        mountpoint: args.mountpoint.clone(),
        threads: args.threads,
        linger: args.linger,
        track_leases: !args.no_lease_tracking,
        passthrough: !args.no_passthrough,
        readdirplus: !args.no_readdirplus,
        uring: args.uring,
        yield_cpu: args.yield_cpu,
        xattrs: args.xattr,
        cache_nodes: args.cache_nodes,
        allow_other: args.allow_other,
        filter_timeout: seconds("filter-timeout", args.filter_timeout, "120")?,
        inspect_timeout: seconds("inspect-timeout", args.inspect_timeout, "600")?,
        keep: keep_policy((
            args.keep_removed,
            args.keep_min_free_percent,
            args.keep_min_free_gib,
        ))?,
        on_umount: daemon::AtUnmount::from_keep_sessions(args.umount_keeps_sessions),
        ports: worktreefs::lifecycle::ports::PortRange::parse(&args.ports, args.port_block)
            .map_err(|e| anyhow!("--ports/--port-block: {e}"))?,
    })
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

/// `mount` in the background: said when the state dir is served already (this directory's
/// repository registered there), else the daemon started.
fn cmd_mount(
    state: &StateDir,
    req: MountRequest,
    json: bool,
    log_level: Option<&str>,
) -> anyhow::Result<()> {
    let mountpoint = req.mountpoint.clone();
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
        print_json(MountJson {
            mountpoint: mp,
            pid,
            state_dir: state.root.clone(),
            repos: store.repos()?.iter().map(RepoJson::of).collect(),
            registered: registered.filter(|_| added).map(|r| r.name),
        });
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
