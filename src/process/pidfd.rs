//! Signals through pidfds: a process is named by a descriptor of its own, so a pid reused
//! by another process meanwhile is never signalled.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::info::proc_info;

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
}
