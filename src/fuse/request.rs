//! A request as the kernel sends it, decoded into one form whatever carried it (a read
//! of `/dev/fuse`, or an io_uring entry's header and payload): the header's identity of
//! the caller, and the operation with its arguments, borrowed from the buffer.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use zerocopy::FromBytes;

use super::abi::{self, opcode};

/// Who asks, and about which node.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub unique: u64,
    pub opcode: u32,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A time `setattr` sets: a given one, or the moment the request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(std::time::SystemTime),
}

/// What `setattr` changes (None: left as it is).
#[derive(Debug, Clone, Copy, Default)]
pub struct SetattrArgs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub fh: Option<u64>,
}

/// One operation and its arguments.
#[derive(Debug)]
pub enum Op<'a> {
    Init(abi::InitIn),
    Destroy,
    Interrupt {
        unique: u64,
    },
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget(Vec<abi::ForgetOne>),
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrArgs),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        name: &'a OsStr,
        newdir: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: u32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        fh: u64,
    },
    Opendir {
        flags: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir {
        fh: u64,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: u32,
    },
    /// An `O_TMPFILE` open: a file with no name in the directory, answered as a create.
    Tmpfile {
        mode: u32,
        umask: u32,
        flags: u32,
    },
    Ioctl,
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    CopyFileRange(abi::CopyFileRangeIn),
    /// An operation this side does not serve (its opcode): answered ENOSYS.
    Unsupported(u32),
}

/// Why a request could not be decoded (answered EIO, and logged).
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed FUSE request: {}", self.0)
    }
}

/// Reads the arguments of a request: the operation's fixed structure (its first
/// argument), then what follows it (names, data) in order.
struct Args<'a> {
    fixed: &'a [u8],
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn fixed<T: FromBytes>(&mut self, what: &'static str) -> Result<T, Malformed> {
        let (v, rest) = T::read_from_prefix(self.fixed).map_err(|_| Malformed(what))?;
        self.fixed = rest;
        Ok(v)
    }

    /// A structure of the arguments after the fixed one (BATCH_FORGET's entries).
    fn then<T: FromBytes>(&mut self, what: &'static str) -> Result<T, Malformed> {
        let (v, rest) = T::read_from_prefix(self.rest).map_err(|_| Malformed(what))?;
        self.rest = rest;
        Ok(v)
    }

    /// A NUL-terminated name.
    fn name(&mut self, what: &'static str) -> Result<&'a OsStr, Malformed> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(Malformed(what))?;
        let name = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Ok(OsStr::from_bytes(name))
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed(what));
        }
        let (b, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(b)
    }
}

/// The size of an operation's fixed structure, its first argument (0: it has none, its
/// arguments are names). A `/dev/fuse` request carries it right after the header; an
/// io_uring entry carries it apart from the rest (the entry's `op_in`).
pub fn fixed_size(opcode: u32) -> usize {
    use std::mem::size_of;
    match opcode {
        opcode::FORGET => size_of::<abi::ForgetIn>(),
        opcode::GETATTR => size_of::<abi::GetattrIn>(),
        opcode::SETATTR => size_of::<abi::SetattrIn>(),
        opcode::MKNOD => size_of::<abi::MknodIn>(),
        opcode::MKDIR => size_of::<abi::MkdirIn>(),
        opcode::RENAME => size_of::<abi::RenameIn>(),
        opcode::RENAME2 => size_of::<abi::Rename2In>(),
        opcode::LINK => size_of::<abi::LinkIn>(),
        opcode::OPEN | opcode::OPENDIR => size_of::<abi::OpenIn>(),
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => size_of::<abi::ReadIn>(),
        opcode::WRITE => size_of::<abi::WriteIn>(),
        opcode::RELEASE | opcode::RELEASEDIR => size_of::<abi::ReleaseIn>(),
        opcode::FSYNC | opcode::FSYNCDIR => size_of::<abi::FsyncIn>(),
        // Without SETXATTR_EXT (never asked for) the kernel sends the first 8 bytes.
        opcode::SETXATTR => 8,
        opcode::GETXATTR | opcode::LISTXATTR => size_of::<abi::GetxattrIn>(),
        opcode::FLUSH => size_of::<abi::FlushIn>(),
        opcode::ACCESS => size_of::<abi::AccessIn>(),
        opcode::CREATE | opcode::TMPFILE => size_of::<abi::CreateIn>(),
        opcode::INTERRUPT => size_of::<abi::InterruptIn>(),
        opcode::IOCTL => size_of::<abi::IoctlIn>(),
        opcode::BATCH_FORGET => size_of::<abi::BatchForgetIn>(),
        opcode::FALLOCATE => size_of::<abi::FallocateIn>(),
        opcode::LSEEK => size_of::<abi::LseekIn>(),
        opcode::COPY_FILE_RANGE => size_of::<abi::CopyFileRangeIn>(),
        _ => 0,
    }
}

/// Splits a request read whole from `/dev/fuse` into its header, its fixed structure and
/// the rest of its arguments.
pub fn split(buf: &[u8]) -> Result<(abi::InHeader, &[u8], &[u8]), Malformed> {
    let (h, rest) = abi::InHeader::read_from_prefix(buf).map_err(|_| Malformed("short header"))?;
    let len = h.len as usize;
    if len < std::mem::size_of::<abi::InHeader>() || len > buf.len() {
        return Err(Malformed("length disagrees with what was read"));
    }
    // Extensions (security context, supplementary groups) are only sent when asked for
    // at INIT, which this side never does; they would sit at the end.
    let ext = h.total_extlen as usize * 8;
    let args_len = len - std::mem::size_of::<abi::InHeader>();
    if ext > args_len {
        return Err(Malformed("extensions longer than the request"));
    }
    let args = &rest[..args_len - ext];
    // INIT's size depends on the kernel's version: all of it is the fixed part.
    let fixed = if h.opcode == opcode::INIT {
        args.len()
    } else {
        fixed_size(h.opcode).min(args.len())
    };
    let (fixed, rest) = args.split_at(fixed);
    Ok((h, fixed, rest))
}

/// Decodes the operation of a request whose header is `h`, whose fixed structure is
/// `fixed` ([`fixed_size`] bytes) and whose other arguments are `rest`.
pub fn decode<'a>(h: &abi::InHeader, fixed: &'a [u8], rest: &'a [u8]) -> Result<Op<'a>, Malformed> {
    let mut a = Args { fixed, rest };
    let op = match h.opcode {
        opcode::INIT => {
            // Kernels before 7.36 send 16 bytes.
            let mut init = abi::InitIn::default();
            let n = fixed.len().min(std::mem::size_of::<abi::InitIn>());
            if n < 16 {
                return Err(Malformed("short INIT"));
            }
            zerocopy::IntoBytes::as_mut_bytes(&mut init)[..n].copy_from_slice(&fixed[..n]);
            Op::Init(init)
        }
        opcode::DESTROY => Op::Destroy,
        opcode::INTERRUPT => Op::Interrupt {
            unique: a.fixed::<abi::InterruptIn>("INTERRUPT")?.unique,
        },
        opcode::LOOKUP => Op::Lookup {
            name: a.name("LOOKUP name")?,
        },
        opcode::FORGET => Op::Forget {
            nlookup: a.fixed::<abi::ForgetIn>("FORGET")?.nlookup,
        },
        opcode::BATCH_FORGET => {
            let b = a.fixed::<abi::BatchForgetIn>("BATCH_FORGET")?;
            let mut v = Vec::with_capacity((b.count as usize).min(a.rest.len() / 16));
            for _ in 0..b.count {
                v.push(a.then::<abi::ForgetOne>("BATCH_FORGET entry")?);
            }
            Op::BatchForget(v)
        }
        opcode::GETATTR => {
            let g = a.fixed::<abi::GetattrIn>("GETATTR")?;
            Op::Getattr {
                fh: (g.getattr_flags & abi::GETATTR_FH != 0).then_some(g.fh),
            }
        }
        opcode::SETATTR => Op::Setattr(setattr(&a.fixed::<abi::SetattrIn>("SETATTR")?)),
        opcode::READLINK => Op::Readlink,
        opcode::SYMLINK => {
            let name = a.name("SYMLINK name")?;
            let target = a.name("SYMLINK target")?;
            Op::Symlink { name, target }
        }
        opcode::MKNOD => {
            let m = a.fixed::<abi::MknodIn>("MKNOD")?;
            Op::Mknod {
                name: a.name("MKNOD name")?,
                mode: m.mode,
                umask: m.umask,
                rdev: m.rdev,
            }
        }
        opcode::MKDIR => {
            let m = a.fixed::<abi::MkdirIn>("MKDIR")?;
            Op::Mkdir {
                name: a.name("MKDIR name")?,
                mode: m.mode,
                umask: m.umask,
            }
        }
        opcode::UNLINK => Op::Unlink {
            name: a.name("UNLINK name")?,
        },
        opcode::RMDIR => Op::Rmdir {
            name: a.name("RMDIR name")?,
        },
        opcode::RENAME => {
            let r = a.fixed::<abi::RenameIn>("RENAME")?;
            Op::Rename {
                name: a.name("RENAME name")?,
                newdir: r.newdir,
                newname: a.name("RENAME new name")?,
                flags: 0,
            }
        }
        opcode::RENAME2 => {
            let r = a.fixed::<abi::Rename2In>("RENAME2")?;
            Op::Rename {
                name: a.name("RENAME2 name")?,
                newdir: r.newdir,
                newname: a.name("RENAME2 new name")?,
                flags: r.flags,
            }
        }
        opcode::LINK => {
            let l = a.fixed::<abi::LinkIn>("LINK")?;
            Op::Link {
                oldnodeid: l.oldnodeid,
                newname: a.name("LINK name")?,
            }
        }
        opcode::OPEN => Op::Open {
            flags: a.fixed::<abi::OpenIn>("OPEN")?.flags,
        },
        opcode::READ => {
            let r = a.fixed::<abi::ReadIn>("READ")?;
            Op::Read {
                fh: r.fh,
                offset: r.offset,
                size: r.size,
            }
        }
        opcode::WRITE => {
            let w = a.fixed::<abi::WriteIn>("WRITE")?;
            Op::Write {
                fh: w.fh,
                offset: w.offset,
                data: a.bytes(w.size as usize, "WRITE data")?,
            }
        }
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE => Op::Release {
            fh: a.fixed::<abi::ReleaseIn>("RELEASE")?.fh,
        },
        opcode::FSYNC => {
            let f = a.fixed::<abi::FsyncIn>("FSYNC")?;
            Op::Fsync {
                fh: f.fh,
                datasync: f.fsync_flags & 1 != 0,
            }
        }
        opcode::SETXATTR => {
            let size = a.fixed::<u32>("SETXATTR size")?;
            let flags = a.fixed::<u32>("SETXATTR flags")?;
            let name = a.name("SETXATTR name")?;
            Op::Setxattr {
                name,
                value: a.bytes(size as usize, "SETXATTR value")?,
                flags,
            }
        }
        opcode::GETXATTR => {
            let g = a.fixed::<abi::GetxattrIn>("GETXATTR")?;
            Op::Getxattr {
                name: a.name("GETXATTR name")?,
                size: g.size,
            }
        }
        opcode::LISTXATTR => Op::Listxattr {
            size: a.fixed::<abi::GetxattrIn>("LISTXATTR")?.size,
        },
        opcode::REMOVEXATTR => Op::Removexattr {
            name: a.name("REMOVEXATTR name")?,
        },
        opcode::FLUSH => Op::Flush {
            fh: a.fixed::<abi::FlushIn>("FLUSH")?.fh,
        },
        opcode::OPENDIR => Op::Opendir {
            flags: a.fixed::<abi::OpenIn>("OPENDIR")?.flags,
        },
        opcode::READDIR | opcode::READDIRPLUS => {
            let r = a.fixed::<abi::ReadIn>("READDIR")?;
            if h.opcode == opcode::READDIR {
                Op::Readdir {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                }
            } else {
                Op::Readdirplus {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                }
            }
        }
        opcode::RELEASEDIR => Op::Releasedir {
            fh: a.fixed::<abi::ReleaseIn>("RELEASEDIR")?.fh,
        },
        opcode::FSYNCDIR => Op::Fsyncdir {
            fh: a.fixed::<abi::FsyncIn>("FSYNCDIR")?.fh,
        },
        opcode::ACCESS => Op::Access {
            mask: a.fixed::<abi::AccessIn>("ACCESS")?.mask,
        },
        opcode::CREATE => {
            let c = a.fixed::<abi::CreateIn>("CREATE")?;
            Op::Create {
                name: a.name("CREATE name")?,
                mode: c.mode,
                umask: c.umask,
                flags: c.flags,
            }
        }
        opcode::TMPFILE => {
            let c = a.fixed::<abi::CreateIn>("TMPFILE")?;
            // The kernel sends the new dentry's placeholder name ("/"); it names nothing.
            Op::Tmpfile {
                mode: c.mode,
                umask: c.umask,
                flags: c.flags,
            }
        }
        opcode::IOCTL => {
            a.fixed::<abi::IoctlIn>("IOCTL")?;
            Op::Ioctl
        }
        opcode::FALLOCATE => {
            let f = a.fixed::<abi::FallocateIn>("FALLOCATE")?;
            Op::Fallocate {
                fh: f.fh,
                offset: f.offset,
                length: f.length,
                mode: f.mode,
            }
        }
        opcode::LSEEK => {
            let l = a.fixed::<abi::LseekIn>("LSEEK")?;
            Op::Lseek {
                fh: l.fh,
                offset: l.offset,
                whence: l.whence,
            }
        }
        opcode::COPY_FILE_RANGE => {
            Op::CopyFileRange(a.fixed::<abi::CopyFileRangeIn>("COPY_FILE_RANGE")?)
        }
        other => Op::Unsupported(other),
    };
    Ok(op)
}

fn setattr(s: &abi::SetattrIn) -> SetattrArgs {
    use abi::fattr;
    let has = |bit: u32| s.valid & bit != 0;
    let time = |set: u32, now: u32, secs: u64, nsecs: u32| {
        if has(now) {
            Some(SetTime::Now)
        } else if has(set) {
            Some(SetTime::At(time_of(secs as i64, nsecs)))
        } else {
            None
        }
    };
    SetattrArgs {
        mode: has(fattr::MODE).then_some(s.mode),
        uid: has(fattr::UID).then_some(s.uid),
        gid: has(fattr::GID).then_some(s.gid),
        size: has(fattr::SIZE).then_some(s.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, s.atime, s.atimensec),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, s.mtime, s.mtimensec),
        fh: has(fattr::FH).then_some(s.fh),
    }
}

/// A time the protocol carries as seconds (signed, as the kernel's time64) and
/// nanoseconds.
pub fn time_of(secs: i64, nsecs: u32) -> std::time::SystemTime {
    use std::time::{Duration, UNIX_EPOCH};
    let nsecs = Duration::from_nanos(u64::from(nsecs.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nsecs
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nsecs
    }
}

impl Header {
    pub fn of(h: &abi::InHeader) -> Header {
        Header {
            unique: h.unique,
            opcode: h.opcode,
            nodeid: h.nodeid,
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    /// A request as the kernel writes it: header, fixed part, then the rest.
    fn request(opcode: u32, fixed: &[u8], rest: &[u8]) -> Vec<u8> {
        let len = std::mem::size_of::<abi::InHeader>() + fixed.len() + rest.len();
        let h = abi::InHeader {
            len: len as u32,
            opcode,
            unique: 7,
            nodeid: 42,
            uid: 1000,
            gid: 100,
            pid: 4321,
            ..Default::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(fixed);
        v.extend_from_slice(rest);
        v
    }

    fn decoded(buf: &[u8]) -> (Header, Op<'_>) {
        let (h, fixed, rest) = split(buf).unwrap();
        (Header::of(&h), decode(&h, fixed, rest).unwrap())
    }

    #[test]
    fn names_and_arguments_come_out_in_the_kernels_order() {
        let buf = request(opcode::LOOKUP, b"", b"file.txt\0");
        let (h, op) = decoded(&buf);
        assert_eq!((h.unique, h.nodeid, h.uid, h.pid), (7, 42, 1000, 4321));
        assert!(matches!(op, Op::Lookup { name } if name == "file.txt"));

        let r = abi::Rename2In {
            newdir: 9,
            flags: libc::RENAME_NOREPLACE,
            padding: 0,
        };
        let buf = request(opcode::RENAME2, r.as_bytes(), b"a\0b\0");
        match decoded(&buf).1 {
            Op::Rename {
                name,
                newdir,
                newname,
                flags,
            } => {
                assert_eq!(
                    (name.to_str(), newdir, newname.to_str()),
                    (Some("a"), 9, Some("b"))
                );
                assert_eq!(flags, libc::RENAME_NOREPLACE);
            }
            other => panic!("{other:?}"),
        }

        let buf = request(opcode::SYMLINK, b"", b"link\0../target\0");
        assert!(matches!(decoded(&buf).1,
            Op::Symlink { name, target } if name == "link" && target == "../target"));

        let w = abi::WriteIn {
            fh: 3,
            offset: 4096,
            size: 5,
            ..Default::default()
        };
        let buf = request(opcode::WRITE, w.as_bytes(), b"hello");
        assert!(matches!(decoded(&buf).1,
            Op::Write { fh: 3, offset: 4096, data } if data == b"hello"));
    }

    /// Every operation reads exactly its fixed structure from the fixed part, as an
    /// io_uring entry carries it apart (a zeroed structure of [`fixed_size`] bytes and two
    /// names decode; one byte less is malformed).
    #[test]
    fn every_operation_reads_its_fixed_structure_and_no_more() {
        for op in 1..=60u32 {
            if op == opcode::INIT {
                continue;
            }
            let n = fixed_size(op);
            let h = abi::InHeader {
                opcode: op,
                ..Default::default()
            };
            let fixed = vec![0u8; n];
            let rest = b"a\0b\0";
            let got = decode(&h, &fixed, rest);
            assert!(got.is_ok(), "opcode {op}: {got:?}");
            if n > 0 && !matches!(got, Ok(Op::Unsupported(_))) {
                assert!(
                    decode(&h, &fixed[..n - 1], rest).is_err(),
                    "opcode {op} reads less than {n}"
                );
            }
        }
    }

    #[test]
    fn a_batch_forget_lists_every_node() {
        let b = abi::BatchForgetIn { count: 2, dummy: 0 };
        let mut rest = Vec::new();
        for (nodeid, nlookup) in [(5u64, 1u64), (9, 3)] {
            rest.extend_from_slice(abi::ForgetOne { nodeid, nlookup }.as_bytes());
        }
        let buf = request(opcode::BATCH_FORGET, b.as_bytes(), &rest);
        let Op::BatchForget(v) = decoded(&buf).1 else {
            panic!()
        };
        let got: Vec<(u64, u64)> = v.iter().map(|f| (f.nodeid, f.nlookup)).collect();
        assert_eq!(got, [(5, 1), (9, 3)]);
    }

    #[test]
    fn setattr_says_what_it_sets() {
        let s = abi::SetattrIn {
            valid: abi::fattr::MODE | abi::fattr::MTIME | abi::fattr::ATIME_NOW | abi::fattr::FH,
            mode: 0o100644,
            mtime: 1_700_000_000,
            mtimensec: 5,
            fh: 11,
            size: 99,
            ..Default::default()
        };
        let buf = request(opcode::SETATTR, s.as_bytes(), b"");
        let Op::Setattr(a) = decoded(&buf).1 else {
            panic!()
        };
        assert_eq!(a.mode, Some(0o100644));
        assert_eq!(a.size, None, "SIZE is not in valid");
        assert_eq!(a.atime, Some(SetTime::Now));
        assert_eq!(a.mtime, Some(SetTime::At(time_of(1_700_000_000, 5))));
        assert_eq!(a.fh, Some(11));
        assert_eq!(a.uid, None);
    }

    #[test]
    fn a_request_that_lies_about_itself_is_malformed() {
        // A name without its NUL.
        let buf = request(opcode::LOOKUP, b"", b"abc");
        let (h, fixed, rest) = split(&buf).unwrap();
        assert_eq!(
            decode(&h, fixed, rest).unwrap_err(),
            Malformed("LOOKUP name")
        );
        // A write whose data is shorter than it says.
        let w = abi::WriteIn {
            size: 100,
            ..Default::default()
        };
        let buf = request(opcode::WRITE, w.as_bytes(), b"short");
        let (h, fixed, rest) = split(&buf).unwrap();
        assert!(decode(&h, fixed, rest).is_err());
        // A length past what was read.
        let mut buf = request(opcode::STATFS, b"", b"");
        buf[0] = 200;
        assert!(split(&buf).is_err());
        // An unknown opcode is not malformed: it is answered ENOSYS.
        let buf = request(4000, b"", b"");
        assert!(matches!(decoded(&buf).1, Op::Unsupported(4000)));
    }

    #[test]
    fn an_old_kernels_short_init_is_read() {
        let mut init = abi::InitIn {
            major: 7,
            minor: 31,
            max_readahead: 131072,
            flags: 0xffff,
            flags2: 0xdead,
            ..Default::default()
        };
        let buf = request(opcode::INIT, &init.as_bytes()[..16], b"");
        let Op::Init(got) = decoded(&buf).1 else {
            panic!()
        };
        init.flags2 = 0;
        assert_eq!(got.as_bytes(), init.as_bytes());
    }
}
