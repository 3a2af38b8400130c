//! `worktreefs mcp`: the CLI's operations for agent frameworks, over the Model Context
//! Protocol on stdio (`rmcp`). Each tool runs this same program's command with `--json`
//! (one code path, one set of checks and messages for people and for agents): its JSON
//! is the tool's structured result; a refusal or failure is a tool result with `isError`
//! carrying the message the CLI prints. JSON-RPC errors are left for protocol faults.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;

/// What one run of the CLI gave.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

#[derive(Clone)]
pub struct Server {
    exe: PathBuf,
    state_dir: PathBuf,
    tool_router: ToolRouter<Self>,
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

impl Server {
    /// Runs `worktreefs --state-dir S ARGS` (bounded by `limit`: killed past it).
    async fn cli(&self, args: Vec<String>, limit: Duration) -> Result<Ran, ErrorData> {
        let exe = self.exe.clone();
        let state = self.state_dir.clone();
        tokio::task::spawn_blocking(move || {
            let child = std::process::Command::new(&exe)
                .arg("--state-dir")
                .arg(&state)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("running {}: {e}", exe.display()))?;
            let pid = child.id();
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                if rx.recv_timeout(limit).is_ok() {
                    return false;
                }
                // Past the limit: ended, by its pid (the process this started, not yet
                // waited for, so the pid is still its).
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                true
            });
            let out = child.wait_with_output();
            let _ = tx.send(());
            let timed_out = waiter.join().unwrap_or(false);
            let out = out.map_err(|e| format!("waiting for {}: {e}", exe.display()))?;
            Ok::<_, String>(Ran {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                timed_out,
            })
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("the command's thread: {e}"), None))?
        .map_err(|e| ErrorData::internal_error(e, None))
    }

    /// A command whose stdout is its JSON outcome: the structured result, or the error.
    async fn json(&self, mut args: Vec<String>) -> Result<CallToolResult, ErrorData> {
        args.push("--json".into());
        let ran = self.cli(args, Duration::from_secs(600)).await?;
        let value: Option<serde_json::Value> = serde_json::from_str(ran.stdout.trim()).ok();
        if ran.code == Some(0) {
            let Some(v) = value else {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "worktreefs printed no JSON: {}",
                    ran.stderr.trim()
                ))]));
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
    let mut r = CallToolResult::error(vec![ContentBlock::text(message)]);
    r.structured_content = value;
    r
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
    /// End the turn (SIGTERM) after this many seconds (default 600).
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
    #[tool(name = "create_worktree", output_schema = worktree_schema())]
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
    #[tool(name = "list_worktrees", output_schema = items_schema())]
    async fn list_worktrees(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["list".into()]).await
    }

    /// One worktree: its object (path, state, branch, base, times).
    #[tool(name = "show_worktree", output_schema = worktree_schema())]
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
            None => CallToolResult::error(vec![ContentBlock::text(format!(
                "worktree {} does not exist; see list_worktrees",
                a.worktree
            ))]),
        })
    }

    /// Take a session's named lease (exclusive too): the worktree object and the lease.
    #[tool(name = "acquire_lease", output_schema = worktree_schema())]
    async fn acquire_lease(
        &self,
        Parameters(a): Parameters<AcquireArgs>,
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
        if let Some(w) = a.wait_secs {
            args.push("--wait".into());
            args.push(w.to_string());
        }
        self.json(args).await
    }

    /// Release a session's named lease: the worktree object as it is now.
    #[tool(name = "release_lease", output_schema = worktree_schema())]
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
    #[tool(name = "run_turn", output_schema = turn_schema())]
    async fn run_turn(
        &self,
        Parameters(a): Parameters<TurnArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if a.command.is_empty() {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "command is empty: give the program and its arguments",
            )]));
        }
        let mut args = vec![
            "turn".to_string(),
            a.worktree.clone(),
            "--session".into(),
            a.session,
            "--json".into(),
        ];
        if a.guard {
            args.push("--guard".into());
        }
        args.push("--".into());
        args.extend(a.command);
        let limit = Duration::from_secs(a.timeout_secs.unwrap_or(600));
        let ran = self.cli(args, limit).await?;
        // A refusal of the turn itself is JSON on stderr, and all that is there.
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(ran.stderr.trim()) {
            if v.get("error").is_some() {
                return Ok(refused(&ran, Some(v)));
            }
        }
        let v = serde_json::json!({
            "worktree": a.worktree,
            "exit_status": ran.code,
            "timed_out": ran.timed_out,
            "stdout_tail": tail(&ran.stdout, TAIL_BYTES),
            "stderr_tail": tail(&ran.stderr, TAIL_BYTES),
        });
        let mut r = CallToolResult::structured(v);
        r.is_error = Some(false);
        Ok(r)
    }

    /// Worktrees kept by cleanup because removing them would lose work (`items`).
    #[tool(name = "list_retained", output_schema = items_schema())]
    async fn list_retained(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["retained".into()]).await
    }

    /// Removed worktrees still restorable (`items`).
    #[tool(name = "list_removed", output_schema = items_schema())]
    async fn list_removed(
        &self,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["removed".into()]).await
    }

    /// Remove a retained or unused worktree when nothing would be lost (or, with discard,
    /// throwing its work away): the outcome.
    #[tool(name = "reclaim", output_schema = worktree_schema())]
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
    #[tool(name = "restore", output_schema = worktree_schema())]
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
            "exit_status": {"type": ["integer", "null"], "description": "the command's exit status (null when a signal ended it)"},
            "timed_out": {"type": "boolean", "description": "ended at timeout_secs"},
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
    rt.block_on(async move {
        let service = Server::new(exe, state_dir)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("starting the MCP session: {e}"))?;
        service
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("the MCP session: {e}"))?;
        Ok(())
    })
}
