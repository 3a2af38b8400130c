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

/// How long one run of git (and the filters it starts) may take before it is ended, in
/// milliseconds (`mount --filter-timeout`).
static TIMEOUT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(120_000);

pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

pub fn set_timeout(d: Duration) {
    TIMEOUT_MS.store((d.as_millis() as u64).max(1), Ordering::Relaxed);
}

/// The user a worktree belongs to, as git must run for them.
#[derive(Debug, Clone)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub name: String,
}

impl Owner {
    /// From the user database (cached); a uid it does not know gets `/` as its home and no
    /// supplementary groups.
    pub fn of(uid: u32, gid: u32) -> Owner {
        static CACHE: OnceLock<Mutex<HashMap<(u32, u32), Owner>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        if let Some(o) = cache.lock().get(&(uid, gid)) {
            return o.clone();
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
        };
        cache.lock().insert((uid, gid), o.clone());
        o
    }

    /// The configuration git reads for this user in the repository at `common_dir`, as far
    /// as conversions go, with the attribute files outside any tree.
    pub fn conv_config(&self, common_dir: &Path) -> (ConvConfig, Vec<Vec<u8>>) {
        let mut cfg = ConvConfig::default();
        let xdg = self.home.join(".config/git");
        let files = [
            (PathBuf::from("/etc/gitconfig"), git2::ConfigLevel::System),
            (xdg.join("config"), git2::ConfigLevel::XDG),
            (self.home.join(".gitconfig"), git2::ConfigLevel::Global),
            (common_dir.join("config"), git2::ConfigLevel::Local),
        ];
        let mut attributes_file = None;
        if let Ok(mut config) = git2::Config::new() {
            for (path, level) in &files {
                if path.is_file() {
                    if let Err(e) = config.add_file(path, *level, false) {
                        tracing::debug!("reading {}: {}", path.display(), e.message());
                    }
                }
            }
            if let Ok(snap) = config.snapshot() {
                if let Ok(mut entries) = snap.entries(Some(r"^(core\.(autocrlf|eol)|filter\..*)$"))
                {
                    while let Some(Ok(e)) = entries.next() {
                        if let Some(name) = e.name() {
                            cfg.set(&name.to_ascii_lowercase(), e.value());
                        }
                    }
                }
                attributes_file = snap.get_string("core.attributesFile").ok();
            }
        }
        let attributes_file = match attributes_file {
            Some(p) => match p.strip_prefix("~/") {
                Some(rest) => self.home.join(rest),
                None => PathBuf::from(p),
            },
            None => xdg.join("attributes"),
        };
        let texts = [
            PathBuf::from("/etc/gitattributes"),
            attributes_file,
            common_dir.join("info/attributes"),
        ]
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect();
        (cfg, texts)
    }
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
        match parent_of(p) {
            Some(pp) if pp > 1 => p = pp,
            _ => return false,
        }
    }
    false
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// Why a run of git gave nothing usable.
#[derive(Debug)]
pub enum RunError {
    /// It could not start (no git, no way to become the owner).
    Spawn(String),
    /// It ran past the timeout and was ended.
    TimedOut,
    /// It failed; what it wrote on stderr.
    Failed(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(e) => write!(f, "git could not be started: {e}"),
            RunError::TimedOut => {
                write!(f, "git did not finish within {:?} and was ended", timeout())
            }
            RunError::Failed(e) => write!(f, "{}", e.trim()),
        }
    }
}

/// An anonymous file (for git's input and output, which then never block on a pipe).
fn memfile(name: &std::ffi::CStr) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the descriptor returned is ours alone.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A memory file holding `data`, at its start.
pub fn input(data: &[u8]) -> std::io::Result<File> {
    use std::io::Write;
    let mut f = memfile(c"wtfs-git-in")?;
    f.write_all(data)?;
    f.rewind()?;
    Ok(f)
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
    let mut cmd = Command::new("git");
    cmd.arg(format!("--git-dir={}", common_dir.display()))
        .args(args)
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
    let stderr = memfile(c"wtfs-git-err").map_err(|e| RunError::Spawn(e.to_string()))?;
    cmd.stderr(Stdio::from(
        stderr
            .try_clone()
            .map_err(|e| RunError::Spawn(e.to_string()))?,
    ));
    let me = nix::unistd::geteuid().as_raw();
    if me != owner.uid {
        if me != 0 {
            return Err(RunError::Spawn(format!(
                "the daemon (uid {me}) cannot run git as the worktree's owner (uid {})",
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
    running().lock().insert(pid);
    RUNNING_COUNT.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + timeout();
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                // The whole group: git and the filters it started. Ours, by our child's pid.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                break Err(RunError::TimedOut);
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => break Err(RunError::Spawn(e.to_string())),
        }
    };
    running().lock().remove(&pid);
    RUNNING_COUNT.fetch_sub(1, Ordering::Relaxed);
    let status = status?;
    if status.success() {
        return Ok(());
    }
    let mut said = String::new();
    let mut stderr = stderr;
    let _ = stderr.rewind();
    let _ = stderr.take(4096).read_to_string(&mut said);
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
    let mut text = String::new();
    let mut out = out;
    let _ = out.rewind();
    let _ = out.take(200).read_to_string(&mut text);
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
    let mut bytes = Vec::new();
    let mut out = out;
    let _ = out.rewind();
    out.read_to_end(&mut bytes)
        .map_err(|e| RunError::Failed(e.to_string()))?;
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
