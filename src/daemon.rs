//! The daemon: one per state directory. Takes the state dir's lock, checks the
//! mountpoint, mounts, signals readiness to the process that started it, and serves until
//! unmounted (by `worktreefs unmount`, `umount`, `fusermount3 -u`, or SIGTERM/SIGINT).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use fuser::{Config, MountOption, Session, SessionACL};

use crate::fs::adapter::WorktreeFs;
use crate::fs::View;
use crate::state::StateDir;
use crate::store::Store;
use crate::worktree::{self, META_MOUNTPOINT};

pub const READY_FD_ENV: &str = "WORKTREEFS_READY_FD";

/// Who holds a state directory's lock, as written in the lock file.
#[derive(Debug, Clone)]
pub struct Holder {
    pub pid: i32,
    pub mountpoint: PathBuf,
}

fn read_holder(path: &Path) -> Option<Holder> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse().ok()?;
    let mountpoint = PathBuf::from(lines.next()?.trim());
    Some(Holder { pid, mountpoint })
}

/// The daemon serving `state`, if one is running (its lock is held).
pub fn running_daemon(state: &StateDir) -> Option<Holder> {
    let file = OpenOptions::new().read(true).open(state.lock_file()).ok()?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return None;
    }
    Some(read_holder(&state.lock_file()).unwrap_or(Holder {
        pid: 0,
        mountpoint: PathBuf::new(),
    }))
}

/// Takes the state directory's exclusive lock, or says who has it.
fn acquire_lock(state: &StateDir) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(state.lock_file())
        .with_context(|| format!("opening {}", state.lock_file().display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let who = read_holder(&state.lock_file());
        bail!(
            "another worktreefs daemon{} is already serving state dir {}{}; unmount it first with `worktreefs unmount --state-dir {}`, or use another --state-dir",
            who.as_ref().map(|h| format!(" (pid {})", h.pid)).unwrap_or_default(),
            state.root.display(),
            who.as_ref()
                .map(|h| format!(" at {}", h.mountpoint.display()))
                .unwrap_or_default(),
            state.root.display()
        );
    }
    Ok(file)
}

/// The source and filesystem type mounted at `path`, if anything is.
pub fn mount_type(path: &Path) -> Option<(String, String)> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let want = path.to_string_lossy();
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (unescape_mount_path(target) == want).then(|| (src.to_string(), fstype.to_string()))
    })
}

fn is_worktreefs_mount(path: &Path) -> bool {
    matches!(mount_type(path), Some((src, fstype)) if src == "worktreefs" && fstype.starts_with("fuse"))
}

pub fn is_mountpoint(path: &Path) -> bool {
    mount_type(path).is_some()
}

fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn check_mountpoint(path: &Path) -> anyhow::Result<()> {
    // A worktreefs mount whose daemon died (no daemon holds this state dir's lock, checked
    // by the caller) answers ENOTCONN to everything: detach it and carry on.
    if let Ok(canonical) =
        fs::canonicalize(path).or_else(|_| Ok::<_, std::io::Error>(path.to_path_buf()))
    {
        if is_worktreefs_mount(&canonical) {
            tracing::warn!(
                "detaching the stale worktreefs mount at {} left by a daemon that is gone",
                canonical.display()
            );
            eprintln!(
                "worktreefs: detaching the stale mount at {} (its daemon is gone)",
                canonical.display()
            );
            nix::mount::umount2(&canonical, nix::mount::MntFlags::MNT_DETACH)
                .with_context(|| format!("detaching the stale mount at {}", canonical.display()))?;
        }
    }
    let meta = fs::metadata(path).map_err(|e| {
        anyhow!(
            "mountpoint {} cannot be used: {e}; create an empty directory there first",
            path.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "mountpoint {} is not a directory; pass an empty directory",
            path.display()
        );
    }
    if is_mountpoint(path) {
        bail!(
            "mountpoint {} is already a mount; unmount it first or pick another directory",
            path.display()
        );
    }
    if fs::read_dir(path)?.next().is_some() {
        bail!(
            "mountpoint {} is not empty; worktreefs mounts only on an empty directory",
            path.display()
        );
    }
    Ok(())
}

pub struct MountRequest {
    pub state: StateDir,
    pub mountpoint: Option<PathBuf>,
    pub threads: usize,
    /// Grace period, in seconds, between a worktree's last release and its cleanup.
    pub linger: u64,
    /// Process leases (off only to measure what they cost).
    pub track_leases: bool,
    /// FUSE passthrough where the kernel offers it.
    pub passthrough: bool,
    /// Listings with the entries' attributes (READDIRPLUS) where the kernel offers them.
    pub readdirplus: bool,
    /// Inodes kept before the kernel's caches of idle worktrees are dropped.
    pub cache_nodes: usize,
}

/// Everything `mount` checks before starting a daemon; also run by the foreground daemon.
pub fn prepare(req: &MountRequest) -> anyhow::Result<PathBuf> {
    if let Some(h) = running_daemon(&req.state) {
        bail!(
            "another worktreefs daemon (pid {}) is already serving state dir {} at {}; unmount it first with `worktreefs unmount --state-dir {}`, or use another --state-dir",
            h.pid,
            req.state.root.display(),
            h.mountpoint.display(),
            req.state.root.display()
        );
    }
    let mountpoint = match &req.mountpoint {
        Some(m) => m.clone(),
        None => {
            let d = req.state.default_mountpoint();
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
    };
    check_mountpoint(&mountpoint)?;
    let mountpoint = fs::canonicalize(&mountpoint)?;
    // The device can be named for tests of the refusal; the kernel's is /dev/fuse.
    let device = std::env::var_os("WORKTREEFS_FUSE_DEVICE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/fuse"));
    if !device.exists() {
        bail!(
            "{} is missing: the fuse kernel module is not loaded (try `modprobe fuse`), or this container was started without access to /dev/fuse",
            device.display()
        );
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open(&device) {
        bail!(
            "cannot open {}: {e}; worktreefs needs permission to use FUSE (run as root or add the user to the fuse group)",
            device.display()
        );
    }
    Ok(mountpoint)
}

/// Runs the daemon in this process until the filesystem is unmounted. `ready` receives one
/// line: "ready" once the mount answers, or "error: …".
pub fn serve(req: MountRequest, ready: Option<OwnedFd>) -> anyhow::Result<()> {
    let mut ready = ready.map(File::from);
    let result = serve_inner(&req, &mut ready);
    if let (Err(e), Some(f)) = (&result, ready.as_mut()) {
        let _ = writeln!(f, "error: {e:#}");
    }
    result
}

fn serve_inner(req: &MountRequest, ready: &mut Option<File>) -> anyhow::Result<()> {
    let mountpoint = prepare(req)?;
    let mut lock = acquire_lock(&req.state)?;
    lock.set_len(0)?;
    writeln!(lock, "{}\n{}", std::process::id(), mountpoint.display())?;

    {
        let store = Store::open(&req.state.root)?;
        store.meta_set(META_MOUNTPOINT, &mountpoint.to_string_lossy())?;
        worktree::repoint_admin_entries(&store, &mountpoint)?;
        enable_fsmonitor(&store);
    }
    // Boot reconcile: finish what a daemon that died left deleting, remove retained
    // worktrees that are now clean and pushed, before anyone can enter.
    crate::cleanup::reconcile_at_boot(&req.state, &mountpoint)?;
    let view = Arc::new(View::new(req.state.clone(), mountpoint.clone())?);
    let tracker = {
        let view = view.clone();
        crate::holders::Tracker::new(req.state.clone(), Box::new(move || view.catalog_changed()))?
    };
    // Boot reconcile: leases of processes that are gone are swept before anyone enters.
    tracker.reconcile(&mountpoint)?;
    tracker.spawn_watcher();
    let fs = WorktreeFs::new(
        view.clone(),
        req.track_leases.then(|| tracker.clone()),
        req.passthrough,
        req.readdirplus,
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("worktreefs".into()),
        MountOption::Subtype("worktreefs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = if nix::unistd::geteuid().is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(req.threads.max(1));
    config.clone_fd = true;

    block_signals();
    let session = Session::new(fs, &mountpoint, &config).map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) || e.kind() == std::io::ErrorKind::PermissionDenied
        {
            anyhow!(
                "no permission to mount at {}: {e}; run as root or allow FUSE mounts for this user",
                mountpoint.display()
            )
        } else {
            anyhow!("mounting at {} failed: {e}", mountpoint.display())
        }
    })?;
    // Invalidations are sent from their own thread, never from the thread answering a
    // request: the kernel holds a directory's lock while it waits for our answer to a
    // lookup, mkdir or rmdir in it, and invalidating an entry of that directory takes the
    // same lock (a deadlock if done in the request's thread).
    let notifier = session.notifier();
    let (inval_tx, inval_rx) = std::sync::mpsc::channel::<crate::fs::Inval>();
    let _ = std::thread::Builder::new()
        .name("invalidate".into())
        .spawn(move || {
            for what in inval_rx {
                let result = match &what {
                    crate::fs::Inval::Inode(ino) => {
                        notifier.inval_inode(fuser::INodeNo(*ino), 0, 0)
                    }
                    crate::fs::Inval::Entry(parent, name) => {
                        notifier.inval_entry(fuser::INodeNo(*parent), name)
                    }
                };
                // ENOENT: the kernel had nothing cached; nothing to drop.
                if let Err(e) = result {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        tracing::debug!("invalidating a kernel cache entry: {e}");
                    }
                }
            }
        });
    let inval_tx = parking_lot::Mutex::new(inval_tx);
    view.set_invalidator(Box::new(move |what| {
        let _ = inval_tx.lock().send(what);
    }));
    tracing::info!(mountpoint = %mountpoint.display(), pid = std::process::id(), "mounted");
    if let Some(mut f) = ready.take() {
        let _ = writeln!(f, "ready");
    }
    spawn_signal_thread(mountpoint.clone());
    spawn_sweeper(
        req.state.clone(),
        req.linger,
        req.cache_nodes,
        view.clone(),
        tracker,
    );
    let r = session.run();
    tracing::info!(mountpoint = %mountpoint.display(), "session ended");
    // Unmounted (by us, umount or fusermount3 -u): leases go, cleanup runs, then the
    // state dir is free.
    if let Err(e) = crate::cleanup::reclaim_at_unmount(&req.state, &mountpoint) {
        tracing::error!("cleanup at unmount failed: {e:#}");
    }
    drop(lock);
    r.map_err(|e| anyhow!("FUSE session ended with an error: {e}"))
}

/// Moves worktrees whose grace period is over from `lingering` to `deleting` and runs
/// their cleanup (removed or retained). Four times a second: a worktree is marked within a
/// quarter second of its grace period ending.
fn spawn_sweeper(
    state: StateDir,
    linger: u64,
    cache_nodes: usize,
    view: Arc<View>,
    tracker: Arc<crate::holders::Tracker>,
) {
    let _ = std::thread::Builder::new()
        .name("sweeper".into())
        .spawn(move || {
            let mut store = match Store::open(&state.root) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("lifecycle sweeper cannot open the store: {e}");
                    return;
                }
            };
            let mut shed = std::collections::HashMap::new();
            loop {
                std::thread::sleep(Duration::from_millis(250));
                // Memory: idle worktrees' inodes go when the table is over its budget.
                view.shed_idle(cache_nodes, &mut shed, Duration::from_secs(10));
                // A process inside (working directory, open file) that the kernel's caches
                // kept from ever asking us gets its lease before the worktree may go.
                for (id, repo, name) in store.lingering_past(linger as i64).unwrap_or_default() {
                    let path = view.mountpoint().join(repo).join(name);
                    if tracker.adopt_processes_inside(id, &path) {
                        tracing::info!("{} is still in use: leased again", path.display());
                    }
                }
                match store.mark_deleting_after_grace(linger as i64) {
                    Ok(ids) if !ids.is_empty() => {
                        tracing::info!(
                            "worktrees {ids:?} have no lease after {linger} s: deleting"
                        );
                        view.catalog_changed();
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("lifecycle sweep failed: {e}"),
                }
                // Cleanup of every deleting worktree nobody else is at (those marked just
                // now, and any whose cleanup someone else left unfinished).
                if !store
                    .worktrees_in(crate::lease::State::Deleting)
                    .unwrap_or_default()
                    .is_empty()
                {
                    let done =
                        crate::cleanup::finish_all_deleting(&state, &mut store, view.mountpoint());
                    if !done.is_empty() {
                        view.catalog_changed();
                    }
                }
            }
        });
}

fn signal_set() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGHUP);
    set
}

fn block_signals() {
    let _ = signal_set().thread_block();
}

/// SIGTERM, SIGINT or SIGHUP unmount the filesystem, which ends the session cleanly.
fn spawn_signal_thread(mountpoint: PathBuf) {
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = signal_set().wait() {
                tracing::info!("{sig:?}: unmounting {}", mountpoint.display());
                if let Err(e) = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH) {
                    tracing::error!("unmount of {} failed: {e}", mountpoint.display());
                }
            }
        });
}

/// Starts the daemon in the background and returns once the mount is ready (or failed).
pub fn spawn_background(req: &MountRequest, log_level: Option<&str>) -> anyhow::Result<i32> {
    let state = &req.state;
    let mountpoint = req.mountpoint.as_deref();
    let (read_end, write_end) = nix::unistd::pipe()?;
    let exe = std::env::current_exe()?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.log_file())?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount");
    if let Some(m) = mountpoint {
        cmd.arg(m);
    }
    cmd.arg("--state-dir")
        .arg(&state.root)
        .arg("--foreground")
        .arg("--linger")
        .arg(req.linger.to_string())
        .arg("--threads")
        .arg(req.threads.to_string());
    if !req.track_leases {
        cmd.arg("--no-lease-tracking");
    }
    if !req.passthrough {
        cmd.arg("--no-passthrough");
    }
    if !req.readdirplus {
        cmd.arg("--no-readdirplus");
    }
    cmd.arg("--cache-nodes").arg(req.cache_nodes.to_string());
    if let Some(l) = log_level {
        cmd.arg("--log-level").arg(l);
    }
    cmd.env(READY_FD_ENV, write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let fd = write_end.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let flags = libc::fcntl(fd, libc::F_GETFD);
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the daemon")?;
    drop(write_end);
    let mut answer = String::new();
    File::from(read_end).read_to_string(&mut answer)?;
    let answer = answer.trim();
    if answer == "ready" {
        return Ok(child.id() as i32);
    }
    if let Some(msg) = answer.strip_prefix("error: ") {
        bail!("{msg}");
    }
    bail!(
        "the daemon exited before the mount was ready; see {}",
        state.log_file().display()
    )
}

/// Installs the fsmonitor hook and enables it for every registered repository's managed
/// worktrees. Failing that, git falls back to scanning: logged, not fatal.
pub fn enable_fsmonitor(store: &Store) {
    for repo in store.repos().unwrap_or_default() {
        if let Err(e) = crate::fsmonitor::enable_for_repo(&repo.gitdir) {
            tracing::warn!(
                "fsmonitor not enabled for repository {} ({e:#}); git status there will scan every file",
                repo.name
            );
        }
    }
}

/// Asks the running daemon, if any, to re-read the store now (after the CLI changed
/// repositories or worktrees), so its listings are current when the command returns.
pub fn poke(state: &StateDir) {
    if let Some(h) = running_daemon(state) {
        let _ = fs::symlink_metadata(
            h.mountpoint
                .join(crate::fs::CONTROL_NAME)
                .join(crate::fs::REFRESH_NAME),
        );
    }
}

pub fn ready_fd_from_env() -> Option<OwnedFd> {
    let fd: i32 = std::env::var(READY_FD_ENV).ok()?.parse().ok()?;
    std::env::remove_var(READY_FD_ENV);
    // SAFETY: the parent passed us this descriptor for our exclusive use.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub enum Unmounted {
    /// Unmounted, and the daemon finished its cleanup and exited.
    Done(PathBuf),
    /// `--lazy` with processes inside: detached; these are still inside ("pid (command)").
    Detached(PathBuf, Vec<String>),
}

/// Unmounts the filesystem served for `state` and waits for its daemon to finish (it
/// releases every lease and runs the cleanup first). With processes inside: refused,
/// naming them, or with `lazy`, detached and left to finish in the background.
pub fn unmount(state: &StateDir, lazy: bool, timeout: Duration) -> anyhow::Result<Unmounted> {
    let holder = running_daemon(state);
    let mountpoint = match &holder {
        Some(h) => h.mountpoint.clone(),
        None => {
            let store = Store::open(&state.root)?;
            let m = worktree::mountpoint_of(state, &store);
            if is_mountpoint(&m) {
                // A daemon that died left its mount behind: detach it.
                nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)
                    .with_context(|| format!("detaching the stale mount at {}", m.display()))?;
                return Ok(Unmounted::Done(m));
            }
            bail!(
                "nothing is mounted for state dir {}: no worktreefs daemon is running; start one with `worktreefs mount`",
                state.root.display()
            );
        }
    };
    let inside = crate::holders::describe_processes_inside(&mountpoint);
    if !inside.is_empty() {
        if !lazy {
            bail!(
                "{} is in use by {} process(es): {}; they must leave it (cd out, close files, or end them) before `worktreefs unmount`, or detach now with `worktreefs unmount --lazy` and cleanup runs once they have left",
                mountpoint.display(),
                inside.len(),
                inside.join(", ")
            );
        }
        nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("detaching {}", mountpoint.display()))?;
        return Ok(Unmounted::Detached(mountpoint, inside));
    }
    let flags = if lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    match nix::mount::umount2(&mountpoint, flags) {
        Ok(()) => {}
        Err(nix::errno::Errno::EBUSY) => bail!(
            "{} is busy (something the process scan could not name holds it, such as a mount below it or a mapped file); leave it and run `worktreefs unmount` again, or `worktreefs unmount --lazy`",
            mountpoint.display()
        ),
        Err(nix::errno::Errno::EPERM) => {
            let status = Command::new("fusermount3")
                .arg("-u")
                .arg(&mountpoint)
                .status()
                .context("running fusermount3 -u")?;
            if !status.success() {
                bail!("fusermount3 -u {} failed", mountpoint.display());
            }
        }
        Err(e) => bail!("unmounting {} failed: {e}", mountpoint.display()),
    }
    let deadline = Instant::now() + timeout;
    while running_daemon(state).is_some() {
        if Instant::now() > deadline {
            bail!(
                "{} was unmounted but the daemon (pid {}) has not exited after {:?}; see {}",
                mountpoint.display(),
                holder.map(|h| h.pid).unwrap_or(0),
                timeout,
                state.log_file().display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Unmounted::Done(mountpoint))
}
