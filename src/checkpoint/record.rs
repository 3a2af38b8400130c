//! The records an epoch appends before each change it keeps, and their reading back.
//!
//! One record per kept thing, appended with one `write` to the epoch's `records` file
//! (opened `O_APPEND`): a tag, the path (relative to the upper layer), the inode number,
//! and a payload (the attributes, `meta.rs`). A record is written after the data it
//! names is in place (a link in `saved/`, a copy in `content/`) and before the change it
//! keeps from: a crash between the two leaves data no record names (never read), and one
//! after the record leaves a record of a state the change never left (still the state
//! at the epoch's start, since only the first change of a thing is kept). A record cut
//! short by a crash is the file's last and is not read.

use std::io;

use super::meta::Meta;

/// What an entry of the upper layer was when the epoch began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Was {
    /// No entry at the path.
    Absent,
    /// A file, symlink, whiteout or special file: the inode, linked at `saved/<ino>`.
    Inode(u64),
    /// A directory, with its attributes.
    Dir(Meta),
}

/// One kept thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// What the name `path` held.
    Name { path: Vec<u8>, was: Was },
    /// The data of the regular file `ino` (found at `path` then), copied to
    /// `content/<ino>`, and its attributes.
    Content { path: Vec<u8>, ino: u64, meta: Meta },
    /// The attributes of the inode `ino` (not a directory: those are `Name`s).
    Attrs { path: Vec<u8>, ino: u64, meta: Meta },
}

const ABSENT: u8 = b'A';
const INODE: u8 = b'L';
const DIR: u8 = b'D';
const CONTENT: u8 = b'C';
const ATTRS: u8 = b'M';

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (tag, path, ino, meta) = match self {
            Record::Name { path, was } => match was {
                Was::Absent => (ABSENT, path, 0, None),
                Was::Inode(ino) => (INODE, path, *ino, None),
                Was::Dir(m) => (DIR, path, 0, Some(m)),
            },
            Record::Content { path, ino, meta } => (CONTENT, path, *ino, Some(meta)),
            Record::Attrs { path, ino, meta } => (ATTRS, path, *ino, Some(meta)),
        };
        let payload = meta.map(Meta::encode).unwrap_or_default();
        let mut out = Vec::with_capacity(1 + 4 + path.len() + 8 + 4 + payload.len());
        out.push(tag);
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path);
        out.extend_from_slice(&ino.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Every whole record of `bytes`, in order; a cut-short last one is left out, and a
    /// record that cannot be read is an error (not a cut: something else wrote there).
    pub(crate) fn decode_all(bytes: &[u8]) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        let mut r = Reader { b: bytes, at: 0 };
        while r.at < bytes.len() {
            let start = r.at;
            match r.record() {
                Some(rec) => out.push(rec?),
                None => {
                    tracing::warn!(
                        "a checkpoint record cut short at byte {start} (a crash while it was written) is left out"
                    );
                    break;
                }
            }
        }
        Ok(out)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// None when the bytes end inside the record.
    fn record(&mut self) -> Option<io::Result<Record>> {
        let tag = *self.take(1)?.first()?;
        let len = self.u32()? as usize;
        let path = self.take(len)?.to_vec();
        let ino = self.u64()?;
        let plen = self.u32()? as usize;
        let payload = self.take(plen)?;
        let meta =
            || Meta::decode(payload).ok_or_else(|| bad(format!("attributes of {}", show(&path))));
        Some((|| {
            Ok(match tag {
                ABSENT => Record::Name {
                    path: path.clone(),
                    was: Was::Absent,
                },
                INODE => Record::Name {
                    path: path.clone(),
                    was: Was::Inode(ino),
                },
                DIR => Record::Name {
                    was: Was::Dir(meta()?),
                    path: path.clone(),
                },
                CONTENT => Record::Content {
                    meta: meta()?,
                    path: path.clone(),
                    ino,
                },
                ATTRS => Record::Attrs {
                    meta: meta()?,
                    path: path.clone(),
                    ino,
                },
                t => return Err(bad(format!("unknown record tag {t}"))),
            })
        })())
    }
}

fn bad(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("checkpoint records: {what}"),
    )
}

/// A path of the upper layer as messages show it (`.` for its root).
pub fn show(path: &[u8]) -> String {
    if path.is_empty() {
        ".".into()
    } else {
        String::from_utf8_lossy(path).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            mode: 0o100644,
            uid: 1,
            gid: 2,
            atime: (3, 4),
            mtime: (5, 6),
            xattrs: vec![(b"user.a".to_vec(), b"v\n".to_vec())],
        }
    }

    #[test]
    fn records_read_back_as_written_and_a_cut_last_one_is_left_out() {
        let recs = vec![
            Record::Name {
                path: b"a/b\nc".to_vec(),
                was: Was::Absent,
            },
            Record::Name {
                path: b"x".to_vec(),
                was: Was::Inode(42),
            },
            Record::Name {
                path: Vec::new(),
                was: Was::Dir(meta()),
            },
            Record::Content {
                path: b"f".to_vec(),
                ino: 7,
                meta: meta(),
            },
            Record::Attrs {
                path: b"l".to_vec(),
                ino: 8,
                meta: meta(),
            },
        ];
        let mut bytes: Vec<u8> = recs.iter().flat_map(Record::encode).collect();
        assert_eq!(Record::decode_all(&bytes).unwrap(), recs);
        bytes.truncate(bytes.len() - 3);
        assert_eq!(Record::decode_all(&bytes).unwrap(), recs[..4]);
        bytes[0] = b'?';
        assert!(Record::decode_all(&bytes).is_err());
    }
}
