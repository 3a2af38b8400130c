//! Questions to a filesystem that may never answer, asked by a child process under a
//! time limit: a `statx` or a read of a mount whose daemon is stopped or hung.
//!
//! A thread cannot be abandoned for this: a request the daemon has taken (over io_uring
//! a request is the daemon's as soon as it is queued, whether the daemon runs or not)
//! holds its caller in an uninterruptible wait, and a process whose thread waits so never
//! finishes exiting, so the command that asked would hang at its end. A child that waits
//! so is left behind (killed, it ends when its request does) and the command goes on.
//!
//! The child runs only system calls on buffers made before the fork (a multi-threaded
//! process's child may not take a lock, and so may not allocate).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The most a read in a child returns.
pub const MAX_READ: usize = 1 << 20;

/// `statx(path, AT_STATX_FORCE_SYNC)` (the kernel must ask the filesystem), in a child:
/// Some(0) it answered, Some(errno) it failed, None no answer within `within`.
pub fn statx_sync(path: &Path, within: Duration) -> Option<i32> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let out = in_child(within, 4, |w| {
        // SAFETY: a zeroed statx is a valid buffer; the path outlives the call.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::statx(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC,
                libc::STATX_BASIC_STATS,
                &mut st,
            )
        };
        let errno = if rc == 0 { 0 } else { last_errno() };
        write_all(w, &errno.to_ne_bytes());
    })?;
    Some(i32::from_ne_bytes(out.get(..4)?.try_into().ok()?))
}

/// The content of file `path` (at most [`MAX_READ`] bytes), read in a child: None when
/// nothing came within `within`; Err(errno) when it could not be read.
pub fn read(path: &Path, within: Duration) -> Option<Result<Vec<u8>, i32>> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // The child writes a status byte (0: content follows; else 1 and the errno), then
    // the content.
    let out = in_child(within, MAX_READ + 5, |w| {
        // SAFETY: open and read into a buffer on the child's stack.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            let mut msg = [1u8; 5];
            msg[1..].copy_from_slice(&last_errno().to_ne_bytes());
            write_all(w, &msg);
            return;
        }
        write_all(w, &[0]);
        let mut buf = [0u8; 4096];
        loop {
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            write_all(w, &buf[..n as usize]);
        }
    })?;
    match out.first() {
        Some(0) => Some(Ok(out[1..].to_vec())),
        Some(_) if out.len() >= 5 => Some(Err(i32::from_ne_bytes(out[1..5].try_into().ok()?))),
        _ => None,
    }
}

/// Closes descriptors `first..=last` (when `any`), with close_range(2) or, where the
/// kernel lacks it, one by one up to the process's limit (in the child: no allocation).
fn close_from_to(first: libc::c_uint, last: libc::c_uint, any: bool) {
    if !any {
        return;
    }
    // SAFETY: closes descriptors of this (child) process only.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc == 0 {
        return;
    }
    // SAFETY: as above.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(1024, 1 << 20) as libc::c_uint;
    for fd in first..=last.min(max) {
        // SAFETY: as above.
        unsafe { libc::close(fd as i32) };
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Writes all of `data` to descriptor `fd` (in the child: no allocation).
fn write_all(fd: i32, mut data: &[u8]) {
    while !data.is_empty() {
        // SAFETY: a write from a live buffer.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n <= 0 {
            return;
        }
        data = &data[n as usize..];
    }
}

/// Runs `work` in a child process, which writes its answer to the descriptor it is given;
/// returns what it wrote (at most `max` bytes) once it ends, or None when it did not end
/// within `within` (it is then killed and reaped by a thread of its own when it ends).
fn in_child(within: Duration, max: usize, work: impl FnOnce(i32)) -> Option<Vec<u8>> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both descriptors were just made and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child runs only `work` (system calls on buffers made before the fork)
    // and `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return None;
    }
    if pid == 0 {
        // Nothing of the parent's stays open here but the answer's pipe: a child left
        // waiting must not hold its standard output (whoever reads it would wait too),
        // nor a lock or a connection the parent holds.
        let keep = w.as_raw_fd() as libc::c_uint;
        close_from_to(0, keep.saturating_sub(1), keep > 0);
        close_from_to(keep + 1, libc::c_uint::MAX, true);
        work(w.as_raw_fd());
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(w);
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let ended = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll of one descriptor.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 && last_errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break false;
        }
        // SAFETY: a read into a live buffer.
        let got = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if got <= 0 {
            break got == 0;
        }
        out.extend_from_slice(&buf[..got as usize]);
        if out.len() > max {
            break false;
        }
    };
    if ended {
        // SAFETY: reaps our own child, which has closed its end (it is ending).
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        return Some(out);
    }
    // SAFETY: kill and reap our own child; it ends when its request does.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::thread::Builder::new()
        .name("asked-reaper".into())
        .spawn(move || unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        });
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_comes_back_from_the_child() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(statx_sync(&f, Duration::from_secs(10)), Some(0));
        assert_eq!(
            statx_sync(&dir.path().join("missing"), Duration::from_secs(10)),
            Some(libc::ENOENT)
        );
        assert_eq!(
            read(&f, Duration::from_secs(10)),
            Some(Ok(b"hello".to_vec()))
        );
        assert_eq!(
            read(&dir.path().join("missing"), Duration::from_secs(10)),
            Some(Err(libc::ENOENT))
        );
    }

    /// A read that never ends (a FIFO nobody writes) is given up at its limit, and the
    /// caller goes on; the child left waiting holds none of the caller's descriptors (a
    /// pipe the caller's reader waits on ends when the caller closes its end).
    #[test]
    fn a_question_never_answered_is_given_up_holding_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo of a fresh path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut fds = [0i32; 2];
        // SAFETY: a pipe, not close-on-exec (as a caller's standard output would be).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let t = Instant::now();
        assert_eq!(read(&fifo, Duration::from_millis(300)), None);
        assert!(t.elapsed() < Duration::from_secs(5));
        // SAFETY: closing our write end; the read end then sees EOF unless the waiting
        // child kept a copy.
        unsafe { libc::close(fds[1]) };
        let mut pfd = libc::pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
        assert_eq!(n, 1, "the pipe's end is not held by the waiting child");
        assert!(pfd.revents & libc::POLLHUP != 0);
        // The child was killed in its open of the FIFO; were it still waiting there, a
        // writer's open would let it end (never blocking here: no reader, ENXIO).
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        unsafe { libc::close(fds[0]) };
    }
}
