//! The view called directly, with no mount: the core's operations, and a reference-model
//! test where random operation sequences run against both the view and a plain directory
//! and must agree.

mod common;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use worktreefs::fs::{Attr, Caller, FType, SetAttr, View, ROOT_INO};
use worktreefs::ino::Ino;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

const ME: Caller = Caller { uid: 0, gid: 0 };

/// A tree's content by path, as `snapshot` gives it.
type Contents = BTreeMap<String, Option<Vec<u8>>>;
/// A tree's attributes by path.
type Attrs = BTreeMap<String, Meta>;

struct Core {
    _env: Rc<Env>,
    view: View,
    root: Ino,
}

fn core() -> Core {
    let env = Rc::new(Env::new());
    let state = StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&state.root).unwrap();
    core_in(&env, &mut store, "w")
}

/// A view of a new worktree `name` of `env`'s repository, rooted at the worktree.
fn core_in(env: &Rc<Env>, store: &mut Store, name: &str) -> Core {
    let state = StateDir::open(&env.state()).unwrap();
    create_at_head(&state, store, name);
    let view = View::new(state, env.mountpoint()).unwrap();
    let repo = view.lookup(ROOT_INO, OsStr::new("repo")).unwrap().attr.ino;
    let root = view.lookup(repo, OsStr::new(name)).unwrap().attr.ino;
    Core {
        _env: env.clone(),
        view,
        root,
    }
}

impl Core {
    /// Resolves a relative path to (parent inode, inode) by lookups.
    fn resolve(&self, path: &str) -> Result<(Ino, Ino), i32> {
        let mut parent = self.root;
        let mut cur = self.root;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            parent = cur;
            cur = self
                .view
                .lookup(cur, OsStr::new(part))
                .map_err(|e| e.errno())?
                .attr
                .ino;
        }
        Ok((parent, cur))
    }

    fn dir_of(&self, path: &str) -> Result<(Ino, String), i32> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", path),
        };
        Ok((self.resolve(dir)?.1, name.to_string()))
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, i32> {
        let (_, ino) = self.resolve(path)?;
        let fh = self
            .view
            .open(ino, libc::O_RDONLY)
            .map_err(|e| e.errno())?
            .0;
        let data = self.view.read(fh, 0, 1 << 24).map_err(|e| e.errno());
        self.view.release(fh);
        data
    }

    fn write(&self, path: &str, data: &[u8]) -> Result<(), i32> {
        let fh = match self.resolve(path) {
            Ok((_, ino)) => {
                self.view
                    .open(ino, libc::O_WRONLY | libc::O_TRUNC)
                    .map_err(|e| e.errno())?
                    .0
            }
            Err(libc::ENOENT) => {
                let (dir, name) = self.dir_of(path)?;
                self.view
                    .create(dir, OsStr::new(&name), 0o100644, 0o022, libc::O_WRONLY, ME)
                    .map_err(|e| e.errno())?
                    .1
            }
            Err(e) => return Err(e),
        };
        let r = self
            .view
            .write(fh, 0, data)
            .map(|_| ())
            .map_err(|e| e.errno());
        self.view.release(fh);
        r
    }

    /// The whole tree as `snapshot` gives a plain directory's (content by path), and every
    /// entry's attributes as the view reports them.
    fn tree(&self) -> (Contents, Attrs) {
        let mut out = (BTreeMap::new(), BTreeMap::new());
        self.walk(self.root, "", &mut out);
        out
    }

    fn walk(&self, ino: Ino, prefix: &str, out: &mut (Contents, Attrs)) {
        let fh = self.view.opendir(ino).unwrap().0;
        let entries = self.view.readdir(fh, 0).unwrap();
        self.view.release(fh);
        for (_, e) in entries {
            let name = e.name.to_string_lossy().into_owned();
            if name == "." || name == ".." || (prefix.is_empty() && name == ".git") {
                continue;
            }
            let mut path = format!("{prefix}{name}");
            let attr = self.view.lookup(ino, &e.name).unwrap().attr;
            let content = match e.kind {
                FType::Dir => {
                    path.push('/');
                    self.walk(attr.ino, &path, out);
                    None
                }
                FType::Symlink => Some(self.view.readlink(attr.ino).unwrap()),
                _ => {
                    let fh = self.view.open(attr.ino, libc::O_RDONLY).unwrap().0;
                    // One byte past the size: a file longer than it says shows.
                    let data = self.view.read(fh, 0, attr.size as u32 + 1).unwrap();
                    self.view.release(fh);
                    Some(data)
                }
            };
            out.1.insert(path.clone(), Meta::of_view(&attr));
            out.0.insert(path, content);
        }
    }
}

#[test]
fn direct_calls_read_the_base_and_write_the_upper_layer() {
    let c = core();
    assert_eq!(c.read("README.md").unwrap(), b"# test repository\n");
    let attr = c
        .view
        .getattr(c.resolve("build.sh").unwrap().1, None)
        .unwrap()
        .attr;
    assert_eq!(attr.perm, 0o755);
    assert_eq!(attr.kind, FType::File);
    c.write("README.md", b"new").unwrap();
    assert_eq!(c.read("README.md").unwrap(), b"new");
    assert_eq!(
        c.view
            .stats
            .copy_ups
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let (dir, _) = c.dir_of("src/main.rs").unwrap();
    c.view.unlink(dir, OsStr::new("main.rs")).unwrap();
    assert_eq!(c.resolve("src/main.rs").unwrap_err(), libc::ENOENT);
    assert_eq!(
        c.view
            .mkdir(c.root, OsStr::new(".wtfs-opaque"), 0o755, 0, ME)
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    assert_eq!(
        c.view
            .mkdir(c.root, OsStr::new("src"), 0o755, 0, ME)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    assert_eq!(
        c.view
            .unlink(c.root, OsStr::new(".git"))
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
}

// The reference model: random operation sequences run against the view and against a
// plain directory (a checkout of the same commit on the machine's own filesystem), and
// after every step both must agree: each operation's errno, each read's bytes, the whole
// tree's content, every entry's type, mode, size and link count, explicitly set mtimes,
// and what the open handles read and report. proptest generates the sequences and, on a
// failure, shrinks the sequence to a minimal one.
//
// Where the kernel answers a request itself before the filesystem is asked (the VFS's
// path walk, its existence and ancestry checks, an access mode a handle was not opened
// with), the model answers as the kernel does and the view is not called: a direct call
// has no kernel in front of it.

/// The paths operations name: the shared model paths, a base symlink, an executable, the
/// empty directory of a submodule, and more names the base does not have.
fn model_paths() -> Vec<&'static str> {
    MODEL_PATHS
        .iter()
        .copied()
        .chain([
            "link-to-readme",
            "build.sh",
            "vendor/sub",
            "y.txt",
            "docs/y.txt",
        ])
        .collect()
}

/// What new symlinks point at: relative names that exist, may exist later, or never do
/// (and a link named `x.txt` that points at itself). None climbs out with `..`.
const LINK_TARGETS: [&str; 7] = [
    "README.md",
    "src",
    "src/main.rs",
    "new/a",
    "x.txt",
    "nowhere",
    "lib",
];

/// Directories of the base (the submodule's empty one among them) and a name `Mkdir` may
/// give one: renames among them move a directory over another, empty or not, which
/// renames between any two paths seldom do.
const DIR_PATHS: [&str; 5] = ["src/lib", "docs", "assets", "vendor/sub", "new"];

/// Files of the base and a new name: opens and unlinks among them unlink a file a handle
/// holds open far more often than among all the paths.
const FILE_PATHS: [&str; 3] = ["README.md", "src/main.rs", "x.txt"];

/// Open handles live in this many slots; an operation names its handle by slot.
const SLOTS: usize = 3;

/// An mtime before this is one the test set (utimens); a file changed since has "now".
const SET_TIMES_BEFORE: u64 = 1_500_000_000;

/// A mode, shown in octal.
#[derive(Clone, Copy, PartialEq)]
struct Perm(u32);

impl std::fmt::Debug for Perm {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "0o{:o}", self.0)
    }
}

/// How a handle is opened.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Read,
    Write,
    ReadWrite,
    Trunc,
    Append,
    /// O_RDWR | O_CREAT: created when the name does not exist.
    Create,
}

impl Mode {
    fn flags(self) -> i32 {
        match self {
            Mode::Read => libc::O_RDONLY,
            Mode::Write => libc::O_WRONLY,
            Mode::ReadWrite | Mode::Create => libc::O_RDWR,
            Mode::Trunc => libc::O_RDWR | libc::O_TRUNC,
            Mode::Append => libc::O_RDWR | libc::O_APPEND,
        }
    }

    fn reads(self) -> bool {
        self != Mode::Write
    }

    fn writes(self) -> bool {
        self != Mode::Read
    }

    fn options(self) -> fs::OpenOptions {
        let mut o = fs::OpenOptions::new();
        match self {
            Mode::Read => o.read(true),
            Mode::Write => o.write(true),
            Mode::ReadWrite => o.read(true).write(true),
            Mode::Trunc => o.read(true).write(true).truncate(true),
            Mode::Append => o.read(true).append(true),
            Mode::Create => o.read(true).write(true).create(true),
        };
        o
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Writes the whole file, creating it if needed (`fs::write`).
    Write(&'static str, String),
    Unlink(&'static str),
    Mkdir(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    /// A hard link: (existing, new name).
    Link(&'static str, &'static str),
    /// A symlink: (target, new name).
    Symlink(&'static str, &'static str),
    Readlink(&'static str),
    /// truncate(2) by path, shrinking or growing.
    Truncate(&'static str, u64),
    Chmod(&'static str, Perm),
    /// utimensat(2) of the mtime (seconds, nanoseconds); the atime is left alone.
    Utimens(&'static str, u64, u32),
    /// Opens a handle into a slot (releasing the one there first).
    Open(usize, &'static str, Mode),
    /// pread through a handle (`Model::pick` says which): (slot, offset, length).
    Read(usize, u64, u32),
    /// pwrite through a handle: (slot, offset, data).
    WriteAt(usize, u64, String),
    /// ftruncate through a handle.
    Ftruncate(usize, u64),
    /// Releases a handle: the first open at the slot or after it.
    Release(usize),
    /// Takes a checkpoint; the plain directory is copied whole.
    Checkpoint,
    /// Rewinds to the checkpoint at this index among those kept (modulo), every handle
    /// released first (a rewind is refused while others write); the plain directory is
    /// made its copy again.
    Rewind(usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let path = || select(model_paths());
    let data = || "[a-z]{1,6}";
    let slot = || 0..SLOTS;
    let size = || prop_oneof![0..48u64, Just(5000u64)];
    let mode = || {
        select(vec![
            Mode::Read,
            Mode::Write,
            Mode::ReadWrite,
            Mode::Trunc,
            Mode::Append,
            Mode::Create,
        ])
    };
    let perm = select(vec![0o644, 0o600, 0o755, 0o400, 0o2755, 0o1700]).prop_map(Perm);
    prop_oneof![
        3 => (path(), data()).prop_map(|(p, d)| Op::Write(p, d)),
        2 => path().prop_map(Op::Unlink),
        1 => select(FILE_PATHS.to_vec()).prop_map(Op::Unlink),
        2 => path().prop_map(Op::Mkdir),
        2 => path().prop_map(Op::Rmdir),
        3 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (select(DIR_PATHS.to_vec()), select(DIR_PATHS.to_vec()))
            .prop_map(|(a, b)| Op::Rename(a, b)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        2 => (select(LINK_TARGETS.to_vec()), path()).prop_map(|(t, p)| Op::Symlink(t, p)),
        1 => path().prop_map(Op::Readlink),
        1 => (path(), size()).prop_map(|(p, s)| Op::Truncate(p, s)),
        1 => (path(), perm).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => (path(), 1_000_000_000..1_000_000_010u64, select(vec![0u32, 123_456_789]))
            .prop_map(|(p, s, ns)| Op::Utimens(p, s, ns)),
        5 => (slot(), path(), mode()).prop_map(|(s, p, m)| Op::Open(s, p, m)),
        2 => (slot(), select(FILE_PATHS.to_vec()), mode()).prop_map(|(s, p, m)| Op::Open(s, p, m)),
        3 => (slot(), 0..24u64, 0..40u32).prop_map(|(s, o, n)| Op::Read(s, o, n)),
        3 => (slot(), 0..24u64, data()).prop_map(|(s, o, d)| Op::WriteAt(s, o, d)),
        2 => (slot(), size()).prop_map(|(s, n)| Op::Ftruncate(s, n)),
        1 => slot().prop_map(Op::Release),
        1 => Just(Op::Checkpoint),
        1 => (0..4usize).prop_map(Op::Rewind),
    ]
}

/// The process's umask, which the plain directory's creations get; the view's are given
/// the same.
fn umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

/// Where a path leads in the view, as the kernel's path walk finds it: the directories
/// walked through (the root first, the last name's directory last), the last name, and
/// the entry there (inode, type), if any.
struct Walked {
    dirs: Vec<Ino>,
    name: String,
    found: Option<(Ino, FType)>,
}

impl Walked {
    fn parent(&self) -> Ino {
        *self.dirs.last().unwrap()
    }

    fn name(&self) -> &OsStr {
        OsStr::new(&self.name)
    }
}

impl Core {
    /// The kernel's path walk through the view: every name looked up, symlinks followed
    /// on the way (and at the end with `follow`), at most 40 of them (ELOOP).
    fn walk_path(&self, path: &str, follow: bool) -> Result<Walked, i32> {
        let mut dirs = vec![self.root];
        let mut names: std::collections::VecDeque<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        let mut links = 0;
        while let Some(name) = names.pop_front() {
            let last = names.is_empty();
            let dir = *dirs.last().unwrap();
            if name == ".." {
                // Only the base's `docs/src-link` (`../src`) names `..`, never at the top
                // nor last. The plain directory's parent holds nothing else: ENOENT too.
                assert!(!last, "a path ending in ..: {path}");
                if dirs.len() == 1 {
                    return Err(libc::ENOENT);
                }
                dirs.pop();
                continue;
            }
            let entry = match self.view.lookup(dir, OsStr::new(&name)) {
                Ok(e) => e,
                Err(e) if e.errno() == libc::ENOENT && last => {
                    return Ok(Walked {
                        dirs,
                        name,
                        found: None,
                    })
                }
                Err(e) => return Err(e.errno()),
            };
            let (ino, kind) = (entry.attr.ino, entry.attr.kind);
            if kind == FType::Symlink && (!last || follow) {
                links += 1;
                if links > 40 {
                    return Err(libc::ELOOP);
                }
                let target = self.view.readlink(ino).map_err(|e| e.errno())?;
                let target = String::from_utf8(target).unwrap();
                assert!(!target.starts_with('/'), "absolute target {target}");
                for part in target.split('/').filter(|p| !p.is_empty()).rev() {
                    names.push_front(part.to_string());
                }
                continue;
            }
            if last {
                return Ok(Walked {
                    dirs,
                    name,
                    found: Some((ino, kind)),
                });
            }
            if kind != FType::Dir {
                return Err(libc::ENOTDIR);
            }
            dirs.push(ino);
        }
        // An empty path: no operation names one.
        unreachable!("empty path {path:?}")
    }
}

/// What is compared of an entry's attributes: what ext4 and the view both define the
/// same way. A directory's size and link count are the filesystem's own; an mtime only
/// when the test set it (a change gives each side its own "now"), a directory's too (a
/// copy-up below it leaves it alone, as on ext4).
#[derive(Debug, PartialEq)]
struct Meta {
    kind: FType,
    perm: Perm,
    size: Option<u64>,
    nlink: Option<u32>,
    set_mtime: Option<SystemTime>,
}

impl Meta {
    fn new(kind: FType, perm: u32, size: u64, nlink: u32, mtime: SystemTime) -> Meta {
        let not_dir = kind != FType::Dir;
        let set_before = UNIX_EPOCH + Duration::from_secs(SET_TIMES_BEFORE);
        Meta {
            kind,
            perm: Perm(perm & 0o7777),
            size: not_dir.then_some(size),
            nlink: not_dir.then_some(nlink),
            set_mtime: (mtime < set_before).then_some(mtime),
        }
    }

    fn of_view(a: &Attr) -> Meta {
        Meta::new(a.kind, a.perm as u32, a.size, a.nlink, a.mtime)
    }

    fn of_plain(m: &fs::Metadata) -> Meta {
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            FType::Dir
        } else if ft.is_symlink() {
            FType::Symlink
        } else {
            FType::File
        };
        Meta::new(
            kind,
            m.mode(),
            m.len(),
            m.nlink() as u32,
            m.modified().unwrap(),
        )
    }
}

fn plain_meta(root: &Path) -> Attrs {
    fn walk(dir: &Path, prefix: &str, out: &mut Attrs) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if prefix.is_empty() && name == ".git" {
                continue;
            }
            let m = fs::symlink_metadata(e.path()).unwrap();
            let mut path = format!("{prefix}{name}");
            if m.is_dir() {
                path.push('/');
                walk(&e.path(), &path, out);
            }
            out.insert(path, Meta::of_plain(&m));
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

/// How often each operation succeeded, failed (by errno) or did not apply, over a run:
/// what the generated sequences exercised.
#[derive(Default)]
struct Tally {
    results: BTreeMap<String, BTreeMap<String, u32>>,
    /// How often each of the cases a run must exercise ([`MUST_HAPPEN`]) happened.
    cases: BTreeMap<&'static str, u32>,
}

/// The cases a run must exercise, each at least [`AT_LEAST`] times (and succeeding on the
/// plain directory), or the test fails: a generator changed so that it no longer makes
/// one would otherwise leave it untested without a word.
const MUST_HAPPEN: [&str; 10] = [
    RENAME_FILE_OVER_FILE,
    RENAME_DIR_OVER_EMPTY_DIR,
    UNLINK_OF_AN_OPEN_FILE,
    "link",
    "truncate",
    "chmod",
    "utimens",
    "read through a handle",
    "write through a handle",
    HANDLE_WITH_NO_NAME,
];
const RENAME_FILE_OVER_FILE: &str = "rename of a file over another file";
const RENAME_DIR_OVER_EMPTY_DIR: &str = "rename of a directory over an empty directory";
const UNLINK_OF_AN_OPEN_FILE: &str = "unlink of a file open in a handle";
const HANDLE_WITH_NO_NAME: &str = "check of a handle on a file with no name left";
const AT_LEAST: u32 = 5;

impl Tally {
    /// The cases of [`MUST_HAPPEN`] that happened fewer than [`AT_LEAST`] times.
    fn missing(&self) -> Vec<&'static str> {
        MUST_HAPPEN
            .into_iter()
            .filter(|c| self.cases.get(c).copied().unwrap_or(0) < AT_LEAST)
            .collect()
    }

    /// Counts `op`'s result; `over` says a rename's new name existed.
    fn count(&mut self, op: &Op, over: bool, errno: Option<i32>) {
        let kind = format!("{op:?}");
        let mut kind = kind.split('(').next().unwrap().to_string();
        if over {
            kind.push_str(" over an entry");
        }
        let result = match errno {
            None => "n/a".to_string(),
            Some(0) => "ok".to_string(),
            Some(e) => std::io::Error::from_raw_os_error(e)
                .kind()
                .to_string()
                .replace(' ', "-"),
        };
        *self
            .results
            .entry(kind)
            .or_default()
            .entry(result)
            .or_default() += 1;
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        writeln!(f, "operations run (by the plain directory's answer):")?;
        for (kind, results) in &self.results {
            let results: Vec<String> = results.iter().map(|(r, n)| format!("{r} {n}")).collect();
            writeln!(f, "  {kind}: {}", results.join(", "))?;
        }
        write!(
            f,
            "cases that must happen: {}",
            MUST_HAPPEN
                .iter()
                .map(|c| format!("{c} {}", self.cases.get(c).unwrap_or(&0)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// A handle open on both sides.
struct Slot {
    fh: worktreefs::fs::Fh,
    ino: Ino,
    dir: bool,
    mode: Mode,
    file: File,
}

/// One sequence's two sides: a fresh worktree (in a fresh view) and a fresh plain
/// directory, with the handles open on both.
struct Model {
    c: Core,
    _plain: tempfile::TempDir,
    root: PathBuf,
    slots: Vec<Option<Slot>>,
    umask: u32,
    /// The checkpoints kept: each one's id and the plain directory's copy then.
    kept: Vec<(u64, PathBuf)>,
}

/// What an operation gave: its errno (0 for success) and what it read.
#[derive(PartialEq)]
struct Outcome {
    errno: i32,
    data: Option<Vec<u8>>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match (self.errno, &self.data) {
            (0, None) => write!(f, "ok"),
            (0, Some(data)) => write!(f, "ok {}", shown(data)),
            (errno, _) => write!(f, "{}", errno_name(errno)),
        }
    }
}

/// Text shown as it is.
#[derive(PartialEq)]
struct Text(String);

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Bytes as text, cut after 80 characters.
fn shown(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], data.len()),
        None => format!("{text:?}"),
    }
}

fn errno_name(errno: i32) -> String {
    let names = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EIO, "EIO"),
        (libc::EBADF, "EBADF"),
        (libc::EACCES, "EACCES"),
        (libc::EEXIST, "EEXIST"),
        (libc::EXDEV, "EXDEV"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ELOOP, "ELOOP"),
    ];
    match names.iter().find(|(e, _)| *e == errno) {
        Some((_, name)) => name.to_string(),
        None => format!("errno {errno}"),
    }
}

fn errno_of(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn outcome(r: Result<Option<Vec<u8>>, i32>) -> Outcome {
    match r {
        Ok(data) => Outcome { errno: 0, data },
        Err(errno) => Outcome { errno, data: None },
    }
}

/// pread until `len` bytes or the end, as the view's read does; at least once (a
/// directory's answers EISDIR even for no bytes).
fn pread(file: &File, offset: u64, len: u32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut done = file.read_at(&mut buf, offset)?;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    buf.truncate(done);
    Ok(buf)
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn libc_result(r: libc::c_int) -> Result<(), i32> {
    match r {
        0 => Ok(()),
        _ => Err(errno_of(std::io::Error::last_os_error())),
    }
}

fn mtime(secs: u64, nsecs: u32) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs, nsecs)
}

impl Model {
    fn new(env: &Rc<Env>, store: &mut Store, name: &str) -> Model {
        let c = core_in(env, store, name);
        let plain = tempfile::tempdir().unwrap();
        // One level down: the parent holds nothing a `..` could find.
        let root = plain.path().join("w");
        fs::create_dir(&root).unwrap();
        // The plain directory starts as a checkout of the same commit, with the empty
        // directory a checkout leaves for the submodule, and the modes git records
        // whatever the umask.
        run_ok(
            "git",
            &[
                "--work-tree",
                root.to_str().unwrap(),
                "checkout",
                "HEAD",
                "--",
                ".",
            ],
            &env.repo.path(),
        );
        fs::create_dir_all(root.join("vendor/sub")).unwrap();
        normalize_modes(&root);
        Model {
            c,
            _plain: plain,
            root,
            slots: (0..SLOTS).map(|_| None).collect(),
            umask: umask(),
            kept: Vec::new(),
        }
    }

    /// Runs `ops`, checking after each step; the error names the step and the log so far.
    fn run(&mut self, ops: &[Op], tally: &mut Tally) -> Result<(), String> {
        let mut log = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            let over = match op {
                Op::Rename(_, b) => fs::symlink_metadata(self.root.join(b)).is_ok(),
                _ => false,
            };
            let case = self.case_of(op);
            let outcome = self.step(op);
            tally.count(op, over, outcome.as_ref().map(|(want, _)| want.errno));
            if let (Some(case), Some((Outcome { errno: 0, .. }, _))) = (case, &outcome) {
                *tally.cases.entry(case).or_default() += 1;
            }
            let Some((want, got)) = outcome else {
                log.push(format!("{step}: {op:?} -> not applicable"));
                continue;
            };
            log.push(format!("{step}: {op:?} -> plain {want:?}, view {got:?}"));
            let failed =
                |what: String| format!("step {step}, {op:?}: {what}\nsteps:\n{}", log.join("\n"));
            if want != got {
                return Err(failed(format!("plain {want:?}, view {got:?}")));
            }
            self.check().map_err(failed)?;
            // Handles whose file has no name left, checked (read, fstat) like the others.
            let unnamed = self.slots.iter().flatten();
            let unnamed = unnamed.filter(|s| s.file.metadata().is_ok_and(|m| m.nlink() == 0));
            *tally.cases.entry(HANDLE_WITH_NO_NAME).or_default() += unnamed.count() as u32;
        }
        Ok(())
    }

    /// Which case of [`MUST_HAPPEN`] `op` is, as the plain directory stands before it (it
    /// counts if the plain directory then does it).
    fn case_of(&self, op: &Op) -> Option<&'static str> {
        let meta = |p: &str| fs::symlink_metadata(self.root.join(p)).ok();
        let empty = |p: &str| fs::read_dir(self.root.join(p)).is_ok_and(|mut d| d.next().is_none());
        match op {
            Op::Rename(a, b) => match (meta(a)?, meta(b)?) {
                (ma, mb) if ma.ino() == mb.ino() => None,
                (ma, mb) if ma.is_file() && mb.is_file() => Some(RENAME_FILE_OVER_FILE),
                (ma, mb) if ma.is_dir() && mb.is_dir() && empty(b) => {
                    Some(RENAME_DIR_OVER_EMPTY_DIR)
                }
                _ => None,
            },
            Op::Unlink(p) => {
                let m = meta(p).filter(|m| m.is_file())?;
                let open = self.slots.iter().flatten().any(|s| {
                    s.file
                        .metadata()
                        .is_ok_and(|f| (f.dev(), f.ino()) == (m.dev(), m.ino()))
                });
                open.then_some(UNLINK_OF_AN_OPEN_FILE)
            }
            Op::Link(..) => Some("link"),
            Op::Truncate(..) => Some("truncate"),
            Op::Chmod(..) => Some("chmod"),
            Op::Utimens(..) => Some("utimens"),
            Op::Read(..) => Some("read through a handle"),
            Op::WriteAt(..) => Some("write through a handle"),
            _ => None,
        }
    }

    /// Both sides' views of the whole state: the tree's content, every entry's
    /// attributes, and each open handle's size and first bytes.
    fn check(&self) -> Result<(), String> {
        let ((view, view_meta), plain) = (self.c.tree(), snapshot(&self.root));
        if view != plain {
            let text = |tree: Contents| -> BTreeMap<String, Text> {
                let text =
                    |data: Option<Vec<u8>>| Text(data.map_or("a directory".into(), |d| shown(&d)));
                tree.into_iter().map(|(k, v)| (k, text(v))).collect()
            };
            let (view, plain) = (text(view), text(plain));
            return Err(format!("trees differ:\n{}", diff(&view, &plain)));
        }
        let (view, plain) = (view_meta, plain_meta(&self.root));
        if view != plain {
            return Err(format!("attributes differ:\n{}", diff(&view, &plain)));
        }
        for (i, s) in self.slots.iter().enumerate() {
            let Some(s) = s.as_ref().filter(|s| !s.dir) else {
                continue;
            };
            let view = self
                .c
                .view
                .getattr(s.ino, Some(s.fh))
                .map(|e| Meta::of_view(&e.attr));
            let plain = s.file.metadata().map(|m| Meta::of_plain(&m));
            let (view, plain) = (view.map_err(|e| e.errno()), plain.map_err(errno_of));
            if view != plain {
                return Err(format!("handle {i}: fstat: plain {plain:?}, view {view:?}"));
            }
            if !s.mode.reads() {
                continue;
            }
            let view = outcome(self.c.view.read(s.fh, 0, 4096).map(Some).map_err(view_err));
            let plain = outcome(pread(&s.file, 0, 4096).map(Some).map_err(errno_of));
            if view != plain {
                return Err(format!("handle {i} reads: plain {plain:?}, view {view:?}"));
            }
        }
        Ok(())
    }
}

/// What the view answered: its errno on failure.
fn view_err(e: worktreefs::fs::error::FsError) -> i32 {
    e.errno()
}

impl Model {
    fn worktree(&self) -> worktreefs::ids::WorktreeId {
        self.c.view.worktree_of(self.c.root).unwrap().0
    }

    /// A checkpoint on both sides: the view's, and a copy of the plain directory.
    fn checkpoint(&mut self) -> (Outcome, Outcome) {
        let ok = outcome(Ok(None));
        match self.c.view.take_checkpoint(self.worktree(), None) {
            Ok(info) => {
                let copy = self._plain.path().join(format!("checkpoint-{}", info.id));
                copy_exact(&self.root, &copy);
                self.kept.push((info.id, copy));
                (ok, outcome(Ok(None)))
            }
            Err(e) => (ok, outcome(Err(e.errno()))),
        }
    }

    /// A rewind on both sides: the view's, and the plain directory made its copy at
    /// that checkpoint again (the state left copied first, as the checkpoint the rewind
    /// takes).
    fn rewind(&mut self, k: usize) -> Option<(Outcome, Outcome)> {
        if self.kept.is_empty() {
            return None;
        }
        for s in 0..SLOTS {
            self.release(s);
        }
        let (id, copy) = self.kept[k % self.kept.len()].clone();
        let before = self
            ._plain
            .path()
            .join(format!("before-{}", self.kept.len()));
        copy_exact(&self.root, &before);
        let ok = outcome(Ok(None));
        match self.c.view.rewind(self.worktree(), id) {
            Ok(done) => {
                self.kept.push((done.before.id, before));
                for e in fs::read_dir(&self.root).unwrap() {
                    let p = e.unwrap().path();
                    if fs::symlink_metadata(&p).unwrap().is_dir() {
                        fs::remove_dir_all(&p).unwrap();
                    } else {
                        fs::remove_file(&p).unwrap();
                    }
                }
                copy_into(&copy, &self.root);
                Some((ok, outcome(Ok(None))))
            }
            Err(e) => Some((ok, outcome(Err(e.errno())))),
        }
    }

    fn release(&mut self, slot: usize) -> bool {
        match self.slots[slot].take() {
            Some(s) => {
                self.c.view.release(s.fh);
                true
            }
            None => false,
        }
    }

    /// The handle an operation on slot `k` uses: the first open at `k` or after it (round
    /// the slots) that allows it. A dir handle is opened for reading only.
    fn pick(&self, k: usize, allows: impl Fn(&Slot) -> bool) -> Option<&Slot> {
        (0..SLOTS)
            .filter_map(|i| self.slots[(k + i) % SLOTS].as_ref())
            .find(|s| allows(s))
    }

    /// Applies one operation to both sides: (plain, view); None where it does not apply
    /// (an empty slot, a read or write the handle's mode refuses, which the kernel answers
    /// itself).
    fn step(&mut self, op: &Op) -> Option<(Outcome, Outcome)> {
        match op {
            Op::Checkpoint => return Some(self.checkpoint()),
            Op::Rewind(k) => return self.rewind(*k),
            _ => {}
        }
        let root = self.root.clone();
        let p = |s: &str| root.join(s);
        let done = |r: std::io::Result<()>| outcome(r.map(|_| None).map_err(errno_of));
        let c = &self.c;
        let (plain, view) = match op {
            Op::Write(path, data) => (
                done(fs::write(p(path), data)),
                outcome(self.view_write(path, data.as_bytes()).map(|_| None)),
            ),
            Op::Unlink(path) => (
                done(fs::remove_file(p(path))),
                outcome(c.walk_path(path, false).and_then(|w| {
                    match w.found {
                        Some(_) => c
                            .view
                            .unlink(w.parent(), w.name())
                            .map(|_| None)
                            .map_err(view_err),
                        None => Err(libc::ENOENT),
                    }
                })),
            ),
            Op::Mkdir(path) => (
                done(fs::create_dir(p(path))),
                outcome(c.walk_path(path, false).and_then(|w| {
                    match w.found {
                        Some(_) => Err(libc::EEXIST),
                        None => c
                            .view
                            .mkdir(w.parent(), w.name(), 0o777, self.umask, ME)
                            .map(|_| None)
                            .map_err(view_err),
                    }
                })),
            ),
            Op::Rmdir(path) => (
                done(fs::remove_dir(p(path))),
                outcome(c.walk_path(path, false).and_then(|w| {
                    match w.found {
                        Some(_) => c
                            .view
                            .rmdir(w.parent(), w.name())
                            .map(|_| None)
                            .map_err(view_err),
                        None => Err(libc::ENOENT),
                    }
                })),
            ),
            Op::Rename(a, b) => (
                done(fs::rename(p(a), p(b))),
                outcome(self.view_rename(a, b).map(|_| None)),
            ),
            Op::Link(a, b) => (
                done(fs::hard_link(p(a), p(b))),
                outcome(self.view_link(a, b).map(|_| None)),
            ),
            Op::Symlink(target, path) => (
                done(std::os::unix::fs::symlink(target, p(path))),
                outcome(c.walk_path(path, false).and_then(|w| {
                    match w.found {
                        Some(_) => Err(libc::EEXIST),
                        None => c
                            .view
                            .symlink(w.parent(), w.name(), Path::new(target), ME)
                            .map(|_| None)
                            .map_err(view_err),
                    }
                })),
            ),
            Op::Readlink(path) => (
                outcome(
                    fs::read_link(p(path))
                        .map(|t| Some(t.into_os_string().into_encoded_bytes()))
                        .map_err(errno_of),
                ),
                outcome(c.walk_path(path, false).and_then(|w| match w.found {
                    Some((ino, _)) => c.view.readlink(ino).map(Some).map_err(view_err),
                    None => Err(libc::ENOENT),
                })),
            ),
            Op::Truncate(path, size) => (
                // SAFETY: a NUL-terminated path.
                outcome(
                    libc_result(unsafe { libc::truncate(cpath(&p(path)).as_ptr(), *size as i64) })
                        .map(|_| None),
                ),
                outcome(self.view_setattr(
                    path,
                    SetAttr {
                        size: Some(*size),
                        ..SetAttr::default()
                    },
                )),
            ),
            Op::Chmod(path, perm) => (
                done(fs::set_permissions(
                    p(path),
                    fs::Permissions::from_mode(perm.0),
                )),
                outcome(self.view_setattr(
                    path,
                    SetAttr {
                        mode: Some(perm.0),
                        ..SetAttr::default()
                    },
                )),
            ),
            Op::Utimens(path, secs, nsecs) => {
                let times = [
                    libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    },
                    libc::timespec {
                        tv_sec: *secs as libc::time_t,
                        tv_nsec: *nsecs as libc::c_long,
                    },
                ];
                // SAFETY: a NUL-terminated path and two timespecs.
                let r = unsafe {
                    libc::utimensat(libc::AT_FDCWD, cpath(&p(path)).as_ptr(), times.as_ptr(), 0)
                };
                let set = SetAttr {
                    mtime: Some(Some(mtime(*secs, *nsecs))),
                    ..SetAttr::default()
                };
                (
                    outcome(libc_result(r).map(|_| None)),
                    outcome(self.view_setattr(path, set)),
                )
            }
            Op::Open(slot, path, mode) => {
                self.release(*slot);
                let plain = mode.options().mode(0o666).open(p(path)).map_err(errno_of);
                let view = self.view_open(path, *mode);
                let result = (
                    outcome(plain.as_ref().map(|_| None).map_err(|e| *e)),
                    outcome(view.map(|_| None)),
                );
                match (plain, view) {
                    (Ok(file), Ok((fh, ino, dir))) => {
                        self.slots[*slot] = Some(Slot {
                            fh,
                            ino,
                            dir,
                            mode: *mode,
                            file,
                        })
                    }
                    (_, Ok((fh, _, _))) => self.c.view.release(fh),
                    _ => {}
                }
                result
            }
            Op::Read(slot, offset, len) => {
                let s = self.pick(*slot, |s| s.mode.reads())?;
                (
                    outcome(pread(&s.file, *offset, *len).map(Some).map_err(errno_of)),
                    outcome(c.view.read(s.fh, *offset, *len).map(Some).map_err(view_err)),
                )
            }
            Op::WriteAt(slot, offset, data) => {
                let s = self.pick(*slot, |s| s.mode.writes())?;
                let plain = done(s.file.write_all_at(data.as_bytes(), *offset));
                // With O_APPEND the kernel writes at the end of the file as it knows it.
                let offset = match s.mode {
                    Mode::Append => match c.view.getattr(s.ino, Some(s.fh)) {
                        Ok(e) => e.attr.size,
                        Err(e) => return Some((plain, outcome(Err(e.errno())))),
                    },
                    _ => *offset,
                };
                let view = c
                    .view
                    .write(s.fh, offset, data.as_bytes())
                    .map_err(view_err);
                let view = view
                    .map(|n| (n as usize != data.len()).then(|| format!("wrote {n}").into_bytes()));
                (plain, outcome(view))
            }
            Op::Ftruncate(slot, size) => {
                let s = self.pick(*slot, |s| s.mode.writes())?;
                let set = SetAttr {
                    size: Some(*size),
                    fh: Some(s.fh),
                    ..SetAttr::default()
                };
                (
                    done(s.file.set_len(*size)),
                    outcome(c.view.setattr(s.ino, set).map(|_| None).map_err(view_err)),
                )
            }
            Op::Release(slot) => {
                let i = (0..SLOTS)
                    .map(|i| (slot + i) % SLOTS)
                    .find(|&i| self.slots[i].is_some())?;
                self.release(i);
                (outcome(Ok(None)), outcome(Ok(None)))
            }
            Op::Checkpoint | Op::Rewind(_) => unreachable!("answered above"),
        };
        Some((plain, view))
    }

    /// `fs::write`: open(O_WRONLY | O_CREAT | O_TRUNC), following a symlink at the end
    /// (creating its missing target), then one write.
    fn view_write(&self, path: &str, data: &[u8]) -> Result<(), i32> {
        let c = &self.c;
        let w = c.walk_path(path, true)?;
        let fh = match w.found {
            Some((ino, _)) => {
                c.view
                    .open(ino, libc::O_WRONLY | libc::O_TRUNC)
                    .map_err(view_err)?
                    .0
            }
            None => {
                c.view
                    .create(
                        w.parent(),
                        w.name(),
                        libc::S_IFREG | 0o666,
                        self.umask,
                        libc::O_WRONLY,
                        ME,
                    )
                    .map_err(view_err)?
                    .1
            }
        };
        let r = c.view.write(fh, 0, data).map(|_| ()).map_err(view_err);
        c.view.release(fh);
        r
    }

    /// open(2) of `path`, following a symlink at the end: (handle, inode, whether it is a
    /// directory's). A directory opened read-only is the kernel's OPENDIR.
    fn view_open(&self, path: &str, mode: Mode) -> Result<(worktreefs::fs::Fh, Ino, bool), i32> {
        let c = &self.c;
        let w = c.walk_path(path, true)?;
        match w.found {
            Some((ino, FType::Dir)) if mode == Mode::Read => {
                Ok((c.view.opendir(ino).map_err(view_err)?.0, ino, true))
            }
            Some((ino, _)) => Ok((
                c.view.open(ino, mode.flags()).map_err(view_err)?.0,
                ino,
                false,
            )),
            None if mode == Mode::Create => {
                let (e, fh) = c
                    .view
                    .create(
                        w.parent(),
                        w.name(),
                        libc::S_IFREG | 0o666,
                        self.umask,
                        mode.flags(),
                        ME,
                    )
                    .map_err(view_err)?;
                Ok((fh, e.attr.ino, false))
            }
            None => Err(libc::ENOENT),
        }
    }

    /// rename(2): the kernel's own checks first (a missing source; a directory moved
    /// below itself, EINVAL; over one of its own ancestors, ENOTEMPTY; two names of one
    /// inode, nothing to do), then the view's.
    fn view_rename(&self, a: &str, b: &str) -> Result<(), i32> {
        let c = &self.c;
        let (wa, wb) = (c.walk_path(a, false)?, c.walk_path(b, false)?);
        let Some((src, _)) = wa.found else {
            return Err(libc::ENOENT);
        };
        if wb.dirs.contains(&src) {
            return Err(libc::EINVAL);
        }
        if let Some((dst, _)) = wb.found {
            if wa.dirs.contains(&dst) {
                return Err(libc::ENOTEMPTY);
            }
            if dst == src {
                return Ok(());
            }
        }
        c.view
            .rename(wa.parent(), wa.name(), wb.parent(), wb.name(), 0)
            .map_err(view_err)
    }

    /// link(2), which follows no symlink: a missing source is ENOENT and an existing new
    /// name EEXIST, both answered by the kernel.
    fn view_link(&self, a: &str, b: &str) -> Result<(), i32> {
        let c = &self.c;
        let Some((ino, _)) = c.walk_path(a, false)?.found else {
            return Err(libc::ENOENT);
        };
        let wb = c.walk_path(b, false)?;
        if wb.found.is_some() {
            return Err(libc::EEXIST);
        }
        c.view
            .link(ino, wb.parent(), wb.name())
            .map(|_| ())
            .map_err(view_err)
    }

    /// A setattr by path (truncate, chmod, utimensat), following a symlink at the end.
    fn view_setattr(&self, path: &str, set: SetAttr) -> Result<Option<Vec<u8>>, i32> {
        let c = &self.c;
        match c.walk_path(path, true)?.found {
            Some((ino, _)) => c.view.setattr(ino, set).map(|_| None).map_err(view_err),
            None => Err(libc::ENOENT),
        }
    }
}

/// Sets the modes git records (0644, 0755 for an executable, 0755 for a directory), which
/// a checkout gives only under the umask 022.
fn normalize_modes(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        let mode = if m.is_dir() {
            normalize_modes(&e.path());
            0o755
        } else if m.is_symlink() {
            continue;
        } else if m.mode() & 0o100 != 0 {
            0o755
        } else {
            0o644
        };
        fs::set_permissions(e.path(), fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// The entries where two maps differ, one a line.
fn diff<V: PartialEq + std::fmt::Debug>(
    view: &BTreeMap<String, V>,
    plain: &BTreeMap<String, V>,
) -> String {
    let mut keys: Vec<&String> = view.keys().chain(plain.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| view.get(*k) != plain.get(*k))
        .map(|k| {
            let at = |m: &BTreeMap<String, V>| match m.get(k) {
                Some(v) => format!("{v:?}"),
                None => "absent".to_string(),
            };
            format!("  {k}: plain {}, view {}", at(plain), at(view))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Random sequences of up to 40 operations, 128 of them (`PROPTEST_CASES` sets another
/// number; about 10 s in a debug build), from a fixed seed unless `PROPTEST_RNG_SEED`
/// gives one, so CI runs the same sequences each time. Each runs in a fresh worktree of
/// one repository, in a fresh view, beside a fresh plain directory. A failure is shrunk to
/// a minimal sequence, which the panic shows; no failure is persisted (a failing sequence
/// worth keeping becomes a test of its own). `--nocapture` shows what the sequences did.
#[test]
fn random_operations_agree_with_a_plain_directory() {
    let env = Rc::new(Env::new());
    let state = StateDir::open(&env.state()).unwrap();
    let store = RefCell::new(Store::open(&state.root).unwrap());
    let made = Cell::new(0);
    // The length of the first sequence that failed, before shrinking.
    let first_failure = Cell::new(0);
    let tally = RefCell::new(Tally::default());
    let mut config = Config {
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 128;
    }
    // The cases of `MUST_HAPPEN` are required of a run from the fixed seed, of the
    // default length or longer: that run is known to reach each of them a dozen times;
    // another seed may fall short by chance, which is no disagreement.
    let fixed_seed = std::env::var_os("PROPTEST_RNG_SEED").is_none();
    let whole_run = fixed_seed && config.cases >= 128;
    if fixed_seed {
        config.rng_seed = RngSeed::Fixed(0x7767_6673);
    }
    let mut runner = TestRunner::new(config);
    let sequences = proptest::collection::vec(op_strategy(), 1..=40);
    let result = runner.run(&sequences, |ops| {
        made.set(made.get() + 1);
        let name = format!("m{}", made.get());
        let mut model = Model::new(&env, &mut store.borrow_mut(), &name);
        let result = model.run(&ops, &mut tally.borrow_mut());
        if result.is_err() && first_failure.get() == 0 {
            first_failure.set(ops.len());
        }
        result.map_err(TestCaseError::fail)
    });
    eprintln!("{}", tally.borrow());
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => {
            let listed: Vec<String> = ops.iter().map(|o| format!("  {o:?},")).collect();
            panic!(
                "the view disagrees with a plain directory\n\
                 minimal sequence ({} steps, shrunk from {}):\n{}\n{why}",
                ops.len(),
                first_failure.get(),
                listed.join("\n")
            )
        }
        Err(e) => panic!("{e}"),
    }
    let missing = tally.borrow().missing();
    assert!(
        !whole_run || missing.is_empty(),
        "the sequences did these fewer than {AT_LEAST} times: {}",
        missing.join(", ")
    );
}

#[test]
fn a_handle_opened_on_the_base_reads_the_copy_up_after_it() {
    let c = core();
    let (_, ino) = c.resolve("README.md").unwrap();
    let reader = c.view.open(ino, libc::O_RDONLY).unwrap().0;
    assert_eq!(c.view.read(reader, 0, 100).unwrap(), b"# test repository\n");
    // Reads of an unchanged file keep using the cached blob.
    assert_eq!(c.view.read(reader, 2, 4).unwrap(), b"test");
    let writer = c.view.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().0;
    c.view.write(writer, 0, b"rewritten").unwrap();
    c.view.release(writer);
    assert_eq!(c.view.read(reader, 0, 100).unwrap(), b"rewritten");
    c.view.release(reader);
}

/// A lookup raises the node's count before it reads the entry's attributes; when those
/// cannot be read, the kernel gets the error and never learns of the node, so the count
/// must be given back (or the node stays for good: with READDIRPLUS every listed name is
/// looked up this way).
#[test]
fn a_lookup_whose_attributes_fail_leaves_no_node_behind() {
    let c = core();
    let repo = c._env.repo.path();
    let oid = git(&repo, &["rev-parse", "HEAD:README.md"]);
    let oid = oid.trim();
    let object = repo.join(".git/objects").join(&oid[..2]).join(&oid[2..]);
    assert!(
        object.exists(),
        "the fixture's blob {oid} is not a loose object"
    );
    // The blob's size is then read from the object database, which no longer has it.
    let state = StateDir::open(&c._env.state()).unwrap();
    fs::remove_dir_all(state.index_cache()).unwrap();
    fs::remove_file(&object).unwrap();
    let before = c.view.node_count();
    for listed in [false, true] {
        let name = OsStr::new("README.md");
        let r = if listed {
            c.view.lookup_listed(c.root, name)
        } else {
            c.view.lookup(c.root, name)
        };
        assert_eq!(
            r.err().map(|e| e.errno()),
            Some(libc::EIO),
            "listed: {listed}"
        );
        assert_eq!(c.view.node_count(), before, "listed: {listed}");
    }
}

/// A creation copies its commit's cached index and finishes the checksum from a saved hash
/// state. Every worktree's index must still carry the right checksum and read back whole,
/// whether the cached index was built by that creation, reused, or reused with its saved
/// state missing or saved for other content (the cache from another version, say).
#[test]
fn every_worktree_index_has_the_right_checksum_however_its_cached_index_was_found() {
    use sha1::Digest;
    let env = Env::new();
    // The cache is keyed by the commit's time, which a creation clamps to a second ago: a
    // commit made just now would give each creation a second later another key (and a
    // fresh cache) on a slow machine. This test needs every creation to find one cache.
    let amended = std::process::Command::new("git")
        .args(["commit", "-q", "--amend", "--no-edit", "--date=@1600000000"])
        .env("GIT_COMMITTER_DATE", "@1600000000")
        .current_dir(env.repo.path())
        .status()
        .unwrap();
    assert!(amended.success());
    let state = StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&state.root).unwrap();
    let tracked = run_ok("git", &["ls-files"], &env.repo.path())
        .lines()
        .count();
    let mut create_and_check = |name: &str| {
        create_at_head(&state, &mut store, name);
        let path = env
            .repo
            .path()
            .join(".git/worktrees")
            .join(format!("wtfs-{name}"))
            .join("index");
        let index = fs::read(&path).unwrap();
        let (body, checksum) = index.split_at(index.len() - 20);
        assert_eq!(sha1::Sha1::digest(body).as_slice(), checksum, "{name}");
        assert_eq!(git2::Index::open(&path).unwrap().len(), tracked, "{name}");
    };
    create_and_check("built");
    create_and_check("reused");
    let saved: Vec<_> = fs::read_dir(state.index_cache())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some(OsStr::new("sha1")))
        .collect();
    assert_eq!(
        saved.len(),
        1,
        "one saved state per cached index: {saved:?}"
    );
    let saved = &saved[0];
    let good = fs::read(saved).unwrap();

    fs::remove_file(saved).unwrap();
    create_and_check("state-missing");
    assert_eq!(fs::read(saved).unwrap(), good, "the state is saved again");

    // Another hash state over as many bytes, saved for content with another checksum.
    let mut other = good.clone();
    for (i, b) in other.iter_mut().enumerate() {
        if !(20..28).contains(&i) {
            *b ^= 0x5a;
        }
    }
    fs::write(saved, &other).unwrap();
    create_and_check("state-for-other-content");
    assert_eq!(fs::read(saved).unwrap(), good, "the state is replaced");
}

#[test]
fn a_base_file_is_taken_from_the_blob_cache_at_its_first_read_not_at_open() {
    let c = core();
    let (parent, ino) = c.resolve("README.md").unwrap();
    let before = c.view.blob_fills();
    let h = c.view.open(ino, libc::O_RDONLY).unwrap().0;
    // A warm open (the kernel has the pages) never reads: it costs no blob.
    assert_eq!(c.view.blob_fills(), before);
    // Removed before the first read: the handle still reads what it opened.
    c.view.unlink(parent, OsStr::new("README.md")).unwrap();
    assert_eq!(c.view.read(h, 0, 100).unwrap(), b"# test repository\n");
    assert_eq!(c.view.blob_fills(), before + 1);
    c.view.release(h);

    // Copied up (truncated) before the first read: the handle reads the new content, and
    // the old blob was never needed.
    let (_, ino) = c.resolve("src/main.rs").unwrap();
    let reader = c.view.open(ino, libc::O_RDONLY).unwrap().0;
    let writer = c.view.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap().0;
    c.view.write(writer, 0, b"rewritten").unwrap();
    c.view.release(writer);
    assert_eq!(c.view.read(reader, 0, 100).unwrap(), b"rewritten");
    assert_eq!(c.view.blob_fills(), before + 1);
    c.view.release(reader);
}

/// Worktrees are isolated: a rename or a link from one worktree into another
/// (of the same repository or another), or into or out of `.control`, answers EXDEV as
/// between two filesystems, and every side keeps what it had. Within a worktree both work.
#[test]
fn rename_and_link_across_worktrees_answer_exdev() {
    let env = Env::new();
    let _other = env.add_repo("other");
    let state = StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&state.root).unwrap();
    create_at_head(&state, &mut store, "a");
    create_at_head(&state, &mut store, "b");
    create_in(&state, &mut store, "other", "c");
    let view = View::new(state, env.mountpoint()).unwrap();
    let look = |dir: Ino, name: &str| view.lookup(dir, OsStr::new(name)).map(|e| e.attr.ino);
    let repo = look(ROOT_INO, "repo").unwrap();
    let other_repo = look(ROOT_INO, "other").unwrap();
    let (a, b) = (look(repo, "a").unwrap(), look(repo, "b").unwrap());
    let c = look(other_repo, "c").unwrap();
    let control = look(ROOT_INO, ".control").unwrap();
    let src = look(a, "src").unwrap();
    let readme = look(a, "README.md").unwrap();
    let rename = |from: Ino, name: &str, to: Ino, newname: &str| {
        view.rename(from, OsStr::new(name), to, OsStr::new(newname), 0)
            .map_err(|e| e.errno())
    };
    let link = |ino: Ino, to: Ino, newname: &str| {
        view.link(ino, to, OsStr::new(newname))
            .map(|_| ())
            .map_err(|e| e.errno())
    };
    let exdev = Err(libc::EXDEV);
    assert_eq!(
        rename(a, "README.md", b, "moved.md"),
        exdev,
        "file to a sibling"
    );
    assert_eq!(
        rename(src, "main.rs", b, "main.rs"),
        exdev,
        "from a subdirectory"
    );
    assert_eq!(rename(a, "src", b, "src2"), exdev, "a directory");
    assert_eq!(
        rename(a, "README.md", c, "moved.md"),
        exdev,
        "another repository"
    );
    assert_eq!(rename(a, "README.md", control, "x"), exdev, "into .control");
    assert_eq!(
        rename(control, "status", a, "status"),
        exdev,
        "out of .control"
    );
    assert_eq!(
        rename(repo, "a", other_repo, "a"),
        exdev,
        "a worktree to another repo"
    );
    assert_eq!(link(readme, b, "linked.md"), exdev);
    assert_eq!(link(readme, c, "linked.md"), exdev);
    // Nothing moved.
    assert!(look(a, "README.md").is_ok() && look(src, "main.rs").is_ok());
    for (dir, name) in [
        (b, "moved.md"),
        (b, "main.rs"),
        (b, "src2"),
        (c, "moved.md"),
    ] {
        assert_eq!(
            look(dir, name).err().map(|e| e.errno()),
            Some(libc::ENOENT),
            "{name}"
        );
    }
    assert!(look(b, "linked.md").is_err() && look(c, "linked.md").is_err());
    // Within one worktree, as before.
    assert_eq!(rename(a, "README.md", src, "README.md"), Ok(()));
    assert_eq!(link(look(src, "README.md").unwrap(), a, "again.md"), Ok(()));
}

/// A copy-up adds the file to its directory's upper copy, but on ext4 truncating (or
/// chmod-ing, or opening for writing) a file leaves its directory's mtime alone, and so
/// does the view: the directory's times are put back after the copy-up's rename.
#[test]
fn a_copy_up_leaves_its_directory_s_mtime_alone() {
    let c = core();
    let set = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let (_, src) = c.resolve("src").unwrap();
    c.view
        .setattr(
            src,
            SetAttr {
                mtime: Some(Some(set)),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!(c.view.getattr(src, None).unwrap().attr.mtime, set);
    let (_, main) = c.resolve("src/main.rs").unwrap();
    c.view
        .setattr(
            main,
            SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!(c.view.getattr(src, None).unwrap().attr.mtime, set);
    // A directory still in the base, copied up on the way (parents first), keeps its
    // base time too, and so does its parent.
    let (_, lib) = c.resolve("src/lib").unwrap();
    let before = c.view.getattr(lib, None).unwrap().attr.mtime;
    let (_, module) = c.resolve("src/lib/mod.rs").unwrap();
    c.view
        .setattr(
            module,
            SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!(c.view.getattr(lib, None).unwrap().attr.mtime, before);
    assert_eq!(c.view.getattr(src, None).unwrap().attr.mtime, set);
}

/// Renaming a directory copies its base entries up into it first (so it can move
/// without its base), and on ext4 the directory keeps its mtime through a rename, as it
/// does here: the copy-up below it is no change of it.
#[test]
fn a_renamed_directory_keeps_its_mtime() {
    let c = core();
    let set = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let (_, docs) = c.resolve("docs").unwrap();
    c.view
        .setattr(
            docs,
            SetAttr {
                mtime: Some(Some(set)),
                ..SetAttr::default()
            },
        )
        .unwrap();
    c.view
        .rename(c.root, OsStr::new("docs"), c.root, OsStr::new("moved"), 0)
        .unwrap();
    let (_, moved) = c.resolve("moved").unwrap();
    assert_eq!(c.view.getattr(moved, None).unwrap().attr.mtime, set);
}

/// Copies the directory `from` to the new `to` exactly: data, modes, symlinks, groups of
/// hard links, and times (a directory's after what goes in it).
fn copy_exact(from: &Path, to: &Path) {
    fs::create_dir(to).unwrap();
    copy_into(from, to);
}

/// As [`copy_exact`], into the existing (empty) directory `to`, which gets `from`'s mode
/// and times.
fn copy_into(from: &Path, to: &Path) {
    fn times(p: &Path, m: &fs::Metadata) {
        let ts = |s: i64, ns: i64| libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        };
        let t = [ts(m.atime(), m.atime_nsec()), ts(m.mtime(), m.mtime_nsec())];
        // SAFETY: a path and two times.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                cpath(p).as_ptr(),
                t.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(rc, 0, "utimensat {}", p.display());
    }
    fn walk(from: &Path, to: &Path, links: &mut BTreeMap<u64, PathBuf>) {
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let (src, dst) = (e.path(), to.join(e.file_name()));
            let m = fs::symlink_metadata(&src).unwrap();
            if m.is_dir() {
                fs::create_dir(&dst).unwrap();
                walk(&src, &dst, links);
                fs::set_permissions(&dst, m.permissions()).unwrap();
                times(&dst, &m);
            } else if let Some(first) = links.get(&m.ino()) {
                fs::hard_link(first, &dst).unwrap();
            } else if m.file_type().is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
                if m.nlink() > 1 {
                    links.insert(m.ino(), dst);
                }
            } else {
                fs::write(&dst, fs::read(&src).unwrap()).unwrap();
                fs::set_permissions(&dst, m.permissions()).unwrap();
                times(&dst, &m);
                if m.nlink() > 1 {
                    links.insert(m.ino(), dst);
                }
            }
        }
    }
    walk(from, to, &mut BTreeMap::new());
    let m = fs::metadata(from).unwrap();
    fs::set_permissions(to, m.permissions()).unwrap();
    times(to, &m);
}
