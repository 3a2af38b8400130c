//! The mount table as `/proc/self/mounts` shows it: what is mounted at a path, and the
//! kernel's escapes in its paths (a space is `\040`). A leaf.

use std::fs;
use std::path::Path;

/// The source and filesystem type mounted at `path`, if anything is.
pub fn mount_type(path: &Path) -> Option<(String, String)> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let want = path.to_string_lossy();
    // The last line for a path is the mount on top, the one a path lookup reaches.
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split_whitespace();
        let (src, target, fstype) = (f.next()?, f.next()?, f.next()?);
        (unescape_mount_path(target) == want).then(|| (src.to_string(), fstype.to_string()))
    })
}

/// The device (`MAJOR:MINOR`) of the mount on top at `path`, as
/// `/proc/self/mountinfo` gives it (each FUSE connection has one of its own), read
/// without touching the mount.
pub fn mount_device(path: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (dev, target) = (f.get(2)?, f.get(4)?);
        (unescape_mount_path(target) == want).then(|| dev.to_string())
    })
}

/// The mount a daemon made, as (path, device), once it is made: the daemon records it,
/// and what stops work for a mount that has gone asks it. Clones share one record.
#[derive(Debug, Clone, Default)]
pub struct OwnMount(std::sync::Arc<std::sync::OnceLock<(std::path::PathBuf, String)>>);

impl OwnMount {
    /// Records the mount made at `path`, of device `device` ([`mount_device`]).
    pub fn record(&self, path: &Path, device: String) {
        let _ = self.0.set((path.to_path_buf(), device));
    }

    /// Whether the mount at `path` is known to have gone, as one reading of the mount
    /// table says: the mount on top there is not the one recorded (another's, or none),
    /// or, with none recorded, nothing is mounted there. False when the table cannot be
    /// read, so a caller that stops work for a mount that has gone does not stop for want
    /// of `/proc`.
    pub fn gone(&self, path: &Path) -> bool {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return false;
        };
        let want = path.to_string_lossy();
        let top = info.lines().rev().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (dev, target) = (f.get(2)?, f.get(4)?);
            (unescape_mount_path(target) == want).then(|| dev.to_string())
        });
        match (self.0.get(), top) {
            (_, None) => true,
            (Some((p, dev)), Some(top)) if p == path => *dev != top,
            (_, Some(_)) => false,
        }
    }
}

/// Whether something is mounted at `path`.
pub fn is_mountpoint(path: &Path) -> bool {
    mount_type(path).is_some()
}

/// A path as the mount table writes it, unescaped (`\040` a space, `\011` a tab, `\012` a
/// newline, `\134` a backslash).
pub fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The filesystem type of the mount descriptor `fd` (of this process) is on, as
/// `/proc/self/fdinfo` and `/proc/self/mountinfo` say, read without touching the mount
/// (a FUSE mount whose daemon hangs is named, never asked).
pub fn fs_type_of_fd(fd: i32) -> Option<String> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    let id = info
        .lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))?
        .trim()
        .to_string();
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        if l.split_whitespace().next()? != id {
            return None;
        }
        let (_, after) = l.split_once(" - ")?;
        after.split_whitespace().next().map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path nothing is mounted at has no mount of this process's; one with a mount of
    /// another device on top than the one recorded has lost it; one never recorded and
    /// mounted has not.
    #[test]
    fn a_mount_of_another_device_on_top_is_not_this_processs_own() {
        let d = tempfile::tempdir().unwrap();
        let own = OwnMount::default();
        assert!(own.gone(d.path()));
        let proc_dev = mount_device(Path::new("/proc")).expect("/proc is mounted");
        assert!(!own.gone(Path::new("/proc")));
        own.clone()
            .record(Path::new("/proc"), format!("{proc_dev}-not"));
        assert!(own.gone(Path::new("/proc")), "a clone records for all");
        assert!(!own.gone(Path::new("/")));
        let mine = OwnMount::default();
        mine.record(Path::new("/proc"), proc_dev);
        assert!(!mine.gone(Path::new("/proc")));
        // And the file descriptor's filesystem is named without touching it.
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(fs_type_of_fd(f.as_raw_fd()).as_deref(), Some("proc"));
    }
}
