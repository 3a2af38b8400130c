//! Reaching a node's place in the upper layer: found from the node table, retried while
//! a rename or removal under way settles.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use super::error::{FsError, FsResult};
use super::place::{held, is_changing, stale_io, Place};
use super::view::View;
use crate::beneath;
use crate::ino::Ino;

impl View {
    /// Where node `ino`'s upper file is.
    pub(super) fn place(&self, ino: Ino) -> FsResult<Place> {
        let (wt, spec) = self.nodes.read().place_spec(ino)?;
        Place::find(wt, spec)
    }

    /// `attempt` on node `ino`, once more holding its worktree's `mutate` when it failed
    /// as a namespace change in flight would make it fail (see `is_changing`) and this
    /// thread holds none.
    fn settled<T>(
        &self,
        ino: Ino,
        attempt: impl Fn() -> FsResult<io::Result<T>>,
    ) -> FsResult<io::Result<T>> {
        let first = attempt();
        let changing = match &first {
            Ok(Err(e)) => is_changing(e.raw_os_error()),
            Err(e) => is_changing(Some(e.errno())),
            Ok(Ok(_)) => false,
        };
        if changing && !held() {
            let _m = self.lock_changes(ino);
            attempt()
        } else {
            first
        }
    }

    /// `f` on node `ino`'s upper file. A request that does not hold `mutate` and finds
    /// another file at the name tries once more holding it: a change to the name was in
    /// flight, and is done then.
    pub(super) fn at_place<T>(
        &self,
        ino: Ino,
        what: &str,
        f: impl Fn(&Place) -> io::Result<T>,
    ) -> FsResult<T> {
        self.settled(ino, || self.place(ino).map(|p| f(&p)))?
            .map_err(|e| FsError::io(format!("{what} of inode {ino}"), e))
    }

    /// The upper directory that directory node `ino` is, as an `O_PATH` descriptor,
    /// checked as `at_place` checks.
    pub(super) fn upper_dir(&self, ino: Ino) -> FsResult<OwnedFd> {
        self.upper_dir_stat(ino).map(|(fd, _)| fd)
    }

    /// As `upper_dir`, with the directory's attributes.
    pub(super) fn upper_dir_stat(&self, ino: Ino) -> FsResult<(OwnedFd, beneath::Stat)> {
        self.settled(ino, || {
            let (wt, rel, expect) = self.nodes.read().dir_spec(ino)?;
            Ok(beneath::dir(wt.upper.fd.as_fd(), &rel).and_then(|fd| {
                let st = beneath::fstat(fd.as_fd())?;
                if expect != 0 && st.st_ino != expect {
                    return Err(stale_io());
                }
                Ok((fd, st))
            }))
        })?
        .map_err(|e| FsError::io(format!("upper directory of inode {ino}"), e))
    }
}
