//! Warm snapshots (`git::warm`) and the patterns that say what they hold.

use rusqlite::{params, OptionalExtension};

use super::{now_secs, Store};

#[derive(Debug, Clone, serde::Serialize)]
pub struct WarmRow {
    pub id: i64,
    pub repo_id: i64,
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
    pub repo_id: i64,
    pub uid: u32,
    pub manifest: &'a str,
    pub files: u64,
    pub bytes: u64,
    pub took_ms: u64,
    pub skipped: u64,
}

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
    pub fn add_warm(&mut self, w: &NewWarm<'_>) -> rusqlite::Result<i64> {
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

    pub fn warm(&self, id: i64) -> rusqlite::Result<Option<WarmRow>> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM warm_snapshots WHERE id = ?1"),
                [id],
                from_row,
            )
            .optional()
    }

    /// The newest snapshot of repository `repo_id` taken with `uid`'s permissions.
    pub fn latest_warm(&self, repo_id: i64, uid: u32) -> rusqlite::Result<Option<WarmRow>> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM warm_snapshots WHERE repo_id = ?1 AND uid = ?2
                     ORDER BY id DESC LIMIT 1"
                ),
                params![repo_id, uid],
                from_row,
            )
            .optional()
    }

    /// Sets repository `id`'s include patterns and whether `new` is warm by default.
    pub fn set_repo_warm(
        &self,
        id: i64,
        include: Option<&[String]>,
        warm_default: Option<bool>,
    ) -> rusqlite::Result<()> {
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
}
