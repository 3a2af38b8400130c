//! Compact tables for the daemon's inode table, where memory per entry is what bounds a
//! mount with many worktrees.
//!
//! * [`InoMap`]: inode number → value. Values live in a slab (a `Vec` whose freed slots
//!   are reused), and a hash map holds only `inode → slot` (16 bytes a bucket). A
//!   `HashMap<u64, Node>` instead keeps whole values in its buckets: its load factor, its
//!   growth by doubling (old and new tables alive at once) and the tombstones that removals
//!   leave (which make it grow under churn even at a steady size) all multiply the value's
//!   size.
//! * [`ChildIndex`]: `(parent, name)` → inode without a copy of the name: the key is the
//!   parent and a 64-bit hash of the name, and the caller confirms the name against the
//!   node it already stores. Two names of one directory with the same hash (never seen in
//!   practice, but possible) go to a small exact map, and so does a second name of one
//!   inode (a hard link) whose hash equals that of its other name in the same directory,
//!   since one slot cannot tell two names of the same inode apart.

use crate::ino::Ino;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::hash::{BuildHasher, Hasher};
use std::os::unix::ffi::OsStrExt;

/// Inode number → `V`, values in a slab.
pub struct InoMap<V> {
    index: HashMap<Ino, u32>,
    slots: Vec<Option<V>>,
    free: Vec<u32>,
}

impl<V> Default for InoMap<V> {
    fn default() -> Self {
        InoMap {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<V> InoMap<V> {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    #[cfg(test)]
    pub fn get_or_insert_with(&mut self, ino: Ino, make: impl FnOnce() -> V) -> &mut V {
        if !self.index.contains_key(&ino) {
            self.insert(ino, make());
        }
        self.get_mut(&ino).expect("just inserted")
    }

    pub fn contains_key(&self, ino: &Ino) -> bool {
        self.index.contains_key(ino)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Ino> {
        self.index.keys()
    }

    pub fn get(&self, ino: &Ino) -> Option<&V> {
        let slot = *self.index.get(ino)?;
        self.slots[slot as usize].as_ref()
    }

    pub fn get_mut(&mut self, ino: &Ino) -> Option<&mut V> {
        let slot = *self.index.get(ino)?;
        self.slots[slot as usize].as_mut()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, ino: Ino, value: V) -> Option<V> {
        if let Some(&slot) = self.index.get(&ino) {
            return self.slots[slot as usize].replace(value);
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(value);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("more than 2^32 inodes");
                self.slots.push(Some(value));
                slot
            }
        };
        self.index.insert(ino, slot);
        None
    }

    pub fn remove(&mut self, ino: &Ino) -> Option<V> {
        let slot = self.index.remove(ino)?;
        let value = self.slots[slot as usize].take();
        self.free.push(slot);
        // Nothing in use: give the memory back, so a table that emptied does not keep
        // its peak.
        if self.free.len() == self.slots.len() {
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        value
    }
}

/// `(parent, name)` → inode, storing no name (see the module's text).
pub struct ChildIndex {
    hashed: HashMap<(Ino, u64), Ino>,
    /// Names whose `(parent, hash)` slot is taken by another name.
    colliding: HashMap<(Ino, OsString), Ino>,
    hasher: FixedSip,
    /// The hash's bits kept: all of them, but for tests of the colliding path.
    mask: u64,
}

impl Default for ChildIndex {
    fn default() -> Self {
        ChildIndex {
            hashed: HashMap::new(),
            colliding: HashMap::new(),
            hasher: FixedSip,
            mask: u64::MAX,
        }
    }
}

/// SipHash with fixed keys: names are hashed the same way for the life of the process.
#[derive(Default, Clone, Copy)]
struct FixedSip;

impl BuildHasher for FixedSip {
    type Hasher = std::collections::hash_map::DefaultHasher;
    fn build_hasher(&self) -> Self::Hasher {
        std::collections::hash_map::DefaultHasher::new()
    }
}

impl ChildIndex {
    /// An index whose hash keeps only `bits` bits, so that names collide (tests).
    #[cfg(test)]
    pub fn colliding_often(bits: u32) -> ChildIndex {
        ChildIndex {
            mask: (1u64 << bits) - 1,
            ..ChildIndex::default()
        }
    }

    pub fn hash(&self, name: &OsStr) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(name.as_bytes());
        h.finish() & self.mask
    }

    /// Maps `(parent, name)` exactly, outside the hashed slots: for a second name of an
    /// inode whose other name in `parent` has the same hash (one slot cannot tell them
    /// apart).
    pub fn insert_exact(&mut self, parent: Ino, name: &OsStr, ino: Ino) {
        self.colliding.insert((parent, name.to_os_string()), ino);
    }

    /// The inode at `(parent, name)`. `named(ino)` says whether that inode has this name
    /// in this parent (the caller's table holds the names).
    pub fn get(&self, parent: Ino, name: &OsStr, named: impl Fn(Ino) -> bool) -> Option<Ino> {
        if let Some(&ino) = self.hashed.get(&(parent, self.hash(name))) {
            if named(ino) {
                return Some(ino);
            }
        }
        if self.colliding.is_empty() {
            return None;
        }
        self.colliding.get(&(parent, name.to_os_string())).copied()
    }

    /// Maps `(parent, name)` to `ino`, replacing what it mapped to. `named` as for `get`,
    /// asked of the inode currently in the name's slot.
    pub fn insert(&mut self, parent: Ino, name: &OsStr, ino: Ino, named: impl Fn(Ino) -> bool) {
        let key = (parent, self.hash(name));
        match self.hashed.get(&key) {
            Some(&other) if other != ino && !named(other) => {
                // The slot belongs to another name with the same hash.
                self.colliding.insert((parent, name.to_os_string()), ino);
            }
            _ => {
                self.hashed.insert(key, ino);
                if !self.colliding.is_empty() {
                    self.colliding.remove(&(parent, name.to_os_string()));
                }
            }
        }
    }

    /// Unmaps `(parent, name)`; returns the inode it mapped to.
    pub fn remove(
        &mut self,
        parent: Ino,
        name: &OsStr,
        named: impl Fn(Ino) -> bool,
    ) -> Option<Ino> {
        // An exact entry first: its hashed slot, if any, may hold another name of the same
        // inode.
        if !self.colliding.is_empty() {
            if let Some(ino) = self.colliding.remove(&(parent, name.to_os_string())) {
                return Some(ino);
            }
        }
        let key = (parent, self.hash(name));
        if let Some(&ino) = self.hashed.get(&key) {
            if named(ino) {
                self.hashed.remove(&key);
                return Some(ino);
            }
        }
        None
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.hashed.len() + self.colliding.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_values_follow_their_inode() {
        let mut m = InoMap::default();
        for i in 0..100u64 {
            assert!(m.insert(Ino(i << 32 | 7), i).is_none());
        }
        assert_eq!(m.len(), 100);
        for i in (0..100u64).step_by(2) {
            assert_eq!(m.remove(&Ino(i << 32 | 7)), Some(i));
        }
        assert_eq!(m.remove(&Ino(7)), None, "removed already");
        for i in 100..150u64 {
            m.insert(Ino(i << 32 | 7), i);
        }
        assert_eq!(m.slots.len(), 100, "freed slots were not reused");
        for i in (1..100u64).step_by(2).chain(100..150) {
            assert_eq!(m.get(&Ino(i << 32 | 7)), Some(&i));
        }
        assert_eq!(m.insert(Ino(1 << 32 | 7), 1000), Some(1));
        *m.get_mut(&Ino(1 << 32 | 7)).unwrap() += 1;
        assert_eq!(m.get(&Ino(1 << 32 | 7)), Some(&1001));
        assert_eq!(*m.get_or_insert_with(Ino(5), || 55), 55);
        assert_eq!(*m.get_or_insert_with(Ino(5), || 66), 55);
        let keys: Vec<Ino> = m.index.keys().copied().collect();
        for k in keys {
            m.remove(&k);
        }
        assert!(m.is_empty());
        assert!(m.slots.is_empty(), "an empty table keeps no slots");
    }

    /// Names and their owners, as the view's node table would hold them.
    struct Names(HashMap<Ino, Vec<(Ino, OsString)>>);
    impl Names {
        fn named(&self, parent: Ino, name: &str) -> impl Fn(Ino) -> bool + '_ {
            let name = OsString::from(name);
            move |ino| {
                self.0
                    .get(&ino)
                    .is_some_and(|v| v.iter().any(|(p, n)| *p == parent && *n == name))
            }
        }
    }

    #[test]
    fn names_are_confirmed_by_their_owner_and_collisions_kept_apart() {
        let mut names = Names(HashMap::new());
        let mut c = ChildIndex::default();
        names.0.insert(Ino(10), vec![(Ino(1), "a".into())]);
        names.0.insert(
            Ino(11),
            vec![(Ino(1), "b".into()), (Ino(2), "b-link".into())],
        );
        c.insert(Ino(1), OsStr::new("a"), Ino(10), names.named(Ino(1), "a"));
        c.insert(Ino(1), OsStr::new("b"), Ino(11), names.named(Ino(1), "b"));
        c.insert(
            Ino(2),
            OsStr::new("b-link"),
            Ino(11),
            names.named(Ino(2), "b-link"),
        );
        assert_eq!(
            c.get(Ino(1), OsStr::new("a"), names.named(Ino(1), "a")),
            Some(Ino(10))
        );
        assert_eq!(
            c.get(Ino(2), OsStr::new("b-link"), names.named(Ino(2), "b-link")),
            Some(Ino(11))
        );
        assert_eq!(
            c.get(Ino(2), OsStr::new("a"), names.named(Ino(2), "a")),
            None
        );
        // A slot whose owner no longer has the name answers nothing.
        names.0.insert(Ino(10), vec![(Ino(1), "renamed".into())]);
        assert_eq!(
            c.get(Ino(1), OsStr::new("a"), names.named(Ino(1), "a")),
            None
        );
        names.0.insert(Ino(10), vec![(Ino(1), "a".into())]);

        // A collision: force one by hashing into a slot held by another name.
        let hb = c.hash(OsStr::new("b"));
        c.hashed.insert((Ino(3), hb), Ino(11)); // "b" of node 11 claims (3, hash(b))
        names
            .0
            .get_mut(&Ino(11))
            .unwrap()
            .push((Ino(3), "b".into()));
        names.0.insert(Ino(12), vec![(Ino(3), "other".into())]);
        // Pretend "other" hashes like "b": insert it into that slot's parent directly.
        let key_other = (Ino(3), c.hash(OsStr::new("other")));
        c.hashed.insert(key_other, Ino(11)); // slot taken by a node without that name
        c.insert(
            Ino(3),
            OsStr::new("other"),
            Ino(12),
            names.named(Ino(3), "other"),
        );
        assert_eq!(c.colliding.len(), 1, "went to the exact map");
        assert_eq!(
            c.get(Ino(3), OsStr::new("other"), names.named(Ino(3), "other")),
            Some(Ino(12))
        );
        assert_eq!(
            c.get(Ino(3), OsStr::new("b"), names.named(Ino(3), "b")),
            Some(Ino(11))
        );
        assert_eq!(
            c.remove(Ino(3), OsStr::new("other"), names.named(Ino(3), "other")),
            Some(Ino(12))
        );
        assert_eq!(
            c.get(Ino(3), OsStr::new("other"), names.named(Ino(3), "other")),
            None
        );
        assert_eq!(
            c.remove(Ino(1), OsStr::new("a"), names.named(Ino(1), "a")),
            Some(Ino(10))
        );
        assert_eq!(
            c.remove(Ino(1), OsStr::new("a"), names.named(Ino(1), "a")),
            None
        );
    }
}
