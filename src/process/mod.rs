//! Processes, as this machine's `/proc` and pidfds show them: who a process is and
//! whether it is still there, whether it is inside a directory, signals that never reach
//! a process that reused a pid, the tree below a command, a child's exit seen without
//! reaping it, and running a command below this process as system(3) does. A leaf: it
//! names nothing of the crate.

pub mod info;
pub mod inside;
pub mod pidfd;
pub mod supervise;
pub mod tree;
pub mod unreaped;

/// Runs test `name` (its path as the test harness names it, `process::tree::tests::…`) in
/// a process of its own and says whether this is that process. The tests that use it make
/// their process a subreaper, reap any child, signal every process below it or change
/// signal dispositions, none of which the other tests of this binary, on other threads,
/// may see or suffer. That process leads a process group of its own, which is sent
/// SIGKILL once the process has exited and before it is reaped (so the group's id is no
/// one else's): nothing the test left in the group lives on. A run longer than a minute
/// is ended the same way and fails.
#[cfg(test)]
pub(crate) fn alone(name: &str) -> bool {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};
    const VAR: &str = "WORKTREEFS_TEST_ALONE";
    if std::env::var(VAR).as_deref() == Ok(name) {
        return true;
    }
    // Its output goes to a file, not a pipe: a process it left holding the pipe open
    // would keep a reader waiting.
    let mut out = tempfile::tempfile().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(VAR, name)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out.try_clone().unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !unreaped::has_exited(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let in_time = unreaped::has_exited(pid);
    // SAFETY: SIGKILL to the process group the child leads; the child is not reaped yet,
    // so the group's id is not another's.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let status = child.wait().unwrap();
    let mut text = String::new();
    std::io::Seek::rewind(&mut out).unwrap();
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    assert!(
        in_time,
        "{name} in its own process ran over a minute:\n{text}"
    );
    assert!(status.success(), "{name} in its own process:\n{text}");
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    false
}
