//! What git's fsmonitor hook would answer in a worktree, asked of the mounted view, so
//! inspection trusts the index entries git trusts.

use std::collections::BTreeSet;

use super::target::Target;
use crate::git::MODE_GITLINK;
use crate::ids::WorktreeId;

/// What the mounted filesystem's fsmonitor hook would answer, asked without counting as
/// a query (the lifecycle does not name the filesystem: the daemon hands its view to
/// cleanup as this, in an [`Inspection`](super::Inspection)).
pub trait FsmonitorAnswers: Send + Sync {
    /// The paths worktree `worktree`'s hook would report as changed since `token`; None
    /// when it would not answer exactly (a token of another instance, a journal that no
    /// longer reaches back): then git looks at every file again.
    fn changed_since(&self, worktree: WorktreeId, token: &str) -> Option<Vec<Vec<u8>>>;
}

/// The index entries git takes as unchanged without looking at the file: valid in the
/// index's FSMN extension and not reported by the hook since its token (git's
/// `tweak_fsmonitor` and `refresh_fsmonitor`), by path. Empty when there is no such
/// extension, no mounted view to ask (`answers`), or for a submodule's view (git in a
/// submodule uses no fsmonitor of worktreefs's).
pub(super) fn fsmonitor_valid(
    t: &Target,
    raw_index: &[u8],
    index: &git2::Index,
    answers: Option<&std::sync::Weak<dyn FsmonitorAnswers>>,
) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    if t.submodule.is_some() {
        return out;
    }
    let Some(m) = crate::git::fsmonitor::IndexMonitor::read(raw_index) else {
        return out;
    };
    // The same file as git2 read (the index may have been written again since).
    if m.entries != index.len() || !index.iter().zip(&m.paths).all(|(e, p)| e.path == *p) {
        return out;
    }
    // The view is held only while it answers (an inspection blocked for good must not
    // keep it alive).
    let answered = answers
        .and_then(std::sync::Weak::upgrade)
        .and_then(|a| a.changed_since(t.id, &m.token));
    let Some(changed) = answered else {
        return out;
    };
    // A reported path is the entry of that path and everything below it.
    if changed.iter().any(|c| c.is_empty() || c.as_slice() == b"/") {
        return out;
    }
    let changed: std::collections::HashSet<&[u8]> = changed.iter().map(Vec::as_slice).collect();
    let reported = |p: &[u8]| {
        changed.contains(p)
            || p.iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && changed.contains(&p[..i]))
    };
    for (i, e) in index.iter().enumerate() {
        if e.mode == MODE_GITLINK || m.dirty(i) || reported(&e.path) {
            continue;
        }
        out.insert(e.path);
    }
    out
}
