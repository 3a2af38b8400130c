//! What a checkpoint keeps of a worktree's submodule views, and a rewind puts back: their
//! records' say of where each view is shown (its path, after a move) and whether its
//! directory was removed. The superproject's names for them (a moved view's stub, the
//! whiteout over its gitlink) are in the upper layer, which the checkpoint keeps as it
//! keeps every name; a view's own files are its own layer's, which no checkpoint keeps
//! (`docs/design/checkpoints.md`).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{FsError, FsResult};
use super::view::View;
use super::worktree::WtCtx;
use crate::layout::submodules::{key_of, readable_records};
use crate::lifecycle::submodules as subs;

/// The file in a checkpoint's directory that holds them (absent: the worktree had no
/// submodule view then).
const FILE: &str = "submodules";

/// One view's record, as a checkpoint keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    /// Its directory's name under `subs/` (`key_of` the path it was made at).
    key: String,
    path: String,
    removed: bool,
}

impl View {
    /// Keeps, in the checkpoint directory `dir`, where `wt`'s submodule views are shown
    /// now (written before git's state of the checkpoint: a checkpoint whose git state is
    /// kept has these too). Taken under the worktree's lock on changes, which moves and
    /// removals of its views hold.
    pub(super) fn keep_submodule_records(&self, wt: &WtCtx, dir: &Path) -> FsResult<()> {
        let kept: Vec<Kept> = readable_records(&self.state.worktree_dir(wt.ident.id))
            .into_iter()
            .filter_map(|(d, r)| {
                Some(Kept {
                    key: d.file_name()?.to_string_lossy().into_owned(),
                    path: r.path,
                    removed: r.removed,
                })
            })
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&kept).map_err(|e| FsError::internal(e.to_string()))?;
        crate::durable::write_file_synced(&dir.join(FILE), &bytes)
            .map_err(|e| FsError::io("keeping the submodule views' records", e))
    }

    /// Puts `wt`'s submodule views' records back as the checkpoint directory `dir` kept
    /// them, with their git entries: a view made since is shown at the path it was made at
    /// again. Then the views in memory are found at those paths. Each record is written
    /// whole, so a rewind cut short and finished later writes the same.
    pub(super) fn restore_submodule_records(&self, wt: &WtCtx, dir: &Path) -> FsResult<()> {
        let kept: Vec<Kept> = match std::fs::read(dir.join(FILE)) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                FsError::eio(
                    format!("{}: {e}", dir.join(FILE).display()),
                    std::io::Error::other("checkpoint's submodule records"),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(FsError::io("reading the submodule views' records", e)),
        };
        let records = readable_records(&self.state.worktree_dir(wt.ident.id));
        if records.is_empty() {
            return Ok(());
        }
        let place = format!("{}/{}", wt.ident.repo, wt.ident.name);
        for (rdir, r) in records {
            let Some(key) = rdir.file_name().map(|k| k.to_string_lossy().into_owned()) else {
                continue;
            };
            let (path, removed) = match kept.iter().find(|k| k.key == key) {
                Some(k) => (k.path.clone(), k.removed),
                // Made since: at the checkpoint, its gitlink showed where it was made.
                None => match r.origin_of(&key) {
                    Some(origin) => (origin, false),
                    None => {
                        tracing::warn!(
                            "submodule view {place}/{}: made after the checkpoint by an older version, which did not record where; left where it is",
                            r.path
                        );
                        continue;
                    }
                },
            };
            if r.path != path || r.moving_from.is_some() {
                if let Err(e) = subs::move_view(
                    &self.state,
                    &self.mountpoint,
                    &place,
                    wt.ident.uid,
                    &rdir,
                    r.clone(),
                    &path,
                ) {
                    tracing::warn!("submodule view {place}/{}: {e:#}", r.path);
                }
            }
            if r.removed != removed {
                subs::set_removed(&rdir, removed).map_err(|e| {
                    FsError::eio(
                        format!("submodule view {place}/{path}: {e:#}"),
                        std::io::Error::other("submodule record"),
                    )
                })?;
            }
        }
        self.find_views_where_recorded(wt);
        Ok(())
    }

    /// Keys the submodule views in memory below `ctx` by the paths their records name
    /// now, as a move does (each keeps its context: never two over one layer).
    fn find_views_where_recorded(&self, ctx: &WtCtx) {
        let within = ctx.sub_path();
        let views: Vec<Arc<WtCtx>> = {
            let _moving = ctx.nested.moving.lock();
            let mut views = ctx.nested.views.lock();
            let all: Vec<(Vec<u8>, Arc<WtCtx>)> = views.drain().collect();
            for (was, sub) in all {
                let now = sub
                    .sub_origin()
                    .and_then(|origin| {
                        let rdir = self
                            .state
                            .subs(ctx.ident.id)
                            .join(key_of(origin.as_bytes()));
                        let b = std::fs::read(rdir.join("record")).ok()?;
                        serde_json::from_slice::<crate::layout::submodules::SubRecord>(&b).ok()
                    })
                    .map(|r| match &within {
                        Some(w) => r
                            .path
                            .strip_prefix(w.as_str())
                            .and_then(|p| p.strip_prefix('/'))
                            .unwrap_or(&r.path)
                            .as_bytes()
                            .to_vec(),
                        None => r.path.into_bytes(),
                    })
                    .unwrap_or(was);
                if let Some(of) = &sub.nested.of {
                    *of.path.lock() = now.clone();
                }
                views.insert(now, sub);
            }
            views.values().cloned().collect()
        };
        for sub in views {
            self.find_views_where_recorded(&sub);
        }
    }
}
