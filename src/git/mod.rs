//! The git layer: everything worktreefs asks of a repository. Reading base trees and
//! blobs, resolving revisions, and writing what git needs to see a managed worktree: its
//! admin entry under `<gitdir>/worktrees/` and an index whose stat data matches what the
//! view reports, with the untracked cache and fsmonitor extensions.
//!
//! Inside: `objects` and `admin` read the repository; `index` is the file format alone;
//! `walk` lists a tree for the index and the untracked cache (`untracked`); `fsmonitor`
//! is git's hook protocol and its configuration; `blobcache` keeps blobs as files;
//! `convert` is what a checkout does to a blob (attributes, end of line, `ident`),
//! `checkout` which files of a tree it converts, `filters` runs git as a worktree's owner
//! for the rest; `ref_delete` deletes refs through git, which libgit2 cannot do safely
//! beside a `git gc`.

pub mod admin;
pub mod blobcache;
pub mod checkout;
pub mod checkpoint;
pub mod checkpoint_refs;
pub mod convert;
mod error;
pub mod filters;
pub mod fsmonitor;
pub mod index;
pub mod integrated;
pub mod objects;
pub mod owner;
pub mod ref_delete;
pub mod untracked;
pub mod walk;
pub mod warm;

pub const MODE_TREE: u32 = 0o040000;
pub const MODE_BLOB: u32 = 0o100644;
pub const MODE_EXEC: u32 = 0o100755;
pub const MODE_LINK: u32 = 0o120000;
pub const MODE_GITLINK: u32 = 0o160000;

pub use admin::{
    admin_dir, checked_out_branches, checked_out_in, common_dir, discover, free_admin_name,
    free_admin_name_except, renamed_branch, resolve_base, worktrees_dir, write_admin_entry, Entry,
    ResolvedBase,
};
pub use error::{GitContext, GitError, GitErrorKind, GitResult};
pub use index::{decode_index_sizes, encode_index, IndexEntry, IndexStat, Sha1Prefix};
pub use objects::{read_blob, with_repo, ObjectCache, TreeEntry, TreeListing};
pub use walk::index_entries;
