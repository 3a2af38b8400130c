//! A block of ports for each worktree, so servers that agents start side by side never
//! collide: a range (default 20000–29999, below the kernel's ephemeral ports) cut into
//! blocks (default 10), one given to each worktree at its creation, kept while it lives
//! (the store holds it; a restart keeps it), free again when it is removed.
//!
//! Blocks are unique across the state directories that share a registry: each is
//! claimed by a file `<first>-<size>` there (`/run/worktreefs/ports` for root, only root
//! may write it; for another user `$XDG_RUNTIME_DIR/worktreefs/ports`, unique across that
//! user's state directories), written under the registry's lock (waited for at most
//! `LOCK_WAIT`) and never through a symlink. An allocation also keeps clear of the blocks
//! the machine's other registries claim, as far as it can read them (a user reads
//! root's; root reads every user's, at most `FOREIGN_PORTS` ports of each): across
//! users, blocks are unique but for two allocations at the same moment. The file names the worktree and the state
//! directory. A claim whose state directory is not there goes at the next allocation;
//! this state directory's claims follow its store: dropped when their worktree is no
//! longer live, made again where missing, and at each mount (`reclaim_all`, after a
//! reboot emptied `/run`) a worktree whose block another state directory claimed
//! meanwhile gets a new one, and one with none (made before blocks were given, or when
//! none was free) gets one. A block with a port someone listens on (TCP) or is bound to
//! (UDP), IPv4 or IPv6, as `/proc/net` lists them, is skipped.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::ids::WorktreeId;
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::state::StateDir;
use crate::store::{PortBlock, Store};

/// Where blocks are cut from, and how big each is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
    pub block: u16,
}

impl Default for PortRange {
    fn default() -> PortRange {
        PortRange {
            low: 20000,
            high: 29999,
            block: 10,
        }
    }
}

/// Where the mount records its range (`LOW-HIGH/BLOCK`), for creations made by any
/// process of the state directory.
pub const META_RANGE: &str = "port_range";

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}/{}", self.low, self.high, self.block)
    }
}

/// The range the last mount of the state directory set, else the default.
pub fn range_of(store: &Store) -> PortRange {
    store
        .meta_get(META_RANGE)
        .ok()
        .flatten()
        .and_then(|v| {
            let (range, block) = v.split_once('/')?;
            PortRange::parse(range, block.parse().ok()?).ok()
        })
        .unwrap_or_default()
}

/// What runs inside worktree `row` (at `path`) is told of it: `WORKTREEFS_WORKTREE`
/// (`repo/name`), `WORKTREEFS_PATH`, `WORKTREEFS_SOURCE` (the registered checkout), and
/// with its block of ports `WORKTREEFS_PORT` (the first) and `WORKTREEFS_PORTS` (how
/// many).
pub fn environment(
    store: &Store,
    row: &crate::store::WorktreeRow,
    path: &Path,
) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "WORKTREEFS_WORKTREE".to_string(),
            format!("{}/{}", row.repo, row.name),
        ),
        ("WORKTREEFS_PATH".to_string(), path.display().to_string()),
    ];
    if let Ok(Some(r)) = store.repo_by_id(row.repo_id) {
        env.push(("WORKTREEFS_SOURCE".into(), r.path.display().to_string()));
    }
    if let Ok(Some(b)) = store.ports_of(row.id) {
        env.push(("WORKTREEFS_PORT".into(), b.first.to_string()));
        env.push(("WORKTREEFS_PORTS".into(), b.size.to_string()));
    }
    env
}

/// Gives the new worktree `id` its block (the one it had before when `want` is free);
/// without one (every block taken, or the registry not to be had) the worktree is made
/// all the same, the log and the error saying why. Returns the block given.
pub fn give(
    state: &StateDir,
    store: &Store,
    id: WorktreeId,
    want: Option<PortBlock>,
) -> Result<PortBlock, String> {
    let range = range_of(store);
    let why = match assign(state, store, id, range, want) {
        Ok(Some(b)) => return Ok(b),
        Ok(None) => format!("every block of {range} is claimed or in use"),
        Err(e) => format!("{e:#}"),
    };
    tracing::warn!("worktree {id} has no ports: {why}");
    Err(why)
}

impl PortRange {
    /// `LOW-HIGH` (`mount --ports`), with blocks of `block`: refused, saying why, when
    /// it holds no block or reaches port 0.
    pub fn parse(text: &str, block: u16) -> Result<PortRange, String> {
        let (lo, hi) = text.split_once('-').ok_or_else(|| {
            format!("'{text}' is not a range of ports LOW-HIGH (for example 20000-29999)")
        })?;
        let parse = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("'{s}' in '{text}' is not a port (1-65535)"))
        };
        let (low, high) = (parse(lo)?, parse(hi)?);
        if low == 0 || block == 0 || high < low || (high - low) as u32 + 1 < block as u32 {
            return Err(format!(
                "ports {text} hold no block of {block}: give LOW-HIGH with LOW at least 1 and at least {block} ports"
            ));
        }
        Ok(PortRange { low, high, block })
    }

    /// Its blocks, in order.
    fn blocks(&self) -> impl Iterator<Item = PortBlock> + '_ {
        (self.low as u32..)
            .step_by(self.block as usize)
            .take_while(|f| f + self.block as u32 - 1 <= self.high as u32)
            .map(|f| PortBlock {
                first: f as u16,
                size: self.block,
            })
    }
}

/// Where the claims are: root's registry for every state directory of root's, a user's
/// own for that user's.
fn registry() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/worktreefs/ports");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("worktreefs/ports"),
        _ => std::env::temp_dir().join(format!(
            "worktreefs-ports-{}",
            nix::unistd::geteuid().as_raw()
        )),
    }
}

/// Another user's registry (or root's), read to keep clear of its claims.
#[derive(Debug, Clone)]
struct Foreign {
    /// A directory of the machine's (`/run/user/UID`, `/tmp`) on no FUSE mount ...
    base: PathBuf,
    /// ... and the registry below it, reached through no symlink and no mount.
    rel: String,
    /// Whose it is: a directory of anyone else's there is not read.
    uid: u32,
}

/// The other registries of this machine, whose claims an allocation here keeps clear of
/// (read without their lock, so two allocations at the same moment may meet): root's,
/// for a user; for root, every user's (`/run/user/UID/worktreefs/ports`, and
/// `worktreefs-ports-UID` in the temporary directory for each uid of the password file).
fn other_registries(own: &Path) -> Vec<Foreign> {
    let mut out = vec![Foreign {
        base: PathBuf::from("/run"),
        rel: "worktreefs/ports".into(),
        uid: 0,
    }];
    if nix::unistd::geteuid().is_root() {
        for e in fs::read_dir("/run/user").into_iter().flatten().flatten() {
            if let Ok(uid) = e.file_name().to_string_lossy().parse() {
                out.push(Foreign {
                    base: e.path(),
                    rel: "worktreefs/ports".into(),
                    uid,
                });
            }
        }
        // Those of users without a runtime directory, by the uids of the password file
        // (not a listing of the temporary directory, which may be huge).
        let tmp = std::env::temp_dir();
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        for uid in passwd
            .lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        {
            if uid != 0 {
                out.push(Foreign {
                    base: tmp.clone(),
                    rel: format!("worktreefs-ports-{uid}"),
                    uid,
                });
            }
        }
    }
    out.retain(|f| f.base.join(&f.rel) != own);
    out
}

/// How many ports one other user's registries may keep an allocation here from: a user
/// cannot make root's daemon give no ports by claiming the whole range (their stale
/// claims, of state directories since deleted, count too until that user allocates
/// again).
const FOREIGN_PORTS: u32 = 1000;

/// How many names of one other registry are read at most.
const FOREIGN_NAMES: usize = 4096;

/// The blocks the registries `regs` claim, as far as this user can read them: the names
/// of the claims (blocks of at most [`FOREIGN_PORTS`] ports, that many of each user's at
/// most) in a directory of the registry's owner that others may not write, reached from
/// a base on no FUSE mount through no symlink and no mount. Nothing of another user's is
/// opened or followed: their files may be FIFOs, their paths lead anywhere, their mounts
/// may hang.
fn foreign_claims(regs: &[Foreign]) -> Vec<PortBlock> {
    use std::collections::HashMap;
    use std::os::fd::{AsFd, AsRawFd};
    let mut out = Vec::new();
    let mut counted: HashMap<u32, u32> = HashMap::new();
    for reg in regs {
        let Ok(base) = crate::beneath::open_real_dir(&reg.base) else {
            continue;
        };
        match crate::mounttable::fs_type_of_fd(base.as_raw_fd()) {
            Some(t) if !t.starts_with("fuse") => {}
            _ => {
                tracing::warn!(
                    "{} is on a FUSE mount (or one that cannot be told): its claims of ports are not read",
                    reg.base.display()
                );
                continue;
            }
        }
        let Ok(fd) = crate::beneath::open(
            base.as_fd(),
            reg.rel.as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        ) else {
            continue;
        };
        let Ok(st) = crate::beneath::fstat(fd.as_fd()) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR
            || st.st_mode & 0o022 != 0
            || st.st_uid != reg.uid
        {
            continue;
        }
        let names = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let mut blocks: Vec<PortBlock> = names
            .into_iter()
            .flatten()
            .take(FOREIGN_NAMES)
            .flatten()
            .filter_map(|e| parse_claim_name(&e.file_name().to_string_lossy()))
            .filter(|b| b.size > 0 && u32::from(b.size) <= FOREIGN_PORTS)
            .collect();
        blocks.sort_by_key(|b| b.first);
        let ports = counted.entry(reg.uid).or_default();
        for b in blocks {
            *ports += u32::from(b.size);
            if *ports > FOREIGN_PORTS {
                tracing::warn!(
                    "uid {}'s registries claim more than {FOREIGN_PORTS} ports: the rest are not kept clear of",
                    reg.uid
                );
                break;
            }
            out.push(b);
        }
    }
    out
}

/// How long a creation waits for another process's allocation before it goes on without
/// ports.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One claim file: its block, and the worktree and state directory it is for.
struct Claim {
    block: PortBlock,
    id: Option<WorktreeId>,
    root: PathBuf,
}

/// The registry, locked for as long as this lives: a directory of this user's that
/// nobody else may write, reached through no symlink, and whose files are never opened
/// through one.
struct Registry {
    dir: PathBuf,
    _lock: fs::File,
}

impl Registry {
    fn open(dir: &Path) -> LifecycleResult<Registry> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("making {}", dir.display()))?;
        let meta =
            fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
        if !meta.is_dir()
            || meta.uid() != nix::unistd::geteuid().as_raw()
            || meta.mode() & 0o022 != 0
        {
            return Err(crate::lifecycle::error::refused(format!(
                "{} is not a directory of this user's that only it may write (a symlink, another user's, or writable by others): no ports are claimed there",
                dir.display()
            )));
        }
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(dir.join(".lock"))
            .with_context(|| format!("opening {}", dir.join(".lock").display()))?;
        let until = std::time::Instant::now() + LOCK_WAIT;
        // SAFETY: flock on a descriptor this function owns; released when it is closed.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if std::time::Instant::now() >= until {
                return Err(crate::lifecycle::error::refused(format!(
                    "{} stayed locked by another allocation for {} s",
                    dir.join(".lock").display(),
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(Registry {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    fn claims(&self) -> LifecycleResult<Vec<Claim>> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = Vec::new();
        for e in
            fs::read_dir(&self.dir).with_context(|| format!("listing {}", self.dir.display()))?
        {
            let e = e.with_context(|| format!("listing {}", self.dir.display()))?;
            let Some(block) = parse_claim_name(&e.file_name().to_string_lossy()) else {
                continue;
            };
            // `<id>\n<state root>`: the root last, as bytes (it may hold anything).
            let text = fs::read(e.path()).unwrap_or_default();
            let (id, root) = match text.iter().position(|b| *b == b'\n') {
                Some(n) => (
                    std::str::from_utf8(&text[..n])
                        .ok()
                        .and_then(|s| s.parse().ok()),
                    PathBuf::from(std::ffi::OsStr::from_bytes(&text[n + 1..])),
                ),
                None => (None, PathBuf::new()),
            };
            out.push(Claim { block, id, root });
        }
        Ok(out)
    }

    fn write(&self, b: PortBlock, state: &StateDir, id: WorktreeId) -> LifecycleResult<()> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(claim_name(b));
        let mut f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("claiming {}", path.display()))?;
        let mut text = format!("{id}\n").into_bytes();
        text.extend_from_slice(state.root.as_os_str().as_bytes());
        f.write_all(&text)
            .with_context(|| format!("claiming {}", path.display()))?;
        Ok(())
    }

    /// Block `b` claimed for worktree `id` and recorded as its own, and counted as
    /// claimed from now on.
    fn give(
        &self,
        b: PortBlock,
        state: &StateDir,
        store: &Store,
        id: WorktreeId,
        claimed: &mut Vec<PortBlock>,
    ) -> LifecycleResult<()> {
        self.write(b, state, id)?;
        store
            .set_ports(id, b)
            .context("recording the worktree's ports")?;
        claimed.push(b);
        Ok(())
    }

    fn remove(&self, b: PortBlock) {
        let _ = fs::remove_file(self.dir.join(claim_name(b)));
    }

    /// The blocks claimed, after dropping the claims that hold nothing any more: this
    /// state directory's that its store no longer has, another's whose state directory
    /// is not there (gone, not merely unreadable). This state directory's live blocks are
    /// claimed again where no claim is (a reboot empties /run); one another state
    /// directory claimed meanwhile is returned in the second list.
    fn sync(&self, state: &StateDir, live: &[(WorktreeId, PortBlock)]) -> LifecycleResult<Synced> {
        let mut claimed = Vec::new();
        let mut ours = Vec::new();
        for c in self.claims()? {
            let stale = if c.root == state.root {
                !live.iter().any(|(w, b)| Some(*w) == c.id && *b == c.block)
            } else {
                c.root.as_os_str().is_empty()
                    || fs::symlink_metadata(&c.root)
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            };
            if stale {
                self.remove(c.block);
                continue;
            }
            if c.root == state.root {
                ours.push(c.block);
            }
            claimed.push(c.block);
        }
        let mut taken_over = Vec::new();
        for (w, b) in live {
            if ours.contains(b) {
                continue;
            }
            if claimed.iter().any(|c| c.overlaps(b)) {
                taken_over.push((*w, *b));
                continue;
            }
            self.write(*b, state, *w)?;
            claimed.push(*b);
        }
        Ok(Synced {
            claimed,
            taken_over,
        })
    }
}

/// What [`Registry::sync`] found: every block claimed, and this state directory's live
/// blocks that another state directory claimed meanwhile.
struct Synced {
    claimed: Vec<PortBlock>,
    taken_over: Vec<(WorktreeId, PortBlock)>,
}

fn claim_name(b: PortBlock) -> String {
    format!("{}-{}", b.first, b.size)
}

fn parse_claim_name(name: &str) -> Option<PortBlock> {
    let (f, s) = name.split_once('-')?;
    Some(PortBlock {
        first: f.parse().ok()?,
        size: s.parse().ok()?,
    })
}

/// The first block of `range` free of `claimed` and of ports something listens on.
fn free_block(
    range: PortRange,
    claimed: &[PortBlock],
    want: Option<PortBlock>,
) -> Option<PortBlock> {
    let listening = listening_ports();
    let free = |b: &PortBlock| {
        !claimed.iter().any(|c| c.overlaps(b)) && !listening.iter().any(|p| b.holds(*p))
    };
    // The block asked for, when it is one of this range's.
    let want = want.filter(|w| range.blocks().any(|b| b == *w));
    want.filter(|b| free(b))
        .or_else(|| range.blocks().find(|b| free(b)))
}

/// Gives worktree `id` a block of `range`, and says which; None when every block is
/// claimed or in use (the worktree is made all the same, without ports: the caller says
/// so). `want`: the block to give when it is free (a restored worktree's old one).
pub fn assign(
    state: &StateDir,
    store: &Store,
    id: WorktreeId,
    range: PortRange,
    want: Option<PortBlock>,
) -> LifecycleResult<Option<PortBlock>> {
    let dir = registry();
    assign_among(&dir, &other_registries(&dir), state, store, id, range, want)
}

/// [`assign`] in registry `dir`, keeping clear of the claims of the registries `others`.
fn assign_among(
    dir: &Path,
    others: &[Foreign],
    state: &StateDir,
    store: &Store,
    id: WorktreeId,
    range: PortRange,
    want: Option<PortBlock>,
) -> LifecycleResult<Option<PortBlock>> {
    let reg = Registry::open(dir)?;
    let live = store.live_ports().context("reading the ports' records")?;
    let mut claimed = reg.sync(state, &live)?.claimed;
    claimed.extend(foreign_claims(others));
    let Some(b) = free_block(range, &claimed, want) else {
        return Ok(None);
    };
    reg.write(b, state, id)?;
    store
        .set_ports(id, b)
        .context("recording the worktree's ports")?;
    Ok(Some(b))
}

/// At a mount: this state directory's blocks are claimed again (a reboot empties
/// /run), and a worktree whose block another state directory claimed meanwhile gets a
/// new one (said in the log). Failures are logged: the mount goes on.
pub fn reclaim_all(state: &StateDir, store: &Store) {
    let dir = registry();
    if let Err(e) = reclaim_in(&dir, &other_registries(&dir), state, store) {
        tracing::warn!("claiming the worktrees' ports again: {e:#}");
    }
}

fn reclaim_in(
    dir: &Path,
    others: &[Foreign],
    state: &StateDir,
    store: &Store,
) -> LifecycleResult<()> {
    let reg = Registry::open(dir)?;
    let live = store.live_ports().context("reading the ports' records")?;
    let Synced {
        mut claimed,
        taken_over,
    } = reg.sync(state, &live)?;
    claimed.extend(foreign_claims(others));
    let range = range_of(store);
    for (id, old) in taken_over {
        match free_block(range, &claimed, None) {
            Some(b) => {
                reg.give(b, state, store, id, &mut claimed)?;
                tracing::info!(
                    "worktree {id}: ports {}-{} were claimed by another state directory; it has {}-{} now",
                    old.first,
                    old.first as u32 + old.size as u32 - 1,
                    b.first,
                    b.first as u32 + b.size as u32 - 1
                );
            }
            None => tracing::warn!(
                "worktree {id}: ports {}-{} were claimed by another state directory, and no block of {range} is free",
                old.first,
                old.first as u32 + old.size as u32 - 1
            ),
        }
    }
    // Worktrees with none (made before blocks were given, or when none was free).
    for id in store
        .live_without_ports()
        .context("reading the worktrees without ports")?
    {
        let Some(b) = free_block(range, &claimed, None) else {
            tracing::warn!("worktree {id} has no ports, and no block of {range} is free");
            break;
        };
        reg.give(b, state, store, id, &mut claimed)?;
        tracing::info!(
            "worktree {id} had no ports; it has {}-{} now",
            b.first,
            b.first as u32 + b.size as u32 - 1
        );
    }
    Ok(())
}

/// Gives worktree `id`'s block back (its claim goes; the store keeps the record, for a
/// restore). Nothing when it had none.
pub fn release(state: &StateDir, store: &Store, id: WorktreeId) {
    release_in(&registry(), state, store, id)
}

fn release_in(dir: &Path, state: &StateDir, store: &Store, id: WorktreeId) {
    let Ok(Some(b)) = store.ports_of(id) else {
        return;
    };
    let Ok(reg) = Registry::open(dir) else {
        // Dropped by the next allocation, which finds the worktree removed.
        return;
    };
    if let Ok(claims) = reg.claims() {
        if claims
            .iter()
            .any(|c| c.block == b && c.id == Some(id) && c.root == state.root)
        {
            reg.remove(b);
        }
    }
}

/// The ports something listens on (TCP) or is bound to (UDP), as `/proc/net` lists
/// them.
fn listening_ports() -> HashSet<u16> {
    let mut out = HashSet::new();
    for (file, tcp) in [
        ("tcp", true),
        ("tcp6", true),
        ("udp", false),
        ("udp6", false),
    ] {
        let Ok(text) = fs::read_to_string(Path::new("/proc/net").join(file)) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(st)) = (f.get(1), f.get(3)) else {
                continue;
            };
            // TCP: only a socket in LISTEN (0A); UDP: any bound socket.
            if tcp && *st != "0A" {
                continue;
            }
            if let Some(port) = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                out.insert(port);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, StateDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let state = StateDir::open(&d.path().join("state")).unwrap();
        let store = Store::open(&state.root).unwrap();
        (d, state, store)
    }

    /// `n` worktrees of a repository of `store`'s.
    fn worktrees(store: &mut Store, n: usize) -> Vec<WorktreeId> {
        let repo = store
            .add_repo("r", Path::new("/x"), Path::new("/x/.git"))
            .unwrap();
        (0..n)
            .map(|i| {
                let name = format!("w{i}");
                store
                    .insert_worktree(&crate::store::NewWorktree {
                        repo_id: repo.id,
                        name: &name,
                        branch: Some(&name),
                        branch_created: true,
                        base_commit: "c",
                        base_tree: "t",
                        base_mtime: 1,
                        uid: 0,
                        gid: 0,
                        admin_name: &name,
                        warm: None,
                    })
                    .unwrap()
            })
            .collect()
    }

    /// Blocks are cut in order, skip what another state directory claimed and what
    /// someone listens on, come back with a restore when free, and go at removal.
    #[test]
    fn blocks_are_unique_skip_listeners_and_are_given_back() {
        let (d, state, mut store) = setup();
        let reg = d.path().join("registry");
        let (_d2, other, mut other_store) = setup();
        let ids = worktrees(&mut store, 3);
        let theirs = worktrees(&mut other_store, 1);
        // Someone listens on a port: its block is never given.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = listener.local_addr().unwrap().port();
        let range = PortRange {
            low: busy - (busy % 10),
            high: busy - (busy % 10) + 39,
            block: 10,
        };
        let a = assign_among(&reg, &[], &other, &other_store, theirs[0], range, None)
            .unwrap()
            .unwrap();
        assert!(!a.holds(busy), "a listened port was given: {a:?}");
        let b = assign_among(&reg, &[], &state, &store, ids[0], range, None)
            .unwrap()
            .unwrap();
        let c = assign_among(&reg, &[], &state, &store, ids[1], range, None)
            .unwrap()
            .unwrap();
        for x in [a, b, c] {
            assert!(!x.holds(busy), "{x:?}");
        }
        assert!(!a.overlaps(&b) && !a.overlaps(&c) && !b.overlaps(&c));
        // Four blocks, one listened on (or more, by other programs), three taken: none
        // left.
        assert_eq!(
            assign_among(&reg, &[], &state, &store, ids[2], range, None).unwrap(),
            None
        );
        // Removed: its block is free again, and a restore asks for it back.
        store.mark_removed(ids[0], "test").unwrap();
        release_in(&reg, &state, &store, ids[0]);
        let again = assign_among(&reg, &[], &state, &store, ids[2], range, Some(b))
            .unwrap()
            .unwrap();
        assert_eq!(again, b);
        // A state directory that is gone loses its claims.
        drop(other_store);
        fs::remove_dir_all(&other.root).unwrap();
        let freed = assign_among(&reg, &[], &state, &store, ids[0], range, Some(a)).unwrap();
        assert_eq!(freed, Some(a));
        drop(listener);
    }

    /// After the registry is emptied (a reboot), another state directory may claim a
    /// block one of this one's worktrees had: the next mount gives that worktree a new
    /// block, and the claims are made again.
    #[test]
    fn a_block_claimed_by_another_after_a_reboot_is_moved_at_the_next_mount() {
        let (d, state, mut store) = setup();
        let reg = d.path().join("registry");
        let (_d2, other, mut other_store) = setup();
        let ours = worktrees(&mut store, 1)[0];
        let theirs = worktrees(&mut other_store, 1)[0];
        let range = PortRange {
            low: 41000,
            high: 41099,
            block: 10,
        };
        let b = assign_among(&reg, &[], &state, &store, ours, range, None)
            .unwrap()
            .unwrap();
        fs::remove_dir_all(&reg).unwrap();
        let t = assign_among(&reg, &[], &other, &other_store, theirs, range, Some(b))
            .unwrap()
            .unwrap();
        assert_eq!(t, b, "the other state dir took it while nobody claimed it");
        store.meta_set(META_RANGE, &range.to_string()).unwrap();
        reclaim_in(&reg, &[], &state, &store).unwrap();
        let moved = store.ports_of(ours).unwrap().unwrap();
        assert!(!moved.overlaps(&b), "{moved:?}");
        let names: Vec<String> = fs::read_dir(&reg)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.contains(&claim_name(moved)) && names.contains(&claim_name(b)),
            "{names:?}"
        );
    }

    /// A live worktree without a block (made before blocks were given, or when none was
    /// free) gets one at the next mount; a removed one does not.
    #[test]
    fn a_worktree_without_a_block_gets_one_at_the_next_mount() {
        let (d, state, mut store) = setup();
        let reg = d.path().join("registry");
        let ids = worktrees(&mut store, 3);
        let range = PortRange {
            low: 42000,
            high: 42099,
            block: 10,
        };
        store.meta_set(META_RANGE, &range.to_string()).unwrap();
        let b = assign_among(&reg, &[], &state, &store, ids[0], range, None)
            .unwrap()
            .unwrap();
        store.mark_removed(ids[2], "test").unwrap();
        reclaim_in(&reg, &[], &state, &store).unwrap();
        let given = store
            .ports_of(ids[1])
            .unwrap()
            .expect("a block at the mount");
        assert!(!given.overlaps(&b), "{given:?} {b:?}");
        assert_eq!(given.size, 10);
        assert_eq!(store.ports_of(ids[0]).unwrap(), Some(b));
        assert_eq!(store.ports_of(ids[2]).unwrap(), None);
    }

    /// `dir` as another user's registry, of this user's.
    fn foreign(dir: &Path) -> Foreign {
        Foreign {
            base: dir.parent().unwrap().to_path_buf(),
            rel: dir.file_name().unwrap().to_string_lossy().into_owned(),
            uid: nix::unistd::geteuid().as_raw(),
        }
    }

    /// An allocation keeps clear of what the machine's other registries claim (another
    /// user's, root's): at most `FOREIGN_PORTS` ports of each user's, in blocks of at
    /// most that, from a directory of the owner named that others may not write, reached
    /// through no symlink.
    #[test]
    fn blocks_claimed_in_another_registry_are_not_given() {
        use std::os::unix::fs::PermissionsExt;
        let (d, state, mut store) = setup();
        let (_d2, other, mut other_store) = setup();
        let (ours, theirs) = (worktrees(&mut store, 1), worktrees(&mut other_store, 1));
        let (reg, theirs_dir) = (d.path().join("mine"), d.path().join("theirs"));
        let range = PortRange {
            low: 43000,
            high: 43099,
            block: 10,
        };
        let t = assign_among(
            &theirs_dir,
            &[],
            &other,
            &other_store,
            theirs[0],
            range,
            None,
        )
        .unwrap()
        .unwrap();
        let o = assign_among(
            &reg,
            &[foreign(&theirs_dir)],
            &state,
            &store,
            ours[0],
            range,
            Some(t),
        )
        .unwrap()
        .unwrap();
        assert!(
            !o.overlaps(&t),
            "{o:?} is {t:?}, claimed in the other registry"
        );
        // Past the limit nothing counts, across one user's registries: 150 blocks of 10
        // in two registries are 1,500 ports; one block of the whole range counts for
        // nothing.
        let (many, more) = (d.path().join("many"), d.path().join("more"));
        for (dir, from) in [(&many, 0u32), (&more, 100)] {
            fs::create_dir(dir).unwrap();
            for i in from..from + 75 {
                fs::write(dir.join(format!("{}-10", 50000 + i * 10)), "").unwrap();
            }
        }
        fs::write(many.join("1-65535"), "").unwrap();
        let seen = foreign_claims(&[foreign(&many), foreign(&more)]);
        assert_eq!(seen.len() as u32 * 10, FOREIGN_PORTS, "{seen:?}");
        assert!(seen.iter().all(|b| b.size == 10));
        // Another owner's than the one named, one anyone may write, one reached through
        // a symlink: not read.
        let wrong = Foreign {
            uid: 4242,
            ..foreign(&more)
        };
        assert!(foreign_claims(&[wrong]).is_empty());
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&more, &link).unwrap();
        assert!(foreign_claims(&[foreign(&link)]).is_empty());
        fs::set_permissions(&more, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(foreign_claims(&[foreign(&more)]).is_empty());
    }

    /// A registry another user could write into, or a symlink, is refused.
    #[test]
    fn a_registry_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (d, state, mut store) = setup();
        let id = worktrees(&mut store, 1)[0];
        let open = d.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(assign_among(&open, &[], &state, &store, id, PortRange::default(), None).is_err());
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        assert!(assign_among(&link, &[], &state, &store, id, PortRange::default(), None).is_err());
        assert_eq!(store.ports_of(id).unwrap(), None);
    }

    #[test]
    fn a_range_that_holds_no_block_is_refused() {
        assert!(PortRange::parse("20000-29999", 10).is_ok());
        for bad in ["", "20000", "x-y", "0-100", "300-200", "20000-20004"] {
            assert!(PortRange::parse(bad, 10).is_err(), "{bad}");
        }
    }
}
