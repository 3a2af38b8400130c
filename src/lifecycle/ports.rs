//! A block of ports for each worktree, so servers that agents start side by side never
//! collide: a range (default 20000–29999, below the kernel's ephemeral ports) cut into
//! blocks (default 10), one given to each worktree at its creation, kept while it lives
//! (the store holds it; a restart keeps it), free again when it is removed.
//!
//! Blocks are unique across every state directory on the machine: each is claimed by a
//! file `<first>-<size>` in a registry directory (`/run/worktreefs/ports` for root; for
//! another user `$XDG_RUNTIME_DIR/worktreefs/ports`, unique across that user's state
//! directories), written under the registry's lock. The file names the state directory
//! and the worktree. A claim whose state directory is gone goes at the next allocation;
//! this state directory's claims are made again from its store (after a reboot emptied
//! `/run`) and dropped when their worktree is no longer live. A block with a port someone
//! listens on (TCP or UDP, IPv4 or IPv6, as `/proc/net` lists them) is skipped.

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
/// a failure to claim one is logged and leaves the worktree without ports, never
/// unmade. Returns the block given.
pub fn give(
    state: &StateDir,
    store: &Store,
    id: WorktreeId,
    want: Option<PortBlock>,
) -> Option<PortBlock> {
    let range = range_of(store);
    match assign(state, store, id, range, want) {
        Ok(Some(b)) => Some(b),
        Ok(None) => {
            tracing::warn!(
                "worktree {id} has no ports: every block of {range} is claimed or in use"
            );
            None
        }
        Err(e) => {
            tracing::warn!("worktree {id} has no ports: {e:#}");
            None
        }
    }
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

/// The registry of claims, and whether it is shared by every user (root's).
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

/// A claim file: the state directory and the worktree it is for.
fn claim_text(state: &StateDir, id: WorktreeId) -> String {
    format!("{}\n{id}\n", state.root.display())
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
    assign_in(&registry(), state, store, id, range, want)
}

fn assign_in(
    dir: &Path,
    state: &StateDir,
    store: &Store,
    id: WorktreeId,
    range: PortRange,
    want: Option<PortBlock>,
) -> LifecycleResult<Option<PortBlock>> {
    fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    // A directory of this user's, reached through no symlink: in a shared /tmp another
    // user could have put one there first.
    {
        use std::os::unix::fs::MetadataExt;
        let meta =
            fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(crate::lifecycle::error::refused(format!(
                "{} is not a directory of this user's (a symlink, or another user's): no ports are claimed there",
                dir.display()
            )));
        }
    }
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .with_context(|| format!("opening {}", dir.join(".lock").display()))?;
    // SAFETY: flock on a descriptor this function owns; released when it is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("locking {}", dir.join(".lock").display()));
    }
    let live = store.live_ports().context("reading the ports' records")?;
    let ours = claim_text(state, id);
    let mut claimed: Vec<PortBlock> = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(b) = parse_claim_name(&name) else {
            continue;
        };
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        let owner = PathBuf::from(text.lines().next().unwrap_or_default());
        let of_ours = owner == state.root;
        // This state directory's claims follow its store; another's go with it.
        let stale = if of_ours {
            let wt = text
                .lines()
                .nth(1)
                .and_then(|l| l.parse::<WorktreeId>().ok());
            !live.iter().any(|(w, lb)| Some(*w) == wt && *lb == b)
        } else {
            !owner.is_dir()
        };
        if stale {
            let _ = fs::remove_file(e.path());
            continue;
        }
        claimed.push(b);
    }
    // Made again from the store: a reboot empties /run.
    for (w, b) in &live {
        if !claimed.contains(b) {
            write_claim(dir, *b, &claim_text(state, *w))?;
            claimed.push(*b);
        }
    }
    let listening = listening_ports();
    let free = |b: &PortBlock| {
        !claimed.iter().any(|c| c.overlaps(b)) && !listening.iter().any(|p| b.holds(*p))
    };
    let chosen = want
        .filter(|b| free(b))
        .or_else(|| range.blocks().find(|b| free(b)));
    let Some(b) = chosen else {
        return Ok(None);
    };
    write_claim(dir, b, &ours)?;
    store
        .set_ports(id, b)
        .context("recording the worktree's ports")?;
    Ok(Some(b))
}

fn write_claim(dir: &Path, b: PortBlock, text: &str) -> LifecycleResult<()> {
    let path = dir.join(claim_name(b));
    let mut f = fs::File::create(&path).with_context(|| format!("claiming {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("claiming {}", path.display()))?;
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
    let path = dir.join(claim_name(b));
    if fs::read_to_string(&path).is_ok_and(|t| t == claim_text(state, id)) {
        let _ = fs::remove_file(&path);
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
        let a = assign_in(&reg, &other, &other_store, theirs[0], range, None)
            .unwrap()
            .unwrap();
        assert!(!a.holds(busy), "a listened port was given: {a:?}");
        let b = assign_in(&reg, &state, &store, ids[0], range, None)
            .unwrap()
            .unwrap();
        let c = assign_in(&reg, &state, &store, ids[1], range, None)
            .unwrap()
            .unwrap();
        for x in [a, b, c] {
            assert!(!x.holds(busy), "{x:?}");
        }
        assert!(!a.overlaps(&b) && !a.overlaps(&c) && !b.overlaps(&c));
        // Four blocks, one listened on (or more, by other programs), three taken: none
        // left.
        assert_eq!(
            assign_in(&reg, &state, &store, ids[2], range, None).unwrap(),
            None
        );
        // Removed: its block is free again, and a restore asks for it back.
        store.mark_removed(ids[0], "test").unwrap();
        release_in(&reg, &state, &store, ids[0]);
        let again = assign_in(&reg, &state, &store, ids[2], range, Some(b))
            .unwrap()
            .unwrap();
        assert_eq!(again, b);
        // A state directory that is gone loses its claims.
        drop(other_store);
        fs::remove_dir_all(&other.root).unwrap();
        let freed = assign_in(&reg, &state, &store, ids[0], range, Some(a)).unwrap();
        assert_eq!(freed, Some(a));
        drop(listener);
    }

    #[test]
    fn a_range_that_holds_no_block_is_refused() {
        assert!(PortRange::parse("20000-29999", 10).is_ok());
        for bad in ["", "20000", "x-y", "0-100", "300-200", "20000-20004"] {
            assert!(PortRange::parse(bad, 10).is_err(), "{bad}");
        }
    }
}
