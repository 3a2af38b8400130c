//! `git status` that scales with what changed: git's fsmonitor hook protocol (version 2),
//! answered from the daemon's own record of the paths changed through each worktree.
//!
//! * Every change made through a view (create, write, truncate, chmod, rename, unlink, …)
//!   appends its path to the worktree's journal with a sequence number (`fs/journal.rs`).
//! * The index written at creation carries git's FSMN extension with the token
//!   [`CREATED_TOKEN`] and every entry marked valid, so the first `git status` in an
//!   untouched view asks the hook instead of calling `lstat` 100,000 times.
//! * git runs the hook (a shell script, enabled for worktreefs' worktrees only by an
//!   `includeIf "gitdir:…/worktrees/wtfs-*"` in the repository's
//!   config; hook and config live in `<gitdir>/worktreefs/`) with the token of its last
//!   query; the hook reads
//!   `<mount>/.control/fsmonitor/<repo>:<worktree>@<token>`, whose content the daemon
//!   generates: the new token, then every path changed since the old one.
//! * A token the daemon cannot answer exactly (another daemon instance's, or older than the
//!   journal keeps) is answered from the upper layer itself: every path it holds or hides
//!   is, by construction, every path that differs from the base commit. Only a journal
//!   overflow falls back to git's "everything may have changed" answer (`/`).

use std::path::{Path, PathBuf};

use super::error::{GitContext, GitError, GitResult};
use super::owner::{as_owner_of, pinned};
use crate::ids::WorktreeId;

/// The token in the index written at creation: "no change since the worktree was made".
pub const CREATED_TOKEN: &str = "wtfs-created";
/// A token this daemon hands out for worktree `id`'s journal: `wtfs:<instance>:<id>:<seq>`
/// (the worktree in it: git run with one worktree's git dir over another's files puts
/// the other's token in its index, which then names no position in its own journal).
pub fn token(instance: &str, id: WorktreeId, seq: u64) -> String {
    format!("wtfs:{instance}:{id}:{seq}")
}

/// The sequence number in `token` if it is one of `instance`'s for worktree `id`.
pub fn parse_token(token: &str, instance: &str, id: WorktreeId) -> Option<u64> {
    let rest = token.strip_prefix("wtfs:")?;
    let (rest, seq) = rest.rsplit_once(':')?;
    let (inst, of) = rest.rsplit_once(':')?;
    if inst != instance || of != id.to_string() {
        return None;
    }
    seq.parse().ok()
}

/// The hook's answer: the new token, then each path, each followed by a NUL.
pub fn encode_response(new_token: &str, paths: &[Vec<u8>]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(new_token.len() + 1 + paths.iter().map(|p| p.len() + 1).sum::<usize>());
    out.extend_from_slice(new_token.as_bytes());
    out.push(0);
    for p in paths {
        out.extend_from_slice(p);
        out.push(0);
    }
    out
}

/// git's FSMN index extension, version 2, marking every entry valid as of `token`.
pub fn index_extension(token: &str) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&2u32.to_be_bytes());
    data.extend_from_slice(token.as_bytes());
    data.push(0);
    // An empty EWAH bitmap (no entry is dirty): bit count 0, one zero word, RLW at 0.
    let mut ewah = Vec::new();
    ewah.extend_from_slice(&0u32.to_be_bytes());
    ewah.extend_from_slice(&1u32.to_be_bytes());
    ewah.extend_from_slice(&0u64.to_be_bytes());
    ewah.extend_from_slice(&0u32.to_be_bytes());
    data.extend_from_slice(&(ewah.len() as u32).to_be_bytes());
    data.extend_from_slice(&ewah);
    let mut ext = Vec::with_capacity(8 + data.len());
    ext.extend_from_slice(b"FSMN");
    ext.extend_from_slice(&(data.len() as u32).to_be_bytes());
    ext.extend_from_slice(&data);
    ext
}

/// What an index's FSMN extension says: the token of git's last fsmonitor query and
/// which entries were dirty then. Every other entry (but a gitlink) is one git takes as
/// unchanged without looking at it, unless the hook reports its path since the token.
#[derive(Debug, PartialEq, Eq)]
pub struct IndexMonitor {
    pub token: String,
    /// How many entries the index holds (the bitmap's positions are theirs, in order).
    pub entries: usize,
    /// Their paths, in order (to check that another reading of the file met the same).
    pub paths: Vec<Vec<u8>>,
    dirty: Vec<u64>,
}

impl IndexMonitor {
    /// Whether git's last query left entry number `i` dirty (to be looked at again).
    pub fn dirty(&self, i: usize) -> bool {
        self.dirty
            .get(i / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// The FSMN extension of the index file `index` (versions 2 to 4, version 2 of the
    /// extension). None when there is none, or anything does not parse: then no entry is
    /// taken as valid.
    pub fn read(index: &[u8]) -> Option<IndexMonitor> {
        let (paths, extensions) = walk_index(index)?;
        let (_, data) = extensions.into_iter().find(|(sig, _)| sig == b"FSMN")?;
        Self::parse(data, paths)
    }

    fn parse(data: &[u8], paths: Vec<Vec<u8>>) -> Option<IndexMonitor> {
        let entries = paths.len();
        let be32 = |d: &[u8], at: usize| -> Option<u32> {
            Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
        };
        if be32(data, 0)? != 2 {
            return None;
        }
        let nul = data.get(4..)?.iter().position(|b| *b == 0)?;
        let token = std::str::from_utf8(&data[4..4 + nul]).ok()?.to_string();
        let ewah = data.get(4 + nul + 1 + 4..)?;
        let ewah = ewah.get(..be32(data, 4 + nul + 1)? as usize)?;
        // EWAH (git's ewah/ewah_io.c): bit count, word count, the words, the position of
        // the last run-length word. Each run-length word: bit 0 the run's bit, bits 1-32
        // its length in words, bits 33-63 how many literal words follow.
        let bits = be32(ewah, 0)? as usize;
        let words = be32(ewah, 4)? as usize;
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_be_bytes(
                ewah.get(8 + i * 8..16 + i * 8)?.try_into().ok()?,
            ))
        };
        if bits > entries {
            return None;
        }
        let mut dirty = vec![0u64; bits.div_ceil(64)];
        let (mut i, mut at) = (0usize, 0usize);
        while i < words {
            let rlw = word(i)?;
            let run = ((rlw >> 1) & 0xffff_ffff) as usize;
            let literals = (rlw >> 33) as usize;
            if rlw & 1 == 1 {
                for w in at..at + run {
                    *dirty.get_mut(w)? = u64::MAX;
                }
            }
            at += run;
            for k in 0..literals {
                *dirty.get_mut(at)? = word(i + 1 + k)?;
                at += 1;
            }
            i += 1 + literals;
        }
        // Bits past the count are no entry's.
        if !bits.is_multiple_of(64) {
            if let Some(last) = dirty.last_mut() {
                *last &= (1u64 << (bits % 64)) - 1;
            }
        }
        Some(IndexMonitor {
            token,
            entries,
            paths,
            dirty,
        })
    }
}

pub const CONTROL_DIR: &str = "fsmonitor";

/// The hook git runs (protocol 2: `$1` is 2, `$2` the last token, cwd the worktree).
/// Plain sh and cat: it works for whoever runs git, and outlives any binary's path.
const HOOK: &str = r#"#!/bin/sh
# worktreefs fsmonitor hook (git protocol 2): prints what changed in this worktree since $2.
[ "$1" = 2 ] || exit 1
wt=$(pwd -P)
mount=${wt%/*/*}
rel=${wt#"$mount"/}
exec cat "$mount/.control/fsmonitor/${rel%%/*}:${rel#*/}@$2"
"#;

/// An index file's entries' paths, in order, and its extensions (signature, data).
type IndexParts<'a> = (Vec<Vec<u8>>, Vec<([u8; 4], &'a [u8])>);

/// The paths of the index file `index`'s entries, in order, and its extensions
/// (signature, data); None when anything does not parse (versions 2 to 4).
fn walk_index(index: &[u8]) -> Option<IndexParts<'_>> {
    let be32 = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(index.get(at..at + 4)?.try_into().ok()?))
    };
    if index.get(0..4)? != b"DIRC" {
        return None;
    }
    let version = be32(4)?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let entries = be32(8)? as usize;
    let mut pos = 12;
    let mut paths: Vec<Vec<u8>> = Vec::with_capacity(entries.min(index.len() / 62));
    for _ in 0..entries {
        let flags = u16::from_be_bytes(index.get(pos + 60..pos + 62)?.try_into().ok()?);
        let mut path_at = pos + 62;
        if version >= 3 && flags & 0x4000 != 0 {
            path_at += 2;
        }
        if version == 4 {
            // A varint (how much of the previous path to drop), then the rest of the
            // path and its NUL; no padding.
            let mut at = path_at;
            let mut c = *index.get(at)?;
            let mut strip = (c & 0x7f) as usize;
            while c & 0x80 != 0 {
                at += 1;
                c = *index.get(at)?;
                strip = strip.checked_add(1)?.checked_mul(128)? + (c & 0x7f) as usize;
            }
            let nul = index.get(at + 1..)?.iter().position(|b| *b == 0)?;
            let mut path = paths.last().cloned().unwrap_or_default();
            path.truncate(path.len().checked_sub(strip)?);
            path.extend_from_slice(&index[at + 1..at + 1 + nul]);
            paths.push(path);
            pos = at + 1 + nul + 1;
        } else {
            let nul = index.get(path_at..)?.iter().position(|b| *b == 0)?;
            paths.push(index[path_at..path_at + nul].to_vec());
            let len = path_at - pos + nul;
            pos += (len + 8) & !7;
        }
    }
    let body_end = index.len().checked_sub(20)?;
    let mut out = Vec::new();
    while pos + 8 <= body_end {
        let sig = index.get(pos..pos + 4)?;
        let len = be32(pos + 4)? as usize;
        let data = index.get(pos + 8..pos + 8 + len)?;
        out.push((sig.try_into().ok()?, data));
        pos += 8 + len;
    }
    Some((paths, out))
}

/// Whether the index file `index` carries the extension `sig` (`link`: a split index).
pub fn has_extension(index: &[u8], sig: &[u8; 4]) -> bool {
    walk_index(index).is_some_and(|(_, ext)| ext.iter().any(|(s, _)| s == sig))
}

/// Where the hook and its config live: in the repository's own git directory, readable by
/// everyone who can use the repository (a state directory under root's home is not).
pub fn repo_dir(gitdir: &Path) -> PathBuf {
    gitdir.join("worktreefs")
}

pub fn hook_path(gitdir: &Path) -> PathBuf {
    repo_dir(gitdir).join("fsmonitor-hook")
}

pub fn include_path(gitdir: &Path) -> PathBuf {
    repo_dir(gitdir).join("config")
}

/// Writes the hook and the config that enables it, if they differ (idempotent). The
/// directory is in the repository, its owner's to make anything: it is reached through
/// no symlink, what is there is read only when it is a regular file (a FIFO would hold
/// the mount), and each file is replaced, never written through (a symlink there to a
/// file of root's stays untouched, never truncated or overwritten by root).
fn install_files(gitdir: &Path) -> GitResult<()> {
    use crate::beneath;
    use std::ffi::OsStr;
    use std::os::fd::AsFd;
    let dir = repo_dir(gitdir);
    let top = pinned(gitdir)?;
    match beneath::mkdir_at(top.as_fd(), OsStr::new("worktreefs"), 0o755) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(GitError::from(e).context(format!("creating {}", dir.display())))
        }
        _ => {}
    }
    let holds = |name: &str, want: &str, mode: u32| {
        beneath::read_regular(
            top.as_fd(),
            format!("worktreefs/{name}").as_bytes(),
            1 << 20,
        )
        .is_ok_and(|(b, st)| b == want.as_bytes() && st.st_mode & 0o7777 == mode)
    };
    let put = |name: &str, text: &str, mode: u32| {
        beneath::dir(top.as_fd(), b"worktreefs")
            .and_then(|d| {
                beneath::replace_file_at(d.as_fd(), OsStr::new(name), text.as_bytes(), mode)
            })
            .with_context(|| format!("writing {}", dir.join(name).display()))
    };
    let hook = hook_path(gitdir);
    if !holds("fsmonitor-hook", HOOK, 0o755) {
        put("fsmonitor-hook", HOOK, 0o755)?;
    }
    let config = format!(
        "# Written by worktreefs for its managed worktrees (admin entries wtfs-*): git asks the\n# daemon what changed instead of scanning, and keeps its untracked-file cache, which\n# the same answers keep current. git 2.55 and later take a FUSE mount for a remote\n# filesystem and turn fsmonitor off there (with a warning on every command) unless\n# fsmonitor.allowRemote says otherwise: the hook reads the daemon, not a remote.\n[core]\n\tfsmonitor = {}\n\tfsmonitorHookVersion = 2\n\tuntrackedCache = true\n[fsmonitor]\n\tallowRemote = true\n",
        hook.display()
    );
    if !holds("config", &config, 0o644) {
        put("config", &config, 0o644)?;
    }
    Ok(())
}

fn include_key(gitdir: &Path) -> String {
    format!(
        "includeIf.gitdir:{}/worktrees/wtfs-*.path",
        gitdir.display()
    )
}

/// Makes the repository's config include the hook's config for worktreefs' worktrees
/// (admin entries named `wtfs-*`) and for no other worktree. The config is written as
/// its repository's owner (see [`as_owner_of`]).
pub fn enable_for_repo(gitdir: &Path) -> GitResult<()> {
    install_files(gitdir)?;
    let gitdir = gitdir.to_path_buf();
    as_owner_of(&gitdir.clone(), move || {
        let config_path = gitdir.join("config");
        let mut config = git2::Config::open(&config_path)
            .with_context(|| format!("opening {}", config_path.display()))?;
        let key = include_key(&gitdir);
        let want = include_path(&gitdir).display().to_string();
        let mut present = false;
        if let Ok(mut entries) = config.multivar(&key, None) {
            while let Some(Ok(e)) = entries.next() {
                if e.value() == Some(want.as_str()) {
                    present = true;
                }
            }
        }
        if !present {
            config
                .set_multivar(&key, "^$", &want)
                .with_context(|| format!("adding {key} to {}", config_path.display()))?;
        }
        Ok(())
    })
}

/// Undoes `enable_for_repo` (on `repo remove`), as the repository's owner.
pub fn disable_for_repo(gitdir: &Path) -> GitResult<()> {
    let dir = gitdir.to_path_buf();
    as_owner_of(gitdir, move || -> GitResult<()> {
        let config_path = dir.join("config");
        let mut config = git2::Config::open(&config_path)?;
        let _ = config.remove_multivar(&include_key(&dir), ".*");
        Ok(())
    })?;
    // libgit2 leaves the emptied section header behind; git itself removes it (as the
    // owner too: git writes a config through a symlink as well).
    let config_path = gitdir.join("config");
    let section = format!("includeIf.gitdir:{}/worktrees/wtfs-*", gitdir.display());
    let mut git = std::process::Command::new("git");
    git.arg("config")
        .arg("--file")
        .arg(&config_path)
        .arg("--remove-section")
        .arg(&section)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let top = pinned(gitdir)?;
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        let owner = crate::beneath::fstat(std::os::fd::AsFd::as_fd(&top))?;
        // (std drops root's supplementary groups when it sets the uid.)
        git.uid(owner.st_uid).gid(owner.st_gid);
    }
    let _ = git.status();
    match crate::beneath::remove_tree(
        std::os::fd::AsFd::as_fd(&top),
        std::ffi::OsStr::new("worktreefs"),
    ) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_belong_to_one_instance() {
        let t = token("abc", WorktreeId(7), 42);
        assert_eq!(parse_token(&t, "abc", WorktreeId(7)), Some(42));
        assert_eq!(
            parse_token(&t, "abc", WorktreeId(8)),
            None,
            "another worktree's"
        );
        assert_eq!(parse_token(&t, "other", WorktreeId(7)), None);
        assert_eq!(
            parse_token("wtfs:abc:42", "abc", WorktreeId(7)),
            None,
            "the old form"
        );
        assert_eq!(parse_token(CREATED_TOKEN, "abc", WorktreeId(7)), None);
        assert_eq!(parse_token("", "abc", WorktreeId(7)), None);
    }

    /// An index of `n` entries (named e0, e1, …) with an FSMN extension of `ewah`.
    fn index_with(n: usize, token: &str, ewah: &[u8]) -> Vec<u8> {
        let mut out = b"DIRC".to_vec();
        out.extend_from_slice(&2u32.to_be_bytes());
        out.extend_from_slice(&(n as u32).to_be_bytes());
        for i in 0..n {
            let name = format!("e{i}");
            let start = out.len();
            out.extend_from_slice(&[0u8; 60]);
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            let len = out.len() - start;
            out.resize(start + ((len + 8) & !7), 0);
        }
        let mut data = 2u32.to_be_bytes().to_vec();
        data.extend_from_slice(token.as_bytes());
        data.push(0);
        data.extend_from_slice(&(ewah.len() as u32).to_be_bytes());
        data.extend_from_slice(ewah);
        out.extend_from_slice(b"TREE\0\0\0\0");
        out.extend_from_slice(b"FSMN");
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(&data);
        out.extend_from_slice(&[0u8; 20]);
        out
    }

    #[test]
    fn fsmonitor_bitmap_runs_and_literals() {
        // 200 bits: a run of two words of ones, then one literal word (bits 128 and 130).
        let mut ewah = 200u32.to_be_bytes().to_vec();
        ewah.extend_from_slice(&2u32.to_be_bytes());
        let rlw: u64 = 1 | (2 << 1) | (1 << 33);
        ewah.extend_from_slice(&rlw.to_be_bytes());
        ewah.extend_from_slice(&0b101u64.to_be_bytes());
        ewah.extend_from_slice(&0u32.to_be_bytes());
        let m = IndexMonitor::read(&index_with(200, "wtfs:i:7", &ewah)).unwrap();
        assert_eq!(m.token, "wtfs:i:7");
        assert_eq!(m.entries, 200);
        assert_eq!(m.paths[13], b"e13");
        for i in 0..200 {
            assert_eq!(m.dirty(i), i <= 128 || i == 130, "{i}");
        }
        // The extension worktreefs writes: nothing dirty.
        let ext = index_extension("t");
        let m = IndexMonitor::read(&index_with(3, "t", &ext[8 + 4 + 2 + 4..])).unwrap();
        assert!((0..3).all(|i| !m.dirty(i)));
        // More bits than entries, or no extension at all: nothing is trusted.
        assert_eq!(IndexMonitor::read(&index_with(100, "t", &ewah)), None);
        assert_eq!(IndexMonitor::read(b"DIRC\0\0\0\x02\0\0\0\0"), None);
    }

    #[test]
    fn response_and_extension_layout() {
        let r = encode_response("tok", &[b"a".to_vec(), b"b/c".to_vec()]);
        assert_eq!(r, b"tok\0a\0b/c\0");
        let ext = index_extension("t");
        assert_eq!(&ext[0..4], b"FSMN");
        let len = u32::from_be_bytes([ext[4], ext[5], ext[6], ext[7]]) as usize;
        assert_eq!(ext.len(), 8 + len);
        // version 2, "t\0", ewah size 20, ewah of 20 bytes
        assert_eq!(len, 4 + 2 + 4 + 20);
    }
}
