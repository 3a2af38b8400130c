//! Helpers for the mounted tests: those shared with `tests/view.rs` (a real repository
//! in a state directory, commands with a time limit; `tests/common/mod.rs`), and a mount
//! that is bounded in time and always unmounted, even when the test fails or hangs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod shared;
pub use shared::*;

/// A running daemon on a temporary mountpoint. Dropping it unmounts and ends the daemon.
/// A watchdog detaches the mount if the test runs longer than its limit, so a hang fails
/// instead of blocking.
pub struct Mounted {
    pub state: PathBuf,
    pub mountpoint: PathBuf,
    child: Option<Child>,
    done: Arc<AtomicBool>,
    /// The mount's device, to abort its connection if the daemon hangs.
    dev: u64,
}

/// Aborts a FUSE connection (its id is the minor number of the mount's device): requests
/// stuck in the kernel fail at once, so a hung daemon cannot hang the test run.
fn abort_connection(dev: u64) {
    let minor = libc::minor(dev);
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(minor.to_string()).exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none", "/sys/fs/fuse/connections"])
            .stderr(Stdio::null())
            .status();
    }
    let _ = fs::write(dir.join(minor.to_string()).join("abort"), "1");
}

impl Mounted {
    pub fn start(state: &Path, mountpoint: &Path) -> Mounted {
        Self::start_limited(state, mountpoint, Duration::from_secs(240))
    }

    /// With a long grace period, so no worktree starts cleanup while a test still uses it
    /// between two commands (tests of the lifecycle pass their own `--linger`).
    pub fn start_limited(state: &Path, mountpoint: &Path, limit: Duration) -> Mounted {
        Self::start_with(state, mountpoint, limit, &["--linger", "600"])
    }

    /// Starts a daemon with extra `mount` arguments (e.g. `--linger 1`).
    pub fn start_with(state: &Path, mountpoint: &Path, limit: Duration, extra: &[&str]) -> Mounted {
        Self::start_env(state, mountpoint, limit, extra, "worktreefs=debug")
    }

    /// As `start_with`, with the daemon's `RUST_LOG`.
    pub fn start_env(
        state: &Path,
        mountpoint: &Path,
        limit: Duration,
        extra: &[&str],
        rust_log: &str,
    ) -> Mounted {
        Self::start_program(Path::new(BIN), state, mountpoint, limit, extra, rust_log)
    }

    /// As `start_env`, the daemon run from the binary `program` (a copy of worktreefs
    /// under another name).
    pub fn start_program(
        program: &Path,
        state: &Path,
        mountpoint: &Path,
        limit: Duration,
        extra: &[&str],
        rust_log: &str,
    ) -> Mounted {
        Self::start_full(program, state, mountpoint, limit, extra, rust_log, &[])
    }

    /// As `start_with`, with `envs` in the daemon's environment only (never this test
    /// process's, which the other tests of its binary share).
    pub fn start_with_envs(
        state: &Path,
        mountpoint: &Path,
        extra: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Mounted {
        Self::start_full(
            Path::new(BIN),
            state,
            mountpoint,
            Duration::from_secs(240),
            extra,
            "worktreefs=debug",
            envs,
        )
    }

    fn start_full(
        program: &Path,
        state: &Path,
        mountpoint: &Path,
        limit: Duration,
        extra: &[&str],
        rust_log: &str,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Mounted {
        // Exists already, or is a dead mount (which cannot be stat'ed): both fine.
        let _ = fs::create_dir(mountpoint);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state.join("test-daemon.log"))
            .unwrap();
        // Whether a removal keeps a copy must not depend on the machine's free disk (the
        // default policy keeps nothing below 5% or 2 GiB free, and a test machine near
        // that retained what the tests expect removed and kept): no threshold, unless the
        // test sets one.
        let free_disk: &[&str] = if extra.iter().any(|a| a.starts_with("--keep-min-free")) {
            &[]
        } else {
            &["--keep-min-free-percent", "0", "--keep-min-free-gib", "0"]
        };
        let child = Command::new(program)
            .arg("mount")
            .arg(mountpoint)
            .arg("--state-dir")
            .arg(state)
            .arg("--foreground")
            .args(free_disk)
            .args(extra)
            .env("RUST_LOG", rust_log)
            // In the test's session a daemon shares its scheduling group, where `auto`
            // would not yield (fuse/yielding.rs): every mounted test runs yielding, in
            // the harsher case, unless it says otherwise.
            .env("WORKTREEFS_YIELD_CPU", "always")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut m = Mounted {
            state: state.to_path_buf(),
            // Not canonicalize(mountpoint): a dead mount there cannot be stat'ed.
            mountpoint: fs::canonicalize(mountpoint.parent().unwrap())
                .unwrap()
                .join(mountpoint.file_name().unwrap()),
            child: Some(child),
            done: Arc::new(AtomicBool::new(false)),
            dev: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // Served by a live daemon: `.control/stats` is generated on every read, so unlike a
        // stat (which the kernel may answer from its cache of a dead mount) reading it
        // needs the daemon.
        while !(is_mounted(&m.mountpoint)
            && fs::read_to_string(m.mountpoint.join(".control/stats")).is_ok())
        {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited before mounting ({status}): {}", m.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "mount did not appear: {}",
                m.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m.dev = std::os::unix::fs::MetadataExt::dev(&fs::metadata(&m.mountpoint).unwrap());
        let done = m.done.clone();
        let mp = m.mountpoint.clone();
        let dev = m.dev;
        std::thread::spawn(move || {
            let end = Instant::now() + limit;
            while Instant::now() < end {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!(
                "watchdog: test exceeded {limit:?}; aborting and detaching {}",
                mp.display()
            );
            abort_connection(dev);
            detach(&mp);
        });
        m
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.state.join("test-daemon.log")).unwrap_or_default()
    }

    /// The end of the daemon's log without its debug lines: what a failure message needs
    /// (the log holds every daemon this state directory ran, and a report of a failure
    /// may show only its start).
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
            .collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn wt(&self, repo: &str, name: &str) -> PathBuf {
        self.mountpoint.join(repo).join(name)
    }

    pub fn stats(&self) -> serde_json::Value {
        let text = fs::read_to_string(self.mountpoint.join(".control/stats")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// Unmounts through the CLI and waits for the daemon to exit.
    /// The paths whose content the daemon has read (its `content_paths` counter).
    pub fn content_paths(&self) -> Vec<String> {
        self.stats()["content_paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    }

    pub fn unmount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let Some(mut child) = self.child.take() else {
            return;
        };
        if is_mounted(&self.mountpoint) {
            let out = wtfs(&self.state, &["unmount"]);
            if !out.status.success() {
                eprintln!(
                    "unmount failed, detaching: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                detach(&self.mountpoint);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                _ if Instant::now() > deadline => {
                    abort_connection(self.dev);
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if is_mounted(&self.mountpoint) {
            detach(&self.mountpoint);
        }
    }

    /// Kills the daemon with SIGKILL and leaves its dead mount behind, as a crash would.
    /// The next `mount` must cope; the mountpoint is detached at the end of the test in
    /// any case by `Env`'s guard.
    pub fn kill9(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Turns libgit2's check of a repository's owner off in this process, as the daemon does
/// at its start, for a test that opens another user's repository in-process. The setting
/// is the whole process's and stays: every test of the binary shares it, none needs the
/// check on, and it is written once, however many tests ask.
pub fn libgit2_owner_check_off() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: libgit2 keeps the setting in one global integer, written here once
        // (from on to off, never back) while other tests' threads may read it; they read
        // either value, and no test opens another user's repository before asking for this.
        unsafe { git2::opts::set_verify_owner_validation(false) }.unwrap();
    });
}

/// A worktree's state from `worktreefs list`; `list` leaves removed worktrees out, so a
/// worktree not listed is "removed".
pub fn state_of(env: &Env, name: &str) -> String {
    listed(env, name)
        .map(|w| w["state"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "removed".into())
}

/// Worktree `repo/<name>` as `worktreefs list --json` gives it, if it is listed.
pub fn listed(env: &Env, name: &str) -> Option<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .cloned()
}

/// The id of worktree `repo/<name>` (it must be listed).
pub fn id_of(env: &Env, name: &str) -> i64 {
    listed(env, name).unwrap_or_else(|| panic!("no worktree {name}"))["id"]
        .as_i64()
        .unwrap()
}

/// Waits until `f` holds; fails naming `what` if it does not by `limit`.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process that works in worktree `dir` (it reads a file there, so it holds a lease)
/// and stays, its working directory inside, until it is killed.
pub fn sit_in(dir: &Path) -> std::process::Child {
    Command::new("sh")
        .args(["-c", "cat README.md > /dev/null; exec sleep 60"])
        .current_dir(dir)
        .spawn()
        .unwrap()
}

/// Waits until a worktree is in state `want`; fails with the event log if it is not by
/// `limit`.
pub fn wait_for_state(env: &Env, name: &str, want: &str, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let now = state_of(env, name);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{name} did not become {want} within {limit:?} (is {now}); events:\n{}",
            wtfs_ok(&env.state(), &["events"])
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `reclaim` of `REPO/NAME` that keeps the worktree, bounded by `limit` (a hang fails
/// the test instead of blocking it): asserts it exits 1 and returns what it said.
pub fn reclaim_kept(env: &Env, target: &str, limit: Duration) -> String {
    let mut child = std::process::Command::new(BIN)
        .args([
            "--state-dir",
            env.state().to_str().unwrap(),
            "reclaim",
            target,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("reclaim {target} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "reclaim {target}: {said}");
    said
}

/// A small deterministic generator (64-bit LCG, high bits), so a random sequence in a
/// model test reproduces from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Unmounts a daemon started in the background (`worktreefs mount` without
/// `--foreground`) when dropped, even when the test fails: through the CLI, then by
/// detaching whatever is still mounted.
pub struct UnmountOnDrop {
    pub state: PathBuf,
    pub mountpoint: PathBuf,
}

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = wtfs(&self.state, &["unmount"]);
        if is_mounted(&self.mountpoint) {
            detach(&self.mountpoint);
        }
    }
}

pub const NOBODY: u32 = 65534;

/// Runs `script` with `sh` as the unprivileged user nobody, in `dir` (entered as root
/// first, so the directories above it need not let nobody through).
pub fn as_nobody(dir: &Path, script: &str) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).current_dir(dir);
    // SAFETY: setgroups, setgid and setuid are async-signal-safe; nothing else runs here.
    unsafe {
        cmd.pre_exec(|| {
            let groups = [NOBODY];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// The store's row of `repo/<name>` as cleanup sees it, under the mount `m`.
pub fn target_of(env: &Env, m: &Mounted, name: &str) -> worktreefs::lifecycle::cleanup::Target {
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let row = store.worktree("repo", name).unwrap().unwrap();
    let repo = store.repo_by_id(row.repo_id).unwrap().unwrap();
    worktreefs::lifecycle::cleanup::Target::new(&state, &row, &repo, &m.mountpoint)
}

/// git's own verdict: the paths `git status --porcelain --untracked-files=all` lists.
pub fn git_dirty_paths(wt: &Path) -> Vec<String> {
    git(
        wt,
        &[
            "-c",
            "core.quotePath=false",
            "status",
            "--porcelain",
            "--untracked-files=all",
            "--no-renames",
        ],
    )
    .lines()
    .map(|l| l[3..].trim_matches('"').to_string())
    .collect()
}

/// Creates worktree `repo/<name>` at HEAD owned by `uid` (its group the same number),
/// with no mount, as `mkdir` through the mount does for that user.
pub fn create_owned_by(env: &Env, name: &str, uid: u32, submodules: bool) {
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let mut store = worktreefs::store::Store::open(&state.root).unwrap();
    worktreefs::lifecycle::create::create_worktree(
        &state,
        &mut store,
        &worktreefs::lifecycle::create::CreateRequest {
            repo: "repo",
            name,
            base: None,
            branch: None,
            uid,
            gid: uid,
            submodules,
            warm: None,
            progress: None,
            filter_timeout: worktreefs::git::filters::DEFAULT_TIMEOUT,
        },
    )
    .unwrap();
}

/// The seed of a randomized test: `WTFS_SEED=<n>` runs another sequence.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("WTFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// `text` with each line's runs of blanks made one space (a table's columns read as words).
pub fn squeezed(text: &str) -> String {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The harness's own additions to the shared types.
impl TestRepo {
    pub fn head(&self) -> String {
        git(&self.path(), &["rev-parse", "HEAD"]).trim().to_string()
    }
}

impl Env {
    pub fn mount(&self) -> Mounted {
        Mounted::start(&self.state(), &self.mountpoint())
    }
    pub fn mount_with(&self, extra: &[&str]) -> Mounted {
        Mounted::start_with(
            &self.state(),
            &self.mountpoint(),
            Duration::from_secs(240),
            extra,
        )
    }
}

/// Every entry below `wt` with its type, mode and content, as a child process reads them
/// (`.git` aside): two trees print the same when they hold the same.
pub fn tree_listing(wt: &Path) -> String {
    run_ok(
        "sh",
        &[
            "-c",
            "find . -path ./.git -prune -o -print | LC_ALL=C sort | while read f; do printf '== %s %s %s\\n' \"$f\" \"$(stat -c '%A %h' \"$f\")\"; if [ -L \"$f\" ]; then readlink \"$f\"; elif [ -f \"$f\" ]; then md5sum < \"$f\"; fi; done",
        ],
        wt,
    )
}

/// What git says of a worktree, from a child process: status (untracked and ignored
/// files too), the staged and unstaged diffs, HEAD, and the branch HEAD names.
pub fn git_state(wt: &Path) -> [String; 5] {
    [
        run_ok(
            "git",
            &[
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--ignored",
            ],
            wt,
        ),
        run_ok("git", &["diff", "--cached"], wt),
        run_ok("git", &["diff"], wt),
        run_ok("git", &["rev-parse", "HEAD"], wt),
        // The branch, or `HEAD` when detached.
        run_ok("git", &["rev-parse", "--symbolic-full-name", "HEAD"], wt),
    ]
}
