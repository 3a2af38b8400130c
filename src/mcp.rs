//! `worktreefs mcp`: the CLI's operations for agent frameworks, over the Model Context
//! Protocol on stdio (`rmcp`). Each tool runs this same program's command with `--json`
//! (one code path, one set of checks and messages for people and for agents): its JSON
//! is the tool's structured result; a refusal or failure is a tool result with `isError`
//! carrying the message the CLI prints, then the refusal's JSON as a second text block.
//! A refusal has no structured content: clients check structured content against the
//! tool's output schema, which describes what a success gives. JSON-RPC errors are left
//! for protocol faults. A client's `notifications/cancelled` ends a turn as its timeout
//! would.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// What one run of the CLI gave.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
    /// The client cancelled the call, and the command was ended for it.
    cancelled: bool,
}

#[derive(Clone)]
pub struct Server {
    exe: PathBuf,
    state_dir: PathBuf,
    tool_router: ToolRouter<Self>,
}

/// A file only this server made, for one turn's outcome (`turn --report`): created new
/// under a name no one can guess (never one that was there, nor through a link) with mode
/// 0600, read back through the descriptor it was made with (whatever is put at its name
/// meanwhile), removed when dropped. It is locked (flock) for as long as this server has
/// it, so a server that was killed leaves a file nobody locks, which the next one removes
/// ([`sweep_reports`]).
struct ReportFile {
    path: PathBuf,
    file: std::fs::File,
}

/// How much of a turn's outcome is read: it is one JSON object of a few hundred bytes.
const REPORT_BYTES: u64 = 64 << 10;

/// The names report files have: `worktreefs-mcp-<random>.json`.
const REPORT_PREFIX: &str = "worktreefs-mcp-";
const REPORT_SUFFIX: &str = ".json";

/// A report file nobody locks is swept only once this old: a server locks its file a
/// moment after making it, never this long after.
const REPORT_SWEEP_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl ReportFile {
    fn new() -> std::io::Result<ReportFile> {
        Self::new_in(&std::env::temp_dir())
    }

    fn new_in(dir: &std::path::Path) -> std::io::Result<ReportFile> {
        use std::os::unix::fs::OpenOptionsExt;
        sweep_reports(dir);
        let mut tries = 0;
        loop {
            let mut bytes = [0u8; 12];
            // SAFETY: getrandom(2) into a buffer of that length.
            let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
            if n != bytes.len() as isize {
                return Err(std::io::Error::last_os_error());
            }
            let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let path = dir.join(format!("{REPORT_PREFIX}{name}{REPORT_SUFFIX}"));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    let report = ReportFile { path, file };
                    report.file.try_lock()?;
                    return Ok(report);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => {
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What the turn wrote: one JSON object, or None.
    fn read(&self) -> Option<serde_json::Value> {
        use std::io::Read;
        std::io::Seek::rewind(&mut &self.file).ok()?;
        let mut text = String::new();
        (&self.file)
            .take(REPORT_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        serde_json::from_str(text.trim()).ok()
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes from `dir` the report files of servers that are gone: this user's regular
/// files named as report files, older than [`REPORT_SWEEP_AGE`], that no descriptor
/// locks. A link or anything else at such a name is left; nothing is followed.
fn sweep_reports(dir: &std::path::Path) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(REPORT_PREFIX) || !name.ends_with(REPORT_SUFFIX) {
            continue;
        }
        let path = e.path();
        // O_NOFOLLOW and O_NONBLOCK: never through a link, never stuck on a FIFO.
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= REPORT_SWEEP_AGE);
        if !meta.is_file() || meta.uid() != me || !old || file.try_lock().is_err() {
            continue;
        }
        // Still the file checked (the name was not replaced meanwhile: only its owner can
        // in a sticky directory, and its owner is this user).
        let same = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
        if same {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The tail of `s`: its last `n` bytes, cut at a character boundary.
fn tail(s: &str, n: usize) -> String {
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
const TAIL_BYTES: usize = 4096;

/// How [`Server::cli`] runs a command.
struct How {
    /// SIGTERM past it, SIGKILL [`KILL_AFTER`] later.
    limit: Duration,
    /// How much of each stream is kept (its tail).
    keep: usize,
    /// A turn: ended with the server, and its tree with it.
    turn: bool,
    /// The call's cancellation: once it fires, the command is ended as past its limit.
    cancel: Option<CancellationToken>,
}

/// How long a turn has to end after the server's SIGTERM before the server kills what
/// runs below it: the turn's own SIGKILL comes [`KILL_AFTER`] after the SIGTERM it passes
/// on, and its end of what was left running takes at most 7 s more.
const TURN_END_GRACE: Duration = Duration::from_secs(15);

/// How long a command past its limit has, after SIGTERM, before SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(5);

/// How much of a turn's stream is kept: past it, the oldest half goes (its result carries
/// only the tail). A command's JSON outcome is kept whole.
const KEEP_BYTES: usize = 16 << 20;

/// How long the pipes may stay quiet, once the command has exited, before reading stops.
const QUIET_AFTER_EXIT: Duration = Duration::from_millis(200);

/// How long reading may go on at all once the command has exited.
const READ_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Reads `out` and `err` until both close, or once `exited` is set, until nothing has come
/// for [`QUIET_AFTER_EXIT`] or [`READ_AFTER_EXIT`] has passed: what the command left
/// running may hold them open, and write to them, forever.
fn drain(
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

impl Server {
    /// Runs `worktreefs --state-dir S ARGS`, bounded by `how.limit`: past it the command
    /// gets SIGTERM, and SIGKILL [`KILL_AFTER`] later (a turn: SIGKILL to every process
    /// below it too). Its output is read until the command has exited and its pipes are
    /// quiet, never longer: something it left running that still holds them does not
    /// keep the tool call waiting.
    async fn cli(&self, args: Vec<String>, how: How) -> Result<Ran, ErrorData> {
        let How {
            limit,
            keep,
            turn,
            cancel,
        } = how;
        let exe = self.exe.clone();
        let state = self.state_dir.clone();
        // The waiting thread below polls this; a task of the runtime's sets it when the
        // client cancels the call.
        let cancelled = Arc::new(AtomicBool::new(false));
        let watcher = cancel.map(|ct| {
            let cancelled = cancelled.clone();
            tokio::spawn(async move {
                ct.cancelled().await;
                cancelled.store(true, Ordering::SeqCst);
            })
        });
        let ran = tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(&exe);
            cmd.arg("--state-dir")
                .arg(&state)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // A server that dies (killed by its client) ends the turn it runs as `turns
            // end` would: SIGTERM when this thread, which waits for the child until it
            // exits, is gone. Other commands (a creation) are left to finish.
            let parent = std::process::id() as libc::pid_t;
            if turn {
                // SAFETY: the closure only calls prctl(2) and getppid(2),
                // async-signal-safe.
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                        if libc::getppid() != parent {
                            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                        }
                        Ok(())
                    });
                }
            }
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("running {}: {e}", exe.display()))?;
            let running = turn.then(|| Running::add(child.id()));
            let (out, err) = (child.stdout.take(), child.stderr.take());
            let exited = Arc::new(AtomicBool::new(false));
            let reader = {
                let exited = exited.clone();
                std::thread::Builder::new()
                    .name("mcp-output".into())
                    .spawn(move || drain(out, err, &exited, keep))
            };
            let reader = match reader {
                Ok(r) => r,
                Err(e) => {
                    // Nothing would read its output: it is ended, and waited for.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("reading the output of {}: {e}", exe.display()));
                }
            };
            let started = Instant::now();
            let mut sent = None;
            let mut cancelled_at = None;
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Ok(s),
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
                let now = started.elapsed();
                // A cancelled call's command is past its limit from that moment on.
                if cancelled_at.is_none() && cancelled.load(Ordering::SeqCst) {
                    cancelled_at = Some(now);
                }
                let limit = cancelled_at.map_or(limit, |at| at.min(limit));
                // By its pid: the process this started, not yet waited for, so the pid
                // is still its.
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                if now >= limit.saturating_add(KILL_AFTER) && sent != Some(Signal::SIGKILL) {
                    if turn {
                        // What runs below the turn, before the turn (whose end would
                        // hand it to init).
                        for p in worktreefs::process::tree::below(pid.as_raw()) {
                            p.signal(libc::SIGKILL);
                        }
                    }
                    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                    sent = Some(Signal::SIGKILL);
                } else if now >= limit && sent.is_none() {
                    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
                    sent = Some(Signal::SIGTERM);
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            drop(running);
            exited.store(true, Ordering::SeqCst);
            let (stdout, stderr) = reader.join().unwrap_or_default();
            let status = status.map_err(|e| format!("waiting for {}: {e}", exe.display()))?;
            Ok::<_, String>(Ran {
                code: status.code(),
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
                timed_out: sent.is_some(),
                cancelled: cancelled_at.is_some() && sent.is_some(),
            })
        })
        .await;
        if let Some(w) = watcher {
            w.abort();
        }
        ran.map_err(|e| ErrorData::internal_error(format!("the command's thread: {e}"), None))?
            .map_err(|e| ErrorData::internal_error(e, None))
    }

    /// A command whose stdout is its JSON outcome: the structured result, or the error.
    async fn json(&self, args: Vec<String>) -> Result<CallToolResult, ErrorData> {
        self.json_cancellable(args, None).await
    }

    /// [`Server::json`], ended (SIGTERM) when `cancel` fires: a command that waits
    /// (`lease acquire --wait`) then gives up rather than acquiring for a client that no
    /// longer asks.
    async fn json_cancellable(
        &self,
        mut args: Vec<String>,
        cancel: Option<CancellationToken>,
    ) -> Result<CallToolResult, ErrorData> {
        args.push("--json".into());
        let ran = self
            .cli(
                args,
                How {
                    limit: Duration::from_secs(600),
                    keep: usize::MAX,
                    turn: false,
                    cancel,
                },
            )
            .await?;
        let value: Option<serde_json::Value> = serde_json::from_str(ran.stdout.trim()).ok();
        if ran.code == Some(0) {
            let Some(v) = value else {
                return Ok(error_result(
                    format!("worktreefs printed no JSON: {}", ran.stderr.trim()),
                    serde_json::json!({"error": "failed", "exit_status": ran.code}),
                ));
            };
            // A structured result is an object: a listing comes as `items`.
            let v = if v.is_array() {
                serde_json::json!({ "items": v })
            } else {
                v
            };
            let mut r = CallToolResult::structured(v);
            r.is_error = Some(false);
            return Ok(r);
        }
        Ok(refused(&ran, value))
    }
}

/// A tool's error result: `message` for people (and the model), then `refusal`, the
/// typed JSON (`error` says which), as a second text block. No structured content: that
/// is checked against the tool's output schema, which is a success's.
fn error_result(message: String, refusal: serde_json::Value) -> CallToolResult {
    CallToolResult::error(vec![
        ContentBlock::text(message),
        ContentBlock::text(refusal.to_string()),
    ])
}

/// A refusal or failure as the tool's error result: the message the CLI prints (its
/// stderr, less the `worktreefs: ` it starts with), with the JSON it gave.
fn refused(ran: &Ran, value: Option<serde_json::Value>) -> CallToolResult {
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

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateArgs {
    /// The new worktree: REPO/NAME.
    pub worktree: String,
    /// Base revision (default: HEAD of the repository, or the branch's tip with `branch`).
    pub base: Option<String>,
    /// Branch to check out (default: a new branch named after the worktree).
    pub branch: Option<String>,
    /// Show the repository's warm snapshot (node_modules/, target/, .env …).
    #[serde(default)]
    pub warm: bool,
    /// Fork this worktree (PARENT or REPO/PARENT): its HEAD, index and uncommitted changes.
    pub from: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WorktreeArg {
    /// The worktree: REPO/NAME.
    pub worktree: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AcquireArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// The orchestrator's session id.
    pub session: String,
    /// Only while nobody else holds the worktree; while held, other sessions are refused.
    #[serde(default)]
    pub exclusive: bool,
    /// Wait up to this many seconds for other holders to go.
    pub wait_secs: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReleaseArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// The session whose lease goes.
    pub session: String,
    /// Why the session let go (e.g. force-killed), shown if the worktree is retained.
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct TurnArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// The session the turn is for.
    pub session: String,
    /// The command and its arguments.
    pub command: Vec<String>,
    /// Refuse writes from outside the turn's process tree while it runs.
    #[serde(default)]
    pub guard: bool,
    /// End the turn after this many seconds (default 600, at least 1): SIGTERM to its
    /// command, SIGKILL 5 s later if it is still there, and what it left running with it.
    /// Cancelling the call ends it the same way at once.
    #[schemars(range(min = 1))]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReclaimArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// Throw away what it holds (the one way to lose work on purpose).
    #[serde(default)]
    pub discard: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RestoreArgs {
    /// The removed worktree: REPO/NAME.
    pub worktree: String,
    /// Restore under this name (when the name is in use again).
    pub as_name: Option<String>,
    /// Which removal of that name (its id in list_removed; default the newest).
    pub id: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct NoArgs {}

#[tool_router(router = tool_router)]
impl Server {
    pub fn new(exe: PathBuf, state_dir: PathBuf) -> Self {
        Server {
            exe,
            state_dir,
            tool_router: Self::tool_router(),
        }
    }

    /// Create a worktree (plain, warm, or a fork of another): the worktree object.
    #[tool(
        name = "create_worktree",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn create_worktree(
        &self,
        Parameters(a): Parameters<CreateArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec!["new".to_string(), a.worktree];
        for (flag, v) in [
            ("--base", a.base),
            ("--branch", a.branch),
            ("--from", a.from),
        ] {
            if let Some(v) = v {
                args.push(flag.into());
                args.push(v);
            }
        }
        if a.warm {
            args.push("--warm".into());
        }
        self.json(args).await
    }

    /// List every worktree (`items`: worktree objects).
    #[tool(
        name = "list_worktrees",
        output_schema = items_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_worktrees(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["list".into()]).await
    }

    /// One worktree: its object (path, state, branch, base, times).
    #[tool(
        name = "show_worktree",
        output_schema = worktree_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn show_worktree(
        &self,
        Parameters(a): Parameters<WorktreeArg>,
    ) -> Result<CallToolResult, ErrorData> {
        let r = self.json(vec!["list".into()]).await?;
        if r.is_error == Some(true) {
            return Ok(r);
        }
        let found = r
            .structured_content
            .as_ref()
            .and_then(|v| v["items"].as_array())
            .and_then(|items| items.iter().find(|w| w["worktree"] == a.worktree.as_str()))
            .cloned();
        Ok(match found {
            Some(w) => {
                let mut r = CallToolResult::structured(w);
                r.is_error = Some(false);
                r
            }
            None => error_result(
                format!("worktree {} does not exist; see list_worktrees", a.worktree),
                serde_json::json!({"error": "not-found", "worktree": a.worktree}),
            ),
        })
    }

    /// Take a session's named lease (exclusive too): the worktree object and the lease.
    #[tool(
        name = "acquire_lease",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn acquire_lease(
        &self,
        Parameters(a): Parameters<AcquireArgs>,
        cancel: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec![
            "lease".to_string(),
            "acquire".into(),
            a.worktree,
            "--session".into(),
            a.session,
        ];
        if a.exclusive {
            args.push("--exclusive".into());
        }
        let Some(w) = a.wait_secs else {
            return self.json(args).await;
        };
        args.push("--wait".into());
        args.push(w.to_string());
        // Cancelled while it waits: the command is ended (it holds nothing yet).
        self.json_cancellable(args, Some(cancel)).await
    }

    /// Release a session's named lease: the worktree object as it is now.
    #[tool(
        name = "release_lease",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn release_lease(
        &self,
        Parameters(a): Parameters<ReleaseArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec![
            "lease".to_string(),
            "release".into(),
            a.worktree,
            "--session".into(),
            a.session,
        ];
        if let Some(r) = a.reason {
            args.push("--reason".into());
            args.push(r);
        }
        self.json(args).await
    }

    /// Run a command as the session's turn (at most one turn per worktree): its exit
    /// status and the tail of its output.
    #[tool(
        name = "run_turn",
        output_schema = turn_schema(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true)
    )]
    async fn run_turn(
        &self,
        Parameters(a): Parameters<TurnArgs>,
        cancel: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        if a.command.is_empty() {
            return Ok(error_result(
                "command is empty: give the program and its arguments".into(),
                serde_json::json!({"error": "bad-arguments", "argument": "command"}),
            ));
        }
        let timeout = a.timeout_secs.unwrap_or(600);
        if timeout == 0 {
            return Ok(error_result(
                "timeout_secs is 0: give at least 1 second (or leave it out for 600)".into(),
                serde_json::json!({"error": "bad-arguments", "argument": "timeout_secs"}),
            ));
        }
        // The turn's outcome comes apart from the command's output, in a file of this
        // server's own (made here, 0600, never one that was there).
        let report = ReportFile::new().map_err(|e| {
            ErrorData::internal_error(format!("making the turn's report file: {e}"), None)
        })?;
        let Some(report_path) = report.path.to_str().map(str::to_string) else {
            return Err(ErrorData::internal_error(
                format!(
                    "the temporary directory {} is not a UTF-8 path; set TMPDIR to one that is",
                    std::env::temp_dir().display()
                ),
                None,
            ));
        };
        let mut args = vec![
            "turn".to_string(),
            a.worktree.clone(),
            format!("--session={}", a.session),
            format!("--timeout={timeout}"),
            format!("--report={report_path}"),
        ];
        if a.guard {
            args.push("--guard".into());
        }
        args.push("--".into());
        args.extend(a.command);
        // The turn ends its command at the timeout itself (and what that left running);
        // this limit only stops a turn process that does not end after it, counted from
        // its start (it may wait for a guard to settle first).
        let limit = Duration::from_secs(timeout)
            .saturating_add(TURN_END_GRACE)
            .saturating_add(Duration::from_secs(120));
        let mut ran = self
            .cli(
                args,
                How {
                    limit,
                    keep: KEEP_BYTES,
                    turn: true,
                    cancel: Some(cancel),
                },
            )
            .await?;
        let outcome = tokio::task::spawn_blocking(move || report.read())
            .await
            .ok()
            .flatten();
        let mut signal = None;
        match outcome.as_ref().and_then(|o| o["error"].as_str()) {
            // Past its timeout: the turn's own line for people is not the command's.
            Some("timed-out") => {
                let o = outcome.as_ref().expect("matched");
                signal = o["signal"].as_str().map(str::to_string);
                ran.timed_out = true;
                if let Some(m) = o["message"].as_str() {
                    let said = format!("worktreefs: {m}\n");
                    if let Some(before) = ran.stderr.strip_suffix(&said) {
                        ran.stderr = before.to_string();
                    }
                }
            }
            // The turn refused (or could not start) its command.
            Some(_) => return Ok(refused(&ran, outcome)),
            // It ended as it says (after this server's SIGTERM, when its limit passed).
            None if outcome.is_some() => {
                if ran.timed_out {
                    signal = Some("SIGTERM".to_string());
                }
            }
            // No outcome: the turn failed before it could say (bad arguments, a fault),
            // was killed, or did not end past its timeout and this server's margin, so
            // this server ended it: an error, with the tails of what it said.
            None => {
                let how = match (ran.timed_out, ran.code) {
                    (true, _) => format!(
                        "the turn did not end within its timeout of {timeout} s and {} s more, so this server ended it (SIGTERM, then SIGKILL to it and what ran below it)",
                        (limit - Duration::from_secs(timeout)).as_secs()
                    ),
                    (false, Some(c)) => format!("the turn ended with exit status {c} without saying how its command ended"),
                    (false, None) => "the turn was ended by a signal before it said how its command ended".to_string(),
                };
                let said = tail(ran.stderr.trim(), 1024);
                let text = if said.is_empty() {
                    how
                } else {
                    format!("{how}; it said: {said}")
                };
                return Ok(error_result(
                    text,
                    serde_json::json!({
                        "error": "failed",
                        "exit_status": ran.code,
                        "server_ended_it": ran.timed_out,
                        "stdout_tail": tail(&ran.stdout, TAIL_BYTES),
                        "stderr_tail": tail(&ran.stderr, TAIL_BYTES),
                    }),
                ));
            }
        }
        let v = serde_json::json!({
            "worktree": a.worktree,
            "exit_status": ran.code,
            "timed_out": ran.timed_out,
            "cancelled": ran.cancelled,
            "signal": signal,
            "stdout_tail": tail(&ran.stdout, TAIL_BYTES),
            "stderr_tail": tail(&ran.stderr, TAIL_BYTES),
        });
        let mut r = CallToolResult::structured(v);
        r.is_error = Some(false);
        Ok(r)
    }

    /// Worktrees kept by cleanup because removing them would lose work (`items`).
    #[tool(
        name = "list_retained",
        output_schema = items_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_retained(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["retained".into()]).await
    }

    /// Removed worktrees still restorable (`items`).
    #[tool(
        name = "list_removed",
        output_schema = items_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_removed(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["removed".into()]).await
    }

    /// Remove a retained or unused worktree when nothing would be lost (or, with discard,
    /// throwing its work away): the outcome.
    #[tool(
        name = "reclaim",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn reclaim(
        &self,
        Parameters(a): Parameters<ReclaimArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec!["reclaim".to_string(), a.worktree];
        if a.discard {
            args.push("--discard".into());
        }
        self.json(args).await
    }

    /// Bring a removed worktree back as it was: the worktree object.
    #[tool(
        name = "restore",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn restore(
        &self,
        Parameters(a): Parameters<RestoreArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec!["restore".to_string(), a.worktree];
        if let Some(n) = a.as_name {
            args.push("--as".into());
            args.push(n);
        }
        if let Some(i) = a.id {
            args.push("--id".into());
            args.push(i.to_string());
        }
        self.json(args).await
    }
}

fn schema(v: serde_json::Value) -> Arc<serde_json::Map<String, serde_json::Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// The worktree object (docs/cli.md), with whatever a command adds to it.
fn worktree_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    let s = |d: &str| serde_json::json!({"type": "string", "description": d});
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "worktree": s("REPO/NAME"),
            "repo": s("repository name"),
            "name": s("worktree name"),
            "path": {"type": ["string", "null"], "description": "its path under the mount"},
            "state": {"type": ["string", "null"], "description": "ready, active, lingering, deleting, removed, retained"},
            "branch": {"type": ["string", "null"]},
            "base_commit": {"type": "string"},
            "created_at": s("RFC 3339"),
            "state_changed_at": s("RFC 3339"),
        },
        "required": ["worktree", "repo", "name"],
        "additionalProperties": true,
    }))
}

/// A listing: its rows as `items`.
fn items_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "object", "additionalProperties": true}},
        },
        "required": ["items"],
    }))
}

fn turn_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "worktree": {"type": "string"},
            "exit_status": {"type": ["integer", "null"], "description": "the turn's exit status: its command's (128+N when signal N ended it), 124 when it ran past timeout_secs"},
            "timed_out": {"type": "boolean", "description": "it ran past timeout_secs, or its call was cancelled, and was ended"},
            "cancelled": {"type": "boolean", "description": "the client cancelled the call, and the turn was ended as at its timeout"},
            "signal": {"type": ["string", "null"], "description": "with timed_out: what ended it, SIGTERM or SIGKILL (sent 5 s after a SIGTERM it ignored)"},
            "stdout_tail": {"type": "string"},
            "stderr_tail": {"type": "string"},
        },
        "required": ["worktree", "exit_status", "timed_out", "stdout_tail", "stderr_tail"],
    }))
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "worktreefs: copy-on-write git worktrees for agents. Create one (create_worktree), hold it with a named lease (acquire_lease/release_lease), run commands one turn at a time (run_turn); cleanup keeps whatever holds work (list_retained) and every removal is restorable (list_removed, restore).",
        )
    }
}

/// Serves MCP on stdin/stdout until the client closes it.
pub fn serve(state_dir: PathBuf) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = rt.block_on(async move {
        let service = Server::new(exe, state_dir)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("starting the MCP session: {e}"))?;
        service
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("the MCP session: {e}"))?;
        Ok(())
    });
    // The client is gone: the turns it asked for that still run are ended as `turns end`
    // would (SIGTERM; the turn kills its command 5 s later if it ignores it, and what it
    // left running), then, past the grace, SIGKILL to each and what runs below it.
    Running::end_all(TURN_END_GRACE);
    rt.shutdown_timeout(Duration::from_secs(2));
    served
}

/// The commands this server runs now (their pidfds), to end when its client goes.
struct Running {
    pid: u32,
}

static RUNNING: std::sync::Mutex<Vec<(u32, OwnedFd)>> = std::sync::Mutex::new(Vec::new());

impl Running {
    /// `pid`: a child just spawned, not yet waited for (its pidfd is surely its own).
    fn add(pid: u32) -> Running {
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
    fn end_all(grace: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A report file whose server was killed (its name left, no descriptor locking it)
    /// is removed when a later server makes one, once old enough that no server can be
    /// between making it and locking it; a live server's stays, and nothing is followed
    /// through a link.
    #[test]
    fn a_killed_servers_report_file_goes_when_the_next_one_makes_one() {
        let dir = tempfile::tempdir().unwrap();
        let age = |path: &std::path::Path| {
            let t = std::time::SystemTime::now() - 2 * REPORT_SWEEP_AGE;
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        let killed = dir
            .path()
            .join("worktreefs-mcp-0123456789abcdef01234567.json");
        std::fs::write(&killed, b"{}").unwrap();
        age(&killed);
        let live = ReportFile::new_in(dir.path()).unwrap();
        age(&live.path);
        let young = dir.path().join("worktreefs-mcp-young.json");
        std::fs::write(&young, b"").unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        age(&target);
        let link = dir.path().join("worktreefs-mcp-link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let next = ReportFile::new_in(dir.path()).unwrap();
        assert!(!killed.exists(), "a killed server's report file goes");
        assert!(next.path.exists());
        assert!(live.path.exists(), "a live server's stays, however old");
        assert!(young.exists(), "one made a moment ago stays");
        assert!(
            target.exists() && link.symlink_metadata().is_ok(),
            "a link is left"
        );
        drop(next);
        drop(live);
    }

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
