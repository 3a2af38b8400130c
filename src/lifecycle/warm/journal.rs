//! A take's journal (`<state>/warm/<manifest>.taking`): each content it puts in the
//! cache written down first, for a prune to delete if the take fails or dies.

use std::fs;
use std::path::PathBuf;

use git2::Oid;

use crate::lifecycle::error::{Context, LifecycleResult};
use crate::state::StateDir;

use super::cache::JOURNAL;

/// A take's journal, open for appending.
pub(super) struct Journal {
    pub(super) path: PathBuf,
    pub(super) file: fs::File,
}

impl Journal {
    pub(super) fn create(state: &StateDir, manifest: &str) -> LifecycleResult<Journal> {
        fs::create_dir_all(state.warm())?;
        let path = state.warm().join(format!("{manifest}{JOURNAL}"));
        let file = fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Journal { path, file })
    }

    /// Writes `oid` down, before its content is placed (a crash between the two leaves a
    /// line for a content that is not there: harmless).
    pub(super) fn note(&mut self, oid: Oid) -> LifecycleResult<()> {
        use std::io::Write;
        self.file
            .write_all(format!("{oid}\n").as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}
