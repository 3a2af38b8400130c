//! Each worktree's block of ports (`lifecycle::ports` allocates them).

use rusqlite::{params, OptionalExtension};

use super::{Store, StoreResult, DELETING, REMOVED};
use crate::ids::WorktreeId;

/// A block of ports: `size` of them from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PortBlock {
    pub first: u16,
    pub size: u16,
}

impl PortBlock {
    /// Whether it shares a port with `other`.
    pub fn overlaps(&self, other: &PortBlock) -> bool {
        let end = |b: &PortBlock| b.first as u32 + b.size as u32;
        (self.first as u32) < end(other) && (other.first as u32) < end(self)
    }

    /// Whether `port` is one of its.
    pub fn holds(&self, port: u16) -> bool {
        port >= self.first && (port as u32) < self.first as u32 + self.size as u32
    }
}

impl Store {
    /// Records worktree `id`'s block (replacing any it had).
    pub fn set_ports(&self, id: WorktreeId, block: PortBlock) -> StoreResult<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO ports(worktree_id, first, size) VALUES (?1, ?2, ?3)",
            params![id, block.first, block.size],
        )?;
        Ok(())
    }

    /// Worktree `id`'s block, if it has one (a removed worktree keeps the record of the
    /// one it had, for a restore to ask for it back).
    pub fn ports_of(&self, id: WorktreeId) -> StoreResult<Option<PortBlock>> {
        Ok(self
            .conn
            .query_row(
                "SELECT first, size FROM ports WHERE worktree_id = ?1",
                [id],
                |r| {
                    Ok(PortBlock {
                        first: r.get(0)?,
                        size: r.get(1)?,
                    })
                },
            )
            .optional()?)
    }

    /// The worktrees neither removed nor being removed that have no block (made before
    /// blocks were given, or when none was free).
    pub fn live_without_ports(&self) -> StoreResult<Vec<WorktreeId>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT w.id FROM worktrees w LEFT JOIN ports p ON p.worktree_id = w.id
             WHERE p.worktree_id IS NULL AND w.state NOT IN ('{REMOVED}', '{DELETING}')
             ORDER BY w.id"
        ))?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The blocks of every worktree not removed.
    pub fn live_ports(&self) -> StoreResult<Vec<(WorktreeId, PortBlock)>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT p.worktree_id, p.first, p.size FROM ports p
             JOIN worktrees w ON w.id = p.worktree_id WHERE w.state != '{REMOVED}'"
        ))?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                PortBlock {
                    first: r.get(1)?,
                    size: r.get(2)?,
                },
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block is recorded, read back, and counts as live until its worktree is removed.
    #[test]
    fn a_block_lives_with_its_worktree() {
        let (_d, mut store, id) = crate::store::tests::store_with_worktree();
        assert_eq!(store.ports_of(id).unwrap(), None);
        let b = PortBlock {
            first: 20010,
            size: 10,
        };
        store.set_ports(id, b).unwrap();
        assert_eq!(store.ports_of(id).unwrap(), Some(b));
        assert_eq!(store.live_ports().unwrap(), vec![(id, b)]);
        store.mark_removed(id, "test").unwrap();
        assert!(store.live_ports().unwrap().is_empty());
        assert_eq!(store.ports_of(id).unwrap(), Some(b), "kept for a restore");
        // Unregistering the repository takes the records of its removed worktrees.
        let repo = store.worktree_by_id(id).unwrap().unwrap().repo_id;
        store.remove_repo(repo).unwrap();
        assert_eq!(store.ports_of(id).unwrap(), None);
        assert!(b.overlaps(&PortBlock {
            first: 20019,
            size: 5
        }));
        assert!(!b.overlaps(&PortBlock {
            first: 20020,
            size: 5
        }));
        assert!(b.holds(20019) && !b.holds(20020) && !b.holds(20009));
    }
}
