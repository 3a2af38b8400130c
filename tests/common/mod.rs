//! What both `tests/view.rs` and the mounted harness need: a real git repository made
//! with the real `git` and registered in a state directory, worktrees created without a
//! mount, commands run with a time limit, and a tree's content by path. Both binaries use
//! every item here (the harness re-exports it from `tests/mounted/common.rs`, beside the
//! mount), so neither needs a dead-code allowance.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_worktreefs");

/// Every path below `root` (directories with a trailing `/`) with its content (a
/// symlink's target), through ordinary std::fs calls; `.git` at the top is left out.
pub fn snapshot(root: &Path) -> std::collections::BTreeMap<String, Option<Vec<u8>>> {
    fn walk(
        dir: &Path,
        prefix: &str,
        out: &mut std::collections::BTreeMap<String, Option<Vec<u8>>>,
    ) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if prefix.is_empty() && name == ".git" {
                continue;
            }
            let path = format!("{prefix}{name}");
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(format!("{path}/"), None);
                walk(&e.path(), &format!("{path}/"), out);
            } else if ft.is_symlink() {
                let target = fs::read_link(e.path()).unwrap();
                out.insert(path, Some(target.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(path, Some(fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, "", &mut out);
    out
}

/// The paths the reference-model tests operate on: base files and directories of
/// `TestRepo`, and names that do not exist there.
pub const MODEL_PATHS: [&str; 14] = [
    "README.md",
    "src",
    "src/main.rs",
    "src/lib",
    "src/lib/mod.rs",
    "src/lib/util.rs",
    "docs",
    "new",
    "new/a",
    "x.txt",
    "src/x.txt",
    "empty.txt",
    "assets",
    "src/lib/x.txt",
];

/// Runs a command with a time limit; panics with its output if it fails.
pub fn run_ok(cmd: &str, args: &[&str], cwd: &Path) -> String {
    let out = run(cmd, args, cwd);
    assert!(
        out.status.success(),
        "`{cmd} {}` in {} failed ({}):\nstdout: {}\nstderr: {}",
        args.join(" "),
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command with a time limit (60 s) and returns its output.
pub fn run(cmd: &str, args: &[&str], cwd: &Path) -> Output {
    Command::new("timeout")
        .arg("-k")
        .arg("5")
        .arg("60")
        .arg(cmd)
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .expect("spawn")
}

pub fn git(cwd: &Path, args: &[&str]) -> String {
    run_ok("git", args, cwd)
}

pub fn wtfs(state: &Path, args: &[&str]) -> Output {
    let mut full = vec!["--state-dir", state.to_str().unwrap()];
    full.extend_from_slice(args);
    run(BIN, &full, Path::new("/"))
}

pub fn wtfs_ok(state: &Path, args: &[&str]) -> String {
    let out = wtfs(state, args);
    assert!(
        out.status.success(),
        "worktreefs {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository with the shapes real trees have: executable files, symlinks, an empty
/// blob, a large file, a deep path, non-ASCII names, a gitlink and an ignore file.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
}

impl TestRepo {
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    pub fn new() -> TestRepo {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        let w = |rel: &str, content: &[u8]| {
            let p = repo.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        };
        w("README.md", b"# test repository\n");
        w("src/main.rs", b"fn main() { println!(\"hi\"); }\n");
        w("src/lib/mod.rs", b"pub mod util;\n");
        w("src/lib/util.rs", b"pub fn one() -> u32 { 1 }\n");
        w("empty.txt", b"");
        w("build.sh", b"#!/bin/sh\necho building\n");
        fs::set_permissions(repo.join("build.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        w("assets/large.bin", &large);
        let deep = (0..24)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join("/");
        w(&format!("{deep}/leaf.txt"), b"deep leaf\n");
        w("docs/naïve café.md", "non-ASCII name\n".as_bytes());
        w("docs/日本語.txt", "こんにちは\n".as_bytes());
        w(".gitignore", b"target/\n*.o\n");
        std::os::unix::fs::symlink("README.md", repo.join("link-to-readme")).unwrap();
        std::os::unix::fs::symlink("../src", repo.join("docs/src-link")).unwrap();
        git(&repo, &["add", "-A"]);
        // A gitlink (submodule entry) pointing at some commit id.
        git(
            &repo,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                "160000,1111111111111111111111111111111111111111,vendor/sub",
            ],
        );
        git(&repo, &["commit", "-q", "-m", "initial"]);
        // A checkout has an empty directory where an uninitialised submodule goes.
        fs::create_dir_all(repo.join("vendor/sub")).unwrap();
        TestRepo { dir }
    }
}

pub fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = path.to_string_lossy().replace(' ', "\\040");
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
}

/// Detaches (lazily unmounts) whatever is mounted at `path`.
pub fn detach(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// A state directory with one registered repository named `repo`.
pub struct Env {
    pub repo: TestRepo,
    pub dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        // Whatever a test left mounted (a killed daemon's mount) goes with it.
        let mp = self.mountpoint();
        if let Ok(parent) = fs::canonicalize(mp.parent().unwrap()) {
            let mp = parent.join(mp.file_name().unwrap());
            if is_mounted(&mp) {
                detach(&mp);
            }
        }
    }
}

impl Env {
    pub fn new() -> Env {
        Env::in_dir(tempfile::tempdir().unwrap())
    }

    /// An `Env` in `dir` (whose `state` may be prepared first: a small disk, say).
    pub fn in_dir(dir: tempfile::TempDir) -> Env {
        let repo = TestRepo::new();
        let env = Env { repo, dir };
        wtfs_ok(
            &env.state(),
            &[
                "repo",
                "add",
                env.repo.path().to_str().unwrap(),
                "--name",
                "repo",
            ],
        );
        env
    }
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn mountpoint(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    /// Registers a second repository (a new test repository) under `name`.
    pub fn add_repo(&self, name: &str) -> TestRepo {
        let other = TestRepo::new();
        wtfs_ok(
            &self.state(),
            &[
                "repo",
                "add",
                other.path().to_str().unwrap(),
                "--name",
                name,
            ],
        );
        other
    }
}

/// Creates worktree `repo/<name>` at HEAD, owned by root, with no mount (the library call
/// the `new` command makes).
pub fn create_at_head(
    state: &worktreefs::state::StateDir,
    store: &mut worktreefs::store::Store,
    name: &str,
) -> worktreefs::store::WorktreeRow {
    create_in(state, store, "repo", name)
}

/// Creates worktree `name` of repository `repo` at its HEAD, without a mount.
pub fn create_in(
    state: &worktreefs::state::StateDir,
    store: &mut worktreefs::store::Store,
    repo: &str,
    name: &str,
) -> worktreefs::store::WorktreeRow {
    worktreefs::lifecycle::create::create_worktree(
        state,
        store,
        &worktreefs::lifecycle::create::CreateRequest {
            repo,
            name,
            base: None,
            branch: None,
            uid: 0,
            gid: 0,
            submodules: false,
            warm: None,
            progress: None,
            filter_timeout: worktreefs::git::filters::DEFAULT_TIMEOUT,
        },
    )
    .unwrap()
}
