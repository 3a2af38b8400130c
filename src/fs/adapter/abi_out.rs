//! Our values as the kernel's structures: attributes, entries, directory entry types.

use crate::fs::{Attr, Entry, FType};
use crate::fuse::abi;
use crate::fuse::reply::{secs_nsecs, valid};

/// The directory-entry type of a listing entry (`DT_*`, which is `S_IFMT >> 12`).
pub(super) fn dtype(k: FType) -> u32 {
    mode_type(k) >> 12
}

/// The file-type bits of a mode.
pub(super) fn mode_type(k: FType) -> u32 {
    match k {
        FType::Dir => libc::S_IFDIR,
        FType::File => libc::S_IFREG,
        FType::Symlink => libc::S_IFLNK,
        FType::Fifo => libc::S_IFIFO,
        FType::Socket => libc::S_IFSOCK,
        FType::CharDev => libc::S_IFCHR,
        FType::BlockDev => libc::S_IFBLK,
    }
}

pub(super) fn fattr(a: &Attr) -> abi::Attr {
    let (atime, atimensec) = secs_nsecs(a.atime);
    let (mtime, mtimensec) = secs_nsecs(a.mtime);
    let (ctime, ctimensec) = secs_nsecs(a.ctime);
    abi::Attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_type(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

pub(super) fn entry_out(e: &Entry) -> abi::EntryOut {
    let (secs, nsecs) = valid(e.ttl);
    abi::EntryOut {
        nodeid: e.attr.ino.0,
        generation: 0,
        entry_valid: secs,
        attr_valid: secs,
        entry_valid_nsec: nsecs,
        attr_valid_nsec: nsecs,
        attr: fattr(&e.attr),
    }
}

pub(super) fn attr_out(e: &Entry) -> abi::AttrOut {
    let (secs, nsecs) = valid(e.ttl);
    abi::AttrOut {
        attr_valid: secs,
        attr_valid_nsec: nsecs,
        dummy: 0,
        attr: fattr(&e.attr),
    }
}

/// An entry carrying only an inode number and a type: what the kernel reads of a negative
/// entry, and of a listing entry it does not link (`.`, `..`, or one declined with inode
/// 0). Its cache times are zero.
pub(super) fn bare_entry(ino: u64, kind: FType) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: ino,
        attr: abi::Attr {
            ino,
            mode: mode_type(kind),
            blksize: 4096,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ino::Ino;

    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn attributes_carry_type_and_permissions_in_the_mode() {
        let a = Attr {
            ino: Ino(5),
            size: 10,
            blocks: 1,
            atime: UNIX_EPOCH + Duration::new(1, 2),
            mtime: SystemTime::UNIX_EPOCH,
            ctime: UNIX_EPOCH + Duration::new(3, 4),
            kind: FType::Symlink,
            perm: 0o777,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
        };
        let f = fattr(&a);
        assert_eq!(f.mode, libc::S_IFLNK | 0o777);
        assert_eq!((f.atime, f.atimensec, f.ctime, f.ctimensec), (1, 2, 3, 4));
        assert_eq!(dtype(FType::Dir), libc::DT_DIR as u32);
        assert_eq!(dtype(FType::Fifo), libc::DT_FIFO as u32);
    }
}
