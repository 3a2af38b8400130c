//! Whether this user can mount a FUSE filesystem here, and how: the one answer that
//! `mount` checks before it starts a daemon and `doctor` reports, so doctor fails exactly
//! where a mount would, with the same way out.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// How a mount is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// This user opens the device and mounts (root).
    Direct,
    /// Through fusermount3, the fuse3 package's setuid helper (a user who may not mount).
    Fusermount(PathBuf),
}

/// Why a mount cannot be made here, and the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub detail: String,
    pub fix: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.detail, self.fix)
    }
}

/// The FUSE device: the kernel's `/dev/fuse`, or `$WORKTREEFS_FUSE_DEVICE` (for tests of
/// the refusals).
pub fn device() -> PathBuf {
    std::env::var_os("WORKTREEFS_FUSE_DEVICE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/fuse"))
}

/// How this user mounts, with what was found (for doctor), or why it cannot.
pub fn check() -> Result<(Access, String), Refused> {
    let dev = device();
    let refused = |detail: String, fix: &str| Refused {
        detail,
        fix: fix.to_string(),
    };
    let meta = std::fs::metadata(&dev).map_err(|e| {
        refused(
            format!(
                "{} is missing ({e}): the fuse kernel module is not loaded, or this container was started without access to it",
                dev.display()
            ),
            "load the module (`modprobe fuse`), or in a container pass the device (`--device /dev/fuse`)",
        )
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev);
    // Mounting needs CAP_SYS_ADMIN (root): without it, a mount goes through fusermount3
    // whatever the device's mode (a distribution's /dev/fuse is often 0666).
    let may_mount = crate::fs::adapter::has_cap_sys_admin();
    let why_not = match opened {
        Ok(_) if !meta.file_type().is_char_device() => {
            return Err(refused(
                format!("{} is not a character device", dev.display()),
                "remove it and load the module again (`modprobe -r fuse; modprobe fuse`)",
            ))
        }
        Ok(_) if may_mount => {
            return Ok((
                Access::Direct,
                format!(
                    "{} (mode {mode:o}) opens for reading and writing, and this user may mount",
                    dev.display()
                ),
            ))
        }
        Ok(_) => "may not mount FUSE filesystems itself (that needs root)".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            format!("may not open {} ({e})", dev.display())
        }
        Err(e) => {
            return Err(refused(
                format!("{} does not open for FUSE: {e}", dev.display()),
                "worktreefs needs permission to use FUSE through it (the FUSE character device, 10:229): a security module or the container's device rules refuse it; allow the device (`--device /dev/fuse`)",
            ))
        }
    };
    let uid = nix::unistd::geteuid();
    let Some(bin) = crate::fs::mount::fusermount_bin() else {
        return Err(refused(
            format!(
                "this user (uid {uid}) {why_not}, and fusermount3 is not installed to do it on its behalf"
            ),
            "install it (`apt-get install fuse3` on Debian and Ubuntu, `dnf install fuse3` on Fedora), or mount as root; without root the daemon has no FUSE passthrough and cannot give files to other users",
        ));
    };
    let setuid =
        std::fs::metadata(&bin).is_ok_and(|m| m.uid() == 0 && m.permissions().mode() & 0o4000 != 0);
    if !setuid && !may_mount {
        return Err(Refused {
            detail: format!(
                "this user (uid {uid}) {why_not}, and {} is not setuid root, so it cannot mount on its behalf",
                bin.display()
            ),
            fix: format!(
                "reinstall fuse3, or `chmod u+s {}` as root; or mount as root",
                bin.display()
            ),
        });
    }
    Ok((
        Access::Fusermount(bin.clone()),
        format!(
            "this user (uid {uid}) {why_not}: mounts go through {}",
            bin.display()
        ),
    ))
}
