//! The runners the daemon starts: `setup --runner REPO/WT` runs the worktree's queued
//! setup command as its owner, with its output capped, and says whether it left work;
//! `setup --teardown REPO/WT` runs the repository's teardown command in the worktree
//! before its removal. Neither is for people (both are hidden).

use std::io::Write;
use std::time::Duration;

use anyhow::anyhow;
use worktreefs::daemon;
use worktreefs::lifecycle::{ports, setup};
use worktreefs::process::supervise::{run_below_as, Below, RunAs};
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::store::{NewLease, SetupEnd, SetupState, Store};

use crate::cli::exit::{Failed, Status};
use crate::cli::state::open_store;

/// The runner: the run the daemon marked running for this worktree, run as a turn's
/// command is (bounded in time, its process tree ended after it) as the worktree's owner
/// with the owner's environment, holding a lease of this process's that gives the
/// worktree back `ready`. Its standard output and error are the log.
pub(super) fn runner(state: &StateDir, repo: &str, name: &str) -> Result<(), Failed> {
    let mut store = open_store(state)?;
    let row = store
        .worktree(repo, name)?
        .ok_or_else(|| anyhow!("worktree '{repo}/{name}' does not exist"))?;
    let run = match store.setup_of(row.id)? {
        Some(r) if r.state == SetupState::Running && r.pid.is_none() => r,
        _ => return Err(anyhow!("{repo}/{name} has no setup waiting for a runner").into()),
    };
    let me = worktreefs::process::info::proc_info(std::process::id() as i32)
        .ok_or_else(|| anyhow!("reading this process's /proc/self/stat"))?;
    let lease = NewLease::Process {
        pid: me.pid,
        start: me.start,
        command: format!("worktreefs setup {repo}/{name}"),
    };
    let fail = |store: &mut Store, holder: Option<&str>, why: String| {
        println!("worktreefs: setup of {repo}/{name} not run: {why}");
        let end = SetupEnd {
            ok: false,
            exit_code: None,
            detail: Some(format!("not run: {why}")),
        };
        store.end_setup(row.id, holder, &end)
    };
    // What came before it is recorded before its lease is taken: its end compares with it.
    // Another runner that recorded itself first runs it: this one ends.
    if !store.setup_runner(row.id, me.pid, me.start)? {
        return Err(anyhow!("{repo}/{name}'s setup has a runner already").into());
    }
    if let Err(e) = store.acquire_lease(row.id, &lease, "its setup command runs") {
        let why = match e {
            worktreefs::store::LeaseError::Conflict(_, state) => format!("the worktree is {state}"),
            worktreefs::store::LeaseError::Occupied(_) => "another holder refused it".into(),
            worktreefs::store::LeaseError::Db(e) => e.to_string(),
        };
        fail(&mut store, None, why)?;
        return Ok(());
    }
    let holder = lease.holder();
    let Some(daemon) = daemon::running_daemon(state) else {
        fail(&mut store, Some(&holder), "nothing is mounted".into())?;
        return Ok(());
    };
    if let Err(why) = its_own_mount(&daemon) {
        fail(&mut store, Some(&holder), why)?;
        return Ok(());
    }
    let dir = daemon.mountpoint.join(repo).join(name);
    let mut env = setup::owner_environment(row.uid);
    env.extend(ports::environment(&store, &row, &dir));
    let who = RunAs::user(row.uid, row.gid);
    println!(
        "worktreefs: setup of {repo}/{name} at {} as uid {} (limit {} s): {}",
        report::rfc3339(worktreefs::store::now_secs()),
        row.uid,
        run.timeout,
        run.command
    );
    let _ = std::io::stdout().flush();
    let command = ["/bin/sh".to_string(), "-c".to_string(), run.command.clone()];
    let limit = Some(Duration::from_secs(run.timeout.max(1)));
    let capped = Capped::start();
    let held_before = holds_work(state, &store, &row, &daemon.mountpoint);
    let ran = run_below_as(&dir, &command, &env, Below::Turn { limit }, Some(&who));
    if let Some(c) = capped {
        c.finish();
    }
    let end = match ran {
        Ok(ended) => {
            use std::os::unix::process::ExitStatusExt;
            let code = ended.status.code();
            match (ended.ended_with, code, ended.status.signal()) {
                (Some(_), _, _) => SetupEnd {
                    ok: false,
                    exit_code: None,
                    detail: Some(format!("timed out after {} s", run.timeout)),
                },
                (None, Some(c), _) => SetupEnd {
                    ok: c == 0,
                    exit_code: Some(c),
                    detail: None,
                },
                (None, None, sig) => SetupEnd {
                    ok: false,
                    exit_code: None,
                    detail: Some(format!("killed by signal {}", sig.unwrap_or(0))),
                },
            }
        }
        Err(e) => SetupEnd {
            ok: false,
            exit_code: e.shell_code().map(i32::from),
            detail: Some(e.to_string()),
        },
    };
    // What it left that cleanup would keep: the worktree is retained for it rather than
    // `ready` again (a lease taken since decides as usual); as it would be when what it
    // holds cannot be told. Only what the command left: a worktree that held work before
    // it (a fork of a changed one) is left as it was.
    use worktreefs::lifecycle::cleanup::Holds;
    let left = match (
        &held_before,
        holds_work(state, &store, &row, &daemon.mountpoint),
    ) {
        (Holds::Work(_), _) | (_, Holds::Nothing) => None,
        (_, Holds::Work(why)) => Some(why),
        (_, Holds::Unknown(why)) => Some(format!("what it holds could not be told: {why}")),
    };
    let path = dir.to_string_lossy().into_owned();
    let after = store.end_setup_leaving(
        row.id,
        Some(&holder),
        &end,
        left.as_deref().map(|why| (path.as_str(), why)),
    )?;
    let ended = store
        .setup_of(row.id)?
        .map(|r| r.summary())
        .unwrap_or_default();
    let why = match &left {
        Some(why) if after == worktreefs::lease::State::Retained => {
            format!(" (what the setup left would be kept: {why})")
        }
        _ => String::new(),
    };
    println!(
        "worktreefs: setup of {repo}/{name} ended at {}: {ended}; the worktree is {after}{why}",
        report::rfc3339(worktreefs::store::now_secs())
    );
    daemon::poke(state);
    // Out of the worktree before this process ends: nothing of it is inside any more.
    let _ = std::env::set_current_dir("/");
    Ok(())
}

/// What worktree `row` holds now, as cleanup would judge it, as the runner can inspect
/// it (without the view's fsmonitor answers, each inspection bounded); a failure to
/// inspect is said in the log and counts as not known.
fn holds_work(
    state: &StateDir,
    store: &Store,
    row: &worktreefs::store::WorktreeRow,
    mountpoint: &std::path::Path,
) -> worktreefs::lifecycle::cleanup::Holds {
    use worktreefs::lifecycle::cleanup::{would_keep, Holds, Inspection};
    let how = Inspection::new(
        setup::LEFT_WORK_LIMIT,
        worktreefs::git::filters::DEFAULT_TIMEOUT.min(setup::LEFT_WORK_LIMIT),
    );
    match would_keep(state, store, row, mountpoint, &how) {
        Ok(holds) => holds,
        Err(e) => {
            println!("worktreefs: what the worktree holds could not be inspected: {e:#}");
            Holds::Unknown(format!("{e:#}"))
        }
    }
}

/// Whether the mount on top at `daemon`'s mountpoint is its own (a lazy unmount may have
/// left it serving a detached mount while another state directory's mounts there): a
/// runner enters only its own. Err: why not.
fn its_own_mount(daemon: &daemon::Holder) -> Result<(), String> {
    let Some(own) = &daemon.device else {
        return Ok(());
    };
    match worktreefs::mounttable::mount_device(&daemon.mountpoint) {
        Some(top) if top == *own => Ok(()),
        _ => Err(format!(
            "the mount at {} is no longer this state dir's daemon's (it was detached)",
            daemon.mountpoint.display()
        )),
    }
}

/// The teardown's runner: waits for the daemon's word (it is let into the deleting
/// worktree from then on), runs the repository's teardown command in the worktree as a
/// turn's command is run, as the worktree's owner with the owner's environment, holding
/// no lease, and exits as the command did.
pub(super) fn teardown_runner(
    state: &StateDir,
    repo: &str,
    name: &str,
    limit: u64,
) -> Result<(), Failed> {
    let mut word = String::new();
    let _ = std::io::stdin().read_line(&mut word);
    if word.trim() != "go" {
        return Err(anyhow!("the daemon did not let this teardown in").into());
    }
    let store = open_store(state)?;
    let row = store
        .worktree(repo, name)?
        .ok_or_else(|| anyhow!("worktree '{repo}/{name}' does not exist"))?;
    let command = store
        .hooks_of(row.repo_id)?
        .on_remove
        .ok_or_else(|| anyhow!("repository '{repo}' has no teardown command"))?;
    let daemon = daemon::running_daemon(state)
        .ok_or_else(|| anyhow!("nothing is mounted for state dir {}", state.root.display()))?;
    its_own_mount(&daemon).map_err(|why| anyhow!("{why}"))?;
    let dir = daemon.mountpoint.join(repo).join(name);
    let mut env = setup::owner_environment(row.uid);
    env.extend(ports::environment(&store, &row, &dir));
    drop(store);
    println!(
        "worktreefs: teardown of {repo}/{name} at {} as uid {} (limit {limit} s): {command}",
        report::rfc3339(worktreefs::store::now_secs()),
        row.uid
    );
    let _ = std::io::stdout().flush();
    let argv = ["/bin/sh".to_string(), "-c".to_string(), command];
    let limit = Some(Duration::from_secs(limit.max(1)));
    let who = RunAs::user(row.uid, row.gid);
    let capped = Capped::start();
    let ran = run_below_as(&dir, &argv, &env, Below::Turn { limit }, Some(&who));
    if let Some(c) = capped {
        c.finish();
    }
    let _ = std::env::set_current_dir("/");
    let (said, code) = match ran {
        Ok(ended) if ended.ended_with.is_some() => {
            ("timed out".to_string(), report::EXIT_TIMED_OUT)
        }
        Ok(ended) => match ended.status.code() {
            Some(0) => ("ok".to_string(), 0),
            Some(c) => (format!("failed (exit {c})"), c),
            None => ("killed by a signal".to_string(), 1),
        },
        Err(e) => (e.to_string(), e.shell_code().map(i32::from).unwrap_or(1)),
    };
    println!(
        "worktreefs: teardown of {repo}/{name} ended at {}: {said}",
        report::rfc3339(worktreefs::store::now_secs())
    );
    let _ = std::io::stdout().flush();
    match code {
        0 => Ok(()),
        c => Err(Status::of(c).into()),
    }
}

/// A runner's output (the log, its standard output and error) passed through a pipe
/// while its command runs, so that at most [`setup::LOG_LIMIT`] bytes of what the command
/// prints are kept: the rest is counted and said at the end.
struct Capped {
    log: std::os::fd::OwnedFd,
    reader: std::thread::JoinHandle<()>,
}

impl Capped {
    /// Puts the pipe in place of this process's standard output and error (the command
    /// inherits it). None when that cannot be done: then the output goes to the log
    /// uncapped.
    fn start() -> Option<Capped> {
        use std::io::Read;
        use std::os::fd::{AsRawFd, FromRawFd};
        let _ = std::io::stdout().flush();
        // SAFETY: dup of our own standard output.
        let log = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if log < 0 {
            return None;
        }
        // SAFETY: just made, ours alone.
        let log = unsafe { std::os::fd::OwnedFd::from_raw_fd(log) };
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
        let out = log.try_clone().ok()?;
        let put_back = |log: &std::os::fd::OwnedFd| {
            // SAFETY: dup2 of a descriptor we own onto our standard output and error.
            unsafe {
                libc::dup2(log.as_raw_fd(), 1);
                libc::dup2(log.as_raw_fd(), 2);
            }
        };
        // SAFETY: dup2 onto our own standard output and error.
        if unsafe { libc::dup2(w.as_raw_fd(), 1) < 0 || libc::dup2(w.as_raw_fd(), 2) < 0 } {
            put_back(&log);
            return None;
        }
        drop(w);
        let reader = std::thread::Builder::new()
            .name("setup-log".into())
            .spawn(move || {
                let mut from = std::fs::File::from(r);
                let mut to = std::fs::File::from(out);
                let (mut kept, mut dropped) = (0u64, 0u64);
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    };
                    let room = setup::LOG_LIMIT.saturating_sub(kept) as usize;
                    let keep = n.min(room);
                    if keep > 0 && to.write_all(&buf[..keep]).is_ok() {
                        kept += keep as u64;
                    }
                    dropped += (n - keep) as u64;
                }
                if dropped > 0 {
                    let _ = writeln!(
                        to,
                        "\n[worktreefs: {dropped} more bytes of output were not kept: a log keeps {} MiB]",
                        setup::LOG_LIMIT >> 20
                    );
                }
            });
        match reader {
            Ok(reader) => Some(Capped { log, reader }),
            Err(_) => {
                put_back(&log);
                None
            }
        }
    }

    /// Puts the log back as this process's standard output and error and waits (a
    /// while) for what the pipe still holds to be written.
    fn finish(self) {
        use std::os::fd::AsRawFd;
        let _ = std::io::stdout().flush();
        // SAFETY: dup2 of a descriptor we own onto our standard output and error.
        unsafe {
            libc::dup2(self.log.as_raw_fd(), 1);
            libc::dup2(self.log.as_raw_fd(), 2);
        }
        // Every writer has ended with the command (its leftovers were ended after it).
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while !self.reader.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
