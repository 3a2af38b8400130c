//! What a change to a worktree's upper layer keeps first when the worktree keeps
//! checkpoints (`crate::checkpoint`): each name it makes, removes or replaces, and the
//! attributes or data it changes in place. All under `mutate`, which taking a checkpoint
//! holds too: no open for writing falls between a checkpoint and the handle table it
//! reads (kept in the epoch before, or copied as open by the new one). A worktree without
//! checkpoints pays one check per change.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;

use super::error::{FsError, FsResult};
use super::view::View;
use super::worktree::WtCtx;
use crate::ino::Ino;

fn kept(what: &str, rel: &[u8], e: io::Error) -> FsError {
    FsError::io(
        format!(
            "keeping {what} {} for the worktree's checkpoints",
            crate::checkpoint::show_path(rel)
        ),
        e,
    )
}

/// Keeps the name `rel` of worktree `wt` (when it keeps checkpoints) before it changes.
pub(super) fn keep_path(wt: &WtCtx, rel: &[u8]) -> FsResult<()> {
    match wt.keeping() {
        Some(c) => c
            .keep_name(wt.upper.fd.as_fd(), rel)
            .map_err(|e| kept("the entry at", rel, e)),
        None => Ok(()),
    }
}

impl View {
    /// The worktree of directory `parent` when it keeps checkpoints, and the path of
    /// `name` in it.
    pub(super) fn keeping_child(
        &self,
        parent: Ino,
        name: &OsStr,
    ) -> FsResult<Option<(std::sync::Arc<WtCtx>, Vec<u8>)>> {
        let t = self.nodes.read();
        let (wt, _, _) = t.wt_of(parent)?;
        if wt.keeping().is_none() {
            return Ok(None);
        }
        let rel = t.child_rel_path(parent, name)?;
        Ok(Some((wt, rel)))
    }

    /// Before the name `name` of `parent` is made, removed or replaced.
    pub(super) fn keep_child(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        match self.keeping_child(parent, name)? {
            Some((wt, rel)) => keep_path(&wt, &rel),
            None => Ok(()),
        }
    }

    /// Before the entry `name` of `parent` goes, with everything below it.
    pub(super) fn keep_child_tree(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        let Some((wt, rel)) = self.keeping_child(parent, name)? else {
            return Ok(());
        };
        let c = wt.keeping().expect("checked");
        c.keep_tree(wt.upper.fd.as_fd(), &rel)
            .map_err(|e| kept("the tree at", &rel, e))
    }

    /// Before the entry `name` of `parent` moves to `newname` of `newparent`.
    pub(super) fn keep_move(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
    ) -> FsResult<()> {
        let Some((wt, from)) = self.keeping_child(parent, name)? else {
            return Ok(());
        };
        let to = self.nodes.read().child_rel_path(newparent, newname)?;
        let c = wt.keeping().expect("checked");
        c.keep_moved(wt.upper.fd.as_fd(), &from, &to)
            .map_err(|e| kept("what moves from", &from, e))
    }

    /// Before the attributes (mode, owner, times, extended attributes) of the upper
    /// entry `ino` change.
    pub(super) fn keep_node_attrs(&self, ino: Ino) -> FsResult<()> {
        self.keep_node(ino, false)
    }

    /// Before the upper file `ino` is opened for writing or truncated.
    pub(super) fn keep_node_content(&self, ino: Ino) -> FsResult<()> {
        self.keep_node(ino, true)
    }

    fn keep_node(&self, ino: Ino, content: bool) -> FsResult<()> {
        let (wt, rel) = {
            let t = self.nodes.read();
            let (wt, _, _) = t.wt_of(ino)?;
            if wt.keeping().is_none() {
                return Ok(());
            }
            (wt, t.live_rel_path(ino).ok())
        };
        let place = self.place(ino)?;
        let fd = place
            .fd()
            .map_err(|e| kept("the file at", rel.as_deref().unwrap_or_default(), e))?;
        let c = wt.keeping().expect("checked");
        let upper = wt.upper.fd.as_fd();
        let r = if content {
            c.keep_content(upper, rel.as_deref(), fd.as_fd())
        } else {
            c.keep_attrs(upper, rel.as_deref(), fd.as_fd())
        };
        r.map_err(|e| kept("the file at", rel.as_deref().unwrap_or_default(), e))
    }
}
