//! The view called directly, with no mount: the core's operations, and a reference-model
//! test where random operation sequences run against both the view and a plain directory
//! and must agree.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use common::*;
use worktreefs::fs::{Caller, FType, View, ROOT_INO};
use worktreefs::state::StateDir;
use worktreefs::store::Store;

const ME: Caller = Caller { uid: 0, gid: 0 };

struct Core {
    _env: Env,
    view: View,
    root: u64,
}

fn core() -> Core {
    let env = Env::new();
    let state = StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&state.root).unwrap();
    create_at_head(&state, &mut store, "w");
    let view = View::new(state, env.mountpoint()).unwrap();
    let repo = view.lookup(ROOT_INO, OsStr::new("repo")).unwrap().attr.ino;
    let root = view.lookup(repo, OsStr::new("w")).unwrap().attr.ino;
    Core {
        _env: env,
        view,
        root,
    }
}

impl Core {
    /// Resolves a relative path to (parent inode, inode) by lookups.
    fn resolve(&self, path: &str) -> Result<(u64, u64), i32> {
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

    fn dir_of(&self, path: &str) -> Result<(u64, String), i32> {
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

    fn tree(&self) -> BTreeMap<String, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        self.walk(self.root, "", &mut out);
        out
    }

    fn walk(&self, ino: u64, prefix: &str, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        let fh = self.view.opendir(ino).unwrap().0;
        let entries = self.view.readdir(fh, 0).unwrap();
        self.view.release(fh);
        for (_, e) in entries {
            let name = e.name.to_string_lossy().into_owned();
            if name == "." || name == ".." || (prefix.is_empty() && name == ".git") {
                continue;
            }
            let path = format!("{prefix}{name}");
            let child = self.view.lookup(ino, &e.name).unwrap().attr.ino;
            match e.kind {
                FType::Dir => {
                    out.insert(format!("{path}/"), None);
                    self.walk(child, &format!("{path}/"), out);
                }
                FType::Symlink => {
                    out.insert(path, Some(self.view.readlink(child).unwrap()));
                }
                _ => {
                    out.insert(path.clone(), Some(self.read(&path).unwrap()));
                }
            }
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

/// Applies one operation to a plain directory; returns the errno (0 on success).
fn apply_plain(root: &Path, op: &Op) -> i32 {
    let p = |s: &str| root.join(s);
    let r: std::io::Result<()> = match op {
        Op::Write(path, data) => fs::write(p(path), data),
        Op::Unlink(path) => fs::remove_file(p(path)),
        Op::Mkdir(path) => fs::create_dir(p(path)),
        Op::Rmdir(path) => fs::remove_dir(p(path)),
        Op::Rename(a, b) => fs::rename(p(a), p(b)),
    };
    r.err().map(|e| e.raw_os_error().unwrap_or(-1)).unwrap_or(0)
}

fn apply_view(c: &Core, op: &Op) -> i32 {
    let r: Result<(), i32> = match op {
        Op::Write(path, data) => c.write(path, data),
        Op::Unlink(path) => c
            .dir_of(path)
            .and_then(|(d, n)| c.view.unlink(d, OsStr::new(&n)).map_err(|e| e.errno())),
        Op::Mkdir(path) => c.dir_of(path).and_then(|(d, n)| {
            c.view
                .mkdir(d, OsStr::new(&n), 0o755, 0, ME)
                .map(|_| ())
                .map_err(|e| e.errno())
        }),
        Op::Rmdir(path) => c
            .dir_of(path)
            .and_then(|(d, n)| c.view.rmdir(d, OsStr::new(&n)).map_err(|e| e.errno())),
        Op::Rename(a, b) => c.dir_of(a).and_then(|(d1, n1)| {
            let (d2, n2) = c.dir_of(b)?;
            // The kernel checks this before asking the filesystem.
            if b.starts_with(&format!("{a}/")) {
                return Err(libc::EINVAL);
            }
            c.view
                .rename(d1, OsStr::new(&n1), d2, OsStr::new(&n2), 0)
                .map_err(|e| e.errno())
        }),
    };
    r.err().unwrap_or(0)
}

#[derive(Debug)]
enum Op {
    Write(String, Vec<u8>),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
    Rename(String, String),
}

#[test]
fn random_operations_agree_with_a_plain_directory() {
    let paths = MODEL_PATHS;
    for seed in 1..=12u64 {
        let c = core();
        let plain = tempfile::tempdir().unwrap();
        // The plain directory starts as a checkout of the same commit.
        run_ok(
            "git",
            &[
                "--work-tree",
                plain.path().to_str().unwrap(),
                "checkout",
                "HEAD",
                "--",
                ".",
            ],
            &c._env.repo.path(),
        );
        fs::create_dir_all(plain.path().join("vendor/sub")).unwrap();
        let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut log = Vec::new();
        for step in 0..60 {
            let op = match rng.next() % 5 {
                0 => Op::Write(
                    rng.pick(&paths).into(),
                    format!("{seed}-{step}").into_bytes(),
                ),
                1 => Op::Unlink(rng.pick(&paths).into()),
                2 => Op::Mkdir(rng.pick(&paths).into()),
                3 => Op::Rmdir(rng.pick(&paths).into()),
                _ => Op::Rename(rng.pick(&paths).into(), rng.pick(&paths).into()),
            };
            let want = apply_plain(plain.path(), &op);
            let got = apply_view(&c, &op);
            log.push(format!("{op:?} -> plain {want}, view {got}"));
            assert_eq!(
                got == 0,
                want == 0,
                "seed {seed}, step {step}: {op:?}\n{}",
                log.join("\n")
            );
            assert_eq!(
                c.tree(),
                snapshot(plain.path()),
                "seed {seed}, step {step}\n{}",
                log.join("\n")
            );
        }
    }
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
    worktreefs::lifecycle::create::create_worktree(
        &state,
        &mut store,
        &worktreefs::lifecycle::create::CreateRequest {
            repo: "other",
            name: "c",
            base: None,
            branch: None,
            uid: 0,
            gid: 0,
            submodules: false,
            warm: None,
            progress: None,
        },
    )
    .unwrap();
    let view = View::new(state, env.mountpoint()).unwrap();
    let look = |dir: u64, name: &str| view.lookup(dir, OsStr::new(name)).map(|e| e.attr.ino);
    let repo = look(ROOT_INO, "repo").unwrap();
    let other_repo = look(ROOT_INO, "other").unwrap();
    let (a, b) = (look(repo, "a").unwrap(), look(repo, "b").unwrap());
    let c = look(other_repo, "c").unwrap();
    let control = look(ROOT_INO, ".control").unwrap();
    let src = look(a, "src").unwrap();
    let readme = look(a, "README.md").unwrap();
    let rename = |from: u64, name: &str, to: u64, newname: &str| {
        view.rename(from, OsStr::new(name), to, OsStr::new(newname), 0)
            .map_err(|e| e.errno())
    };
    let link = |ino: u64, to: u64, newname: &str| {
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
