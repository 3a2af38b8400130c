//! Running this program's command for a tool: bounded in time, its output read until it
//! has exited and its pipes are quiet, and the turns still running ended when the client
//! goes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock};
use tokio_util::sync::CancellationToken;

/// What one run of the CLI gave.
pub(super) struct Ran {
    pub(super) code: Option<i32>,
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) timed_out: bool,
    /// The client cancelled the call, and the command was ended for it.
    pub(super) cancelled: bool,
}

/// The tail of `s`: its last `n` bytes, cut at a character boundary.
pub(super) fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut i = s.len() - n;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    format!("…{}", &s[i..])
}

/// How much of a turn's output its result carries.
pub(super) const TAIL_BYTES: usize = 4096;

/// How [`Server::cli`] runs a command.
pub(super) struct How {
    /// SIGTERM past it, SIGKILL [`KILL_AFTER`] later.
    pub(super) limit: Duration,
    /// How much of each stream is kept (its tail).
    pub(super) keep: usize,
    /// A turn: ended with the server, and its tree with it.
    pub(super) turn: bool,
    /// The call's cancellation: once it fires, the command is ended as past its limit.
    pub(super) cancel: Option<CancellationToken>,
}

/// How long a turn has to end after the server's SIGTERM before the server kills what
/// runs below it: the turn's own SIGKILL comes [`KILL_AFTER`] after the SIGTERM it passes
/// on, and its end of what was left running takes at most 7 s more.
pub(super) const TURN_END_GRACE: Duration = Duration::from_secs(15);

/// How long a command past its limit has, after SIGTERM, before SIGKILL.
pub(super) const KILL_AFTER: Duration = Duration::from_secs(5);

/// How much of a turn's stream is kept: past it, the oldest half goes (its result carries
/// only the tail). A command's JSON outcome is kept whole.
pub(super) const KEEP_BYTES: usize = 16 << 20;

/// How long the pipes may stay quiet, once the command has exited, before reading stops.
pub(super) const QUIET_AFTER_EXIT: Duration = Duration::from_millis(200);

/// How long reading may go on at all once the command has exited.
pub(super) const READ_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Reads `out` and `err` until both close, or once `exited` is set, until nothing has come
/// for [`QUIET_AFTER_EXIT`] or [`READ_AFTER_EXIT`] has passed: what the command left
/// running may hold them open, and write to them, forever.
pub(super) fn drain(
    out: Option<std::process::ChildStdout>,
    err: Option<std::process::ChildStderr>,
    exited: &AtomicBool,
    keep: usize,
) -> (Vec<u8>, Vec<u8>) {
    let mut fds: Vec<(Option<OwnedFd>, Vec<u8>)> = vec![
        (out.map(OwnedFd::from), Vec::new()),
        (err.map(OwnedFd::from), Vec::new()),
    ];
    let (mut quiet_since, mut exited_at) = (None, None);
    loop {
        let mut polled: Vec<libc::pollfd> = fds
            .iter()
            .filter_map(|(fd, _)| fd.as_ref())
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if polled.is_empty() {
            break;
        }
        // SAFETY: poll(2) on descriptors this function owns, `polled.len()` entries.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 50) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
        let mut got = false;
        for p in &polled {
            if p.revents == 0 {
                continue;
            }
            let Some((fd, buf)) = fds
                .iter_mut()
                .find(|(fd, _)| fd.as_ref().is_some_and(|f| f.as_raw_fd() == p.fd))
            else {
                continue;
            };
            let mut chunk = [0u8; 65536];
            // SAFETY: read(2) into a buffer of that size; poll said it will not block.
            let r = unsafe { libc::read(p.fd, chunk.as_mut_ptr().cast(), chunk.len()) };
            if r > 0 {
                got = true;
                buf.extend_from_slice(&chunk[..r as usize]);
                if buf.len() > keep {
                    buf.drain(..buf.len() - keep / 2);
                }
            } else if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
            {
                *fd = None;
            }
        }
        if exited.load(Ordering::SeqCst) {
            let at = *exited_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= READ_AFTER_EXIT {
                break;
            }
            if got {
                quiet_since = None;
            } else if quiet_since.get_or_insert_with(Instant::now).elapsed() >= QUIET_AFTER_EXIT {
                break;
            }
        }
    }
    let err = std::mem::take(&mut fds[1].1);
    (std::mem::take(&mut fds[0].1), err)
}

/// The commands this server runs now (their pidfds), to end when its client goes.
pub(super) struct Running {
    pid: u32,
}

pub(super) static RUNNING: std::sync::Mutex<Vec<(u32, OwnedFd)>> =
    std::sync::Mutex::new(Vec::new());

impl Running {
    /// `pid`: a child just spawned, not yet waited for (its pidfd is surely its own).
    pub(super) fn add(pid: u32) -> Running {
        if let Some(fd) = worktreefs::process::pidfd::pidfd_open(pid as i32) {
            RUNNING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((pid, fd));
        }
        Running { pid }
    }

    /// SIGTERM to every turn still running, SIGKILL to those left after `grace` and to
    /// what runs below them.
    pub(super) fn end_all(grace: Duration) {
        let send = |sig| {
            let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            for (_, fd) in running.iter() {
                let _ = worktreefs::process::pidfd::pidfd_signal(fd, sig);
            }
            running.len()
        };
        if send(libc::SIGTERM) == 0 {
            return;
        }
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if RUNNING.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for (pid, fd) in RUNNING.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // Only below a turn still there (its pid is its own, not yet reaped).
            if !worktreefs::process::tree::has_exited(fd) {
                for p in worktreefs::process::tree::below(*pid as libc::pid_t) {
                    p.signal(libc::SIGKILL);
                }
            }
        }
        send(libc::SIGKILL);
    }
}

impl Drop for Running {
    /// The command has exited (and been waited for).
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(pid, _)| *pid != self.pid);
    }
}

/// A tool's error result: `message` for people (and the model), then `refusal`, the
/// typed JSON (`error` says which), as a second text block. No structured content: that
/// is checked against the tool's output schema, which is a success's.
pub(super) fn error_result(message: String, refusal: serde_json::Value) -> CallToolResult {
    CallToolResult::error(vec![
        ContentBlock::text(message),
        ContentBlock::text(refusal.to_string()),
    ])
}

/// A refusal or failure as the tool's error result: the message the CLI prints (its
/// stderr, less the `worktreefs: ` it starts with), with the JSON it gave.
pub(super) fn refused(ran: &Ran, value: Option<serde_json::Value>) -> CallToolResult {
    let said = ran
        .stderr
        .trim()
        .strip_prefix("worktreefs: ")
        .unwrap_or(ran.stderr.trim())
        .to_string();
    let message = value
        .as_ref()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .filter(|_| said.is_empty())
        .unwrap_or(said);
    let message = if message.is_empty() {
        match ran.code {
            Some(c) => format!("worktreefs ended with exit status {c} and said nothing"),
            None => "worktreefs was ended by a signal and said nothing".to_string(),
        }
    } else {
        message
    };
    let refusal = match value {
        Some(v) if v.is_object() => v,
        _ => serde_json::json!({"error": "failed", "message": message, "exit_status": ran.code}),
    };
    error_result(message, refusal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use std::sync::Arc;

    /// A command that exits while what it started keeps its stdout open, writing all the
    /// time: its output is read up to a bound after the exit, never until that ends.
    #[test]
    fn reading_stops_soon_after_the_exit_whatever_holds_the_pipes() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .process_group(0)
            .args([
                "-c",
                "(while :; do echo more; sleep 0.01; done) & echo \"first $!\"; echo said >&2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let exited = Arc::new(AtomicBool::new(false));
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let exited = exited.clone();
            std::thread::spawn(move || tx.send(drain(out, err, &exited, usize::MAX)));
        }
        let group = child.id() as i32;
        child.wait().unwrap();
        exited.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let read = rx.recv_timeout(Duration::from_secs(10));
        let took = started.elapsed();
        // SAFETY: plain kill of the process group this test started (the loop left behind).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let (out, err) = read.expect("reading did not stop within 10 s of the exit");
        let out = String::from_utf8(out).unwrap();
        assert!(out.lines().any(|l| l.starts_with("first ")), "{out}");
        assert!(out.contains("more"), "{out}");
        assert_eq!(String::from_utf8(err).unwrap(), "said\n");
        assert!(
            took < READ_AFTER_EXIT + Duration::from_secs(1),
            "reading went on for {took:?} after the exit"
        );
    }
}
