//! What a node of the view is (`NodeKind`): the top, `.control` and its files, a
//! repository's directory, a worktree entry with its place in the layers, a worktree's
//! `.git` file; the part of the mount it belongs to (`Domain`), and the fixed nodes of
//! `.control`. The table that holds them is `inodes.rs`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::ino;

use super::control::{ControlDir, CONTROL_INO, CONTROL_NAME, LAYOUT};
use super::error::{FsError, FsResult};
use super::inodes::{self, InodeTable, Inodes, PathStep, Step};
use super::inodes::{DYNAMIC_INO_BIT, ROOT_INO};
use super::overlay::Overlay;
use super::worktree::WtCtx;
use crate::ids::RepoId;
use crate::ino::Ino;

/// The view's inode table and its nodes.
pub(super) type NodeTable = InodeTable<NodeKind>;
pub(super) type Nodes = Inodes<NodeKind>;
pub(super) type Node = inodes::Node<NodeKind>;

#[derive(Debug, Clone)]
pub(super) enum NodeKind {
    Root,
    ControlDir(ControlDir),
    ControlFile(ControlDir, String),
    Repo(RepoId),
    /// A worktree entry; `is_root` for the worktree's own directory.
    Wt {
        wt: Arc<WtCtx>,
        ov: Overlay,
        is_root: bool,
    },
    GitFile(Arc<WtCtx>),
}

impl PathStep for NodeKind {
    fn path_step(&self) -> Step {
        match self {
            NodeKind::Wt { is_root: true, .. } => Step::Start,
            NodeKind::Wt { .. } => Step::Inside,
            _ => Step::Outside,
        }
    }
}

/// The part of the mount a node belongs to. Names never move between two parts: a rename
/// or a link across answers EXDEV, as between two filesystems, so each worktree's upper
/// layer holds only its own files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Domain {
    /// The top of the mount.
    Top,
    Control,
    /// A repository's directory (where its worktrees are).
    Repo(RepoId),
    /// Everything inside one worktree (or submodule view), its own directory included:
    /// its inode-number seed and its context's address (unique while a node holds it).
    Worktree(crate::ino::InoSpace, usize),
}

impl NodeTable {
    pub(super) fn domain(&self, ino: Ino) -> FsResult<Domain> {
        Ok(match self.kind(ino).ok_or_else(|| FsError::stale(ino))? {
            NodeKind::Root => Domain::Top,
            NodeKind::ControlDir(_) | NodeKind::ControlFile(..) => Domain::Control,
            NodeKind::Repo(id) => Domain::Repo(*id),
            // The context itself, not its inode-number seed (a submodule view's is a
            // hash, which a crafted path could make another view's).
            NodeKind::Wt { wt, .. } | NodeKind::GitFile(wt) => {
                Domain::Worktree(wt.ident.ino_space, Arc::as_ptr(wt) as usize)
            }
        })
    }

    /// Refuses a rename or link from `from` into directory `to` when they are in two
    /// isolated parts of the mount (see `Domain`).
    pub(super) fn same_domain(&self, from: Ino, to: Ino, what: &str) -> FsResult<()> {
        let (a, b) = (self.domain(from)?, self.domain(to)?);
        if a == b {
            return Ok(());
        }
        Err(FsError::cross_device(format!(
            "{what} from {a:?} into {b:?}: worktrees are separate filesystems"
        )))
    }

    /// The overlay state of worktree entry `ino`, to change it (copy-up, rename).
    pub(super) fn overlay_mut(&mut self, ino: Ino) -> Option<&mut Overlay> {
        match self.kind_mut(ino) {
            Some(NodeKind::Wt { ov, .. }) => Some(ov),
            _ => None,
        }
    }

    /// Adds (or counts once more) the worktree entry `name` of directory `parent`, with
    /// the inode number its path gives (see `ino::path_ino`).
    pub(super) fn insert_entry(
        &mut self,
        parent: Ino,
        name: &OsStr,
        wt: Arc<WtCtx>,
        ov: Overlay,
    ) -> FsResult<Ino> {
        let natural = ino::path_ino(wt.ident.ino_space, &self.child_rel_path(parent, name)?);
        let kind = NodeKind::Wt {
            wt,
            ov,
            is_root: false,
        };
        Ok(self.insert_child(parent, name, natural, kind))
    }

    pub(super) fn wt_of(&self, ino: Ino) -> FsResult<(Arc<WtCtx>, Overlay, bool)> {
        match self.kind(ino) {
            Some(NodeKind::Wt { wt, ov, is_root }) => Ok((wt.clone(), *ov, *is_root)),
            Some(_) => Err(FsError::not_permitted("not a worktree entry")),
            None => Err(FsError::stale(ino)),
        }
    }
}

/// The nodes of `.control` and what it holds, `(ino, kind, parent, name)`, as the node
/// table is built with them.
pub(super) fn fixed_nodes() -> impl Iterator<Item = (Ino, NodeKind, Ino, &'static str)> {
    let top = (
        CONTROL_INO,
        NodeKind::ControlDir(ControlDir::Top),
        ROOT_INO,
        CONTROL_NAME,
    );
    std::iter::once(top).chain(LAYOUT.iter().map(|&(ino, name, dir)| {
        let kind = match dir {
            Some(d) => NodeKind::ControlDir(d),
            None => NodeKind::ControlFile(ControlDir::Top, name.into()),
        };
        (ino, kind, CONTROL_INO, name)
    }))
}

/// The inode a generated `.control` entry is given (unless taken: see `assign_ino`).
pub(super) fn control_ino(dir: ControlDir, name: &OsStr) -> Ino {
    Ino(DYNAMIC_INO_BIT | (1 << 61) | ino::fnv1a32(name.as_bytes()) as u64 | ((dir as u64) << 32))
}
