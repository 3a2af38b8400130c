//! A worktree's layers (`WtCtx`: its identity, upper and work directories, journal, base)
//! and a node's place in them (`Overlay`). Resolving a name through them is `base.rs`.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use git2::Oid;

use crate::git::{self};
use crate::layout::Whiteouts;

use super::journal::WorktreeJournal;
use super::types::{FType, GITFILE_NAME};

/// A directory's upper directory as a lookup found it: its descriptor once opened, and
/// whether a whiteout holds the name looked up (a removed base entry's; a new entry goes
/// over it in one rename).
#[derive(Default)]
pub(super) struct UpperDir {
    pub(super) fd: Option<OwnedFd>,
    pub(super) whiteout_at_name: bool,
}

/// A worktree as the view needs it, built from its row.
#[derive(Debug)]
pub struct WtCtx {
    pub id: i64,
    pub repo_id: i64,
    pub repo: String,
    pub name: String,
    pub gitdir: PathBuf,
    pub base_tree: Oid,
    pub base_mtime: SystemTime,
    pub uid: u32,
    pub gid: u32,
    /// The upper and work directories: their paths for messages, their descriptors for
    /// everything else (see `fs/place.rs`).
    pub upper: PathBuf,
    pub work: PathBuf,
    pub(super) upper_fd: OwnedFd,
    pub(super) work_fd: OwnedFd,
    /// Its whiteout files (see `crate::layout`).
    pub(super) whiteouts: Whiteouts,
    pub gitfile: Vec<u8>,
    /// Whether blob sizes were seeded from the cached index of the base tree.
    pub(super) sizes_seeded: std::sync::atomic::AtomicBool,
    /// What git's fsmonitor hook asks of this worktree.
    pub(super) journal: WorktreeJournal,
    /// The warm snapshot below its base tree (`new --warm`), shared by every worktree of
    /// it.
    pub(super) warm: Option<Arc<crate::git::warm::Snapshot>>,
    /// The base files a checkout converts (none for most repositories).
    pub(super) conversions: Option<Arc<crate::git::checkout::Conversions>>,
    /// The number inode numbers are made from (`ino::path_ino`): the worktree's id, or
    /// for a submodule's view a number of its own.
    pub ino_id: i64,
    /// The worktree whose leases cover this one: itself, or a submodule's parent.
    pub lease_id: i64,
    /// For a submodule's view: the view it is in, and its place there.
    pub(super) sub_of: Option<SubOf>,
    /// Whether initialized submodules show as views of their own (`new --submodules`).
    pub(super) submodules: bool,
    /// git's admin entry's name (in `<gitdir>/worktrees/`).
    pub(super) admin_name: String,
    /// Those views, by path, each made at the first lookup of its directory. Held only
    /// to look up or insert (never while a view is made).
    pub(super) subs: parking_lot::Mutex<std::collections::HashMap<Vec<u8>, Arc<WtCtx>>>,
    /// A lock per path whose view is being made, so it is made once while lookups of the
    /// others (and the fsmonitor's answer, which looks at every view) go on.
    pub(super) making:
        parking_lot::Mutex<std::collections::HashMap<Vec<u8>, Arc<parking_lot::Mutex<()>>>>,
    /// Held while its submodule views move (their records and `subs` rekeyed) and while a
    /// view made is put in `subs` at its record's path: never while waiting for anything
    /// else (`mutate` is taken before it, a making slot never while it is held).
    pub(super) moving: parking_lot::Mutex<()>,
}

/// A submodule's view's place in the view it is in.
#[derive(Debug)]
pub(super) struct SubOf {
    pub(super) parent: std::sync::Weak<WtCtx>,
    /// Its path there now (a rename moves it).
    pub(super) path: parking_lot::Mutex<Vec<u8>>,
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
        if let Some(of) = &self.sub_of {
            if let Some(p) = of.parent.upgrade() {
                p.record_change(&of.path());
            }
        }
    }

    /// Whether this is a submodule's view (nested in a worktree).
    pub fn is_submodule(&self) -> bool {
        self.sub_of.is_some()
    }

    /// For a submodule's view: its path in the worktree (through every level above it).
    pub(super) fn sub_path(&self) -> Option<String> {
        let of = self.sub_of.as_ref()?;
        let path = of.path();
        let path = String::from_utf8_lossy(&path);
        let parent = of.parent.upgrade()?;
        Some(crate::lifecycle::submodules::full_path(
            parent.sub_path().as_deref(),
            &path,
        ))
    }

    /// For a submodule's view: the path in the worktree it was made at, which names its
    /// record (`submodules::key_of`).
    pub(super) fn sub_origin(&self) -> Option<String> {
        let of = self.sub_of.as_ref()?;
        let parent = of.parent.upgrade()?;
        Some(crate::lifecycle::submodules::full_path(
            parent.sub_path().as_deref(),
            &String::from_utf8_lossy(&of.origin),
        ))
    }

    /// The worktree's name (a submodule view's is its path below the worktree's).
    pub(super) fn worktree_name(&self) -> String {
        match self.sub_of.as_ref().and_then(|of| of.parent.upgrade()) {
            Some(parent) => parent.worktree_name(),
            None => self.name.clone(),
        }
    }

    /// Whether its `.git` file was removed: only a submodule's can be (`git rm` and
    /// `git submodule deinit` remove it with the directory), a whiteout in its upper root
    /// saying so.
    pub(super) fn gitfile_removed(&self) -> bool {
        self.is_submodule()
            && self
                .whiteouts
                .at(self.upper_fd.as_fd(), OsStr::new(GITFILE_NAME))
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct BaseRef {
    pub(super) oid: Oid,
    pub(super) mode: u32,
    /// An entry of the worktree's warm snapshot: its number plus one (`git::warm`); 0
    /// for git's. A directory's can be both (a tracked directory the snapshot adds to).
    pub(super) warm: u32,
}

impl BaseRef {
    pub(super) fn of(e: &git::TreeEntry) -> BaseRef {
        BaseRef {
            oid: e.oid,
            mode: e.mode,
            warm: e.warm,
        }
    }
}

/// A worktree entry's place in the overlay.
#[derive(Debug, Clone, Copy)]
pub(super) struct Overlay {
    pub(super) ftype: FType,
    /// Directories: the base tree merged underneath (None when new or opaque).
    /// Files and symlinks: the base object, used while the entry is not in the upper layer.
    pub(super) base: Option<BaseRef>,
    pub(super) in_upper: bool,
    /// The upper file's inode number, which the file found at the node's name must have
    /// (0: not in the upper layer, or not known).
    pub(super) upper_ino: u64,
}

impl Overlay {
    /// A new entry of the upper layer, whose file has inode number `upper_ino`.
    pub(super) fn upper(ftype: FType, upper_ino: u64) -> Overlay {
        Overlay {
            ftype,
            base: None,
            in_upper: true,
            upper_ino,
        }
    }
}
