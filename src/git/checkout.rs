//! Which files of a tree a checkout converts: decided once per tree (and configuration)
//! when its index is built, kept beside the cached index, and linked into each worktree
//! made from it, so a view serves what `git worktree add` would write.
//!
//! A repository whose attributes cannot call for a conversion (no `.gitattributes` that
//! says `eol=crlf`, `ident`, a configured `filter=`, an encoding; no `core.autocrlf`)
//! costs one scan of its attribute files; otherwise `git check-attr` is asked once about
//! every file of the tree. Converted paths get index entries whose size makes git look at
//! their content (0), or, for LFS pointers, the size of the file they stand for.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::convert::{
    classify, clean_turns_crlf, has_crlf, lfs_pointer_size, may_clean, may_convert,
    may_not_round_trip, round_trip_changes, AutoCrlf, Conv, ConvConfig,
};
use super::filters::{check_attrs, Owner};
use super::index::IndexEntry;
use super::{MODE_BLOB, MODE_EXEC};

const MAGIC_1: &[u8] = b"worktreefs conversions 1\n";
const MAGIC: &[u8] = b"worktreefs conversions 2\n";

/// The converted files of one tree, by path.
#[derive(Debug, Default)]
pub struct Conversions {
    /// What the decisions were made with (see `Setting::fingerprint`).
    pub fingerprint: String,
    by_path: HashMap<Vec<u8>, (Oid, Conv)>,
    /// Files whose blob does not survive a checkout and a clean (a CRLF blob under `text
    /// eol=crlf`, a foreign `$Id: … $` under `ident`, a blob a clean filter changes): git
    /// lists them as modified once it looks at them, as it does in a checkout whose
    /// files were touched. Their index entries carry no size (git reads them).
    dirty: HashMap<Vec<u8>, Oid>,
}

impl Conversions {
    pub fn get(&self, path: &[u8]) -> Option<&Conv> {
        self.by_path.get(path).map(|(_, c)| c)
    }

    pub fn is_empty(&self) -> bool {
        self.by_path.is_empty() && self.dirty.is_empty()
    }

    /// The paths whose blob a checkout and a clean do not give back.
    pub fn dirty(&self) -> impl Iterator<Item = &[u8]> {
        self.dirty.keys().map(Vec::as_slice)
    }

    /// Whether `path`'s blob does not survive a checkout and a clean.
    pub fn is_dirty(&self, path: &[u8]) -> bool {
        self.dirty.contains_key(path)
    }

    pub fn len(&self) -> usize {
        self.by_path.len()
    }

    /// The blobs of converted and dirty paths (their index entries carry no blob size).
    pub fn oids(&self) -> HashSet<Oid> {
        self.by_path
            .values()
            .map(|(o, _)| *o)
            .chain(self.dirty.values().copied())
            .collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.push(b'\n');
        let mut paths: Vec<_> = self.by_path.iter().collect();
        paths.sort_by(|a, b| a.0.cmp(b.0));
        for (path, (oid, conv)) in paths {
            out.extend_from_slice(path);
            out.push(0);
            out.extend_from_slice(format!("{oid} {}", conv.encode()).as_bytes());
            out.push(0);
        }
        // An empty path ends the converted ones; the dirty ones follow.
        out.push(0);
        let mut dirty: Vec<_> = self.dirty.iter().collect();
        dirty.sort();
        for (path, oid) in dirty {
            out.extend_from_slice(path);
            out.push(0);
            out.extend_from_slice(oid.to_string().as_bytes());
            out.push(0);
        }
        out
    }

    /// A worktree's list, written at its creation at `path`: None where it has none (no
    /// file); an error of kind `InvalidData` where the file is no such list.
    pub fn read(path: &std::path::Path) -> std::io::Result<Option<Conversions>> {
        match std::fs::read(path) {
            Ok(bytes) => Conversions::decode(&bytes).map(Some).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is not a list of conversions", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn decode(bytes: &[u8]) -> Option<Conversions> {
        // A list of the first format has no dirty paths.
        let rest = bytes
            .strip_prefix(MAGIC)
            .or_else(|| bytes.strip_prefix(MAGIC_1))?;
        let nl = rest.iter().position(|&b| b == b'\n')?;
        let fingerprint = String::from_utf8(rest[..nl].to_vec()).ok()?;
        let mut fields = rest[nl + 1..].split(|&b| b == 0);
        let mut by_path = HashMap::new();
        while let Some(path) = fields.next() {
            if path.is_empty() {
                break;
            }
            let spec = std::str::from_utf8(fields.next()?).ok()?;
            let (oid, conv) = spec.split_once(' ')?;
            by_path.insert(
                path.to_vec(),
                (Oid::from_str(oid).ok()?, Conv::parse(conv)?),
            );
        }
        let mut dirty = HashMap::new();
        while let Some(path) = fields.next() {
            if path.is_empty() {
                break;
            }
            let oid = std::str::from_utf8(fields.next()?).ok()?;
            dirty.insert(path.to_vec(), Oid::from_str(oid).ok()?);
        }
        Some(Conversions {
            fingerprint,
            by_path,
            dirty,
        })
    }
}

/// The blobs whose sizes the cached index at `index_path` does not hold (its converted
/// files), from the list beside it.
pub fn converted_oids_beside(index_path: &Path) -> HashSet<Oid> {
    std::fs::read(index_path.with_extension("conv"))
        .ok()
        .and_then(|b| Conversions::decode(&b))
        .map(|c| c.oids())
        .unwrap_or_default()
}

/// What the decisions depend on besides the tree: the owner's configuration (read by git
/// running as the owner) and the attribute files outside the tree (known by their stat
/// data here; git reads them, as the owner).
pub struct Setting {
    pub owner: Owner,
    pub config: ConvConfig,
    extra: Vec<(PathBuf, u64, i64, i64)>,
    /// The repository belongs to the owner or to root, so the filter drivers its own
    /// configuration names may run as the owner. Otherwise (a repository of someone else,
    /// as git's `safe.directory` check would refuse it) nothing runs that the repository
    /// could name: its drivers are left out, and no conversion needs git.
    pub trusted: bool,
    /// Conversions can be decided and made (git reads attributes from a tree, git 2.40,
    /// and the configuration could be read).
    pub available: bool,
}

impl Setting {
    /// The setting for `uid:gid`'s worktrees of the repository at `common_dir`; each run
    /// of git for it may take `limit`.
    pub fn of(uid: u32, gid: u32, common_dir: &Path, limit: std::time::Duration) -> Setting {
        use std::os::unix::fs::MetadataExt;
        let owner = Owner::of(uid, gid, limit);
        let trusted = std::fs::metadata(common_dir).is_ok_and(|m| m.uid() == uid || m.uid() == 0);
        let mut config = ConvConfig::default();
        let mut attributes_file = None;
        let mut available = super::filters::git_has_attr_source();
        if available {
            match owner.read_config(common_dir) {
                Ok(found) => {
                    config = found.config;
                    if !trusted {
                        for d in &found.local_drivers {
                            config.drivers.remove(d);
                        }
                    }
                    attributes_file = found.attributes_file;
                }
                Err(e) => {
                    tracing::warn!(
                        "reading the configuration of {} as uid {uid}: {e}; files it would convert show as committed",
                        common_dir.display()
                    );
                    available = false;
                }
            }
        }
        let attributes_file = match attributes_file {
            Some(p) => match p.strip_prefix("~/") {
                Some(rest) => owner.home.join(rest),
                None => PathBuf::from(p),
            },
            None => owner.home.join(".config/git/attributes"),
        };
        // Stat data only: a file a user names is never read with the daemon's rights.
        let extra = [
            PathBuf::from("/etc/gitattributes"),
            attributes_file,
            common_dir.join("info/attributes"),
        ]
        .into_iter()
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok().filter(|m| m.is_file())?;
            Some((p, m.len(), m.mtime(), m.mtime_nsec()))
        })
        .collect();
        Setting {
            owner,
            config,
            extra,
            trusted,
            available,
        }
    }

    /// The part of a cached index's key this setting decides: "n" when no conversion can
    /// be made here, "0" when nothing outside the tree can call for one, else a short
    /// hash of all that can.
    pub fn fingerprint(&self) -> String {
        if !self.available {
            return "n".into();
        }
        if self.config.is_plain() && self.extra.is_empty() {
            return "0".into();
        }
        use sha1::Digest;
        let mut h = sha1::Sha1::new();
        h.update(self.config.describe().as_bytes());
        h.update([self.trusted as u8]);
        for (p, len, mtime, nsec) in &self.extra {
            h.update(p.as_os_str().as_encoded_bytes());
            h.update(format!("\0{len}\0{mtime}\0{nsec}\0").as_bytes());
        }
        h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether git's clean side may differ from a file's bytes anywhere in `tree` (so a
    /// file that differs from its blob must be compared as git compares it).
    /// Never for a repository that is not trusted: git would run what its configuration
    /// names, and a file that differs from its blob then counts as modified (kept).
    pub fn may_clean(&self, repo: &Repository, tree: &git2::Tree) -> bool {
        if !self.available || !self.trusted {
            return false;
        }
        if self.config.autocrlf != AutoCrlf::False || !self.extra.is_empty() {
            return true;
        }
        let mut found = false;
        let _ = tree.walk(git2::TreeWalkMode::PreOrder, |_, e| {
            if e.name_bytes() == b".gitattributes" {
                if let Ok(b) = repo.find_blob(e.id()) {
                    if may_clean(b.content(), &self.config) {
                        found = true;
                        return git2::TreeWalkResult::Abort;
                    }
                }
            }
            git2::TreeWalkResult::Ok
        });
        found
    }

    /// Decides the conversions of `tree` for `entries` (its index entries), setting the
    /// size of each converted entry. None when no file is converted.
    pub fn decide(
        &self,
        repo: &Repository,
        common_dir: &Path,
        tree: Oid,
        entries: &mut [IndexEntry],
    ) -> super::GitResult<Option<Conversions>> {
        if !self.available {
            return Ok(None);
        }
        let is_file = |e: &IndexEntry| e.mode == MODE_BLOB || e.mode == MODE_EXEC;
        let mut maybe = self.config.autocrlf == AutoCrlf::True || !self.extra.is_empty();
        if !maybe {
            for e in entries.iter().filter(|e| is_file(e)) {
                let name = e.path.rsplit(|&b| b == b'/').next().unwrap_or(&e.path);
                if name == b".gitattributes" {
                    let blob = repo.find_blob(e.oid)?;
                    if may_convert(blob.content(), &self.config)
                        || may_not_round_trip(blob.content(), &self.config)
                    {
                        maybe = true;
                        break;
                    }
                }
            }
        }
        if !maybe {
            return Ok(None);
        }
        let files: Vec<usize> = (0..entries.len())
            .filter(|&i| is_file(&entries[i]))
            .collect();
        let paths: Vec<&[u8]> = files.iter().map(|&i| entries[i].path.as_slice()).collect();
        let attrs = check_attrs(&self.owner, common_dir, tree, &paths).map_err(|e| {
            super::GitError::new(
                super::GitErrorKind::Failed,
                format!("reading the attributes of tree {tree}: {e}"),
            )
        })?;
        let mut by_path = HashMap::new();
        let mut dirty = HashMap::new();
        let mut budget = RoundTripBudget::new();
        for (&i, a) in files.iter().zip(attrs) {
            let Some(mut conv) = classify(&a, &self.config) else {
                // Written as it is, but cleaned: a CRLF blob under `text eol=lf`.
                let e = &mut entries[i];
                if clean_turns_crlf(&a, &self.config)
                    && small_blob(repo, e.oid)
                    && repo.find_blob(e.oid).is_ok_and(|b| has_crlf(b.content()))
                {
                    e.size = 0;
                    dirty.insert(e.path.clone(), e.oid);
                }
                continue;
            };
            if conv.runs_git() && !self.trusted {
                continue; // an encoding: git would read the repository's configuration
            }
            if self.round_trip_fails(repo, common_dir, tree, &entries[i], &a, &conv, &mut budget) {
                dirty.insert(entries[i].path.clone(), entries[i].oid);
            }
            let e = &mut entries[i];
            e.size = 0;
            // The pointer's size is the file's only where git-lfs fetches it: not with
            // `git lfs install --skip-smudge`, which leaves pointers.
            let skips = self.config.drivers.get("lfs").is_some_and(|d| {
                [&d.smudge, &d.process]
                    .iter()
                    .any(|c| c.as_deref().is_some_and(|c| c.contains("--skip")))
            });
            let lfs_only = conv.filter.as_deref() == Some("lfs")
                && !skips
                && !conv.ident
                && !conv.crlf_out
                && conv.encoding.is_none();
            if lfs_only {
                if let Ok(blob) = repo.find_blob(e.oid) {
                    if let Some(size) = lfs_pointer_size(blob.content()) {
                        conv.lfs_size = Some(size);
                        e.size = size as u32;
                    }
                }
            }
            by_path.insert(e.path.clone(), (e.oid, conv));
        }
        if by_path.is_empty() && dirty.is_empty() {
            return Ok(None);
        }
        Ok(Some(Conversions {
            fingerprint: self.fingerprint(),
            by_path,
            dirty,
        }))
    }

    /// Whether the checkout of entry `e` (converted as `conv`) cleans back to another blob:
    /// decided here from the blob for end of line and `ident` (git's rules: a CRLF in a
    /// blob under a rule that is not `auto`, an expanded `$Id: … $`), and by git itself
    /// (smudge, then hash-object) for a filter or an encoding; never for git-lfs, whose
    /// pointers come back by design (and whose smudge would fetch the file).
    #[allow(clippy::too_many_arguments)]
    fn round_trip_fails(
        &self,
        repo: &Repository,
        common_dir: &Path,
        tree: Oid,
        e: &IndexEntry,
        a: &super::convert::PathAttrs,
        conv: &Conv,
        budget: &mut RoundTripBudget,
    ) -> bool {
        if conv.filter.as_deref() == Some("lfs") && conv.encoding.is_none() {
            return false;
        }
        if conv.runs_git() {
            // A driver that failed (or timed out) once is not run again for this tree,
            // and all of them together get a bounded time: the index is built during a
            // creation. A file not checked is taken as coming back from a checkout unchanged.
            let driver = conv.filter.clone().unwrap_or_default();
            if budget.failed.contains(&driver) || budget.spent() {
                return false;
            }
            use super::filters::RunError;
            let smudged = super::filters::memfile(c"wtfs-round-trip")
                .map_err(|e| RunError::Spawn(e.to_string()))
                .and_then(|f| {
                    super::filters::smudge(
                        &self.owner,
                        common_dir,
                        tree,
                        &e.path,
                        e.oid,
                        f.try_clone().map_err(|e| RunError::Spawn(e.to_string()))?,
                    )?;
                    use std::io::Seek;
                    let mut f = f;
                    f.rewind().map_err(|e| RunError::Spawn(e.to_string()))?;
                    Ok(f)
                });
            return match smudged
                .and_then(|f| super::filters::clean_id(&self.owner, common_dir, tree, &e.path, f))
            {
                Ok(id) => id != e.oid,
                Err(err) => {
                    tracing::info!(
                        "not checking whether files of filter {driver:?} survive a checkout: {} failed ({err})",
                        String::from_utf8_lossy(&e.path)
                    );
                    budget.failed.insert(driver);
                    false
                }
            };
        }
        if !small_blob(repo, e.oid) {
            return false;
        }
        let Ok(blob) = repo.find_blob(e.oid) else {
            return false;
        };
        round_trip_changes(
            e.oid,
            blob.content(),
            Some(conv),
            clean_turns_crlf(a, &self.config),
            conv.ident,
        )
    }
}

/// How long a tree's index build may spend running filters to find the blobs that do
/// not survive a checkout, and which drivers failed.
struct RoundTripBudget {
    until: std::time::Instant,
    failed: HashSet<String>,
    said: bool,
}

impl RoundTripBudget {
    const TIME: std::time::Duration = std::time::Duration::from_secs(30);

    fn new() -> RoundTripBudget {
        RoundTripBudget {
            until: std::time::Instant::now() + Self::TIME,
            failed: HashSet::new(),
            said: false,
        }
    }

    /// Whether the time is up (said once).
    fn spent(&mut self) -> bool {
        let spent = std::time::Instant::now() >= self.until;
        if spent && !self.said {
            self.said = true;
            tracing::info!(
                "stopped checking which filtered files survive a checkout after {} s; the rest are taken as coming back",
                Self::TIME.as_secs()
            );
        }
        spent
    }
}

/// Blobs read whole to find a CRLF or an `$Id: … $`: up to 16 MiB (a larger one is taken
/// as coming back from a checkout unchanged, unread).
fn small_blob(repo: &Repository, oid: Oid) -> bool {
    repo.odb()
        .and_then(|o| o.read_header(oid))
        .is_ok_and(|(size, _)| size <= 16 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::convert::CrlfAction;

    #[test]
    fn conversions_read_back_what_was_written() {
        let mut by_path = HashMap::new();
        let oid = Oid::hash_object(git2::ObjectType::Blob, b"x").unwrap();
        for (i, p) in [&b"a.bat"[..], b"dir/with space\tand\ntab", "ünï".as_bytes()]
            .iter()
            .enumerate()
        {
            by_path.insert(
                p.to_vec(),
                (
                    oid,
                    Conv {
                        crlf: CrlfAction::TextCrlf,
                        crlf_out: true,
                        ident: i == 1,
                        filter: (i == 2).then(|| "lfs".to_string()),
                        required: i == 2,
                        encoding: None,
                        lfs_size: (i == 2).then_some(7),
                    },
                ),
            );
        }
        let dirty: HashMap<Vec<u8>, Oid> = [(b"crlf.bat".to_vec(), oid), (b"a/id.c".to_vec(), oid)]
            .into_iter()
            .collect();
        let c = Conversions {
            fingerprint: "abc".into(),
            by_path,
            dirty,
        };
        let back = Conversions::decode(&c.encode()).unwrap();
        assert_eq!(back.fingerprint, "abc");
        assert_eq!(back.by_path, c.by_path);
        assert_eq!(back.dirty, c.dirty);
        assert!(back.is_dirty(b"crlf.bat") && !back.is_dirty(b"a.bat"));
        assert!(Conversions::decode(b"something else").is_none());
        // Read from a file: none without one, an error of its kind for another file.
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("conversions");
        assert!(Conversions::read(&path).unwrap().is_none());
        std::fs::write(&path, c.encode()).unwrap();
        assert_eq!(Conversions::read(&path).unwrap().unwrap().dirty, c.dirty);
        std::fs::write(&path, b"something else").unwrap();
        let e = Conversions::read(&path).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // A list of the first format (no dirty paths) still reads.
        let mut first = MAGIC_1.to_vec();
        first.extend_from_slice(b"abc\na.bat\0");
        first.extend_from_slice(format!("{oid} crlf=text-crlf out=crlf").as_bytes());
        first.push(0);
        let old = Conversions::decode(&first).unwrap();
        assert!(old.get(b"a.bat").is_some() && old.dirty.is_empty());
    }
}
