//! A user who is not root: mounts through fusermount3 (the setuid helper of the fuse3
//! package) when it is installed, with no FUSE passthrough; without it the mount is
//! refused, naming what is missing, and leaves no registration behind.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::common::*;

/// /dev/fuse open to users while the test runs (mode 0666, as distributions make it and
/// fusermount3 needs), its mode put back however the test ends.
struct DevFuseOpen(Option<u32>);

impl DevFuseOpen {
    fn new() -> DevFuseOpen {
        let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
        if mode & 0o006 == 0o006 {
            return DevFuseOpen(None);
        }
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        DevFuseOpen(Some(mode))
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        if let Some(mode) = self.0 {
            let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode));
        }
    }
}

/// Unmounted as nobody, then detached by root if still there, however the test ends.
struct NobodyMount(PathBuf, PathBuf);

impl Drop for NobodyMount {
    fn drop(&mut self) {
        if is_mounted(&self.1) {
            let _ = as_nobody(&self.0, "HOME=$PWD timeout 60 \"$BIN\" unmount");
        }
        if is_mounted(&self.1) {
            detach(&self.1);
        }
    }
}

fn fusermount3() -> Option<PathBuf> {
    ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

#[test]
fn a_user_who_is_not_root_mounts_through_fusermount3_or_is_told_what_is_missing() {
    let Some(_) = fusermount3() else {
        eprintln!("skipped: fusermount3 is not installed (apt-get install fuse3; .ci/run does)");
        return;
    };
    let top = tempfile::tempdir().unwrap();
    fs::set_permissions(top.path(), fs::Permissions::from_mode(0o711)).unwrap();
    // nobody's home: its repository, state directory and mountpoint.
    let home = top.path().join("home");
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    let sh = |script: &str| {
        let o = as_nobody(
            &home,
            &format!("export HOME=$PWD BIN={BIN} GIT_CONFIG_NOSYSTEM=1; {script}"),
        );
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, _, err) = sh("git init -q -b main repo && cd repo && echo hello > README.md && git add . && git -c user.name=n -c user.email=n@x commit -qm one");
    assert_eq!(code, Some(0), "{err}");
    let mnt = home.join(".local/state/worktreefs-mnt");
    let _guard = NobodyMount(home.clone(), mnt.clone());
    let _open = DevFuseOpen::new();

    // Without fusermount3: refused, naming it and how to get it; nothing registered.
    let (code, _, err) =
        sh("cd repo && WORKTREEFS_FUSERMOUNT=/nonexistent timeout 60 \"$BIN\" mount");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("fusermount3 is not installed") && err.contains("apt-get install fuse3"),
        "{err}"
    );
    let (_, repos, _) = sh("timeout 60 \"$BIN\" repo list");
    assert_eq!(repos.trim(), "", "a failed mount left a registration");
    // doctor fails there too, with the same way out as the mount's.
    let (code, out, err) =
        sh("WORKTREEFS_FUSERMOUNT=/nonexistent timeout 60 \"$BIN\" doctor --json");
    assert_eq!(code, Some(1), "{out}{err}");
    let checks: serde_json::Value = serde_json::from_str(&out).unwrap();
    let device = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "fuse-device")
        .unwrap();
    assert_eq!(device["status"], "fail", "{device}");
    let fix = device["fix"].as_str().unwrap();
    assert!(err.is_empty() || !err.contains("panicked"), "{err}");
    let (_, _, mount_err) =
        sh("cd repo && WORKTREEFS_FUSERMOUNT=/nonexistent timeout 60 \"$BIN\" mount");
    assert!(
        mount_err.contains(fix),
        "doctor's fix {fix:?} is not the mount's: {mount_err}"
    );
    assert!(!is_mounted(&mnt));

    // With it: mounted as nobody's, type fuse.worktreefs; worktrees work; no passthrough.
    let (code, out, err) = sh("cd repo && timeout 60 \"$BIN\" mount");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(is_mounted(&mnt), "{out}{err}");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == mnt.to_str())
        .unwrap();
    assert!(
        line.contains(" fuse.worktreefs ") && line.contains("user_id=65534"),
        "{line}"
    );
    let (code, out, err) = sh("timeout 60 \"$BIN\" new repo/t && cat .local/state/worktreefs-mnt/repo/t/README.md && cd .local/state/worktreefs-mnt/repo/t && echo change >> README.md && git status --porcelain");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("hello\n") && out.contains(" M README.md"),
        "{out}"
    );
    let log = fs::read_to_string(home.join(".local/state/worktreefs/daemon.log")).unwrap();
    assert!(
        log.contains("FUSE passthrough: off (the daemon lacks CAP_SYS_ADMIN"),
        "{log}"
    );
    let (code, out, err) = sh("timeout 60 \"$BIN\" unmount");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!is_mounted(&mnt));
}
