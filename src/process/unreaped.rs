//! A child's exit seen without reaping it (`waitid` with `WNOWAIT`): until it is reaped,
//! its pid (and so the id of the process group or session it leads) cannot be given to
//! another process, so what it left can still be signalled by that id.

/// Whether child `pid` of this process has exited (or cannot be waited for), without
/// reaping it and without waiting.
pub fn has_exited(pid: i32) -> bool {
    // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on this process's own child, writing only into `info`.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is set by waitid when a child changed state (0 when none did).
    rc != 0 || unsafe { info.si_pid() } != 0
}

/// Waits until child `pid` of this process has exited, without reaping it.
pub fn until_exited(pid: i32) {
    loop {
        // SAFETY: as in `has_exited`.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as in `has_exited`.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child is seen to have exited and stays unreaped (its pid still ours to wait
    /// for) until it is.
    #[test]
    fn an_exit_is_seen_and_the_child_left_unreaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!has_exited(pid));
        until_exited(pid);
        assert!(has_exited(pid));
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "reaped"
        );
        assert!(child.wait().unwrap().success());
    }
}
