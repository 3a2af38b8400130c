//! The process tree below a `turn` (a subreaper): its command's timeout, and the end of
//! everything the command left running, so nothing a turn started goes on writing once
//! its gate is open.
//!
//! Every process is signalled through a pidfd opened before it is checked to be the one
//! the walk found (its parent then is this process or one found before it): a pid reused
//! by another process meanwhile is never signalled. (Where no pidfd can be had, by pid:
//! the turn raises its descriptor limit first, so only a kernel or filter without
//! pidfd_open leaves it so.) A SIGTERM goes with a SIGCONT, so a
//! stopped process acts on it (as timeout(1) does). The end is a freeze: every process
//! of the tree is stopped (a stopped process cannot fork) until a walk finds none it had
//! not stopped, then all are killed, so a chain of processes that each fork the next and
//! exit cannot outrun it.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::info::{is_zombie, proc_info};
use super::pidfd::{pidfd_open, pidfd_signal};

/// One process below this one.
pub struct Proc {
    pub pid: libc::pid_t,
    /// None where no pidfd could be had for it (a kernel before 5.3, a seccomp filter,
    /// out of descriptors): it is then signalled by pid.
    fd: Option<OwnedFd>,
}

impl Proc {
    /// Sends `sig`; false when the process is gone (or could not be signalled).
    pub fn signal(&self, sig: libc::c_int) -> bool {
        match &self.fd {
            Some(fd) => pidfd_signal(fd, sig).unwrap_or(false),
            // SAFETY: plain kill(2) of a process found below this one a moment ago.
            None => unsafe { libc::kill(self.pid, sig) == 0 },
        }
    }

    /// Whether it has exited (a zombie, or reaped).
    pub fn exited(&self) -> bool {
        match &self.fd {
            Some(fd) => exited(fd),
            None => is_zombie_or_gone(self.pid),
        }
    }
}

/// Whether the process of `pidfd` has exited: its pidfd reads ready.
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    exited(pidfd)
}

fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) of one descriptor we own, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn is_zombie_or_gone(pid: libc::pid_t) -> bool {
    super::info::read_proc(&format!("/proc/{pid}/stat")).map_or(true, |s| is_zombie(&s))
}

/// The children of `pid`, from `/proc/<pid>/task/*/children` (every thread's).
fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every process below `root` (children, theirs, …), each checked as the module says.
pub fn below(root: libc::pid_t) -> Vec<Proc> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for pid in children_of(parent) {
            if !seen.insert(pid) {
                continue;
            }
            // Without a pidfd for another reason than the process being gone (no
            // pidfd_open in this kernel, a seccomp filter, out of descriptors), it is
            // still walked and signalled, by pid.
            let fd = pidfd_open(pid);
            if fd.is_none() && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                continue; // gone since the listing
            }
            // Opened first, checked after: the pidfd is of the process that has `parent`
            // as its parent now, not of one that took the pid since.
            if proc_info(pid).is_none_or(|p| p.ppid != parent) {
                continue;
            }
            found.push(Proc { pid, fd });
            parents.push(pid);
        }
    }
    found
}

/// Every process below this one.
pub fn descendants() -> Vec<Proc> {
    below(std::process::id() as libc::pid_t)
}

/// Reaps every child of this process that has exited (a subreaper adopts orphans: they
/// must not pile up as zombies).
fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only `status`.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            break;
        }
    }
}

/// Live processes among `procs`.
fn live(procs: &[Proc]) -> impl Iterator<Item = &Proc> {
    procs.iter().filter(|p| !p.exited())
}

/// SIGTERM and SIGCONT to `p`.
fn terminate(p: &Proc) {
    p.signal(libc::SIGTERM);
    p.signal(libc::SIGCONT);
}

/// Ends everything below this process (a subreaper, once its command has exited): SIGTERM
/// (with SIGCONT) to every process of the tree, and to each that joins it within `grace`
/// (a leftover's child adopted after its parent ended); then the freeze and SIGKILL for
/// what is still there, for at most `limit`. Returns the pids still alive after that
/// (none unless processes keep escaping the freeze or cannot be signalled).
///
/// The tree is gone only when a walk right after reaping finds no process at all: one
/// that finds only processes that exited proves nothing, since the children of a process
/// that exited after this process's children were listed come to this subreaper unseen.
pub fn end_all(grace: Duration, limit: Duration) -> Vec<libc::pid_t> {
    reap();
    if descendants().is_empty() {
        return Vec::new();
    }
    let mut termed: HashSet<libc::pid_t> = HashSet::new();
    let end = Instant::now() + grace;
    loop {
        reap();
        let now = descendants();
        if now.is_empty() {
            return Vec::new();
        }
        for p in live(&now) {
            if termed.insert(p.pid) {
                terminate(p);
            }
        }
        if Instant::now() >= end {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let end = Instant::now() + limit;
    loop {
        reap();
        let mut tree = descendants();
        if tree.is_empty() {
            return Vec::new();
        }
        // Stop every process, again for those a walk finds that were not stopped (forked
        // before their parent stopped), until none is new.
        let mut stopped: HashSet<libc::pid_t> = HashSet::new();
        loop {
            let mut new = false;
            for p in &tree {
                if stopped.insert(p.pid) {
                    p.signal(libc::SIGSTOP);
                    new = true;
                }
            }
            if !new || Instant::now() >= end {
                break;
            }
            let again = descendants();
            tree.extend(again.into_iter().filter(|p| !stopped.contains(&p.pid)));
        }
        for p in &tree {
            p.signal(libc::SIGKILL);
        }
        reap();
        if Instant::now() >= end {
            reap();
            return live(&descendants()).map(|p| p.pid).collect();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a command past its timeout has, after SIGTERM, before SIGKILL.
pub const KILL_AFTER: Duration = Duration::from_secs(5);

/// A turn's clock: a thread that sends SIGTERM (with SIGCONT) to the command and every
/// process below this one once the limit has passed, and SIGKILL to what is still there
/// [`KILL_AFTER`] later; and, whatever the limit, SIGKILL [`KILL_AFTER`] after a SIGTERM
/// or SIGHUP this process passed on to the command (`turns end`, a server that went:
/// [`on_signal`] wakes it), so a command that ignores it does not keep the turn. Nothing
/// is sent once the command has exited (its pidfd reads ready), so a command that ends
/// at the limit is not reported as timed out. The thread is made before the command
/// starts (a clock that could not be kept refuses to start it) and blocks every signal,
/// so signals sent to the process are taken on the thread that waits for the command.
pub struct Timer {
    start: std::sync::mpsc::Sender<Started>,
    wake: OwnedFd,
    thread: std::thread::JoinHandle<Option<libc::c_int>>,
}

/// The command the timer counts for, and whether it is still an unreaped child (for a
/// kernel without pidfds: the waiting thread clears it before it reaps the command).
struct Started {
    command: Proc,
    unreaped: &'static std::sync::atomic::AtomicI32,
}

/// The write end of the running timer's pipe, for [`on_signal`] (-1: none).
static WAKE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Tells the running timer, if any, that a SIGTERM or SIGHUP was passed on to the
/// command: it sends SIGKILL [`KILL_AFTER`] later if the command is still there.
/// Async-signal-safe (an atomic load and a write(2)), for a signal handler.
pub fn on_signal() {
    let fd = WAKE.load(std::sync::atomic::Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) of one byte to a pipe this process made (non-blocking).
        unsafe { libc::write(fd, b"T".as_ptr().cast(), 1) };
    }
}

impl Timer {
    /// A timer of `limit` (None: none, only the end after a signal passed on), counting
    /// from [`Timer::started`].
    pub fn new(limit: Option<Duration>) -> std::io::Result<Timer> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) into an array of two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made and are owned here.
        let (read, wake) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (start, starts) = std::sync::mpsc::channel::<Started>();
        // The thread starts with every signal blocked (it inherits this thread's mask).
        // SAFETY: sigfillset and pthread_sigmask on local sets.
        let old = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            old
        };
        let thread = std::thread::Builder::new()
            .name("turn-clock".into())
            .spawn(move || {
                let Ok(Started { command, unreaped }) = starts.recv() else {
                    return None;
                };
                clock(&read, &command, unreaped, limit)
            });
        // SAFETY: putting back the mask found.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        let thread = thread?;
        WAKE.store(wake.as_raw_fd(), std::sync::atomic::Ordering::SeqCst);
        Ok(Timer {
            start,
            wake,
            thread,
        })
    }

    /// The command started: `pid`, a child of this process not yet waited for, whose pid
    /// `unreaped` holds until it is about to be reaped. The clock runs from now.
    pub fn started(&self, pid: libc::pid_t, unreaped: &'static std::sync::atomic::AtomicI32) {
        let command = Proc {
            pid,
            fd: pidfd_open(pid),
        };
        let _ = self.start.send(Started { command, unreaped });
    }

    /// Stops it (the command has exited, or never started): the signal its limit made it
    /// send last, if the command ran past the limit.
    pub fn stop(self) -> Option<libc::c_int> {
        WAKE.store(-1, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: write(2) of one byte to the pipe this timer owns.
        unsafe { libc::write(self.wake.as_raw_fd(), b"S".as_ptr().cast(), 1) };
        drop(self.start);
        self.thread.join().unwrap_or(None)
    }
}

/// The timer's thread: waits on its pipe (`S`: stop, `T`: a signal was passed on) and
/// its deadlines. Returns the signal the limit made it send last, if it fired.
fn clock(
    read: &OwnedFd,
    command: &Proc,
    unreaped: &'static std::sync::atomic::AtomicI32,
    limit: Option<Duration>,
) -> Option<libc::c_int> {
    // The command, and every other process below this one (the command's own and those
    // it left to this subreaper already), each once. Without a pidfd of the command
    // only the command, and only while it is unreaped.
    let send = |sig: libc::c_int| {
        if command.fd.is_none() {
            if unreaped.load(std::sync::atomic::Ordering::SeqCst) != command.pid {
                return false;
            }
            command.signal(sig);
            return true;
        }
        if command.exited() {
            return false;
        }
        let others: Vec<Proc> = descendants()
            .into_iter()
            .filter(|p| p.pid != command.pid && p.fd.is_some())
            .collect();
        for p in std::iter::once(command).chain(&others) {
            p.signal(sig);
            if sig == libc::SIGTERM {
                p.signal(libc::SIGCONT);
            }
        }
        true
    };
    let started = Instant::now();
    // A limit no clock can reach is no limit.
    let mut term_at = limit.and_then(|l| started.checked_add(l));
    let mut kill_at: Option<Instant> = None;
    let mut timed_out = None;
    loop {
        let next = match (term_at, kill_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let wait_ms = next.map_or(-1, |n| {
            n.saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as i32
        });
        let mut p = libc::pollfd {
            fd: read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) of one descriptor we own.
        let n = unsafe { libc::poll(&mut p, 1, wait_ms) };
        if n > 0 {
            let mut buf = [0u8; 64];
            // SAFETY: read(2) into a buffer of that size (the pipe is non-blocking).
            let r = unsafe { libc::read(read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            for b in buf.iter().take(r.max(0) as usize) {
                match b {
                    b'S' => return timed_out,
                    _ => {
                        if kill_at.is_none() {
                            kill_at = Some(Instant::now() + KILL_AFTER);
                        }
                    }
                }
            }
        }
        let now = Instant::now();
        if term_at.is_some_and(|t| now >= t) {
            term_at = None;
            if send(libc::SIGTERM) {
                timed_out = Some(libc::SIGTERM);
                kill_at = Some(kill_at.map_or(now + KILL_AFTER, |k| k.min(now + KILL_AFTER)));
            }
        }
        if kill_at.is_some_and(|k| now >= k) {
            kill_at = None;
            if send(libc::SIGKILL) && timed_out.is_some() {
                timed_out = Some(libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};
    use std::sync::atomic::AtomicI32;

    /// Runs test `name` of this module in a process of its own (see
    /// `crate::process::alone`): the tests that use it make that process a subreaper, reap
    /// every child of it and signal every process below it.
    fn alone(name: &str) -> bool {
        crate::process::alone(&format!("process::tree::tests::{name}"))
    }

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        cmd
    }

    /// Waits until `f` holds; fails naming `what` if it does not within 10 s.
    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < end, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn comm(pid: libc::pid_t) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Whether process `pid` ignores SIGTERM (its `SigIgn` mask).
    fn ignores_term(pid: libc::pid_t) -> bool {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
    }

    /// Whether process `pid` is stopped (state `T` in its `stat`).
    fn stopped(pid: libc::pid_t) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    }

    /// Whether `pid` names no process (nor zombie) at all.
    fn gone(pid: libc::pid_t) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) != 0 }
    }

    /// A command started by a test and the processes found below it: all sent SIGKILL
    /// (through their pidfds) and the command reaped when dropped, so a failing test
    /// leaves none behind.
    struct Spawned {
        command: Child,
        found: Vec<Proc>,
    }

    impl Drop for Spawned {
        fn drop(&mut self) {
            for p in &self.found {
                p.signal(libc::SIGKILL);
            }
            let _ = self.command.kill();
            let _ = self.command.wait();
        }
    }

    /// This process made a subreaper, as a turn is: what a command leaves running comes
    /// to it.
    fn subreaper() {
        // SAFETY: plain prctl on this process (a test process of its own, see `alone`).
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    }

    #[test]
    fn below_finds_every_process_under_a_command_and_signals_each_through_its_pidfd() {
        let command = sh("sleep 30 & sh -c 'sleep 30 & wait' & wait")
            .spawn()
            .unwrap();
        let root = command.id() as libc::pid_t;
        let mut t = Spawned {
            command,
            found: Vec::new(),
        };
        // Each forked child is `sh` until it has run `sleep`.
        until("a shell and two sleeps below the command", || {
            t.found = below(root);
            let mut names: Vec<String> = t.found.iter().map(|p| comm(p.pid)).collect();
            names.sort();
            names == ["sh", "sleep", "sleep"]
        });
        assert!(t.found.iter().all(|p| p.fd.is_some()), "each with a pidfd");
        assert!(t.found.iter().all(|p| !p.exited()));
        for p in &t.found {
            assert!(p.signal(libc::SIGKILL));
        }
        until("each seen to have exited", || {
            t.found.iter().all(Proc::exited)
        });
        // With its children ended, the command's `wait` returns and it exits.
        assert!(t.command.wait().unwrap().success());
        // Reaped by their parents: no longer signalled.
        until("each reaped", || t.found.iter().all(|p| !p.signal(0)));
    }

    #[test]
    fn a_pidfd_reads_exited_once_its_process_has_exited_before_it_is_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let fd = pidfd_open(pid).unwrap();
        assert!(!has_exited(&fd));
        assert!(pidfd_signal(&fd, libc::SIGKILL).unwrap());
        until("the pidfd reads exited", || has_exited(&fd));
        assert!(!gone(pid), "a zombie, not yet reaped");
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(has_exited(&fd));
    }

    #[test]
    fn with_nothing_below_end_all_returns_at_once() {
        if !alone("with_nothing_below_end_all_returns_at_once") {
            return;
        }
        subreaper();
        let started = Instant::now();
        assert!(end_all(Duration::from_secs(10), Duration::from_secs(10)).is_empty());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn what_a_command_left_running_is_sent_sigterm_first_and_ended_within_the_grace() {
        if !alone("what_a_command_left_running_is_sent_sigterm_first_and_ended_within_the_grace") {
            return;
        }
        subreaper();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker");
        let script = dir.path().join("left.sh");
        std::fs::write(
            &script,
            "trap 'echo TERM > \"$1\"; exit 0' TERM\nsleep 30 &\nwait\n",
        )
        .unwrap();
        let run = format!(
            "sh {} {} & sleep 30 & exit 0",
            script.display(),
            marker.display()
        );
        assert!(sh(&run).status().unwrap().success());
        // Its trap is set once the script has started its sleep.
        let mut left = Vec::new();
        until("the three left running adopted here", || {
            left = descendants();
            left.len() == 3 && left.iter().filter(|p| comm(p.pid) == "sleep").count() == 2
        });
        let started = Instant::now();
        assert_eq!(
            end_all(Duration::from_secs(10), Duration::from_secs(10)),
            Vec::<libc::pid_t>::new()
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a SIGTERM ends them, well before the grace is over: {:?}",
            started.elapsed()
        );
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "TERM\n");
        assert!(descendants().is_empty());
        assert!(left.iter().all(|p| gone(p.pid)), "reaped here");
    }

    #[test]
    fn a_stopped_process_is_continued_to_act_on_its_sigterm() {
        if !alone("a_stopped_process_is_continued_to_act_on_its_sigterm") {
            return;
        }
        subreaper();
        assert!(sh("sleep 30 & kill -STOP $!; exit 0")
            .status()
            .unwrap()
            .success());
        let mut left = Vec::new();
        // Stopped, perhaps before it had become `sleep`.
        until("the stopped process adopted here", || {
            left = descendants();
            left.len() == 1 && stopped(left[0].pid)
        });
        let started = Instant::now();
        assert!(end_all(Duration::from_secs(10), Duration::from_secs(10)).is_empty());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "ended by SIGTERM, not after the grace: {:?}",
            started.elapsed()
        );
        assert!(gone(left[0].pid));
    }

    #[test]
    fn one_that_ignores_sigterm_is_killed_once_the_grace_is_over() {
        if !alone("one_that_ignores_sigterm_is_killed_once_the_grace_is_over") {
            return;
        }
        subreaper();
        assert!(sh("(trap '' TERM; exec sleep 30) & exit 0")
            .status()
            .unwrap()
            .success());
        let mut left = Vec::new();
        until("the sleep ignoring SIGTERM adopted here", || {
            left = descendants();
            left.len() == 1 && comm(left[0].pid) == "sleep" && ignores_term(left[0].pid)
        });
        let grace = Duration::from_millis(500);
        let started = Instant::now();
        assert!(end_all(grace, Duration::from_secs(10)).is_empty());
        let took = started.elapsed();
        assert!(took >= grace, "ended before the grace was over: {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(gone(left[0].pid));
    }

    #[test]
    fn a_chain_of_processes_each_forking_the_next_cannot_outrun_the_end() {
        if !alone("a_chain_of_processes_each_forking_the_next_cannot_outrun_the_end") {
            return;
        }
        subreaper();
        let dir = tempfile::tempdir().unwrap();
        let chain = dir.path().join("chain.sh");
        // Each link ignores SIGTERM, lives a moment, starts the next and exits.
        std::fs::write(&chain, "trap '' TERM\nsleep 0.02\nsh \"$0\" &\n").unwrap();
        assert!(Command::new("sh").arg(&chain).status().unwrap().success());
        std::thread::sleep(Duration::from_millis(200));
        assert!(!descendants().is_empty(), "the chain runs on");
        let started = Instant::now();
        assert!(end_all(Duration::from_millis(200), Duration::from_secs(10)).is_empty());
        assert!(started.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        assert!(descendants().is_empty(), "a link survived the end");
    }

    /// The command's pid while it is unreaped, as the waiting thread of a turn keeps it.
    static UNREAPED: AtomicI32 = AtomicI32::new(0);

    #[test]
    fn a_command_past_its_limit_is_sent_sigterm_and_so_is_what_it_left_running() {
        if !alone("a_command_past_its_limit_is_sent_sigterm_and_so_is_what_it_left_running") {
            return;
        }
        subreaper();
        let timer = Timer::new(Some(Duration::from_millis(300))).unwrap();
        let mut t = Spawned {
            command: sh("sleep 30 & exec sleep 30").spawn().unwrap(),
            found: Vec::new(),
        };
        let pid = t.command.id() as libc::pid_t;
        until("the sleep the command started", || {
            t.found = below(pid);
            t.found.len() == 1 && comm(pid) == "sleep"
        });
        let left = t.found[0].pid;
        UNREAPED.store(pid, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        timer.started(pid, &UNREAPED);
        let status = t.command.wait().unwrap();
        UNREAPED.store(0, std::sync::atomic::Ordering::SeqCst);
        let took = started.elapsed();
        assert_eq!(timer.stop(), Some(libc::SIGTERM));
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < KILL_AFTER, "{took:?}");
        // What the command left, adopted here, ended by the same SIGTERM.
        let mut status = 0;
        // SAFETY: waitpid of a process this subreaper adopted, writing only `status`.
        assert_eq!(unsafe { libc::waitpid(left, &mut status, 0) }, left);
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM);
    }

    #[test]
    fn a_command_that_ignores_its_sigterm_is_killed_kill_after_later() {
        if !alone("a_command_that_ignores_its_sigterm_is_killed_kill_after_later") {
            return;
        }
        let timer = Timer::new(Some(Duration::from_millis(100))).unwrap();
        let mut t = Spawned {
            command: sh("trap '' TERM; exec sleep 30").spawn().unwrap(),
            found: Vec::new(),
        };
        let pid = t.command.id() as libc::pid_t;
        until("the command ignoring SIGTERM", || {
            comm(pid) == "sleep" && ignores_term(pid)
        });
        UNREAPED.store(pid, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        timer.started(pid, &UNREAPED);
        let status = t.command.wait().unwrap();
        UNREAPED.store(0, std::sync::atomic::Ordering::SeqCst);
        let took = started.elapsed();
        assert_eq!(timer.stop(), Some(libc::SIGKILL));
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(took >= KILL_AFTER, "{took:?}");
        assert!(took < KILL_AFTER * 3, "{took:?}");
    }

    #[test]
    fn a_command_that_ends_in_time_is_sent_nothing() {
        if !alone("a_command_that_ends_in_time_is_sent_nothing") {
            return;
        }
        let timer = Timer::new(Some(Duration::from_secs(30))).unwrap();
        let mut t = Spawned {
            command: sh("sleep 0.1; exit 7").spawn().unwrap(),
            found: Vec::new(),
        };
        let pid = t.command.id() as libc::pid_t;
        UNREAPED.store(pid, std::sync::atomic::Ordering::SeqCst);
        timer.started(pid, &UNREAPED);
        let status = t.command.wait().unwrap();
        UNREAPED.store(0, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        assert_eq!(timer.stop(), None);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "stopped at once"
        );
        assert_eq!(status.code(), Some(7));
    }

    #[test]
    fn a_sigterm_passed_on_is_followed_by_sigkill_kill_after_later_without_a_limit() {
        if !alone("a_sigterm_passed_on_is_followed_by_sigkill_kill_after_later_without_a_limit") {
            return;
        }
        let timer = Timer::new(None).unwrap();
        let mut t = Spawned {
            command: sh("trap '' TERM; exec sleep 30").spawn().unwrap(),
            found: Vec::new(),
        };
        let pid = t.command.id() as libc::pid_t;
        until("the command ignoring SIGTERM", || {
            comm(pid) == "sleep" && ignores_term(pid)
        });
        UNREAPED.store(pid, std::sync::atomic::Ordering::SeqCst);
        timer.started(pid, &UNREAPED);
        // What a turn's handler does once it has passed a SIGTERM on to the command.
        // SAFETY: a signal to this test's own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        on_signal();
        let status = t.command.wait().unwrap();
        UNREAPED.store(0, std::sync::atomic::Ordering::SeqCst);
        let took = started.elapsed();
        assert_eq!(timer.stop(), None, "no limit passed");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(took >= KILL_AFTER - Duration::from_millis(100), "{took:?}");
        assert!(took < KILL_AFTER * 3, "{took:?}");
    }
}
