//! What a checkpoint keeps of a worktree's submodule views, and a rewind puts back: their
//! records' say of where each view is shown (its path, after a move) and whether its
//! directory was removed. The superproject's names for them (a moved view's stub, the
//! whiteout over its gitlink) are in the upper layer, which the checkpoint keeps as it
//! keeps every name; a view's own files are its own layer's, which no checkpoint keeps
//! (`docs/design/checkpoints.md`). So only the worktree's own views are put back: a
//! nested view's names are in its parent view's layer, which the rewind leaves as it is.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{FsError, FsResult};
use super::view::View;
use super::worktree::WtCtx;
use crate::layout::submodules::{key_of, readable_records};
use crate::lifecycle::submodules as subs;

/// The file in a checkpoint's directory that holds them, written for a worktree that
/// shows submodule views (absent for one that does not, which has none, and in a
/// checkpoint of a version that kept none: a rewind to it leaves the records as they
/// are).
const FILE: &str = "submodules";

/// A change a rewind makes to one view's record.
struct Planned {
    dir: std::path::PathBuf,
    record: crate::layout::submodules::SubRecord,
    path: String,
    removed: bool,
}

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
        if !wt.nested.shown {
            return Ok(());
        }
        let kept: Vec<Kept> = readable_records(&self.state.worktree_dir(wt.ident.id))
            .into_iter()
            .filter(|(_, r)| r.within.is_none())
            .filter_map(|(d, r)| {
                Some(Kept {
                    key: d.file_name()?.to_string_lossy().into_owned(),
                    path: r.path,
                    removed: r.removed,
                })
            })
            .collect();
        let bytes = serde_json::to_vec(&kept).map_err(|e| FsError::internal(e.to_string()))?;
        crate::durable::write_file_synced(&dir.join(FILE), &bytes)
            .map_err(|e| FsError::io("keeping the submodule views' records", e))
    }

    /// Puts `wt`'s own submodule views' records back as the checkpoint directory `dir`
    /// kept them, with their git entries: a view made since is shown at the path it was
    /// made at again. Then the views in memory are found at those paths. Returns the
    /// paths a view moved from and to (the kernel and the node table look them up again).
    /// Each record is written whole, so a rewind cut short and finished later writes the
    /// same; a failure fails the rewind, which stays marked unfinished.
    pub(super) fn restore_submodule_records(
        &self,
        wt: &WtCtx,
        dir: &Path,
    ) -> FsResult<Vec<Vec<u8>>> {
        let kept: Vec<Kept> = match std::fs::read(dir.join(FILE)) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                FsError::eio(
                    format!("{}: {e}", dir.join(FILE).display()),
                    std::io::Error::other("checkpoint's submodule records"),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(FsError::io("reading the submodule views' records", e)),
        };
        let planned = self.planned_moves(wt, &kept);
        if planned.is_empty() {
            return Ok(Vec::new());
        }
        let place = format!("{}/{}", wt.ident.repo, wt.ident.name);
        let failed = |path: &str, e: String| {
            FsError::eio(
                format!("submodule view {place}/{path}: {e}"),
                std::io::Error::other("submodule record"),
            )
        };
        let mut paths = Vec::new();
        for m in planned {
            if m.record.path != m.path || m.record.moving_from.is_some() {
                paths.push(m.record.path.clone().into_bytes());
                paths.push(m.path.clone().into_bytes());
                subs::move_view(
                    &self.state,
                    &self.mountpoint,
                    &place,
                    wt.ident.uid,
                    &m.dir,
                    m.record.clone(),
                    &m.path,
                )
                .map_err(|e| failed(&m.record.path, format!("{e:#}")))?;
            }
            if m.record.removed != m.removed {
                subs::set_removed(&m.dir, m.removed)
                    .map_err(|e| failed(&m.path, format!("{e:#}")))?;
            }
        }
        self.find_views_where_recorded(wt);
        Ok(paths)
    }

    /// What a rewind to a checkpoint that kept `kept` changes of `wt`'s own views'
    /// records: each that differs, with its path and removed mark then.
    fn planned_moves(&self, wt: &WtCtx, kept: &[Kept]) -> Vec<Planned> {
        let mut out = Vec::new();
        for (rdir, r) in readable_records(&self.state.worktree_dir(wt.ident.id)) {
            if r.within.is_some() {
                continue;
            }
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
                            "submodule view {}/{}/{}: made after the checkpoint by an older version, which did not record where; left where it is",
                            wt.ident.repo,
                            wt.ident.name,
                            r.path
                        );
                        continue;
                    }
                },
            };
            if r.path != path || r.moving_from.is_some() || r.removed != removed {
                out.push(Planned {
                    dir: rdir,
                    record: r,
                    path,
                    removed,
                });
            }
        }
        out
    }

    /// Refuses a rewind to checkpoint directory `dir` of `wt` that would move a view with
    /// views of its own: their records name paths inside it, which a move of it does not
    /// follow (a rename of such a view is refused too).
    pub(super) fn refuse_moving_nested_views(&self, wt: &WtCtx, dir: &Path) -> FsResult<()> {
        let kept: Vec<Kept> = match std::fs::read(dir.join(FILE)) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => return Ok(()),
        };
        let records = readable_records(&self.state.worktree_dir(wt.ident.id));
        for m in self.planned_moves(wt, &kept) {
            if m.record.path == m.path {
                continue;
            }
            let inside = format!("{}/", m.record.path);
            if records.iter().any(|(_, r)| {
                !r.removed
                    && r.within
                        .as_deref()
                        .is_some_and(|w| w == m.record.path || w.starts_with(&inside))
            }) {
                return Err(FsError::new(
                    super::error::ErrorKind::Busy,
                    format!(
                        "submodule view {} has submodule views of its own, which a rewind to this checkpoint cannot move back with it to {}; deinitialize them first (`git -C {} submodule deinit --all`), or rewind to another checkpoint",
                        m.record.path, m.path, m.record.path
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Keys `wt`'s own submodule views in memory by the paths their records name now,
    /// as a move does (each keeps its context: never two over one layer).
    fn find_views_where_recorded(&self, wt: &WtCtx) {
        let _moving = wt.nested.moving.lock();
        let mut views = wt.nested.views.lock();
        let all: Vec<(Vec<u8>, Arc<WtCtx>)> = views.drain().collect();
        for (was, sub) in all {
            let now = sub
                .sub_origin()
                .and_then(|origin| {
                    let rdir = self.state.subs(wt.ident.id).join(key_of(origin.as_bytes()));
                    let b = std::fs::read(rdir.join("record")).ok()?;
                    serde_json::from_slice::<crate::layout::submodules::SubRecord>(&b).ok()
                })
                .map(|r| r.path.into_bytes())
                .unwrap_or(was);
            if let Some(of) = &sub.nested.of {
                *of.path.lock() = now.clone();
            }
            views.insert(now, sub);
        }
    }
}
