//! A worktree's checkpoints: its upper layer as it was when each was taken, kept by what
//! changes after it, and put back by a rewind (`rewind.rs`). The design and its choices:
//! `docs/design/checkpoints.md`.
//!
//! Taking checkpoint N starts *epoch* N, a directory `<checkpoints>/<N>/`; it copies
//! nothing (the files open for writing at that moment aside). From then on, the first
//! time anything of the upper layer changes in the epoch, what it was is kept there:
//!
//! * a name (`keep_name`): whether it was absent, a directory (its attributes), or an
//!   inode, hard-linked into `saved/<ino>` (O(1), whatever the size);
//! * an inode's attributes (`keep_attrs`), before a chmod, chown, utimes or an
//!   extended attribute's change;
//! * a regular file's data (`keep_content`), copied into `content/<ino>` before its first
//!   open for writing or truncation: the kernel writes an upper file past the daemon
//!   (passthrough), so the data is kept at the open, not at the write.
//!
//! The callers (the view) keep one rule: before a change to the upper layer, they keep
//! what it changes, every path whose entry changes included (`keep_tree` before a
//! directory goes, `keep_moved` before one moves). Each epoch's records then say what
//! every path and inode it changed was at its start, and the upper layer at checkpoint
//! N is, path by path, the earliest record of the epochs N and after, or what is there
//! now for a path none of them touched. A rewind puts exactly that back.

mod keep;
mod meta;
mod record;
mod rewind;

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::beneath;

use record::{Record, Was};

pub use record::show as show_path;
pub use rewind::Rewound;

const INFO: &str = "info.json";
const RECORDS: &str = "records";
const SAVED: &str = "saved";
const CONTENT: &str = "content";
/// In the checkpoints directory while a rewind is under way: `<to> <new>`.
const REWINDING: &str = "rewinding";

/// How many checkpoints a worktree keeps: the oldest goes when one more is taken.
pub const KEEP_COUNT: usize = 50;
/// How long a checkpoint is kept (the newest stays, whatever its age).
pub const KEEP_HOURS: i64 = 72;

/// What a checkpoint says of itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    pub id: u64,
    pub label: Option<String>,
    /// Seconds since the epoch.
    pub taken_at: i64,
    /// Files open for writing when it was taken, copied then, and their bytes.
    #[serde(default)]
    pub copied_open: u64,
    #[serde(default)]
    pub copied_bytes: u64,
}

/// A worktree's checkpoints (none until the first is taken: every keep is then free).
#[derive(Debug)]
pub struct Checkpoints {
    path: PathBuf,
    state: Mutex<Option<Epoch>>,
    /// How many links to each inode the epochs' `saved/` stores hold (one per epoch at
    /// most): names the view does not show, taken off the link count it shows.
    held: Held,
    /// A rewind is marked as under way (begun, not ended): changes are refused meanwhile,
    /// since what they changed could not be kept apart from what the rewind changes.
    unfinished: std::sync::atomic::AtomicBool,
}

/// The links to each inode the stores hold, shared by the epoch under way.
type Held = std::sync::Arc<Mutex<std::collections::HashMap<u64, u32>>>;

/// The epoch under way: the newest checkpoint's.
#[derive(Debug)]
struct Epoch {
    id: u64,
    held: Held,
    saved: OwnedFd,
    content: OwnedFd,
    records: File,
    names: HashSet<Vec<u8>>,
    attrs: HashSet<u64>,
    contents: HashSet<u64>,
}

fn other(what: String) -> io::Error {
    io::Error::other(what)
}

impl Checkpoints {
    /// The checkpoints kept in `path` (`<worktree dir>/checkpoints`; none if it is absent).
    /// A checkpoint whose taking was cut short is removed.
    pub fn open(path: PathBuf) -> io::Result<Checkpoints> {
        let c = Checkpoints {
            path,
            state: Mutex::new(None),
            held: Held::default(),
            unfinished: Default::default(),
        };
        let ids = c.epoch_ids()?;
        if let Some(&last) = ids.last() {
            *c.state.lock() = Some(c.load_epoch(last)?);
        }
        c.count_held()?;
        if c.pending_rewind().is_some() {
            c.unfinished
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(c)
    }

    /// Refuses a change while a rewind is marked as under way.
    fn changes_allowed(&self) -> io::Result<()> {
        if self.unfinished.load(std::sync::atomic::Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "a rewind of this worktree did not finish: rewind again (to finish it, or to the checkpoint it took first, to go back)",
            ));
        }
        Ok(())
    }

    /// How many links to inode `ino` the checkpoints hold.
    pub fn links_held(&self, ino: u64) -> u32 {
        self.held.lock().get(&ino).copied().unwrap_or(0)
    }

    /// Counts the links the epochs' stores hold again, from disk.
    fn count_held(&self) -> io::Result<()> {
        let mut held = std::collections::HashMap::new();
        for id in self.epoch_ids()? {
            let saved = self.dir(id).join(SAVED);
            let rd = match fs::read_dir(&saved) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for e in rd.flatten() {
                if let Some(ino) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) {
                    *held.entry(ino).or_insert(0) += 1;
                }
            }
        }
        *self.held.lock() = held;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of checkpoint `id` (the caller keeps git's files of it there too).
    pub fn dir(&self, id: u64) -> PathBuf {
        self.path.join(id.to_string())
    }

    /// Whether any checkpoint is kept (keeps cost nothing until one is).
    pub fn any(&self) -> bool {
        self.state.lock().is_some()
    }

    /// The ids of the complete checkpoints, oldest first; an incomplete one removed.
    fn epoch_ids(&self) -> io::Result<Vec<u64>> {
        let rd = match fs::read_dir(&self.path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut ids = Vec::new();
        for e in rd {
            let e = e?;
            let Some(id) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            if e.path().join(INFO).exists() {
                ids.push(id);
            } else {
                tracing::warn!(
                    "checkpoint {} was cut short while it was taken: removed",
                    e.path().display()
                );
                fs::remove_dir_all(e.path())?;
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The checkpoints kept in `path`, oldest first, each with how many paths changed
    /// since it was taken; read only, beside the daemon: a checkpoint being taken or
    /// dropped meanwhile is left out (a drop hands its records to the checkpoint before
    /// it first, then removes its directory file by file).
    pub fn read(path: &Path) -> io::Result<Vec<(Info, usize)>> {
        let c = Checkpoints {
            path: path.to_path_buf(),
            state: Mutex::new(None),
            held: Held::default(),
            unfinished: Default::default(),
        };
        let rd = match fs::read_dir(path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut ids: Vec<u64> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|id: &u64| c.dir(*id).join(INFO).is_file())
            .collect();
        ids.sort_unstable();
        // Paths changed since each: those its epoch and every later one touched.
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
        for &id in ids.iter().rev() {
            let (records, info) = match (read_records(&c.dir(id)), c.info(id)) {
                (Ok(records), Ok(info)) => (records, info),
                (Err(e), _) | (_, Err(e)) if gone(&e) => continue,
                (Err(e), _) | (_, Err(e)) => return Err(e),
            };
            for r in records {
                match r {
                    // A directory's attributes, kept because a name in it changed: that
                    // name counts, not the directory.
                    Record::Name {
                        was: Was::Dir(_), ..
                    } => {}
                    Record::Name { path, .. }
                    | Record::Content { path, .. }
                    | Record::Attrs { path, .. } => {
                        seen.insert(path);
                    }
                }
            }
            out.push((info, seen.len()));
        }
        out.reverse();
        Ok(out)
    }

    /// Every checkpoint kept, oldest first.
    pub fn list(&self) -> io::Result<Vec<Info>> {
        let _s = self.state.lock();
        self.infos()
    }

    fn infos(&self) -> io::Result<Vec<Info>> {
        self.epoch_ids()?
            .into_iter()
            .map(|id| self.info(id))
            .collect()
    }

    fn info(&self, id: u64) -> io::Result<Info> {
        let p = self.dir(id).join(INFO);
        serde_json::from_slice(&fs::read(&p)?).map_err(|e| other(format!("{}: {e}", p.display())))
    }

    fn load_epoch(&self, id: u64) -> io::Result<Epoch> {
        let dir = self.dir(id);
        let mut e = Epoch {
            id,
            held: self.held.clone(),
            saved: beneath::open_root(&dir.join(SAVED))?,
            content: beneath::open_root(&dir.join(CONTENT))?,
            records: fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(dir.join(RECORDS))?,
            names: HashSet::new(),
            attrs: HashSet::new(),
            contents: HashSet::new(),
        };
        for r in read_records(&dir)? {
            e.note(&r);
        }
        Ok(e)
    }

    /// Takes a checkpoint: a new epoch (O(1)), with a copy of each file in
    /// `open_for_writing` (upper files open for writing now, which change past the
    /// daemon: each an `O_PATH` descriptor and its path if it has one).
    pub fn take(
        &self,
        label: Option<String>,
        upper: BorrowedFd,
        open_for_writing: &[(Option<Vec<u8>>, BorrowedFd)],
    ) -> io::Result<Info> {
        let mut state = self.state.lock();
        self.take_locked(&mut state, label, upper, open_for_writing)
    }

    fn take_locked(
        &self,
        state: &mut Option<Epoch>,
        label: Option<String>,
        upper: BorrowedFd,
        open_for_writing: &[(Option<Vec<u8>>, BorrowedFd)],
    ) -> io::Result<Info> {
        let id = self.epoch_ids()?.last().map_or(1, |l| l + 1);
        let dir = self.dir(id);
        fs::create_dir_all(&self.path)?;
        fs::create_dir(&dir)?;
        let made = (|| {
            fs::create_dir(dir.join(SAVED))?;
            fs::create_dir(dir.join(CONTENT))?;
            File::create(dir.join(RECORDS))?;
            let mut info = Info {
                id,
                label,
                taken_at: now(),
                copied_open: 0,
                copied_bytes: 0,
            };
            let mut epoch = self.open_new(id)?;
            for (path, fd) in open_for_writing {
                if let Some(bytes) = epoch.keep_content(upper, path.as_deref(), *fd)? {
                    info.copied_open += 1;
                    info.copied_bytes += bytes;
                }
            }
            let json = serde_json::to_vec_pretty(&info).map_err(|e| other(e.to_string()))?;
            crate::durable::write_file_synced(&dir.join(INFO), &json)?;
            Ok::<_, io::Error>((epoch, info))
        })();
        match made {
            Ok((epoch, info)) => {
                *state = Some(epoch);
                Ok(info)
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn open_new(&self, id: u64) -> io::Result<Epoch> {
        let dir = self.dir(id);
        Ok(Epoch {
            id,
            held: self.held.clone(),
            saved: beneath::open_root(&dir.join(SAVED))?,
            content: beneath::open_root(&dir.join(CONTENT))?,
            records: fs::OpenOptions::new()
                .append(true)
                .open(dir.join(RECORDS))?,
            names: HashSet::new(),
            attrs: HashSet::new(),
            contents: HashSet::new(),
        })
    }

    /// A keep: refused while a rewind is unfinished, else done by the epoch under way
    /// (nothing to keep before the first checkpoint).
    fn in_epoch(&self, keep: impl FnOnce(&mut Epoch) -> io::Result<()>) -> io::Result<()> {
        self.changes_allowed()?;
        match self.state.lock().as_mut() {
            Some(e) => keep(e),
            None => Ok(()),
        }
    }

    /// Before the name `rel` of the upper layer `upper` is made, removed or replaced.
    pub fn keep_name(&self, upper: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        self.in_epoch(|e| e.keep_name(upper, rel))
    }

    /// Before the entry at `rel` is removed or replaced: it and, a directory, everything
    /// in it.
    pub fn keep_tree(&self, upper: BorrowedFd, rel: &[u8]) -> io::Result<()> {
        self.in_epoch(|e| e.keep_tree(upper, rel))
    }

    /// Before the entry at `from` moves to `to` (replacing what is there): both trees,
    /// and every path below `to` that an entry below `from` will take.
    pub fn keep_moved(&self, upper: BorrowedFd, from: &[u8], to: &[u8]) -> io::Result<()> {
        self.in_epoch(|e| e.keep_moved(upper, from, to))
    }

    /// Before the attributes of the entry `fd` (at `rel` if it has a name) change.
    pub fn keep_attrs(
        &self,
        upper: BorrowedFd,
        rel: Option<&[u8]>,
        fd: BorrowedFd,
    ) -> io::Result<()> {
        self.in_epoch(|e| e.keep_attrs(upper, rel, fd))
    }

    /// Before the regular file `fd` (at `rel` if it has a name) is opened for writing or
    /// truncated: its data and attributes.
    pub fn keep_content(
        &self,
        upper: BorrowedFd,
        rel: Option<&[u8]>,
        fd: BorrowedFd,
    ) -> io::Result<()> {
        self.in_epoch(|e| e.keep_content(upper, rel, fd).map(|_| ()))
    }

    /// The checkpoints past the limits (more than `count`, or taken more than `hours`
    /// ago; never the newest), oldest first.
    pub fn past_limits(&self, count: usize, hours: i64) -> io::Result<Vec<u64>> {
        let all = self.list()?;
        let now = now();
        let n = all.len();
        Ok(all
            .iter()
            .enumerate()
            .filter(|(i, c)| *i + 1 < n && (n - i > count || now - c.taken_at > hours * 3600))
            .map(|(_, c)| c.id)
            .collect())
    }

    /// Drops checkpoint `id`. What its epoch kept that the one before it did not is
    /// handed to that one (a rewind there still needs it); the oldest is simply deleted.
    pub fn drop_checkpoint(&self, id: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if let Some((to, before)) = self.pending_rewind() {
            if id == to || id == before {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("checkpoint {id} is in the rewind to {to} that did not finish"),
                ));
            }
        }
        let ids = self.epoch_ids()?;
        let Some(at) = ids.iter().position(|&i| i == id) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no checkpoint {id}"),
            ));
        };
        let dir = self.dir(id);
        if at > 0 {
            let prev = ids[at - 1];
            let mut into = if state.as_ref().is_some_and(|e| e.id == prev) {
                state.take().expect("checked")
            } else {
                self.load_epoch(prev)?
            };
            let src_saved = beneath::open_root(&dir.join(SAVED))?;
            let src_content = beneath::open_root(&dir.join(CONTENT))?;
            for r in read_records(&dir)? {
                if into.has(&r) {
                    continue;
                }
                let linked = match &r {
                    Record::Name {
                        was: Was::Inode(ino),
                        ..
                    }
                    | Record::Attrs { ino, .. } => Some(*ino),
                    Record::Content { ino, .. } => {
                        move_kept(src_content.as_fd(), into.content.as_fd(), *ino)?;
                        Some(*ino)
                    }
                    Record::Name { .. } => None,
                };
                if let Some(ino) = linked {
                    move_kept(src_saved.as_fd(), into.saved.as_fd(), ino)?;
                }
                into.append(&r)?;
            }
            // Everything handed over before the checkpoint goes (a crash before leaves
            // both, the older complete).
            let handed = ids.last() == Some(&id);
            fs::remove_dir_all(&dir)?;
            if handed || state.is_none() {
                *state = Some(into);
            }
            if !handed {
                // The newest stays the epoch under way.
                if let Some(&last) = ids.last() {
                    if state.as_ref().is_none_or(|e| e.id != last) {
                        *state = Some(self.load_epoch(last)?);
                    }
                }
            }
        } else {
            let newest = ids.len() == 1;
            fs::remove_dir_all(&dir)?;
            if newest {
                *state = None;
            }
        }
        self.count_held()?;
        Ok(())
    }
}

fn read_records(dir: &Path) -> io::Result<Vec<Record>> {
    Record::decode_all(&fs::read(dir.join(RECORDS))?)
}

/// Gives another epoch's store the kept entry `ino` (a link: the dropped epoch's goes
/// with its directory, after every record is handed over, so a crash between leaves both
/// whole), unless that one has it already (the same inode, kept under another record).
fn move_kept(from: BorrowedFd, to: BorrowedFd, ino: u64) -> io::Result<()> {
    let n = ino_name(ino);
    match beneath::link_at(from, &n, to, &n) {
        // Kept there already; or never linked here (a file with no name left when kept).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOENT)) => Ok(()),
        other => other,
    }
}

pub(crate) fn ino_name(ino: u64) -> OsString {
    OsString::from(ino.to_string())
}

pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

pub(crate) fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `rel`'s directory and last name (`rel` not empty).
pub(crate) fn split(rel: &[u8]) -> (&[u8], &OsStr) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], OsStr::from_bytes(&rel[i + 1..])),
        None => (&[], OsStr::from_bytes(rel)),
    }
}

pub(crate) fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

/// The entry at `rel` now: its status, or None when there is none.
pub(crate) fn entry_at(upper: BorrowedFd, rel: &[u8]) -> io::Result<Option<beneath::Stat>> {
    if rel.is_empty() {
        return beneath::fstat(upper).map(Some);
    }
    let (dir, name) = split(rel);
    let d = match beneath::dir(upper, dir) {
        Ok(d) => d,
        Err(e) if is_gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match beneath::stat_at(d.as_fd(), name) {
        Ok(st) => Ok(Some(st)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}
