//! `worktreefs doctor`: is this machine set up? One check per line, each with what to do
//! when it fails. Reads only: it makes no state directory, and looks at a mount only
//! through its `.control` (no worktree, so no lease), on a thread under a time limit.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use worktreefs::report::shapes::{CheckJson, CheckStatus};
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::exit::{AsJson, Exit, Failed};

#[derive(Args)]
pub struct DoctorArgs {
    /// The checks as a JSON array on stdout (check, status ok|warn|fail, detail, fix).
    #[arg(long)]
    pub json: bool,
}

pub fn run(root: &Path, args: DoctorArgs) -> Result<(), Failed> {
    let json = args.json;
    let checks = checks(root);
    if json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        for c in &checks {
            println!("{:<4} {:<16} {}", c.status.as_str(), c.check, c.detail);
            if let Some(f) = &c.fix {
                println!("{:<21} fix: {f}", "");
            }
        }
    }
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| c.check.clone())
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    Err(ChecksFailed(failed).into())
}

/// The checks that failed: said already, check by check (and as JSON with `--json`), so
/// the exit code is what is left to say.
struct ChecksFailed(Vec<String>);

impl Exit for ChecksFailed {
    fn message(&self) -> String {
        format!("{} check(s) failed: {}", self.0.len(), self.0.join(", "))
    }

    fn json(&self) -> AsJson {
        AsJson::Printed
    }
}

fn check(name: &str, status: CheckStatus, detail: String, fix: Option<String>) -> CheckJson {
    CheckJson {
        check: name.to_string(),
        status,
        detail,
        fix,
    }
}

/// How long the daemon's `.control/stats` may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Every check, in order: the FUSE device, fusermount3, the kernel, the state directory,
/// stale mounts and locks, the daemon, each repository.
fn checks(root: &Path) -> Vec<CheckJson> {
    let root_user = nix::unistd::geteuid().is_root();
    let mut out = vec![fuse_device(), fusermount(root_user), kernel(root_user)];
    let state = state_dir(root, &mut out);
    stale_mounts(&mut out);
    if let Some(state) = state {
        let store = (state.root.join(worktreefs::store::DB_FILE).exists())
            .then(|| Store::open(&state.root))
            .and_then(|r| r.ok());
        daemon(&state, &mut out);
        if let Some(store) = &store {
            stale_creations(store, &mut out);
            repositories(store, &mut out);
            forbidden_branches(store, &mut out);
        }
    }
    out
}

/// The FUSE device, and whether this user can mount through it (or fusermount3): the
/// check `mount` makes, so this fails where a mount would, with the same way out.
fn fuse_device() -> CheckJson {
    match worktreefs::daemon::fuse_access::check() {
        Ok((_, detail)) => check("fuse-device", CheckStatus::Ok, detail, None),
        Err(r) => check("fuse-device", CheckStatus::Fail, r.detail, Some(r.fix)),
    }
}

fn fusermount(root_user: bool) -> CheckJson {
    let Some(bin) = worktreefs::fs::mount::fusermount_bin() else {
        return if root_user {
            check(
                "fusermount3",
                CheckStatus::Ok,
                "not installed; root mounts without it".into(),
                None,
            )
        } else {
            check(
                "fusermount3",
                CheckStatus::Fail,
                "not installed: a user who is not root mounts through it".into(),
                Some(
                    "install it (`apt-get install fuse3`, `dnf install fuse3`), or mount as root"
                        .into(),
                ),
            )
        };
    };
    let setuid =
        std::fs::metadata(&bin).is_ok_and(|m| m.uid() == 0 && m.permissions().mode() & 0o4000 != 0);
    if setuid || root_user {
        check(
            "fusermount3",
            CheckStatus::Ok,
            format!(
                "{}{}",
                bin.display(),
                if setuid { " (setuid root)" } else { "" }
            ),
            None,
        )
    } else {
        check(
            "fusermount3",
            CheckStatus::Fail,
            format!(
                "{} is not setuid root: it cannot mount for you",
                bin.display()
            ),
            Some(format!(
                "reinstall fuse3, or `chmod u+s {}` as root",
                bin.display()
            )),
        )
    }
}

/// The kernel's release as (major, minor).
fn release() -> Option<(String, u32, u32)> {
    let u = nix::sys::utsname::uname().ok()?;
    let r = u.release().to_string_lossy().into_owned();
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((r, major, minor))
}

fn kernel(root_user: bool) -> CheckJson {
    let Some((r, major, minor)) = release() else {
        return check(
            "kernel",
            CheckStatus::Warn,
            "the kernel's release cannot be read".into(),
            None,
        );
    };
    let at_least = |a: u32, b: u32| (major, minor) >= (a, b);
    // The daemon never changes enable_uring: the machine's owner decides.
    let (uring, uring_fix) = match worktreefs::fs::mount::uring_available() {
        Ok(()) => (
            "FUSE over io_uring: on, so a mount takes its requests over io_uring (unless --uring off)"
                .to_string(),
            None,
        ),
        Err(_) if worktreefs::fs::mount::uring_switch().exists() => (
            "FUSE over io_uring: off (enable_uring=N), so a mount takes its requests through /dev/fuse".to_string(),
            Some(format!(
                "for requests over io_uring (fewer, cheaper round trips): `echo 1 > {}` now, and `options fuse enable_uring=1` in /etc/modprobe.d/fuse.conf for every boot; then mount again",
                worktreefs::fs::mount::uring_switch().display()
            )),
        ),
        Err(why) => (format!("FUSE over io_uring: {why}; a mount takes its requests through /dev/fuse"), None),
    };
    let passthrough = if !at_least(6, 9) {
        "FUSE passthrough: not before Linux 6.9, so file I/O goes through the daemon".to_string()
    } else if root_user {
        "FUSE passthrough: offered from Linux 6.9 (a mount's log says whether it took it)"
            .to_string()
    } else {
        "FUSE passthrough: not for a daemon that is not root (the kernel asks CAP_SYS_ADMIN of it), so file I/O goes through the daemon, and it cannot give files to other owners; the bench figures are for a root daemon".to_string()
    };
    let passthrough_fix = (!at_least(6, 9) || !root_user).then(|| {
        if root_user {
            "a kernel from 6.9 on does file I/O without the daemon".to_string()
        } else {
            "mount as root for passthrough and files given to their owners".to_string()
        }
    });
    let fixes: Vec<String> = passthrough_fix.into_iter().chain(uring_fix).collect();
    let status = if fixes.is_empty() {
        CheckStatus::Ok
    } else {
        CheckStatus::Warn
    };
    let fix = (!fixes.is_empty()).then(|| fixes.join("; "));
    check(
        "kernel",
        status,
        format!("Linux {r}; {passthrough}; {uring}"),
        fix,
    )
}

fn state_dir(root: &Path, out: &mut Vec<CheckJson>) -> Option<StateDir> {
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            out.push(check(
                "state-dir",
                CheckStatus::Ok,
                format!(
                    "{} does not exist yet; the first mount or `repo add` makes it",
                    root.display()
                ),
                None,
            ));
            return None;
        }
        Err(e) => {
            out.push(check(
                "state-dir",
                CheckStatus::Fail,
                format!("{}: {e}", root.display()),
                Some("use a state dir of your own with --state-dir".into()),
            ));
            return None;
        }
    };
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.permissions().mode() & 0o7777;
    let (status, detail, fix) = if meta.file_type().is_symlink() || !meta.is_dir() {
        (
            CheckStatus::Fail,
            format!("{} is not a directory", root.display()),
            Some("move it away, or use another --state-dir".into()),
        )
    } else if meta.uid() != me {
        (
            CheckStatus::Fail,
            format!(
                "{} belongs to uid {}, not to you (uid {me})",
                root.display(),
                meta.uid()
            ),
            Some("run as its owner, or use a state dir of your own with --state-dir".into()),
        )
    } else if mode & 0o077 != 0 {
        (
            CheckStatus::Warn,
            format!(
                "{} has mode {mode:o}: others may look into it",
                root.display()
            ),
            Some(format!(
                "`chmod 700 {}` (the next mount does it too)",
                root.display()
            )),
        )
    } else {
        (
            CheckStatus::Ok,
            format!("{} (mode {mode:o}, yours)", root.display()),
            None,
        )
    };
    out.push(check("state-dir", status, detail, fix));
    let state = StateDir {
        root: std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()),
    };
    // Free space: kept removals give way below the keep policy's floor.
    if let Ok(v) = nix::sys::statvfs::statvfs(&state.root) {
        let free = v.blocks_available() * v.fragment_size();
        let total = v.blocks() * v.fragment_size();
        let policy = std::fs::exists(state.root.join(worktreefs::store::DB_FILE))
            .unwrap_or(false)
            .then(|| Store::open(&state.root).ok())
            .flatten()
            .map(|s| worktreefs::lifecycle::cleanup::keep::KeepPolicy::of(&s))
            .unwrap_or_default();
        let pct = if total > 0 {
            free as f64 * 100.0 / total as f64
        } else {
            0.0
        };
        let low = pct < policy.min_free_percent || free < policy.min_free_bytes;
        out.push(check(
            "free-space",
            if low { CheckStatus::Warn } else { CheckStatus::Ok },
            format!(
                "{} free of {} ({pct:.0}%) where the state dir is",
                worktreefs::report::human_bytes(free),
                worktreefs::report::human_bytes(total)
            ),
            low.then(|| format!(
                "below the floor ({}% or {}): kept removals are given up first; free space, or `worktreefs du` for what uses it",
                policy.min_free_percent,
                worktreefs::report::human_bytes(policy.min_free_bytes)
            )),
        ));
    }
    Some(state)
}

/// worktreefs mounts whose daemon is gone (they answer ENOTCONN).
fn stale_mounts(out: &mut Vec<CheckJson>) {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let ours: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "fuse.worktreefs" || (f[2] == "fuse" && f[0] == "worktreefs")))
                .then(|| PathBuf::from(worktreefs::mounttable::unescape_mount_path(f[1])))
        })
        .collect();
    let dead: Vec<&PathBuf> = ours
        .iter()
        .filter(|m| {
            worktreefs::daemon::mountpoint::probe(m, None)
                == worktreefs::daemon::mountpoint::Liveness::Dead
        })
        .collect();
    if dead.is_empty() {
        out.push(check(
            "stale-mounts",
            CheckStatus::Ok,
            format!(
                "{} worktreefs mount(s), none left by a dead daemon",
                ours.len()
            ),
            None,
        ));
    } else {
        let list: Vec<String> = dead.iter().map(|m| m.display().to_string()).collect();
        out.push(check(
            "stale-mounts",
            CheckStatus::Fail,
            format!("left by a daemon that died: {}", list.join(", ")),
            Some(format!(
                "`worktreefs unmount` with that mount's state dir detaches it (or `umount -l {}`); the next mount finishes its cleanup",
                list[0]
            )),
        ));
    }
}

fn daemon(state: &StateDir, out: &mut Vec<CheckJson>) {
    let Some(d) = worktreefs::daemon::running_daemon(state) else {
        out.push(check(
            "daemon",
            CheckStatus::Ok,
            "not running for this state dir (start one with `worktreefs mount`)".into(),
            None,
        ));
        return;
    };
    if worktreefs::daemon::detached(state, &d) {
        out.push(check(
            "daemon",
            CheckStatus::Warn,
            worktreefs::daemon::detached_message(&d),
            Some(
                "it finishes once the processes inside have left; `worktreefs status` shows it"
                    .into(),
            ),
        ));
        return;
    }
    let stats = d.mountpoint.join(".control").join("stats");
    // Asked by a child process: a daemon that is stopped or hung never holds doctor.
    let answer = worktreefs::asked::read(&stats, ANSWER_TIMEOUT).map(|r| {
        r.map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(std::io::Error::from_raw_os_error)
    });
    match answer.ok_or(()) {
        Ok(Ok(text)) => {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            out.push(check(
                "daemon",
                CheckStatus::Ok,
                format!(
                    "pid {} serves {}: answers ({} inodes in use, passthrough {}, requests over {}{}, {})",
                    d.pid,
                    d.mountpoint.display(),
                    v["nodes"],
                    if v["passthrough"] == true {
                        "on"
                    } else {
                        "off"
                    },
                    v["transport"].as_str().unwrap_or("/dev/fuse"),
                    if v["yield_cpu"] == true && v["transport"] == "io_uring" {
                        " yielding the CPU to each caller"
                    } else {
                        ""
                    },
                    worktreefs::report::human_bytes(v["heap_in_use"].as_u64().unwrap_or(0))
                ),
                None,
            ));
        }
        Ok(Err(e)) => out.push(check(
            "daemon",
            CheckStatus::Fail,
            format!(
                "pid {} holds the state dir, but {} does not answer: {e}",
                d.pid,
                d.mountpoint.display()
            ),
            Some(format!(
                "see {}; `worktreefs unmount` and mount again",
                state.log_file().display()
            )),
        )),
        Err(_) => out.push(check(
            "daemon",
            CheckStatus::Fail,
            format!(
                "pid {} serves {}, which has not answered within {} s",
                d.pid,
                d.mountpoint.display(),
                ANSWER_TIMEOUT.as_secs()
            ),
            Some(format!(
                "see {}; a daemon stuck for good: `worktreefs unmount --lazy`, then end pid {}",
                state.log_file().display(),
                d.pid
            )),
        )),
    }
}

/// Creations whose process is gone (killed half-way): the next mount or creation of that
/// name rolls them back.
fn stale_creations(store: &Store, out: &mut Vec<CheckJson>) {
    let rows = store.creations().unwrap_or_default();
    let gone: Vec<String> = rows
        .iter()
        .filter(|c| {
            worktreefs::process::info::proc_info(c.pid).is_none_or(|p| p.start != c.pid_start)
        })
        .map(|c| format!("{} (pid {})", c.name, c.pid))
        .collect();
    if gone.is_empty() {
        out.push(check(
            "stale-locks",
            CheckStatus::Ok,
            format!(
                "{} creation(s) under way, none left by a process that died",
                rows.len()
            ),
            None,
        ));
    } else {
        out.push(check(
            "stale-locks",
            CheckStatus::Warn,
            format!("creations left by a process that died: {}", gone.join(", ")),
            Some("the next mount rolls them back (or a `worktreefs new` of that name)".into()),
        ));
    }
}

/// Each repository: there, and its config includes the fsmonitor settings of worktreefs'
/// worktrees (else `git status` there scans every file).
/// Branches worktrees were given whose names git forbids (made before names were
/// checked as git checks them: `HEAD` breaks `git rev-parse --abbrev-ref HEAD` in the
/// repository), each with the rename that mends it, which cleanup follows.
fn forbidden_branches(store: &Store, out: &mut Vec<CheckJson>) {
    let repos = store.repos().unwrap_or_default();
    for w in store.worktrees().unwrap_or_default() {
        if w.state == worktreefs::lease::State::Removed {
            continue;
        }
        let Some(b) = &w.branch else { continue };
        let Err(why) = worktreefs::names::validate_branch_name(b) else {
            continue;
        };
        let Some(r) = repos.iter().find(|r| r.id == w.repo_id) else {
            continue;
        };
        // Renamed already: cleanup follows it (and records the new name then).
        let admin = worktreefs::git::admin_dir(&r.gitdir, &w.admin_name);
        if worktreefs::git::renamed_branch(&r.gitdir, &admin, b).is_some() {
            continue;
        }
        let to = format!(
            "wt-{}",
            worktreefs::names::sanitize_name(&b.replace("..", "-").replace(".lock", "-lock"))
        )
        .trim_end_matches('.')
        .to_string();
        out.push(check(
            &format!("branch {}/{}", w.repo, w.name),
            CheckStatus::Warn,
            format!(
                "worktree {}/{} is on branch '{b}': {why} (with it, git in the repository misreads names such as HEAD)",
                w.repo, w.name
            ),
            Some(format!(
                "rename it: `git -C {} branch -m {} {}` (the worktree follows the rename)",
                worktreefs::report::shell_word(&r.path.display().to_string()),
                worktreefs::report::shell_word(b),
                worktreefs::report::shell_word(&to)
            )),
        ));
    }
}

fn repositories(store: &Store, out: &mut Vec<CheckJson>) {
    let repos = store.repos().unwrap_or_default();
    if repos.is_empty() {
        out.push(check(
            "repositories",
            CheckStatus::Ok,
            "none registered (`worktreefs repo add PATH`, or `worktreefs mount` inside one)".into(),
            None,
        ));
    }
    for r in repos {
        let name = format!("repo {}", r.name);
        if !r.gitdir.is_dir() {
            out.push(check(
                &name,
                CheckStatus::Fail,
                format!("its git directory {} is gone", r.gitdir.display()),
                Some(format!(
                    "put the repository back, or `worktreefs repo remove {}` once its worktrees are reclaimed",
                    r.name
                )),
            ));
            continue;
        }
        let key = format!(
            "includeif.gitdir:{}/worktrees/wtfs-*.path",
            r.gitdir.display()
        );
        let want = worktreefs::git::fsmonitor::include_path(&r.gitdir);
        let included = std::process::Command::new("git")
            .arg("config")
            .arg("--file")
            .arg(r.gitdir.join("config"))
            .arg("--get-all")
            .arg(&key)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| Path::new(l) == want)
            });
        if included && want.is_file() {
            out.push(check(
                &name,
                CheckStatus::Ok,
                format!(
                    "{}: its config includes {}",
                    r.path.display(),
                    want.display()
                ),
                None,
            ));
        } else {
            out.push(check(
                &name,
                CheckStatus::Warn,
                format!(
                    "{}/config does not include {} (`git status` in its worktrees scans every file)",
                    r.gitdir.display(),
                    want.display()
                ),
                Some("mount again: the daemon writes it at start".into()),
            ));
        }
    }
}
