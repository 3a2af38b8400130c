//! The machine's other registries (root's for a user, every user's for root), whose
//! claims an allocation here keeps clear of, read without their lock and without opening
//! or following anything of another user's.

use std::fs;
use std::path::{Path, PathBuf};

use crate::store::PortBlock;

use super::registry::parse_claim_name;

/// Another user's registry (or root's), read to keep clear of its claims.
#[derive(Debug, Clone)]
pub(super) struct Foreign {
    /// A directory of the machine's (`/run/user/UID`, `/tmp`) on no FUSE mount ...
    base: PathBuf,
    /// ... and the registry below it, reached through no symlink and no mount.
    rel: String,
    /// Whose it is: a directory of anyone else's there is not read.
    uid: u32,
}

/// The other registries of this machine, whose claims an allocation here keeps clear of
/// (read without their lock, so two allocations at the same moment may meet): root's,
/// for a user; for root, every user's (`/run/user/UID/worktreefs/ports`, and
/// `worktreefs-ports-UID` in the temporary directory for each uid of the password file).
pub(super) fn other_registries(own: &Path) -> Vec<Foreign> {
    let mut out = vec![Foreign {
        base: PathBuf::from("/run"),
        rel: "worktreefs/ports".into(),
        uid: 0,
    }];
    if nix::unistd::geteuid().is_root() {
        for e in fs::read_dir("/run/user").into_iter().flatten().flatten() {
            if let Ok(uid) = e.file_name().to_string_lossy().parse() {
                out.push(Foreign {
                    base: e.path(),
                    rel: "worktreefs/ports".into(),
                    uid,
                });
            }
        }
        // Those of users without a runtime directory, by the uids of the password file
        // (not a listing of the temporary directory, which may be huge).
        let tmp = std::env::temp_dir();
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        for uid in passwd
            .lines()
            .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        {
            if uid != 0 {
                out.push(Foreign {
                    base: tmp.clone(),
                    rel: format!("worktreefs-ports-{uid}"),
                    uid,
                });
            }
        }
    }
    out.retain(|f| f.base.join(&f.rel) != own);
    out
}

/// How many ports one other user's registries may keep an allocation here from: a user
/// cannot make root's daemon give no ports by claiming the whole range (their stale
/// claims, of state directories since deleted, count too until that user allocates
/// again).
const FOREIGN_PORTS: u32 = 1000;

/// How many names of one other registry are read at most.
const FOREIGN_NAMES: usize = 4096;

/// The blocks the registries `regs` claim, as far as this user can read them: the names
/// of the claims (blocks of at most [`FOREIGN_PORTS`] ports, that many of each user's at
/// most) in a directory of the registry's owner that others may not write, reached from
/// a base on no FUSE mount through no symlink and no mount. Nothing of another user's is
/// opened or followed: their files may be FIFOs, their paths lead anywhere, their mounts
/// may hang.
pub(super) fn foreign_claims(regs: &[Foreign]) -> Vec<PortBlock> {
    use std::collections::HashMap;
    use std::os::fd::{AsFd, AsRawFd};
    let mut out = Vec::new();
    let mut counted: HashMap<u32, u32> = HashMap::new();
    for reg in regs {
        let Ok(base) = crate::beneath::open_real_dir(&reg.base) else {
            continue;
        };
        match crate::mounttable::fs_type_of_fd(base.as_raw_fd()) {
            Some(t) if !t.starts_with("fuse") => {}
            _ => {
                tracing::warn!(
                    "{} is on a FUSE mount (or one that cannot be told): its claims of ports are not read",
                    reg.base.display()
                );
                continue;
            }
        }
        let Ok(fd) = crate::beneath::open(
            base.as_fd(),
            reg.rel.as_bytes(),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        ) else {
            continue;
        };
        let Ok(st) = crate::beneath::fstat(fd.as_fd()) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR
            || st.st_mode & 0o022 != 0
            || st.st_uid != reg.uid
        {
            continue;
        }
        let names = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let mut blocks: Vec<PortBlock> = names
            .into_iter()
            .flatten()
            .take(FOREIGN_NAMES)
            .flatten()
            .filter_map(|e| parse_claim_name(&e.file_name().to_string_lossy()))
            .filter(|b| b.size > 0 && u32::from(b.size) <= FOREIGN_PORTS)
            .collect();
        blocks.sort_by_key(|b| b.first);
        let ports = counted.entry(reg.uid).or_default();
        for b in blocks {
            *ports += u32::from(b.size);
            if *ports > FOREIGN_PORTS {
                tracing::warn!(
                    "uid {}'s registries claim more than {FOREIGN_PORTS} ports: the rest are not kept clear of",
                    reg.uid
                );
                break;
            }
            out.push(b);
        }
    }
    out
}

/// `dir` as another user's registry, of this user's (for tests).
#[cfg(test)]
pub(super) fn of_this_user(dir: &Path) -> Foreign {
    Foreign {
        base: dir.parent().unwrap().to_path_buf(),
        rel: dir.file_name().unwrap().to_string_lossy().into_owned(),
        uid: nix::unistd::geteuid().as_raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At most `FOREIGN_PORTS` ports of each user's are read, in blocks of at most that,
    /// from a directory of the owner named that others may not write, reached through
    /// no symlink.
    #[test]
    fn claims_past_the_limit_or_where_others_may_write_are_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        // Past the limit nothing counts, across one user's registries: 150 blocks of 10
        // in two registries are 1,500 ports; one block of the whole range counts for
        // nothing.
        let (many, more) = (d.path().join("many"), d.path().join("more"));
        for (dir, from) in [(&many, 0u32), (&more, 100)] {
            fs::create_dir(dir).unwrap();
            for i in from..from + 75 {
                fs::write(dir.join(format!("{}-10", 50000 + i * 10)), "").unwrap();
            }
        }
        fs::write(many.join("1-65535"), "").unwrap();
        let seen = foreign_claims(&[of_this_user(&many), of_this_user(&more)]);
        assert_eq!(seen.len() as u32 * 10, FOREIGN_PORTS, "{seen:?}");
        assert!(seen.iter().all(|b| b.size == 10));
        // Another owner's than the one named, one anyone may write, one reached through
        // a symlink: not read.
        let wrong = Foreign {
            uid: 4242,
            ..of_this_user(&more)
        };
        assert!(foreign_claims(&[wrong]).is_empty());
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&more, &link).unwrap();
        assert!(foreign_claims(&[of_this_user(&link)]).is_empty());
        fs::set_permissions(&more, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(foreign_claims(&[of_this_user(&more)]).is_empty());
    }
}
