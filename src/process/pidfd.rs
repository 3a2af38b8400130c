//! pidfds: a process named by a descriptor of its own, so a signal sent through it never
//! reaches another process that reused the pid meanwhile.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
