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

pub fn path_ino(worktree_id: i64, path: &[u8]) -> u64 {
    ((worktree_id as u64 & 0x7fff_ffff) << 32) | path_ino_low(path) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_inos_are_stable_and_distinct_per_worktree() {
        assert_eq!(path_ino(3, b"src/main.rs"), path_ino(3, b"src/main.rs"));
        assert_ne!(path_ino(3, b"src/main.rs"), path_ino(4, b"src/main.rs"));
        assert_eq!(
            path_ino(3, b"src/main.rs") as u32,
            path_ino(4, b"src/main.rs") as u32
        );
        // Known FNV-1a vector.
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
    }
}
