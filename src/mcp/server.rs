//! The server: this program's path and state directory, a command run for a tool and its
//! JSON read back, and `serve` on stdio.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, ServiceExt};
use tokio_util::sync::CancellationToken;

use super::run::{drain, error_result, refused, How, Ran, Running, KILL_AFTER, TURN_END_GRACE};

#[derive(Clone)]
pub struct Server {
    pub(super) exe: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) tool_router: ToolRouter<Self>,
}

impl Server {
    /// Runs `worktreefs --state-dir S ARGS`, bounded by `how.limit`: past it the command
    /// gets SIGTERM, and SIGKILL [`KILL_AFTER`] later (a turn: SIGKILL to every process
    /// below it too). Its output is read until the command has exited and its pipes are
    /// quiet, never longer: something it left running that still holds them does not
    /// keep the tool call waiting.
    pub(super) async fn cli(&self, args: Vec<String>, how: How) -> Result<Ran, ErrorData> {
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
    pub(super) async fn json(&self, args: Vec<String>) -> Result<CallToolResult, ErrorData> {
        self.json_cancellable(args, None).await
    }

    /// [`Server::json`], ended (SIGTERM) when `cancel` fires: a command that waits
    /// (`lease acquire --wait`) then gives up rather than acquiring for a client that no
    /// longer asks.
    pub(super) async fn json_cancellable(
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
