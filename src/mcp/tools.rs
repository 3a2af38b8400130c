//! The tools: each runs the command of its name with `--json`; its JSON is the result,
//! a refusal a tool error with the CLI's message.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::report_file::ReportFile;
use super::run::{error_result, refused, tail, How, KEEP_BYTES, TAIL_BYTES, TURN_END_GRACE};
use super::server::Server;

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
    /// When the worktree exists already (and is not being deleted), use it rather than
    /// refuse: nothing is made, and the object says `"reused": true`.
    #[serde(default)]
    pub reuse: bool,
    /// Wait for the repository's setup command to end in the new worktree (the result is
    /// an error, with the worktree object, when it failed).
    #[serde(default)]
    pub wait_setup: bool,
    /// Run no setup command in it.
    #[serde(default)]
    pub no_setup: bool,
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
    /// Go ahead while the worktree's setup command still runs (by default the turn waits
    /// for it).
    #[serde(default)]
    pub no_wait_setup: bool,
    /// Go ahead even though the worktree's setup command failed (by default refused:
    /// `setup-failed`).
    #[serde(default)]
    pub ignore_setup: bool,
    /// Take no checkpoint as the turn starts (by default one is, labelled `turn
    /// SESSION`: rewind to it undoes the turn).
    #[serde(default)]
    pub no_checkpoint: bool,
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
pub struct CheckpointArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// Words to know it by in list_checkpoints.
    pub label: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RewindArgs {
    /// The worktree: REPO/NAME.
    pub worktree: String,
    /// The checkpoint to go back to (its `checkpoint` number in list_checkpoints).
    pub to: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct NoArgs {}

#[tool_router(router = tool_router)]
impl Server {
    pub(super) fn new(exe: PathBuf, state_dir: PathBuf) -> Self {
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
        for (flag, given) in [
            ("--reuse", a.reuse),
            ("--wait-setup", a.wait_setup),
            ("--no-setup", a.no_setup),
        ] {
            if given {
                args.push(flag.into());
            }
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
        for (flag, given) in [
            ("--guard", a.guard),
            ("--no-wait-setup", a.no_wait_setup),
            ("--ignore-setup", a.ignore_setup),
            ("--no-checkpoint", a.no_checkpoint),
        ] {
            if given {
                args.push(flag.into());
            }
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

    /// What a turn's command is told of a worktree: its path, source checkout, and its
    /// block of ports (`port`, the first; `ports`, how many), unique on the machine.
    #[tool(
        name = "worktree_env",
        output_schema = env_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn worktree_env(
        &self,
        Parameters(a): Parameters<WorktreeArg>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["env".into(), a.worktree]).await
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

    /// Keep the worktree's whole state (files, index, HEAD, branch) to rewind to later:
    /// the worktree object with the checkpoint's `checkpoint`, `label`, `taken_at`.
    #[tool(
        name = "checkpoint",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn checkpoint(
        &self,
        Parameters(a): Parameters<CheckpointArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut args = vec!["checkpoint".to_string(), a.worktree];
        if let Some(l) = a.label {
            args.push("--label".into());
            args.push(l);
        }
        self.json(args).await
    }

    /// Bring the worktree back to a checkpoint exactly (a checkpoint of the state it
    /// leaves is taken first: `undo` rewinds to it): the worktree object with
    /// `rewound_to`, `undo`, `changed`.
    #[tool(
        name = "rewind",
        output_schema = worktree_schema(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn rewind(
        &self,
        Parameters(a): Parameters<RewindArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec![
            "rewind".to_string(),
            a.worktree,
            "--to".into(),
            a.to.to_string(),
        ])
        .await
    }

    /// The worktree's checkpoints, oldest first (`checkpoints`: each one's `checkpoint`,
    /// `label`, `taken_at`, `changed_since`).
    #[tool(
        name = "list_checkpoints",
        output_schema = checkpoints_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_checkpoints(
        &self,
        Parameters(a): Parameters<WorktreeArg>,
    ) -> Result<CallToolResult, ErrorData> {
        self.json(vec!["checkpoints".to_string(), a.worktree]).await
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
            "changed": {"type": ["integer", "null"], "description": "list_worktrees, show_worktree: entries of its upper layer at paths its base has (with untracked, an upper bound of git status)"},
            "untracked": {"type": ["integer", "null"], "description": "entries at paths its base has not (a new directory counts once)"},
            "ahead": {"type": ["integer", "null"], "description": "its commits not in compared_with"},
            "behind": {"type": ["integer", "null"], "description": "commits of compared_with not in it"},
            "compared_with": {"type": ["string", "null"], "description": "its branch's upstream (origin/main), or base"},
            "turn": {"type": ["string", "null"], "description": "the session whose turn runs in it now"},
            "last_activity_at": s("RFC 3339: the last time anything happened in it"),
            "setup": {
                "type": ["object", "null"],
                "description": "its run of the repository's setup command, if it had one: state (pending, running, ok, failed), summary (e.g. failed (exit 3)), command, exit_code, started_at, ended_at",
            },
        },
        "required": ["worktree", "repo", "name"],
        "additionalProperties": true,
    }))
}

/// What `env --json` gives.
fn env_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    let s = |d: &str| serde_json::json!({"type": "string", "description": d});
    let n = |d: &str| serde_json::json!({"type": ["integer", "null"], "description": d});
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "worktree": s("REPO/NAME (WORKTREEFS_WORKTREE)"),
            "path": s("its path under the mount (WORKTREEFS_PATH)"),
            "source": {"type": ["string", "null"], "description": "the registered checkout (WORKTREEFS_SOURCE)"},
            "port": n("the first port of its block (WORKTREEFS_PORT); null without one"),
            "ports": n("how many ports the block has (WORKTREEFS_PORTS)"),
        },
        "required": ["worktree", "path"],
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

/// What `checkpoints --json` gives.
fn checkpoints_schema() -> Arc<serde_json::Map<String, serde_json::Value>> {
    schema(serde_json::json!({
        "type": "object",
        "properties": {
            "worktree": {"type": "string", "description": "REPO/NAME"},
            "checkpoints": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "checkpoint": {"type": "integer", "description": "its number: rewind's `to`"},
                        "label": {"type": ["string", "null"], "description": "a turn's is `turn SESSION`"},
                        "taken_at": {"type": "string", "description": "RFC 3339"},
                        "changed_since": {"type": "integer", "description": "paths changed since it was taken"},
                    },
                    "required": ["checkpoint", "taken_at"],
                    "additionalProperties": true,
                },
            },
        },
        "required": ["worktree", "checkpoints"],
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
            "worktreefs: copy-on-write git worktrees for agents. Create one (create_worktree), hold it with a named lease (acquire_lease/release_lease), run commands one turn at a time (run_turn, each taking a checkpoint first: list_checkpoints, rewind undoes a turn); cleanup keeps whatever holds work (list_retained) and every removal is restorable (list_removed, restore).",
        )
    }
}
