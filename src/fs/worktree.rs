//! A worktree as the view serves it (`WtCtx`), in the parts it is made of: who it is
//! (`Identity`), its upper layer (`UpperLayer`), its base (`base_layer::Base`), the
//! journal git's fsmonitor hook asks (`journal.rs`) and the submodule views nested in it
//! (`Nested`). A submodule's view is a `WtCtx` of its own, nested in its parent's.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::layout::Whiteouts;

use super::base_layer::Base;
use super::journal::WorktreeJournal;
use super::types::GITFILE_NAME;
use crate::ids::{RepoId, WorktreeId};

/// A worktree as the view needs it, built from its row (or a submodule's record).
#[derive(Debug)]
pub struct WtCtx {
    pub ident: Identity,
    pub(super) upper: UpperLayer,
    pub(super) base: Base,
    /// What git's fsmonitor hook asks of this worktree.
    pub(super) journal: WorktreeJournal,
    pub(super) nested: Nested,
    /// Its checkpoints (a submodule's view has none of its own: see
    /// `docs/design/checkpoints.md`).
    pub(super) checkpoints: Option<crate::checkpoint::Checkpoints>,
}

/// Who a worktree is: its row's names and numbers, its owner and git's entry for it.
#[derive(Debug)]
pub struct Identity {
    pub id: WorktreeId,
    pub repo_id: RepoId,
    pub repo: String,
    /// Its name (a submodule view's: its path below the worktree's).
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// git's admin entry's name (in `<gitdir>/worktrees/`).
    pub(super) admin_name: String,
    /// What its `.git` file says.
    pub gitfile: Vec<u8>,
    /// Whose inode numbers its entries get (`ino::path_ino`): the worktree's id, or for
    /// a submodule's view a space of its own.
    pub ino_space: crate::ino::InoSpace,
    /// The worktree whose leases cover this one: itself, or a submodule's parent.
    pub lease_id: WorktreeId,
}

/// A worktree's upper layer: the upper and work directories, their paths for messages,
/// their descriptors for everything else (see `fs/place.rs`), and its whiteout files.
#[derive(Debug)]
pub(super) struct UpperLayer {
    pub(super) path: PathBuf,
    pub(super) work: PathBuf,
    pub(super) fd: OwnedFd,
    pub(super) work_fd: OwnedFd,
    /// Its whiteout files (see `crate::layout`).
    pub(super) whiteouts: Whiteouts,
}

/// The submodule views of a worktree, and for a submodule's view its place in its parent.
#[derive(Debug, Default)]
pub(super) struct Nested {
    /// For a submodule's view: the view it is in, and its place there.
    pub(super) of: Option<SubOf>,
    /// Whether initialized submodules show as views of their own (`new --submodules`).
    pub(super) shown: bool,
    /// Those views, by path, each made at the first lookup of its directory. Held only
    /// to look up or insert (never while a view is made).
    pub(super) views: Mutex<HashMap<Vec<u8>, Arc<WtCtx>>>,
    /// A lock per path whose view is being made, so it is made once while lookups of the
    /// others (and the fsmonitor's answer, which looks at every view) go on.
    pub(super) making: Mutex<HashMap<Vec<u8>, Arc<Mutex<()>>>>,
    /// Held while its submodule views move (their records and `views` rekeyed) and while
    /// a view made is put in `views` at its record's path: never while waiting for
    /// anything else (`mutate` is taken before it, a making slot never while it is held).
    pub(super) moving: Mutex<()>,
}

/// A submodule's view's place in the view it is in.
#[derive(Debug)]
pub(super) struct SubOf {
    pub(super) parent: Weak<WtCtx>,
    /// Its path there now (a rename moves it).
    pub(super) path: Mutex<Vec<u8>>,
    /// The path it was made at, which names its record (`submodules::key_of`), and the
    /// commit the gitlink there records: what a moved view's stub says
    /// (`submodules::stub_text`).
    pub(super) origin: Vec<u8>,
    pub(super) commit: git2::Oid,
}

impl SubOf {
    pub(super) fn path(&self) -> Vec<u8> {
        self.path.lock().clone()
    }
}

impl WtCtx {
    /// Records in the journal (git's fsmonitor answers) that `rel` changed; in a
    /// submodule's view, its path in the parent changed too (git checks the submodule).
    pub(super) fn record_change(&self, rel: &[u8]) {
        self.journal.record(rel);
        if let Some(of) = &self.nested.of {
            if let Some(p) = of.parent.upgrade() {
                p.record_change(&of.path());
            }
        }
    }

    /// Its checkpoints, when it keeps any (every change then keeps what it changes).
    pub(super) fn keeping(&self) -> Option<&crate::checkpoint::Checkpoints> {
        self.checkpoints.as_ref().filter(|c| c.any())
    }

    /// The attributes of its upper file `st` as node `ino` shows them: the links its
    /// checkpoints hold to the file are theirs, not names in the view.
    pub(super) fn upper_attr(
        &self,
        ino: crate::ino::Ino,
        st: &crate::beneath::Stat,
    ) -> super::types::Attr {
        let mut attr = super::types::Attr::from_stat(ino, st);
        if let Some(c) = &self.checkpoints {
            attr.nlink = attr.nlink.saturating_sub(c.links_held(st.st_ino));
        }
        attr
    }

    /// Whether this is a submodule's view (nested in a worktree).
    pub fn is_submodule(&self) -> bool {
        self.nested.of.is_some()
    }

    /// For a submodule's view: its path in the worktree (through every level above it).
    pub(super) fn sub_path(&self) -> Option<String> {
        let of = self.nested.of.as_ref()?;
        let path = of.path();
        let path = String::from_utf8_lossy(&path);
        let parent = of.parent.upgrade()?;
        Some(crate::layout::submodules::full_path(
            parent.sub_path().as_deref(),
            &path,
        ))
    }

    /// For a submodule's view: the path in the worktree it was made at, which names its
    /// record (`submodules::key_of`).
    pub(super) fn sub_origin(&self) -> Option<String> {
        let of = self.nested.of.as_ref()?;
        let parent = of.parent.upgrade()?;
        Some(crate::layout::submodules::full_path(
            parent.sub_path().as_deref(),
            &String::from_utf8_lossy(&of.origin),
        ))
    }

    /// The worktree's name (a submodule view's is its path below the worktree's).
    pub(super) fn worktree_name(&self) -> String {
        match self.nested.of.as_ref().and_then(|of| of.parent.upgrade()) {
            Some(parent) => parent.worktree_name(),
            None => self.ident.name.clone(),
        }
    }

    /// Whether its `.git` file was removed: only a submodule's can be (`git rm` and
    /// `git submodule deinit` remove it with the directory), a whiteout in its upper root
    /// saying so.
    pub(super) fn gitfile_removed(&self) -> bool {
        self.is_submodule()
            && self
                .upper
                .whiteouts
                .at(self.upper.fd.as_fd(), OsStr::new(GITFILE_NAME))
    }
}
