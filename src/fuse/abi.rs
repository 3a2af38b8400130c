//! The FUSE protocol's structures and numbers, as the kernel lays them out
//! (`include/uapi/linux/fuse.h`, protocol 7.x). Every structure is plain old data of fixed
//! layout; the tests check each size and offset against the kernel's own header where the
//! machine has one.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol's major version, and the newest minor version this side speaks.
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 40;

/// The oldest minor version served: Linux 4.20 (7.28) and later.
pub const OLDEST_MINOR_VERSION: u32 = 28;

/// The root directory's node id.
pub const ROOT_ID: u64 = 1;

/// The smallest buffer a read of `/dev/fuse` may be given.
pub const MIN_READ_BUFFER: usize = 8192;

/// Request opcodes (`enum fuse_opcode`).
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// Notification codes (`enum fuse_notify_code`), sent as a reply's error with unique 0.
pub mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
}

/// INIT flags: bits 0–31 travel in `flags`, 32–63 in `flags2` (with `INIT_EXT`).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `fuse_open_out.open_flags` bits.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_getattr_in.getattr_flags`: `fh` names an open handle.
pub const GETATTR_FH: u32 = 1 << 0;

/// `/dev/fuse` ioctls: `_IOR(229, 0, uint32_t)`, `_IOW(229, 1, struct fuse_backing_map)`,
/// `_IOW(229, 2, uint32_t)`.
pub mod ioc {
    const MAGIC: u64 = 229;
    const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
        (dir << 30) | (size << 16) | (MAGIC << 8) | nr
    }
    const WRITE: u64 = 1;
    const READ: u64 = 2;
    pub const CLONE: u64 = ioc(READ, 0, 4);
    pub const BACKING_OPEN: u64 = ioc(WRITE, 1, 16);
    pub const BACKING_CLOSE: u64 = ioc(WRITE, 2, 4);
}

/// Declares protocol structures: `#[repr(C)]`, readable from and writable as bytes.
macro_rules! abi {
    ($($(#[$m:meta])* pub struct $name:ident { $($field:ident: $ty:ty,)* })*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Debug, Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
            pub struct $name { $(pub $field: $ty,)* }
        )*
    };
}

abi! {
    pub struct InHeader {
        len: u32,
        opcode: u32,
        unique: u64,
        nodeid: u64,
        uid: u32,
        gid: u32,
        pid: u32,
        total_extlen: u16,
        padding: u16,
    }

    pub struct OutHeader {
        len: u32,
        error: i32,
        unique: u64,
    }

    pub struct Attr {
        ino: u64,
        size: u64,
        blocks: u64,
        atime: u64,
        mtime: u64,
        ctime: u64,
        atimensec: u32,
        mtimensec: u32,
        ctimensec: u32,
        mode: u32,
        nlink: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        blksize: u32,
        flags: u32,
    }

    pub struct EntryOut {
        nodeid: u64,
        generation: u64,
        entry_valid: u64,
        attr_valid: u64,
        entry_valid_nsec: u32,
        attr_valid_nsec: u32,
        attr: Attr,
    }

    pub struct AttrOut {
        attr_valid: u64,
        attr_valid_nsec: u32,
        dummy: u32,
        attr: Attr,
    }

    pub struct ForgetIn {
        nlookup: u64,
    }

    pub struct ForgetOne {
        nodeid: u64,
        nlookup: u64,
    }

    pub struct BatchForgetIn {
        count: u32,
        dummy: u32,
    }

    pub struct GetattrIn {
        getattr_flags: u32,
        dummy: u32,
        fh: u64,
    }

    pub struct MknodIn {
        mode: u32,
        rdev: u32,
        umask: u32,
        padding: u32,
    }

    pub struct MkdirIn {
        mode: u32,
        umask: u32,
    }

    pub struct RenameIn {
        newdir: u64,
    }

    pub struct Rename2In {
        newdir: u64,
        flags: u32,
        padding: u32,
    }

    pub struct LinkIn {
        oldnodeid: u64,
    }

    pub struct SetattrIn {
        valid: u32,
        padding: u32,
        fh: u64,
        size: u64,
        lock_owner: u64,
        atime: u64,
        mtime: u64,
        ctime: u64,
        atimensec: u32,
        mtimensec: u32,
        ctimensec: u32,
        mode: u32,
        unused4: u32,
        uid: u32,
        gid: u32,
        unused5: u32,
    }

    pub struct OpenIn {
        flags: u32,
        open_flags: u32,
    }

    pub struct CreateIn {
        flags: u32,
        mode: u32,
        umask: u32,
        open_flags: u32,
    }

    /// `padding` is `backing_id` from 7.40 on.
    pub struct OpenOut {
        fh: u64,
        open_flags: u32,
        backing_id: i32,
    }

    pub struct ReleaseIn {
        fh: u64,
        flags: u32,
        release_flags: u32,
        lock_owner: u64,
    }

    pub struct FlushIn {
        fh: u64,
        unused: u32,
        padding: u32,
        lock_owner: u64,
    }

    pub struct ReadIn {
        fh: u64,
        offset: u64,
        size: u32,
        read_flags: u32,
        lock_owner: u64,
        flags: u32,
        padding: u32,
    }

    pub struct WriteIn {
        fh: u64,
        offset: u64,
        size: u32,
        write_flags: u32,
        lock_owner: u64,
        flags: u32,
        padding: u32,
    }

    pub struct WriteOut {
        size: u32,
        padding: u32,
    }

    pub struct Kstatfs {
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
        padding: u32,
        spare: [u32; 6],
    }

    pub struct FsyncIn {
        fh: u64,
        fsync_flags: u32,
        padding: u32,
    }

    /// What a kernel sends without `SETXATTR_EXT` is its first 8 bytes.
    pub struct SetxattrIn {
        size: u32,
        flags: u32,
        setxattr_flags: u32,
        padding: u32,
    }

    pub struct GetxattrIn {
        size: u32,
        padding: u32,
    }

    pub struct GetxattrOut {
        size: u32,
        padding: u32,
    }

    pub struct AccessIn {
        mask: u32,
        padding: u32,
    }

    /// A kernel before 7.36 sends its first 16 bytes.
    pub struct InitIn {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
        flags2: u32,
        unused: [u32; 11],
    }

    /// `unused[0]` is `max_stack_depth` from 7.40 on.
    pub struct InitOut {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
        max_background: u16,
        congestion_threshold: u16,
        max_write: u32,
        time_gran: u32,
        max_pages: u16,
        map_alignment: u16,
        flags2: u32,
        max_stack_depth: u32,
        unused: [u32; 6],
    }

    pub struct InterruptIn {
        unique: u64,
    }

    pub struct IoctlIn {
        fh: u64,
        flags: u32,
        cmd: u32,
        arg: u64,
        in_size: u32,
        out_size: u32,
    }

    pub struct FallocateIn {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
        padding: u32,
    }

    pub struct LseekIn {
        fh: u64,
        offset: u64,
        whence: u32,
        padding: u32,
    }

    pub struct LseekOut {
        offset: u64,
    }

    pub struct CopyFileRangeIn {
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    }

    /// A listing entry's fixed part; the name follows, padded to 8 bytes.
    pub struct Dirent {
        ino: u64,
        off: u64,
        namelen: u32,
        typ: u32,
    }

    pub struct NotifyInvalInodeOut {
        ino: u64,
        off: i64,
        len: i64,
    }

    pub struct NotifyInvalEntryOut {
        parent: u64,
        namelen: u32,
        flags: u32,
    }

    pub struct BackingMap {
        fd: i32,
        flags: u32,
        padding: u64,
    }
}

/// A listing entry's length with its name, padded to 8 bytes (`FUSE_DIRENT_SIZE`).
pub const fn dirent_size(namelen: usize) -> usize {
    (std::mem::size_of::<Dirent>() + namelen + 7) & !7
}

/// A READDIRPLUS entry's length with its name (`FUSE_DIRENTPLUS_SIZE`).
pub const fn direntplus_size(namelen: usize) -> usize {
    (std::mem::size_of::<EntryOut>() + std::mem::size_of::<Dirent>() + namelen + 7) & !7
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets as this module lays them out, checked against the kernel's header
    /// by [`the_layouts_are_the_kernels`] (and against the sizes the protocol documents
    /// where no header is at hand).
    fn ours() -> Vec<(&'static str, usize)> {
        macro_rules! s {
            ($t:ty, $c:literal) => {
                (concat!("sizeof(struct ", $c, ")"), size_of::<$t>())
            };
        }
        macro_rules! o {
            ($t:ty, $c:literal, $f:ident, $cf:literal) => {
                (
                    concat!("offsetof(struct ", $c, ", ", $cf, ")"),
                    offset_of!($t, $f),
                )
            };
        }
        vec![
            s!(InHeader, "fuse_in_header"),
            o!(InHeader, "fuse_in_header", pid, "pid"),
            o!(InHeader, "fuse_in_header", total_extlen, "total_extlen"),
            s!(OutHeader, "fuse_out_header"),
            s!(Attr, "fuse_attr"),
            o!(Attr, "fuse_attr", atimensec, "atimensec"),
            o!(Attr, "fuse_attr", flags, "flags"),
            s!(EntryOut, "fuse_entry_out"),
            o!(EntryOut, "fuse_entry_out", attr, "attr"),
            s!(AttrOut, "fuse_attr_out"),
            o!(AttrOut, "fuse_attr_out", attr, "attr"),
            s!(ForgetIn, "fuse_forget_in"),
            s!(ForgetOne, "fuse_forget_one"),
            s!(BatchForgetIn, "fuse_batch_forget_in"),
            s!(GetattrIn, "fuse_getattr_in"),
            s!(MknodIn, "fuse_mknod_in"),
            s!(MkdirIn, "fuse_mkdir_in"),
            s!(RenameIn, "fuse_rename_in"),
            s!(Rename2In, "fuse_rename2_in"),
            s!(LinkIn, "fuse_link_in"),
            s!(SetattrIn, "fuse_setattr_in"),
            o!(SetattrIn, "fuse_setattr_in", atimensec, "atimensec"),
            o!(SetattrIn, "fuse_setattr_in", uid, "uid"),
            s!(OpenIn, "fuse_open_in"),
            s!(CreateIn, "fuse_create_in"),
            s!(OpenOut, "fuse_open_out"),
            o!(OpenOut, "fuse_open_out", backing_id, "padding"),
            s!(ReleaseIn, "fuse_release_in"),
            s!(FlushIn, "fuse_flush_in"),
            s!(ReadIn, "fuse_read_in"),
            s!(WriteIn, "fuse_write_in"),
            s!(WriteOut, "fuse_write_out"),
            s!(Kstatfs, "fuse_kstatfs"),
            s!(FsyncIn, "fuse_fsync_in"),
            s!(SetxattrIn, "fuse_setxattr_in"),
            s!(GetxattrIn, "fuse_getxattr_in"),
            s!(GetxattrOut, "fuse_getxattr_out"),
            s!(AccessIn, "fuse_access_in"),
            s!(InitIn, "fuse_init_in"),
            o!(InitIn, "fuse_init_in", flags2, "flags2"),
            s!(InitOut, "fuse_init_out"),
            o!(InitOut, "fuse_init_out", max_pages, "max_pages"),
            o!(InitOut, "fuse_init_out", flags2, "flags2"),
            o!(InitOut, "fuse_init_out", max_stack_depth, "unused"),
            s!(InterruptIn, "fuse_interrupt_in"),
            s!(IoctlIn, "fuse_ioctl_in"),
            s!(FallocateIn, "fuse_fallocate_in"),
            s!(LseekIn, "fuse_lseek_in"),
            s!(LseekOut, "fuse_lseek_out"),
            s!(CopyFileRangeIn, "fuse_copy_file_range_in"),
            s!(Dirent, "fuse_dirent"),
            s!(NotifyInvalInodeOut, "fuse_notify_inval_inode_out"),
            s!(NotifyInvalEntryOut, "fuse_notify_inval_entry_out"),
        ]
    }

    /// The kernel's header, where the machine has one (Debian: linux-libc-dev).
    const HEADER: &str = "/usr/include/linux/fuse.h";

    /// Every size and offset above is what a C compiler makes of the kernel's own header.
    #[test]
    fn the_layouts_are_the_kernels() {
        let cc = ["cc", "gcc"].into_iter().find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok()
        });
        let (Some(cc), true) = (cc, std::path::Path::new(HEADER).exists()) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI has a C compiler and {HEADER}"
            );
            eprintln!("not checked: no C compiler or no {HEADER}");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let ours = ours();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <linux/fuse.h>\nint main(void) {\n",
        );
        for (expr, _) in &ours {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        c.push_str("  return 0;\n}\n");
        let src = dir.path().join("sizes.c");
        let bin = dir.path().join("sizes");
        std::fs::write(&src, c).unwrap();
        let out = std::process::Command::new(cc)
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new(&bin).output().unwrap();
        let theirs: Vec<usize> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(theirs.len(), ours.len());
        for ((expr, mine), kernel) in ours.iter().zip(theirs) {
            assert_eq!(*mine, kernel, "{expr}");
        }
    }

    /// The structures newer than some headers, at the sizes the protocol gives them.
    #[test]
    fn the_newer_structures_have_the_protocols_sizes() {
        assert_eq!(size_of::<BackingMap>(), 16);
        assert_eq!(ioc::CLONE, 0x8004_e500);
        assert_eq!(ioc::BACKING_OPEN, 0x4010_e501);
        assert_eq!(ioc::BACKING_CLOSE, 0x4004_e502);
        assert_eq!(dirent_size(1), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
        assert_eq!(direntplus_size(1), 128 + 32);
    }
}
