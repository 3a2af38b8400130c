//! git's index file format: encoding the entries written at creation, the running SHA-1
//! that lets a copy finish its checksum, and reading blob sizes back from a cached index.

use git2::Oid;
use sha1::{Digest, Sha1};

use crate::ino::path_ino_low;

use super::MODE_GITLINK;

/// One index entry, with the stat data the view will report for it.
pub struct IndexEntry {
    pub path: Vec<u8>,
    pub mode: u32,
    pub oid: Oid,
    pub size: u32,
}

/// Stat data the view reports for untouched base entries of one worktree.
pub struct IndexStat {
    pub mtime: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Serializes an index (version 2) in git's format: header, entries sorted by path,
/// extensions, SHA-1. Written by hand so the stat fields are exactly what the view reports.
pub fn encode_index(entries: &[IndexEntry], stat: &IndexStat, extensions: &[Vec<u8>]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(12 + entries.len() * 96 + 20);
    buf.extend_from_slice(b"DIRC");
    buf.extend_from_slice(&2u32.to_be_bytes());
    buf.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        let start = buf.len();
        for v in [stat.mtime, 0, stat.mtime, 0, 0, path_ino_low(&e.path)] {
            buf.extend_from_slice(&v.to_be_bytes()); // ctime s/ns, mtime s/ns, dev, ino
        }
        let (uid, gid) = if e.mode == MODE_GITLINK {
            (0, 0)
        } else {
            (stat.uid, stat.gid)
        };
        for v in [e.mode, uid, gid, e.size] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        buf.extend_from_slice(e.oid.as_bytes());
        let flags = e.path.len().min(0xfff) as u16;
        buf.extend_from_slice(&flags.to_be_bytes());
        buf.extend_from_slice(&e.path);
        // 1 to 8 NULs so the entry length is a multiple of 8.
        let len = buf.len() - start;
        let pad = 8 - (len % 8);
        buf.extend(std::iter::repeat_n(0u8, pad));
    }
    for ext in extensions {
        buf.extend_from_slice(ext);
    }
    let digest = Sha1::digest(&buf);
    buf.extend_from_slice(&digest);
    buf
}

/// The SHA-1 of a long, fixed start, to be finished with different endings: the hash state
/// after the start's whole 64-byte blocks. A worktree's index is the cached index's body
/// (10 MB for 100,000 entries) followed by the worktree's own untracked cache and a
/// checksum of both; with this state kept next to the cached index, a creation hashes only
/// the body's last partial block and its own extension, and never reads the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sha1Prefix {
    state: [u32; 5],
    /// How many bytes `state` covers: a multiple of 64.
    len: u64,
}

impl Sha1Prefix {
    /// Length of `encode`'s output.
    pub const ENCODED_LEN: usize = 28;
    const INITIAL: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];

    /// The state after the whole 64-byte blocks of `data` (the rest is left to `finish`).
    pub fn of(data: &[u8]) -> Self {
        let mut state = Self::INITIAL;
        let len = data.len() / 64 * 64;
        Self::compress(&mut state, &data[..len]);
        Self {
            state,
            len: len as u64,
        }
    }

    /// Runs SHA-1's compression over `blocks`, a whole number of 64-byte blocks.
    fn compress(state: &mut [u32; 5], blocks: &[u8]) {
        for block in blocks.chunks_exact(64) {
            sha1::compress(
                state,
                std::slice::from_ref(sha1::digest::generic_array::GenericArray::from_slice(block)),
            );
        }
    }

    /// How many bytes of the start the state covers; the caller passes the bytes after
    /// them to `finish`.
    pub fn covered(&self) -> u64 {
        self.len
    }

    /// The SHA-1 of the covered bytes followed by `rest`, in order.
    pub fn finish(&self, rest: &[&[u8]]) -> [u8; 20] {
        let rest_len: usize = rest.iter().map(|r| r.len()).sum();
        let bits = (self.len + rest_len as u64) * 8;
        let mut tail = Vec::with_capacity(rest_len + 72);
        for r in rest {
            tail.extend_from_slice(r);
        }
        tail.push(0x80);
        while tail.len() % 64 != 56 {
            tail.push(0);
        }
        tail.extend_from_slice(&bits.to_be_bytes());
        let mut state = self.state;
        Self::compress(&mut state, &tail);
        let mut out = [0u8; 20];
        for (o, v) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        for (o, v) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&v.to_be_bytes());
        }
        out[20..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Reads `encode`'s output back; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::ENCODED_LEN {
            return None;
        }
        let mut state = [0u32; 5];
        for (s, b) in state.iter_mut().zip(bytes.chunks_exact(4)) {
            *s = u32::from_be_bytes(b.try_into().ok()?);
        }
        let len = u64::from_be_bytes(bytes[20..].try_into().ok()?);
        (len % 64 == 0).then_some(Self { state, len })
    }
}

/// (object id, size) of every regular file and symlink entry of an index in the layout
/// `encode_index` writes (version 2, no extensions). Stops at the first malformed entry.
pub fn decode_index_sizes(bytes: &[u8]) -> Vec<(Oid, u64)> {
    let mut out = Vec::new();
    if bytes.len() < 12 || &bytes[0..4] != b"DIRC" || bytes[4..8] != 2u32.to_be_bytes() {
        return out;
    }
    let count = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let mut pos = 12;
    for _ in 0..count {
        let Some(fixed) = bytes.get(pos..pos + 62) else {
            break;
        };
        let mode = u32::from_be_bytes([fixed[24], fixed[25], fixed[26], fixed[27]]);
        let size = u32::from_be_bytes([fixed[36], fixed[37], fixed[38], fixed[39]]);
        let Ok(oid) = Oid::from_bytes(&fixed[40..60]) else {
            break;
        };
        let Some(nul) = bytes[pos + 62..].iter().position(|b| *b == 0) else {
            break;
        };
        let len = 62 + nul;
        pos += len + (8 - len % 8);
        if mode != MODE_GITLINK {
            out.push((oid, size as u64));
        }
    }
    out
}

/// The index of commit `at`'s tree, made by libgit2 at `scratch` (in the kept copy, the
/// daemon's own directory) and read back: no stat data, so git looks at each file once.
pub fn index_of_commit(
    repo: &git2::Repository,
    at: git2::Oid,
    scratch: &std::path::Path,
) -> super::GitResult<Vec<u8>> {
    let _ = std::fs::remove_file(scratch);
    let tree = repo.find_commit(at)?.tree()?;
    let mut index = git2::Index::open(scratch)?;
    index.read_tree(&tree)?;
    index.write()?;
    let bytes = std::fs::read(scratch)?;
    let _ = std::fs::remove_file(scratch);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::MODE_BLOB;
    use git2::ObjectType;

    #[test]
    fn encoded_index_has_git_layout() {
        let entries = vec![IndexEntry {
            path: b"a.txt".to_vec(),
            mode: MODE_BLOB,
            oid: Oid::from_str("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391").unwrap(),
            size: 0,
        }];
        let buf = encode_index(
            &entries,
            &IndexStat {
                mtime: 1000,
                uid: 1,
                gid: 2,
            },
            &[],
        );
        assert_eq!(&buf[0..4], b"DIRC");
        // 12 header + (62 fixed + 5 name = 67, padded to 72) + 20 checksum.
        assert_eq!(buf.len(), 12 + 72 + 20);
        let body = &buf[..buf.len() - 20];
        assert_eq!(&buf[buf.len() - 20..], Sha1::digest(body).as_slice());
        assert_eq!(decode_index_sizes(&buf), vec![(entries[0].oid, 0)]);
    }

    /// The cached index sits among files named like it (its untracked cache, its saved
    /// hash state, a writer's temporary file); the sizes come from the index itself.
    #[test]
    fn a_sha1_prefix_finished_with_the_rest_is_the_sha1_of_the_whole() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for start in [0, 1, 63, 64, 65, 127, 128, 1000, 2999, 3000] {
            let prefix = Sha1Prefix::of(&data[..start]);
            assert_eq!(prefix.covered() % 64, 0);
            assert!(prefix.covered() as usize <= start && start - (prefix.covered() as usize) < 64);
            assert_eq!(Sha1Prefix::decode(&prefix.encode()), Some(prefix));
            let covered = prefix.covered() as usize;
            for split in [start, (start + 3000) / 2, 3000] {
                let got = prefix.finish(&[&data[covered..split], &data[split..]]);
                assert_eq!(
                    got.as_slice(),
                    Sha1::digest(&data).as_slice(),
                    "start {start} split {split}"
                );
            }
        }
        assert_eq!(Sha1Prefix::decode(&[0; 27]), None);
        let mut odd = Sha1Prefix::of(&data).encode();
        odd[27] = 1; // a length that is not whole blocks
        assert_eq!(Sha1Prefix::decode(&odd), None);
    }

    #[test]
    fn index_sizes_round_trip() {
        let entries: Vec<IndexEntry> = (0..50u32)
            .map(|i| IndexEntry {
                path: "x".repeat(i as usize + 1).into_bytes(),
                mode: if i == 7 { MODE_GITLINK } else { MODE_BLOB },
                oid: Oid::hash_object(ObjectType::Blob, &i.to_be_bytes()).unwrap(),
                size: i * 1000,
            })
            .collect();
        let buf = encode_index(
            &entries,
            &IndexStat {
                mtime: 1,
                uid: 0,
                gid: 0,
            },
            &[crate::git::fsmonitor::index_extension("t")],
        );
        let got = decode_index_sizes(&buf);
        let want: Vec<(Oid, u64)> = entries
            .iter()
            .filter(|e| e.mode != MODE_GITLINK)
            .map(|e| (e.oid, e.size as u64))
            .collect();
        assert_eq!(got, want);
    }
}
