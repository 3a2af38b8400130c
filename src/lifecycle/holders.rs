//! Process leases: which process holds which worktree, and noticing when it exits.
//!
//! The first request inside a worktree from a process that is not covered (neither it nor
//! an ancestor holds a lease there) takes a lease for it, identified by pid and start time.
//! Covered processes are remembered per worktree, so a covered process costs one hash
//! lookup per request. A pidfd per holder tells a watcher thread the moment the holder
//! exits; the lease then passes to a process still inside the worktree (working directory
//! or an open file below it), or is released.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::state::StateDir;
use crate::store::{LeaseError, NewLease, Store};

/// A process as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Start time in clock ticks since boot (field 22 of /proc/<pid>/stat).
    pub start: u64,
    pub command: String,
}

/// Reads /proc/<pid>/stat. The command may hold spaces and parentheses, so fields are
/// counted from the last ')'.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &stat)
}

/// How the holder of a process lease `(pid, start)` stands for the process `me` asking
/// for a lease: [`Liveness::Ours`] when it is `me` or one of its ancestors (`cd wt &&
/// worktreefs run --exclusive …` is not refused for its own shell).
pub fn liveness_for(me: i32) -> impl Fn(i64, i64) -> crate::store::Liveness {
    use crate::store::Liveness;
    let mut ours = Vec::new();
    let mut cur = proc_info(me);
    while let Some(p) = cur.filter(|_| ours.len() < 64) {
        ours.push((p.pid as i64, p.start as i64));
        cur = if p.ppid > 0 { proc_info(p.ppid) } else { None };
    }
    move |pid, start| {
        if ours.contains(&(pid, start)) {
            return Liveness::Ours;
        }
        liveness(pid, start)
    }
}

/// How the process `(pid, start)` stands: alive, gone (exited, or its pid names another
/// process now), or unknown (why), for anyone asking.
pub fn liveness(pid: i64, start: i64) -> crate::store::Liveness {
    use crate::store::Liveness;
    let path = format!("/proc/{pid}/stat");
    match fs::read_to_string(&path) {
        Ok(stat) => match parse_stat(pid as i32, &stat) {
            // A zombie has exited: it holds nothing, whether or not it was reaped yet.
            Some(p) if p.start as i64 == start && is_zombie(&stat) => Liveness::Gone,
            Some(p) if p.start as i64 == start => Liveness::Alive,
            Some(_) => Liveness::Gone,
            None => Liveness::Unknown(format!("{path} cannot be parsed")),
        },
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            // /proc may hide it (hidepid, another pid namespace): the kernel says.
            // SAFETY: signal 0 only checks that the process exists.
            if unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
            {
                Liveness::Unknown(format!("pid {pid} exists but {path} cannot be read"))
            } else {
                Liveness::Gone
            }
        }
        Err(e) => Liveness::Unknown(format!("reading {path}: {e}")),
    }
}

/// Whether the thread `tid` belongs to the process `root` `(pid, start)` or one of its
/// descendants, walking parents up from it. Err: a process on the way cannot be read
/// (exited meanwhile, hidden), so it cannot be told.
pub fn descends_from(tid: i32, root: (i64, i64)) -> Result<bool, String> {
    let mut cur = tgid_of(tid).unwrap_or(tid);
    for _ in 0..1024 {
        let p = proc_info(cur).ok_or_else(|| format!("/proc/{cur}/stat cannot be read"))?;
        if (p.pid as i64, p.start as i64) == root {
            return Ok(true);
        }
        if p.ppid <= 0 {
            return Ok(false);
        }
        cur = p.ppid;
    }
    Ok(false)
}

/// Whether process `pid` has exited but is not reaped yet.
fn is_zombie_pid(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| is_zombie(&s))
}

/// Whether a `/proc/<pid>/stat` text's state (the field after the command) says the
/// process has exited: zombie or dead.
pub(crate) fn is_zombie(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|c| stat[c + 1..].split_whitespace().next())
        .is_some_and(|st| st == "Z" || st == "X")
}

fn parse_stat(pid: i32, stat: &str) -> Option<ProcInfo> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let command = stat[open + 1..close].to_string();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // fields[0] is field 3 (state): ppid is field 4, starttime field 22.
    Some(ProcInfo {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        command,
    })
}

/// The process (thread group) a thread belongs to: FUSE names the calling thread.
pub fn tgid_of(tid: i32) -> Option<i32> {
    // Most callers are single-threaded, and a thread-group leader is its own process:
    // pidfd_open accepts only leaders, a syscall where /proc/<tid>/status makes the kernel
    // format some fifty lines (this runs on the first request of every new process, gcc's
    // cc1 and as for one).
    if pidfd_open(tid).is_some() {
        return Some(tid);
    }
    let status = fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The command line process `pid` runs now.
pub fn command_line(pid: i32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let s: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    (!s.is_empty()).then(|| s.join(" "))
}

/// Whether process `pid` is inside `dir`: its working directory, an open file, or a
/// shared writable mapping of a file below it (its stores reach the file with no
/// descriptor open and no request the daemon sees; the kernel names the file by its
/// path in the mount, with passthrough too).
pub fn is_inside(pid: i32, dir: &Path) -> bool {
    // A link too long to read back that leads into the same filesystem counts: better
    // named among the processes inside than taken for gone.
    let counts = |l: Link| matches!(l, Link::Below | Link::Unnamed);
    // Its working directory, its root (chroot), the program it runs.
    if ["cwd", "root", "exe"]
        .iter()
        .any(|l| counts(link(&format!("/proc/{pid}/{l}"), dir)))
    {
        return true;
    }
    let open_below = match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(rd) => rd
            .flatten()
            .any(|e| counts(link(&e.path().to_string_lossy(), dir))),
        Err(_) => false,
    };
    open_below
        || fs::read(format!("/proc/{pid}/maps"))
            .is_ok_and(|maps| maps.split(|b| *b == b'\n').any(|l| maps_below(l, dir)))
}

/// Where a `/proc` link (`cwd`, `root`, `exe`, `fd/N`) leads, as far as `dir` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Below,
    /// Elsewhere, or gone (the process exited, the descriptor was closed).
    Elsewhere,
    /// Not readable to this process (another user's, hidepid, an LSM).
    Denied,
    /// It leads into `dir`'s filesystem but cannot be named: a path longer than PATH_MAX
    /// (ENAMETOOLONG), which a process reaches by `cd`-ing deeper and deeper.
    Unnamed,
}

fn link(path: &str, dir: &Path) -> Link {
    use std::os::unix::fs::MetadataExt;
    match fs::read_link(path) {
        Ok(p) if p.starts_with(dir) => Link::Below,
        Ok(_) => Link::Elsewhere,
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) => Link::Elsewhere,
            Some(libc::EACCES) | Some(libc::EPERM) => Link::Denied,
            // Followed rather than read (stat needs no name): the same filesystem as
            // `dir` may be inside it.
            _ => match (fs::metadata(path), fs::metadata(dir)) {
                (Ok(a), Ok(b)) if a.dev() != b.dev() => Link::Elsewhere,
                _ => Link::Unnamed,
            },
        },
    }
}
/// Whether the `/proc/<pid>/maps` line `line` maps a file below `dir` (a shared library
/// or program built there, a file mapped for reading or writing).
fn maps_below(line: &[u8], dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // `address perms offset dev inode path`: the path is what follows the fifth field.
    let mut rest = line;
    for _ in 0..5 {
        let start = rest.iter().position(|b| *b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
        rest = &rest[end..];
    }
    let path = rest.trim_ascii_start();
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    path.is_absolute() && path.starts_with(dir)
}

/// Whether process `pid` is inside `dir`, as [`is_inside`], when that can be told: None
/// when it cannot — its `/proc` entries are not readable to this process (another user's
/// without root, hidepid, an LSM), or it lives in another mount namespace (its paths are
/// not the daemon's: a container with the worktree bind-mounted). Gone: not inside.
fn inside_or_unknown(pid: i32, dir: &Path) -> Option<bool> {
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/mnt"));
    match (ns("self"), ns(&pid.to_string())) {
        (Ok(a), Ok(b)) if a == b => {}
        (_, Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => return Some(false),
        _ => return None,
    }
    let denied =
        |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM));
    // A link that cannot be told (unreadable, or too long to name) makes the answer
    // unknown unless another one is inside.
    let mut unknown = false;
    for l in ["cwd", "root", "exe"] {
        match link(&format!("/proc/{pid}/{l}"), dir) {
            Link::Below => return Some(true),
            Link::Elsewhere => {}
            Link::Denied | Link::Unnamed => unknown = true,
        }
    }
    match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(rd) => {
            for e in rd.flatten() {
                match link(&e.path().to_string_lossy(), dir) {
                    Link::Below => return Some(true),
                    Link::Elsewhere => {}
                    Link::Denied | Link::Unnamed => unknown = true,
                }
            }
        }
        Err(e) if denied(&e) => return None,
        Err(_) if unknown => return None,
        Err(_) => return Some(false),
    }
    match fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) if maps.split(|b| *b == b'\n').any(|l| maps_below(l, dir)) => Some(true),
        Ok(_) if unknown => None,
        Ok(_) => Some(false),
        Err(e) if denied(&e) => None,
        Err(_) if unknown => None,
        Err(_) => Some(false),
    }
}

/// Whether process `pid` or any of its descendants is inside `dir` (as [`is_inside`]:
/// working directory, root, program, open file, mapping). The tree is read from
/// `/proc/<pid>/task/*/children`. None when it cannot be told: that file does not exist
/// (a kernel without `CONFIG_PROC_CHILDREN`), or a process of the tree cannot be read or
/// lives in another mount namespace; the caller then keeps what it has.
pub fn tree_inside(pid: i32, dir: &Path) -> Option<bool> {
    let mut stack = vec![pid];
    let mut seen = HashSet::new();
    while let Some(p) = stack.pop() {
        if !seen.insert(p) || seen.len() > 65536 {
            continue;
        }
        if inside_or_unknown(p, dir)? {
            return Some(true);
        }
        let tasks = match fs::read_dir(format!("/proc/{p}/task")) {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // Exited meanwhile: its children (if any) were reparented, out of this
                // tree.
                continue;
            }
            Err(_) => return None,
        };
        for t in tasks.flatten() {
            match fs::read_to_string(t.path().join("children")) {
                Ok(c) => stack.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if t.path().exists() {
                        return None; // no such file on this kernel
                    }
                }
                Err(_) => return None,
            }
        }
    }
    Some(false)
}

/// The file a `/proc/<pid>/maps` line (`address perms offset dev inode path`, the path
/// padded with spaces) maps shared and writable, when it is below `dir`.
pub fn shared_writable_below(line: &[u8], dir: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut rest = line;
    let mut fields = [&b""[..]; 5];
    for f in &mut fields {
        let start = rest.iter().position(|b| *b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
        *f = &rest[..end];
        rest = &rest[end..];
    }
    let perms = fields[1];
    if perms.len() < 4 || perms[1] != b'w' || perms[3] != b's' {
        return None;
    }
    let path = rest.trim_ascii_start();
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    (path.is_absolute() && path.starts_with(dir)).then(|| path.to_path_buf())
}

/// Every live process inside `dir`, lowest pid first, except `skip`.
pub fn processes_inside(dir: &Path, skip: i32) -> Vec<i32> {
    let mut out: Vec<i32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != skip && *pid != std::process::id() as i32)
        .filter(|pid| is_inside(*pid, dir))
        .collect();
    out.sort();
    out
}

/// Where process `pid` is inside `dir`, as [`is_inside`] tells it: the first path below
/// `dir` it has (working directory, root, program, open file, mapping) and which it is.
pub fn inside_where(pid: i32, dir: &Path) -> Option<(PathBuf, &'static str)> {
    let below = |l: &str| fs::read_link(l).ok().filter(|p| p.starts_with(dir));
    for (l, how) in [
        ("cwd", "working directory"),
        ("root", "root directory"),
        ("exe", "program"),
    ] {
        if let Some(p) = below(&format!("/proc/{pid}/{l}")) {
            return Some((p, how));
        }
    }
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Some(p) = below(&e.path().to_string_lossy()) {
                return Some((p, "open file"));
            }
        }
    }
    let maps = fs::read(format!("/proc/{pid}/maps")).ok()?;
    maps.split(|b| *b == b'\n').find_map(|line| {
        use std::os::unix::ffi::OsStrExt;
        let at = line.iter().position(|b| *b == b'/')?;
        let path = &line[at..];
        let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
        let path = Path::new(std::ffi::OsStr::from_bytes(path));
        (maps_below(line, dir)).then(|| (path.to_path_buf(), "mapped file"))
    })
}

/// Every process inside the mount at `mountpoint` (but this one), with the worktree it
/// is in (`REPO/WT`, or the mount's own top or a repository's directory as `REPO/` and
/// `/`) and how: one pass over `/proc`, for `list` and `unmount`.
pub fn processes_in_worktrees(mountpoint: &Path) -> Vec<(i32, String, &'static str)> {
    let me = std::process::id() as i32;
    let mut out: Vec<(i32, String, &'static str)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let Some((path, how)) = inside_where(pid, mountpoint) else {
                // Inside by a path too long to read back: counted, its place unknown.
                return is_inside(pid, mountpoint).then_some((
                    pid,
                    "?".to_string(),
                    "a path too long to name",
                ));
            };
            let rel = path.strip_prefix(mountpoint).ok()?;
            let parts: Vec<String> = rel
                .components()
                .take(2)
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let place = match parts.as_slice() {
                [] => "/".to_string(),
                [repo] => format!("{repo}/"),
                [repo, wt, ..] => format!("{repo}/{wt}"),
            };
            Some((pid, place, how))
        })
        .collect();
    out.sort();
    out
}

/// The processes inside `dir`, as "pid (command line)", for messages that name them.
pub fn describe_processes_inside(dir: &Path) -> Vec<String> {
    processes_inside(dir, 0)
        .into_iter()
        .map(|pid| format!("{pid} ({})", command_line(pid).unwrap_or_default()))
        .collect()
}

/// Sends `sig` to the process `(pid, start)` through a pidfd opened before its start time
/// is checked, so a pid reused by another process is never signalled. Ok(false): the
/// process is gone (or its pid names another one now); Err: it could not be signalled
/// (EPERM: another user's).
pub fn signal(pid: i64, start: i64, sig: libc::c_int) -> std::io::Result<bool> {
    let Ok(pid) = i32::try_from(pid) else {
        return Ok(false);
    };
    let Some(fd) = pidfd_open(pid) else {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(false),
            _ => Err(e),
        };
    };
    match proc_info(pid) {
        Some(p) if p.start as i64 == start => {}
        _ => return Ok(false),
    }
    pidfd_signal(&fd, sig)
}

/// Sends `sig` through `pidfd` (the process it was opened for, never one that reused its
/// pid). Ok(false): that process is gone.
pub fn pidfd_signal(pidfd: &OwnedFd, sig: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: pidfd_send_signal on a descriptor we own, no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ESRCH) => Ok(false),
        _ => Err(e),
    }
}

/// A pidfd of process `pid` (None where the kernel has no pidfd_open, or out of
/// descriptors). Of a child not yet waited for, it is that child's for sure.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; on success the return value is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A lease held by a live process, watched through its pidfd.
struct Watched {
    worktree_id: i64,
    worktree_path: PathBuf,
    info: ProcInfo,
    pidfd: OwnedFd,
    /// The time (unix seconds) of the last request seen from a process it covers; 0: none
    /// since it was watched.
    active: Active,
    /// When it was watched (a holder is never let go in its first second: `run` records
    /// its lease just before it enters).
    since: std::time::Instant,
}

/// A holder's last activity (unix milliseconds), shared by every process it covers (set
/// on each request).
type Active = Arc<std::sync::atomic::AtomicI64>;

/// Unix time in milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn active_now() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(now_ms()))
}

fn active_none() -> Active {
    Arc::new(std::sync::atomic::AtomicI64::new(0))
}

/// A lease change the tracker could not write to SQLite at once, written by its writer in
/// the order it was made.
#[derive(Debug, Clone)]
enum Op {
    /// Counted in the gate as pending until written.
    Acquire {
        worktree_id: i64,
        lease: NewLease,
        reason: String,
        /// When it was taken (unix seconds).
        since: i64,
    },
    Release {
        worktree_id: i64,
        holder: String,
        kind: &'static str,
        reason: String,
    },
}

/// A failure that waiting may cure: the database busy or locked, its disk full, an I/O
/// error.
fn is_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode;
    crate::store::is_busy(e)
        || matches!(
            e,
            rusqlite::Error::SqliteFailure(f, _)
                if matches!(
                    f.code,
                    ErrorCode::DiskFull
                        | ErrorCode::SystemIoFailure
                        | ErrorCode::CannotOpen
                        | ErrorCode::ReadOnly
                )
        )
}

/// How long a request may wait for SQLite to record a new holder's lease before the lease
/// is kept in memory instead (and written by the writer when it can be).
const REQUEST_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

pub struct Tracker {
    /// The connection requests record leases with (short busy timeout).
    fast: Mutex<Store>,
    /// The connection of the watcher, the writer and exits (the usual busy timeout).
    store: Mutex<Store>,
    /// What the live daemon knows of leases and removals in memory (shared with the
    /// sweeper and the filesystem's rmdir).
    gate: Arc<super::gate::Gate>,
    /// Lease changes waiting to be written, oldest first.
    queue: Mutex<std::collections::VecDeque<Op>>,
    /// One writer drains the queue at a time.
    draining: Mutex<()>,
    /// Unmounted: nothing more is written.
    stopped: std::sync::atomic::AtomicBool,
    /// Processes known covered, per worktree, each with the activity of the holder that
    /// covers it: the fast path of every request.
    covered: RwLock<HashMap<i64, HashMap<i32, Active>>>,
    /// How many times a worktree's covered set was dropped (a holder exited); bumped
    /// under `covered`'s write lock, so a request that began its walk before a drop
    /// cannot put back what the drop removed.
    drops: AtomicU64,
    watched: Mutex<Vec<Watched>>,
    /// Holders whose exit is being handled (no longer watched, lease not yet passed on or
    /// released): (worktree, pid, start).
    exiting: Mutex<HashSet<(i64, i32, u64)>>,
    /// Written to wake the watcher when a holder is added.
    wake: (OwnedFd, OwnedFd),
    /// Called when the store changed (so the view re-reads states).
    on_change: Box<dyn Fn() + Send + Sync>,
}

impl Tracker {
    pub fn new(
        state: &StateDir,
        gate: Arc<super::gate::Gate>,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> anyhow::Result<Arc<Tracker>> {
        let store = Store::open(&state.root)?;
        let fast = Store::open(&state.root)?;
        fast.set_busy_timeout(REQUEST_BUSY_TIMEOUT)?;
        let (r, w) = nix::unistd::pipe()?;
        let tracker = Arc::new(Tracker {
            fast: Mutex::new(fast),
            store: Mutex::new(store),
            gate,
            queue: Mutex::new(std::collections::VecDeque::new()),
            draining: Mutex::new(()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            covered: RwLock::new(HashMap::new()),
            drops: AtomicU64::new(0),
            watched: Mutex::new(Vec::new()),
            exiting: Mutex::new(HashSet::new()),
            wake: (r, w),
            on_change,
        });
        Ok(tracker)
    }

    /// Boot reconcile: process leases whose process is gone (or whose pid now names
    /// another process) are swept; live ones are watched again.
    pub fn reconcile(&self, mountpoint: &Path) -> anyhow::Result<()> {
        self.watch_recorded(mountpoint, "process gone at boot")?;
        (self.on_change)();
        Ok(())
    }

    /// Process leases recorded by someone else (`run --exclusive` records its own, which
    /// the daemon never took when an ancestor inside covered it): watched from now on, or
    /// swept (`reason`) when their process is gone. Run by the sweeper every second, so
    /// such a lease ends within about a second of its process, however it ends. Returns
    /// how many were swept.
    pub fn watch_recorded(&self, mountpoint: &Path, reason: &str) -> anyhow::Result<usize> {
        if self.stopped.load(Ordering::Acquire) {
            return Ok(0);
        }
        let leases = self.store.lock().leases()?;
        let mut swept = 0;
        for l in leases.into_iter().filter(|l| l.holder_kind == "process") {
            let pid = l.pid.unwrap_or(0) as i32;
            let start = l.pid_start.unwrap_or(-1);
            let known = self.watched.lock().iter().any(|w| {
                w.worktree_id == l.worktree_id && w.info.pid == pid && w.info.start as i64 == start
            }) || self
                .exiting
                .lock()
                .contains(&(l.worktree_id, pid, start as u64));
            // A holder that let go whose release is still queued (the database busy) is
            // not watched again: once written, its requests would find it covered with
            // no lease.
            let releasing = self.queue.lock().iter().any(|op| {
                matches!(op, Op::Release { worktree_id, holder, .. }
                    if *worktree_id == l.worktree_id && *holder == l.holder)
            });
            if known || releasing {
                continue;
            }
            let alive = proc_info(pid).filter(|p| Some(p.start as i64) == l.pid_start);
            let path = mountpoint.join(&l.repo).join(&l.worktree);
            match alive {
                Some(info) => {
                    // Alive but no pidfd (out of descriptors): left as it is, looked at
                    // again next time; never released under a live process.
                    let Some(pidfd) = pidfd_open(pid) else {
                        tracing::warn!(
                            "cannot watch process {pid} (pidfd_open failed): its lease stays"
                        );
                        continue;
                    };
                    // Covered before it is watched: an exit handled in between then drops
                    // the mark with the rest.
                    let active = active_none();
                    self.covered
                        .write()
                        .entry(l.worktree_id)
                        .or_default()
                        .insert(pid, active.clone());
                    self.watch(Watched {
                        worktree_id: l.worktree_id,
                        worktree_path: path,
                        info,
                        pidfd,
                        active,
                        since: std::time::Instant::now(),
                    });
                    let _ = nix::unistd::write(&self.wake.1, b"w");
                }
                None => {
                    if self
                        .store
                        .lock()
                        .release_lease(l.worktree_id, &l.holder, "swept", reason)?
                    {
                        swept += 1;
                    }
                }
            }
        }
        Ok(swept)
    }

    /// Called on every request inside a worktree. Cheap when the process is covered.
    /// Err when the worktree cannot be leased (deleting, removed) or the lease not recorded.
    pub fn touch(
        &self,
        worktree_id: i64,
        worktree_path: impl FnOnce() -> Option<PathBuf>,
        tid: u32,
    ) -> Result<(), LeaseError> {
        let tid = tid as i32;
        if tid <= 0 {
            return Ok(());
        }
        if let Some(set) = self.covered.read().get(&worktree_id) {
            if let Some(active) = set.get(&tid) {
                // Stored only when 100 ms went by: the cell is shared by every process the
                // holder covers.
                let now = now_ms();
                if now - active.load(Ordering::Relaxed) >= 100 {
                    active.store(now, Ordering::Relaxed);
                }
                return Ok(());
            }
        }
        let Some(worktree_path) = worktree_path() else {
            return Ok(());
        };
        let worktree_path = worktree_path.as_path();
        let seen = self.drops.load(Ordering::Acquire);
        let Some(pid) = tgid_of(tid) else {
            return Ok(()); // gone already
        };
        // git run by the daemon for a checkout conversion, and the filters it starts.
        if crate::git::filters::is_ours(pid) {
            return Ok(());
        }
        // Covered by itself or an ancestor?
        let holders: HashMap<i32, Active> = self
            .watched
            .lock()
            .iter()
            .filter(|w| w.worktree_id == worktree_id)
            .map(|w| (w.info.pid, w.active.clone()))
            .collect();
        // A process already known covered covers its descendants too: the set is
        // emptied whenever a holder of this worktree exits.
        let known = |p: i32| {
            self.covered
                .read()
                .get(&worktree_id)
                .and_then(|set| set.get(&p).cloned())
        };
        let covered_by = |active: Active| {
            active.store(now_ms(), Ordering::Relaxed);
            self.mark_covered(worktree_id, seen, &[pid, tid], &active);
        };
        let mut cur = pid;
        let mut depth = 0;
        while cur > 1 && depth < 64 {
            if let Some(active) = holders.get(&cur).cloned().or_else(|| known(cur)) {
                covered_by(active);
                return Ok(());
            }
            cur = match proc_info(cur) {
                Some(p) => p.ppid,
                None => break,
            };
            depth += 1;
        }
        // The holder is the outermost of this process and its ancestors that are inside the
        // worktree: for `cd <worktree> && make`, the shell, whose lease then covers make
        // and everything it starts (the shell's `cd` alone rarely reaches the daemon: the
        // kernel answers it from its caches).
        let Some(mut info) = proc_info(pid) else {
            return Ok(());
        };
        let mut depth = 0;
        while depth < 64 && info.ppid > 1 && is_inside(info.ppid, worktree_path) {
            match proc_info(info.ppid) {
                Some(parent) => info = parent,
                None => break,
            }
            depth += 1;
        }
        if let Some(active) = holders.get(&info.pid) {
            covered_by(active.clone());
            return Ok(());
        }
        // No store re-read here: this runs inside a FUSE request, and the state it moved
        // (ready or lingering to active) is re-read by the next lookup anyway.
        if let Some(active) = self.take(
            worktree_id,
            worktree_path,
            info,
            "first request inside",
            false,
        )? {
            self.mark_covered(worktree_id, seen, &[pid, tid], &active);
        }
        Ok(())
    }

    /// Each watched holder's last activity: (worktree, holder key, unix seconds), for those
    /// a request was seen from since it was watched.
    pub fn activity(&self) -> Vec<(i64, String, i64)> {
        self.watched
            .lock()
            .iter()
            .filter_map(|w| {
                let at = w.active.load(Ordering::Relaxed) / 1000;
                (at > 0).then(|| {
                    let holder = NewLease::Process {
                        pid: w.info.pid,
                        start: w.info.start,
                        command: String::new(),
                    }
                    .holder();
                    (w.worktree_id, holder, at)
                })
            })
            .collect()
    }

    /// Remembers `pids` as covered in a worktree, unless a covered set was dropped since
    /// `seen` (read before the walk that found them covered): that walk may have seen a
    /// holder that has exited since, and a covered process also covers its descendants.
    /// Not remembered, the next request walks again.
    fn mark_covered(&self, worktree_id: i64, seen: u64, pids: &[i32], active: &Active) {
        let mut covered = self.covered.write();
        if self.drops.load(Ordering::Acquire) != seen {
            return;
        }
        covered
            .entry(worktree_id)
            .or_default()
            .extend(pids.iter().map(|p| (*p, active.clone())));
    }

    /// A holder of `worktree_id` exited: nobody is known covered there any more.
    fn drop_covered(&self, worktree_id: i64) {
        let mut covered = self.covered.write();
        self.drops.fetch_add(1, Ordering::AcqRel);
        covered.remove(&worktree_id);
    }

    fn take(
        &self,
        worktree_id: i64,
        worktree_path: &Path,
        info: ProcInfo,
        reason: &str,
        notify: bool,
    ) -> Result<Option<Active>, LeaseError> {
        let Some(pidfd) = pidfd_open(info.pid) else {
            return Ok(None); // exited meanwhile
        };
        let command = command_line(info.pid).unwrap_or_else(|| info.command.clone());
        let lease = NewLease::Process {
            pid: info.pid,
            start: info.start,
            command,
        };
        self.record(worktree_id, lease, reason)?;
        let active = self.watch(Watched {
            worktree_id,
            worktree_path: worktree_path.to_path_buf(),
            info,
            pidfd,
            active: if notify { active_none() } else { active_now() },
            since: std::time::Instant::now(),
        });
        let _ = nix::unistd::write(&self.wake.1, b"w");
        if notify {
            (self.on_change)();
        }
        Ok(Some(active))
    }

    /// Records a new process lease: in SQLite when it answers within the request's busy
    /// timeout and nothing is waiting to be written before it, else in memory (the gate
    /// counts it, the writer records it later). Refused only by the lifecycle: the
    /// worktree is deleting (in memory or in SQLite) or removed; a database that cannot be
    /// written never fails the request.
    fn record(&self, worktree_id: i64, lease: NewLease, reason: &str) -> Result<(), LeaseError> {
        use crate::lease::State;
        self.gate
            .enter(worktree_id)
            .map_err(|c| LeaseError::Conflict(c, State::Deleting))?;
        let holder = lease.holder();
        let (queued, again) = {
            let q = self.queue.lock();
            let again = q.iter().any(|op| {
                matches!(op, Op::Acquire { worktree_id: w, lease: l, .. }
                    if *w == worktree_id && l.holder() == holder)
            });
            (!q.is_empty(), again)
        };
        if again {
            // Already waiting to be written (the sweeper adopts a process inside each
            // round while the database is locked): counted once.
            self.gate.recorded(worktree_id);
            return Ok(());
        }
        // Straight to SQLite when nothing waits before it; else, or when SQLite does not
        // take it within the request's timeout, into the queue.
        let late = if queued {
            "recorded after earlier changes waiting".to_string()
        } else {
            match self.fast.lock().acquire_lease(worktree_id, &lease, reason) {
                Ok(_) => {
                    self.gate.recorded(worktree_id);
                    return Ok(());
                }
                Err(e @ (LeaseError::Conflict(..) | LeaseError::Occupied(_))) => {
                    self.gate.recorded(worktree_id);
                    return Err(e);
                }
                Err(LeaseError::Db(e)) => {
                    tracing::warn!(
                        worktree_id,
                        "the lease of {holder} is kept in memory until the database can be written: {e}"
                    );
                    format!("recorded late: {e}")
                }
            }
        };
        self.enqueue(Op::Acquire {
            worktree_id,
            lease,
            reason: format!("{reason} ({late})"),
            since: crate::store::now_secs(),
        });
        Ok(())
    }

    /// The leases kept in memory, not yet in SQLite: (worktree, lease, since), for
    /// `.control/leases` (who holds what, whether or not the database could say so).
    pub fn pending_leases(&self) -> Vec<(i64, NewLease, i64)> {
        let mut out: Vec<(i64, NewLease, i64)> = Vec::new();
        for op in self.queue.lock().iter() {
            match op {
                Op::Acquire {
                    worktree_id,
                    lease,
                    since,
                    ..
                } => out.push((*worktree_id, lease.clone(), *since)),
                Op::Release {
                    worktree_id,
                    holder,
                    ..
                } => out.retain(|(w, l, _)| !(w == worktree_id && l.holder() == *holder)),
            }
        }
        out
    }

    fn enqueue(&self, op: Op) {
        self.queue.lock().push_back(op);
    }

    /// Writes what is waiting, oldest first, until the queue is empty or the database
    /// refuses (busy, full: tried again later). Returns how many are left.
    pub fn drain(&self) -> usize {
        let _one = self.draining.lock();
        loop {
            if self.stopped.load(Ordering::Acquire) {
                return 0;
            }
            // Left in the queue while it is written: `.control/leases` still shows it, and
            // a repeat of it is still counted once.
            let Some(op) = self.queue.lock().front().cloned() else {
                return 0;
            };
            let result = match &op {
                Op::Acquire {
                    worktree_id,
                    lease,
                    reason,
                    ..
                } => match self.store.lock().acquire_lease(*worktree_id, lease, reason) {
                    Ok(_) => Ok(()),
                    Err(LeaseError::Conflict(c, state)) => {
                        // Only this daemon moves a worktree to deleting, and never over a
                        // pending lease: this means someone else did.
                        tracing::error!(
                            worktree_id,
                            "a lease kept in memory could not be recorded: the worktree is {state} ({c:?})"
                        );
                        Ok(())
                    }
                    // A process lease is never refused for occupancy.
                    Err(LeaseError::Occupied(_)) => Ok(()),
                    Err(LeaseError::Db(e)) => Err(e),
                },
                Op::Release {
                    worktree_id,
                    holder,
                    kind,
                    reason,
                } => self
                    .store
                    .lock()
                    .release_lease(*worktree_id, holder, kind, reason)
                    .map(|_| ()),
            };
            if result.as_ref().is_ok() || result.as_ref().is_err_and(|e| !is_transient(e)) {
                // Only the writer takes from the front (under `draining`): still this one.
                self.queue.lock().pop_front();
            }
            match result {
                Ok(()) => {
                    if let Op::Acquire { worktree_id, .. } = &op {
                        self.gate.recorded(*worktree_id);
                    }
                    (self.on_change)();
                }
                Err(e) if is_transient(&e) => {
                    tracing::debug!("lease changes wait for the database: {e}");
                    return self.queue.lock().len();
                }
                Err(e) => {
                    // Not a matter of waiting (the worktree's row is gone, say): dropped,
                    // so it does not hold up every change behind it.
                    tracing::error!(
                        "a lease change kept in memory cannot be written, dropped: {op:?}: {e}"
                    );
                    if let Op::Acquire { worktree_id, .. } = &op {
                        self.gate.recorded(*worktree_id);
                    }
                }
            }
        }
    }

    /// At unmount, once no request can come: what is still waiting is dropped (every
    /// lease is released with reason `unmount` right after) and nothing more is written.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _one = self.draining.lock();
        let dropped = std::mem::take(&mut *self.queue.lock());
        if !dropped.is_empty() {
            tracing::info!(
                "unmount: {} lease change(s) kept in memory are superseded by the release of every lease",
                dropped.len()
            );
        }
    }

    /// Watches a holder's exit, once per (worktree, process); its activity cell (the one
    /// already watched, if it was).
    fn watch(&self, w: Watched) -> Active {
        let mut watched = self.watched.lock();
        match watched
            .iter()
            .find(|x| x.worktree_id == w.worktree_id && x.info == w.info)
        {
            Some(x) => x.active.clone(),
            None => {
                let active = w.active.clone();
                watched.push(w);
                active
            }
        }
    }

    /// A holder exited: pass its lease to a process still inside, else release it.
    /// Its key is in `exiting` from the moment it left `watched` (the watcher puts it
    /// there under the same lock) until its lease is passed on or released.
    fn holder_exited(&self, w: Watched) {
        let key = (w.worktree_id, w.info.pid, w.info.start);
        self.pass_on_or_release(w, "exited");
        self.exiting.lock().remove(&key);
    }

    /// Last close: a watched holder neither of whose process tree is inside its worktree
    /// any more (working directory, root, program, open file, mapping) lets go as if it had
    /// exited (its lease passed to a process still inside, else released). Run by the
    /// sweeper every second; it reads only the holders' own trees. A holder whose tree
    /// cannot be read (no `/proc/<pid>/task/*/children`) keeps its lease until it exits.
    /// Returns how many let go.
    pub fn release_departed(self: &Arc<Self>) -> usize {
        if self.stopped.load(Ordering::Acquire) {
            return 0;
        }
        // Only a holder idle for a second (no request from a process it covers), watched
        // for a second: one at work, whatever its working directory (a program writing
        // through absolute paths), is not let go between its requests.
        let now = now_ms();
        let holders: Vec<(i64, ProcInfo, PathBuf)> = self
            .watched
            .lock()
            .iter()
            .filter(|w| {
                w.since.elapsed() >= std::time::Duration::from_secs(1)
                    && now - w.active.load(Ordering::Relaxed) >= 1000
            })
            .map(|w| (w.worktree_id, w.info.clone(), w.worktree_path.clone()))
            .collect();
        let mut n = 0;
        for (worktree_id, info, path) in holders {
            if tree_inside(info.pid, &path) != Some(false) {
                continue;
            }
            // Still the same process (not exited and reused meanwhile), still watched.
            if proc_info(info.pid).is_none_or(|p| p.start != info.start) {
                continue;
            }
            let w = {
                let mut watched = self.watched.lock();
                let Some(i) = watched
                    .iter()
                    .position(|w| w.worktree_id == worktree_id && w.info == info)
                else {
                    continue;
                };
                let w = watched.remove(i);
                self.exiting
                    .lock()
                    .insert((worktree_id, info.pid, info.start));
                w
            };
            tracing::info!(
                "process {} ({}) left {}: nothing of its process tree is inside",
                info.pid,
                info.command,
                path.display()
            );
            // On a thread of its own, as an exit is (its scans for an heir take a
            // while): the sweeper goes on.
            let me = self.clone();
            let _ = std::thread::Builder::new()
                .name("lease-left".into())
                .spawn(move || {
                    let key = (w.worktree_id, w.info.pid, w.info.start);
                    me.pass_on_or_release(w, "left (nothing of its process tree is inside)");
                    me.exiting.lock().remove(&key);
                });
            n += 1;
        }
        n
    }

    fn pass_on_or_release(&self, w: Watched, how: &str) {
        let holder = NewLease::Process {
            pid: w.info.pid,
            start: w.info.start,
            command: String::new(),
        }
        .holder();
        self.drop_covered(w.worktree_id);
        // A process that is forking or exiting right now may be missing from one scan (a
        // zombie has no working directory; a child not yet forked is not there): look
        // again twice before concluding nobody is inside. Still well within a second.
        // The heir is watched (pidfd open, start time checked) before its lease is taken,
        // so no lease is ever recorded for a process nobody watches.
        let mut heir: Option<(ProcInfo, OwnedFd)> = None;
        'scan: for wait_ms in [0, 50, 200] {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            // Processes that hold a lease here already keep their own; the exited holder's
            // parent (a shell whose command ended) comes first, then the rest by pid.
            let holders: HashSet<i32> = self
                .watched
                .lock()
                .iter()
                .filter(|x| x.worktree_id == w.worktree_id)
                .map(|x| x.info.pid)
                .collect();
            let mut inside: Vec<i32> = processes_inside(&w.worktree_path, w.info.pid)
                .into_iter()
                .filter(|p| !holders.contains(p))
                .collect();
            inside.sort_by_key(|p| (*p != w.info.ppid, *p));
            tracing::debug!(
                "holder {} of {} exited; inside without a lease: {inside:?}",
                w.info.pid,
                w.worktree_path.display()
            );
            for pid in inside {
                let Some(pidfd) = pidfd_open(pid) else {
                    continue;
                };
                let Some(info) = proc_info(pid) else { continue };
                heir = Some((info, pidfd));
                break 'scan;
            }
        }
        // Through the queue, in order behind anything not yet written (the exited
        // holder's own lease, if it was kept in memory).
        match heir {
            Some((info, pidfd)) => {
                // The heir's lease first, so the worktree never looks unheld.
                let heir_lease = NewLease::Process {
                    pid: info.pid,
                    start: info.start,
                    command: command_line(info.pid).unwrap_or_else(|| info.command.clone()),
                };
                let reason = format!("holder {} {how}; {} is still inside", w.info.pid, info.pid);
                if self.gate.enter_continuing(w.worktree_id).is_ok() {
                    self.enqueue(Op::Acquire {
                        worktree_id: w.worktree_id,
                        lease: heir_lease,
                        reason: reason.clone(),
                        since: crate::store::now_secs(),
                    });
                    self.watch(Watched {
                        worktree_id: w.worktree_id,
                        worktree_path: w.worktree_path.clone(),
                        info,
                        pidfd,
                        active: active_none(),
                        since: std::time::Instant::now(),
                    });
                    // The watcher polls the heir's pidfd from now on, not a second later.
                    let _ = nix::unistd::write(&self.wake.1, b"w");
                }
                self.enqueue(Op::Release {
                    worktree_id: w.worktree_id,
                    holder,
                    kind: "passed",
                    reason,
                });
            }
            None => self.enqueue(Op::Release {
                worktree_id: w.worktree_id,
                holder,
                kind: "released",
                reason: format!("holder {how}"),
            }),
        }
        let left = self.drain();
        if left > 0 {
            tracing::warn!(
                "the lease of process {} ({how}) is released once the database can be written ({left} change(s) waiting)",
                w.info.pid
            );
        }
        (self.on_change)();
    }

    /// The watcher: waits on every holder's pidfd and the wake pipe; and the writer, which
    /// records the lease changes kept in memory as soon as the database takes them (on a
    /// thread of its own: a database locked for long must not delay noticing exits).
    pub fn spawn_watcher(self: &Arc<Self>) {
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-writer".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                if !me.queue.lock().is_empty() {
                    me.drain();
                }
            });
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-watcher".into())
            .spawn(move || loop {
                let mut fds: Vec<libc::pollfd> = vec![libc::pollfd {
                    fd: me.wake.0.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // Who each descriptor polled is: another thread (a holder that left) may
                // close one meanwhile and a new holder get its number, so what fired is
                // told by who was polled, not by the number.
                let polled: Vec<(i64, ProcInfo)> = {
                    let watched = me.watched.lock();
                    fds.extend(watched.iter().map(|w| libc::pollfd {
                        fd: w.pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                    watched
                        .iter()
                        .map(|w| (w.worktree_id, w.info.clone()))
                        .collect()
                };
                // SAFETY: fds is a valid array of pollfd for its length.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
                if n <= 0 {
                    continue;
                }
                if fds[0].revents != 0 {
                    let mut buf = [0u8; 64];
                    let _ = nix::unistd::read(me.wake.0.as_raw_fd(), &mut buf);
                }
                let fired: Vec<&(i64, ProcInfo)> = fds[1..]
                    .iter()
                    .zip(&polled)
                    .filter(|(p, _)| p.revents != 0)
                    .map(|(_, who)| who)
                    .collect();
                if fired.is_empty() {
                    continue;
                }
                let gone: Vec<Watched> = {
                    let mut watched = me.watched.lock();
                    // Exited for sure (a descriptor closed under the poll fires too): its
                    // process no longer runs with that start time.
                    let (gone, keep): (Vec<Watched>, Vec<Watched>) =
                        watched.drain(..).partition(|w| {
                            fired
                                .iter()
                                .any(|(id, info)| *id == w.worktree_id && *info == w.info)
                                && proc_info(w.info.pid)
                                    .is_none_or(|p| p.start != w.info.start || is_zombie_pid(p.pid))
                        });
                    *watched = keep;
                    me.exiting.lock().extend(
                        gone.iter()
                            .map(|w| (w.worktree_id, w.info.pid, w.info.start)),
                    );
                    gone
                };
                // Each on its own thread: one exit's rescans must not delay another's.
                for w in gone {
                    let me = me.clone();
                    let _ = std::thread::Builder::new()
                        .name("lease-exit".into())
                        .spawn(move || me.holder_exited(w));
                }
            });
    }

    /// Before a worktree may start deleting: a process inside it that never made a request
    /// the kernel could not answer from its caches gets its lease now.
    pub fn adopt_processes_inside(&self, worktree_id: i64, worktree_path: &Path) -> bool {
        let mut any = false;
        for pid in processes_inside(worktree_path, 0) {
            if let Some(info) = proc_info(pid) {
                if self
                    .take(
                        worktree_id,
                        worktree_path,
                        info,
                        "inside at the end of the grace period",
                        true,
                    )
                    .is_ok()
                {
                    any = true;
                }
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reaches_only_the_process_of_that_start_time() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i64;
        let start = proc_info(pid as i32).unwrap().start as i64;
        // Another start time: the pid names another process, which is left alone.
        assert!(!signal(pid, start + 1, libc::SIGTERM).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            child.try_wait().unwrap().is_none(),
            "signalled the wrong process"
        );
        assert!(signal(pid, start, libc::SIGTERM).unwrap());
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        // Reaped: gone.
        assert!(!signal(pid, start, libc::SIGTERM).unwrap());
    }

    #[test]
    fn a_walk_that_began_before_a_holder_exited_marks_nobody_covered() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let t = Tracker::new(
            &state,
            Arc::new(crate::lifecycle::gate::Gate::new()),
            Box::new(|| {}),
        )
        .unwrap();
        let covered = |pid| {
            t.covered
                .read()
                .get(&7)
                .is_some_and(|s| s.contains_key(&pid))
        };
        let a = active_none();
        let seen = t.drops.load(Ordering::Acquire);
        t.mark_covered(7, seen, &[100, 101], &a);
        assert!(covered(100) && covered(101));
        // A walk starts, then a holder of the worktree exits: what the walk found must not
        // come back after the drop (a covered process covers its descendants too).
        let seen = t.drops.load(Ordering::Acquire);
        t.drop_covered(7);
        assert!(!covered(100));
        t.mark_covered(7, seen, &[200], &a);
        assert!(!covered(200));
        // A walk that starts after the drop is remembered again.
        t.mark_covered(7, t.drops.load(Ordering::Acquire), &[200], &a);
        assert!(covered(200));
    }

    #[test]
    fn mappings_below_are_inside_and_shared_writable_ones_are_writers() {
        let dir = Path::new("/mnt/repo/wt");
        let line = |perms: &str, path: &str| {
            format!("7ff543199000-7ff54319a000 {perms} 00000000 00:28 8115940858                 {path}")
        };
        let writes = |l: String| shared_writable_below(l.as_bytes(), dir).is_some();
        assert!(writes(line("rw-s", "/mnt/repo/wt/a b.txt")));
        assert_eq!(
            shared_writable_below(line("rw-s", "/mnt/repo/wt/x (deleted)").as_bytes(), dir),
            Some(PathBuf::from("/mnt/repo/wt/x"))
        );
        for (perms, path) in [
            ("r--s", "/mnt/repo/wt/a"),
            ("rw-p", "/mnt/repo/wt/a"),
            ("rw-s", "/mnt/repo/wt2/a"),
            ("rw-s", "/mnt/repo/other"),
            ("rw-s", ""),
        ] {
            assert!(!writes(line(perms, path)), "{perms} {path}");
        }
        assert!(shared_writable_below(b"", dir).is_none());
        // Any mapping of a file below is inside (a program or library built there).
        for (perms, path, inside) in [
            ("r-xp", "/mnt/repo/wt/target/debug/app", true),
            ("r--p", "/mnt/repo/wt/lib.so (deleted)", true),
            ("rw-s", "/mnt/repo/wt/a b.txt", true),
            ("r-xp", "/usr/lib/libc.so.6", false),
            ("rw-p", "", false),
            ("rw-p", "[heap]", false),
            ("r-xp", "/mnt/repo/wt2/app", false),
        ] {
            assert_eq!(
                maps_below(line(perms, path).as_bytes(), dir),
                inside,
                "{path}"
            );
        }
    }

    #[test]
    fn a_process_tree_is_inside_while_a_descendant_is() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap();
        // sh (outside) -> sh -> sleep, the grandchild's working directory inside.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "(cd '{}' && exec sleep 5) & wait",
                inside.display()
            ))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tree_inside(pid, &inside) != Some(true) {
            assert!(
                std::time::Instant::now() < end,
                "the grandchild is never seen inside"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!is_inside(pid, &inside), "the shell itself is outside");
        child.kill().unwrap();
        child.wait().unwrap();
        // A tree of this test's own (not this process's, whose children include other
        // tests' short-lived processes, one of which may exit mid-walk: None).
        let mut outside = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let outside_pid = outside.id() as i32;
        let found = tree_inside(outside_pid, Path::new("/nonexistent/dir"));
        outside.kill().unwrap();
        outside.wait().unwrap();
        assert_eq!(found, Some(false));
    }

    #[test]
    fn proc_info_reads_this_process() {
        let me = std::process::id() as i32;
        let info = proc_info(me).unwrap();
        assert_eq!(info.pid, me);
        assert!(info.start > 0);
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(tgid_of(me), Some(me));
        // A thread other than the leader belongs to the leader's process.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: plain syscall.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
            tx.send((tid, tgid_of(tid))).unwrap();
        })
        .join()
        .unwrap();
        let (tid, tgid) = rx.recv().unwrap();
        assert_ne!(tid, me);
        assert_eq!(tgid, Some(me));
        assert!(proc_info(i32::MAX).is_none());
    }

    #[test]
    fn inside_follows_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // The child's cwd is set before exec; allow it a moment to appear.
        let mut seen = false;
        for _ in 0..50 {
            if is_inside(pid, dir.path()) {
                seen = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let listed = processes_inside(dir.path(), 0);
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen);
        assert!(listed.contains(&pid));
    }

    /// A working directory deeper than PATH_MAX cannot be read back from /proc (ENAMETOOLONG):
    /// such a process is not taken for one outside (last close would end its lease and
    /// cleanup remove the worktree under it).
    #[test]
    fn a_working_directory_too_deep_to_name_is_not_taken_for_outside() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap();
        // 60 levels of 100-byte names, made and opened one below the other (relative to
        // a descriptor: no path that long is ever spelled), then the child's cwd.
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let name = "d".repeat(100);
        let open = |at: libc::c_int, n: &str| -> OwnedFd {
            let c = std::ffi::CString::new(n).unwrap();
            // SAFETY: openat on a NUL-terminated name.
            let fd = unsafe { libc::openat(at, c.as_ptr(), libc::O_DIRECTORY | libc::O_CLOEXEC) };
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            // SAFETY: just opened, ours.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let mut fd = open(libc::AT_FDCWD, inside.to_str().unwrap());
        let c = std::ffi::CString::new(name.as_str()).unwrap();
        for _ in 0..60 {
            // SAFETY: mkdirat on a NUL-terminated name.
            assert_eq!(
                unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o755) },
                0
            );
            fd = open(fd.as_raw_fd(), &name);
        }
        let deep = fd.as_raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("10");
        // SAFETY: fchdir is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fchdir(deep) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(fd);
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let named = std::fs::read_link(format!("/proc/{pid}/cwd"));
        let inside_now = inside_or_unknown(pid, &inside);
        let tree = tree_inside(pid, &inside);
        let listed = is_inside(pid, &inside);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            named.is_err(),
            "the kernel named a path deeper than PATH_MAX"
        );
        assert_ne!(inside_now, Some(false));
        assert_ne!(tree, Some(false));
        assert!(listed, "listed among the processes inside");
    }
}
