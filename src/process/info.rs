//! A process as `/proc` shows it: its start time (which tells it from a later process
//! given the same pid), its parent, its command line, and whether it is still there.

use std::fs;
use std::io::Read;

use super::pidfd::{pidfd_open, pidfd_signal};

/// A process as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// The session it is in (its leader's pid).
    pub session: i32,
    /// Start time in clock ticks since boot (field 22 of /proc/<pid>/stat).
    pub start: u64,
    pub command: String,
}

/// Reads /proc/<pid>/stat. The command may hold spaces and parentheses, so fields are
/// counted from the last ')'.
pub fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = read_proc(&format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &stat)
}

/// Reads a small `/proc` file (`stat`, `status`) whole. `fs::read_to_string` asks for its
/// size (0 for these) and then reads in steps from 32 bytes, nine system calls for a
/// `stat` in all; into room for 1 KiB it is one read and the one that sees the end.
/// This runs on the first request of every new process in a worktree (`cc1`, `as`, `ld`
/// each). A process names itself with any bytes (`prctl(PR_SET_NAME)`), so the text is
/// taken lossily: a name that is not UTF-8 still leaves the fields after it readable.
pub fn read_proc(path: &str) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(String::from_utf8(buf)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// How the holder of a process lease `(pid, start)` stands for the process `me` asking
/// for a lease: [`Liveness::Ours`] when it is `me` or one of its ancestors (`cd wt &&
/// worktreefs run --exclusive …` is not refused for its own shell).
pub fn liveness_for(me: i32) -> impl Fn(i64, i64) -> Liveness {
    use Liveness;
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
pub fn liveness(pid: i64, start: i64) -> Liveness {
    use Liveness;
    let path = format!("/proc/{pid}/stat");
    match read_proc(&path) {
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
pub fn is_zombie_pid(pid: i32) -> bool {
    read_proc(&format!("/proc/{pid}/stat")).is_ok_and(|s| is_zombie(&s))
}

/// Whether a `/proc/<pid>/stat` text's state (the field after the command) says the
/// process has exited: zombie or dead.
pub fn is_zombie(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|c| stat[c + 1..].split_whitespace().next())
        .is_some_and(|st| st == "Z" || st == "X")
}

fn parse_stat(pid: i32, stat: &str) -> Option<ProcInfo> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let command = stat[open + 1..close].to_string();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // fields[0] is field 3 (state): ppid is field 4, session field 6, starttime field 22.
    Some(ProcInfo {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
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
    let status = read_proc(&format!("/proc/{tid}/status")).ok()?;
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

/// A process holder, as the one asking for a lease sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// The one asking, or one of its ancestors: not somebody else.
    Ours,
    Alive,
    /// Exited (or its pid names another process now): it holds nothing.
    Gone,
    /// Cannot be told; why.
    Unknown(String),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_named_in_bytes_that_are_not_utf8_is_still_read() {
        // A thread's stat shows its own name; `PR_SET_NAME` takes any bytes.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: plain syscalls; the name is a NUL-terminated buffer that outlives them.
            let tid = unsafe {
                libc::prctl(libc::PR_SET_NAME, c"w\xff\xfe(x) S".as_ptr());
                libc::syscall(libc::SYS_gettid)
            } as i32;
            tx.send(tid).unwrap();
            wait.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let info = proc_info(tid);
        // Its status too (`Name:` holds the same bytes): a thread is told from its process.
        let tgid = tgid_of(tid);
        done.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(tgid, Some(std::process::id() as i32));
        let info = info.expect("its stat read, though its name is not UTF-8");
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(info.command, "w\u{fffd}\u{fffd}(x) S");
    }

    #[test]
    fn read_proc_reads_past_its_first_kilobyte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long");
        let text: String = (0..700).map(|i| format!("{i} ")).collect();
        assert!(text.len() > 2048);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_proc(path.to_str().unwrap()).unwrap(), text);
        let status = read_proc("/proc/self/status").unwrap();
        assert!(status.starts_with("Name:") && status.ends_with('\n'));
    }

    #[test]
    fn proc_info_reads_this_process() {
        let me = std::process::id() as i32;
        let info = proc_info(me).unwrap();
        assert_eq!(info.pid, me);
        assert!(info.start > 0);
        assert_eq!(info.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(
            info.session,
            nix::unistd::getsid(None).unwrap().as_raw(),
            "the session, read past a command of spaces and parentheses"
        );
        assert_eq!(
            parse_stat(
                9,
                "9 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"
            )
            .map(|p| (p.command, p.ppid, p.session, p.start)),
            Some(("a) b (c".to_string(), 1, 3, 19))
        );
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
}
