//! Stable inode numbers for what the view reports in `st_ino`.
//!
//! FUSE node ids are handles the kernel uses for one mount; `st_ino` is what git records
//! in its index and must survive remounts. Base entries and directories get
//! `worktree id << 32 | fnv1a32(path)`: git keeps only the low 32 bits, so the index written
//! at creation (which knows the path but need not know the worktree) matches, while two
//! worktrees never share an inode number. An entry keeps its number when it is copied up
//! (the node does); a collision with a live node keeps the low 32 bits and changes the
//! high ones (`fs/nodes.rs`, `NodeTable::assign_ino`).

/// A node's inode number: the FUSE node id the kernel names it by, and its `st_ino`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Ino(pub u64);

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= *b as u32;
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The 32 bits git stores for an untouched base entry at `path` (relative to the worktree).
pub fn path_ino_low(path: &[u8]) -> u32 {
    // Never 0: some tools treat inode 0 as "no inode".
    fnv1a32(path).max(1)
}

/// Whose inode numbers: what the high 32 bits of every number of one view's entries are
/// made from. A worktree's is its id (below bit 30); a submodule view's has bit 30 set,
/// the rest made from its parent's and its path ([`InoSpace::of_submodule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InoSpace(pub i64);

impl InoSpace {
    /// The space of the submodule view at `path` of the view whose space is `parent`.
    pub fn of_submodule(parent: InoSpace, path: &[u8]) -> InoSpace {
        let mix = (parent.0 as u64).wrapping_mul(0x9e37_79b9) ^ fnv1a32(path) as u64;
        InoSpace((0x4000_0000 | (mix & 0x3fff_ffff)) as i64)
    }
}

/// The inode number the entry at `path` of a view of space `space` starts with.
pub fn path_ino(space: InoSpace, path: &[u8]) -> u64 {
    ((space.0 as u64 & 0x7fff_ffff) << 32) | path_ino_low(path) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_inos_are_stable_and_distinct_per_worktree() {
        let (a, b) = (InoSpace(3), InoSpace(4));
        assert_eq!(path_ino(a, b"src/main.rs"), path_ino(a, b"src/main.rs"));
        assert_ne!(path_ino(a, b"src/main.rs"), path_ino(b, b"src/main.rs"));
        assert_eq!(
            path_ino(a, b"src/main.rs") as u32,
            path_ino(b, b"src/main.rs") as u32
        );
        // A submodule view's space is no worktree's, and stays the same for a path.
        let sub = InoSpace::of_submodule(a, b"lib/dep");
        assert!(sub.0 & 0x4000_0000 != 0 && sub.0 < 0x8000_0000);
        assert_eq!(sub, InoSpace::of_submodule(a, b"lib/dep"));
        assert_ne!(sub, InoSpace::of_submodule(b, b"lib/dep"));
        // Known FNV-1a vector.
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
    }
}
