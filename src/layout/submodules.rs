//! A worktree's submodule views on disk, in the worktree's own directory
//! (`<state>/worktrees/<id>/subs/<key>/`): `record` (JSON, written first: what was made,
//! so cleanup and a crash find it), `upper/` and `work/` (its layers, in the upper
//! layer's format), `conversions`; and the stub a moved view leaves in the upper layer
//! (`SUBMODULE_MARKER`). Made and removed by `lifecycle::submodules`, served by
//! `fs/submodule.rs`.

use std::fs;
use std::path::{Path, PathBuf};

use git2::Oid;
use serde::{Deserialize, Serialize};

/// One submodule's view, as recorded when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRecord {
    /// Its path in the worktree (a nested submodule's: from the worktree's root too).
    pub path: String,
    /// For a submodule's own submodule: the path (in the worktree) of the submodule view
    /// it is in.
    #[serde(default)]
    pub within: Option<String>,
    /// Its name in `.gitmodules`.
    pub name: String,
    /// Its repository (`<gitdir>/modules/<name>`).
    pub gitdir: PathBuf,
    /// Its git admin entry's name in that repository's `worktrees/`.
    pub admin_name: String,
    /// The commit the superproject records, and its tree.
    pub commit: String,
    pub tree: String,
    /// The stat time of its untouched entries (the commit's time).
    pub base_mtime: i64,
    /// Its directory was removed from the worktree (`git rm`, `git submodule deinit`,
    /// `rm -r`): no longer shown; its git entry stays, with any commit made in it, until
    /// the worktree goes.
    #[serde(default)]
    pub removed: bool,
    /// While it is moved (see `lifecycle::submodules::move_view`): the path it was at, which its git entry may
    /// still name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_from: Option<String>,
    /// The path (in the worktree) it was made at, which names its directory (`key_of`);
    /// absent in records of versions before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

impl SubRecord {
    /// The path it was made at: recorded, or for an older record one of the paths it
    /// names whose key is its directory's `key` (None when it moved on from there).
    pub fn origin_of(&self, key: &str) -> Option<String> {
        self.origin.clone().or_else(|| {
            std::iter::once(&self.path)
                .chain(&self.moving_from)
                .find(|p| key_of(p.as_bytes()) == key)
                .cloned()
        })
    }
}

/// The name of a submodule's directory under `subs/`: from its path.
pub fn key_of(path: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(path)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every submodule view recorded in the worktree directory `dir` (live or parked), with
/// its directory. Fails, naming what, when a view cannot be read back (an unreadable or
/// unparsable record, or layers with no record): cleanup then keeps the worktree.
pub fn records(dir: &Path) -> Result<Vec<(PathBuf, SubRecord)>, String> {
    let subs = dir.join("subs");
    let entries = match fs::read_dir(&subs) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("listing {}: {e}", subs.display())),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("listing {}: {e}", subs.display()))?;
        let record = e.path().join("record");
        match fs::read(&record) {
            Ok(bytes) => {
                let r: SubRecord = serde_json::from_slice(&bytes)
                    .map_err(|err| format!("{} cannot be read: {err}", record.display()))?;
                out.push((e.path(), r));
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                // Made before its record (never, by construction) or half removed: its
                // layers are kept if they hold anything.
                let upper_empty = fs::read_dir(e.path().join("upper"))
                    .map(|mut d| d.next().is_none())
                    .unwrap_or(true);
                if !upper_empty {
                    return Err(format!("{} holds files but no record", e.path().display()));
                }
            }
            Err(err) => return Err(format!("reading {}: {err}", record.display())),
        }
    }
    out.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    Ok(out)
}

/// As `records`, keeping what can be read (for repointing and removing git entries).
pub fn readable_records(dir: &Path) -> Vec<(PathBuf, SubRecord)> {
    fs::read_dir(dir.join("subs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let bytes = fs::read(e.path().join("record")).ok()?;
            Some((e.path(), serde_json::from_slice(&bytes).ok()?))
        })
        .collect()
}

/// A path in a view `within` a submodule's (or the worktree's, for None) as a path in the
/// worktree.
pub fn full_path(within: Option<&str>, path: &str) -> String {
    match within {
        Some(w) => format!("{w}/{path}"),
        None => path.to_string(),
    }
}

/// What a moved submodule view's stub (`layout::SUBMODULE_MARKER`) says: the path (in
/// the view it is in) it was made at, which names its record, and the commit its gitlink
/// there records.
pub fn stub_text(origin: &[u8], commit: Oid) -> Vec<u8> {
    let mut v = format!("{commit}\n").into_bytes();
    v.extend_from_slice(origin);
    v
}

/// The origin and commit of a stub (see [`stub_text`]).
pub fn parse_stub(b: &[u8]) -> Option<(Vec<u8>, Oid)> {
    let (commit, origin) = b.split_at(b.iter().position(|&c| c == b'\n')?);
    let commit = Oid::from_str(std::str::from_utf8(commit).ok()?).ok()?;
    let origin = &origin[1..];
    (!origin.is_empty()).then(|| (origin.to_vec(), commit))
}
