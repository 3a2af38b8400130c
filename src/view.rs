//! The copy-on-write view: the namespace of a mount and every worktree's overlay.
//!
//! Everything here is callable without a mount; `fuse.rs` only translates. A worktree
//! entry is the merge of a **base** (the tree of the base commit, read lazily through
//! `ObjectCache`) and an **upper** layer (real files under `<state>/worktrees/<id>/upper`).
//!
//! ## Upper-layer format
//!
//! * A file, symlink or directory present in the upper layer wins over the base.
//! * A whiteout for name `N` is an empty regular file `.wtfs-wh.N` in the same upper
//!   directory; it hides the base entry `N`. An upper entry `N` next to a whiteout for
//!   `N` still wins (that is how a crash between the two steps of a change resolves).
//! * An opaque directory holds an empty file `.wtfs-opaque`: nothing of the base below it
//!   shows through.
//! * Names starting with `.wtfs-` are reserved in the view (EINVAL on create).
//!
//! Every change is ordered so a crash between its steps leaves either the old or the new
//! view: a whiteout is written before the upper entry it replaces is removed, an upper
//! entry is created before its whiteout is dropped, copy-up and opaque directories are
//! built in the work directory and renamed into place.
//!
//! ## Locks (take them in this order, never the reverse)
//!
//! 1. `mutate`: one namespace change at a time (create, unlink, rename, copy-up, …).
//! 2. `nodes`: the inode table (read-locked by lookups, getattr and path resolution;
//!    write-locked to add, move or forget nodes).
//! 3. `handles`: open file and directory handles.
//! 4. `catalog` and `store`: repositories and worktrees known from SQLite (only taken at
//!    the top of the mount and in `mkdir` of a worktree, never on the read path).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use git2::Oid;
use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::blobcache::BlobCache;
use crate::error::{FsError, FsResult};
use crate::gitlayer::{self, ObjectCache, MODE_EXEC, MODE_GITLINK, MODE_LINK, MODE_TREE};
use crate::ino;
use crate::inomap::{ChildIndex, InoMap};
use crate::state::StateDir;
use crate::store::{RepoRow, Store, WorktreeRow};
use crate::worktree::{self, CreateRequest};

pub const ROOT_INO: u64 = 1;
const CONTROL_INO: u64 = 2;
const CTRL_LEASES_INO: u64 = 3;
const CTRL_WORKTREES_INO: u64 = 4;
const CTRL_RETAINED_INO: u64 = 5;
const CTRL_STATUS_INO: u64 = 6;
const CTRL_STATS_INO: u64 = 7;
const CTRL_FSMONITOR_INO: u64 = 8;
const REPO_INO_BASE: u64 = 1 << 61;
const DYNAMIC_INO_BIT: u64 = 1 << 62;

pub const CONTROL_NAME: &str = ".control";
pub const RESERVED_PREFIX: &[u8] = b".wtfs-";
pub const WHITEOUT_PREFIX: &str = ".wtfs-wh.";
pub const OPAQUE_MARKER: &str = ".wtfs-opaque";
pub const GITFILE_NAME: &str = ".git";
/// Looking up `.control/refresh` makes the daemon re-read the store at once.
pub const REFRESH_NAME: &str = "refresh";

/// Worktree entries (the worktree's own directory included) change only through this
/// daemon, and every such change is a request the kernel makes and so accounts for: the
/// kernel may cache them, names (present or absent) and attributes, for long. Without
/// that, every path walk inside a worktree would cost a GETATTR of the worktree's
/// directory for the permission check, and every file looked up again after a short TTL
/// a LOOKUP.
const WT_STABLE_TTL: Duration = Duration::from_secs(3600);
/// Upper-layer regular files: with passthrough, writes through a shared mapping of the
/// backing file do not reach the FUSE inode's attributes (the kernel re-reads them when
/// the file is mapped, written or read, not after each write through a mapping): their
/// cached mtime is re-read after this long.
const WT_TTL: Duration = Duration::from_secs(60);
/// Repositories come and go through the CLI, another process: cached briefly.
const TOP_TTL: Duration = Duration::from_secs(1);
/// `.control` files change with every lease and state change: never cached.
const CONTROL_TTL: Duration = Duration::ZERO;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FType {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FType {
    fn from_mode(mode: u32) -> FType {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FType::Dir,
            libc::S_IFLNK => FType::Symlink,
            libc::S_IFIFO => FType::Fifo,
            libc::S_IFSOCK => FType::Socket,
            libc::S_IFCHR => FType::CharDev,
            libc::S_IFBLK => FType::BlockDev,
            _ => FType::File,
        }
    }
    fn from_git_mode(mode: u32) -> FType {
        match mode {
            MODE_TREE | MODE_GITLINK => FType::Dir,
            MODE_LINK => FType::Symlink,
            _ => FType::File,
        }
    }
}

/// What `stat` reports; the FUSE adapter copies it into fuser's struct.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FType,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Attr,
    pub ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FType,
    pub name: OsString,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Option<SystemTime>>,
    pub mtime: Option<Option<SystemTime>>,
    pub fh: Option<u64>,
}

pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Who asks: used for the owner of what a request creates.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A worktree as the view needs it, built from its row.
#[derive(Debug)]
pub struct WtCtx {
    pub id: i64,
    pub repo_id: i64,
    pub repo: String,
    pub name: String,
    pub gitdir: PathBuf,
    pub base_tree: Oid,
    pub base_mtime: SystemTime,
    pub uid: u32,
    pub gid: u32,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub gitfile: Vec<u8>,
    /// Whether blob sizes were seeded from the cached index of the base tree.
    sizes_seeded: std::sync::atomic::AtomicBool,
    /// Paths changed through this view, for git's fsmonitor hook.
    journal: Mutex<crate::fsmonitor::Journal>,
    /// Bumped by every fsmonitor query; an open file records its path again on its first
    /// write after a query (see `write`).
    query_epoch: AtomicU64,
    /// Inodes open for writing, with how many handles: every fsmonitor query reports them
    /// as changed, since with FUSE passthrough their writes never reach the daemon. Each is
    /// recorded in the journal again when its last writer closes.
    open_writers: Mutex<HashMap<u64, usize>>,
}

#[derive(Debug, Clone, Copy)]
struct BaseRef {
    oid: Oid,
    mode: u32,
}

/// A worktree entry's place in the overlay.
#[derive(Debug, Clone, Copy)]
struct Overlay {
    ftype: FType,
    /// Directories: the base tree merged underneath (None when new or opaque).
    /// Files and symlinks: the base object, used while the entry is not in the upper layer.
    base: Option<BaseRef>,
    in_upper: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ControlDir {
    Top,
    Leases,
    Worktrees,
    Retained,
    /// `<repo>:<worktree>@<token>`: git's fsmonitor hook reads what changed (see fsmonitor.rs).
    FsMonitor,
}

#[derive(Debug, Clone)]
enum NodeKind {
    Root,
    ControlDir(ControlDir),
    ControlFile(ControlDir, String),
    Repo(i64),
    /// A worktree entry; `is_root` for the worktree's own directory.
    Wt {
        wt: Arc<WtCtx>,
        ov: Overlay,
        is_root: bool,
    },
    GitFile(Arc<WtCtx>),
}

#[derive(Debug)]
struct Node {
    kind: NodeKind,
    parent: u64,
    name: Box<OsStr>,
    /// The kernel's lookup count. Atomic so a lookup of a known name counts it under the
    /// table's read lock; `forget` (write lock) is the only one that lowers it.
    lookups: AtomicU64,
    unlinked: bool,
}

impl Node {
    fn new(kind: NodeKind, parent: u64, name: &OsStr, lookups: u64) -> Node {
        Node {
            kind,
            parent,
            name: name.into(),
            lookups: AtomicU64::new(lookups),
            unlinked: false,
        }
    }
}

/// The inode table. Memory per node bounds a mount with many worktrees (see
/// `inomap.rs`): nodes live in a slab, and the name index keeps no copy of the names.
struct NodeTable {
    nodes: InoMap<Node>,
    children: ChildIndex,
    /// Further names of hard-linked upper files (rare), by inode.
    aliases: HashMap<u64, Vec<(u64, OsString)>>,
    next_dynamic: u64,
    /// `nodes.len()`, readable without the table's lock (the stats file and the sweeper
    /// read it; a request that holds the lock must never take it again).
    count: Arc<AtomicUsize>,
}

/// Whether `ino` is called `name` in `parent` (its own name or one of its links).
fn has_name(
    nodes: &InoMap<Node>,
    aliases: &HashMap<u64, Vec<(u64, OsString)>>,
    ino: u64,
    parent: u64,
    name: &OsStr,
) -> bool {
    nodes
        .get(&ino)
        .is_some_and(|n| n.parent == parent && &*n.name == name)
        || aliases
            .get(&ino)
            .is_some_and(|v| v.iter().any(|(p, n)| *p == parent && n == name))
}

impl NodeTable {
    fn new(count: Arc<AtomicUsize>) -> NodeTable {
        NodeTable {
            nodes: InoMap::default(),
            children: ChildIndex::default(),
            aliases: HashMap::new(),
            next_dynamic: 0,
            count,
        }
    }

    fn assign_ino(&mut self, natural: u64) -> u64 {
        if natural > ROOT_INO && !self.nodes.contains_key(&natural) {
            return natural;
        }
        // Collision (or a still-open unlinked entry at the same path): keep the low 32 bits
        // git compares, change the high ones.
        loop {
            self.next_dynamic += 1;
            let candidate = DYNAMIC_INO_BIT | (self.next_dynamic << 32) | (natural & 0xffff_ffff);
            if !self.nodes.contains_key(&candidate) {
                return candidate;
            }
        }
    }

    /// The inode named `name` in `parent`.
    fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        self.children
            .get(parent, name, |i| has_name(nodes, aliases, i, parent, name))
    }

    /// Maps `(parent, name)` to `ino` (whose node says so already, or will at once).
    fn map_child(&mut self, parent: u64, name: &OsStr, ino: u64) {
        // Another name of this inode in this directory with the same hash would share the
        // slot, and one slot cannot tell two names of one inode apart: map it exactly.
        // (Hashed only when there is such a name, a rename's or a link's: not for a new
        // node, which `insert_node` maps before the table holds it.)
        let own = self.nodes.get(&ino).map(|n| (n.parent, &*n.name));
        let links = self.aliases.get(&ino).into_iter().flatten();
        let twin = own
            .into_iter()
            .chain(links.map(|(p, n)| (*p, n.as_os_str())))
            .any(|(p, n)| {
                p == parent && n != name && self.children.hash(n) == self.children.hash(name)
            });
        if twin {
            self.children.insert_exact(parent, name, ino);
            return;
        }
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        // The slot may be taken over from a node that is gone or has this very name.
        self.children.insert(parent, name, ino, |i| {
            !nodes.contains_key(&i) || has_name(nodes, aliases, i, parent, name)
        });
    }

    /// Unmaps `(parent, name)`, returning the inode; the node keeps its fields.
    fn unmap_child(&mut self, parent: u64, name: &OsStr) -> Option<u64> {
        let (nodes, aliases) = (&self.nodes, &self.aliases);
        self.children
            .remove(parent, name, |i| has_name(nodes, aliases, i, parent, name))
    }

    /// Adds a node under its own name (`node.parent`, `node.name`).
    /// `ino` is new to the table: its name is mapped first, so no copy of it is needed.
    fn insert_node(&mut self, ino: u64, node: Node) {
        debug_assert!(
            !self.nodes.contains_key(&ino),
            "inode {ino} is in the table"
        );
        if ino != ROOT_INO {
            self.map_child(node.parent, &node.name, ino);
        }
        self.nodes.insert(ino, node);
        self.count.store(self.nodes.len(), Ordering::Relaxed);
    }

    fn insert_child(&mut self, parent: u64, name: &OsStr, natural: u64, kind: NodeKind) -> u64 {
        if let Some(existing) = self.child(parent, name) {
            if let Some(n) = self.nodes.get_mut(&existing) {
                n.lookups.fetch_add(1, Ordering::Relaxed);
                return existing;
            }
        }
        let ino = self.assign_ino(natural);
        self.insert_node(ino, Node::new(kind, parent, name, 1));
        ino
    }

    /// Gives `ino` the further name `(parent, name)` (a hard link, or a rename of one).
    fn add_alias(&mut self, ino: u64, parent: u64, name: &OsStr) {
        self.aliases
            .entry(ino)
            .or_default()
            .push((parent, name.to_os_string()));
        self.map_child(parent, name, ino);
    }

    /// Drops the name `(parent, name)`; the node stays while the kernel still knows it.
    fn detach_name(&mut self, parent: u64, name: &OsStr) {
        let Some(ino) = self.unmap_child(parent, name) else {
            return;
        };
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        if node.parent == parent && &*node.name == name {
            let next = self.aliases.get_mut(&ino).and_then(|v| v.pop());
            if let Some((p, n)) = next {
                node.parent = p;
                node.name = n.into();
            } else {
                node.unlinked = true;
            }
        } else if let Some(v) = self.aliases.get_mut(&ino) {
            v.retain(|(p, n)| !(*p == parent && n == name));
        }
        if self.aliases.get(&ino).is_some_and(|v| v.is_empty()) {
            self.aliases.remove(&ino);
        }
    }

    /// Removes a node the kernel has forgotten, with every name still mapped to it.
    fn remove_node(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        let mut names = vec![(node.parent, node.name.to_os_string())];
        names.extend(self.aliases.get(&ino).cloned().unwrap_or_default());
        for (p, n) in &names {
            if self.child(*p, n) == Some(ino) {
                self.unmap_child(*p, n);
            }
        }
        self.aliases.remove(&ino);
        self.nodes.remove(&ino);
        self.count.store(self.nodes.len(), Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct Stats {
    /// read() requests served on worktree content (not `.git` or `.control`).
    pub content_reads: AtomicU64,
    pub copy_ups: AtomicU64,
    /// The first distinct paths (`repo/worktree/path`) whose content was read, for tests
    /// and diagnosis; recorded once per open handle, not per read.
    pub content_paths: Mutex<Vec<String>>,
    /// Requests served, by kind: what the kernel could not answer from its caches.
    pub lookups: AtomicU64,
    pub getattrs: AtomicU64,
    pub opendirs: AtomicU64,
    pub readdirs: AtomicU64,
    /// Opens answered with FUSE passthrough (the kernel then reads and writes the backing
    /// file itself; such an open counts as one content read).
    pub passthrough_opens: AtomicU64,
    /// getxattr, setxattr, listxattr and removexattr requests (each kind is declined with
    /// ENOSYS, which the kernel remembers, so at most one of each per mount).
    pub xattr_requests: AtomicU64,
}

const MAX_RECORDED_PATHS: usize = 64;

enum HandleKind {
    File {
        ino: u64,
        /// The worktree, and the fsmonitor query epoch in which this handle last recorded
        /// its path as changed (writable handles only).
        wt: Option<Arc<WtCtx>>,
        noted_epoch: AtomicU64,
        /// The copy-up epoch when this handle last checked its node (base handles only).
        seen_copy_ups: AtomicU64,
        /// Whether this handle's first read was recorded in `Stats::content_paths`.
        read_seen: std::sync::atomic::AtomicBool,
        /// None for a base file until its first read (`blob` says which one): a warm open
        /// never reads, the kernel keeps the file's pages.
        file: RwLock<Option<File>>,
        /// Opened on the blob cache; reopened on the upper file once the entry is copied up.
        on_base: std::sync::atomic::AtomicBool,
        /// The blob a base handle reads.
        blob: Option<BaseBlob>,
    },
    Memory(Vec<u8>),
    Dir(Vec<DirEntry>),
}

/// A base file's blob, as a handle opens it at its first read: the worktree whose
/// repository holds it, and its size, checked at open.
struct BaseBlob {
    wt: Arc<WtCtx>,
    oid: Oid,
    size: u64,
}

/// A file the kernel reads and writes directly for an open handle (FUSE passthrough), and
/// its identity (device, inode).
pub struct Backing {
    pub file: File,
    pub key: (u64, u64),
}

struct Catalog {
    data_version: i64,
    /// When the set of repositories or worktrees last changed: the mtime of the top
    /// directories, which the kernel compares to decide whether its cached listing holds.
    changed_at: SystemTime,
    repos: Vec<RepoRow>,
    worktrees: HashMap<(i64, String), Arc<WtCtx>>,
    /// Lifecycle state by worktree id.
    states: HashMap<i64, String>,
    /// Worktrees without a lease (ready, lingering, retained) and since when.
    idle_since: HashMap<i64, i64>,
}

/// What the kernel should forget.
pub enum Inval {
    /// An inode's attributes and listing.
    Inode(u64),
    /// The name `name` in directory `parent`.
    Entry(u64, OsString),
}

/// Tells the kernel to drop what it cached. Set by the daemon once the FUSE session exists;
/// absent in direct-call tests.
pub type Invalidator = Box<dyn Fn(Inval) + Send + Sync>;

pub struct View {
    state: StateDir,
    mountpoint: PathBuf,
    store: Mutex<Store>,
    catalog: RwLock<Catalog>,
    objects: ObjectCache,
    blobs: BlobCache,
    mutate: Mutex<()>,
    nodes: RwLock<NodeTable>,
    /// The table's size, kept by the table itself (see `NodeTable::count`).
    node_count: Arc<AtomicUsize>,
    handles: Mutex<HashMap<u64, Arc<HandleKind>>>,
    next_fh: AtomicU64,
    /// Listings being read by handle-less readdir (see `readdir_ino`).
    listings: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    invalidator: std::sync::OnceLock<Invalidator>,
    /// Bumped by every copy-up: a read on a handle opened on a base blob checks whether its
    /// file was copied up only when this moved since the handle last looked.
    copy_up_epoch: AtomicU64,
    /// Names this daemon's fsmonitor tokens, so a token from an earlier life is known.
    instance: String,
    pub stats: Stats,
}

fn cstr(p: &Path) -> FsResult<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| FsError::new(libc::EINVAL, format!("path {} contains NUL", p.display())))
}

fn lstat(p: &Path) -> io::Result<fs::Metadata> {
    fs::symlink_metadata(p)
}

fn exists(p: &Path) -> bool {
    lstat(p).is_ok()
}

/// The inode a generated `.control` entry is given (unless taken: see `assign_ino`).
fn control_ino(dir: ControlDir, name: &OsStr) -> u64 {
    DYNAMIC_INO_BIT | (1 << 61) | ino::fnv1a32(name.as_bytes()) as u64 | ((dir as u64) << 32)
}

fn whiteout_name(name: &OsStr) -> OsString {
    let mut s = OsString::from(WHITEOUT_PREFIX);
    s.push(name);
    s
}

fn systime(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn check_name(name: &OsStr) -> FsResult<()> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(FsError::new(libc::EINVAL, format!("invalid name {name:?}")));
    }
    if b.starts_with(RESERVED_PREFIX) {
        return Err(FsError::new(
            libc::EINVAL,
            format!(
                "name {name:?} uses the prefix '.wtfs-', which worktreefs reserves for its upper-layer markers"
            ),
        ));
    }
    if b.len() > 255 - WHITEOUT_PREFIX.len() {
        return Err(FsError::new(
            libc::ENAMETOOLONG,
            format!(
                "name of {} bytes is longer than worktreefs allows ({})",
                b.len(),
                255 - WHITEOUT_PREFIX.len()
            ),
        ));
    }
    Ok(())
}

fn not_supported(what: &str) -> FsError {
    FsError::new(libc::EPERM, format!("{what} is not possible here"))
}

impl View {
    pub fn new(state: StateDir, mountpoint: PathBuf) -> anyhow::Result<View> {
        let store = Store::open(&state.root)?;
        let blobs = BlobCache::new(state.blobs(), state.blobs_tmp());
        let node_count = Arc::new(AtomicUsize::new(0));
        let mut nodes = NodeTable::new(node_count.clone());
        let fixed = [
            (ROOT_INO, NodeKind::Root, ROOT_INO, ""),
            (
                CONTROL_INO,
                NodeKind::ControlDir(ControlDir::Top),
                ROOT_INO,
                CONTROL_NAME,
            ),
            (
                CTRL_LEASES_INO,
                NodeKind::ControlDir(ControlDir::Leases),
                CONTROL_INO,
                "leases",
            ),
            (
                CTRL_WORKTREES_INO,
                NodeKind::ControlDir(ControlDir::Worktrees),
                CONTROL_INO,
                "worktrees",
            ),
            (
                CTRL_RETAINED_INO,
                NodeKind::ControlDir(ControlDir::Retained),
                CONTROL_INO,
                "retained",
            ),
            (
                CTRL_STATUS_INO,
                NodeKind::ControlFile(ControlDir::Top, "status".into()),
                CONTROL_INO,
                "status",
            ),
            (
                CTRL_STATS_INO,
                NodeKind::ControlFile(ControlDir::Top, "stats".into()),
                CONTROL_INO,
                "stats",
            ),
            (
                CTRL_FSMONITOR_INO,
                NodeKind::ControlDir(ControlDir::FsMonitor),
                CONTROL_INO,
                crate::fsmonitor::CONTROL_DIR,
            ),
        ];
        for (i, kind, parent, name) in fixed {
            nodes.insert_node(i, Node::new(kind, parent, OsStr::new(name), u64::MAX / 2));
        }
        let view = View {
            state,
            mountpoint,
            store: Mutex::new(store),
            catalog: RwLock::new(Catalog {
                data_version: -1,
                changed_at: SystemTime::now(),
                repos: Vec::new(),
                worktrees: HashMap::new(),
                states: HashMap::new(),
                idle_since: HashMap::new(),
            }),
            node_count,
            objects: ObjectCache::default(),
            blobs,
            mutate: Mutex::new(()),
            nodes: RwLock::new(nodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            listings: Mutex::new(HashMap::new()),
            invalidator: std::sync::OnceLock::new(),
            copy_up_epoch: AtomicU64::new(0),
            instance: format!(
                "{}.{}",
                std::process::id(),
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ),
            stats: Stats::default(),
        };
        view.refresh_catalog(true)?;
        Ok(view)
    }

    pub fn blob_fills(&self) -> u64 {
        self.blobs.fills.load(Ordering::Relaxed)
    }

    // ----- catalog: repositories and worktrees from the store -----

    fn wt_ctx(&self, row: &WorktreeRow, repo: &RepoRow) -> anyhow::Result<WtCtx> {
        let upper = self.state.upper(row.id);
        let work = self.state.work(row.id);
        // A worktree whose directory is gone (being removed, or removed by hand) is not
        // made again here.
        if !self.state.worktree_dir(row.id).is_dir() {
            anyhow::bail!("{} is missing", self.state.worktree_dir(row.id).display());
        }
        fs::create_dir_all(&upper)?;
        fs::create_dir_all(&work)?;
        let admin = gitlayer::admin_dir(&repo.gitdir, &row.admin_name);
        Ok(WtCtx {
            id: row.id,
            repo_id: row.repo_id,
            repo: row.repo.clone(),
            name: row.name.clone(),
            gitdir: repo.gitdir.clone(),
            base_tree: Oid::from_str(&row.base_tree)?,
            base_mtime: systime(row.base_mtime, 0),
            uid: row.uid,
            gid: row.gid,
            upper,
            work,
            gitfile: format!("gitdir: {}\n", admin.display()).into_bytes(),
            sizes_seeded: false.into(),
            journal: Mutex::new(crate::fsmonitor::Journal::default()),
            query_epoch: AtomicU64::new(0),
            open_writers: Mutex::new(HashMap::new()),
        })
    }

    /// Reloads repositories and worktrees when another connection changed the store.
    fn refresh_catalog(&self, force: bool) -> anyhow::Result<()> {
        let store = self.store.lock();
        let version = store.data_version()?;
        if !force && self.catalog.read().data_version == version {
            return Ok(());
        }
        let repos = store.repos()?;
        let rows = store.worktrees()?;
        drop(store);
        let mut cat = self.catalog.write();
        let mut worktrees = HashMap::new();
        let states: HashMap<i64, String> = rows.iter().map(|r| (r.id, r.state.clone())).collect();
        let idle_since: HashMap<i64, i64> = rows
            .iter()
            .filter(|r| matches!(r.state.as_str(), "ready" | "lingering" | "retained"))
            .map(|r| (r.id, r.state_changed_at))
            .collect();
        // Worktrees that just started deleting: the kernel must ask again before anyone
        // enters them, and then hears EBUSY.
        let now_deleting: Vec<(u64, OsString)> = rows
            .iter()
            .filter(|r| {
                r.state == "deleting"
                    && cat.states.get(&r.id).map(String::as_str) != Some("deleting")
            })
            .map(|r| (REPO_INO_BASE + r.repo_id as u64, OsString::from(&r.name)))
            .chain(
                // Gone from the catalog (removed) without being seen deleting.
                cat.worktrees
                    .iter()
                    .filter(|(_, w)| !states.contains_key(&w.id))
                    .map(|((repo_id, name), _)| {
                        (REPO_INO_BASE + *repo_id as u64, OsString::from(name))
                    }),
            )
            .collect();
        for row in rows {
            let key = (row.repo_id, row.name.clone());
            if let Some(existing) = cat.worktrees.get(&key).filter(|w| w.id == row.id) {
                worktrees.insert(key, existing.clone());
                continue;
            }
            let Some(repo) = repos.iter().find(|r| r.id == row.repo_id) else {
                continue;
            };
            match self.wt_ctx(&row, repo) {
                Ok(ctx) => {
                    worktrees.insert(key, Arc::new(ctx));
                }
                Err(e) => {
                    tracing::error!("worktree {}/{} cannot be served: {e:#}", row.repo, row.name)
                }
            }
        }
        let changed = cat
            .repos
            .iter()
            .map(|r| r.id)
            .ne(repos.iter().map(|r| r.id))
            || cat.worktrees.len() != worktrees.len()
            || worktrees.keys().any(|k| !cat.worktrees.contains_key(k));
        let repo_ids: Vec<i64> = repos.iter().map(|r| r.id).collect();
        cat.repos = repos;
        cat.worktrees = worktrees;
        cat.states = states;
        cat.idle_since = idle_since;
        cat.data_version = version;
        if changed {
            cat.changed_at = SystemTime::now();
        }
        drop(cat);
        if let Some(inval) = self.invalidator.get() {
            if changed {
                inval(Inval::Inode(ROOT_INO));
                for id in repo_ids {
                    inval(Inval::Inode(REPO_INO_BASE + id as u64));
                }
            }
            for (parent, name) in now_deleting {
                inval(Inval::Entry(parent, name));
            }
        }
        Ok(())
    }

    /// The store changed (a lifecycle sweep, a lease): re-read it now.
    pub fn catalog_changed(&self) {
        if let Err(e) = self.refresh_catalog(true) {
            tracing::warn!("re-reading the store failed: {e:#}");
        }
    }

    /// The worktree an inode belongs to, as (id, whether the inode is the worktree's own
    /// directory). None for the top of the mount and `.control`. On every request: no
    /// allocation.
    pub fn worktree_of(&self, ino: u64) -> Option<(i64, bool)> {
        let t = self.nodes.read();
        match t.nodes.get(&ino).map(|n| &n.kind) {
            Some(NodeKind::Wt { wt, is_root, .. }) => Some((wt.id, *is_root)),
            Some(NodeKind::GitFile(wt)) => Some((wt.id, false)),
            _ => None,
        }
    }

    /// How many inodes the daemon keeps (one per inode the kernel holds).
    pub fn node_count(&self) -> usize {
        self.node_count.load(Ordering::Relaxed)
    }

    /// Keeps the inode table near `budget` nodes: when it is over, asks the kernel to drop
    /// its cached entries of worktrees nobody holds a lease on, idle longest first (a few
    /// per call; the kernel then forgets their inodes and the nodes go). A worktree in use
    /// is never touched; one shed is not asked again for `again`. Returns how many were
    /// asked.
    pub fn shed_idle(
        &self,
        budget: usize,
        recently: &mut HashMap<i64, std::time::Instant>,
        again: Duration,
    ) -> usize {
        if self.node_count() <= budget {
            return 0;
        }
        let Some(inval) = self.invalidator.get() else {
            return 0;
        };
        let now = std::time::Instant::now();
        recently.retain(|_, at| now.duration_since(*at) < again);
        // The catalog first, released before the table is read: the lock order is `nodes`
        // then `catalog` (a lookup at the top holds the table while it reads the catalog),
        // and holding both the other way round deadlocks once a catalog writer queues.
        let candidates: Vec<(i64, i64, u64, OsString)> = {
            let cat = self.catalog.read();
            cat.worktrees
                .iter()
                .filter_map(|((repo_id, name), w)| {
                    let since = *cat.idle_since.get(&w.id)?;
                    (!recently.contains_key(&w.id)).then(|| {
                        let parent = REPO_INO_BASE + *repo_id as u64;
                        (since, w.id, parent, OsString::from(name))
                    })
                })
                .collect()
        };
        let mut idle: Vec<(i64, i64, u64, OsString)> = {
            let t = self.nodes.read();
            candidates
                .into_iter()
                .filter(|(_, _, parent, name)| t.child(*parent, name).is_some())
                .collect()
        };
        idle.sort();
        let n = idle.len().min(4);
        for (_, id, parent, name) in idle.into_iter().take(n) {
            tracing::debug!("dropping the kernel's cache of idle worktree {id}");
            recently.insert(id, now);
            inval(Inval::Entry(parent, name));
        }
        n
    }

    /// Where worktree `id` is under the mount.
    pub fn worktree_path(&self, id: i64) -> Option<PathBuf> {
        let cat = self.catalog.read();
        cat.worktrees
            .values()
            .find(|w| w.id == id)
            .map(|w| self.mountpoint.join(&w.repo).join(&w.name))
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the state directory (where backing files live) is on a stacked filesystem
    /// such as overlayfs, which FUSE passthrough must count as one level of stacking.
    pub fn state_on_stacked_fs(&self) -> bool {
        nix::sys::statfs::statfs(&self.state.root)
            .map(|s| s.filesystem_type() == nix::sys::statfs::OVERLAYFS_SUPER_MAGIC)
            .unwrap_or(false)
    }

    pub fn set_invalidator(&self, f: Invalidator) {
        let _ = self.invalidator.set(f);
    }

    fn refresh(&self) -> FsResult<()> {
        self.refresh_catalog(false)
            .map_err(|e| FsError::new(libc::EIO, format!("reading the store: {e:#}")))
    }

    // ----- attributes -----

    fn top_dir_attr(&self, ino: u64) -> Attr {
        // Root and repository directories change when the catalog does; `.control`
        // directories with every lease, so they always look new.
        let now = SystemTime::now();
        let is_repo = (REPO_INO_BASE..DYNAMIC_INO_BIT).contains(&ino);
        let mtime = if ino == ROOT_INO || is_repo {
            self.catalog.read().changed_at
        } else {
            now
        };
        // A repository's directory belongs to the repository's owner, who may create
        // worktrees in it with mkdir.
        let (uid, gid, perm) = if is_repo {
            let cat = self.catalog.read();
            cat.repos
                .iter()
                .find(|r| REPO_INO_BASE + r.id as u64 == ino)
                .and_then(|r| fs::metadata(&r.path).ok())
                .map(|m| (m.uid(), m.gid(), 0o755))
                .unwrap_or((0, 0, 0o755))
        } else if ino == ROOT_INO {
            (0, 0, 0o755)
        } else {
            (0, 0, 0o555)
        };
        Attr {
            ino,
            size: 4096,
            blocks: 8,
            atime: mtime,
            mtime,
            ctime: mtime,
            kind: FType::Dir,
            perm,
            nlink: 2,
            uid,
            gid,
            rdev: 0,
        }
    }

    fn memory_attr(&self, ino: u64, len: usize, mtime: SystemTime, uid: u32, gid: u32) -> Attr {
        Attr {
            ino,
            size: len as u64,
            blocks: (len as u64).div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            kind: FType::File,
            perm: 0o444,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
        }
    }

    fn attr_from_meta(ino: u64, m: &fs::Metadata) -> Attr {
        Attr {
            ino,
            size: m.len(),
            blocks: m.blocks(),
            atime: systime(m.atime(), m.atime_nsec()),
            mtime: systime(m.mtime(), m.mtime_nsec()),
            ctime: systime(m.ctime(), m.ctime_nsec()),
            kind: FType::from_mode(m.mode()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
        }
    }

    fn base_attr(&self, ino: u64, wt: &WtCtx, ov: &Overlay) -> FsResult<Attr> {
        let base = ov
            .base
            .ok_or_else(|| FsError::new(libc::EIO, "base entry without object"))?;
        let (size, perm, nlink) = match ov.ftype {
            FType::Dir => (4096, 0o755, 2),
            FType::Symlink | FType::File => {
                if !wt.sizes_seeded.swap(true, Ordering::Relaxed) {
                    self.objects
                        .seed_sizes_from_index_cache(&self.state.index_cache(), wt.base_tree);
                }
                let size = self
                    .objects
                    .blob_size(&wt.gitdir, base.oid)
                    .map_err(|e| FsError::git(format!("size of blob {}", base.oid), e))?;
                let perm = match base.mode {
                    MODE_EXEC => 0o755,
                    MODE_LINK => 0o777,
                    _ => 0o644,
                };
                (size, perm, 1)
            }
            _ => (0, 0o644, 1),
        };
        Ok(Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: wt.base_mtime,
            mtime: wt.base_mtime,
            ctime: wt.base_mtime,
            kind: ov.ftype,
            perm,
            nlink,
            uid: wt.uid,
            gid: wt.gid,
            rdev: 0,
        })
    }

    fn node_attr(&self, t: &NodeTable, ino: u64) -> FsResult<Attr> {
        let node = t
            .nodes
            .get(&ino)
            .ok_or_else(|| FsError::new(libc::ESTALE, format!("inode {ino} is not known")))?;
        match &node.kind {
            NodeKind::Root | NodeKind::ControlDir(_) | NodeKind::Repo(_) => {
                Ok(self.top_dir_attr(ino))
            }
            NodeKind::ControlFile(dir, name) => {
                let content = self.control_content(*dir, name)?;
                Ok(self.memory_attr(ino, content.len(), SystemTime::now(), 0, 0))
            }
            NodeKind::GitFile(wt) => {
                Ok(self.memory_attr(ino, wt.gitfile.len(), wt.base_mtime, wt.uid, wt.gid))
            }
            NodeKind::Wt { wt, ov, .. } => {
                if ov.in_upper {
                    if node.unlinked {
                        return Err(FsError::expected(libc::ENOENT, "entry was removed"));
                    }
                    let path = self.upper_path(t, ino)?;
                    let m = lstat(&path)
                        .map_err(|e| FsError::io(format!("stat {}", path.display()), e))?;
                    Ok(Self::attr_from_meta(ino, &m))
                } else {
                    self.base_attr(ino, wt, ov)
                }
            }
        }
    }

    // ----- paths -----

    /// The path of a worktree entry relative to its worktree (empty for the root).
    fn rel_path(&self, t: &NodeTable, ino: u64) -> FsResult<Vec<u8>> {
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut cur = ino;
        loop {
            let node = t
                .nodes
                .get(&cur)
                .ok_or_else(|| FsError::new(libc::ESTALE, format!("inode {cur} is not known")))?;
            match &node.kind {
                NodeKind::Wt { is_root: true, .. } => break,
                NodeKind::Wt { .. } => {
                    parts.push(&node.name);
                    cur = node.parent;
                }
                _ => return Err(FsError::new(libc::EINVAL, "not a worktree entry")),
            }
        }
        let mut out = Vec::new();
        for (i, p) in parts.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(p.as_bytes());
        }
        Ok(out)
    }

    fn wt_of(&self, t: &NodeTable, ino: u64) -> FsResult<(Arc<WtCtx>, Overlay, bool)> {
        match t.nodes.get(&ino).map(|n| &n.kind) {
            Some(NodeKind::Wt { wt, ov, is_root }) => Ok((wt.clone(), *ov, *is_root)),
            Some(_) => Err(FsError::new(libc::EPERM, "not a worktree entry")),
            None => Err(FsError::new(
                libc::ESTALE,
                format!("inode {ino} is not known"),
            )),
        }
    }

    fn upper_path(&self, t: &NodeTable, ino: u64) -> FsResult<PathBuf> {
        let (wt, _, _) = self.wt_of(t, ino)?;
        let rel = self.rel_path(t, ino)?;
        Ok(if rel.is_empty() {
            wt.upper.clone()
        } else {
            wt.upper.join(OsStr::from_bytes(&rel))
        })
    }

    fn base_tree_of(
        &self,
        wt: &WtCtx,
        ov: &Overlay,
    ) -> FsResult<Option<Arc<gitlayer::TreeListing>>> {
        match ov.base {
            Some(b) if b.mode == MODE_TREE && ov.ftype == FType::Dir => self
                .objects
                .tree(&wt.gitdir, b.oid)
                .map(Some)
                .map_err(|e| FsError::git(format!("reading tree {}", b.oid), e)),
            _ => Ok(None),
        }
    }

    /// What the name `name` in worktree directory `dir` is, from the layers on disk.
    /// `dir_upper` gives the directory's upper path, asked only when the directory is in
    /// the upper layer (most lookups are in base-only directories).
    fn resolve_child(
        &self,
        wt: &WtCtx,
        dir_ov: &Overlay,
        dir_upper: impl FnOnce() -> FsResult<PathBuf>,
        name: &OsStr,
    ) -> FsResult<Option<Overlay>> {
        let base_listing = self.base_tree_of(wt, dir_ov)?;
        let base_entry = base_listing.as_ref().and_then(|l| l.get(name)).cloned();
        if dir_ov.in_upper {
            let dir_upper = dir_upper()?;
            let up = dir_upper.join(name);
            match lstat(&up) {
                Ok(m) => {
                    let ftype = FType::from_mode(m.mode());
                    let base = match &base_entry {
                        Some(e)
                            if ftype == FType::Dir
                                && e.mode == MODE_TREE
                                && !exists(&up.join(OPAQUE_MARKER)) =>
                        {
                            Some(BaseRef {
                                oid: e.oid,
                                mode: e.mode,
                            })
                        }
                        _ => None,
                    };
                    return Ok(Some(Overlay {
                        ftype,
                        base,
                        in_upper: true,
                    }));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(FsError::io(format!("stat {}", up.display()), e)),
            }
            if base_entry.is_some() && exists(&dir_upper.join(whiteout_name(name))) {
                return Ok(None);
            }
        }
        Ok(base_entry.map(|e| Overlay {
            ftype: FType::from_git_mode(e.mode),
            base: Some(BaseRef {
                oid: e.oid,
                mode: e.mode,
            }),
            in_upper: false,
        }))
    }

    // ----- lookup and forget -----

    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.stats.lookups.fetch_add(1, Ordering::Relaxed);
        self.lookup_in(parent, name, false)
    }

    /// A lookup the kernel did not ask for: of an entry of a listing just made, sent with
    /// its attributes (READDIRPLUS), which the kernel links and later forgets like a
    /// looked-up name. Counted as a lookup of the node, not in the LOOKUP statistics; a
    /// `.control` name is not checked against its directory again (the listing was), and
    /// a generated file's size is left 0 (see `lookup_control`).
    pub fn lookup_listed(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.lookup_in(parent, name, true)
    }

    fn lookup_in(&self, parent: u64, name: &OsStr, listed: bool) -> FsResult<Entry> {
        let parent_kind = {
            let t = self.nodes.read();
            let node = t.nodes.get(&parent).ok_or_else(|| {
                FsError::new(libc::ESTALE, format!("inode {parent} is not known"))
            })?;
            let kind = node.kind.clone();
            let known = t.child(parent, name);
            if let Some(ino) = known.filter(|_| {
                !matches!(
                    kind,
                    NodeKind::Root | NodeKind::Repo(_) | NodeKind::ControlDir(_)
                )
            }) {
                // Counted under the read lock that found it: a forget needs the write lock,
                // so it cannot drop the node in between. Given back if its attributes fail.
                if let Some(n) = t.nodes.get(&ino) {
                    n.lookups.fetch_add(1, Ordering::Relaxed);
                }
                let attr = self.node_attr(&t, ino);
                let ttl = self.ttl_of(&t, ino);
                drop(t);
                return match attr {
                    Ok(attr) => Ok(Entry { attr, ttl }),
                    Err(e) => {
                        self.forget(ino, 1);
                        Err(e)
                    }
                };
            }
            kind
        };
        match parent_kind {
            NodeKind::Root => self.lookup_top(name),
            NodeKind::Repo(repo_id) => self.lookup_repo_child(parent, repo_id, name),
            NodeKind::ControlDir(dir) => self.lookup_control(parent, dir, name, listed),
            NodeKind::Wt { wt, ov, is_root } => {
                if ov.ftype != FType::Dir {
                    return Err(FsError::new(libc::ENOTDIR, "not a directory"));
                }
                if is_root && name == GITFILE_NAME {
                    let natural = ino::path_ino(wt.id, b".git");
                    let mut t = self.nodes.write();
                    let ino = t.insert_child(parent, name, natural, NodeKind::GitFile(wt.clone()));
                    return self.counted_entry(t, ino);
                }
                if name.as_bytes().starts_with(RESERVED_PREFIX) {
                    return Err(FsError::not_found(name.to_string_lossy()));
                }
                let dir_upper = || self.upper_path(&self.nodes.read(), parent);
                let child = self
                    .resolve_child(&wt, &ov, dir_upper, name)?
                    .ok_or_else(|| {
                        let mut e =
                            FsError::not_found(format!("{}/{}", wt.name, name.to_string_lossy()));
                        // Not the hour of present names: a lookup inside a directory
                        // being renamed (whose new path the table learns after the
                        // rename on disk) answers "absent" for that moment.
                        e.negative_ttl = Some(WT_TTL);
                        e
                    })?;
                let mut t = self.nodes.write();
                let mut rel = self.rel_path(&t, parent)?;
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(name.as_bytes());
                let natural = ino::path_ino(wt.id, &rel);
                let ino = t.insert_child(
                    parent,
                    name,
                    natural,
                    NodeKind::Wt {
                        wt,
                        ov: child,
                        is_root: false,
                    },
                );
                self.counted_entry(t, ino)
            }
            NodeKind::ControlFile(..) | NodeKind::GitFile(_) => {
                Err(FsError::new(libc::ENOTDIR, "not a directory"))
            }
        }
    }

    fn lookup_top(&self, name: &OsStr) -> FsResult<Entry> {
        if name == CONTROL_NAME {
            return Ok(Entry {
                attr: self.top_dir_attr(CONTROL_INO),
                ttl: CONTROL_TTL,
            });
        }
        self.refresh()?;
        let repo = self
            .catalog
            .read()
            .repos
            .iter()
            .find(|r| r.name.as_bytes() == name.as_bytes())
            .cloned()
            .ok_or_else(|| FsError::not_found(format!("repository {}", name.to_string_lossy())))?;
        let ino = REPO_INO_BASE + repo.id as u64;
        let mut t = self.nodes.write();
        if !t.nodes.contains_key(&ino) {
            t.insert_node(ino, Node::new(NodeKind::Repo(repo.id), ROOT_INO, name, 0));
        }
        if let Some(n) = t.nodes.get(&ino) {
            n.lookups.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Entry {
            attr: self.top_dir_attr(ino),
            ttl: TOP_TTL,
        })
    }

    fn worktree_ctx(&self, repo_id: i64, name: &OsStr) -> FsResult<Arc<WtCtx>> {
        self.refresh()?;
        self.catalog
            .read()
            .worktrees
            .get(&(repo_id, name.to_string_lossy().into_owned()))
            .cloned()
            .ok_or_else(|| FsError::not_found(format!("worktree {}", name.to_string_lossy())))
    }

    fn lookup_repo_child(&self, parent: u64, repo_id: i64, name: &OsStr) -> FsResult<Entry> {
        let wt = self.worktree_ctx(repo_id, name)?;
        if self.catalog.read().states.get(&wt.id).map(String::as_str) == Some("deleting") {
            let c = crate::lease::Conflict::Deleting;
            return Err(FsError::new(
                c.errno(),
                format!(
                    "worktree {}/{} is deleting (no lease, cleanup begun): not entered",
                    wt.repo, wt.name
                ),
            ));
        }
        let mut t = self.nodes.write();
        let natural = ino::path_ino(wt.id, b"");
        // A worktree re-created under the same name is a different worktree: replace the
        // stale mapping.
        if let Some(old) = t.child(parent, name) {
            let stale = match t.nodes.get(&old).map(|n| &n.kind) {
                Some(NodeKind::Wt { wt: w, .. }) => w.id != wt.id,
                _ => true,
            };
            if stale {
                t.detach_name(parent, name);
            }
        }
        let ino = t.insert_child(
            parent,
            name,
            natural,
            NodeKind::Wt {
                wt: wt.clone(),
                ov: Overlay {
                    ftype: FType::Dir,
                    base: Some(BaseRef {
                        oid: wt.base_tree,
                        mode: MODE_TREE,
                    }),
                    in_upper: true,
                },
                is_root: true,
            },
        );
        self.counted_entry(t, ino)
    }

    fn lookup_control(
        &self,
        parent: u64,
        dir: ControlDir,
        name: &OsStr,
        listed: bool,
    ) -> FsResult<Entry> {
        let name_s = name.to_string_lossy().into_owned();
        if dir == ControlDir::Top && name == REFRESH_NAME {
            // The CLI asks this after changing repositories or worktrees, so listings the
            // kernel cached are dropped before the command returns.
            self.refresh_catalog(true)
                .map_err(|e| FsError::new(libc::EIO, format!("reading the store: {e:#}")))?;
            return Err(FsError::expected(libc::ENOENT, "catalog refreshed"));
        }
        // A generated file named in a listing is sent with size 0 instead of having its
        // content generated for each entry (a listing of N leases would generate N
        // times): its TTL is 0, so the kernel asks again (LOOKUP by path, GETATTR on an
        // open file; both generate it) before it uses the attributes for anything.
        let listed_file = |ino: u64| self.memory_attr(ino, 0, SystemTime::now(), 0, 0);
        if dir == ControlDir::Top {
            // Fixed nodes: their lookup counts are never used up.
            let t = self.nodes.read();
            let ino = t
                .child(parent, name)
                .ok_or_else(|| FsError::not_found(format!(".control/{name_s}")))?;
            let attr = match t.nodes.get(&ino).map(|n| &n.kind) {
                Some(NodeKind::ControlFile(..)) if listed => listed_file(ino),
                _ => self.node_attr(&t, ino)?,
            };
            return Ok(Entry {
                attr,
                ttl: self.ttl_of(&t, ino),
            });
        }
        if !listed && dir != ControlDir::FsMonitor && !self.control_names(dir)?.contains(&name_s) {
            return Err(FsError::not_found(format!(".control entry {name_s}")));
        }
        let natural = control_ino(dir, name);
        let mut t = self.nodes.write();
        let ino = t.insert_child(parent, name, natural, NodeKind::ControlFile(dir, name_s));
        if listed {
            return Ok(Entry {
                attr: listed_file(ino),
                ttl: CONTROL_TTL,
            });
        }
        self.counted_entry(t, ino)
    }

    /// The entry of `ino`, whose lookup count was just raised under the write lock `t`:
    /// its attributes and TTL, or, when its attributes cannot be had, the error with the
    /// count given back (the kernel, answered with the error, never learns of the node).
    fn counted_entry(&self, t: RwLockWriteGuard<'_, NodeTable>, ino: u64) -> FsResult<Entry> {
        match self.node_attr(&t, ino) {
            Ok(attr) => Ok(Entry {
                attr,
                ttl: self.ttl_of(&t, ino),
            }),
            Err(e) => {
                drop(t);
                self.forget(ino, 1);
                Err(e)
            }
        }
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        let mut t = self.nodes.write();
        let Some(node) = t.nodes.get_mut(&ino) else {
            return;
        };
        // The write lock excludes every increment (they hold the read lock).
        let left = node.lookups.load(Ordering::Relaxed).saturating_sub(nlookup);
        node.lookups.store(left, Ordering::Relaxed);
        if left > 0 {
            return;
        }
        t.remove_node(ino);
    }

    fn ttl_of(&self, t: &NodeTable, ino: u64) -> Duration {
        match t.nodes.get(&ino).map(|n| &n.kind) {
            // A worktree's own directory goes away through cleanup, which another process
            // may run: its entry is re-checked as before.
            Some(NodeKind::Wt { is_root: true, .. }) => WT_TTL,
            Some(NodeKind::Wt { ov, .. }) if ov.in_upper && ov.ftype == FType::File => WT_TTL,
            Some(NodeKind::Wt { .. }) | Some(NodeKind::GitFile(_)) => WT_STABLE_TTL,
            // Listings under .control change with every lease: the kernel must look at the
            // directory's (always new) mtime before using a listing it kept.
            Some(NodeKind::ControlFile(..)) | Some(NodeKind::ControlDir(_)) => CONTROL_TTL,
            _ => TOP_TTL,
        }
    }

    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> FsResult<Entry> {
        self.stats.getattrs.fetch_add(1, Ordering::Relaxed);
        if let Some(fh) = fh {
            if let Some(h) = self.handles.lock().get(&fh).cloned() {
                if let HandleKind::File { file, on_base, .. } = &*h {
                    if !on_base.load(Ordering::Acquire) {
                        let m = opened(file)?
                            .metadata()
                            .map_err(|e| FsError::io("fstat", e))?;
                        let attr = Self::attr_from_meta(ino, &m);
                        return Ok(Entry { attr, ttl: WT_TTL });
                    }
                }
            }
        }
        let t = self.nodes.read();
        Ok(Entry {
            attr: self.node_attr(&t, ino)?,
            ttl: self.ttl_of(&t, ino),
        })
    }

    // ----- the control directory -----

    fn control_names(&self, dir: ControlDir) -> FsResult<Vec<String>> {
        match dir {
            ControlDir::Top => Ok(vec![
                "leases".into(),
                "worktrees".into(),
                "retained".into(),
                "status".into(),
                "stats".into(),
                crate::fsmonitor::CONTROL_DIR.into(),
            ]),
            ControlDir::Worktrees => {
                self.refresh()?;
                let cat = self.catalog.read();
                let mut names: Vec<String> = cat
                    .worktrees
                    .values()
                    .map(|w| format!("{}:{}", w.repo, w.name))
                    .collect();
                names.sort();
                Ok(names)
            }
            ControlDir::Leases => Ok(self
                .store
                .lock()
                .leases()
                .map_err(|e| FsError::store("reading leases", e))?
                .iter()
                .map(|l| l.entry_name())
                .collect()),
            ControlDir::Retained => Ok(self
                .store
                .lock()
                .retained()
                .map_err(|e| FsError::store("reading the retained store", e))?
                .iter()
                .map(|r| r.entry_name())
                .collect()),
            // Entries exist for any name asked (the name carries the query).
            ControlDir::FsMonitor => Ok(Vec::new()),
        }
    }

    fn control_content(&self, dir: ControlDir, name: &str) -> FsResult<Vec<u8>> {
        let store_err = |e: rusqlite::Error| FsError::store("reading .control", e);
        match (dir, name) {
            // Answered at open (a query has effects); nothing to show before.
            (ControlDir::FsMonitor, _) => Ok(Vec::new()),
            (ControlDir::Top, "status") => {
                let store = self.store.lock();
                let rows = store.worktrees().map_err(store_err)?;
                let leases = store.leases().map_err(store_err)?;
                Ok(crate::report::status_table(&rows, &leases).into_bytes())
            }
            (ControlDir::Top, "stats") => {
                let v = serde_json::json!({
                    "content_reads": self.stats.content_reads.load(Ordering::Relaxed),
                    "blob_fills": self.blob_fills(),
                    "copy_ups": self.stats.copy_ups.load(Ordering::Relaxed),
                    "content_paths": *self.stats.content_paths.lock(),
                    "lookups": self.stats.lookups.load(Ordering::Relaxed),
                    "getattrs": self.stats.getattrs.load(Ordering::Relaxed),
                    "opendirs": self.stats.opendirs.load(Ordering::Relaxed),
                    "readdirs": self.stats.readdirs.load(Ordering::Relaxed),
                    "passthrough_opens": self.stats.passthrough_opens.load(Ordering::Relaxed),
                    "xattr_requests": self.stats.xattr_requests.load(Ordering::Relaxed),
                    "nodes": self.node_count(),
                });
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Leases, entry) => {
                let lease = self
                    .store
                    .lock()
                    .leases()
                    .map_err(store_err)?
                    .into_iter()
                    .find(|l| l.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/leases/{entry}")))?;
                let v = serde_json::to_value(&lease)
                    .map_err(|e| FsError::new(libc::EIO, e.to_string()))?;
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Retained, entry) => {
                let row = self
                    .store
                    .lock()
                    .retained()
                    .map_err(store_err)?
                    .into_iter()
                    .find(|r| r.entry_name() == entry)
                    .ok_or_else(|| FsError::not_found(format!(".control/retained/{entry}")))?;
                let v = serde_json::to_value(&row)
                    .map_err(|e| FsError::new(libc::EIO, e.to_string()))?;
                Ok(format!("{v}\n").into_bytes())
            }
            (ControlDir::Worktrees, entry) => {
                let (repo, wt) = entry
                    .split_once(':')
                    .ok_or_else(|| FsError::not_found(entry.to_string()))?;
                let row = self
                    .store
                    .lock()
                    .worktree(repo, wt)
                    .map_err(store_err)?
                    .ok_or_else(|| FsError::not_found(entry.to_string()))?;
                let mut v = serde_json::to_value(&row)
                    .map_err(|e| FsError::new(libc::EIO, e.to_string()))?;
                v["path"] = serde_json::Value::String(
                    self.mountpoint.join(repo).join(wt).display().to_string(),
                );
                Ok(format!("{v}\n").into_bytes())
            }
            _ => Err(FsError::not_found(format!(".control entry {name}"))),
        }
    }

    // ----- directories -----

    fn merged_listing(&self, t: &NodeTable, ino: u64) -> FsResult<Vec<DirEntry>> {
        let (wt, ov, is_root) = self.wt_of(t, ino)?;
        if ov.ftype != FType::Dir {
            return Err(FsError::new(libc::ENOTDIR, "not a directory"));
        }
        let rel = self.rel_path(t, ino)?;
        let child_ino = |name: &[u8]| {
            let mut p = rel.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            ino::path_ino(wt.id, &p)
        };
        let mut names: BTreeMap<OsString, DirEntry> = BTreeMap::new();
        let mut whiteouts: HashSet<OsString> = HashSet::new();
        if ov.in_upper {
            let dir = self.upper_path(t, ino)?;
            let rd = fs::read_dir(&dir)
                .map_err(|e| FsError::io(format!("listing {}", dir.display()), e))?;
            for e in rd {
                let e = e.map_err(|e| FsError::io(format!("listing {}", dir.display()), e))?;
                let name = e.file_name();
                let b = name.as_bytes();
                if let Some(hidden) = b.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                    whiteouts.insert(OsStr::from_bytes(hidden).to_os_string());
                    continue;
                }
                if b.starts_with(RESERVED_PREFIX) || (is_root && name == GITFILE_NAME) {
                    continue;
                }
                let ft = e
                    .file_type()
                    .map_err(|e| FsError::io(format!("listing {}", dir.display()), e))?;
                let kind = if ft.is_dir() {
                    FType::Dir
                } else if ft.is_symlink() {
                    FType::Symlink
                } else if ft.is_fifo() {
                    FType::Fifo
                } else if ft.is_socket() {
                    FType::Socket
                } else {
                    FType::File
                };
                names.insert(
                    name.clone(),
                    DirEntry {
                        ino: child_ino(b),
                        kind,
                        name,
                    },
                );
            }
        }
        if let Some(listing) = self.base_tree_of(&wt, &ov)? {
            for e in &listing.entries {
                if names.contains_key(&e.name) || whiteouts.contains(&e.name) {
                    continue;
                }
                names.insert(
                    e.name.clone(),
                    DirEntry {
                        ino: child_ino(e.name.as_bytes()),
                        kind: FType::from_git_mode(e.mode),
                        name: e.name.clone(),
                    },
                );
            }
        }
        let mut out = Vec::with_capacity(names.len() + 1);
        if is_root {
            out.push(DirEntry {
                ino: ino::path_ino(wt.id, b".git"),
                kind: FType::File,
                name: GITFILE_NAME.into(),
            });
        }
        out.extend(names.into_values());
        Ok(out)
    }

    fn listing(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        let kind = {
            let t = self.nodes.read();
            t.nodes
                .get(&ino)
                .map(|n| n.kind.clone())
                .ok_or_else(|| FsError::new(libc::ESTALE, format!("inode {ino} is not known")))?
        };
        match kind {
            NodeKind::Root => {
                self.refresh()?;
                let mut out = vec![DirEntry {
                    ino: CONTROL_INO,
                    kind: FType::Dir,
                    name: CONTROL_NAME.into(),
                }];
                for r in &self.catalog.read().repos {
                    out.push(DirEntry {
                        ino: REPO_INO_BASE + r.id as u64,
                        kind: FType::Dir,
                        name: r.name.clone().into(),
                    });
                }
                Ok(out)
            }
            NodeKind::Repo(repo_id) => {
                self.refresh()?;
                let mut out: Vec<DirEntry> = self
                    .catalog
                    .read()
                    .worktrees
                    .values()
                    .filter(|w| w.repo_id == repo_id)
                    .map(|w| DirEntry {
                        ino: ino::path_ino(w.id, b""),
                        kind: FType::Dir,
                        name: w.name.clone().into(),
                    })
                    .collect();
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(out)
            }
            NodeKind::ControlDir(dir) => {
                let names = self.control_names(dir)?;
                let t = self.nodes.read();
                Ok(names
                    .into_iter()
                    .map(|n| DirEntry {
                        // The inode stat gives: fixed under `.control` itself.
                        ino: (dir == ControlDir::Top)
                            .then(|| t.child(ino, OsStr::new(&n)))
                            .flatten()
                            .unwrap_or_else(|| control_ino(dir, OsStr::new(&n))),
                        kind: if dir == ControlDir::Top && !matches!(n.as_str(), "status" | "stats")
                        {
                            FType::Dir
                        } else {
                            FType::File
                        },
                        name: n.into(),
                    })
                    .collect())
            }
            NodeKind::Wt { .. } => {
                let t = self.nodes.read();
                self.merged_listing(&t, ino)
            }
            _ => Err(FsError::new(libc::ENOTDIR, "not a directory")),
        }
    }

    /// Opens a directory listing. The flag says whether the kernel may keep the listing
    /// across opens: true inside worktrees, whose directories change only through requests
    /// the kernel makes (and then drops its copy), false at the top of the mount.
    pub fn opendir(&self, ino: u64) -> FsResult<(u64, bool)> {
        self.stats.opendirs.fetch_add(1, Ordering::Relaxed);
        let cacheable = matches!(
            self.nodes.read().nodes.get(&ino).map(|n| &n.kind),
            Some(NodeKind::Wt { .. })
        );
        let entries = self.listing_with_dots(ino)?;
        Ok((self.add_handle(HandleKind::Dir(entries)), cacheable))
    }

    /// `.`, `..` and the directory's entries, in the order readdir offsets refer to.
    fn listing_with_dots(&self, ino: u64) -> FsResult<Vec<DirEntry>> {
        let mut entries = vec![
            DirEntry {
                ino,
                kind: FType::Dir,
                name: ".".into(),
            },
            DirEntry {
                ino: ROOT_INO,
                kind: FType::Dir,
                name: "..".into(),
            },
        ];
        entries.extend(self.listing(ino)?);
        Ok(entries)
    }

    /// Entries from `offset` on; each entry's offset for the next call is its index + 1.
    pub fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.stats.readdirs.fetch_add(1, Ordering::Relaxed);
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::Dir(entries) => Ok(entries
                .iter()
                .enumerate()
                .skip(offset as usize)
                .map(|(i, e)| (i as u64 + 1, e.clone()))
                .collect()),
            _ => Err(FsError::new(libc::ENOTDIR, "handle is not a directory")),
        }
    }

    /// Readdir without an open handle (the kernel skips opendir when the filesystem
    /// declines it, and caches listings itself). A pass starts at offset 0, which lists
    /// afresh; later offsets continue that listing.
    pub fn readdir_ino(&self, ino: u64, offset: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        self.stats.readdirs.fetch_add(1, Ordering::Relaxed);
        let listing = {
            let cached = if offset > 0 {
                self.listings.lock().get(&ino).cloned()
            } else {
                None
            };
            match cached {
                Some(l) => l,
                None => {
                    let l = Arc::new(self.listing_with_dots(ino)?);
                    self.listings.lock().insert(ino, l.clone());
                    l
                }
            }
        };
        if offset as usize >= listing.len() {
            self.listings.lock().remove(&ino);
        }
        Ok(listing
            .iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .collect())
    }

    // ----- the change journal (fsmonitor) -----

    fn note(&self, wt: &WtCtx, rel: &[u8]) {
        wt.journal.lock().record(rel);
    }

    /// Records that the entry `ino` changed.
    fn note_node(&self, ino: u64) {
        let t = self.nodes.read();
        if let (Ok((wt, _, _)), Ok(rel)) = (self.wt_of(&t, ino), self.rel_path(&t, ino)) {
            drop(t);
            self.note(&wt, &rel);
        }
    }

    /// Records that the name `name` in directory `parent` changed (created or removed).
    fn note_child(&self, parent: u64, name: &OsStr) {
        let t = self.nodes.read();
        if let (Ok((wt, _, _)), Ok(mut rel)) = (self.wt_of(&t, parent), self.rel_path(&t, parent)) {
            drop(t);
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            self.note(&wt, &rel);
        }
    }

    /// Records every path below the upper directory `dir` (at `rel` in the worktree) under
    /// both `rel` and `old_rel`: a directory moved from `old_rel`.
    fn note_moved_tree(&self, wt: &WtCtx, dir: &Path, rel: &[u8], old_rel: &[u8]) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name();
            if name.as_bytes().starts_with(RESERVED_PREFIX) {
                continue;
            }
            let join = |base: &[u8]| {
                let mut p = base.to_vec();
                p.push(b'/');
                p.extend_from_slice(name.as_bytes());
                p
            };
            let (new, old) = (join(rel), join(old_rel));
            self.note(wt, &new);
            self.note(wt, &old);
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                self.note_moved_tree(wt, &e.path(), &new, &old);
            }
        }
    }

    /// Answers git's fsmonitor hook for `<repo>:<worktree>@<token>`: the new token, then
    /// every path that changed since `token`.
    fn fsmonitor_query(&self, query: &str) -> FsResult<Vec<u8>> {
        let bad = || {
            FsError::new(
                libc::EINVAL,
                format!("fsmonitor query {query:?} is not <repo>:<worktree>@<token>"),
            )
        };
        let (who, token) = query.split_once('@').ok_or_else(bad)?;
        let (repo, name) = who.split_once(':').ok_or_else(bad)?;
        self.refresh()?;
        let wt = self
            .catalog
            .read()
            .worktrees
            .values()
            .find(|w| w.repo == repo && w.name == name)
            .cloned()
            .ok_or_else(|| FsError::not_found(format!("worktree {repo}/{name}")))?;
        use crate::fsmonitor::{encode_response, parse_token, token as make_token, Since};
        // Bump first: a write that has not yet checked the epoch will record again.
        wt.query_epoch.fetch_add(1, Ordering::AcqRel);
        let (seq, since) = {
            let j = wt.journal.lock();
            let since = match parse_token(token, &self.instance) {
                Some(s) => j.since(s),
                None => Since::Unknown,
            };
            (j.seq(), since)
        };
        let mut paths = match since {
            Since::Paths(p) => p,
            Since::Everything => vec![b"/".to_vec()],
            Since::Unknown => {
                // Everything that differs from the base is in the upper layer.
                let mut out = Vec::new();
                self.upper_paths(&wt, &wt.upper, b"", Some(wt.base_tree), &mut out)?;
                out.sort();
                out.dedup();
                out
            }
        };
        // Files open for writing may change at any moment without a request reaching us.
        let writers: Vec<u64> = wt.open_writers.lock().keys().copied().collect();
        if !writers.is_empty() {
            let t = self.nodes.read();
            for ino in writers {
                if let Ok(rel) = self.rel_path(&t, ino) {
                    paths.push(rel);
                }
            }
        }
        tracing::debug!(
            repo,
            worktree = name,
            token,
            changed = paths.len(),
            "fsmonitor query"
        );
        Ok(encode_response(&make_token(&self.instance, seq), &paths))
    }

    /// Every path the upper directory `dir` (at `rel`) holds or hides: its entries, the
    /// names its whiteouts delete, and, below an opaque directory, the base's entries.
    fn upper_paths(
        &self,
        wt: &WtCtx,
        dir: &Path,
        rel: &[u8],
        base: Option<Oid>,
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        let join = |name: &[u8]| {
            let mut p = rel.to_vec();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            p
        };
        let opaque = exists(&dir.join(OPAQUE_MARKER));
        let listing = match base {
            Some(tree) => Some(
                self.objects
                    .tree(&wt.gitdir, tree)
                    .map_err(|e| FsError::git("reading tree", e))?,
            ),
            None => None,
        };
        if opaque {
            if let Some(l) = &listing {
                for e in &l.entries {
                    self.base_paths(wt, e, &join(e.name.as_bytes()), out)?;
                }
            }
        }
        let rd =
            fs::read_dir(dir).map_err(|e| FsError::io(format!("listing {}", dir.display()), e))?;
        for e in rd.flatten() {
            let name = e.file_name();
            let b = name.as_bytes();
            if let Some(hidden) = b.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                // A deleted base directory hides everything below it.
                match listing
                    .as_ref()
                    .and_then(|l| l.get(OsStr::from_bytes(hidden)))
                {
                    Some(entry) => self.base_paths(wt, entry, &join(hidden), out)?,
                    None => out.push(join(hidden)),
                }
                continue;
            }
            if b.starts_with(RESERVED_PREFIX) || (rel.is_empty() && name == GITFILE_NAME) {
                continue;
            }
            let path = join(b);
            out.push(path.clone());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let below = if opaque {
                    None
                } else {
                    listing
                        .as_ref()
                        .and_then(|l| l.get(&name))
                        .filter(|entry| entry.mode == MODE_TREE)
                        .map(|entry| entry.oid)
                };
                self.upper_paths(wt, &e.path(), &path, below, out)?;
            } else if let Some(entry) = listing.as_ref().and_then(|l| l.get(&name)) {
                // A file where the base has a directory: the directory's files are gone.
                if entry.mode == MODE_TREE && !opaque {
                    self.base_paths(wt, entry, &path, out)?;
                }
            }
        }
        Ok(())
    }

    /// `path` and, for a base directory, every path below it.
    fn base_paths(
        &self,
        wt: &WtCtx,
        entry: &gitlayer::TreeEntry,
        path: &[u8],
        out: &mut Vec<Vec<u8>>,
    ) -> FsResult<()> {
        out.push(path.to_vec());
        if entry.mode == MODE_TREE {
            let l = self
                .objects
                .tree(&wt.gitdir, entry.oid)
                .map_err(|e| FsError::git("reading tree", e))?;
            for e in &l.entries {
                let mut p = path.to_vec();
                p.push(b'/');
                p.extend_from_slice(e.name.as_bytes());
                self.base_paths(wt, e, &p, out)?;
            }
        }
        Ok(())
    }

    // ----- handles -----

    /// A handle on the upper file `file`, or (with `blob`) on a base file, opened at its
    /// first read.
    fn file_handle(
        &self,
        ino: u64,
        wt: Option<Arc<WtCtx>>,
        file: Option<File>,
        blob: Option<BaseBlob>,
    ) -> u64 {
        let on_base = blob.is_some();
        if let Some(w) = &wt {
            *w.open_writers.lock().entry(ino).or_insert(0) += 1;
        }
        self.add_handle(HandleKind::File {
            ino,
            wt,
            noted_epoch: AtomicU64::new(u64::MAX),
            seen_copy_ups: AtomicU64::new(self.copy_up_epoch.load(Ordering::Acquire)),
            read_seen: false.into(),
            file: RwLock::new(file),
            on_base: on_base.into(),
            blob,
        })
    }

    fn add_handle(&self, kind: HandleKind) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Arc::new(kind));
        fh
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<HandleKind>> {
        self.handles
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::new(libc::EBADF, format!("file handle {fh} is not open")))
    }

    pub fn release(&self, fh: u64) {
        let h = self.handles.lock().remove(&fh);
        if let Some(HandleKind::File {
            ino, wt: Some(wt), ..
        }) = h.as_deref()
        {
            let last = {
                let mut w = wt.open_writers.lock();
                match w.get_mut(ino) {
                    Some(n) if *n > 1 => {
                        *n -= 1;
                        false
                    }
                    _ => {
                        w.remove(ino);
                        true
                    }
                }
            };
            if last {
                // Written behind the daemon's back (passthrough, mmap): recorded at close.
                self.note_node(*ino);
            }
        }
    }

    /// For an open file handle: its inode and whether it reads the base (the blob cache).
    pub fn handle_io(&self, fh: u64) -> Option<(u64, bool)> {
        match &*self.handle(fh).ok()? {
            HandleKind::File { ino, on_base, .. } => Some((*ino, on_base.load(Ordering::Acquire))),
            _ => None,
        }
    }

    /// The file the kernel may read and write directly for handle `fh` (FUSE passthrough):
    /// the cached blob, read-only, for a base file; the upper file, read-write, otherwise.
    /// With it, its identity (device, inode): every passthrough open of one inode must use
    /// the same backing file. None for generated content.
    pub fn backing_for(&self, fh: u64) -> FsResult<Option<Backing>> {
        let h = self.handle(fh)?;
        let HandleKind::File {
            ino,
            file,
            on_base,
            read_seen,
            blob,
            ..
        } = &*h
        else {
            return Ok(None);
        };
        let backing = if on_base.load(Ordering::Acquire) {
            self.read_file(file, blob.as_ref())?
                .try_clone()
                .map_err(|e| FsError::io("dup of a cached blob", e))?
        } else if let Some(plain) = opened(file).ok().and_then(|f| plain_read_write(&f)) {
            // The handle's own file (a creation's, say) is what the backing needs: a dup
            // spares a path walk.
            plain
        } else {
            let path = self.upper_path(&self.nodes.read(), *ino)?;
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| {
                    FsError::io(format!("opening {} for passthrough", path.display()), e)
                })?
        };
        let m = backing
            .metadata()
            .map_err(|e| FsError::io("fstat of a backing file", e))?;
        self.stats.passthrough_opens.fetch_add(1, Ordering::Relaxed);
        self.stats.content_reads.fetch_add(1, Ordering::Relaxed);
        if !read_seen.swap(true, Ordering::Relaxed) {
            self.record_content_path(*ino);
        }
        Ok(Some(Backing {
            file: backing,
            key: (m.dev(), m.ino()),
        }))
    }

    // ----- copy-up -----

    /// Makes sure the directory `ino` exists in the upper layer (parents first).
    fn ensure_upper_dir(&self, ino: u64) -> FsResult<()> {
        let mut chain = Vec::new();
        {
            let t = self.nodes.read();
            let mut cur = ino;
            loop {
                let (_, ov, is_root) = self.wt_of(&t, cur)?;
                if ov.in_upper {
                    break;
                }
                if ov.ftype != FType::Dir {
                    return Err(FsError::new(libc::ENOTDIR, "not a directory"));
                }
                chain.push(cur);
                if is_root {
                    break;
                }
                cur = t.nodes.get(&cur).map(|n| n.parent).unwrap_or(ROOT_INO);
            }
        }
        for dir in chain.into_iter().rev() {
            self.copy_up(dir, true)?;
        }
        Ok(())
    }

    fn set_in_upper(&self, ino: u64, base: Option<Option<BaseRef>>) {
        let mut t = self.nodes.write();
        if let Some(Node {
            kind: NodeKind::Wt { ov, .. },
            ..
        }) = t.nodes.get_mut(&ino)
        {
            ov.in_upper = true;
            if let Some(b) = base {
                ov.base = b;
            }
        }
        drop(t);
        self.copy_up_epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn work_tmp(wt: &WtCtx, what: &str) -> PathBuf {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        wt.work.join(format!(
            "{what}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Copies the entry `ino` into the upper layer (callers hold `mutate`). With
    /// `with_data` false a regular file arrives empty (it is about to be truncated).
    /// Atomic: built in the work directory, fsync'd, renamed into place.
    fn copy_up(&self, ino: u64, with_data: bool) -> FsResult<()> {
        let (wt, ov, path) = {
            let t = self.nodes.read();
            let (wt, ov, _) = self.wt_of(&t, ino)?;
            if ov.in_upper {
                return Ok(());
            }
            (wt, ov, self.upper_path(&t, ino)?)
        };
        let parent = self
            .nodes
            .read()
            .nodes
            .get(&ino)
            .map(|n| n.parent)
            .unwrap_or(ROOT_INO);
        self.ensure_upper_dir(parent)?;
        let base = ov
            .base
            .ok_or_else(|| FsError::new(libc::EIO, "copy-up of an entry with no base"))?;
        match ov.ftype {
            FType::Dir => {
                match fs::create_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(FsError::io(format!("mkdir {}", path.display()), e)),
                }
                self.chown(&path, wt.uid, wt.gid)?;
            }
            FType::File => {
                let tmp = Self::work_tmp(&wt, "copyup");
                let result = self.copy_blob_to(&wt, base, &tmp, with_data);
                if let Err(e) = result {
                    let _ = fs::remove_file(&tmp);
                    return Err(e);
                }
                fs::rename(&tmp, &path)
                    .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
            }
            FType::Symlink => {
                let target = gitlayer::read_blob(&wt.gitdir, base.oid)
                    .map_err(|e| FsError::git("reading symlink target", e))?;
                let tmp = Self::work_tmp(&wt, "copyup");
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &tmp)
                    .map_err(|e| FsError::io("creating symlink in work dir", e))?;
                let _ = nix::unistd::fchownat(
                    None,
                    &tmp,
                    Some(nix::unistd::Uid::from_raw(wt.uid)),
                    Some(nix::unistd::Gid::from_raw(wt.gid)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                );
                fs::rename(&tmp, &path)
                    .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
            }
            _ => return Err(FsError::new(libc::EIO, "unexpected base entry type")),
        }
        self.stats.copy_ups.fetch_add(1, Ordering::Relaxed);
        self.set_in_upper(ino, None);
        Ok(())
    }

    fn copy_blob_to(&self, wt: &WtCtx, base: BaseRef, tmp: &Path, with_data: bool) -> FsResult<()> {
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| FsError::io(format!("creating {}", tmp.display()), e))?;
        if with_data {
            let size = self
                .objects
                .blob_size(&wt.gitdir, base.oid)
                .map_err(|e| FsError::git("blob size", e))?;
            let src_path = self
                .blobs
                .ensure(&wt.gitdir, base.oid, size)
                .map_err(|e| FsError::io(format!("materializing blob {}", base.oid), e))?;
            let src = File::open(&src_path).map_err(|e| FsError::io("opening cached blob", e))?;
            clone_or_copy(&src, &dst, size).map_err(|e| FsError::io("copying blob", e))?;
        }
        let perm = if base.mode == MODE_EXEC { 0o755 } else { 0o644 };
        dst.set_permissions(fs::Permissions::from_mode(perm))
            .map_err(|e| FsError::io("chmod", e))?;
        let _ = nix::unistd::fchown(
            dst.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(wt.uid)),
            Some(nix::unistd::Gid::from_raw(wt.gid)),
        );
        let t = nix::sys::time::TimeSpec::from(
            wt.base_mtime.duration_since(UNIX_EPOCH).unwrap_or_default(),
        );
        let _ = nix::sys::stat::futimens(dst.as_raw_fd(), &t, &t);
        dst.sync_all().map_err(|e| FsError::io("fsync", e))?;
        Ok(())
    }

    fn chown(&self, path: &Path, uid: u32, gid: u32) -> FsResult<()> {
        match nix::unistd::fchownat(
            None,
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(()) | Err(nix::errno::Errno::EPERM) => Ok(()),
            Err(e) => Err(FsError::io(
                format!("chown {}", path.display()),
                io::Error::from_raw_os_error(e as i32),
            )),
        }
    }

    /// Copies every base entry below directory `ino` into the upper layer and marks it
    /// opaque, so the directory can move without its base (used by rename of directories).
    fn copy_up_tree(&self, ino: u64) -> FsResult<()> {
        let (wt, ov, path) = {
            let t = self.nodes.read();
            let (wt, ov, _) = self.wt_of(&t, ino)?;
            (wt, ov, self.upper_path(&t, ino)?)
        };
        self.ensure_upper_dir(ino)?;
        if ov.base.is_none() {
            return Ok(());
        }
        self.copy_up_tree_at(&wt, &path, ov.base)?;
        // Every node below now lives entirely in the upper layer.
        let mut t = self.nodes.write();
        let below: Vec<u64> = t
            .nodes
            .keys()
            .copied()
            .filter(|&n| self.is_below(&t, n, ino))
            .collect();
        for n in below.into_iter().chain(std::iter::once(ino)) {
            if let Some(Node {
                kind: NodeKind::Wt { ov, .. },
                ..
            }) = t.nodes.get_mut(&n)
            {
                ov.in_upper = true;
                if ov.ftype == FType::Dir {
                    ov.base = None;
                }
            }
        }
        drop(t);
        self.copy_up_epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn is_below(&self, t: &NodeTable, mut n: u64, ancestor: u64) -> bool {
        for _ in 0..4096 {
            let Some(node) = t.nodes.get(&n) else {
                return false;
            };
            if !matches!(node.kind, NodeKind::Wt { is_root: false, .. }) {
                return false;
            }
            if node.parent == ancestor {
                return true;
            }
            n = node.parent;
        }
        false
    }

    fn copy_up_tree_at(&self, wt: &WtCtx, dir: &Path, base: Option<BaseRef>) -> FsResult<()> {
        let Some(base) = base.filter(|b| b.mode == MODE_TREE) else {
            return Ok(());
        };
        if exists(&dir.join(OPAQUE_MARKER)) {
            return Ok(());
        }
        let listing = self
            .objects
            .tree(&wt.gitdir, base.oid)
            .map_err(|e| FsError::git("reading tree", e))?;
        for e in &listing.entries {
            let up = dir.join(&e.name);
            let child_base = BaseRef {
                oid: e.oid,
                mode: e.mode,
            };
            match lstat(&up) {
                Ok(m) => {
                    if m.is_dir() && e.mode == MODE_TREE {
                        self.copy_up_tree_at(wt, &up, Some(child_base))?;
                    }
                    continue;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(FsError::io(format!("stat {}", up.display()), err)),
            }
            if exists(&dir.join(whiteout_name(&e.name))) {
                continue;
            }
            match e.mode {
                MODE_TREE | MODE_GITLINK => {
                    fs::create_dir(&up)
                        .map_err(|err| FsError::io(format!("mkdir {}", up.display()), err))?;
                    self.chown(&up, wt.uid, wt.gid)?;
                    self.copy_up_tree_at(wt, &up, Some(child_base))?;
                }
                MODE_LINK => {
                    let target = gitlayer::read_blob(&wt.gitdir, e.oid)
                        .map_err(|err| FsError::git("reading symlink target", err))?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &up)
                        .map_err(|err| FsError::io("symlink", err))?;
                    self.chown(&up, wt.uid, wt.gid)?;
                }
                _ => {
                    let tmp = Self::work_tmp(wt, "copyup");
                    self.copy_blob_to(wt, child_base, &tmp, true)?;
                    fs::rename(&tmp, &up).map_err(|err| FsError::io("rename", err))?;
                }
            }
        }
        write_marker(&dir.join(OPAQUE_MARKER), true)
    }

    // ----- namespace changes -----

    /// The overlay entry currently at `(parent, name)`, from the table or from disk.
    fn child_state(&self, parent: u64, name: &OsStr) -> FsResult<Option<(Option<u64>, Overlay)>> {
        let t = self.nodes.read();
        if let Some(ino) = t.child(parent, name) {
            if let Some(Node {
                kind: NodeKind::Wt { ov, .. },
                ..
            }) = t.nodes.get(&ino)
            {
                return Ok(Some((Some(ino), *ov)));
            }
            if let Some(Node {
                kind: NodeKind::GitFile(_),
                ..
            }) = t.nodes.get(&ino)
            {
                return Err(FsError::new(
                    libc::EPERM,
                    "the worktree's .git file is managed by worktreefs",
                ));
            }
        }
        let (wt, ov, is_root) = self.wt_of(&t, parent)?;
        if is_root && name == GITFILE_NAME {
            return Err(FsError::new(
                libc::EPERM,
                "the worktree's .git file is managed by worktreefs",
            ));
        }
        drop(t);
        let dir_upper = || self.upper_path(&self.nodes.read(), parent);
        Ok(self
            .resolve_child(&wt, &ov, dir_upper, name)?
            .map(|o| (None, o)))
    }

    fn base_has(&self, parent: u64, name: &OsStr) -> FsResult<bool> {
        let (wt, ov) = {
            let t = self.nodes.read();
            let (wt, ov, _) = self.wt_of(&t, parent)?;
            (wt, ov)
        };
        Ok(self
            .base_tree_of(&wt, &ov)?
            .map(|l| l.get(name).is_some())
            .unwrap_or(false))
    }

    fn dir_upper_path(&self, parent: u64) -> FsResult<(Arc<WtCtx>, PathBuf)> {
        let t = self.nodes.read();
        let (wt, _, _) = self.wt_of(&t, parent)?;
        Ok((wt, self.upper_path(&t, parent)?))
    }

    fn new_entry(&self, parent: u64, name: &OsStr, ov: Overlay) -> FsResult<Entry> {
        let mut t = self.nodes.write();
        let (wt, _, _) = self.wt_of(&t, parent)?;
        t.detach_name(parent, name);
        let mut rel = self.rel_path(&t, parent)?;
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.as_bytes());
        let natural = ino::path_ino(wt.id, &rel);
        let ino = t.insert_child(
            parent,
            name,
            natural,
            NodeKind::Wt {
                wt,
                ov,
                is_root: false,
            },
        );
        self.counted_entry(t, ino)
    }

    /// Prepares `(parent, name)` for a new upper entry: the name must be free in the view
    /// and the parent directory present in the upper layer. Returns the parent's upper dir.
    fn prepare_create(&self, parent: u64, name: &OsStr) -> FsResult<(Arc<WtCtx>, PathBuf)> {
        check_name(name)?;
        if self.child_state(parent, name)?.is_some() {
            return Err(FsError::expected(
                libc::EEXIST,
                format!("{} exists", name.to_string_lossy()),
            ));
        }
        self.ensure_upper_dir(parent)?;
        self.dir_upper_path(parent)
    }

    /// Removes the whiteout of `name` in `parent` (upper directory `dir`), if there can be
    /// one: whiteouts are written only over base entries, so most creations have none to
    /// remove and skip the failing `unlink`.
    fn drop_whiteout(&self, parent: u64, dir: &Path, name: &OsStr) {
        if self.base_has(parent, name).unwrap_or(true) {
            let _ = fs::remove_file(dir.join(whiteout_name(name)));
        }
    }

    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Entry, u64)> {
        let _m = self.mutate.lock();
        let (wt, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(flags & (libc::O_APPEND | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC))
            .mode(mode & !umask & 0o7777)
            .open(&path)
            .map_err(|e| FsError::io(format!("create {}", path.display()), e))?;
        self.chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        let entry = self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::File,
                base: None,
                in_upper: true,
            },
        )?;
        let fh = self.file_handle(entry.attr.ino, Some(wt), Some(file), None);
        Ok((entry, fh))
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a file beside worktrees"));
        }
        let _m = self.mutate.lock();
        let (_, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let c = cstr(&path)?;
        // SAFETY: c is a valid NUL-terminated path.
        let rc = unsafe {
            libc::mknod(
                c.as_ptr(),
                (mode & !umask) as libc::mode_t,
                rdev as libc::dev_t,
            )
        };
        if rc != 0 {
            return Err(FsError::io(
                format!("mknod {}", path.display()),
                io::Error::last_os_error(),
            ));
        }
        self.chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::from_mode(mode),
                base: None,
                in_upper: true,
            },
        )
    }

    fn is_repo(&self, ino: u64) -> bool {
        matches!(
            self.nodes.read().nodes.get(&ino).map(|n| &n.kind),
            Some(NodeKind::Repo(_)) | Some(NodeKind::Root) | Some(NodeKind::ControlDir(_)) | None
        )
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<Entry> {
        let parent_kind = self.nodes.read().nodes.get(&parent).map(|n| n.kind.clone());
        match parent_kind {
            Some(NodeKind::Repo(repo_id)) => return self.mkdir_worktree(parent, repo_id, name, caller),
            Some(NodeKind::Wt { .. }) => {}
            Some(NodeKind::Root) => {
                return Err(FsError::new(
                    libc::EPERM,
                    format!(
                        "cannot mkdir {:?} at the top of the mount: repositories are added with `worktreefs repo add PATH`",
                        name
                    ),
                ))
            }
            _ => return Err(not_supported("mkdir here")),
        }
        let _m = self.mutate.lock();
        let base_had_name = self.base_has(parent, name)?;
        let (wt, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        let perm = mode & !umask & 0o7777;
        if base_had_name {
            // The base has (had) this name and it was removed: the new directory must hide
            // the base's content, so it is built opaque and renamed into place.
            let tmp = Self::work_tmp(&wt, "mkdir");
            fs::create_dir(&tmp).map_err(|e| FsError::io("mkdir in work dir", e))?;
            write_marker(&tmp.join(OPAQUE_MARKER), true)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(perm))
                .map_err(|e| FsError::io("chmod", e))?;
            self.chown(&tmp, caller.uid, caller.gid)?;
            fs::rename(&tmp, &path)
                .map_err(|e| FsError::io(format!("rename into {}", path.display()), e))?;
        } else {
            fs::create_dir(&path)
                .map_err(|e| FsError::io(format!("mkdir {}", path.display()), e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(perm))
                .map_err(|e| FsError::io("chmod", e))?;
            self.chown(&path, caller.uid, caller.gid)?;
        }
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::Dir,
                base: None,
                in_upper: true,
            },
        )
    }

    fn mkdir_worktree(
        &self,
        parent: u64,
        repo_id: i64,
        name: &OsStr,
        caller: Caller,
    ) -> FsResult<Entry> {
        let name_s = name.to_str().ok_or_else(|| {
            FsError::new(libc::EINVAL, format!("worktree name {name:?} is not UTF-8"))
        })?;
        let repo = self
            .catalog
            .read()
            .repos
            .iter()
            .find(|r| r.id == repo_id)
            .map(|r| r.name.clone())
            .ok_or_else(|| FsError::not_found("repository"))?;
        {
            let mut store = self.store.lock();
            worktree::create_worktree(
                &self.state,
                &mut store,
                &CreateRequest {
                    repo: &repo,
                    name: name_s,
                    base: None,
                    branch: None,
                    uid: caller.uid,
                    gid: caller.gid,
                },
            )
            .map_err(|e| FsError::new(e.errno(), format!("mkdir {repo}/{name_s}: {e}")))?;
        }
        self.refresh_catalog(true)
            .map_err(|e| FsError::new(libc::EIO, format!("reading the store: {e:#}")))?;
        tracing::info!(repo, worktree = name_s, "created worktree by mkdir");
        self.lookup_repo_child(parent, repo_id, name)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Entry> {
        if self.is_repo(parent) {
            return Err(not_supported("creating a symlink beside worktrees"));
        }
        let _m = self.mutate.lock();
        let (_, dir) = self.prepare_create(parent, name)?;
        let path = dir.join(name);
        std::os::unix::fs::symlink(target, &path)
            .map_err(|e| FsError::io(format!("symlink {}", path.display()), e))?;
        self.chown(&path, caller.uid, caller.gid)?;
        self.drop_whiteout(parent, &dir, name);
        self.note_child(parent, name);
        self.new_entry(
            parent,
            name,
            Overlay {
                ftype: FType::Symlink,
                base: None,
                in_upper: true,
            },
        )
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let t = self.nodes.read();
        let (wt, ov, _) = self.wt_of(&t, ino)?;
        if ov.ftype != FType::Symlink {
            return Err(FsError::new(libc::EINVAL, "not a symlink"));
        }
        if ov.in_upper {
            let path = self.upper_path(&t, ino)?;
            return fs::read_link(&path)
                .map(|p| p.into_os_string().into_vec())
                .map_err(|e| FsError::io(format!("readlink {}", path.display()), e));
        }
        let base = ov
            .base
            .ok_or_else(|| FsError::new(libc::EIO, "symlink without object"))?;
        drop(t);
        gitlayer::read_blob(&wt.gitdir, base.oid).map_err(|e| FsError::git("reading symlink", e))
    }

    fn remove_checks(&self, parent: u64, name: &OsStr) -> FsResult<(Option<u64>, Overlay)> {
        let kind = self.nodes.read().nodes.get(&parent).map(|n| n.kind.clone());
        match kind {
            Some(NodeKind::Wt { .. }) => {}
            Some(NodeKind::Repo(_)) => {
                return Err(FsError::new(
                    libc::EPERM,
                    format!(
                        "{} is a worktree: remove it with rmdir (or `worktreefs reclaim`), not unlink or rename",
                        name.to_string_lossy()
                    ),
                ))
            }
            _ => return Err(not_supported("removing this entry")),
        }
        self.child_state(parent, name)?
            .ok_or_else(|| FsError::not_found(name.to_string_lossy()))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let _m = self.mutate.lock();
        let (_, ov) = self.remove_checks(parent, name)?;
        if ov.ftype == FType::Dir {
            return Err(FsError::new(libc::EISDIR, "is a directory"));
        }
        let needs_whiteout = self.base_has(parent, name)?;
        if needs_whiteout {
            self.ensure_upper_dir(parent)?;
        }
        let (_, dir) = self.dir_upper_path(parent)?;
        if needs_whiteout {
            write_marker(&dir.join(whiteout_name(name)), ov.in_upper)?;
        }
        if ov.in_upper {
            let path = dir.join(name);
            fs::remove_file(&path)
                .map_err(|e| FsError::io(format!("unlink {}", path.display()), e))?;
        }
        self.note_child(parent, name);
        self.nodes.write().detach_name(parent, name);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        let parent_kind = self.nodes.read().nodes.get(&parent).map(|n| n.kind.clone());
        if let Some(NodeKind::Repo(repo_id)) = parent_kind {
            return self.rmdir_worktree(parent, repo_id, name);
        }
        let _m = self.mutate.lock();
        let (ino, ov) = self.remove_checks(parent, name)?;
        if ov.ftype != FType::Dir {
            return Err(FsError::new(libc::ENOTDIR, "not a directory"));
        }
        // Emptiness in the merged view.
        let (wt, dir) = self.dir_upper_path(parent)?;
        let path = dir.join(name);
        let nonempty = match ino {
            Some(ino) => {
                let t = self.nodes.read();
                !self.merged_listing(&t, ino)?.is_empty()
            }
            None => {
                let upper_has = ov.in_upper
                    && fs::read_dir(&path)
                        .map_err(|e| FsError::io("listing", e))?
                        .flatten()
                        .any(|e| !e.file_name().as_bytes().starts_with(RESERVED_PREFIX));
                let base_has = match self.base_tree_of(&wt, &ov)? {
                    Some(l) => l
                        .entries
                        .iter()
                        .any(|e| !(ov.in_upper && exists(&path.join(whiteout_name(&e.name))))),
                    None => false,
                };
                upper_has || base_has
            }
        };
        if nonempty {
            return Err(FsError::expected(
                libc::ENOTEMPTY,
                format!("{} is not empty", name.to_string_lossy()),
            ));
        }
        let needs_whiteout = self.base_has(parent, name)?;
        if needs_whiteout {
            self.ensure_upper_dir(parent)?;
            write_marker(&dir.join(whiteout_name(name)), ov.in_upper)?;
        }
        if ov.in_upper {
            // Out of the view in one rename, then deleted with its markers.
            let trash = Self::work_tmp(&wt, "trash");
            fs::rename(&path, &trash)
                .map_err(|e| FsError::io(format!("rmdir {}", path.display()), e))?;
            if let Err(e) = fs::remove_dir_all(&trash) {
                tracing::warn!("could not empty {}: {e}", trash.display());
            }
        }
        self.note_child(parent, name);
        self.nodes.write().detach_name(parent, name);
        Ok(())
    }

    /// `rmdir <mount>/<repo>/<wt>`: the same removal as `worktreefs reclaim`. EBUSY while
    /// leased or in use, ENOTEMPTY while it holds work (its files stay).
    fn rmdir_worktree(&self, parent: u64, repo_id: i64, name: &OsStr) -> FsResult<()> {
        use crate::cleanup::{request_removal, Outcome, RequestError};
        let wt = self.worktree_ctx(repo_id, name)?;
        let label = format!("{}/{}", wt.repo, wt.name);
        let mut store =
            Store::open(&self.state.root).map_err(|e| FsError::store("opening the store", e))?;
        let row = store
            .worktree_by_id(wt.id)
            .map_err(|e| FsError::store("reading the worktree", e))?
            .ok_or_else(|| FsError::not_found(&label))?;
        let r = request_removal(
            &self.state,
            &mut store,
            &row,
            &self.mountpoint,
            false,
            &mut |_| {},
        );
        self.catalog_changed();
        match r {
            Ok(Outcome::Removed(detail)) => {
                tracing::info!("rmdir {label}: removed ({detail})");
                self.nodes.write().detach_name(parent, name);
                Ok(())
            }
            Ok(Outcome::Retained(reason)) => Err(FsError::new(
                libc::EIO,
                format!("rmdir {label}: removal failed, worktree retained with its files: {reason}"),
            )),
            Err(RequestError::Busy(m)) => Err(FsError::new(libc::EBUSY, format!("rmdir {label}: {m}"))),
            Err(RequestError::HoldsWork(m)) => Err(FsError::new(
                libc::ENOTEMPTY,
                format!(
                    "rmdir {label}: refused, it holds work: {m}; commit and push it, or throw it away with `worktreefs reclaim {label} --discard`"
                ),
            )),
            Err(RequestError::Gone(m)) => Err(FsError::not_found(m)),
            Err(RequestError::Other(e)) => Err(FsError::new(libc::EIO, format!("rmdir {label}: {e:#}"))),
        }
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        if flags & (libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0 {
            return Err(FsError::new(
                libc::EINVAL,
                "RENAME_EXCHANGE and RENAME_WHITEOUT are not supported",
            ));
        }
        check_name(newname)?;
        let _m = self.mutate.lock();
        let (src_ino, src) = self.remove_checks(parent, name)?;
        let dst = self.remove_checks(newparent, newname).ok();
        if parent == newparent && name == newname {
            return Ok(());
        }
        if let Some((dst_ino, d)) = &dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(FsError::expected(
                    libc::EEXIST,
                    format!("{} exists", newname.to_string_lossy()),
                ));
            }
            match (src.ftype == FType::Dir, d.ftype == FType::Dir) {
                (true, false) => {
                    return Err(FsError::expected(
                        libc::ENOTDIR,
                        "target is not a directory",
                    ))
                }
                (false, true) => {
                    return Err(FsError::expected(libc::EISDIR, "target is a directory"))
                }
                (true, true) => {
                    let ino = match dst_ino {
                        Some(i) => *i,
                        None => self.lookup(newparent, newname)?.attr.ino,
                    };
                    let nonempty = {
                        let t = self.nodes.read();
                        !self.merged_listing(&t, ino)?.is_empty()
                    };
                    if dst_ino.is_none() {
                        self.forget(ino, 1);
                    }
                    if nonempty {
                        return Err(FsError::expected(
                            libc::ENOTEMPTY,
                            "target directory is not empty",
                        ));
                    }
                }
                _ => {}
            }
        }
        // The kernel has looked the source up before renaming it; a direct caller may not
        // have, so take a node for the duration of the rename and give it back after.
        let (src_ino, borrowed) = match src_ino {
            Some(i) => (i, false),
            None => (self.lookup(parent, name)?.attr.ino, true),
        };
        let result = self.rename_inner(
            parent,
            name,
            newparent,
            newname,
            src_ino,
            src,
            dst.map(|d| d.1),
        );
        if borrowed {
            self.forget(src_ino, 1);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_inner(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        src_ino: u64,
        src: Overlay,
        dst: Option<Overlay>,
    ) -> FsResult<()> {
        if src.ftype == FType::Dir {
            self.copy_up_tree(src_ino)?;
        } else {
            self.copy_up(src_ino, true)?;
        }
        self.ensure_upper_dir(newparent)?;
        let (wt, from_dir) = self.dir_upper_path(parent)?;
        let (_, to_dir) = self.dir_upper_path(newparent)?;
        let from = from_dir.join(name);
        let to = to_dir.join(newname);
        if src.ftype == FType::Dir && self.base_has(newparent, newname)? {
            write_marker(&from.join(OPAQUE_MARKER), true)?;
        }
        if self.base_has(parent, name)? {
            write_marker(&from_dir.join(whiteout_name(name)), true)?;
        }
        if let Some(d) = dst {
            if d.in_upper && d.ftype == FType::Dir {
                let trash = Self::work_tmp(&wt, "trash");
                fs::rename(&to, &trash)
                    .map_err(|e| FsError::io("moving the replaced directory out", e))?;
                let _ = fs::remove_dir_all(&trash);
            }
        }
        fs::rename(&from, &to).map_err(|e| {
            FsError::io(format!("rename {} to {}", from.display(), to.display()), e)
        })?;
        self.drop_whiteout(newparent, &to_dir, newname);
        self.note_child(parent, name);
        self.note_child(newparent, newname);
        if src.ftype == FType::Dir {
            let rel_of = |p: u64, n: &OsStr| {
                let t = self.nodes.read();
                self.rel_path(&t, p).map(|mut r| {
                    if !r.is_empty() {
                        r.push(b'/');
                    }
                    r.extend_from_slice(n.as_bytes());
                    r
                })
            };
            if let (Ok(new_rel), Ok(old_rel)) = (rel_of(newparent, newname), rel_of(parent, name)) {
                self.note_moved_tree(&wt, &to, &new_rel, &old_rel);
            }
        }
        let mut t = self.nodes.write();
        t.detach_name(newparent, newname);
        t.unmap_child(parent, name);
        let own_name = t
            .nodes
            .get(&src_ino)
            .is_some_and(|n| n.parent == parent && &*n.name == name);
        if own_name {
            if let Some(node) = t.nodes.get_mut(&src_ino) {
                node.parent = newparent;
                node.name = newname.into();
            }
            t.map_child(newparent, newname, src_ino);
        } else if t.nodes.contains_key(&src_ino) {
            if let Some(v) = t.aliases.get_mut(&src_ino) {
                v.retain(|(p, n)| !(*p == parent && n == name));
            }
            t.add_alias(src_ino, newparent, newname);
        }
        if let Some(node) = t.nodes.get_mut(&src_ino) {
            node.unlinked = false;
            if let NodeKind::Wt { ov, .. } = &mut node.kind {
                if ov.ftype == FType::Dir && dst.is_some() {
                    ov.base = None;
                }
            }
        }
        Ok(())
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> FsResult<Entry> {
        let _m = self.mutate.lock();
        let (_, ov, _) = {
            let t = self.nodes.read();
            self.wt_of(&t, ino)?
        };
        if ov.ftype == FType::Dir {
            return Err(FsError::new(
                libc::EPERM,
                "hard links to directories are not allowed",
            ));
        }
        let (_, dir) = self.prepare_create(newparent, newname)?;
        self.copy_up(ino, true)?;
        let src = self.upper_path(&self.nodes.read(), ino)?;
        let dst = dir.join(newname);
        fs::hard_link(&src, &dst).map_err(|e| FsError::io(format!("link {}", dst.display()), e))?;
        self.drop_whiteout(newparent, &dir, newname);
        self.note_child(newparent, newname);
        self.note_node(ino);
        let mut t = self.nodes.write();
        t.detach_name(newparent, newname);
        if t.nodes.contains_key(&ino) {
            t.add_alias(ino, newparent, newname);
        }
        if let Some(node) = t.nodes.get(&ino) {
            node.lookups.fetch_add(1, Ordering::Relaxed);
        }
        self.counted_entry(t, ino)
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> FsResult<Entry> {
        let _m = self.mutate.lock();
        {
            let t = self.nodes.read();
            match t.nodes.get(&ino).map(|n| &n.kind) {
                Some(NodeKind::Wt { .. }) => {}
                Some(NodeKind::GitFile(_)) => {
                    return Err(FsError::new(
                        libc::EPERM,
                        "the worktree's .git file is managed by worktreefs",
                    ))
                }
                _ => return Err(not_supported("changing attributes here")),
            }
        }
        let truncating_to_zero = set.size == Some(0);
        self.copy_up(ino, !truncating_to_zero)?;
        let path = self.upper_path(&self.nodes.read(), ino)?;
        if let Some(mode) = set.mode {
            let c = cstr(&path)?;
            // SAFETY: valid path; fchmodat without AT_SYMLINK_NOFOLLOW as Linux requires.
            if unsafe { libc::chmod(c.as_ptr(), (mode & 0o7777) as libc::mode_t) } != 0 {
                return Err(FsError::io(
                    format!("chmod {}", path.display()),
                    io::Error::last_os_error(),
                ));
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            nix::unistd::fchownat(
                None,
                &path,
                set.uid.map(nix::unistd::Uid::from_raw),
                set.gid.map(nix::unistd::Gid::from_raw),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| {
                FsError::io(
                    format!("chown {}", path.display()),
                    io::Error::from_raw_os_error(e as i32),
                )
            })?;
        }
        if let Some(size) = set.size {
            let via_handle = set.fh.and_then(|fh| self.handle(fh).ok());
            match via_handle.as_deref() {
                Some(HandleKind::File { file, on_base, .. })
                    if !on_base.load(Ordering::Acquire) =>
                {
                    opened(file)?
                        .set_len(size)
                        .map_err(|e| FsError::io("ftruncate", e))?
                }
                _ => OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .and_then(|f| f.set_len(size))
                    .map_err(|e| FsError::io(format!("truncate {}", path.display()), e))?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let spec = |t: Option<Option<SystemTime>>| match t {
                None => nix::sys::time::TimeSpec::new(0, libc::UTIME_OMIT),
                Some(None) => nix::sys::time::TimeSpec::new(0, libc::UTIME_NOW),
                Some(Some(t)) => {
                    nix::sys::time::TimeSpec::from(t.duration_since(UNIX_EPOCH).unwrap_or_default())
                }
            };
            nix::sys::stat::utimensat(
                None,
                &path,
                &spec(set.atime),
                &spec(set.mtime),
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .map_err(|e| {
                FsError::io(
                    format!("utimens {}", path.display()),
                    io::Error::from_raw_os_error(e as i32),
                )
            })?;
        }
        // Recorded after the change, so a query cannot slip in between and miss it.
        self.note_node(ino);
        let t = self.nodes.read();
        Ok(Entry {
            attr: self.node_attr(&t, ino)?,
            ttl: self.ttl_of(&t, ino),
        })
    }

    // ----- file data -----

    /// Opens a file. The flag says the content is generated (`.git`, `.control`): the
    /// kernel must read it directly rather than trust a cached size.
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<(u64, bool)> {
        let generated = matches!(
            self.nodes.read().nodes.get(&ino).map(|n| &n.kind),
            Some(NodeKind::ControlFile(..))
        );
        self.open_inner(ino, flags).map(|fh| (fh, generated))
    }

    fn open_inner(&self, ino: u64, flags: i32) -> FsResult<u64> {
        let kind = self
            .nodes
            .read()
            .nodes
            .get(&ino)
            .map(|n| n.kind.clone())
            .ok_or_else(|| FsError::new(libc::ESTALE, format!("inode {ino} is not known")))?;
        let acc = flags & libc::O_ACCMODE;
        let writing = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match kind {
            NodeKind::GitFile(wt) => {
                if writing {
                    return Err(FsError::new(
                        libc::EACCES,
                        "the worktree's .git file is managed by worktreefs",
                    ));
                }
                Ok(self.add_handle(HandleKind::Memory(wt.gitfile.clone())))
            }
            NodeKind::ControlFile(dir, name) => {
                if writing {
                    return Err(FsError::new(libc::EACCES, ".control is read-only"));
                }
                let content = if dir == ControlDir::FsMonitor {
                    self.fsmonitor_query(&name)?
                } else {
                    self.control_content(dir, &name)?
                };
                Ok(self.add_handle(HandleKind::Memory(content)))
            }
            NodeKind::Wt { wt, ov, .. } => {
                if ov.ftype == FType::Dir {
                    return Err(FsError::new(libc::EISDIR, "is a directory"));
                }
                if writing {
                    let _m = self.mutate.lock();
                    self.copy_up(ino, flags & libc::O_TRUNC == 0)?;
                    let path = self.upper_path(&self.nodes.read(), ino)?;
                    let file = open_upper(&path, flags)?;
                    self.note_node(ino);
                    return Ok(self.file_handle(ino, Some(wt), Some(file), None));
                }
                if ov.in_upper {
                    let path = self.upper_path(&self.nodes.read(), ino)?;
                    let file = open_upper(&path, flags)?;
                    return Ok(self.file_handle(ino, None, Some(file), None));
                }
                let base = ov
                    .base
                    .ok_or_else(|| FsError::new(libc::EIO, "file without object"))?;
                // The blob is read at the first READ; a missing object (a partial clone, a
                // pruned one) still fails here, from the size cache the attributes filled.
                let size = self
                    .objects
                    .blob_size(&wt.gitdir, base.oid)
                    .map_err(|e| FsError::git("blob size", e))?;
                let blob = BaseBlob {
                    wt,
                    oid: base.oid,
                    size,
                };
                Ok(self.file_handle(ino, None, None, Some(blob)))
            }
            _ => Err(FsError::new(libc::EISDIR, "is a directory")),
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::Memory(data) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                Ok(data[start..end].to_vec())
            }
            HandleKind::File {
                ino,
                file,
                on_base,
                read_seen,
                seen_copy_ups,
                blob,
                ..
            } => {
                self.stats.content_reads.fetch_add(1, Ordering::Relaxed);
                if !read_seen.swap(true, Ordering::Relaxed) {
                    self.record_content_path(*ino);
                }
                if on_base.load(Ordering::Acquire) {
                    // Recorded before looking: a copy-up after the look moves the epoch again.
                    let epoch = self.copy_up_epoch.load(Ordering::Acquire);
                    if seen_copy_ups.swap(epoch, Ordering::AcqRel) != epoch {
                        self.follow_copy_up(*ino, file, on_base)?;
                    }
                }
                let mut buf = vec![0u8; size as usize];
                let f = self.read_file(file, blob.as_ref())?;
                let mut done = 0;
                while done < buf.len() {
                    match f.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FsError::io("read", e)),
                    }
                }
                buf.truncate(done);
                Ok(buf)
            }
            HandleKind::Dir(_) => Err(FsError::new(libc::EISDIR, "is a directory")),
        }
    }

    fn record_content_path(&self, ino: u64) {
        let mut paths = self.stats.content_paths.lock();
        if paths.len() >= MAX_RECORDED_PATHS {
            return;
        }
        let t = self.nodes.read();
        let Ok((wt, _, _)) = self.wt_of(&t, ino) else {
            return;
        };
        let rel = self.rel_path(&t, ino).unwrap_or_default();
        let p = format!("{}/{}/{}", wt.repo, wt.name, String::from_utf8_lossy(&rel));
        if !paths.contains(&p) {
            paths.push(p);
        }
    }

    /// The file handle `file` reads: for a base file not read yet, the blob `blob`, taken
    /// from (or first put in) the blob cache now.
    fn read_file<'a>(
        &self,
        file: &'a RwLock<Option<File>>,
        blob: Option<&BaseBlob>,
    ) -> FsResult<MappedRwLockReadGuard<'a, File>> {
        if let Ok(f) = opened(file) {
            return Ok(f);
        }
        let BaseBlob { wt, oid, size } =
            blob.ok_or_else(|| FsError::new(libc::EBADF, "handle has no file"))?;
        let mut slot = file.write();
        if slot.is_none() {
            // EIO whatever went wrong (a full disk, say): the errno a read may return.
            let path = self
                .blobs
                .ensure(&wt.gitdir, *oid, *size)
                .map_err(|e| FsError::new(libc::EIO, format!("materializing blob {oid}: {e}")))?;
            let file = File::open(&path)
                .map_err(|e| FsError::new(libc::EIO, format!("opening cached blob {oid}: {e}")))?;
            *slot = Some(file);
        }
        RwLockReadGuard::try_map(RwLockWriteGuard::downgrade(slot), Option::as_ref)
            .map_err(|_| FsError::new(libc::EBADF, "handle has no file"))
    }

    /// A handle opened before its file was copied up reads the upper file from then on, so
    /// every reader sees changes made through the view.
    fn follow_copy_up(
        &self,
        ino: u64,
        file: &RwLock<Option<File>>,
        on_base: &std::sync::atomic::AtomicBool,
    ) -> FsResult<()> {
        let t = self.nodes.read();
        let Ok((_, ov, _)) = self.wt_of(&t, ino) else {
            return Ok(());
        };
        if !ov.in_upper {
            return Ok(());
        }
        let path = self.upper_path(&t, ino)?;
        drop(t);
        let f = open_upper(&path, libc::O_RDONLY)?;
        *file.write() = Some(f);
        // Release: whoever sees `false` (Acquire) also sees the file just put in.
        on_base.store(false, Ordering::Release);
        Ok(())
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.handle(fh)?;
        match &*h {
            HandleKind::File {
                ino,
                wt,
                noted_epoch,
                file,
                on_base,
                ..
            } if !on_base.load(Ordering::Acquire) => {
                opened(file)?
                    .write_all_at(data, offset)
                    .map_err(|e| FsError::io("write", e))?;
                // After the data, not before: a query that ran before this check either saw
                // this handle's earlier record (and git will stat the file after this write)
                // or bumped the epoch, and then the path is recorded again here.
                if let Some(wt) = wt {
                    let epoch = wt.query_epoch.load(Ordering::Acquire);
                    if noted_epoch.swap(epoch, Ordering::AcqRel) != epoch {
                        self.note_node(*ino);
                    }
                }
                Ok(data.len() as u32)
            }
            _ => Err(FsError::new(libc::EBADF, "handle not open for writing")),
        }
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handle(fh)?;
        if let HandleKind::File { file, on_base, .. } = &*h {
            if !on_base.load(Ordering::Acquire) {
                let f = opened(file)?;
                let r = if datasync {
                    f.sync_data()
                } else {
                    f.sync_all()
                };
                r.map_err(|e| FsError::io("fsync", e))?;
            }
        }
        Ok(())
    }

    pub fn statfs(&self) -> FsResult<Statfs> {
        let s = nix::sys::statvfs::statvfs(&self.state.root)
            .map_err(|e| FsError::io("statvfs", io::Error::from_raw_os_error(e as i32)))?;
        Ok(Statfs {
            blocks: s.blocks(),
            bfree: s.blocks_free(),
            bavail: s.blocks_available(),
            files: s.files(),
            ffree: s.files_free(),
            bsize: s.block_size() as u32,
            namelen: 255 - WHITEOUT_PREFIX.len() as u32,
            frsize: s.fragment_size() as u32,
        })
    }

    pub fn access(&self, ino: u64) -> FsResult<()> {
        if self.nodes.read().nodes.contains_key(&ino) {
            Ok(())
        } else {
            Err(FsError::new(
                libc::ESTALE,
                format!("inode {ino} is not known"),
            ))
        }
    }
}

/// A duplicate of `file` when it is opened for reading and writing and with no flag that
/// changes how I/O on it behaves (append, sync, no-atime, direct). Registered as an inode's
/// backing file, it names the file the kernel opens for each passthrough open (with that
/// open's own flags, in the kernels seen here); a plain one is also right for a kernel that
/// would do I/O on it directly.
fn plain_read_write(file: &File) -> Option<File> {
    // SAFETY: F_GETFL on a file descriptor this File owns.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    let behaviour =
        libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME | libc::O_DIRECT;
    if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR || flags & behaviour != 0 {
        return None;
    }
    file.try_clone().ok()
}

/// The file a handle holds: an upper file always, a base file once its first read has
/// opened the blob (`View::read_file`).
fn opened(file: &RwLock<Option<File>>) -> FsResult<MappedRwLockReadGuard<'_, File>> {
    RwLockReadGuard::try_map(file.read(), Option::as_ref)
        .map_err(|_| FsError::new(libc::EBADF, "handle has no file"))
}

fn open_upper(path: &Path, flags: i32) -> FsResult<File> {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions::new()
        .read(acc == libc::O_RDONLY || acc == libc::O_RDWR)
        .write(acc == libc::O_WRONLY || acc == libc::O_RDWR)
        .custom_flags(
            (flags
                & (libc::O_APPEND
                    | libc::O_TRUNC
                    | libc::O_NOATIME
                    | libc::O_SYNC
                    | libc::O_DSYNC))
                | libc::O_NOFOLLOW,
        )
        .open(path)
        .map_err(|e| FsError::io(format!("open {}", path.display()), e))
}

/// Creates an empty marker file (whiteout or opaque). `ordered`: a later step removes or
/// moves an upper entry and must not reach the disk before this marker does, so the
/// marker is synced first. A marker with nothing after it is as durable as any other
/// unlink: until the next sync, like the filesystem underneath.
fn write_marker(path: &Path, ordered: bool) -> FsResult<()> {
    match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) if ordered => f.sync_all().map_err(|e| FsError::io("fsync marker", e)),
        Ok(_) => Ok(()),
        Err(e) => Err(FsError::io(format!("writing marker {}", path.display()), e)),
    }
}

/// FICLONE where the filesystem shares extents, else copy_file_range (std::io::copy uses it).
fn clone_or_copy(src: &File, dst: &File, _size: u64) -> io::Result<()> {
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: both descriptors are open for the duration of the call.
    let rc = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) };
    if rc == 0 {
        return Ok(());
    }
    let mut s = src;
    let mut d = dst;
    io::copy(&mut s, &mut d)?;
    Ok(())
}

#[cfg(test)]
mod node_table_tests {
    use super::*;

    /// Every name resolves to its inode and nothing else does, with a hash of 1 bit so
    /// that names of one directory, and names of one hard-linked inode, collide.
    #[test]
    fn names_resolve_through_links_unlinks_and_forgets_when_hashes_collide() {
        for order in 0..4usize {
            let mut t = NodeTable::new(Arc::new(AtomicUsize::new(0)));
            t.children = ChildIndex::colliding_often(1);
            let d = 7u64;
            let others: Vec<u64> = ["b", "c", "d"]
                .iter()
                .enumerate()
                .map(|(i, n)| t.insert_child(d, OsStr::new(n), 200 + i as u64, NodeKind::Repo(0)))
                .collect();
            let a = t.insert_child(d, OsStr::new("a"), 100, NodeKind::Repo(0));
            // Hard links of "a": with one bit of hash, several share a slot with it.
            let mut names: Vec<String> = vec!["a".into()];
            for i in 0..8 {
                let l = format!("a{i}");
                t.detach_name(d, OsStr::new(&l));
                t.add_alias(a, d, OsStr::new(&l));
                names.push(l);
            }
            let check = |t: &NodeTable, live: &[String]| {
                for n in live {
                    assert_eq!(t.child(d, OsStr::new(n)), Some(a), "order {order}: {n}");
                }
                for (n, ino) in ["b", "c", "d"].iter().zip(&others) {
                    assert_eq!(t.child(d, OsStr::new(n)), Some(*ino), "order {order}: {n}");
                }
            };
            check(&t, &names);
            // Unlink the names one by one, in a different order each round.
            let k = names.len();
            let mut live = names.clone();
            for step in 0..k - 1 {
                let victim = live.remove((step * (order + 1) + order) % live.len());
                t.detach_name(d, OsStr::new(&victim));
                assert_eq!(
                    t.child(d, OsStr::new(&victim)),
                    None,
                    "order {order}: {victim}"
                );
                check(&t, &live);
            }
            // Forgetting the inodes leaves no name behind.
            t.remove_node(a);
            for ino in others {
                t.remove_node(ino);
            }
            for n in names.iter().map(String::as_str).chain(["b", "c", "d"]) {
                assert_eq!(t.child(d, OsStr::new(n)), None, "order {order}: {n}");
            }
            assert!(t.children.is_empty(), "{} names left", t.children.len());
            assert!(t.nodes.is_empty());
        }
    }
}
