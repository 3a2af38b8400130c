//! The FUSE adapter: each request is one call into `View` and one `match` that turns the
//! result into an answer or an errno. Every operation runs in a tracing span with the
//! request's unique id, inode and pid; failures are logged (expected ones at debug).
//!
//! - `worktree_fs.rs`: the filesystem's state, INIT, entering a worktree, forget.
//! - `ops.rs`: one request served; `open.rs` and `listing.rs`: opens and listings.
//! - `abi_out.rs`: our values as the kernel's structures; `errors.rs`: errno answers.

mod abi_out;
mod errors;
mod listing;
mod open;
mod ops;
mod worktree_fs;

pub use worktree_fs::{has_cap_sys_admin, WorktreeFs};
