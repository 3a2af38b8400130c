//! What changed in a worktree, as the view notes it and git's fsmonitor hook asks it:
//! changes noted in the journal, a query answered from the journal or, when it cannot
//! answer exactly, from the upper layer itself.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use git2::Oid;

use super::error::{FsError, FsResult};
use super::inodes::join_rel;
use super::journal::Since;
use super::types::GITFILE_NAME;
use super::view::View;
use super::worktree::WtCtx;
use crate::beneath;
use crate::git::{self, MODE_TREE};
use crate::ids::WorktreeId;
use crate::ino::Ino;
use crate::layout::UpperDir;

impl View {
    /// Records that the entry `ino` changed.
    pub(super) fn note_node(&self, ino: Ino) {
        let t = self.nodes.read();
        if let Ok((wt, _, _)) = t.wt_of(ino) {
            let paths = t.rel_paths(ino);
            drop(t);
            for rel in paths {
                wt.record_change(&rel);
            }
        }
    }

    /// Records that the name `name` in directory `parent` changed (created or removed).
    pub(super) fn note_child(&self, parent: Ino, name: &OsStr) {
        let t = self.nodes.read();
        if let (Ok((wt, _, _)), Ok(rel)) = (t.wt_of(parent), t.child_rel_path(parent, name)) {
            drop(t);
            wt.record_change(&rel);
        }
    }

    /// Records every path below the upper directory `dir` (at `rel` in the worktree) under
    /// both `rel` and `old_rel`: a directory moved from `old_rel`. A walk with a stack of
    /// its own (a tree as deep as a user makes one costs no thread's stack).
    pub(super) fn note_moved_tree(&self, wt: &WtCtx, dir: BorrowedFd, rel: &[u8], old_rel: &[u8]) {
        // Each directory to look in: its path below `dir`, and its two paths in the worktree
        // (paths, not descriptors: a wide tree holds none open).
        let mut stack = vec![(Vec::new(), rel.to_vec(), old_rel.to_vec())];
        while let Some((below, rel, old_rel)) = stack.pop() {
            let Ok(d) = beneath::dir(dir, &below) else {
                continue;
            };
            let Ok(upper) = UpperDir::read(d.as_fd(), &wt.upper.whiteouts) else {
                continue;
            };
            for e in &upper.entries {
                let name = e.name.as_bytes();
                let (new, old) = (join_rel(&rel, name), join_rel(&old_rel, name));
                wt.record_change(&new);
                wt.record_change(&old);
                if e.is_dir(d.as_fd()) {
                    stack.push((join_rel(&below, name), new, old));
                }
            }
        }
    }

    /// Answers git's fsmonitor hook for `<repo>:<worktree>@<token>`: the new token, then
    /// every path that changed since `token`.
    pub(super) fn fsmonitor_query(&self, query: &str) -> FsResult<Vec<u8>> {
        let bad = || {
            FsError::invalid(format!(
                "fsmonitor query {query:?} is not <repo>:<worktree>@<token>"
            ))
        };
        let (who, token) = query.split_once('@').ok_or_else(bad)?;
        let (repo, name) = who.split_once(':').ok_or_else(bad)?;
        self.refresh()?;
        let wt = self
            .catalog
            .worktree_named(repo, name)
            .ok_or_else(|| FsError::not_found(format!("worktree {repo}/{name}")))?;
        use crate::git::fsmonitor::{encode_response, parse_token, token as make_token};
        let (seq, since) = wt
            .journal
            .begin_query(parse_token(token, &self.instance, wt.ident.id));
        let paths = self.answer_paths(&wt, since)?;
        tracing::debug!(
            repo,
            worktree = name,
            token,
            changed = paths.len(),
            "fsmonitor query"
        );
        Ok(encode_response(
            &make_token(&self.instance, wt.ident.id, seq),
            &paths,
        ))
    }

    /// What an fsmonitor answer reports, the journal having said `since`.
    fn answer_paths(&self, wt: &WtCtx, since: Since) -> FsResult<Vec<Vec<u8>>> {
        let mut paths = match since {
            Since::Paths(p) => p,
            Since::Everything => vec![b"/".to_vec()],
            Since::Unknown => {
                // Everything that differs from the base is in the upper layer.
                let mut out = Vec::new();
                self.upper_paths(wt, wt.upper.fd.as_fd(), b"", Some(wt.base.tree), &mut out)?;
                // A submodule view's changes are in its own layers: its path says so.
                out.extend(
                    crate::layout::submodules::readable_records(
                        &self.state.worktree_dir(wt.ident.id),
                    )
                    .into_iter()
                    .map(|(_, r)| r.path.into_bytes()),
                );
                // Files whose blob does not survive a checkout and a clean: git lists them
                // as modified once it looks at them, as in a checkout whose files were
                // touched (their index entries carry no size, so it reads them).
                out.extend(wt.base.dirty_conversions().map(<[u8]>::to_vec));
                out.sort();
                out.dedup();
                out
            }
        };
        // `.gitmodules` is never reported unchanged: git rewrites it in-process (`git rm`
        // and `git mv` of a submodule, `git submodule add`) and then stages it, trusting
        // the fsmonitor bit this answer gave it for the file as it was (its
        // `add_to_index` does not ignore that bit), so the rewrite went unstaged.
        if self.root_has(wt, OsStr::new(".gitmodules")) {
            paths.push(b".gitmodules".to_vec());
        }
        // Files open for writing may change at any moment without a request reaching us
        // (in a submodule's view too: its path then).
        // (The lock is held only to look up or insert a view, never while one is made.)
        for (path, sub) in wt.nested.views.lock().iter() {
            if writing_in(sub) {
                paths.push(path.clone());
            }
        }
        let writers = wt.journal.open_writers();
        if !writers.is_empty() {
            let t = self.nodes.read();
            for ino in writers {
                paths.extend(t.rel_paths(ino));
            }
        }
        Ok(paths)
    }

    /// Whether worktree `wt`'s root shows `name`: in its upper layer, or in its base tree
    /// and not deleted (a worktree's root is never opaque).
    fn root_has(&self, wt: &WtCtx, name: &OsStr) -> bool {
        match beneath::stat_at(wt.upper.fd.as_fd(), name) {
            Ok(st) => !wt.upper.whiteouts.is(&st),
            Err(_) => self
                .objects
                .tree(&wt.base.gitdir, wt.base.tree)
                .is_ok_and(|l| l.get(name).is_some()),
        }
    }

    /// Every path the upper directory `dir` (at `rel`) holds or hides: its entries, the
    /// names its whiteouts delete, and, below an opaque directory, the base's entries.
    pub(super) fn upper_paths(
        &self,
        wt: &WtCtx,
        dir: BorrowedFd,
        rel: &[u8],
        base: Option<Oid>,
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        let join = |name: &[u8]| join_rel(rel, name);
        let upper = UpperDir::read(dir, &wt.upper.whiteouts).map_err(|e| {
            FsError::io(
                format!("listing {}/{}", wt.ident.name, String::from_utf8_lossy(rel)),
                e,
            )
        })?;
        let listing = match base {
            Some(tree) => Some(
                self.objects
                    .tree(&wt.base.gitdir, tree)
                    .map_err(|e| FsError::git("reading tree", e))?,
            ),
            None => None,
        };
        if upper.opaque {
            if let Some(l) = &listing {
                for e in &l.entries {
                    self.base_paths(wt, e, &join(e.name.as_bytes()), out)?;
                }
            }
        }
        for hidden in &upper.whiteouts {
            // A deleted base directory hides everything below it.
            match listing.as_ref().and_then(|l| l.get(hidden)) {
                Some(entry) => self.base_paths(wt, entry, &join(hidden.as_bytes()), out)?,
                None => out.push(join(hidden.as_bytes())),
            }
        }
        for e in &upper.entries {
            let name = &e.name;
            if rel.is_empty() && name == GITFILE_NAME {
                continue;
            }
            let path = join(name.as_bytes());
            out.push(path.clone());
            if e.is_dir(dir) {
                let below = if upper.opaque {
                    None
                } else {
                    listing
                        .as_ref()
                        .and_then(|l| l.get(name))
                        .filter(|entry| entry.mode == MODE_TREE)
                        .map(|entry| entry.oid)
                };
                let sub = beneath::dir(dir, name.as_bytes())
                    .map_err(|e| FsError::io("opening an upper directory", e))?;
                self.upper_paths(wt, sub.as_fd(), &path, below, out)?;
            } else if let Some(entry) = listing.as_ref().and_then(|l| l.get(name)) {
                // A file where the base has a directory: the directory's files are gone.
                if entry.mode == MODE_TREE && !upper.opaque {
                    self.base_paths(wt, entry, &path, out)?;
                }
            }
        }
        Ok(())
    }

    /// `path` and, for a base directory, every path below it.
    pub(super) fn base_paths(
        &self,
        wt: &WtCtx,
        entry: &git::TreeEntry,
        path: &[u8],
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        out.push(path.to_vec());
        if entry.mode == MODE_TREE {
            let l = self
                .objects
                .tree(&wt.base.gitdir, entry.oid)
                .map_err(|e| FsError::git("reading tree", e))?;
            for e in &l.entries {
                self.base_paths(wt, e, &join_rel(path, e.name.as_bytes()), out)?;
            }
        }
        Ok(())
    }
}

/// Whether a file is open for writing in the submodule view `sub` or one below it.
fn writing_in(sub: &WtCtx) -> bool {
    !sub.journal.open_writers().is_empty()
        || sub
            .nested
            .views
            .lock()
            .values()
            .any(|below| writing_in(below))
}

/// Cleanup's inspection trusts what git trusts: the answer git would get now.
impl crate::lifecycle::cleanup::FsmonitorAnswers for View {
    fn changed_since(&self, worktree: WorktreeId, token: &str) -> Option<Vec<Vec<u8>>> {
        let wt = self.catalog.worktree_by_id(worktree)?;
        let seq = crate::git::fsmonitor::parse_token(token, &self.instance, worktree)?;
        match wt.journal.peek(seq) {
            since @ Since::Paths(_) => self.answer_paths(&wt, since).ok(),
            Since::Unknown | Since::Everything => None,
        }
    }
}
