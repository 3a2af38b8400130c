//! `worktreefs du`: the disk the state directory uses, by what uses it: each worktree's
//! upper layer, the kept removals, the shared caches, the database. Read without ever
//! following a symlink (the upper layers hold what users made: a directory swapped for a
//! link mid-walk is skipped, never walked into) and without entering a mount: the
//! mountpoint often sits inside the state directory, and a walk through it would take
//! leases, read every worktree's base tree, and hang with its daemon.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::Args;
use worktreefs::beneath;
use worktreefs::report::shapes::{DuJson, KeptUsageJson, UsageJson, WorktreeUsageJson};
use worktreefs::state::StateDir;
use worktreefs::store::Store;
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::state::open_store;
use crate::cli::target::which;

#[derive(Args)]
pub struct DuArgs {
    /// Only this worktree: REPO/WT, or a path inside it under the mount (default:
    /// the worktree the current directory is in, else everything).
    pub target: Option<String>,
    /// As JSON on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: DuArgs) -> Result<(), Failed> {
    Ok(cmd_du(state, args.target.as_deref(), args.json)?)
}

fn cmd_du(state: &StateDir, target: Option<&str>, json: bool) -> anyhow::Result<()> {
    use worktreefs::report::human_bytes;
    let given = match target {
        Some(t) => Some(which(state, Some(t), false)?),
        // Inside a worktree: that one; elsewhere: everything.
        None => which(state, None, false).ok(),
    };
    let only = given.as_deref().and_then(|t| t.split_once('/'));
    let store = open_store(state)?;
    let r = report(state, &store, only)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mut t = Table::new(&["WORKTREE", "STATE", "DISK", "ENTRIES"])
        .right(2)
        .right(3);
    for w in &r.worktrees {
        t.row([
            w.worktree.clone(),
            w.state.to_string(),
            human_bytes(w.usage.bytes),
            w.usage.entries.to_string(),
        ]);
    }
    print!("{}", t.render());
    if only.is_some() {
        return Ok(());
    }
    let sum = |it: &mut dyn Iterator<Item = u64>| it.sum::<u64>();
    println!(
        "kept removals: {} in {} (`worktreefs removed`)",
        human_bytes(sum(&mut r.removed.iter().map(|k| k.usage.bytes))),
        r.removed.len()
    );
    println!(
        "shared: content store {}, warm snapshots {}, index cache {}; database {}; being deleted {}",
        human_bytes(r.blobs.bytes),
        human_bytes(r.warm.bytes),
        human_bytes(r.index_cache.bytes),
        human_bytes(r.database.bytes),
        human_bytes(r.trash.bytes)
    );
    println!(
        "total {} in {} (each file once; the mount is not counted)",
        human_bytes(r.total.bytes),
        r.state_dir.display()
    );
    Ok(())
}

/// Counts file `st` in `u`.
fn add(u: &mut UsageJson, st: &libc::stat) {
    u.bytes += st.st_blocks as u64 * 512;
    u.apparent_bytes += st.st_size as u64;
    u.entries += 1;
}

/// The mountpoints at or below `root` (from /proc/self/mounts): never entered, never
/// even looked at (a stat there would ask the filesystem mounted there).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|t| PathBuf::from(worktreefs::mounttable::unescape_mount_path(t)))
        .filter(|p| p.starts_with(root) && p != root)
        .collect()
}

/// A walk of trees under one state directory: the inodes seen (a file linked from two
/// places counts once in each tree and once in a total walked with one `Walk`).
pub struct Walk {
    skip: Vec<PathBuf>,
    seen: HashSet<(u64, u64)>,
}

impl Walk {
    pub fn new(skip: Vec<PathBuf>) -> Walk {
        Walk {
            skip,
            seen: HashSet::new(),
        }
    }

    /// What `path` (the directory itself and all below it, on its own filesystem) uses;
    /// nothing for a path that is not there. Entries that go while it is read are not
    /// counted; a directory that cannot be read is counted without its contents.
    pub fn usage(&mut self, path: &Path) -> UsageJson {
        let mut u = UsageJson::default();
        if self.skip.iter().any(|s| s == path) {
            return u;
        }
        let Ok(fd) = beneath::open_real_dir(path) else {
            // A regular file (the database) or nothing.
            if let Ok(m) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::MetadataExt;
                if m.file_type().is_file() && self.seen.insert((m.dev(), m.ino())) {
                    u.bytes += m.blocks() * 512;
                    u.apparent_bytes += m.size();
                    u.entries += 1;
                }
            }
            return u;
        };
        let Ok(st) = beneath::fstat(fd.as_fd()) else {
            return u;
        };
        if self.seen.insert((st.st_dev, st.st_ino)) {
            add(&mut u, &st);
        }
        self.walk(fd.as_fd(), path, st.st_dev, &mut u);
        u
    }

    fn walk(&mut self, dir: BorrowedFd, path: &Path, dev: u64, u: &mut UsageJson) {
        let Ok(entries) = beneath::list(dir) else {
            return;
        };
        for e in entries {
            let p = path.join(&e.name);
            if self.skip.contains(&p) {
                continue;
            }
            let Ok(st) = beneath::stat_at(dir, &e.name) else {
                continue;
            };
            if st.st_dev != dev {
                continue;
            }
            if self.seen.insert((st.st_dev, st.st_ino)) {
                add(u, &st);
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                // O_NOFOLLOW | O_DIRECTORY: a directory replaced by a link since the
                // stat is not walked into.
                if let Ok(sub) = beneath::dir(dir, OsStr::as_bytes(&e.name)) {
                    if beneath::fstat(sub.as_fd()).is_ok_and(|s| s.st_dev == dev) {
                        self.walk(sub.as_fd(), &p, dev, u);
                    }
                }
            }
        }
    }
}

/// The usage of every worktree (or only `only`, `REPO/WT`) and the rest.
pub fn report(
    state: &StateDir,
    store: &Store,
    only: Option<(&str, &str)>,
) -> anyhow::Result<DuJson> {
    let skip = mounts_under(&state.root);
    let mut worktrees = Vec::new();
    for w in store.worktrees()? {
        if only.is_some_and(|(r, n)| r != w.repo || n != w.name) {
            continue;
        }
        if w.state == worktreefs::lease::State::Removed {
            continue;
        }
        let usage = Walk::new(skip.clone()).usage(&state.worktree_dir(w.id));
        worktrees.push(WorktreeUsageJson {
            id: w.id,
            worktree: format!("{}/{}", w.repo, w.name),
            repo: w.repo.clone(),
            name: w.name.clone(),
            state: w.state.as_str().to_string(),
            usage,
        });
    }
    if let Some((r, n)) = only {
        if worktrees.is_empty() {
            anyhow::bail!(
                "worktree '{r}/{n}' is not in use here (see `worktreefs list`; a removed one is under `worktreefs removed`)"
            );
        }
    }
    let mut removed = Vec::new();
    for k in store.kept()? {
        if only.is_some() {
            break;
        }
        removed.push(KeptUsageJson {
            id: k.worktree_id,
            worktree: format!("{}/{}", k.repo, k.worktree),
            repo: k.repo.clone(),
            name: k.worktree.clone(),
            usage: Walk::new(skip.clone()).usage(&state.removed_dir(k.worktree_id)),
        });
    }
    let one = |p: &Path| Walk::new(skip.clone()).usage(p);
    let db = state.root.join(worktreefs::store::DB_FILE);
    let mut database = UsageJson::default();
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.clone().into_os_string();
        name.push(suffix);
        let u = one(Path::new(&name));
        database.bytes += u.bytes;
        database.apparent_bytes += u.apparent_bytes;
        database.entries += u.entries;
    }
    Ok(DuJson {
        state_dir: state.root.clone(),
        worktrees,
        removed,
        blobs: one(&state.blobs()),
        warm: one(&state.warm()),
        index_cache: one(&state.index_cache()),
        database,
        trash: one(&state.trash()),
        total: Walk::new(skip).usage(&state.root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Sizes add up, a hard link counts once, a symlink is never followed (its target's
    /// size is not counted), and a skipped path is not looked at.
    #[test]
    fn a_walk_counts_each_inode_once_and_follows_no_link() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/one"), vec![1u8; 10_000]).unwrap();
        std::fs::hard_link(root.join("a/one"), root.join("a/b/same")).unwrap();
        std::fs::write(root.join("a/b/two"), vec![2u8; 3]).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 1 << 20]).unwrap();
        symlink(outside.path(), root.join("a/link")).unwrap();
        std::fs::create_dir(root.join("skipped")).unwrap();
        std::fs::write(root.join("skipped/x"), vec![0u8; 50_000]).unwrap();
        let u = Walk::new(vec![root.join("skipped")]).usage(root);
        // root, a, a/b, one (once), two, link.
        assert_eq!(u.entries, 6, "{u:?}");
        let dir_sizes: u64 = ["", "a", "a/b"]
            .iter()
            .map(|p| std::fs::symlink_metadata(root.join(p)).unwrap().len())
            .sum();
        let link = std::fs::symlink_metadata(root.join("a/link"))
            .unwrap()
            .len();
        assert_eq!(u.apparent_bytes, dir_sizes + 10_000 + 3 + link);
        assert!(u.bytes < (1 << 20), "followed the link: {u:?}");
        // Nothing there: nothing used.
        assert_eq!(
            Walk::new(vec![]).usage(&root.join("none")),
            UsageJson::default()
        );
    }
}
