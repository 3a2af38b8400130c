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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_signal_through_a_pidfd_reaches_the_process_it_was_opened_for() {
        let mut child = sleeper();
        let fd = pidfd_open(child.id() as i32).expect("a pidfd of a child not yet waited for");
        assert!(pidfd_signal(&fd, libc::SIGTERM).unwrap());
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn once_reaped_a_process_is_gone_for_its_pidfd_and_has_none_to_open() {
        let mut child = sleeper();
        let pid = child.id() as i32;
        let fd = pidfd_open(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!pidfd_signal(&fd, libc::SIGTERM).unwrap(), "gone");
        assert!(!pidfd_signal(&fd, 0).unwrap(), "gone");
        assert!(pidfd_open(pid).is_none());
    }

    /// The arguments of clone3(2), as far as `set_tid` (CLONE_ARGS_SIZE_VER1 and on).
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
    }

    /// A child of this process with pid `pid` (clone3's `set_tid`, which root may ask
    /// for), waiting for a signal until it is killed.
    fn child_with_pid(pid: libc::pid_t) -> std::io::Result<()> {
        let tid = pid;
        let args = CloneArgs {
            exit_signal: libc::SIGCHLD as u64,
            set_tid: &tid as *const libc::pid_t as u64,
            set_tid_size: 1,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 with no shared memory, as fork does; the child makes nothing but
        // raw system calls (no lock another thread may have held) until it is killed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match r {
            0 => loop {
                // SAFETY: ppoll of no descriptors: waits for a signal.
                unsafe {
                    libc::syscall(
                        libc::SYS_ppoll,
                        std::ptr::null::<libc::pollfd>(),
                        0,
                        std::ptr::null::<libc::timespec>(),
                        std::ptr::null::<libc::sigset_t>(),
                    )
                };
            },
            r if r < 0 => Err(std::io::Error::last_os_error()),
            r => {
                assert_eq!(r as libc::pid_t, pid);
                Ok(())
            }
        }
    }

    /// In a process of its own (`process::alone`): its raw child is a copy of the test
    /// process that never execs, which would hold the other tests' descriptors while it
    /// lives, and waiting for it by pid is this process's to do alone. Needs root
    /// (clone3's `set_tid` wants CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), as the
    /// mounted tests do.
    #[test]
    fn a_signal_through_a_pidfd_never_reaches_a_process_that_reused_the_pid() {
        if !crate::process::alone(
            "process::pidfd::tests::a_signal_through_a_pidfd_never_reaches_a_process_that_reused_the_pid",
        ) {
            return;
        }
        let mut child = sleeper();
        let pid = child.id() as i32;
        let fd = pidfd_open(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        child_with_pid(pid).expect("a child with the freed pid (clone3 set_tid, as root)");
        let sent = pidfd_signal(&fd, libc::SIGKILL);
        // Time for a SIGKILL that did reach it to end it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut status = 0;
        // SAFETY: waitpid of this process's own child, without waiting.
        let untouched = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0;
        // SAFETY: the new child is not reaped, so `pid` is still its own.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // SAFETY: waitpid of this process's own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(!sent.unwrap(), "the old process is gone");
        assert!(untouched, "the new process with its pid was signalled");
    }
}
