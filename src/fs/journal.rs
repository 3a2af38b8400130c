//! What git's fsmonitor hook asks: each change made through a view is recorded in its
//! worktree's journal, and a query answers the paths changed since a token.

use std::ffi::OsStr;
use std::fs::{self};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use git2::Oid;

use crate::gitlayer::{self, MODE_TREE};
use crate::layout::{OPAQUE_MARKER, RESERVED_PREFIX, WHITEOUT_PREFIX};

use super::error::{FsError, FsResult};
use super::overlay::WtCtx;
use super::view::{exists, View, GITFILE_NAME};

impl View {
    pub(super) fn note(&self, wt: &WtCtx, rel: &[u8]) {
        wt.journal.lock().record(rel);
    }

    /// Records that the entry `ino` changed.
    pub(super) fn note_node(&self, ino: u64) {
        let t = self.nodes.read();
        if let (Ok((wt, _, _)), Ok(rel)) = (t.wt_of(ino), t.rel_path(ino)) {
            drop(t);
            self.note(&wt, &rel);
        }
    }

    /// Records that the name `name` in directory `parent` changed (created or removed).
    pub(super) fn note_child(&self, parent: u64, name: &OsStr) {
        let t = self.nodes.read();
        if let (Ok((wt, _, _)), Ok(mut rel)) = (t.wt_of(parent), t.rel_path(parent)) {
            drop(t);
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            self.note(&wt, &rel);
        }
    }

    /// Records every path below the upper directory `dir` (at `rel` in the worktree) under
    /// both `rel` and `old_rel`: a directory moved from `old_rel`.
    pub(super) fn note_moved_tree(&self, wt: &WtCtx, dir: &Path, rel: &[u8], old_rel: &[u8]) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name();
            if name.as_bytes().starts_with(RESERVED_PREFIX) {
                continue;
            }
            let join = |base: &[u8]| {
                let mut p = base.to_vec();
                p.push(b'/');
                p.extend_from_slice(name.as_bytes());
                p
            };
            let (new, old) = (join(rel), join(old_rel));
            self.note(wt, &new);
            self.note(wt, &old);
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                self.note_moved_tree(wt, &e.path(), &new, &old);
            }
        }
    }

    /// Answers git's fsmonitor hook for `<repo>:<worktree>@<token>`: the new token, then
    /// every path that changed since `token`.
    pub(super) fn fsmonitor_query(&self, query: &str) -> FsResult<Vec<u8>> {
        let bad = || {
            FsError::new(
                libc::EINVAL,
                format!("fsmonitor query {query:?} is not <repo>:<worktree>@<token>"),
            )
        };
        let (who, token) = query.split_once('@').ok_or_else(bad)?;
        let (repo, name) = who.split_once(':').ok_or_else(bad)?;
        self.refresh()?;
        let wt = self
            .catalog
            .read()
            .worktrees
            .values()
            .find(|w| w.repo == repo && w.name == name)
            .cloned()
            .ok_or_else(|| FsError::not_found(format!("worktree {repo}/{name}")))?;
        use crate::fsmonitor::{encode_response, parse_token, token as make_token, Since};
        // Bump first: a write that has not yet checked the epoch will record again.
        wt.query_epoch.fetch_add(1, Ordering::AcqRel);
        let (seq, since) = {
            let j = wt.journal.lock();
            let since = match parse_token(token, &self.instance) {
                Some(s) => j.since(s),
                None => Since::Unknown,
            };
            (j.seq(), since)
        };
        let mut paths = match since {
            Since::Paths(p) => p,
            Since::Everything => vec![b"/".to_vec()],
            Since::Unknown => {
                // Everything that differs from the base is in the upper layer.
                let mut out = Vec::new();
                self.upper_paths(&wt, &wt.upper, b"", Some(wt.base_tree), &mut out)?;
                out.sort();
                out.dedup();
                out
            }
        };
        // Files open for writing may change at any moment without a request reaching us.
        let writers: Vec<u64> = wt.open_writers.lock().keys().copied().collect();
        if !writers.is_empty() {
            let t = self.nodes.read();
            for ino in writers {
                if let Ok(rel) = t.rel_path(ino) {
                    paths.push(rel);
                }
            }
        }
        tracing::debug!(
            repo,
            worktree = name,
            token,
            changed = paths.len(),
            "fsmonitor query"
        );
        Ok(encode_response(&make_token(&self.instance, seq), &paths))
    }

    /// Every path the upper directory `dir` (at `rel`) holds or hides: its entries, the
    /// names its whiteouts delete, and, below an opaque directory, the base's entries.
    pub(super) fn upper_paths(
        &self,
        wt: &WtCtx,
        dir: &Path,
        rel: &[u8],
        base: Option<Oid>,
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        let join = |name: &[u8]| {
            let mut p = rel.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            p
        };
        let opaque = exists(&dir.join(OPAQUE_MARKER));
        let listing = match base {
            Some(tree) => Some(
                self.objects
                    .tree(&wt.gitdir, tree)
                    .map_err(|e| FsError::git("reading tree", e))?,
            ),
            None => None,
        };
        if opaque {
            if let Some(l) = &listing {
                for e in &l.entries {
                    self.base_paths(wt, e, &join(e.name.as_bytes()), out)?;
                }
            }
        }
        let rd =
            fs::read_dir(dir).map_err(|e| FsError::io(format!("listing {}", dir.display()), e))?;
        for e in rd.flatten() {
            let name = e.file_name();
            let b = name.as_bytes();
            if let Some(hidden) = b.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                // A deleted base directory hides everything below it.
                match listing
                    .as_ref()
                    .and_then(|l| l.get(OsStr::from_bytes(hidden)))
                {
                    Some(entry) => self.base_paths(wt, entry, &join(hidden), out)?,
                    None => out.push(join(hidden)),
                }
                continue;
            }
            if b.starts_with(RESERVED_PREFIX) || (rel.is_empty() && name == GITFILE_NAME) {
                continue;
            }
            let path = join(b);
            out.push(path.clone());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let below = if opaque {
                    None
                } else {
                    listing
                        .as_ref()
                        .and_then(|l| l.get(&name))
                        .filter(|entry| entry.mode == MODE_TREE)
                        .map(|entry| entry.oid)
                };
                self.upper_paths(wt, &e.path(), &path, below, out)?;
            } else if let Some(entry) = listing.as_ref().and_then(|l| l.get(&name)) {
                // A file where the base has a directory: the directory's files are gone.
                if entry.mode == MODE_TREE && !opaque {
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
        entry: &gitlayer::TreeEntry,
        path: &[u8],
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        out.push(path.to_vec());
        if entry.mode == MODE_TREE {
            let l = self
                .objects
                .tree(&wt.gitdir, entry.oid)
                .map_err(|e| FsError::git("reading tree", e))?;
            for e in &l.entries {
                let mut p = path.to_vec();
                p.push(b'/');
                p.extend_from_slice(e.name.as_bytes());
                self.base_paths(wt, e, &p, out)?;
            }
        }
        Ok(())
    }
}
