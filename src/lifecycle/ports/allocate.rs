//! A block given to a worktree at its creation (or back at a restore), this state
//! directory's blocks claimed again at a mount, a block given back at a removal.

use std::path::Path;

use crate::ids::WorktreeId;
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::state::StateDir;
use crate::store::{PortBlock, Store};

use super::foreign::{foreign_claims, other_registries, Foreign};
use super::listening::listening_ports;
use super::range::{range_of, PortRange};
use super::registry::{registry, Registry, Synced};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::ports::foreign::of_this_user;
    use crate::lifecycle::ports::range::META_RANGE;
    use crate::lifecycle::ports::registry::claim_name;
    use std::fs;

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

    /// An allocation keeps clear of what the machine's other registries claim (another
    /// user's, root's).
    #[test]
    fn blocks_claimed_in_another_registry_are_not_given() {
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
            &[of_this_user(&theirs_dir)],
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
}
