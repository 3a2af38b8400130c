//! The daemon: one per state directory. Takes the state dir's lock, checks the
//! mountpoint, mounts, signals readiness to the process that started it, and serves until
//! unmounted (by `worktreefs unmount`, `umount`, `fusermount3 -u`, or SIGTERM/SIGINT).

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};

use crate::fs::View;
use crate::lifecycle::create::{self, META_MOUNTPOINT};
use crate::store::Store;

mod background;
pub mod checkpoints;
pub mod fuse_access;
mod instance;
pub mod mountpoint;
mod request;
pub mod socket;

pub use crate::mounttable::{is_mountpoint, mount_type};
pub use background::spawn_background;
use background::{block_signals, spawn_signal_thread};
use instance::acquire_lock;
pub use instance::{
    answers, detached, detached_message, leases_in_this_pid_namespace, poke, running_daemon, Holder,
};
use mountpoint::check_mountpoint;
pub use request::{AtUnmount, MountRequest, READY_FD_ENV};

/// Everything `mount` checks before starting a daemon; also run by the foreground daemon.
pub fn prepare(req: &MountRequest) -> anyhow::Result<PathBuf> {
    if let Some(h) = running_daemon(&req.state) {
        if detached(&req.state, &h) {
            bail!(
                "state dir {} is still in use: {}; mount again once it has (`worktreefs status` says when), or end those processes",
                req.state.root.display(),
                detached_message(&h)
            );
        }
        instance::answers(&h, std::time::Duration::from_secs(5)).map_err(|e| anyhow!("{e}"))?;
        bail!(
            "another worktreefs daemon (pid {}) is already serving state dir {} at {}; unmount it first with `worktreefs unmount --state-dir {}`, or use another --state-dir",
            h.pid,
            req.state.root.display(),
            h.mountpoint.display(),
            req.state.root.display()
        );
    }
    // Before anything is made (the default mountpoint): a mount that cannot be leaves
    // nothing behind. The same check as `doctor`'s.
    fuse_access::check().map_err(|r| anyhow!("{r}"))?;
    let mountpoint = match &req.mountpoint {
        Some(m) => m.clone(),
        None => {
            let d = req.state.default_mountpoint();
            default_mountpoint_dir(&d)?;
            d
        }
    };
    check_mountpoint(&mountpoint, &req.state)?;
    let mountpoint = fs::canonicalize(&mountpoint)?;
    Ok(mountpoint)
}

/// Makes the default mountpoint, a directory of this user's: next to the state directory,
/// where (in /tmp, say) another user may have put a name first, so a symlink or a
/// directory of someone else's there is refused, never followed.
fn default_mountpoint_dir(d: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = d.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match fs::DirBuilder::new().mode(0o755).create(d) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => bail!("creating the default mountpoint {}: {e}", d.display()),
    }
    match fs::symlink_metadata(d) {
        Ok(m) if m.file_type().is_symlink() || !m.is_dir() => bail!(
            "the default mountpoint {} is not a directory (a symlink or a file is there); remove it, or give a mountpoint",
            d.display()
        ),
        Ok(m) if m.uid() != nix::unistd::geteuid().as_raw() => bail!(
            "the default mountpoint {} belongs to uid {}, not to you; remove it, or give a mountpoint",
            d.display(),
            m.uid()
        ),
        // A directory of this user's, or a dead mount (checked next).
        _ => Ok(()),
    }
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

/// Raises the daemon's open-file limit to its hard limit: each open file through the mount
/// may hold a descriptor, and so may each removed file still open (the deleted-but-open
/// set, `fs/place.rs`). Returns the limit in force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("could not raise the open-file limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

fn serve_inner(req: &MountRequest, ready: &mut Option<File>) -> anyhow::Result<()> {
    // Before any thread is started, so that every thread inherits it: a signal that
    // unmounts is taken by the signal thread alone (one let through to any other thread
    // would end the daemon at once, its mount left dead). One that comes before the
    // signal thread runs waits for it.
    block_signals();
    let mountpoint = prepare(req)?;
    let limit = raise_open_file_limit();
    tracing::debug!(limit, "open-file limit");
    let mut lock = acquire_lock(&req.state)?;
    // Lock files on this state directory's checkpoint refs made before now are a dead
    // daemon's.
    crate::git::checkpoint_refs::sole_writer_since(std::time::SystemTime::now());
    lock.set_len(0)?;
    // Its pid namespace too: a command elsewhere must not take the pid for one of its own.
    let pid_ns = fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    writeln!(
        lock,
        "{}\n{}\n{pid_ns}",
        std::process::id(),
        mountpoint.display()
    )?;

    // What an earlier `worktreefs unmount` said and no daemon read is not this one's.
    let _ = fs::remove_file(req.state.unmount_mode_file());
    // Before anything runs a filter or an inspection (boot reconcile does both).
    let inspection =
        crate::lifecycle::cleanup::Inspection::new(req.inspect_timeout, req.filter_timeout);
    {
        let store = Store::open_described(&req.state.root)?;
        store.meta_set(META_MOUNTPOINT, &mountpoint.to_string_lossy())?;
        store.meta_set(crate::lifecycle::ports::META_RANGE, &req.ports.to_string())?;
        crate::lifecycle::ports::reclaim_all(&req.state, &store);
        req.keep.record(&store)?;
        crate::lifecycle::admin_entries::repoint_admin_entries(&req.state, &store, &mountpoint)?;
        let mut store = store;
        match create::roll_back_dead_creations(&req.state, &mut store) {
            Ok(0) => {}
            Ok(n) => tracing::info!("boot reconcile: {n} creation(s) killed half-way rolled back"),
            Err(e) => tracing::error!("boot reconcile: rolling back creations failed: {e:#}"),
        }
        // Turns whose process died while no daemon watched: their gates open.
        match store.end_dead_turns(&crate::process::info::liveness) {
            Ok(ended) if !ended.is_empty() => {
                tracing::info!(
                    "boot reconcile: {} turn(s) of dead processes ended",
                    ended.len()
                )
            }
            Ok(_) => {}
            Err(e) => tracing::error!("boot reconcile: ending turns of dead processes failed: {e}"),
        }
        enable_fsmonitor(&store);
    }
    // Boot reconcile: creations killed half-way are rolled back (a creation recorded by a
    // process that is gone), then what a daemon that died left deleting is finished,
    // retained
    // worktrees that are now clean and pushed, before anyone can enter.
    // A removal with a teardown command to run is left `deleting` for the sweeper, which
    // runs the command inside the worktree once the mount serves it.
    crate::lifecycle::cleanup::reconcile_at_boot(
        &req.state,
        &mountpoint,
        &inspection.clone().awaiting_mount(),
    )?;
    let view = Arc::new(View::new(req.state.clone(), mountpoint.clone())?);
    // From here on inspection trusts the index entries git trusts, by what the view's
    // fsmonitor hook would answer.
    let inspection = inspection.asking(&view);
    // While the mount is served, a removal runs the repository's teardown command in the
    // worktree first (an unmount has them run before it unmounts,
    // `cleanup::tear_down_before_unmount`; one no mount serves waits for the next).
    let setups = crate::lifecycle::setup::Launcher {
        program: "/proc/self/exe".into(),
        state: req.state.clone(),
        runners: Default::default(),
    };
    let own_mount = crate::mounttable::OwnMount::default();
    let serving = inspection
        .clone()
        .tearing_down_with(setups.clone(), own_mount.clone());
    view.set_inspection(serving.clone());
    let gate = view.gate();
    let tracker = {
        let view = view.clone();
        crate::lifecycle::holders::Tracker::new(
            &req.state,
            gate.clone(),
            setups.runners.clone(),
            Box::new(move || view.catalog_changed()),
        )?
    };
    {
        let tracker = tracker.clone();
        view.set_pending_leases(Box::new(move || tracker.pending_leases()));
    }
    {
        let tracker = tracker.clone();
        view.set_lease_activity(Box::new(move || tracker.activity()));
    }
    // Boot reconcile: leases of processes that are gone are swept before anyone enters.
    // Setup runs whose runner died with the last daemon end first, as their runner's end
    // would have (a worktree nobody else held is `ready` again): before the sweep of
    // leases whose process is gone releases theirs as a holder's leaving.
    if let Ok(mut store) = Store::open(&req.state.root) {
        crate::lifecycle::setup::fail_orphaned(&mut store);
    }
    tracker.reconcile(&mountpoint)?;
    tracker.spawn_watcher();
    let session = crate::fs::mount::mount(
        view.clone(),
        req.track_leases.then(|| tracker.clone()),
        &mountpoint,
        &crate::fs::mount::MountOptions {
            threads: req.threads,
            passthrough: req.passthrough,
            readdirplus: req.readdirplus,
            allow_other: req.allow_other,
            uring: req.uring,
            xattrs: req.xattrs,
            yield_cpu: req.yield_cpu,
        },
    )?;
    // Which mount is this daemon's: a later probe takes a mount that does not answer for
    // one this daemon left only when it is this very mount.
    if let Some(dev) = crate::mounttable::mount_device(&mountpoint) {
        writeln!(lock, "device {dev}")?;
        own_mount.record(&mountpoint, dev);
    }
    socket::serve(&req.state, view.clone(), gate.clone(), mountpoint.clone())?;
    tracing::info!(mountpoint = %mountpoint.display(), pid = std::process::id(), "mounted");
    if let Some(mut f) = ready.take() {
        let _ = writeln!(f, "ready");
    }
    notify_ready();
    // A signal's unmount cleans up the worktrees with a teardown command first, as
    // `worktreefs unmount` has the daemon do through its socket.
    let before_signal_unmount: Box<dyn FnOnce() + Send> = {
        let (state, view, gate, mountpoint) = (
            req.state.clone(),
            view.clone(),
            gate.clone(),
            mountpoint.clone(),
        );
        let on_umount = req.on_umount;
        Box::new(move || {
            // What an unmount whose cleanup runs asked (a planned restart whose command's
            // wait ran out, say), or one that detached the mount already said (`--lazy`
            // with processes inside, then systemd's SIGTERM), else the mount's default;
            // told to this daemon's end as that unmount would have.
            let at = AtUnmount::being_asked().unwrap_or_else(|| AtUnmount::said(&state, on_umount));
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                socket::clean_up_before_unmount(
                    &state,
                    &view,
                    &gate,
                    &mountpoint,
                    at == AtUnmount::KeepSessions,
                )
            }));
            match ran {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::error!("cleanup before the unmount failed: {e:#}"),
                Err(_) => tracing::error!("cleanup before the unmount failed (a panic)"),
            }
            if let Err(e) = at.tell(&state) {
                tracing::warn!("writing {}: {e}", state.unmount_mode_file().display());
            }
        })
    };
    spawn_signal_thread(mountpoint.clone(), before_signal_unmount);
    let sweeper = crate::lifecycle::sweeper::spawn(
        req.state.clone(),
        crate::lifecycle::sweeper::Settings {
            linger: req.linger,
            cache_nodes: req.cache_nodes,
            inspection: serving,
            setups,
        },
        view.clone(),
        tracker.clone(),
        gate,
    );
    let r = session.run();
    tracing::info!(mountpoint = %mountpoint.display(), "session ended");
    // Its mount is gone: the lock names none a later probe could take for one this daemon
    // left (the number of a device that is gone may be given to another mount).
    {
        use std::io::{Seek, SeekFrom};
        let _ = lock
            .set_len(0)
            .and_then(|()| lock.seek(SeekFrom::Start(0)))
            .and_then(|_| {
                writeln!(
                    lock,
                    "{}\n{}\n{pid_ns}",
                    std::process::id(),
                    mountpoint.display()
                )
            });
    }
    // What the unmount asked, read at once (stopping the sweeper may wait for a cleanup
    // under way, and nothing written later is this unmount's).
    let keep_sessions = AtUnmount::asked(&req.state, req.on_umount) == AtUnmount::KeepSessions;
    // Unmounted (by us, umount or fusermount3 -u): leases go, cleanup runs, then the
    // state dir is free. Lease changes still kept in memory are superseded.
    tracker.stop();
    sweeper.stop();
    // A cleanup before the unmount still under way (one that outlived its command's
    // wait, or a signal's) ends first, and none starts after: the daemon never exits in
    // the middle of one.
    let _ended = crate::lifecycle::cleanup::end_cleanups_before_unmount();
    // A removal with a teardown command to run (of a worktree someone was still in when
    // the cleanup before the unmount ran, or after an unmount by `umount`) waits for the
    // next mount, `deleting`: it never goes without its teardown.
    if let Err(e) = crate::lifecycle::cleanup::reclaim_at_unmount(
        &req.state,
        &mountpoint,
        &inspection.clone().awaiting_mount(),
        keep_sessions,
    ) {
        tracing::error!("cleanup at unmount failed: {e:#}");
    }
    let _ = fs::remove_file(req.state.socket());
    drop(lock);
    r.map_err(|e| anyhow!("FUSE session ended with an error: {e}"))
}

/// Installs the fsmonitor hook and enables it for every registered repository's managed
/// worktrees. Failing that, git falls back to scanning: logged, not fatal.
pub fn enable_fsmonitor(store: &Store) {
    for repo in store.repos().unwrap_or_default() {
        if let Err(e) = crate::git::fsmonitor::enable_for_repo(&repo.gitdir) {
            tracing::warn!(
                "fsmonitor not enabled for repository {} ({e:#}); git status there will scan every file",
                repo.name
            );
        }
    }
}

pub fn ready_fd_from_env() -> Option<OwnedFd> {
    let fd: i32 = std::env::var(READY_FD_ENV).ok()?.parse().ok()?;
    std::env::remove_var(READY_FD_ENV);
    // SAFETY: the parent passed us this descriptor for our exclusive use.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Tells systemd the mount is ready (a `Type=notify` unit, `mount --foreground`): READY=1
/// and this pid on `$NOTIFY_SOCKET`, as sd_notify(3) does. Nothing when it is not set. (The
/// variable stays in the environment, as other threads may read it: what the daemon
/// starts never writes there, and systemd's default `NotifyAccess=main` would not listen.)
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("READY=1\nMAINPID={}\n", std::process::id());
    let sent = (|| -> std::io::Result<()> {
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_encoded_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            // An abstract socket.
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(std::path::Path::new(&path))?,
        };
        sock.send_to_addr(msg.as_bytes(), &addr)?;
        Ok(())
    })();
    match sent {
        Ok(()) => tracing::info!("told systemd the mount is ready"),
        Err(e) => tracing::warn!(
            "NOTIFY_SOCKET is set ({}) but the readiness message could not be sent: {e}",
            path.to_string_lossy()
        ),
    }
}
