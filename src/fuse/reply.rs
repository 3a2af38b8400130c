//! The answer to a request, in one form whatever carries it back: an errno, nothing (for
//! FORGET), or the operation's reply structure and its data. A transport writes the
//! reply header and then [`Answer::parts`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zerocopy::IntoBytes;

use super::abi;

/// What a request is answered with.
#[derive(Debug)]
pub enum Answer {
    /// No reply at all (FORGET, BATCH_FORGET).
    Nothing,
    /// Failed with this errno (positive).
    Error(i32),
    /// Done; nothing to say.
    Empty,
    Entry(abi::EntryOut),
    Attr(abi::AttrOut),
    Open(abi::OpenOut),
    Create(abi::EntryOut, abi::OpenOut),
    Write(abi::WriteOut),
    Statfs(abi::Kstatfs),
    Lseek(abi::LseekOut),
    /// A size alone (GETXATTR or LISTXATTR asked with size 0).
    XattrSize(abi::GetxattrOut),
    /// Bytes: read data, a link's target, a listing, an attribute's value.
    Data(Vec<u8>),
    /// The INIT reply, of which the first `len` bytes are sent (older kernels read less).
    Init(abi::InitOut, usize),
}

impl Answer {
    /// The errno of the reply header (0, or the negative errno).
    pub fn error(&self) -> i32 {
        match self {
            Answer::Error(e) => -e,
            _ => 0,
        }
    }

    /// The reply's arguments after its header, in order.
    pub fn parts(&self) -> [&[u8]; 2] {
        match self {
            Answer::Nothing | Answer::Error(_) | Answer::Empty => [&[], &[]],
            Answer::Entry(e) => [e.as_bytes(), &[]],
            Answer::Attr(a) => [a.as_bytes(), &[]],
            Answer::Open(o) => [o.as_bytes(), &[]],
            Answer::Create(e, o) => [e.as_bytes(), o.as_bytes()],
            Answer::Write(w) => [w.as_bytes(), &[]],
            Answer::Statfs(s) => [s.as_bytes(), &[]],
            Answer::Lseek(l) => [l.as_bytes(), &[]],
            Answer::XattrSize(x) => [x.as_bytes(), &[]],
            Answer::Data(d) => [d, &[]],
            Answer::Init(i, len) => [&i.as_bytes()[..*len], &[]],
        }
    }

    /// The length of the arguments.
    pub fn len(&self) -> usize {
        let [a, b] = self.parts();
        a.len() + b.len()
    }

    /// Whether the reply carries no arguments.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The reply header for request `unique`.
    pub fn header(&self, unique: u64) -> abi::OutHeader {
        abi::OutHeader {
            len: (std::mem::size_of::<abi::OutHeader>() + self.len()) as u32,
            error: self.error(),
            unique,
        }
    }
}

/// A time as the protocol carries it: seconds since the epoch (negative before it, as
/// two's complement) and nanoseconds.
pub fn secs_nsecs(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            // -1.25 s is -2 s + 0.75 s.
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                (s.wrapping_neg() as u64, 0)
            } else {
                (s.wrapping_neg().wrapping_sub(1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

/// A cache timeout as the protocol carries it.
pub fn valid(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

/// A listing being filled up to the size the kernel asked for: READDIR entries, or
/// READDIRPLUS entries with their lookups.
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirBuf {
    pub fn new(max: u32) -> DirBuf {
        let max = max as usize;
        DirBuf {
            buf: Vec::with_capacity(max.min(64 << 10)),
            max,
        }
    }

    /// Adds a READDIR entry; false when it does not fit (nothing added).
    pub fn add(&mut self, ino: u64, next: u64, typ: u32, name: &OsStr) -> bool {
        let name = name.as_bytes();
        let size = abi::dirent_size(name.len());
        if self.buf.len() + size > self.max {
            return false;
        }
        self.push_dirent(ino, next, typ, name, size);
        true
    }

    /// Adds a READDIRPLUS entry; false when it does not fit (nothing added).
    pub fn add_plus(&mut self, entry: &abi::EntryOut, next: u64, typ: u32, name: &OsStr) -> bool {
        let name = name.as_bytes();
        let size = abi::direntplus_size(name.len());
        if self.buf.len() + size > self.max {
            return false;
        }
        self.buf.extend_from_slice(entry.as_bytes());
        self.push_dirent(
            entry.attr.ino,
            next,
            typ,
            name,
            size - std::mem::size_of::<abi::EntryOut>(),
        );
        true
    }

    fn push_dirent(&mut self, ino: u64, off: u64, typ: u32, name: &[u8], size: usize) {
        let start = self.buf.len();
        let d = abi::Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            typ,
        };
        self.buf.extend_from_slice(d.as_bytes());
        self.buf.extend_from_slice(name);
        self.buf.resize(start + size, 0);
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn into_answer(self) -> Answer {
        Answer::Data(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn times_before_the_epoch_keep_their_nanoseconds_positive() {
        let t = UNIX_EPOCH - Duration::from_millis(1250);
        assert_eq!(secs_nsecs(t), ((-2i64) as u64, 750_000_000));
        let t = UNIX_EPOCH - Duration::from_secs(3);
        assert_eq!(secs_nsecs(t), ((-3i64) as u64, 0));
        let t = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(secs_nsecs(t), (5, 7));
        // And back as a request carries them.
        let back = super::super::request::time_of(-2, 750_000_000);
        assert_eq!(back, UNIX_EPOCH - Duration::from_millis(1250));
    }

    #[test]
    fn a_listing_stops_at_the_size_asked_and_pads_each_name() {
        let mut d = DirBuf::new(72 + 31);
        assert!(d.add(5, 1, libc::DT_REG as u32, OsStr::new("a")));
        assert!(d.add(6, 2, libc::DT_DIR as u32, OsStr::new("bcdefghij")));
        assert!(!d.add(7, 3, libc::DT_REG as u32, OsStr::new("x")), "full");
        let Answer::Data(buf) = d.into_answer() else {
            panic!()
        };
        assert_eq!(buf.len(), 32 + 40);
        let (first, rest) = abi::Dirent::read_from_prefix(&buf).unwrap();
        assert_eq!((first.ino, first.off, first.namelen), (5, 1, 1));
        assert_eq!(&rest[..1], b"a");
        let second = abi::Dirent::read_from_prefix(&buf[32..]).unwrap().0;
        assert_eq!((second.ino, second.namelen), (6, 9));
        assert_eq!(&buf[32 + 24..32 + 33], b"bcdefghij");
        assert!(buf[32 + 33..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_plus_entry_carries_its_lookup_then_its_dirent() {
        let mut d = DirBuf::new(4096);
        let mut e = abi::EntryOut {
            nodeid: 9,
            ..Default::default()
        };
        e.attr.ino = 9;
        assert!(d.add_plus(&e, 1, libc::DT_REG as u32, OsStr::new("f")));
        let Answer::Data(buf) = d.into_answer() else {
            panic!()
        };
        assert_eq!(buf.len(), abi::direntplus_size(1));
        let (entry, rest) = abi::EntryOut::read_from_prefix(&buf).unwrap();
        assert_eq!(entry.nodeid, 9);
        let (dirent, _) = abi::Dirent::read_from_prefix(rest).unwrap();
        assert_eq!((dirent.ino, dirent.off, dirent.namelen), (9, 1, 1));
    }

    #[test]
    fn the_header_counts_the_arguments_and_negates_the_errno() {
        let a = Answer::Error(libc::ENOENT);
        let h = a.header(3);
        assert_eq!((h.len, h.error, h.unique), (16, -libc::ENOENT, 3));
        let a = Answer::Create(abi::EntryOut::default(), abi::OpenOut::default());
        assert_eq!(a.header(1).len as usize, 16 + 128 + 16);
    }
}
