//! Taking a snapshot: the steps listed in `mod.rs`, each file read as the user who asks.

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use git2::Oid;

use crate::beneath::{self, Stat};
use crate::git::filters::Owner;
use crate::git::warm::{Kind, Record};
use crate::lifecycle::error::{Context, LifecycleResult};
use crate::report::human_bytes;
use crate::state::StateDir;
use crate::store::{NewWarm, RepoRow, Store, WarmRow};

use super::as_user::{look, AsUser, Found};
use super::blob::store_blob;
use super::cache::{blob_path, dirs_path, idents_path, lock, path_order, LOCK_FILE};
use super::idents::{self, Ident};
use super::journal::Journal;
use super::patterns::{ls_files, patterns, INCLUDE_FILE};
use super::prune::{journals, prune};

/// How often a file that changes while it is copied is copied again before it is skipped.
pub(super) const MAX_COPIES: usize = 5;

/// A snapshot taken.
#[derive(Debug)]
pub struct Taken {
    pub row: WarmRow,
    pub links: u64,
    /// What was not taken, and why (path, reason).
    pub skipped: Vec<(String, String)>,
    /// Patterns that matched nothing.
    pub unmatched: Vec<String>,
    pub patterns: Vec<String>,
    pub took: Duration,
    /// Files the user's last snapshot read that were not read again (unchanged since).
    pub unchanged: u64,
}

/// How far a take has come: the files (and their bytes) copied so far, of those it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
    pub of_files: u64,
    pub of_bytes: u64,
}

/// Told after each file a take copies (cheap to call: the caller decides when to show).
pub type Progress<'a> = Option<&'a dyn Fn(Copied)>;

pub(super) fn lossy(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// Takes a new snapshot of `repo`'s source checkout with the permissions of `uid`. One
/// that fails leaves nothing: what it put in the blob cache is pruned at once (or by the
/// sweeper's next prune, when another take runs).
pub fn take(
    state: &StateDir,
    store: &mut Store,
    repo: &RepoRow,
    uid: u32,
    gid: u32,
    progress: Progress<'_>,
) -> LifecycleResult<Taken> {
    let taken = take_held(state, store, repo, uid, gid, progress);
    if taken.is_err() && !journals(state).is_empty() {
        // The lock this take held shared may still be held for an instant by a child any
        // thread of this process forked meanwhile (its descriptor lives until the child's
        // exec): the prune waits that out, a while, rather than leave it to the sweeper.
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match prune(state, store) {
                Ok(None) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!("pruning after a failed warm snapshot: {e:#}");
                    break;
                }
            }
        }
    }
    taken
}

/// [`take`], under the lock shared with other takes.
pub(super) fn take_held(
    state: &StateDir,
    store: &mut Store,
    repo: &RepoRow,
    uid: u32,
    gid: u32,
    progress: Progress<'_>,
) -> LifecycleResult<Taken> {
    let started = Instant::now();
    let started_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    // Held until the row is in the store: a prune never deletes a content this stored,
    // nor its manifest, before then.
    let _lock = lock(state, libc::LOCK_SH)
        .with_context(|| format!("locking {}", state.warm().join(LOCK_FILE).display()))?;
    // Taken by the command line, whose git runs have the default time.
    let owner = Owner::of(uid, gid, crate::git::filters::DEFAULT_TIMEOUT);
    let user = AsUser::start(&owner)?;
    let path = repo.path.clone();
    let root = user
        .run(move || beneath::open_real_dir(&path))?
        .with_context(|| {
            format!(
                "the source checkout {} of {} cannot be reached by uid {uid} through no symbolic link",
                repo.path.display(),
                repo.name
            )
        })?;
    let root = std::sync::Arc::new(root);
    let mut skipped = Vec::new();
    let patterns = patterns(&user, &root, repo, &mut skipped)?;
    if patterns.is_empty() {
        return Err(crate::lifecycle::error::refused(format!(
            "repository {} names nothing for warm worktrees to inherit: put gitignore patterns (node_modules/, target/, .env) in {} or run `worktreefs repo set {} --include PATTERN…`",
            repo.name,
            repo.path.join(INCLUDE_FILE).display(),
            repo.name
        )));
    }
    let listed = ls_files(&owner, repo, &patterns, false)?;
    let mut unmatched = Vec::new();
    for p in &patterns {
        if !p.starts_with('!') && ls_files(&owner, repo, std::slice::from_ref(p), true)?.is_empty()
        {
            unmatched.push(p.clone());
        }
    }

    // What each path is, as the user sees it; the directories on the way.
    let mut dirs: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut found: Vec<(Vec<u8>, Found)> = Vec::with_capacity(listed.len());
    for rel in listed {
        if rel
            .split(|b| *b == b'/')
            .any(|c| crate::layout::is_reserved(std::ffi::OsStr::new(&lossy(c))))
        {
            skipped.push((lossy(&rel), "a name worktreefs reserves".into()));
            continue;
        }
        let r = root.clone();
        let rel2 = rel.clone();
        // Looked at only: 30,000 files are not held open at once.
        let what = user.run(move || look(r.as_fd(), &rel2, false))?;
        if let Found::Skip(why) = what {
            skipped.push((lossy(&rel), why));
            continue;
        }
        let mut at = rel.as_slice();
        while let Some(i) = at.iter().rposition(|b| *b == b'/') {
            at = &at[..i];
            if !dirs.insert(at.to_vec()) {
                break;
            }
        }
        found.push((rel, what));
    }
    // What the user's last snapshot of it read: a file where nothing moved since is not
    // copied again (only opened, as the user, to see it is still theirs to read), and
    // needs no room.
    let before = store
        .latest_warm(repo.id, uid)
        .ok()
        .flatten()
        .and_then(|w| fs::read(idents_path(state, &w.manifest)).ok())
        .map(|b| idents::decode(&b))
        .unwrap_or_default();
    let reusable: std::collections::HashMap<Vec<u8>, Oid> = found
        .iter()
        .filter_map(|(rel, f)| match f {
            Found::File(_, seen) => {
                unchanged_since(state, &before, rel, seen).map(|oid| (rel.clone(), oid))
            }
            _ => None,
        })
        .collect();
    let need: u64 = found
        .iter()
        .map(|(rel, f)| match f {
            Found::File(_, st) if !reusable.contains_key(rel) => st.st_size as u64,
            _ => 0,
        })
        .sum();
    let files = found
        .iter()
        .filter(|(_, f)| matches!(f, Found::File(..)))
        .count();
    let free = nix::sys::statvfs::statvfs(&state.blobs())
        .map(|s| s.blocks_available() * s.fragment_size())
        .with_context(|| format!("reading the free space of {}", state.blobs().display()))?;
    if need > free {
        return Err(crate::lifecycle::error::refused(format!(
            "the warm snapshot of {} needs {} ({files} files) and the state directory's disk ({}) has {} free: free some space, or narrow the patterns ({} in {}, `worktreefs repo set {} --include`)",
            repo.name,
            human_bytes(need),
            state.root.display(),
            human_bytes(free),
            INCLUDE_FILE,
            repo.path.display(),
            repo.name
        )));
    }

    let mut records: Vec<Record> = Vec::with_capacity(found.len() + dirs.len());
    for d in &dirs {
        let r = root.clone();
        let d2 = d.clone();
        if let Found::Dir(st) = user.run(move || look(r.as_fd(), &d2, false))? {
            records.push(record(d.clone(), Kind::Dir, &st, gid, None, Vec::new()));
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let manifest = format!("{}-{uid}-{nanos}", repo.id);
    // When this take began: a file whose times are as new as that may change again within
    // the same tick of the clock unseen (see `Ident::racy`).
    let took_from = (started_wall / 1_000_000_000, started_wall % 1_000_000_000);
    let mut known: Vec<(Vec<u8>, Ident, Oid)> = Vec::with_capacity(files);
    let mut journal = Journal::create(state, &manifest)?;
    let (mut links, mut bytes, mut copied, mut unchanged) = (0u64, 0u64, 0u64, 0u64);
    for (rel, what) in found {
        let stored = match what {
            Found::File(_, seen) => match reusable.get(&rel).copied().filter(|_| {
                let r = root.clone();
                let rel2 = rel.clone();
                matches!(
                    user.run(move || look(r.as_fd(), &rel2, true)),
                    Ok(Found::File(Some(_), now)) if Ident::of(&now) == Ident::of(&seen)
                )
            }) {
                Some(oid) => {
                    unchanged += 1;
                    Ok((oid, seen))
                }
                None => {
                    let mut copies = 0;
                    loop {
                        let r = root.clone();
                        let rel2 = rel.clone();
                        let (file, st) = match user.run(move || look(r.as_fd(), &rel2, true))? {
                            Found::File(Some(f), st) => (f, st),
                            Found::Skip(why) => break Err(why),
                            _ => break Err("no longer a regular file".into()),
                        };
                        if let Some(oid) = store_blob(state, &mut journal, &file, &st)? {
                            break Ok((oid, st));
                        }
                        copies += 1;
                        if copies >= MAX_COPIES {
                            break Err(format!(
                                "changed each of the {MAX_COPIES} times it was copied"
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(10 << copies));
                    }
                }
            },
            Found::Link(target, st) => {
                links += 1;
                let oid = Oid::hash_object(git2::ObjectType::Blob, &target).ok();
                records.push(record(rel, Kind::Link, &st, gid, oid, target));
                continue;
            }
            Found::Dir(_) | Found::Skip(_) => continue,
        };
        match stored {
            Ok((oid, st)) => {
                bytes += st.st_size as u64;
                copied += 1;
                known.push((rel.clone(), Ident::of(&st).seen_at(took_from), oid));
                records.push(record(rel, Kind::File, &st, gid, Some(oid), Vec::new()));
                if let Some(tell) = progress {
                    tell(Copied {
                        files: copied,
                        bytes,
                        of_files: files as u64,
                        of_bytes: need,
                    });
                }
            }
            Err(why) => skipped.push((lossy(&rel), why)),
        }
    }

    // Parents before children: sorted by path, each directory before what is in it.
    records.sort_by(|a, b| path_order(&a.path, &b.path));
    let mut holding: BTreeSet<Vec<u8>> = BTreeSet::new();
    // Every directory the manifest makes holds something: those recorded and those on
    // the way to a file (one that changed while it was looked at is made all the same).
    for d in &dirs {
        holding.insert(match d.iter().rposition(|b| *b == b'/') {
            Some(i) => d[..i].to_vec(),
            None => Vec::new(),
        });
    }
    for r in &records {
        holding.insert(match r.path.iter().rposition(|b| *b == b'/') {
            Some(i) => r.path[..i].to_vec(),
            None => Vec::new(),
        });
    }
    let mut dir_list = Vec::new();
    for d in &holding {
        dir_list.extend_from_slice(d);
        dir_list.push(0);
    }
    let write = |path: &Path, bytes: &[u8]| {
        crate::durable::write_file_synced(path, bytes)
            .with_context(|| format!("writing {}", path.display()))
    };
    let gone_with = |state: &StateDir| {
        let _ = fs::remove_file(dirs_path(state, &manifest));
        let _ = fs::remove_file(idents_path(state, &manifest));
    };
    write(&dirs_path(state, &manifest), &dir_list)?;
    if let Err(e) = write(&idents_path(state, &manifest), &idents::encode(&known)) {
        gone_with(state);
        return Err(e);
    }
    let mpath = state.warm().join(&manifest);
    if let Err(e) = write(&mpath, &crate::git::warm::encode(&records)) {
        gone_with(state);
        return Err(e);
    }
    let took = started.elapsed();
    let row = store
        .add_warm(&NewWarm {
            repo_id: repo.id,
            uid,
            manifest: &manifest,
            files: records.iter().filter(|r| r.kind != Kind::Dir).count() as u64,
            bytes,
            took_ms: took.as_millis() as u64,
            skipped: skipped.len() as u64,
        })
        .and_then(|id| store.warm(id).map(|r| r.expect("just added")))
        .map_err(|e| {
            let _ = fs::remove_file(&mpath);
            gone_with(state);
            crate::lifecycle::error::failed(format!("recording the warm snapshot: {e}"))
        })?;
    // The row holds the contents now (a journal left by a crash here is harmless: the
    // prune keeps what a manifest names).
    drop(journal.file);
    if let Err(e) = fs::remove_file(&journal.path) {
        tracing::warn!("removing {}: {e}", journal.path.display());
    }
    Ok(Taken {
        row,
        links,
        skipped,
        unmatched,
        patterns,
        took,
        unchanged,
    })
}

/// The content file `rel` had in the user's last snapshot, when nothing of it moved since
/// (`seen` is how it is now) and that content is still in the cache.
fn unchanged_since(
    state: &StateDir,
    before: &std::collections::HashMap<Vec<u8>, (Ident, Oid)>,
    rel: &[u8],
    seen: &Stat,
) -> Option<Oid> {
    let (was, oid) = before.get(rel)?;
    if *was != Ident::of(seen) || was.racy() {
        return None;
    }
    fs::symlink_metadata(blob_path(state, *oid))
        .is_ok_and(|m| m.is_file() && m.len() == was.size())
        .then_some(*oid)
}

pub(super) fn record(
    path: Vec<u8>,
    kind: Kind,
    st: &Stat,
    gid: u32,
    oid: Option<Oid>,
    target: Vec<u8>,
) -> Record {
    // In the view an entry belongs to the worktree's owner and group. Group bits granted
    // to another group (`alice:secrets 0640`) would grant them to the owner's group
    // instead: they are dropped, so the view is never more open than the source.
    let mut perm = st.st_mode & 0o7777;
    if st.st_gid != gid {
        perm &= !0o2070;
    }
    Record {
        path,
        kind,
        perm,
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        oid,
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prune once the snapshots' lock is free: a child another test's thread forks
    /// holds a take's descriptor of it until it execs (None meanwhile).
    fn prune_when_free(state: &StateDir, store: &mut Store) -> crate::lifecycle::warm::Pruned {
        for _ in 0..100 {
            if let Some(p) = prune(state, store).unwrap() {
                return p;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the snapshots' lock stayed held");
    }
    use crate::lifecycle::warm::blob::DURING_COPY;
    use crate::lifecycle::warm::cache::JOURNAL;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    /// A repository whose checkout holds an ignored `target/out`, and a state directory.
    fn setup(d: &Path) -> (StateDir, Store, RepoRow) {
        let repo = d.join("repo");
        fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        fs::write(repo.join(".gitignore"), "target/\n").unwrap();
        git(&repo, &["add", "."]);
        git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "i",
            ],
        );
        fs::create_dir_all(repo.join("target")).unwrap();
        fs::write(repo.join("target/out"), b"v0").unwrap();
        fs::write(repo.join(INCLUDE_FILE), "target/\n").unwrap();
        let state = StateDir::open(&d.join("state")).unwrap();
        let store = Store::open(&state.root).unwrap();
        let row = store.add_repo("repo", &repo, &repo.join(".git")).unwrap();
        (state, store, row)
    }

    /// The content the snapshot `taken` holds for `path`, read from the blob cache.
    fn held(state: &StateDir, taken: &Taken, path: &[u8]) -> Option<Vec<u8>> {
        let bytes = fs::read(state.warm().join(&taken.row.manifest)).unwrap();
        let records = crate::git::warm::decode(&bytes).unwrap();
        let r = records.iter().find(|r| r.path == path)?;
        Some(fs::read(blob_path(state, r.oid.unwrap())).unwrap())
    }

    /// Takes a snapshot with `during(i)` run between the `i`th copy (from 1) and the look
    /// after it; the snapshot, and how many copies were made.
    fn take_with(
        state: &StateDir,
        store: &mut Store,
        repo: &RepoRow,
        mut during: impl FnMut(u32) + 'static,
    ) -> (Taken, u32) {
        let n = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let n2 = n.clone();
        DURING_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                n2.set(n2.get() + 1);
                during(n2.get())
            }))
        });
        let taken = take(state, store, repo, 0, 0, None);
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        (taken.unwrap(), n.get())
    }

    /// A second take reads only what moved since the first: an untouched file is not
    /// copied again; one rewritten to the same size with its modification time put back
    /// is (its change time moved), and the new snapshot holds its new content; a
    /// content gone from the cache is read again too.
    #[test]
    fn a_take_reads_again_only_the_files_that_moved_since_the_last() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, repo) = setup(d.path());
        fs::write(repo.path.join("target/other"), b"same").unwrap();
        // Files as new as a take are read again by the next (a change within the same
        // tick would not show): these are older than that by then.
        std::thread::sleep(Duration::from_millis(2100));
        let (first, copies) = take_with(&state, &mut store, &repo, |_| {});
        assert_eq!((copies, first.unchanged), (2, 0));
        let (second, copies) = take_with(&state, &mut store, &repo, |_| {});
        assert_eq!((copies, second.unchanged), (0, 2));
        assert_eq!(held(&state, &second, b"target/out").unwrap(), b"v0");

        let out = repo.path.join("target/out");
        let before = fs::metadata(&out).unwrap();
        // The change time ticks on: a rewrite in the same tick would keep it.
        std::thread::sleep(Duration::from_millis(20));
        fs::write(&out, b"v1").unwrap();
        let times = [libc::timespec {
            tv_sec: std::os::unix::fs::MetadataExt::mtime(&before),
            tv_nsec: std::os::unix::fs::MetadataExt::mtime_nsec(&before),
        }; 2];
        let c = std::ffi::CString::new(out.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and two valid timespecs.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
            0
        );
        let (third, copies) = take_with(&state, &mut store, &repo, |_| {});
        assert_eq!((copies, third.unchanged), (1, 1));
        assert_eq!(held(&state, &third, b"target/out").unwrap(), b"v1");

        // Its content gone from the cache (a prune, a disk cleaned by hand): read again.
        // So is `out`: rewritten just before the last take, what that take recorded of it
        // is not trusted (a change in the same tick would not have shown).
        let records =
            crate::git::warm::decode(&fs::read(state.warm().join(&third.row.manifest)).unwrap())
                .unwrap();
        let other = records.iter().find(|r| r.path == b"target/other").unwrap();
        let blob = blob_path(&state, other.oid.unwrap());
        fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(&blob).unwrap();
        let (fourth, copies) = take_with(&state, &mut store, &repo, |_| {});
        assert_eq!((copies, fourth.unchanged), (2, 0));
        assert_eq!(held(&state, &fourth, b"target/other").unwrap(), b"same");
    }

    #[test]
    fn a_file_rewritten_while_it_is_copied_is_copied_again_and_held_whole() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, repo) = setup(d.path());
        let out = repo.path.join("target/out");
        let o = out.clone();
        // The first two copies each see the file rewritten (a longer content, so its
        // size changes too) before the look after them; the third sees it still.
        let (taken, n) = take_with(&state, &mut store, &repo, move |i| {
            if i <= 2 {
                fs::write(&o, format!("version {i} of the output").repeat(i as usize)).unwrap();
            }
        });
        assert_eq!(n, 3, "copied three times");
        assert!(taken.skipped.is_empty(), "{:?}", taken.skipped);
        let want = "version 2 of the output".repeat(2);
        assert_eq!(
            held(&state, &taken, b"target/out").unwrap(),
            want.as_bytes()
        );
        assert_eq!(fs::read(&out).unwrap(), want.as_bytes());
        // No partial copy is left in the cache's staging directory.
        assert_eq!(fs::read_dir(state.blobs_tmp()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_rewritten_during_every_copy_is_left_out_saying_why() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, repo) = setup(d.path());
        fs::write(repo.path.join("target/still"), b"still").unwrap();
        let out = repo.path.join("target/out");
        // Every copy sees `out` change (a copy of `still` too: `still` itself does not).
        let (taken, _) = take_with(&state, &mut store, &repo, move |i| {
            fs::write(&out, format!("v{i}-{}", "x".repeat(i as usize))).unwrap();
        });
        assert_eq!(
            taken.skipped,
            vec![(
                "target/out".to_string(),
                format!("changed each of the {MAX_COPIES} times it was copied")
            )]
        );
        assert_eq!(held(&state, &taken, b"target/out"), None);
        assert_eq!(held(&state, &taken, b"target/still").unwrap(), b"still");
        assert_eq!(taken.row.skipped, 1);
        assert_eq!(fs::read_dir(state.blobs_tmp()).unwrap().count(), 0);
    }

    /// The contents in the blob cache.
    fn cached(state: &StateDir) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        let mut dirs = vec![state.blobs()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    if e.path() != state.blobs_tmp() {
                        dirs.push(e.path());
                    }
                } else {
                    out.insert(e.path());
                }
            }
        }
        out
    }

    #[test]
    fn a_take_that_fails_halfway_leaves_no_content_in_the_cache() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, repo) = setup(d.path());
        for n in ["a", "b", "c"] {
            fs::write(repo.path.join("target").join(n), format!("only {n}")).unwrap();
        }
        let before = cached(&state);
        // The second copy's staging file goes (as a full disk would fail it): the first
        // content is in the cache by then.
        let tmp = state.blobs_tmp();
        let placed = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let (p2, st2) = (placed.clone(), state.root.clone());
        DURING_COPY.with(|h| {
            let mut i = 0;
            *h.borrow_mut() = Some(Box::new(move || {
                i += 1;
                if i == 2 {
                    p2.set(cached(&StateDir::open(&st2).unwrap()).len());
                    fs::remove_dir_all(&tmp).unwrap();
                }
            }))
        });
        let r = take(&state, &mut store, &repo, 0, 0, None);
        DURING_COPY.with(|h| *h.borrow_mut() = None);
        assert!(r.is_err(), "the take failed");
        assert_eq!(
            placed.get(),
            before.len() + 1,
            "one content was in the cache"
        );
        assert_eq!(cached(&state), before, "and it is gone");
        assert!(journals(&state).is_empty());
        assert!(store.warm_all().unwrap().is_empty());
    }

    #[test]
    fn a_journal_a_dead_take_left_is_pruned_but_not_what_a_snapshot_holds() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, repo) = setup(d.path());
        // Told after each file it copies, the last time with all of them.
        let told = std::cell::RefCell::new(Vec::new());
        let tell = |c: Copied| told.borrow_mut().push(c);
        let taken = take(&state, &mut store, &repo, 0, 0, Some(&tell)).unwrap();
        let told = told.into_inner();
        assert_eq!(told.len() as u64, taken.row.files, "{told:?}");
        let last = told.last().unwrap();
        assert_eq!((last.files, last.bytes), (taken.row.files, taken.row.bytes));
        assert_eq!((last.of_files, last.of_bytes), (last.files, last.bytes));
        assert!(
            journals(&state).is_empty(),
            "a take that ends removes its journal"
        );
        let kept = cached(&state);
        assert_eq!(kept.len(), 1, "target/out");
        // A take that died after placing one content of its own and naming one the
        // snapshot holds (and a line cut short).
        let own = Oid::hash_object(git2::ObjectType::Blob, b"died with it").unwrap();
        let own_path = blob_path(&state, own);
        fs::create_dir_all(own_path.parent().unwrap()).unwrap();
        fs::write(&own_path, b"died with it").unwrap();
        let held_oid =
            crate::git::warm::decode(&fs::read(state.warm().join(&taken.row.manifest)).unwrap())
                .unwrap()
                .into_iter()
                .find_map(|r| r.oid)
                .unwrap();
        fs::write(
            state.warm().join(format!("1-0-1{JOURNAL}")),
            format!("{own}\n{held_oid}\n{}", &own.to_string()[..12]),
        )
        .unwrap();
        assert_eq!(journals(&state).len(), 1);
        let pruned = prune_when_free(&state, &mut store);
        assert_eq!((pruned.journals, pruned.blobs), (1, 1));
        assert_eq!(cached(&state), kept);
        assert!(journals(&state).is_empty());
        assert_eq!(
            held(&state, &taken, b"target/out").unwrap(),
            b"v0",
            "the snapshot's content stays"
        );
    }

    #[test]
    fn a_prune_that_cannot_tell_who_holds_a_content_keeps_the_journal_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let (state, mut store, _repo) = setup(d.path());
        let gone = d.path().join("gone");
        store.add_repo("gone", &gone, &gone.join(".git")).unwrap();
        let own = Oid::hash_object(git2::ObjectType::Blob, b"died with it").unwrap();
        let own_path = blob_path(&state, own);
        fs::create_dir_all(own_path.parent().unwrap()).unwrap();
        fs::write(&own_path, b"died with it").unwrap();
        fs::write(
            state.warm().join(format!("1-0-1{JOURNAL}")),
            format!("{own}\n"),
        )
        .unwrap();
        let pruned = prune_when_free(&state, &mut store);
        assert_eq!((pruned.journals, pruned.blobs), (0, 0));
        assert!(own_path.exists());
        assert_eq!(journals(&state).len(), 1, "for the next prune");
    }
}
