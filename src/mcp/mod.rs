//! `worktreefs mcp`: the CLI's operations for agent frameworks, over the Model Context
//! Protocol on stdio (`rmcp`). Each tool runs this same program's command with `--json`
//! (one code path, one set of checks and messages for people and for agents): its JSON
//! is the tool's structured result; a refusal or failure is a tool result with `isError`
//! carrying the message the CLI prints, then the refusal's JSON as a second text block.
//! A refusal has no structured content: clients check structured content against the
//! tool's output schema, which describes what a success gives. JSON-RPC errors are left
//! for protocol faults. A client's `notifications/cancelled` ends a turn as its timeout
//! would.
//!
//! - `server.rs`: the server and `serve`; `tools.rs`: the tools and their schemas.
//! - `run.rs`: one command run for a tool, and the turns ended when the client goes.
//! - `report_file.rs`: the file a turn's outcome comes back in.

mod report_file;
mod run;
mod server;
mod tools;

pub use server::serve;
