//! How long kept copies stay and how much free disk they leave (`mount
//! --keep-removed`, recorded for the commands that remove without the daemon), and the
//! disk a directory uses.

use std::fs;
use std::path::Path;

use crate::report::human_bytes;
use crate::store::{Store, StoreResult};

const META_KEEP_SECS: &str = "keep_removed_secs";
const META_MIN_FREE_PCT: &str = "keep_min_free_percent";
const META_MIN_FREE_BYTES: &str = "keep_min_free_bytes";

/// How long kept copies stay, and how much free disk they leave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepPolicy {
    /// 0: nothing is kept.
    pub keep_secs: i64,
    /// Kept copies give way while the state directory's disk has less than this share
    /// free (percent) …
    pub min_free_percent: f64,
    /// … or less than this many bytes free.
    pub min_free_bytes: u64,
}

impl Default for KeepPolicy {
    fn default() -> Self {
        KeepPolicy {
            keep_secs: 24 * 3600,
            min_free_percent: 5.0,
            min_free_bytes: 2 << 30,
        }
    }
}

impl KeepPolicy {
    /// The policy the last mount recorded (removals run by a command, without the daemon,
    /// keep by it too), else the defaults.
    pub fn of(store: &Store) -> KeepPolicy {
        let d = KeepPolicy::default();
        let get = |k: &str| store.meta_get(k).ok().flatten();
        KeepPolicy {
            keep_secs: get(META_KEEP_SECS)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.keep_secs),
            min_free_percent: get(META_MIN_FREE_PCT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.min_free_percent),
            min_free_bytes: get(META_MIN_FREE_BYTES)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.min_free_bytes),
        }
    }

    pub fn record(&self, store: &Store) -> StoreResult<()> {
        store.meta_set(META_KEEP_SECS, &self.keep_secs.to_string())?;
        store.meta_set(META_MIN_FREE_PCT, &self.min_free_percent.to_string())?;
        store.meta_set(META_MIN_FREE_BYTES, &self.min_free_bytes.to_string())
    }

    pub fn keeps(&self) -> bool {
        self.keep_secs > 0
    }

    /// Why the disk at `path` is too full for kept copies, if it is.
    pub fn low_disk(&self, path: &Path) -> Option<String> {
        let st = nix::sys::statvfs::statvfs(path).ok()?;
        let unit = st.fragment_size().max(1) as u64;
        let free = st.blocks_available() as u64 * unit;
        let total = st.blocks() as u64 * unit;
        let below_share = (free as f64) < total as f64 * self.min_free_percent / 100.0;
        (below_share || free < self.min_free_bytes).then(|| {
            format!(
                "the state directory's disk has {} free of {} (kept copies give way below {}% or {} free)",
                human_bytes(free),
                human_bytes(total),
                self.min_free_percent,
                human_bytes(self.min_free_bytes)
            )
        })
    }
}

/// Disk used by everything below `dir` (never following a symlink).
pub fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut n = m.blocks() * 512;
    if m.is_dir() {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            n += disk_usage(&e.path());
        }
    }
    n
}
