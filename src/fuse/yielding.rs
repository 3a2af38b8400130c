//! Answers over io_uring that leave the caller on its CPU.
//!
//! A request over io_uring reaches a queue thread pinned to the caller's CPU, and the
//! caller sleeps until the answer comes. The answer wakes it from inside the queue
//! thread's system call, while that thread still runs there, so the scheduler puts the
//! caller on another CPU that is idle. On a virtual machine an idle CPU is halted and
//! waking it goes through the hypervisor: tens of microseconds, more than the round trip
//! itself, and paid again at the next request as the caller hops back.
//!
//! The scheduler counts a CPU whose runnable threads are all `SCHED_IDLE` as idle: it
//! wakes a task there and lets it run at once. So a queue thread turns itself
//! `SCHED_IDLE` just before it commits an answer and stays so while it waits for the
//! next request; the caller wakes on its own CPU, and its next request finds the thread
//! there. The thread takes its own policy back as soon as a request arrives, those
//! nobody waits for too: a RELEASE served idle waited behind its caller, holding what
//! the next open needs (Python writing small files took 1.35 times as long).
//!
//! A `SCHED_IDLE` thread has the lowest weight (3 against 1,024) and, woken, never
//! preempts the thread that runs: it waits for that thread's slice to end, or a tick.
//! Inside its scheduling group every other thread goes first; across groups the
//! group's weight on that CPU counts, which shrinks with the load the group has there
//! (the daemon's other threads). What bounds the cost:
//! * a watchdog thread gives its policy back to any queue thread idle for [`LIMIT`] (an
//!   answer or a request that came meanwhile waits about that long, and a tick, at
//!   most), and when the thread it turned back was waiting for its CPU no thread yields
//!   for [`BACK_OFF`]: the CPUs are busy, where yielding gains nothing;
//! * with `auto`, it is done only where the daemon has a scheduling group to itself (its
//!   own session under the kernel's autogroup, or a control group of its own, as a
//!   service has), so no other program's threads go before its waiting ones.
//!
//! What a thread starts inherits its policy: threads and processes are started only
//! while serving requests (at the thread's own policy), and what starts them runs
//! inside [`at_own_policy`] besides.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long a queue thread stays `SCHED_IDLE` at most before the watchdog turns it back.
pub const LIMIT: Duration = Duration::from_millis(1);

/// How long no thread yields after the watchdog found one it turned back waiting for
/// its CPU: the CPUs are busy, where yielding gains nothing and a thread may wait.
pub const BACK_OFF: Duration = Duration::from_millis(100);

/// `mount --yield-cpu`: whether io_uring's queue threads yield their CPU to the callers
/// they answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum YieldCpu {
    /// Where the daemon has a scheduling group to itself.
    #[default]
    Auto,
    /// Never.
    Off,
    /// Wherever a thread may leave `SCHED_IDLE` again, in a shared group too (the
    /// watchdog bounds each wait).
    Always,
}

impl std::str::FromStr for YieldCpu {
    type Err = String;
    fn from_str(s: &str) -> Result<YieldCpu, String> {
        match s {
            "auto" => Ok(YieldCpu::Auto),
            "off" => Ok(YieldCpu::Off),
            "always" => Ok(YieldCpu::Always),
            _ => Err(format!("'{s}' is not one of auto, off, always")),
        }
    }
}

impl std::fmt::Display for YieldCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            YieldCpu::Auto => "auto",
            YieldCpu::Off => "off",
            YieldCpu::Always => "always",
        })
    }
}

/// One queue thread as the watchdog sees it.
struct Slot {
    /// The thread's id; 0 once it ended (under `ending`).
    tid: AtomicI32,
    /// When the thread turned `SCHED_IDLE` (monotonic ns); 0 while it runs at its policy.
    since: AtomicU64,
    /// Held by the watchdog while it turns the thread back and by the thread as it ends,
    /// so the watchdog never names a thread id that may be another thread's by then.
    ending: Mutex<()>,
}

struct Shared {
    slots: Box<[Slot]>,
    /// The policy the threads take back (`SCHED_OTHER`, or `SCHED_BATCH` if the daemon
    /// was started so).
    policy: libc::c_int,
    /// [`LIMIT`] in ns (shorter or longer in tests).
    limit: u64,
    /// The watchdog sleeps until a thread turns idle again.
    parked: AtomicBool,
    /// No thread yields before this time (monotonic ns; see [`BACK_OFF`]).
    busy_until: AtomicU64,
    stop: AtomicBool,
    watchdog: OnceLock<std::thread::Thread>,
}

/// Yielding for one connection's queue threads, and its watchdog.
pub struct Yielding {
    shared: Arc<Shared>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Yielding {
    /// Yielding for `threads` queue threads as `how` asks (not `Off`); Err says why it is
    /// not done here.
    pub fn start(threads: usize, how: YieldCpu) -> Result<Yielding, String> {
        let policy = own_policy()?;
        if how == YieldCpu::Auto {
            own_group(&ProcFiles)?;
        }
        probe(policy)?;
        Yielding::begin(threads, policy, LIMIT)
    }

    /// Yielding back to `policy`, once the checks of [`Yielding::start`] passed.
    fn begin(threads: usize, policy: libc::c_int, limit: Duration) -> Result<Yielding, String> {
        let shared = Arc::new(Shared {
            slots: (0..threads)
                .map(|_| Slot {
                    tid: AtomicI32::new(0),
                    since: AtomicU64::new(0),
                    ending: Mutex::new(()),
                })
                .collect(),
            policy,
            limit: limit.as_nanos() as u64,
            parked: AtomicBool::new(false),
            busy_until: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            watchdog: OnceLock::new(),
        });
        let watched = shared.clone();
        let handle = std::thread::Builder::new()
            .name("fuse-yield".into())
            .spawn(move || watch(&watched))
            .map_err(|e| format!("its watchdog thread could not start ({e})"))?;
        let _ = shared.watchdog.set(handle.thread().clone());
        Ok(Yielding {
            shared,
            watchdog: Some(handle),
        })
    }

    /// The calling queue thread's part, as slot `slot` (below the `threads` given).
    pub fn turn(&self, slot: usize) -> Turn {
        // SAFETY: gettid(2) has no failure and no arguments.
        let tid = unsafe { libc::gettid() };
        self.shared.slots[slot].tid.store(tid, SeqCst);
        Turn {
            shared: self.shared.clone(),
            slot,
        }
    }
}

impl Drop for Yielding {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(w) = self.shared.watchdog.get() {
            w.unpark();
        }
        if let Some(h) = self.watchdog.take() {
            let _ = h.join();
        }
    }
}

/// One queue thread's yielding.
pub struct Turn {
    shared: Arc<Shared>,
    slot: usize,
}

/// A queue thread that turned `SCHED_IDLE` by its own doing (the watchdog may have given
/// its policy back meanwhile): what it takes back, and where the watchdog watches it.
struct Yielded {
    shared: Arc<Shared>,
    slot: usize,
}

impl Yielded {
    /// Takes the thread's policy back; true when it did (else the watchdog still watches
    /// and tries again).
    fn back(&self) -> bool {
        if let Err(e) = set_policy(0, self.shared.policy) {
            tracing::error!("a FUSE queue thread could not take its scheduling policy back: {e}");
            return false;
        }
        self.shared.slots[self.slot].since.store(0, SeqCst);
        true
    }
}

thread_local! {
    static YIELDED: std::cell::RefCell<Option<Yielded>> = const { std::cell::RefCell::new(None) };
}

/// Whether the calling thread turned `SCHED_IDLE` by its own doing.
fn yielded() -> bool {
    YIELDED.with_borrow(|y| y.is_some())
}

/// Takes the calling thread's policy back if it yielded.
fn take_back() {
    YIELDED.with_borrow_mut(|y| {
        if y.as_ref().is_some_and(Yielded::back) {
            *y = None;
        }
    });
}

/// Runs `f` at the calling thread's own policy: a queue thread that yielded takes it back
/// first. A process or thread started inherits the policy of the thread that starts it,
/// so what a queue thread starts (a checkout filter, a worktree's creation) is started
/// through this (`uring::unpinned`).
pub fn at_own_policy<T>(f: impl FnOnce() -> T) -> T {
    take_back();
    f()
}

/// Whether the calling thread runs `SCHED_IDLE` (for checks in debug builds).
pub fn idle_now() -> bool {
    // SAFETY: sched_getscheduler(2) of the calling thread.
    unsafe { libc::sched_getscheduler(0) & !RESET_ON_FORK == libc::SCHED_IDLE }
}

impl Turn {
    /// A request arrived: it is served at the thread's own policy.
    pub fn serve(&mut self) {
        take_back();
    }

    /// The answer is committed next: the thread turns `SCHED_IDLE` until a request comes,
    /// or the watchdog turns it back.
    pub fn answer(&mut self) {
        let slot = &self.shared.slots[self.slot];
        if yielded() && slot.since.load(SeqCst) != 0 {
            return;
        }
        let now = now_ns();
        if now < self.shared.busy_until.load(SeqCst) {
            return;
        }
        slot.since.store(now, SeqCst);
        if self.shared.parked.load(SeqCst) && self.shared.parked.swap(false, SeqCst) {
            if let Some(w) = self.shared.watchdog.get() {
                w.unpark();
            }
        }
        if set_policy(0, libc::SCHED_IDLE).is_err() {
            slot.since.store(0, SeqCst);
            return;
        }
        YIELDED.set(Some(Yielded {
            shared: self.shared.clone(),
            slot: self.slot,
        }));
        // Held up for LIMIT between the two lines above, the watchdog has turned the
        // thread back already and looks at it no more: take the policy back here.
        if slot.since.load(SeqCst) != now {
            take_back();
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let slot = &self.shared.slots[self.slot];
        let _ending = slot.ending.lock().unwrap_or_else(|e| e.into_inner());
        slot.tid.store(0, SeqCst);
        take_back();
        YIELDED.set(None);
        slot.since.store(0, SeqCst);
    }
}

/// The watchdog: gives each thread idle for its limit its policy back, and stops all
/// yielding for [`BACK_OFF`] when one of them was waiting for its CPU; sleeps while no
/// thread is idle.
fn watch(s: &Shared) {
    let back_off = BACK_OFF.as_nanos() as u64;
    loop {
        if s.stop.load(SeqCst) {
            return;
        }
        let now = now_ns();
        let mut next: Option<u64> = None;
        for slot in s.slots.iter() {
            let since = slot.since.load(SeqCst);
            if since == 0 {
                continue;
            }
            let due = since.saturating_add(s.limit);
            if due > now {
                next = Some(next.map_or(due, |n| n.min(due)));
                continue;
            }
            let _ending = slot.ending.lock().unwrap_or_else(|e| e.into_inner());
            let tid = slot.tid.load(SeqCst);
            if tid == 0 {
                // Ended: nothing to watch.
                slot.since.store(0, SeqCst);
                continue;
            }
            // Looked at before it is turned back (which may make it run).
            let waiting = runnable(tid);
            if let Err(e) = set_policy(tid, s.policy) {
                // Watched still: tried again a limit later.
                tracing::error!("turning an idle FUSE queue thread back: {e}");
                let again = now.saturating_add(s.limit);
                next = Some(next.map_or(again, |n| n.min(again)));
                continue;
            }
            if slot
                .since
                .compare_exchange(since, 0, SeqCst, SeqCst)
                .is_ok()
                && waiting
            {
                s.busy_until.store(now_ns() + back_off, SeqCst);
            }
        }
        if let Some(due) = next {
            // Unparked early by the end (`Yielding`'s drop).
            std::thread::park_timeout(Duration::from_nanos((due - now).max(50_000)));
            continue;
        }
        // Park, unless a thread turned idle after the look above (it sees `parked` and
        // unparks, or this sees its `since`).
        s.parked.store(true, SeqCst);
        if s.slots.iter().any(|x| x.since.load(SeqCst) != 0) || s.stop.load(SeqCst) {
            s.parked.store(false, SeqCst);
            continue;
        }
        std::thread::park();
        s.parked.store(false, SeqCst);
    }
}

/// Whether thread `tid` of this process is runnable or running (state R): a thread left
/// idle that is R was kept waiting for its CPU (or is serving a RELEASE).
fn runnable(tid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|t| Some(t[t.rfind(')')? + 1..].trim_start().starts_with('R')))
        .unwrap_or(false)
}

fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) into a timespec of ours.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Sets thread `tid`'s policy (0: the calling thread), its nice value kept.
fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> std::io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) with a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, policy, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `SCHED_RESET_ON_FORK`, or'ed into the policy `sched_getscheduler` reports.
const RESET_ON_FORK: libc::c_int = 0x4000_0000;

/// The daemon's policy, if one yielding can come back to.
fn own_policy() -> Result<libc::c_int, String> {
    // SAFETY: sched_getscheduler(2) of the calling thread.
    let p = unsafe { libc::sched_getscheduler(0) };
    if p < 0 {
        return Err(format!(
            "its scheduling policy could not be read ({})",
            std::io::Error::last_os_error()
        ));
    }
    match p & !RESET_ON_FORK {
        p @ (libc::SCHED_OTHER | libc::SCHED_BATCH) => Ok(p),
        libc::SCHED_IDLE => Err("the daemon runs SCHED_IDLE already".into()),
        _ => Err("the daemon runs under a real-time policy".into()),
    }
}

/// Whether a thread may turn `SCHED_IDLE` and back here (leaving `SCHED_IDLE` needs
/// CAP_SYS_NICE or an RLIMIT_NICE that allows the thread's nice value). Tried on a
/// thread of its own, which ends either way.
fn probe(policy: libc::c_int) -> Result<(), String> {
    std::thread::Builder::new()
        .name("fuse-yield-probe".into())
        .spawn(move || {
            set_policy(0, libc::SCHED_IDLE)
                .map_err(|e| format!("a thread cannot turn SCHED_IDLE ({e})"))?;
            set_policy(0, policy).map_err(|e| {
                format!(
                    "a thread cannot leave SCHED_IDLE ({e}; it needs CAP_SYS_NICE or RLIMIT_NICE)"
                )
            })
        })
        .map_err(|e| format!("a probe thread could not start ({e})"))?
        .join()
        .map_err(|_| "its probe thread panicked".to_string())?
}

/// What [`own_group`] reads (files of /proc and the control groups' filesystem).
trait GroupFiles {
    fn read(&self, path: &str) -> Option<String>;
    fn exists(&self, path: &str) -> bool;
    fn pid(&self) -> u32;
    fn parent(&self) -> u32;
    fn session_leader(&self) -> bool;
}

struct ProcFiles;

impl GroupFiles for ProcFiles {
    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
    fn exists(&self, path: &str) -> bool {
        std::path::Path::new(path).exists()
    }
    fn pid(&self) -> u32 {
        std::process::id()
    }
    fn parent(&self) -> u32 {
        std::os::unix::process::parent_id()
    }
    fn session_leader(&self) -> bool {
        // SAFETY: getsid(2) of the calling process.
        unsafe { libc::getsid(0) == libc::getpid() }
    }
}

/// Ok when the daemon has a scheduling group to itself: the control group whose CPU
/// controller schedules it holds no other process (but its parent, a `mount` that waits
/// for it to be ready), or it is the real root group and the daemon leads a session of
/// its own under the kernel's autogroup.
fn own_group(f: &dyn GroupFiles) -> Result<(), String> {
    let cgroups = f
        .read("/proc/self/cgroup")
        .ok_or("its control group could not be read")?;
    // The CPU controller's line in cgroup v1 ("1:cpu,cpuacct:/x"), else v2's ("0::/x").
    let mut v2 = None;
    let mut v1 = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "cpu") {
            v1 = Some((ctrl.to_string(), path.to_string()));
        }
    }
    let (dir, path) = match (v1, v2) {
        (Some((ctrl, path)), _) => (format!("/sys/fs/cgroup/{ctrl}"), path),
        (None, Some(path)) => {
            // Under cgroup v2 the CPU controller may be off below some group: the
            // nearest group up the path that has it (`cpu.weight`) schedules the daemon.
            // The real root has no `cpu.weight`; a root that has one is a namespace's (a
            // container's), shared with everything in it.
            let own = path.trim_end_matches('/').to_string();
            let mut path = own.clone();
            loop {
                if f.exists(&format!("/sys/fs/cgroup{path}/cpu.weight")) {
                    break;
                }
                match path.rfind('/') {
                    Some(i) => path.truncate(i),
                    None => break,
                }
            }
            if path.is_empty() && f.exists("/sys/fs/cgroup/cpu.weight") {
                return Err("its control group is the root of a control group namespace (a container's), shared with every program in it".into());
            }
            if !path.is_empty() && path != own {
                return Err(format!("its CPU is shared out by the control group {path}, which holds every group below it (the CPU controller is off below it)"));
            }
            (
                "/sys/fs/cgroup".to_string(),
                if path.is_empty() { "/".into() } else { path },
            )
        }
        (None, None) => return Err("its CPU control group could not be found".into()),
    };
    if path == "/" {
        let autogroup = f.read("/proc/sys/kernel/sched_autogroup_enabled");
        if autogroup.as_deref().map(str::trim) != Some("1") {
            return Err("it shares the root control group with every program and the kernel's autogroup is off".into());
        }
        if !f.session_leader() {
            return Err("it shares its session (so its autogroup) with other programs: run it in the background or as a service, or mount with --yield-cpu always".into());
        }
        return Ok(());
    }
    // Groups below it without a CPU controller of their own share its share.
    let below = f
        .read(&format!("{dir}{path}/cgroup.stat"))
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("nr_descendants "))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    if below > 0 {
        return Err(format!(
            "its control group {path} has {below} groups below it, which share its CPU"
        ));
    }
    let listed = f
        .read(&format!("{dir}{path}/cgroup.procs"))
        .ok_or_else(|| format!("its control group {path} could not be read"))?;
    let (me, parent) = (f.pid().to_string(), f.parent().to_string());
    match listed
        .lines()
        .map(str::trim)
        .find(|p| !p.is_empty() && *p != me && *p != parent)
    {
        Some(other) => Err(format!(
            "its control group {path} holds other processes too (pid {other}); mount with --yield-cpu always to yield there too"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake {
        files: HashMap<&'static str, &'static str>,
        leader: bool,
    }

    impl GroupFiles for Fake {
        fn read(&self, path: &str) -> Option<String> {
            self.files.get(path).map(|s| s.to_string())
        }
        fn exists(&self, path: &str) -> bool {
            self.files.contains_key(path)
        }
        fn pid(&self) -> u32 {
            42
        }
        fn parent(&self) -> u32 {
            41
        }
        fn session_leader(&self) -> bool {
            self.leader
        }
    }

    fn fake(files: &[(&'static str, &'static str)], leader: bool) -> Fake {
        Fake {
            files: files.iter().copied().collect(),
            leader,
        }
    }

    #[test]
    fn a_group_of_its_own_is_a_service_cgroup_or_a_session_under_autogroup() {
        let nested = [
            ("/proc/self/cgroup", "0::/system.slice/w.service\n"),
            ("/sys/fs/cgroup/system.slice/w.service/cpu.weight", "100\n"),
            (
                "/sys/fs/cgroup/system.slice/w.service/cgroup.stat",
                "nr_descendants 2\nnr_dying_descendants 0\n",
            ),
            ("/sys/fs/cgroup/system.slice/w.service/cgroup.procs", "42\n"),
        ];
        assert!(own_group(&fake(&nested, false))
            .unwrap_err()
            .contains("2 groups below"));
        let service = [
            ("/proc/self/cgroup", "0::/system.slice/w.service\n"),
            ("/sys/fs/cgroup/system.slice/w.service/cpu.weight", "100\n"),
            (
                "/sys/fs/cgroup/system.slice/w.service/cgroup.stat",
                "nr_descendants 0\n",
            ),
            // Its parent, a `mount` waiting for it to be ready, may be there still.
            (
                "/sys/fs/cgroup/system.slice/w.service/cgroup.procs",
                "41\n42\n",
            ),
        ];
        assert!(own_group(&fake(&service, false)).is_ok());
        let shared = [
            ("/proc/self/cgroup", "0::/docker/abc\n"),
            ("/sys/fs/cgroup/docker/abc/cpu.weight", "100\n"),
            ("/sys/fs/cgroup/docker/abc/cgroup.procs", "1\n42\n77\n"),
        ];
        let why = own_group(&fake(&shared, true)).unwrap_err();
        assert!(
            why.contains("/docker/abc") && why.contains("pid 1"),
            "{why}"
        );
        let root = [
            ("/proc/self/cgroup", "1:cpu,cpuacct:/\n0::/\n"),
            ("/proc/sys/kernel/sched_autogroup_enabled", "1\n"),
        ];
        assert!(own_group(&fake(&root, true)).is_ok());
        assert!(own_group(&fake(&root, false))
            .unwrap_err()
            .contains("session"));
        let no_autogroup = [
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/sys/kernel/sched_autogroup_enabled", "0\n"),
        ];
        assert!(own_group(&fake(&no_autogroup, true))
            .unwrap_err()
            .contains("autogroup is off"));
        // A container's namespace shows its group as the root, which has `cpu.weight`
        // (the real root has none).
        let container = [
            ("/proc/self/cgroup", "0::/\n"),
            ("/sys/fs/cgroup/cpu.weight", "100\n"),
            ("/proc/sys/kernel/sched_autogroup_enabled", "1\n"),
        ];
        assert!(own_group(&fake(&container, true))
            .unwrap_err()
            .contains("namespace"));
    }

    #[test]
    fn under_cgroup_v2_the_group_with_the_cpu_controller_counts() {
        // The controller off below system.slice: the slice shares the CPU out among
        // every service in it, whatever the service's own group holds.
        let slice = [
            ("/proc/self/cgroup", "0::/system.slice/w.service\n"),
            ("/sys/fs/cgroup/system.slice/cpu.weight", "100\n"),
            ("/sys/fs/cgroup/system.slice/w.service/cgroup.procs", "42\n"),
        ];
        assert!(own_group(&fake(&slice, false))
            .unwrap_err()
            .contains("/system.slice,"));
        // Off everywhere: the root group schedules it, and the autogroup rules apply.
        let nowhere = [
            ("/proc/self/cgroup", "0::/user.slice/session-1.scope\n"),
            ("/proc/sys/kernel/sched_autogroup_enabled", "1\n"),
        ];
        assert!(own_group(&fake(&nowhere, true)).is_ok());
        assert!(own_group(&fake(&nowhere, false))
            .unwrap_err()
            .contains("session"));
    }

    #[test]
    fn cgroup_v1_names_the_cpu_controllers_group() {
        let v1 = [
            (
                "/proc/self/cgroup",
                "4:memory:/m\n2:cpu,cpuacct:/svc\n1:name=systemd:/x\n0::/other\n",
            ),
            ("/sys/fs/cgroup/cpu,cpuacct/svc/cgroup.procs", "42\n"),
        ];
        assert!(own_group(&fake(&v1, false)).is_ok());
        let unreadable = [("/proc/self/cgroup", "2:cpu:/svc\n")];
        assert!(own_group(&fake(&unreadable, false))
            .unwrap_err()
            .contains("/svc"));
    }

    fn policy_of(tid: libc::pid_t) -> i32 {
        // SAFETY: sched_getscheduler(2) of a thread of this process.
        unsafe { libc::sched_getscheduler(tid) }
    }

    /// Yielding as the daemon has it, whatever group this test process is in (the
    /// checks of the group are tested above), the watchdog turning a thread back after
    /// `limit`; None where threads may not leave SCHED_IDLE (not root, no RLIMIT_NICE).
    fn yielding(limit: Duration) -> Option<Yielding> {
        if let Err(why) = probe(libc::SCHED_OTHER) {
            eprintln!("yielding is not possible for this test process ({why}): not checked");
            return None;
        }
        Some(Yielding::begin(1, libc::SCHED_OTHER, limit).expect("the watchdog starts"))
    }

    /// Long enough that no test thread held up by others' load is turned back before it
    /// looks at its own policy.
    const NEVER: Duration = Duration::from_secs(60);

    #[test]
    fn the_watchdog_turns_back_a_thread_left_idle() {
        let Some(y) = yielding(Duration::from_secs(2)) else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let turn_of = &y;
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut t = turn_of.turn(0);
                t.answer();
                // SAFETY: gettid(2).
                let tid = unsafe { libc::gettid() };
                tx.send((tid, policy_of(tid))).unwrap();
                // Idle, and no request comes: only the watchdog can turn it back.
                let _ = done_rx.recv_timeout(Duration::from_secs(15));
                drop(t);
            });
            let (tid, after_answer) = rx.recv().unwrap();
            assert_eq!(after_answer, libc::SCHED_IDLE, "idle after its answer");
            let start = std::time::Instant::now();
            while policy_of(tid) != libc::SCHED_OTHER && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_micros(200));
            }
            let policy = policy_of(tid);
            done_tx.send(()).unwrap();
            assert_eq!(
                policy,
                libc::SCHED_OTHER,
                "the watchdog turned the thread back"
            );
        });
    }

    /// The policy of a process `sh` started now (the 41st field of its /proc stat line).
    fn policy_of_a_child() -> String {
        let out = std::process::Command::new("sh")
            .args(["-c", "cut -d' ' -f41 /proc/$$/stat"])
            .output()
            .expect("sh runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn what_a_thread_that_yielded_starts_runs_at_the_daemons_policy() {
        let Some(y) = yielding(NEVER) else {
            return;
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut t = y.turn(0);
                t.answer();
                assert_eq!(policy_of_a_child(), "5", "a child inherits SCHED_IDLE");
                assert_eq!(at_own_policy(policy_of_a_child), "0");
                // SAFETY: gettid(2).
                let tid = unsafe { libc::gettid() };
                assert_eq!(policy_of(tid), libc::SCHED_OTHER);
                drop(t);
            });
        });
    }

    #[test]
    fn every_request_is_served_at_the_threads_policy() {
        let Some(y) = yielding(NEVER) else {
            return;
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: gettid(2).
                let tid = unsafe { libc::gettid() };
                let mut t = y.turn(0);
                t.answer();
                assert_eq!(policy_of(tid), libc::SCHED_IDLE, "idle after its answer");
                t.serve();
                assert_eq!(policy_of(tid), libc::SCHED_OTHER);
                t.answer();
                drop(t);
                assert_eq!(
                    policy_of(tid),
                    libc::SCHED_OTHER,
                    "an ended turn leaves none idle"
                );
            });
        });
    }
}
