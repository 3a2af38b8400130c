//! A worktree's git `HEAD` and `index`, read through its checked admin entry (never
//! through a link, bounded in size): what a removal keeps of it, and what a fork starts
//! from; and the commit a `HEAD` file's text names.

use std::os::fd::AsFd;

use git2::{Oid, Repository};

use super::target::Target;
use crate::git::admin::AdminDirs;

/// Why keeping failed: `hard` when the entry is not this worktree's (the removal
/// stops, as parking would); otherwise the removal goes on without keeping.
pub(super) struct NotKept {
    pub(super) why: String,
    pub(super) hard: bool,
}

fn soft(why: String) -> NotKept {
    NotKept { why, hard: false }
}

/// Whether `head` (a `HEAD` file's text) is one git writes: a branch, or a commit id.
fn head_is_plain(head: &str) -> bool {
    let h = head.trim_end_matches('\n');
    match h.strip_prefix("ref: refs/heads/") {
        Some(b) => git2::Branch::name_is_valid(b).unwrap_or(false),
        None => (h.len() == 40 || h.len() == 64) && h.bytes().all(|c| c.is_ascii_hexdigit()),
    }
}

/// git's `HEAD` and `index` of `t`'s entry, read through the entry checked as the
/// removal checks it (another worktree's entry renamed into its name is not read); an
/// entry that is gone gives the branch recorded at creation and no index.
pub(super) fn read_entry(t: &Target) -> Result<(String, Option<Vec<u8>>), NotKept> {
    let name = t.admin.file_name().unwrap_or_default();
    let dirs = AdminDirs::open(&t.gitdir)
        .map_err(|e| soft(format!("opening git directory {}: {e}", t.gitdir.display())))?;
    let fallback = || match &t.branch {
        Some(b) => Ok((format!("ref: refs/heads/{b}\n"), None)),
        None => Err(soft(format!(
            "{} is gone and no branch was recorded: nothing says what HEAD was",
            t.admin.display()
        ))),
    };
    let worktrees = match dirs.worktrees(false) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return fallback(),
        Err(e) => return Err(soft(format!("reaching {}: {e}", t.admin.display()))),
    };
    let entry = match crate::git::Entry::open(worktrees.as_fd(), name) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return fallback(),
        Err(e) => return Err(soft(format!("opening {}: {e}", t.admin.display()))),
    };
    entry
        .check(
            |b| b.starts_with(crate::git::admin::ADMIN_MARKER.as_bytes()),
            &t.repo_and_name(),
            t.uid,
        )
        .map_err(|why| NotKept {
            why: format!("{} {why}; left alone", t.admin.display()),
            hard: true,
        })?;
    let head = crate::beneath::read_regular(entry.fd(), b"HEAD", 4 << 10)
        .map_err(|e| soft(format!("reading {}/HEAD: {e}", t.admin.display())))?
        .0;
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head_is_plain(&head) {
        return Err(soft(format!(
            "{}/HEAD names neither a branch nor a commit",
            t.admin.display()
        )));
    }
    let index = match crate::beneath::read_regular(entry.fd(), b"index", KEPT_INDEX_CAP) {
        Ok((b, _)) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(soft(format!("reading {}/index: {e}", t.admin.display()))),
    };
    Ok((head, index))
}

/// `read_entry` for a fork (`lifecycle::fork`): git's `HEAD` and `index` of a live
/// worktree, read through its checked entry; why not, as text.
pub(crate) fn git_files_of(t: &Target) -> Result<(String, Option<Vec<u8>>), String> {
    read_entry(t).map_err(|n| n.why)
}

/// The commit a `HEAD` file's text names, for a fork.
pub(crate) fn commit_of_head(repo: &Repository, head: &str) -> Option<Oid> {
    head_commit(repo, head)
}

/// The largest index a removal keeps (a checkout of 1,000,000 files has one of ~100 MB).
const KEPT_INDEX_CAP: u64 = 512 << 20;

/// The commit `head` (a `HEAD` file's text) names in `repo`, if any.
pub(super) fn head_commit(repo: &Repository, head: &str) -> Option<Oid> {
    let oid = match head.trim().strip_prefix("ref:") {
        Some(r) => repo.refname_to_id(r.trim()).ok()?,
        None => Oid::from_str(head.trim()).ok()?,
    };
    repo.find_object(oid, None)
        .ok()?
        .peel_to_commit()
        .ok()
        .map(|c| c.id())
}
