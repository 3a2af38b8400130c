//! Taking a warm snapshot (`worktreefs warm REPO`, the first `new --warm`): the ignored
//! and untracked files of the repository's source checkout that match its include
//! patterns, each read once, as the user who asks, into the shared blob cache, and listed
//! in a manifest (`git::warm`) that warm worktrees show under their base tree.
//!
//! The steps:
//! 1. The patterns: `.worktreeinclude` at the checkout's top (read as a regular file
//!    reached through no symlink) and the repository's `repo add|set --include`. None: an
//!    error that says where to put them.
//! 2. What they match: `git ls-files --others --ignored --exclude=P…` run as the user (so
//!    gitignore syntax is git's own, and tracked files are never taken). A pattern that
//!    matches nothing is reported.
//! 3. Each path looked at as the user (`setfsuid` on a thread of its own) through no
//!    symlink: a symlink is kept as its text (never followed), a FIFO, socket or device is
//!    skipped and never opened, a file the user cannot read is skipped; both reported.
//! 4. The sizes summed and refused, naming them, when the state directory's disk has
//!    less room.
//! 5. Each file copied (a reflink where the disk shares extents) into the blob cache
//!    under its blob id, and kept only if its stat data was the same before and after the
//!    copy (whole as of one instant; a file that keeps changing is retried, then skipped
//!    and reported). A file the user's last snapshot read is not read again when its
//!    device, inode, size, modification and change times and mode are what that snapshot
//!    recorded and its content is still in the cache (`idents.rs`).
//! 6. The manifest, the list of its directories and what it knew of each file written
//!    (synced, renamed), then the row: a snapshot is in the store only once all of it is
//!    on disk.
//!
//! Each content the take puts in the cache is first written down in its journal
//! (`<state>/warm/<manifest>.taking`, one blob id a line), which goes once the row is in:
//! a take that fails or dies leaves its journal, and the next prune deletes what it names
//! that nothing else holds.
//!
//! [`prune`] deletes what no snapshot needs any more: a snapshot superseded by a newer one
//! of the same repository and user that no worktree shows (nor a kept removal), a
//! manifest no row names, and the contents only those held (never one a remaining
//! snapshot holds, nor one git holds: the blob cache's own), and those of the journals
//! takes that failed left. Takes and prunes share a lock (`<state>/warm/.lock`): takes
//! hold it shared, a prune exclusive and never waits (so every journal a prune sees is
//! of a take that ended).
//!
//! - `take.rs`: taking a snapshot (the steps above, in order); `shown.rs`: the one a new
//!   worktree shows.
//! - `as_user.rs`: reading the checkout as the user; `patterns.rs`: the patterns and what
//!   they match; `blob.rs`: a file's content into the cache; `journal.rs`: a take's
//!   journal.
//! - `prune.rs`: deleting what no worktree shows; `cache.rs`: the cache's layout and lock.
//! - `idents.rs`: what a snapshot knew of each source file, for the next take and for
//!   telling how much of the source changed since.

mod as_user;
mod blob;
mod cache;
mod idents;
mod journal;
mod patterns;
mod prune;
mod shown;
mod take;

pub use cache::manifest_path;
pub use patterns::INCLUDE_FILE;
pub use prune::{journals, prune, Pruned};
pub use shown::{ensure, latest, moved_since, untracked_part, Moved};
pub use take::{take, Copied, Progress, Taken};
