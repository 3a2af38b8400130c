//! Running git for a worktree's owner: the conversions git must do itself (filters,
//! `working-tree-encoding`), the clean side of a file for cleanup's comparison, and the
//! attribute look-up at creation.
//!
//! Filters are commands from the repository's configuration, so git runs with the
//! owner's uid, gid and groups (never as root on someone's behalf), the owner's home (for
//! their global configuration, where `git lfs install` puts its filter), no environment
//! of the daemon's beyond `PATH`, `/` as its working directory (outside every view), in a
//! process group of its own that a timeout ends. Attributes are read from the worktree's
//! base commit (`--attr-source`), as a fresh checkout of it reads them.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use git2::Oid;
use parking_lot::Mutex;

use super::convert::{AttrValue, ConvConfig, PathAttrs, ATTR_NAMES};

/// How long one run of git (and the filters it starts) may take before it is ended,
/// unless told otherwise (`mount --filter-timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The user a worktree belongs to, as git must run for them.
#[derive(Debug, Clone)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub name: String,
    /// How long one run of git for them may take before it is ended.
    pub limit: Duration,
}

impl Owner {
    /// From the user database (cached); a uid it does not know gets `/` as its home and no
    /// supplementary groups. Each run of git for them may take `limit` (at least a
    /// millisecond).
    pub fn of(uid: u32, gid: u32, limit: Duration) -> Owner {
        Owner {
            limit: limit.max(Duration::from_millis(1)),
            ..Owner::looked_up(uid, gid)
        }
    }

    fn looked_up(uid: u32, gid: u32) -> Owner {
        // Kept a minute: a change of someone's groups reaches their filters soon.
        type Cache = Mutex<HashMap<(u32, u32), (Instant, Owner)>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        if let Some((at, o)) = cache.lock().get(&(uid, gid)) {
            if at.elapsed() < Duration::from_secs(60) {
                return o.clone();
            }
        }
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        let (home, name) = match &user {
            Some(u) => (u.dir.clone(), u.name.clone()),
            None => (PathBuf::from("/"), uid.to_string()),
        };
        let mut groups: Vec<u32> = user
            .and_then(|u| {
                let name = std::ffi::CString::new(u.name).ok()?;
                nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid)).ok()
            })
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        if !groups.contains(&gid) {
            groups.push(gid);
        }
        let o = Owner {
            uid,
            gid,
            groups,
            home,
            name,
            limit: DEFAULT_TIMEOUT,
        };
        cache.lock().insert((uid, gid), (Instant::now(), o.clone()));
        o
    }

    /// The configuration git reads for this user in the repository at `common_dir`, as far
    /// as conversions go, read by git itself running as the user (so includes and files
    /// the user names are read with the user's rights, never the daemon's): the settings,
    /// the names of filter drivers the repository's own config defines, and
    /// `core.attributesFile` if set.
    pub fn read_config(&self, common_dir: &Path) -> Result<OwnerConfig, RunError> {
        let out = memfile(c"wtfs-git-out").map_err(|e| RunError::Spawn(e.to_string()))?;
        let args: [&std::ffi::OsStr; 4] = [
            "config".as_ref(),
            "-z".as_ref(),
            "--list".as_ref(),
            "--show-scope".as_ref(),
        ];
        run_git(
            self,
            common_dir,
            &args,
            None,
            out.try_clone()
                .map_err(|e| RunError::Spawn(e.to_string()))?,
        )?;
        Ok(OwnerConfig::parse(&read_back(out, 4 << 20)?))
    }
}

/// What `Owner::read_config` found.
#[derive(Debug, Default)]
pub struct OwnerConfig {
    pub config: ConvConfig,
    /// Filter drivers named in the repository's own configuration.
    pub local_drivers: std::collections::BTreeSet<String>,
    pub attributes_file: Option<String>,
}

impl OwnerConfig {
    /// `git config -z --list --show-scope`: `scope NUL name LF value NUL` (no LF and no
    /// value for a key set without `=`).
    pub fn parse(bytes: &[u8]) -> OwnerConfig {
        let mut found = OwnerConfig::default();
        let mut fields = bytes.split(|&b| b == 0);
        while let (Some(scope), Some(entry)) = (fields.next(), fields.next()) {
            let entry = String::from_utf8_lossy(entry);
            let (name, value) = match entry.split_once('\n') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (entry.to_string(), None),
            };
            // Section and key are case-insensitive (git prints them lower-cased); a
            // subsection (a driver's name) keeps its case.
            let Some(first) = name.find('.') else {
                continue;
            };
            let section = &name[..first];
            if section == "filter" {
                if let Some((driver, _)) = name[first + 1..].rsplit_once('.') {
                    if scope == b"local" || scope == b"worktree" {
                        found.local_drivers.insert(driver.to_string());
                    }
                }
            }
            if name == "core.attributesfile" {
                found.attributes_file = value.clone();
            }
            found.config.set(&name, value.as_deref());
        }
        found
    }
}

/// Whether this machine's git reads attributes from a tree (`--attr-source`, git 2.40):
/// without it, no conversion is decided or made, and a log line says so once.
pub fn git_has_attr_source() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let version = Command::new("git")
            .arg("version")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let has = parse_git_version(&version).is_some_and(|v| v >= (2, 40));
        if !has {
            tracing::warn!(
                "{} cannot read attributes from a commit (--attr-source needs git 2.40): files that .gitattributes or core.autocrlf convert show as committed; install git 2.40 or later for them to show as a checkout writes them",
                if version.trim().is_empty() { "this git" } else { version.trim() }
            );
        }
        has
    })
}

fn parse_git_version(s: &str) -> Option<(u32, u32)> {
    let v = s.trim().strip_prefix("git version ")?;
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Pids of the git processes running for a worktree's owner now: their requests to the
/// view (and their children's) take no lease.
static RUNNING: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
static RUNNING_COUNT: AtomicUsize = AtomicUsize::new(0);

fn running() -> &'static Mutex<HashSet<i32>> {
    RUNNING.get_or_init(Default::default)
}

/// Whether `pid` is one of the git processes started here, or a descendant of one (a
/// filter it runs), looked up through `/proc` at most eight parents up.
pub fn is_ours(pid: i32) -> bool {
    if RUNNING_COUNT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let set = running().lock().clone();
    let mut p = pid;
    for _ in 0..8 {
        if set.contains(&p) {
            return true;
        }
        match crate::process::info::proc_info(p).map(|i| i.ppid) {
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

/// Why a run of git gave nothing usable.
#[derive(Debug)]
pub enum RunError {
    /// It could not start (no git, no way to become the owner).
    Spawn(String),
    /// It ran past its time limit (this long) and was ended.
    TimedOut(Duration),
    /// It failed; what it wrote on stderr.
    Failed(String),
    /// Its output found no room (the disk of the cache): not the filter's fault.
    NoSpace(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(e) => write!(f, "git could not be started: {e}"),
            RunError::TimedOut(limit) => {
                write!(f, "git did not finish within {limit:?} and was ended")
            }
            RunError::Failed(e) | RunError::NoSpace(e) => write!(f, "{}", e.trim()),
        }
    }
}

/// An anonymous file (for git's input and output, which then never block on a pipe).
pub(crate) fn memfile(name: &std::ffi::CStr) -> std::io::Result<File> {
    super::blobcache::memfd(name, &[])
}

/// What git wrote to the memory file `out`, up to `limit` bytes.
fn read_back(mut out: File, limit: u64) -> Result<Vec<u8>, RunError> {
    let mut bytes = Vec::new();
    out.rewind()
        .and_then(|_| out.take(limit).read_to_end(&mut bytes))
        .map_err(|e| RunError::Failed(format!("reading git's output: {e}")))?;
    Ok(bytes)
}

/// A memory file holding `data`, at its start.
pub fn input(data: &[u8]) -> std::io::Result<File> {
    super::blobcache::memfd(c"wtfs-git-in", data)
}

/// `git --git-dir=<common_dir> <args>` run as `owner`, with `stdin` as its input and its
/// output written to `stdout`; errors carry what it said.
pub fn run_git(
    owner: &Owner,
    common_dir: &Path,
    args: &[&std::ffi::OsStr],
    stdin: Option<File>,
    stdout: File,
) -> Result<(), RunError> {
    run(owner, GitDir::Path(common_dir), args, stdin, stdout)
}

/// As [`run_git`], in the git directory open as `dir`: git starts there (`--git-dir=.`),
/// so a path swapped for a symbolic link meanwhile leads it nowhere else.
pub fn run_git_in(
    owner: &Owner,
    dir: std::os::fd::BorrowedFd,
    args: &[&std::ffi::OsStr],
    stdin: Option<File>,
    stdout: File,
) -> Result<(), RunError> {
    run(owner, GitDir::Open(dir), args, stdin, stdout)
}

/// Where git finds the repository.
enum GitDir<'a> {
    Path(&'a Path),
    Open(std::os::fd::BorrowedFd<'a>),
}

fn run(
    owner: &Owner,
    git_dir: GitDir,
    args: &[&std::ffi::OsStr],
    stdin: Option<File>,
    stdout: File,
) -> Result<(), RunError> {
    let mut cmd = Command::new("git");
    match git_dir {
        GitDir::Path(p) => {
            cmd.arg(format!("--git-dir={}", p.display()));
        }
        GitDir::Open(fd) => {
            use std::os::fd::AsRawFd;
            let fd = fd.as_raw_fd();
            cmd.arg("--git-dir=.");
            // SAFETY: fchdir is async-signal-safe; the descriptor is open until exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::fchdir(fd) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    }
    cmd.args(args)
        .env_clear()
        .env("HOME", &owner.home)
        .env("USER", &owner.name)
        .env("LOGNAME", &owner.name)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .current_dir("/")
        .stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null))
        .stdout(Stdio::from(stdout))
        .process_group(0);
    // What git says, through a pipe whose reader keeps the first 4 KiB and drops the
    // rest (a filter that floods its stderr costs no memory).
    cmd.stderr(Stdio::piped());
    let me = nix::unistd::geteuid().as_raw();
    if me != owner.uid {
        if me != 0 {
            return Err(RunError::Spawn(format!(
                "the daemon (uid {me}) cannot run git as uid {} (the owner of the worktree or repository it is for): run the daemon as root, or as that user",
                owner.uid
            )));
        }
        let (uid, gid) = (owner.uid, owner.gid);
        let groups: Vec<libc::gid_t> = owner.groups.clone();
        // SAFETY: only async-signal-safe system calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|e| RunError::Spawn(e.to_string()))?;
    let pid = child.id() as i32;
    let (said_tx, said_rx) = std::sync::mpsc::channel();
    if let Some(mut pipe) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = 4096usize.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
            let _ = said_tx.send(String::from_utf8_lossy(&kept).into_owned());
        });
    }
    running().lock().insert(pid);
    RUNNING_COUNT.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + owner.limit;
    let mut pause = Duration::from_millis(1);
    // Exit is seen without reaping (WNOWAIT): the pid, and so the group's id, stays ours
    // until the group is ended and the child reaped.
    let exited = || crate::process::unreaped::has_exited(pid);
    let mut timed_out = false;
    while !exited() {
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
    // On a timeout, asked first (git removes the lock files it holds as it ends), then
    // a second later the whole group goes: git and the filters it started, or what a
    // filter left running in it. The group is this run's own, led by our unreaped child.
    if timed_out {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let asked = Instant::now();
        while !exited() && asked.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let status = child.wait().map_err(|e| RunError::Spawn(e.to_string()));
    running().lock().remove(&pid);
    RUNNING_COUNT.fetch_sub(1, Ordering::Relaxed);
    let status = if timed_out {
        Err(RunError::TimedOut(owner.limit))
    } else {
        status
    };
    // The pipe closes once no one in the group holds it; something that left the group
    // holding it is waited for a moment only.
    let mut said = said_rx
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_default();
    let status = status?;
    if status.success() {
        return Ok(());
    }
    if said.contains("No space left on device") {
        return Err(RunError::NoSpace(said));
    }
    if said.trim().is_empty() {
        said = format!("git exited with {status}");
    }
    Err(RunError::Failed(said))
}

/// What a checkout of the base commit `commit` writes for the blob `oid` at `path`,
/// written to `out`: git's own conversion (`cat-file --filters`), filters included.
pub fn smudge(
    owner: &Owner,
    common_dir: &Path,
    commit: Oid,
    path: &[u8],
    oid: Oid,
    out: File,
) -> Result<(), RunError> {
    use std::os::unix::ffi::OsStrExt;
    let source = format!("--attr-source={commit}");
    let mut path_arg = b"--path=".to_vec();
    path_arg.extend_from_slice(path);
    let oid_s = oid.to_string();
    let args: [&std::ffi::OsStr; 6] = [
        source.as_ref(),
        "-c".as_ref(),
        "core.safecrlf=false".as_ref(),
        "cat-file".as_ref(),
        "--filters".as_ref(),
        std::ffi::OsStr::from_bytes(&path_arg),
    ];
    let mut all = args.to_vec();
    all.push(oid_s.as_ref());
    run_git(owner, common_dir, &all, None, out)
}

/// The blob id git would give the file `content` at `path` (its clean side: end of
/// line, `ident`, filters, encoding), reading attributes from `attr_source`.
pub fn clean_id(
    owner: &Owner,
    common_dir: &Path,
    attr_source: Oid,
    path: &[u8],
    content: File,
) -> Result<Oid, RunError> {
    use std::os::unix::ffi::OsStrExt;
    let source = format!("--attr-source={attr_source}");
    let mut path_arg = b"--path=".to_vec();
    path_arg.extend_from_slice(path);
    let out = memfile(c"wtfs-git-out").map_err(|e| RunError::Spawn(e.to_string()))?;
    let args: [&std::ffi::OsStr; 6] = [
        source.as_ref(),
        "-c".as_ref(),
        "core.safecrlf=false".as_ref(),
        "hash-object".as_ref(),
        std::ffi::OsStr::from_bytes(&path_arg),
        "--stdin".as_ref(),
    ];
    run_git(
        owner,
        common_dir,
        &args,
        Some(content),
        out.try_clone()
            .map_err(|e| RunError::Spawn(e.to_string()))?,
    )?;
    let text = String::from_utf8_lossy(&read_back(out, 200)?).into_owned();
    Oid::from_str(text.trim())
        .map_err(|_| RunError::Failed(format!("hash-object printed {text:?}")))
}

/// The conversion attributes of each of `paths` in the tree of `commit`.
pub fn check_attrs(
    owner: &Owner,
    common_dir: &Path,
    commit: Oid,
    paths: &[&[u8]],
) -> Result<Vec<PathAttrs>, RunError> {
    let source = format!("--attr-source={commit}");
    let mut list = Vec::new();
    for p in paths {
        list.extend_from_slice(p);
        list.push(0);
    }
    let stdin = input(&list).map_err(|e| RunError::Spawn(e.to_string()))?;
    let out = memfile(c"wtfs-git-out").map_err(|e| RunError::Spawn(e.to_string()))?;
    let mut args: Vec<&std::ffi::OsStr> = vec![
        source.as_ref(),
        "check-attr".as_ref(),
        "-z".as_ref(),
        "--stdin".as_ref(),
    ];
    args.extend(ATTR_NAMES.iter().map(std::ffi::OsStr::new));
    run_git(
        owner,
        common_dir,
        &args,
        Some(stdin),
        out.try_clone()
            .map_err(|e| RunError::Spawn(e.to_string()))?,
    )?;
    let bytes = read_back(out, u64::MAX)?;
    // <path> NUL <attribute> NUL <value> NUL, each path's attributes in a row, paths in
    // the order given.
    let mut fields = bytes.split(|&b| b == 0);
    let mut result = Vec::with_capacity(paths.len());
    for p in paths {
        let mut a = PathAttrs::default();
        for _ in 0..ATTR_NAMES.len() {
            let (Some(path), Some(name), Some(value)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(RunError::Failed("check-attr's answer ended early".into()));
            };
            if path != *p {
                return Err(RunError::Failed(format!(
                    "check-attr answered for {:?} when asked for {:?}",
                    String::from_utf8_lossy(path),
                    String::from_utf8_lossy(p)
                )));
            }
            a.set(
                &String::from_utf8_lossy(name),
                AttrValue::parse(&String::from_utf8_lossy(value)),
            );
        }
        result.push(a);
    }
    Ok(result)
}
