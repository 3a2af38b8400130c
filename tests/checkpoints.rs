//! The checkpoint store on its own, over a plain directory standing for an upper layer:
//! random operations, each keeping what it changes first as the view does, with
//! checkpoints taken and dropped and rewinds, against the directory as it was at each
//! checkpoint (every name, type, mode, owner, data, link target, `user.` attribute and
//! group of hard links equal after each rewind).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use worktreefs::beneath;
use worktreefs::checkpoint::Checkpoints;

const PATHS: [&str; 10] = [
    "a", "b", "c", "a/x", "a/y", "b/x", "c/z", "a/x/p", "b/x/p", "a/y/q",
];

#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8),
    Append(usize, u8),
    Truncate(usize),
    Mkdir(usize),
    Unlink(usize),
    Rmdir(usize),
    RemoveTree(usize),
    Rename(usize, usize),
    Link(usize, usize),
    Symlink(usize, u8),
    Chmod(usize, u32),
    Chown(usize, u32),
    Xattr(usize, u8),
    /// Opens a file for writing and keeps it open (past the hooks, as passthrough).
    Hold(usize),
    /// Writes through the file held open (no hook: the kernel writes past the daemon).
    WriteHeld(u8),
    Checkpoint,
    /// Rewind to the checkpoint with this index among those kept (modulo).
    Rewind(usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PATHS.len();
    prop_oneof![
        4 => (p.clone(), any::<u8>()).prop_map(|(a, b)| Op::Write(a, b)),
        2 => (p.clone(), any::<u8>()).prop_map(|(a, b)| Op::Append(a, b)),
        1 => p.clone().prop_map(Op::Truncate),
        3 => p.clone().prop_map(Op::Mkdir),
        2 => p.clone().prop_map(Op::Unlink),
        1 => p.clone().prop_map(Op::Rmdir),
        1 => p.clone().prop_map(Op::RemoveTree),
        3 => (p.clone(), p.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (p.clone(), p.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (p.clone(), any::<u8>()).prop_map(|(a, b)| Op::Symlink(a, b)),
        1 => (p.clone(), prop_oneof![Just(0o600u32), Just(0o755), Just(0o700), Just(0o640)])
            .prop_map(|(a, m)| Op::Chmod(a, m)),
        1 => (p.clone(), 1000u32..1003).prop_map(|(a, u)| Op::Chown(a, u)),
        1 => (p.clone(), any::<u8>()).prop_map(|(a, v)| Op::Xattr(a, v)),
        2 => p.clone().prop_map(Op::Hold),
        3 => any::<u8>().prop_map(Op::WriteHeld),
        3 => Just(Op::Checkpoint),
        2 => (0usize..8).prop_map(Op::Rewind),
        1 => (0usize..8).prop_map(Op::Drop),
    ]
}

/// What a plain directory holds, compared whole: hard links as groups numbered in the
/// order of their first path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir {
        mode: u32,
        uid: u32,
        mtime: (i64, i64),
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    File {
        mode: u32,
        uid: u32,
        mtime: (i64, i64),
        data: Vec<u8>,
        group: usize,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Link {
        target: Vec<u8>,
        uid: u32,
    },
}

fn xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<(Vec<u8>, Vec<u8>)> = xattr_list(p)
        .into_iter()
        .filter(|n| n.starts_with(b"user."))
        .map(|n| {
            let val = xattr_get(p, &n);
            (n, val)
        })
        .collect();
    v.sort();
    v
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn xattr_list(p: &Path) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: a path and a buffer of that length.
    let n = unsafe { libc::llistxattr(cpath(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    buf.truncate(n as usize);
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| s.to_vec())
        .collect()
}

fn xattr_get(p: &Path, n: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let name = std::ffi::CString::new(n).unwrap();
    // SAFETY: a path, a name and a buffer of that length.
    let got = unsafe {
        libc::lgetxattr(
            cpath(p).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    buf.truncate(got.max(0) as usize);
    buf
}

/// A regular file (not through a symlink).
fn is_file(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

fn capture(root: &Path) -> BTreeMap<String, Node> {
    fn walk(
        root: &Path,
        rel: &str,
        out: &mut BTreeMap<String, Node>,
        groups: &mut BTreeMap<u64, usize>,
    ) {
        let mut names: Vec<_> = fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let r = if rel.is_empty() {
                n.to_string_lossy().into_owned()
            } else {
                format!("{rel}/{}", n.to_string_lossy())
            };
            let p = root.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.insert(
                    r.clone(),
                    Node::Dir {
                        mode: m.mode(),
                        uid: m.uid(),
                        mtime: (m.mtime(), m.mtime_nsec()),
                        xattrs: xattrs(&p),
                    },
                );
                walk(root, &r, out, groups);
            } else if m.file_type().is_symlink() {
                out.insert(
                    r,
                    Node::Link {
                        target: fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                        uid: m.uid(),
                    },
                );
            } else {
                let next = groups.len();
                let group = *groups.entry(m.ino()).or_insert(next);
                out.insert(
                    r,
                    Node::File {
                        mode: m.mode(),
                        uid: m.uid(),
                        mtime: (m.mtime(), m.mtime_nsec()),
                        data: fs::read(&p).unwrap(),
                        group,
                        xattrs: xattrs(&p),
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    let m = fs::metadata(root).unwrap();
    out.insert(
        String::new(),
        Node::Dir {
            mode: m.mode(),
            uid: m.uid(),
            mtime: (m.mtime(), m.mtime_nsec()),
            xattrs: xattrs(root),
        },
    );
    walk(root, "", &mut out, &mut BTreeMap::new());
    out
}

struct Run {
    _tmp: tempfile::TempDir,
    upper: PathBuf,
    fd: OwnedFd,
    cps: Checkpoints,
    /// Each checkpoint kept: its id and the directory then.
    kept: Vec<(u64, BTreeMap<String, Node>)>,
    held: Option<(File, PathBuf)>,
}

impl Run {
    fn new() -> Run {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        fs::create_dir(&upper).unwrap();
        fs::write(upper.join("a"), b"base a").unwrap();
        let fd = beneath::open_root(&upper).unwrap();
        let cps = Checkpoints::open(tmp.path().join("checkpoints")).unwrap();
        Run {
            _tmp: tmp,
            upper,
            fd,
            cps,
            kept: Vec::new(),
            held: None,
        }
    }

    fn p(&self, i: usize) -> PathBuf {
        self.upper.join(PATHS[i])
    }

    fn fd_of(&self, i: usize) -> Option<OwnedFd> {
        beneath::open(self.fd.as_fd(), PATHS[i].as_bytes(), libc::O_PATH, 0).ok()
    }

    fn held_fds(&self) -> Vec<(Option<Vec<u8>>, OwnedFd)> {
        self.held
            .iter()
            .map(|(f, _)| {
                // Its path now, as the view's node table knows it (none once unlinked).
                let ino = f.metadata().unwrap().ino();
                let rel = PATHS
                    .iter()
                    .find(|p| {
                        fs::symlink_metadata(self.upper.join(p)).is_ok_and(|m| m.ino() == ino)
                    })
                    .map(|p| p.as_bytes().to_vec());
                (rel, OwnedFd::from(f.try_clone().unwrap()))
            })
            .collect()
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        let up = self.fd.as_fd();
        let rel = |i: usize| PATHS[i].as_bytes();
        let keep_content = |i: usize| {
            if let Some(fd) = self.fd_of(i) {
                self.cps.keep_content(up, Some(rel(i)), fd.as_fd()).unwrap();
            }
        };
        match *op {
            Op::Write(i, b) => {
                if fs::symlink_metadata(self.p(i)).is_ok_and(|m| !m.is_file()) {
                    return Ok(());
                }
                self.cps.keep_name(up, rel(i)).unwrap();
                keep_content(i);
                let _ = fs::write(self.p(i), [b; 3]);
            }
            Op::Append(i, b) => {
                if is_file(&self.p(i)) {
                    keep_content(i);
                    let mut f = fs::OpenOptions::new().append(true).open(self.p(i)).unwrap();
                    f.write_all(&[b]).unwrap();
                }
            }
            Op::Truncate(i) => {
                if is_file(&self.p(i)) {
                    keep_content(i);
                    File::options()
                        .write(true)
                        .open(self.p(i))
                        .unwrap()
                        .set_len(1)
                        .unwrap();
                }
            }
            Op::Mkdir(i) => {
                self.cps.keep_name(up, rel(i)).unwrap();
                let _ = fs::create_dir(self.p(i));
            }
            Op::Unlink(i) => {
                if fs::symlink_metadata(self.p(i)).is_ok_and(|m| !m.is_dir()) {
                    self.cps.keep_name(up, rel(i)).unwrap();
                    fs::remove_file(self.p(i)).unwrap();
                }
            }
            Op::Rmdir(i) => {
                self.cps.keep_tree(up, rel(i)).unwrap();
                let _ = fs::remove_dir(self.p(i));
            }
            Op::RemoveTree(i) => {
                if self.p(i).is_dir() {
                    self.cps.keep_tree(up, rel(i)).unwrap();
                    fs::remove_dir_all(self.p(i)).unwrap();
                }
            }
            Op::Rename(i, j) => {
                let (from, to) = (self.p(i), self.p(j));
                if i == j || to.starts_with(&from) || fs::symlink_metadata(&from).is_err() {
                    return Ok(());
                }
                self.cps.keep_moved(up, rel(i), rel(j)).unwrap();
                let _ = fs::rename(&from, &to);
            }
            Op::Link(i, j) => {
                if is_file(&self.p(i)) {
                    self.cps.keep_name(up, rel(j)).unwrap();
                    let _ = fs::hard_link(self.p(i), self.p(j));
                }
            }
            Op::Symlink(i, b) => {
                self.cps.keep_name(up, rel(i)).unwrap();
                let _ = std::os::unix::fs::symlink(format!("t{b}"), self.p(i));
            }
            Op::Chmod(i, m) => {
                if let Some(fd) = self.fd_of(i) {
                    if !fs::symlink_metadata(self.p(i)).unwrap().is_symlink() {
                        self.cps.keep_attrs(up, Some(rel(i)), fd.as_fd()).unwrap();
                        fs::set_permissions(self.p(i), fs::Permissions::from_mode(m)).unwrap();
                    }
                }
            }
            Op::Chown(i, u) => {
                if let Some(fd) = self.fd_of(i) {
                    self.cps.keep_attrs(up, Some(rel(i)), fd.as_fd()).unwrap();
                    std::os::unix::fs::lchown(self.p(i), Some(u), Some(u)).unwrap();
                }
            }
            Op::Xattr(i, v) => {
                let p = self.p(i);
                let Ok(m) = fs::symlink_metadata(&p) else {
                    return Ok(());
                };
                if m.is_symlink() {
                    return Ok(());
                }
                let fd = self.fd_of(i).unwrap();
                self.cps.keep_attrs(up, Some(rel(i)), fd.as_fd()).unwrap();
                let name = std::ffi::CString::new(format!("user.k{}", v % 3)).unwrap();
                // SAFETY: a path, a name and a value.
                unsafe {
                    if v % 4 == 0 {
                        libc::lremovexattr(cpath(&p).as_ptr(), name.as_ptr());
                    } else {
                        libc::lsetxattr(
                            cpath(&p).as_ptr(),
                            name.as_ptr(),
                            [v].as_ptr().cast(),
                            1,
                            0,
                        );
                    }
                }
            }
            Op::Hold(i) => {
                if self.held.is_none() && is_file(&self.p(i)) {
                    keep_content(i);
                    let f = fs::OpenOptions::new().append(true).open(self.p(i)).unwrap();
                    self.held = Some((f, self.p(i)));
                }
            }
            Op::WriteHeld(b) => {
                if let Some((f, _)) = &mut self.held {
                    f.write_all(&[b, b]).unwrap();
                }
            }
            Op::Checkpoint => {
                let held = self.held_fds();
                let open: Vec<_> = held.iter().map(|(p, f)| (p.clone(), f.as_fd())).collect();
                let info = self.cps.take(None, up, &open).map_err(|e| e.to_string())?;
                self.kept.push((info.id, capture(&self.upper)));
            }
            Op::Rewind(k) => {
                if self.kept.is_empty() {
                    return Ok(());
                }
                // A rewind is refused while others write: the file held is closed first.
                self.held = None;
                let (id, want) = self.kept[k % self.kept.len()].clone();
                let before = capture(&self.upper);
                let r = self
                    .cps
                    .rewind(up, id, Some("before".into()), &[])
                    .map_err(|e| format!("rewind to {id}: {e}"))?;
                self.kept.push((r.before.id, before));
                let got = capture(&self.upper);
                if got != want {
                    return Err(diff(&want, &got, id));
                }
            }
            Op::Drop(k) => {
                if self.kept.is_empty() {
                    return Ok(());
                }
                let (id, _) = self.kept.remove(k % self.kept.len());
                self.cps.drop_checkpoint(id).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn check_list(&self) -> Result<(), String> {
        let ids: Vec<u64> = self.cps.list().unwrap().iter().map(|i| i.id).collect();
        let mut want: Vec<u64> = self.kept.iter().map(|(i, _)| *i).collect();
        want.sort();
        if ids != want {
            return Err(format!("checkpoints listed {ids:?}, kept {want:?}"));
        }
        Ok(())
    }
}

fn diff(want: &BTreeMap<String, Node>, got: &BTreeMap<String, Node>, id: u64) -> String {
    let mut out = format!("after a rewind to checkpoint {id}:\n");
    for (k, v) in want {
        match got.get(k) {
            None => out += &format!("  {k:?} missing (was {v:?})\n"),
            Some(g) if g != v => out += &format!("  {k:?} is {g:?}, was {v:?}\n"),
            _ => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            out += &format!("  {k:?} should not be there ({v:?})\n");
        }
    }
    out
}

fn run_ops(ops: &[Op]) -> Result<(), String> {
    let mut run = Run::new();
    for (n, op) in ops.iter().enumerate() {
        run.step(op).map_err(|e| format!("step {n} {op:?}: {e}"))?;
        run.check_list()
            .map_err(|e| format!("step {n} {op:?}: {e}"))?;
    }
    // Every checkpoint still kept rewinds exactly, newest first.
    run.held = None;
    let kept = run.kept.clone();
    for (id, want) in kept.iter().rev() {
        let r = run
            .cps
            .rewind(run.fd.as_fd(), *id, None, &[])
            .map_err(|e| format!("final rewind to {id}: {e}"))?;
        let _ = r;
        let got = capture(&run.upper);
        if &got != want {
            return Err(format!("final: {}", diff(want, &got, *id)));
        }
    }
    Ok(())
}

#[test]
fn random_changes_rewind_to_exactly_each_checkpoint() {
    let mut config = Config {
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 256;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x6368_6b70);
    }
    let mut runner = TestRunner::new(config);
    let result = runner.run(&proptest::collection::vec(op(), 1..=60), |ops| {
        run_ops(&ops).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => {
            let listed: Vec<String> = ops.iter().map(|o| format!("  {o:?},")).collect();
            panic!(
                "a rewind disagrees with the directory at its checkpoint\nminimal sequence ({} steps):\n{}\n{why}",
                ops.len(),
                listed.join("\n")
            )
        }
        Err(e) => panic!("{e}"),
    }
}

/// A directory `depth` levels deep below `root/top` (made by descriptor, as no path that
/// long could name it).
fn deep_tree(root: &Path, top: &str, depth: usize) {
    fs::create_dir(root.join(top)).unwrap();
    let mut cur = beneath::open_root(&root.join(top)).unwrap();
    for _ in 0..depth {
        beneath::mkdir_at(cur.as_fd(), std::ffi::OsStr::new("d"), 0o755).unwrap();
        cur = beneath::dir(cur.as_fd(), b"d").unwrap();
    }
    beneath::replace_file_at(cur.as_fd(), std::ffi::OsStr::new("leaf"), b"leaf", 0o644).unwrap();
}

/// How deep the chain of `d` below `root/top` goes, and whether its leaf is there.
fn depth_of(root: &Path, top: &str) -> (usize, bool) {
    let mut cur = beneath::open_root(&root.join(top)).unwrap();
    let mut n = 0;
    while let Ok(d) = beneath::dir(cur.as_fd(), b"d") {
        cur = d;
        n += 1;
    }
    (
        n,
        beneath::stat_at(cur.as_fd(), std::ffi::OsStr::new("leaf")).is_ok(),
    )
}

/// A user can make a tree deeper than any stack and move it: keeping it, and a rewind
/// that removes it and puts it back, walk it with stacks of their own (on a thread of a
/// small stack) and hold one descriptor at a time (more levels than descriptors allowed).
#[test]
fn a_tree_deeper_than_a_stack_is_kept_moved_and_rewound() {
    let run = Run::new();
    deep_tree(&run.upper, "x", 3000);
    let run = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let up = run.fd.as_fd();
            let one = run.cps.take(None, up, &[]).unwrap();
            run.cps.keep_moved(up, b"x", b"y").unwrap();
            fs::rename(run.upper.join("x"), run.upper.join("y")).unwrap();
            run.cps.rewind(up, one.id, None, &[]).unwrap();
            run
        })
        .unwrap()
        .join()
        .expect("the walks fit a small stack");
    assert_eq!(depth_of(&run.upper, "x"), (3000, true));
    assert!(!run.upper.join("y").exists());
    // The tree goes without std's recursive removal (the test's own clean-up).
    beneath::remove_tree(
        beneath::open_root(&run.upper).unwrap().as_fd(),
        std::ffi::OsStr::new("x"),
    )
    .unwrap();
    let kept = run.cps.path().to_path_buf();
    for e in fs::read_dir(&kept).unwrap().flatten() {
        if e.path().is_dir() {
            beneath::remove_tree(beneath::open_root(&kept).unwrap().as_fd(), &e.file_name())
                .unwrap();
        }
    }
}

/// A rewind cut short (begun, the process gone before it ran) is finished by the next
/// instance over the same directory, leftovers of an earlier run of its own cleaned up.
#[test]
fn a_rewind_begun_and_cut_short_is_finished_after_a_restart() {
    let run = Run::new();
    let up = run.fd.as_fd();
    fs::write(run.upper.join("b"), b"one").unwrap();
    let want = capture(&run.upper);
    let one = run.cps.take(None, up, &[]).unwrap();
    run.cps.keep_name(up, b"b").unwrap();
    fs::remove_file(run.upper.join("b")).unwrap();
    run.cps.keep_name(up, b"c").unwrap();
    fs::write(run.upper.join("c"), b"new").unwrap();
    let before = run.cps.begin_rewind(up, one.id, None, &[]).unwrap();
    // A copy a run cut short left in its checkpoint's directory.
    let leftover = run.cps.dir(before.id).join("fresh-1");
    fs::write(&leftover, b"half").unwrap();
    let path = run.cps.path().to_path_buf();
    drop(run.cps);
    let again = Checkpoints::open(path).unwrap();
    assert_eq!(again.pending_rewind(), Some((one.id, before.id)));
    again.continue_rewind(up).unwrap().expect("under way");
    again.end_rewind().unwrap();
    assert_eq!(again.pending_rewind(), None);
    assert_eq!(capture(&run.upper), want);
    assert!(!leftover.exists());
}

/// A listing read while a checkpoint is dropped (its directory removed file by file, its
/// records handed to the one before first) leaves that one out and lists the others.
#[test]
fn a_listing_read_while_a_checkpoint_goes_leaves_it_out() {
    let run = Run::new();
    let up = run.fd.as_fd();
    fs::write(run.upper.join("b"), b"one").unwrap();
    let one = run.cps.take(None, up, &[]).unwrap();
    run.cps.keep_name(up, b"b").unwrap();
    fs::remove_file(run.upper.join("b")).unwrap();
    let two = run.cps.take(None, up, &[]).unwrap();
    run.cps.keep_name(up, b"c").unwrap();
    fs::write(run.upper.join("c"), b"new").unwrap();
    let three = run.cps.take(None, up, &[]).unwrap();
    // Half removed: its info still there, its records gone.
    fs::remove_file(run.cps.dir(two.id).join("records")).unwrap();
    let listed: Vec<(u64, usize)> = Checkpoints::read(run.cps.path())
        .unwrap()
        .into_iter()
        .map(|(i, changed)| (i.id, changed))
        .collect();
    assert_eq!(listed, vec![(one.id, 1), (three.id, 0)]);
}

fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// git's state of a worktree lives in its admin entry, which its user writes: a link
/// planted there is replaced, never written through; a file kept there that is not a
/// regular file is not read; and the branches a rewind moves come from the daemon's own
/// directory, not from anything the entry holds.
#[test]
fn git_state_is_kept_and_put_back_through_no_link_its_user_planted() {
    use worktreefs::git::checkpoint::{restore, save, Place};
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    fs::write(repo.join("f"), "one\n").unwrap();
    git(&repo, &["add", "f"]);
    git(&repo, &["commit", "-qm", "one"]);
    git(&repo, &["worktree", "add", "-q", "-b", "feature", "../wt"]);
    let wt = tmp.path().join("wt");
    let gitdir = repo.join(".git").canonicalize().unwrap();
    let admin = gitdir.join("worktrees/wt");
    let daemon = tmp.path().join("daemon-1");
    fs::create_dir(&daemon).unwrap();
    // The entry names the worktree as a mount would (`<mount>/<repo>/<name>/.git`).
    fs::write(admin.join("gitdir"), "/mnt/repo/wt/.git\n").unwrap();
    let place = Place {
        gitdir: &gitdir,
        admin_name: "wt",
        worktree: "repo/wt".into(),
        uid: 0,
    };
    fs::write(admin.join("MERGE_MSG"), "kept\n").unwrap();
    save(&place, &daemon, "7", 1, &[]).unwrap();
    assert!(place.is_saved(1));
    let head_then = fs::read_to_string(admin.join("HEAD")).unwrap();
    git(&wt, &["commit", "-q", "--allow-empty", "-m", "two"]);

    // What the entry's user can plant: links to a file of root's in place of the files
    // a rewind writes, a FIFO in place of one it reads.
    let victim = tmp.path().join("victim");
    fs::write(&victim, "root's\n").unwrap();
    let _ = fs::remove_file(admin.join("MERGE_MSG"));
    std::os::unix::fs::symlink(&victim, admin.join("MERGE_MSG")).unwrap();
    fs::create_dir_all(admin.join("logs")).unwrap();
    let _ = fs::remove_file(admin.join("logs/HEAD"));
    std::os::unix::fs::symlink(&victim, admin.join("logs/HEAD")).unwrap();
    restore(&place, &daemon, 1).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "root's\n");
    assert!(!fs::symlink_metadata(admin.join("MERGE_MSG"))
        .unwrap()
        .is_symlink());
    assert_eq!(
        fs::read_to_string(admin.join("MERGE_MSG")).unwrap(),
        "kept\n"
    );
    assert_eq!(fs::read_to_string(admin.join("HEAD")).unwrap(), head_then);
    // The branch is back at its commit then.
    let out = std::process::Command::new("git")
        .args(["log", "--format=%s", "-1", "feature"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "one");

    // A FIFO as HEAD is not opened: the save says what it met, at once.
    fs::remove_file(admin.join("HEAD")).unwrap();
    nix::unistd::mkfifo(
        &admin.join("HEAD"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let _ = save(&place, &daemon, "7", 2, &[]);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
