//! Each worktree's change journal: every change made through a view is recorded, and the
//! paths changed since a token are read back. Noting changes and answering git's hook
//! is `fsmonitor.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use crate::ino::Ino;
use parking_lot::Mutex;

/// How many changes a worktree's journal keeps before older tokens get the full answer.
const JOURNAL_CAPACITY: usize = 65_536;

/// Paths changed through one worktree, in order, each with its sequence number.
#[derive(Debug, Default)]
pub struct Journal {
    seq: u64,
    /// Every change with a sequence number above `floor` is still in `entries`.
    floor: u64,
    entries: VecDeque<(u64, Vec<u8>)>,
}

/// What a query answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Since {
    /// These paths changed (possibly none).
    Paths(Vec<Vec<u8>>),
    /// The token is not this journal's: the caller answers from the upper layer.
    Unknown,
    /// The journal no longer reaches back that far: everything may have changed.
    Everything,
}

impl Journal {
    /// Records that `path` (relative to the worktree) changed.
    pub fn record(&mut self, path: &[u8]) {
        self.seq += 1;
        self.entries.push_back((self.seq, path.to_vec()));
        if self.entries.len() > JOURNAL_CAPACITY {
            if let Some((s, _)) = self.entries.pop_front() {
                self.floor = s;
            }
        }
    }

    /// The sequence number the next token will carry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Paths changed after sequence number `since`.
    pub fn since(&self, since: u64) -> Since {
        if since < self.floor || since > self.seq {
            return Since::Everything;
        }
        let mut out: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(s, _)| *s > since)
            .map(|(_, p)| p.clone())
            .collect();
        out.sort();
        out.dedup();
        Since::Paths(out)
    }
}

/// One worktree's record for git's fsmonitor hook: the journal of changed paths, the
/// query epoch, and the files open for writing.
#[derive(Debug, Default)]
pub(super) struct WorktreeJournal {
    /// Paths changed through this view.
    journal: Mutex<Journal>,
    /// Bumped by every fsmonitor query; an open file records its path again on its first
    /// write after a query (see `View::write`).
    query_epoch: AtomicU64,
    /// Inodes open for writing, with how many handles: every fsmonitor query reports them
    /// as changed, since with FUSE passthrough their writes never reach the daemon. Each is
    /// recorded in the journal again when its last writer closes.
    open_writers: Mutex<HashMap<Ino, usize>>,
}

impl WorktreeJournal {
    pub(super) fn record(&self, rel: &[u8]) {
        self.journal.lock().record(rel);
    }

    /// The epoch of the latest query (see `query_epoch`).
    pub(super) fn query_epoch(&self) -> u64 {
        self.query_epoch.load(Ordering::Acquire)
    }

    /// What a query with `since` would be told, without being one.
    pub(super) fn peek(&self, since: u64) -> Since {
        self.journal.lock().since(since)
    }

    /// A query begins: bumped first, so a write that has not yet checked the epoch will
    /// record its path again. Returns the journal's sequence number and what changed
    /// since `token`'s (None: the token is not this journal's).
    pub(super) fn begin_query(&self, since: Option<u64>) -> (u64, Since) {
        self.query_epoch.fetch_add(1, Ordering::AcqRel);
        let j = self.journal.lock();
        let answer = match since {
            Some(s) => j.since(s),
            None => Since::Unknown,
        };
        (j.seq(), answer)
    }

    /// A handle opened `ino` for writing.
    pub(super) fn writer_opened(&self, ino: Ino) {
        *self.open_writers.lock().entry(ino).or_insert(0) += 1;
    }

    /// A writing handle of `ino` closed; true when it was the last.
    pub(super) fn writer_closed(&self, ino: Ino) -> bool {
        let mut w = self.open_writers.lock();
        match w.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                w.remove(&ino);
                true
            }
        }
    }

    /// Inodes open for writing now.
    pub(super) fn open_writers(&self) -> Vec<Ino> {
        self.open_writers.lock().keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_answers_by_sequence() {
        let mut j = Journal::default();
        assert_eq!(j.since(0), Since::Paths(vec![]));
        j.record(b"a");
        j.record(b"b/c");
        let mid = j.seq();
        j.record(b"a");
        assert_eq!(
            j.since(0),
            Since::Paths(vec![b"a".to_vec(), b"b/c".to_vec()])
        );
        assert_eq!(j.since(mid), Since::Paths(vec![b"a".to_vec()]));
        assert_eq!(j.since(j.seq()), Since::Paths(vec![]));
        // A token from the future (another life of this journal) is not trusted.
        assert_eq!(j.since(j.seq() + 1), Since::Everything);
    }

    #[test]
    fn journal_overflow_answers_everything_for_old_tokens() {
        let mut j = Journal::default();
        for i in 0..(JOURNAL_CAPACITY + 10) {
            j.record(format!("f{i}").as_bytes());
        }
        assert_eq!(j.since(3), Since::Everything);
        let recent = j.seq() - 2;
        assert_eq!(
            j.since(recent),
            Since::Paths(vec![
                format!("f{}", JOURNAL_CAPACITY + 8).into_bytes(),
                format!("f{}", JOURNAL_CAPACITY + 9).into_bytes(),
            ])
        );
    }
}
