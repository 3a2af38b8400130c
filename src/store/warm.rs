//! Warm snapshots (`git::warm`) and the patterns that say what they hold.

use rusqlite::{params, OptionalExtension};

use super::{now_secs, Store, StoreResult};
use crate::ids::RepoId;

#[derive(Debug, Clone, serde::Serialize)]
pub struct WarmRow {
    pub id: i64,
    pub repo_id: RepoId,
    /// Whose permissions it was taken with.
    pub uid: u32,
    pub taken_at: i64,
    /// Its manifest's file name in `<state>/warm/`.
    pub manifest: String,
    pub files: u64,
    pub bytes: u64,
    pub took_ms: u64,
    pub skipped: u64,
}

pub struct NewWarm<'a> {
    pub repo_id: RepoId,
    pub uid: u32,
    pub manifest: &'a str,
    pub files: u64,
    pub bytes: u64,
    pub took_ms: u64,
    pub skipped: u64,
}

/// A snapshot `s` nothing needs: see [`Store::prune_warm`].
const PRUNABLE: &str = "EXISTS (SELECT 1 FROM warm_snapshots n
         WHERE n.repo_id = s.repo_id AND n.uid = s.uid AND n.id > s.id)
     AND NOT EXISTS (SELECT 1 FROM worktrees w WHERE w.warm = s.id
         AND (w.state != 'removed' OR EXISTS (SELECT 1 FROM kept k WHERE k.worktree_id = w.id)))";

const COLUMNS: &str = "id, repo_id, uid, taken_at, manifest, files, bytes, took_ms, skipped";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WarmRow> {
    Ok(WarmRow {
        id: r.get(0)?,
        repo_id: r.get(1)?,
        uid: r.get(2)?,
        taken_at: r.get(3)?,
        manifest: r.get(4)?,
        files: r.get::<_, i64>(5)? as u64,
        bytes: r.get::<_, i64>(6)? as u64,
        took_ms: r.get::<_, i64>(7)? as u64,
        skipped: r.get::<_, i64>(8)? as u64,
    })
}

impl Store {
    /// Records a snapshot taken (its manifest already in place), with an event.
    pub fn add_warm(&mut self, w: &NewWarm<'_>) -> StoreResult<i64> {
        let tx = self.conn.transaction()?;
        let now = now_secs();
        tx.execute(
            "INSERT INTO warm_snapshots(repo_id, uid, taken_at, manifest, files, bytes, took_ms, skipped)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                w.repo_id,
                w.uid,
                now,
                w.manifest,
                w.files as i64,
                w.bytes as i64,
                w.took_ms as i64,
                w.skipped as i64
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute(
            "INSERT INTO events(at, worktree_id, kind, reason) VALUES (?1, NULL, 'warm-snapshot', ?2)",
            params![
                now,
                format!(
                    "snapshot {id} of repository {}: {} files, {} bytes, {} skipped, {} ms",
                    w.repo_id, w.files, w.bytes, w.skipped, w.took_ms
                )
            ],
        )?;
        tx.commit()?;
        Ok(id)
    }

    /// Whether a snapshot is [prunable](Store::prune_warm): a cheap look, for a sweep.
    pub fn has_prunable_warm(&self) -> StoreResult<bool> {
        Ok(self.conn.query_row(
            &format!("SELECT EXISTS (SELECT 1 FROM warm_snapshots s WHERE {PRUNABLE})"),
            [],
            |r| r.get(0),
        )?)
    }

    /// Deletes, with an event each, the snapshots nothing needs any more: a newer one of
    /// the same repository and user exists (the newest is what the next `new --warm`
    /// shows), and no worktree shows it — none that is not removed, nor a removed one
    /// whose copy is kept for a restore. One transaction: a creation that records a
    /// worktree of a snapshot checks in its own that the snapshot is still there
    /// ([`Store::finish_creation`]), so a worktree never names a deleted one.
    pub fn prune_warm(&mut self) -> StoreResult<Vec<WarmRow>> {
        // Immediate: a creation committed between the read and the deletes would fail
        // the upgrade to a write (BUSY_SNAPSHOT), not wait for it.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let rows: Vec<WarmRow> = tx
            .prepare(&format!(
                "SELECT {COLUMNS} FROM warm_snapshots s WHERE {PRUNABLE} ORDER BY id"
            ))?
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        let now = now_secs();
        for w in &rows {
            tx.execute("DELETE FROM warm_snapshots WHERE id = ?1", [w.id])?;
            tx.execute(
                "INSERT INTO events(at, worktree_id, kind, reason) VALUES (?1, NULL, 'warm-pruned', ?2)",
                params![
                    now,
                    format!(
                        "snapshot {} of repository {} (uid {}): a newer one was taken and no worktree shows it",
                        w.id, w.repo_id, w.uid
                    )
                ],
            )?;
        }
        tx.commit()?;
        Ok(rows)
    }

    /// Every snapshot.
    pub fn warm_all(&self) -> StoreResult<Vec<WarmRow>> {
        Ok(self
            .conn
            .prepare(&format!("SELECT {COLUMNS} FROM warm_snapshots ORDER BY id"))?
            .query_map([], from_row)?
            .collect::<rusqlite::Result<_>>()?)
    }

    pub fn warm(&self, id: i64) -> StoreResult<Option<WarmRow>> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM warm_snapshots WHERE id = ?1"),
                [id],
                from_row,
            )
            .optional()?)
    }

    /// The newest snapshot of repository `repo_id` taken with `uid`'s permissions.
    pub fn latest_warm(&self, repo_id: RepoId, uid: u32) -> StoreResult<Option<WarmRow>> {
        Ok(self
            .conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM warm_snapshots WHERE repo_id = ?1 AND uid = ?2
                     ORDER BY id DESC LIMIT 1"
                ),
                params![repo_id, uid],
                from_row,
            )
            .optional()?)
    }

    /// Sets repository `id`'s include patterns and whether `new` is warm by default.
    pub fn set_repo_warm(
        &self,
        id: RepoId,
        include: Option<&[String]>,
        warm_default: Option<bool>,
    ) -> StoreResult<()> {
        if let Some(include) = include {
            self.conn.execute(
                "UPDATE repos SET include = ?2 WHERE id = ?1",
                params![id, include.join("\n")],
            )?;
        }
        if let Some(d) = warm_default {
            self.conn.execute(
                "UPDATE repos SET warm_default = ?2 WHERE id = ?1",
                params![id, d],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_newest_snapshot_of_the_user_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let repo = store
            .add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        assert!(repo.include.is_empty() && !repo.warm_default);
        let new = |uid, manifest| NewWarm {
            repo_id: repo.id,
            uid,
            manifest,
            files: 2,
            bytes: 3,
            took_ms: 4,
            skipped: 0,
        };
        let a = store.add_warm(&new(1000, "a")).unwrap();
        let b = store.add_warm(&new(1000, "b")).unwrap();
        store.add_warm(&new(0, "c")).unwrap();
        assert!(a < b);
        assert_eq!(
            store.latest_warm(repo.id, 1000).unwrap().unwrap().manifest,
            "b"
        );
        assert!(store.latest_warm(repo.id, 7).unwrap().is_none());
        store
            .set_repo_warm(
                repo.id,
                Some(&["node_modules/".into(), ".env".into()]),
                Some(true),
            )
            .unwrap();
        let repo = store.repo_by_id(repo.id).unwrap().unwrap();
        assert_eq!(repo.include, vec!["node_modules/", ".env"]);
        assert!(repo.warm_default);
        store.remove_repo(repo.id).unwrap();
        assert!(store.warm(a).unwrap().is_none());
    }

    #[test]
    fn a_snapshot_goes_once_superseded_and_shown_by_no_worktree_nor_kept_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let repo = store
            .add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        let add = |store: &mut Store, uid, manifest| {
            store
                .add_warm(&NewWarm {
                    repo_id: repo.id,
                    uid,
                    manifest,
                    files: 1,
                    bytes: 1,
                    took_ms: 1,
                    skipped: 0,
                })
                .unwrap()
        };
        let worktree = |store: &mut Store, name: &'static str, warm| {
            store.insert_worktree(&crate::store::NewWorktree {
                repo_id: repo.id,
                name,
                branch: Some(name),
                branch_created: true,
                base_commit: "c",
                base_tree: "t",
                base_mtime: 1,
                uid: 0,
                gid: 0,
                admin_name: name,
                warm,
            })
        };
        let ids = |rows: Vec<WarmRow>| rows.iter().map(|w| w.id).collect::<Vec<_>>();
        let a = add(&mut store, 0, "a");
        let other_user = add(&mut store, 1000, "u");
        // The newest of each user stays, shown or not.
        assert!(!store.has_prunable_warm().unwrap());
        assert!(store.prune_warm().unwrap().is_empty());
        let shown = worktree(&mut store, "w", Some(a)).unwrap();
        let b = add(&mut store, 0, "b");
        // Superseded, but shown by a worktree.
        assert!(store.prune_warm().unwrap().is_empty());
        // Removed with a kept copy (restorable): still needed.
        store
            .mark_removed_kept(
                shown,
                "test",
                &crate::store::NewKept {
                    bytes: 0,
                    head: "ref: refs/heads/w".into(),
                    tip: None,
                    tip_ref: None,
                    how: "test".into(),
                },
            )
            .unwrap();
        assert!(!store.has_prunable_warm().unwrap());
        store.drop_kept(shown, "test").unwrap();
        assert!(store.has_prunable_warm().unwrap());
        assert_eq!(ids(store.prune_warm().unwrap()), vec![a]);
        assert_eq!(ids(store.warm_all().unwrap()), vec![other_user, b]);
        assert!(store
            .events(0, 100)
            .unwrap()
            .iter()
            .any(|e| e.kind == "warm-pruned"));
        // A creation that picked the pruned one records nothing.
        assert_eq!(
            worktree(&mut store, "late", Some(a)).unwrap_err().kind(),
            super::super::ErrorKind::NotFound
        );
        assert!(store.worktree("r", "late").unwrap().is_none());
        worktree(&mut store, "on-time", Some(b)).unwrap();
    }
}
