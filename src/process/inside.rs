//! Whether a process is inside a directory: its working directory, root, program, an
//! open file or a mapping below it, read from `/proc/<pid>/`.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::info::command_line;

/// Whether process `pid` is inside `dir`: its working directory, an open file, or a
/// shared writable mapping of a file below it (its stores reach the file with no
/// descriptor open and no request the daemon sees; the kernel names the file by its
/// path in the mount, with passthrough too).
pub fn is_inside(pid: i32, dir: &Path) -> bool {
    // A link too long to read back that leads into the same filesystem counts: better
    // named among the processes inside than taken for gone.
    let counts = |l: Link| matches!(l, Link::Below | Link::Unnamed);
    // Its working directory, its root (chroot), the program it runs.
    if ["cwd", "root", "exe"]
        .iter()
        .any(|l| counts(link(&format!("/proc/{pid}/{l}"), dir)))
    {
        return true;
    }
    let open_below = match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(rd) => rd
            .flatten()
            .any(|e| counts(link(&e.path().to_string_lossy(), dir))),
        Err(_) => false,
    };
    open_below
        || fs::read(format!("/proc/{pid}/maps"))
            .is_ok_and(|maps| maps.split(|b| *b == b'\n').any(|l| maps_below(l, dir)))
}

/// Where a `/proc` link (`cwd`, `root`, `exe`, `fd/N`) leads, as far as `dir` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Below,
    /// Elsewhere, or gone (the process exited, the descriptor was closed).
    Elsewhere,
    /// Not readable to this process (another user's, hidepid, an LSM).
    Denied,
    /// It leads into `dir`'s filesystem but cannot be named: a path longer than PATH_MAX
    /// (ENAMETOOLONG), which a process reaches by `cd`-ing deeper and deeper.
    Unnamed,
}

fn link(path: &str, dir: &Path) -> Link {
    use std::os::unix::fs::MetadataExt;
    match fs::read_link(path) {
        Ok(p) if p.starts_with(dir) => Link::Below,
        Ok(_) => Link::Elsewhere,
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) => Link::Elsewhere,
            Some(libc::EACCES) | Some(libc::EPERM) => Link::Denied,
            // Followed rather than read (stat needs no name): the same filesystem as
            // `dir` may be inside it.
            _ => match (fs::metadata(path), fs::metadata(dir)) {
                (Ok(a), Ok(b)) if a.dev() != b.dev() => Link::Elsewhere,
                _ => Link::Unnamed,
            },
        },
    }
}
/// Whether the `/proc/<pid>/maps` line `line` maps a file below `dir` (a shared library
/// or program built there, a file mapped for reading or writing).
fn maps_below(line: &[u8], dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // `address perms offset dev inode path`: the path is what follows the fifth field.
    let mut rest = line;
    for _ in 0..5 {
        let start = rest.iter().position(|b| *b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
        rest = &rest[end..];
    }
    let path = rest.trim_ascii_start();
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    path.is_absolute() && path.starts_with(dir)
}

/// Whether process `pid` is inside `dir`, as [`is_inside`], when that can be told: None
/// when it cannot — its `/proc` entries are not readable to this process (another user's
/// without root, hidepid, an LSM), or it lives in another mount namespace (its paths are
/// not the daemon's: a container with the worktree bind-mounted). Gone: not inside.
fn inside_or_unknown(pid: i32, dir: &Path) -> Option<bool> {
    let ns = |p: &str| fs::read_link(format!("/proc/{p}/ns/mnt"));
    match (ns("self"), ns(&pid.to_string())) {
        (Ok(a), Ok(b)) if a == b => {}
        (_, Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => return Some(false),
        _ => return None,
    }
    let denied =
        |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM));
    // A link that cannot be told (unreadable, or too long to name) makes the answer
    // unknown unless another one is inside.
    let mut unknown = false;
    for l in ["cwd", "root", "exe"] {
        match link(&format!("/proc/{pid}/{l}"), dir) {
            Link::Below => return Some(true),
            Link::Elsewhere => {}
            Link::Denied | Link::Unnamed => unknown = true,
        }
    }
    match fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(rd) => {
            for e in rd.flatten() {
                match link(&e.path().to_string_lossy(), dir) {
                    Link::Below => return Some(true),
                    Link::Elsewhere => {}
                    Link::Denied | Link::Unnamed => unknown = true,
                }
            }
        }
        Err(e) if denied(&e) => return None,
        Err(_) if unknown => return None,
        Err(_) => return Some(false),
    }
    match fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) if maps.split(|b| *b == b'\n').any(|l| maps_below(l, dir)) => Some(true),
        Ok(_) if unknown => None,
        Ok(_) => Some(false),
        Err(e) if denied(&e) => None,
        Err(_) if unknown => None,
        Err(_) => Some(false),
    }
}

/// Whether process `pid` or any of its descendants is inside `dir` (as [`is_inside`]:
/// working directory, root, program, open file, mapping). The tree is read from
/// `/proc/<pid>/task/*/children`. None when it cannot be told: that file does not exist
/// (a kernel without `CONFIG_PROC_CHILDREN`), or a process of the tree cannot be read or
/// lives in another mount namespace; the caller then keeps what it has.
pub fn tree_inside(pid: i32, dir: &Path) -> Option<bool> {
    let mut stack = vec![pid];
    let mut seen = HashSet::new();
    while let Some(p) = stack.pop() {
        if !seen.insert(p) || seen.len() > 65536 {
            continue;
        }
        if inside_or_unknown(p, dir)? {
            return Some(true);
        }
        let tasks = match fs::read_dir(format!("/proc/{p}/task")) {
            Ok(t) => t,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // Exited meanwhile: its children (if any) were reparented, out of this
                // tree.
                continue;
            }
            Err(_) => return None,
        };
        for t in tasks.flatten() {
            match fs::read_to_string(t.path().join("children")) {
                Ok(c) => stack.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if t.path().exists() {
                        return None; // no such file on this kernel
                    }
                }
                Err(_) => return None,
            }
        }
    }
    Some(false)
}

/// The file a `/proc/<pid>/maps` line (`address perms offset dev inode path`, the path
/// padded with spaces) maps shared and writable, when it is below `dir`.
pub fn shared_writable_below(line: &[u8], dir: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut rest = line;
    let mut fields = [&b""[..]; 5];
    for f in &mut fields {
        let start = rest.iter().position(|b| *b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
        *f = &rest[..end];
        rest = &rest[end..];
    }
    let perms = fields[1];
    if perms.len() < 4 || perms[1] != b'w' || perms[3] != b's' {
        return None;
    }
    let path = rest.trim_ascii_start();
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    (path.is_absolute() && path.starts_with(dir)).then(|| path.to_path_buf())
}

/// Every process with a file below `dir` open for writing (a descriptor opened to write,
/// or a shared writable mapping), lowest pid first, each with that file's path; `skip`
/// says which processes are not asked about.
pub fn writers_below(dir: &Path, skip: impl Fn(i32) -> bool) -> Vec<(i32, PathBuf)> {
    let mut out = Vec::new();
    let mut pids: Vec<i32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != std::process::id() as i32 && !skip(*pid))
        .collect();
    pids.sort();
    for pid in pids {
        if let Some(p) = writing_below(pid, dir) {
            out.push((pid, p));
        }
    }
    out
}

/// The first file below `dir` process `pid` has open for writing, if any.
fn writing_below(pid: i32, dir: &Path) -> Option<PathBuf> {
    for e in fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(target) = fs::read_link(e.path()) else {
            continue;
        };
        if !target.starts_with(dir) {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
            .unwrap_or(0);
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Some(target);
        }
    }
    let maps = fs::read(format!("/proc/{pid}/maps")).ok()?;
    maps.split(|b| *b == b'\n')
        .find_map(|l| shared_writable_below(l, dir))
}

/// Every live process inside `dir`, lowest pid first, except `skip`.
pub fn processes_inside(dir: &Path, skip: i32) -> Vec<i32> {
    let mut out: Vec<i32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != skip && *pid != std::process::id() as i32)
        .filter(|pid| is_inside(*pid, dir))
        .collect();
    out.sort();
    out
}

/// Where process `pid` is inside `dir`, as [`is_inside`] tells it: the first path below
/// `dir` it has (working directory, root, program, open file, mapping) and which it is.
pub fn inside_where(pid: i32, dir: &Path) -> Option<(PathBuf, &'static str)> {
    let below = |l: &str| fs::read_link(l).ok().filter(|p| p.starts_with(dir));
    for (l, how) in [
        ("cwd", "working directory"),
        ("root", "root directory"),
        ("exe", "program"),
    ] {
        if let Some(p) = below(&format!("/proc/{pid}/{l}")) {
            return Some((p, how));
        }
    }
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            if let Some(p) = below(&e.path().to_string_lossy()) {
                return Some((p, "open file"));
            }
        }
    }
    let maps = fs::read(format!("/proc/{pid}/maps")).ok()?;
    maps.split(|b| *b == b'\n').find_map(|line| {
        use std::os::unix::ffi::OsStrExt;
        let at = line.iter().position(|b| *b == b'/')?;
        let path = &line[at..];
        let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
        let path = Path::new(std::ffi::OsStr::from_bytes(path));
        (maps_below(line, dir)).then(|| (path.to_path_buf(), "mapped file"))
    })
}

/// Every process inside the mount at `mountpoint` (but this one), with the worktree it
/// is in (`REPO/WT`, or the mount's own top or a repository's directory as `REPO/` and
/// `/`) and how: one pass over `/proc`, for `list` and `unmount`.
pub fn processes_in_worktrees(mountpoint: &Path) -> Vec<(i32, String, &'static str)> {
    let me = std::process::id() as i32;
    let mut out: Vec<(i32, String, &'static str)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let Some((path, how)) = inside_where(pid, mountpoint) else {
                // Inside by a path too long to read back: counted, its place unknown.
                return is_inside(pid, mountpoint).then_some((
                    pid,
                    "?".to_string(),
                    "a path too long to name",
                ));
            };
            let rel = path.strip_prefix(mountpoint).ok()?;
            let parts: Vec<String> = rel
                .components()
                .take(2)
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let place = match parts.as_slice() {
                [] => "/".to_string(),
                [repo] => format!("{repo}/"),
                [repo, wt, ..] => format!("{repo}/{wt}"),
            };
            Some((pid, place, how))
        })
        .collect();
    out.sort();
    out
}

/// The processes inside `dir`, as "pid (command line)", for messages that name them.
pub fn describe_processes_inside(dir: &Path) -> Vec<String> {
    processes_inside(dir, 0)
        .into_iter()
        .map(|pid| format!("{pid} ({})", command_line(pid).unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_below_are_inside_and_shared_writable_ones_are_writers() {
        let dir = Path::new("/mnt/repo/wt");
        let line = |perms: &str, path: &str| {
            format!("7ff543199000-7ff54319a000 {perms} 00000000 00:28 8115940858                 {path}")
        };
        let writes = |l: String| shared_writable_below(l.as_bytes(), dir).is_some();
        assert!(writes(line("rw-s", "/mnt/repo/wt/a b.txt")));
        assert_eq!(
            shared_writable_below(line("rw-s", "/mnt/repo/wt/x (deleted)").as_bytes(), dir),
            Some(PathBuf::from("/mnt/repo/wt/x"))
        );
        for (perms, path) in [
            ("r--s", "/mnt/repo/wt/a"),
            ("rw-p", "/mnt/repo/wt/a"),
            ("rw-s", "/mnt/repo/wt2/a"),
            ("rw-s", "/mnt/repo/other"),
            ("rw-s", ""),
        ] {
            assert!(!writes(line(perms, path)), "{perms} {path}");
        }
        assert!(shared_writable_below(b"", dir).is_none());
        // Any mapping of a file below is inside (a program or library built there).
        for (perms, path, inside) in [
            ("r-xp", "/mnt/repo/wt/target/debug/app", true),
            ("r--p", "/mnt/repo/wt/lib.so (deleted)", true),
            ("rw-s", "/mnt/repo/wt/a b.txt", true),
            ("r-xp", "/usr/lib/libc.so.6", false),
            ("rw-p", "", false),
            ("rw-p", "[heap]", false),
            ("r-xp", "/mnt/repo/wt2/app", false),
        ] {
            assert_eq!(
                maps_below(line(perms, path).as_bytes(), dir),
                inside,
                "{path}"
            );
        }
    }

    #[test]
    fn a_process_tree_is_inside_while_a_descendant_is() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap();
        // sh (outside) -> sh -> sleep, the grandchild's working directory inside.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "(cd '{}' && exec sleep 5) & wait",
                inside.display()
            ))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tree_inside(pid, &inside) != Some(true) {
            assert!(
                std::time::Instant::now() < end,
                "the grandchild is never seen inside"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!is_inside(pid, &inside), "the shell itself is outside");
        child.kill().unwrap();
        child.wait().unwrap();
        // A tree of this test's own (not this process's, whose children include other
        // tests' short-lived processes, one of which may exit mid-walk: None).
        let mut outside = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let outside_pid = outside.id() as i32;
        let found = tree_inside(outside_pid, Path::new("/nonexistent/dir"));
        outside.kill().unwrap();
        outside.wait().unwrap();
        assert_eq!(found, Some(false));
    }

    #[test]
    fn inside_follows_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // The child's cwd is set before exec; allow it a moment to appear.
        let mut seen = false;
        for _ in 0..50 {
            if is_inside(pid, dir.path()) {
                seen = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let listed = processes_inside(dir.path(), 0);
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen);
        assert!(listed.contains(&pid));
    }

    /// A working directory deeper than PATH_MAX cannot be read back from /proc (ENAMETOOLONG):
    /// such a process is not taken for one outside (last close would end its lease and
    /// cleanup remove the worktree under it).
    #[test]
    fn a_working_directory_too_deep_to_name_is_not_taken_for_outside() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("in");
        std::fs::create_dir(&inside).unwrap();
        // 60 levels of 100-byte names, made and opened one below the other (relative to
        // a descriptor: no path that long is ever spelled), then the child's cwd.
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let name = "d".repeat(100);
        let open = |at: libc::c_int, n: &str| -> OwnedFd {
            let c = std::ffi::CString::new(n).unwrap();
            // SAFETY: openat on a NUL-terminated name.
            let fd = unsafe { libc::openat(at, c.as_ptr(), libc::O_DIRECTORY | libc::O_CLOEXEC) };
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            // SAFETY: just opened, ours.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let mut fd = open(libc::AT_FDCWD, inside.to_str().unwrap());
        let c = std::ffi::CString::new(name.as_str()).unwrap();
        for _ in 0..60 {
            // SAFETY: mkdirat on a NUL-terminated name.
            assert_eq!(
                unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o755) },
                0
            );
            fd = open(fd.as_raw_fd(), &name);
        }
        let deep = fd.as_raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("10");
        // SAFETY: fchdir is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fchdir(deep) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(fd);
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let named = std::fs::read_link(format!("/proc/{pid}/cwd"));
        let inside_now = inside_or_unknown(pid, &inside);
        let tree = tree_inside(pid, &inside);
        let listed = is_inside(pid, &inside);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            named.is_err(),
            "the kernel named a path deeper than PATH_MAX"
        );
        assert_ne!(inside_now, Some(false));
        assert_ne!(tree, Some(false));
        assert!(listed, "listed among the processes inside");
    }
}
