//! The inode table: every node the kernel knows, its lookup count, and the names that
//! lead to it (mountpoint-s3's superblock, fuse-backend-rs's inode store). It knows
//! inodes, names and paths only: what a node is (`K`, the view's `nodes::NodeKind`) is
//! its holder's, asked only where a node's path starts (`PathStep`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{FsError, FsResult};
use super::inomap::{ChildIndex, InoMap};
use crate::ino::Ino;

pub const ROOT_INO: Ino = Ino(1);
pub(super) const DYNAMIC_INO_BIT: u64 = 1 << 62;

/// Where a node stands on the paths inside a worktree (which are relative to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// A worktree's own directory, where its paths start.
    Start,
    /// An entry inside a worktree: a step on a path.
    Inside,
    /// Anything outside every worktree (the top, a repository's directory, `.control`).
    Outside,
}

/// What the table asks of a node's kind.
pub(super) trait PathStep {
    fn path_step(&self) -> Step;
}

#[derive(Debug)]
pub(super) struct Node<K> {
    kind: K,
    parent: Ino,
    name: Box<OsStr>,
    /// The kernel's lookup count. Atomic so a lookup of a known name counts it under the
    /// table's read lock; `forget` (write lock) is the only one that lowers it.
    lookups: AtomicU64,
    unlinked: bool,
}

impl<K> Node<K> {
    pub(super) fn kind(&self) -> &K {
        &self.kind
    }

    pub(super) fn parent(&self) -> Ino {
        self.parent
    }

    pub(super) fn name(&self) -> &OsStr {
        &self.name
    }

    /// Whether its last name was removed (it lives on while the kernel knows it).
    pub(super) fn is_unlinked(&self) -> bool {
        self.unlinked
    }

    pub(super) fn new(kind: K, parent: Ino, name: &OsStr, lookups: u64) -> Node<K> {
        Node {
            kind,
            parent,
            name: name.into(),
            lookups: AtomicU64::new(lookups),
            unlinked: false,
        }
    }
}

/// The path `name` in the directory at `rel` (both relative to the worktree; `rel` empty
/// for the worktree's own directory).
pub(super) fn join_rel(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// The inode table. Memory per node bounds a mount with many worktrees (see
/// `fs/inomap.rs`): nodes live in a slab, and the name index keeps no copy of the names.
pub(super) struct InodeTable<K> {
    nodes: InoMap<Node<K>>,
    children: ChildIndex,
    /// Further names of hard-linked upper files (rare), by inode.
    aliases: HashMap<Ino, Vec<(Ino, OsString)>>,
    /// The deleted-but-open set: upper files of nodes whose last name is gone, held open
    /// (`O_PATH`) until the kernel forgets the node (see `fs/place.rs`).
    orphans: HashMap<Ino, Arc<OwnedFd>>,
    /// `orphans.len()`, readable without the lock (the stats file).
    kept: Arc<AtomicUsize>,
    next_dynamic: u64,
    /// `nodes.len()`, readable without the table's lock (the stats file and the sweeper
    /// read it; a request that holds the lock must never take it again).
    count: Arc<AtomicUsize>,
}

/// The node table and its lock. Lock order (see `View`): after `mutate`, before the
/// handles and the catalog. Read-locked by lookups, getattr and path resolution;
/// write-locked to add, move or forget nodes.
pub(super) struct Inodes<K> {
    table: RwLock<InodeTable<K>>,
    count: Arc<AtomicUsize>,
    kept: Arc<AtomicUsize>,
}

impl<K> Inodes<K> {
    /// A table holding the fixed nodes `(ino, kind, parent, name)`, whose lookup counts
    /// are never used up.
    pub(super) fn new<'a>(fixed: impl IntoIterator<Item = (Ino, K, Ino, &'a str)>) -> Inodes<K> {
        let count = Arc::new(AtomicUsize::new(0));
        let mut table = InodeTable::new(count.clone());
        for (ino, kind, parent, name) in fixed {
            table.insert_node(ino, Node::new(kind, parent, OsStr::new(name), u64::MAX / 2));
        }
        Inodes {
            kept: table.kept.clone(),
            table: RwLock::new(table),
            count,
        }
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, InodeTable<K>> {
        self.table.read()
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, InodeTable<K>> {
        self.table.write()
    }

    /// How many nodes the table holds, without its lock.
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// How many removed files are kept open (the deleted-but-open set), without the lock.
    pub(super) fn kept_open(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }
}

impl<K> InodeTable<K> {
    pub(super) fn new(count: Arc<AtomicUsize>) -> InodeTable<K> {
        InodeTable {
            nodes: InoMap::default(),
            children: ChildIndex::default(),
            aliases: HashMap::new(),
            orphans: HashMap::new(),
            kept: Arc::new(AtomicUsize::new(0)),
            next_dynamic: 0,
            count,
        }
    }

    pub(super) fn assign_ino(&mut self, natural: u64) -> Ino {
        if natural > ROOT_INO.0 && !self.nodes.contains_key(&Ino(natural)) {
            return Ino(natural);
        }
        // Collision (or a still-open unlinked entry at the same path): keep the low 32 bits
        // git compares, change the high ones.
        loop {
            self.next_dynamic += 1;
            let candidate =
                Ino(DYNAMIC_INO_BIT | (self.next_dynamic << 32) | (natural & 0xffff_ffff));
            if !self.nodes.contains_key(&candidate) {
                return candidate;
            }
        }
    }

    pub(super) fn get(&self, ino: Ino) -> Option<&Node<K>> {
        self.nodes.get(&ino)
    }

    /// The kernel learned of `ino` once more (a lookup, a link, a listing's entry). Under
    /// the read lock: a forget needs the write lock, so it cannot drop the node meanwhile.
    pub(super) fn count_lookup(&self, ino: Ino) {
        if let Some(n) = self.nodes.get(&ino) {
            n.lookups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The kernel forgot `nlookup` of its lookups of `ino`; the node goes with the last.
    pub(super) fn forget(&mut self, ino: Ino, nlookup: u64) -> bool {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return false;
        };
        // The write lock excludes every increment (they hold the read lock).
        let left = node.lookups.load(Ordering::Relaxed).saturating_sub(nlookup);
        node.lookups.store(left, Ordering::Relaxed);
        if left == 0 {
            self.remove_node(ino);
        }
        left == 0
    }

    pub(super) fn contains(&self, ino: Ino) -> bool {
        self.nodes.contains_key(&ino)
    }

    pub(super) fn kind_mut(&mut self, ino: Ino) -> Option<&mut K> {
        self.nodes.get_mut(&ino).map(|n| &mut n.kind)
    }

    pub(super) fn kind(&self, ino: Ino) -> Option<&K> {
        self.nodes.get(&ino).map(|n| &n.kind)
    }

    /// Moves the name `(parent, name)` of `ino` to `(newparent, newname)`, replacing
    /// whatever had that name (a rename): the node's own name, or one of its links.
    pub(super) fn move_name(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        kept: Option<(Ino, OwnedFd)>,
    ) {
        self.detach_keeping(newparent, newname, kept);
        self.unmap_child(parent, name);
        let own_name = self
            .nodes
            .get(&ino)
            .is_some_and(|n| n.parent == parent && &*n.name == name);
        if own_name {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.parent = newparent;
                node.name = newname.into();
            }
            self.map_child(newparent, newname, ino);
        } else if self.nodes.contains_key(&ino) {
            if let Some(v) = self.aliases.get_mut(&ino) {
                v.retain(|(p, n)| !(*p == parent && n == name));
            }
            self.add_alias(ino, newparent, newname);
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.unlinked = false;
        }
    }

    /// The inode named `name` in `parent`.
    pub(super) fn child(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        self.children
            .get(parent, name, |i| has_name(nodes, aliases, i, parent, name))
    }

    /// Maps `(parent, name)` to `ino` (whose node says so already, or will at once).
    pub(super) fn map_child(&mut self, parent: Ino, name: &OsStr, ino: Ino) {
        // Another name of this inode in this directory with the same hash would share the
        // slot, and one slot cannot tell two names of one inode apart: map it exactly.
        // (Hashed only when there is such a name, a rename's or a link's: not for a new
        // node, which `insert_node` maps before the table holds it.)
        let own = self.nodes.get(&ino).map(|n| (n.parent, &*n.name));
        let links = self.aliases.get(&ino).into_iter().flatten();
        let twin = own
            .into_iter()
            .chain(links.map(|(p, n)| (*p, n.as_os_str())))
            .any(|(p, n)| {
                p == parent && n != name && self.children.hash(n) == self.children.hash(name)
            });
        if twin {
            self.children.insert_exact(parent, name, ino);
            return;
        }
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        // The slot may be taken over from a node that is gone or has this very name.
        self.children.insert(parent, name, ino, |i| {
            !nodes.contains_key(&i) || has_name(nodes, aliases, i, parent, name)
        });
    }

    /// Unmaps `(parent, name)`, returning the inode; the node keeps its fields.
    pub(super) fn unmap_child(&mut self, parent: Ino, name: &OsStr) -> Option<Ino> {
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        self.children
            .remove(parent, name, |i| has_name(nodes, aliases, i, parent, name))
    }

    /// Adds a node under its own name (`node.parent`, `node.name`).
    /// `ino` is new to the table: its name is mapped first, so no copy of it is needed.
    pub(super) fn insert_node(&mut self, ino: Ino, node: Node<K>) {
        debug_assert!(
            !self.nodes.contains_key(&ino),
            "inode {ino} is in the table"
        );
        if ino != ROOT_INO {
            self.map_child(node.parent, &node.name, ino);
        }
        self.nodes.insert(ino, node);
        self.count.store(self.nodes.len(), Ordering::Relaxed);
    }

    pub(super) fn insert_child(&mut self, parent: Ino, name: &OsStr, natural: u64, kind: K) -> Ino {
        if let Some(existing) = self.child(parent, name) {
            if let Some(n) = self.nodes.get_mut(&existing) {
                n.lookups.fetch_add(1, Ordering::Relaxed);
                return existing;
            }
        }
        let ino = self.assign_ino(natural);
        self.insert_node(ino, Node::new(kind, parent, name, 1));
        ino
    }

    /// Adds a node with no name, an `O_TMPFILE` file made in directory `parent`: unlinked
    /// from the start, its file `fd` kept until a link names it (`name_nameless`) or the
    /// kernel forgets it.
    pub(super) fn insert_nameless(
        &mut self,
        parent: Ino,
        natural: u64,
        kind: K,
        fd: OwnedFd,
    ) -> Ino {
        let ino = self.assign_ino(natural);
        let mut node = Node::new(kind, parent, OsStr::new(""), 1);
        node.unlinked = true;
        self.nodes.insert(ino, node);
        self.count.store(self.nodes.len(), Ordering::Relaxed);
        self.orphans.insert(ino, Arc::new(fd));
        self.kept.store(self.orphans.len(), Ordering::Relaxed);
        ino
    }

    /// Gives node `ino`, which has no name, its first: `(parent, name)` (a link of an
    /// `O_TMPFILE` file). Its file is found by that name from now on.
    pub(super) fn name_nameless(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.parent = parent;
        node.name = name.into();
        node.unlinked = false;
        self.map_child(parent, name, ino);
        if self.orphans.remove(&ino).is_some() {
            self.kept.store(self.orphans.len(), Ordering::Relaxed);
        }
    }

    /// Gives `ino` the further name `(parent, name)` (a hard link, or a rename of one).
    pub(super) fn add_alias(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        self.aliases
            .entry(ino)
            .or_default()
            .push((parent, name.to_os_string()));
        self.map_child(parent, name, ino);
    }

    /// Drops the name `(parent, name)`; the node stays while the kernel still knows it.
    pub(super) fn detach_name(&mut self, parent: Ino, name: &OsStr) {
        self.detach_keeping(parent, name, None)
    }

    /// As `detach_name`; `kept` is the file that had the name, held open (see
    /// `View::keep`), which the node keeps if this was its last name.
    pub(super) fn detach_keeping(
        &mut self,
        parent: Ino,
        name: &OsStr,
        kept: Option<(Ino, OwnedFd)>,
    ) {
        let Some(ino) = self.unmap_child(parent, name) else {
            return;
        };
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        if node.parent == parent && &*node.name == name {
            let next = self.aliases.get_mut(&ino).and_then(|v| v.pop());
            if let Some((p, n)) = next {
                node.parent = p;
                node.name = n.into();
            } else {
                node.unlinked = true;
                if let Some((_, fd)) = kept.filter(|(k, _)| *k == ino) {
                    self.orphans.insert(ino, Arc::new(fd));
                    self.kept.store(self.orphans.len(), Ordering::Relaxed);
                }
            }
        } else if let Some(v) = self.aliases.get_mut(&ino) {
            v.retain(|(p, n)| !(*p == parent && n == name));
        }
        if self.aliases.get(&ino).is_some_and(|v| v.is_empty()) {
            self.aliases.remove(&ino);
        }
    }

    /// The kept file of node `ino`, whose last name is gone.
    pub(super) fn orphan(&self, ino: Ino) -> Option<Arc<OwnedFd>> {
        self.orphans.get(&ino).cloned()
    }

    /// Node `ino`, whose last name is gone, now has its own file `fd` (a copy-up of a
    /// removed base file).
    pub(super) fn set_orphan(&mut self, ino: Ino, fd: OwnedFd) {
        self.orphans.insert(ino, Arc::new(fd));
        self.kept.store(self.orphans.len(), Ordering::Relaxed);
    }

    /// Whether `(parent, name)` is the last name of node `ino` (removing it orphans it).
    pub(super) fn is_last_name(&self, ino: Ino, parent: Ino, name: &OsStr) -> bool {
        self.nodes
            .get(&ino)
            .is_some_and(|n| n.parent == parent && &*n.name == name)
            && self.aliases.get(&ino).is_none_or(|v| v.is_empty())
    }

    /// Removes a node the kernel has forgotten, with every name still mapped to it.
    pub(super) fn remove_node(&mut self, ino: Ino) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        let mut names = vec![(node.parent, node.name.to_os_string())];
        names.extend(self.aliases.get(&ino).cloned().unwrap_or_default());
        for (p, n) in &names {
            if self.child(*p, n) == Some(ino) {
                self.unmap_child(*p, n);
            }
        }
        self.aliases.remove(&ino);
        if self.orphans.remove(&ino).is_some() {
            self.kept.store(self.orphans.len(), Ordering::Relaxed);
        }
        self.nodes.remove(&ino);
        self.count.store(self.nodes.len(), Ordering::Relaxed);
    }
}

/// Whether `ino` is called `name` in `parent` (its own name or one of its links).
pub(super) fn has_name<K>(
    nodes: &InoMap<Node<K>>,
    aliases: &HashMap<Ino, Vec<(Ino, OsString)>>,
    ino: Ino,
    parent: Ino,
    name: &OsStr,
) -> bool {
    nodes
        .get(&ino)
        .is_some_and(|n| n.parent == parent && &*n.name == name)
        || aliases
            .get(&ino)
            .is_some_and(|v| v.iter().any(|(p, n)| *p == parent && n == name))
}

impl<K: PathStep> InodeTable<K> {
    /// Every node below directory `ino` (not `ino` itself).
    pub(super) fn below(&self, ino: Ino) -> Vec<Ino> {
        self.nodes
            .keys()
            .copied()
            .filter(|&n| self.is_below(n, ino))
            .collect()
    }

    /// The path of a worktree entry relative to its worktree (empty for the root).
    pub(super) fn rel_path(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        loop {
            let node = self.nodes.get(&cur).ok_or_else(|| FsError::stale(cur))?;
            match node.kind.path_step() {
                Step::Start => break,
                Step::Inside => {
                    parts.push(&node.name);
                    cur = node.parent;
                }
                Step::Outside => return Err(FsError::invalid("not a worktree entry")),
            }
        }
        let mut out = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(p.as_bytes());
        }
        Ok(out)
    }

    /// Every path of node `ino` relative to its worktree: its name's, then its hard
    /// links' the table knows (a change to the file is a change at each).
    pub(super) fn rel_paths(&self, ino: Ino) -> Vec<Vec<u8>> {
        // A file made with no name (O_TMPFILE, not linked yet) has no path at all.
        let named = self.nodes.get(&ino).is_none_or(|n| !n.name.is_empty());
        let mut out: Vec<Vec<u8>> = self.rel_path(ino).into_iter().filter(|_| named).collect();
        for (p, n) in self.aliases.get(&ino).into_iter().flatten() {
            if let Ok(rel) = self.child_rel_path(*p, n) {
                out.push(rel);
            }
        }
        out
    }

    /// The path of the name `name` in directory `parent`, relative to its worktree.
    pub(super) fn child_rel_path(&self, parent: Ino, name: &OsStr) -> FsResult<Vec<u8>> {
        Ok(join_rel(&self.rel_path(parent)?, name.as_bytes()))
    }

    /// As `rel_path`, for reaching the upper layer: ENOENT when the node or an ancestor
    /// has lost its last name (nothing below a removed directory has a path).
    pub(super) fn live_rel_path(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let mut cur = ino;
        loop {
            let node = self.nodes.get(&cur).ok_or_else(|| FsError::stale(cur))?;
            if node.unlinked {
                return Err(FsError::not_found(format!("inode {cur} was removed")));
            }
            match node.kind.path_step() {
                Step::Start => break,
                Step::Inside => cur = node.parent,
                Step::Outside => return Err(FsError::invalid("not a worktree entry")),
            }
        }
        self.rel_path(ino)
    }

    pub(super) fn is_below(&self, mut n: Ino, ancestor: Ino) -> bool {
        for _ in 0..4096 {
            let Some(node) = self.nodes.get(&n) else {
                return false;
            };
            if !matches!(node.kind.path_step(), Step::Inside) {
                return false;
            }
            if node.parent == ancestor {
                return true;
            }
            n = node.parent;
        }
        false
    }
}

#[cfg(test)]
mod node_table_tests {
    use super::*;

    /// Every name resolves to its inode and nothing else does, with a hash of 1 bit so
    /// that names of one directory, and names of one hard-linked inode, collide.
    #[test]
    fn names_resolve_through_links_unlinks_and_forgets_when_hashes_collide() {
        for order in 0..4usize {
            let mut t = InodeTable::<()>::new(Arc::new(AtomicUsize::new(0)));
            t.children = ChildIndex::colliding_often(1);
            let d = Ino(7);
            let others: Vec<Ino> = ["b", "c", "d"]
                .iter()
                .enumerate()
                .map(|(i, n)| t.insert_child(d, OsStr::new(n), 200 + i as u64, ()))
                .collect();
            let a = t.insert_child(d, OsStr::new("a"), 100, ());
            // Hard links of "a": with one bit of hash, several share a slot with it.
            let mut names: Vec<String> = vec!["a".into()];
            for i in 0..8 {
                let l = format!("a{i}");
                t.detach_name(d, OsStr::new(&l));
                t.add_alias(a, d, OsStr::new(&l));
                names.push(l);
            }
            let check = |t: &InodeTable<()>, live: &[String]| {
                for n in live {
                    assert_eq!(t.child(d, OsStr::new(n)), Some(a), "order {order}: {n}");
                }
                for (n, ino) in ["b", "c", "d"].iter().zip(&others) {
                    assert_eq!(t.child(d, OsStr::new(n)), Some(*ino), "order {order}: {n}");
                }
            };
            check(&t, &names);
            // Unlink the names one by one, in a different order each round.
            let k = names.len();
            let mut live = names.clone();
            for step in 0..k - 1 {
                let victim = live.remove((step * (order + 1) + order) % live.len());
                t.detach_name(d, OsStr::new(&victim));
                assert_eq!(
                    t.child(d, OsStr::new(&victim)),
                    None,
                    "order {order}: {victim}"
                );
                check(&t, &live);
            }
            // Forgetting the inodes leaves no name behind.
            t.remove_node(a);
            for ino in others {
                t.remove_node(ino);
            }
            for n in names.iter().map(String::as_str).chain(["b", "c", "d"]) {
                assert_eq!(t.child(d, OsStr::new(n)), None, "order {order}: {n}");
            }
            assert!(t.children.is_empty(), "{} names left", t.children.len());
            assert!(t.nodes.is_empty());
        }
    }
}
