//! The watcher thread: a pidfd per holder tells it the moment the holder exits; the lease
//! then passes to a process still inside the worktree, or is released.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::process::info::{command_line, is_zombie_pid, proc_info, ProcInfo};
use crate::process::inside::{processes_inside, tree_inside};
use crate::process::pidfd::pidfd_open;
use crate::store::NewLease;

use super::tracker::{active_none, now_ms, Active, Op, Tracker, Watched};
use crate::ids::WorktreeId;

impl Tracker {
    /// Watches a holder's exit, once per (worktree, process); its activity cell (the one
    /// already watched, if it was).
    pub(super) fn watch(&self, w: Watched) -> Active {
        let mut watched = self.watched.lock();
        match watched
            .iter()
            .find(|x| x.worktree_id == w.worktree_id && x.info == w.info)
        {
            Some(x) => x.active.clone(),
            None => {
                let active = w.active.clone();
                watched.push(w);
                active
            }
        }
    }

    /// A holder exited: pass its lease to a process still inside, else release it.
    /// Its key is in `exiting` from the moment it left `watched` (the watcher puts it
    /// there under the same lock) until its lease is passed on or released.
    pub(super) fn holder_exited(&self, w: Watched) {
        let key = (w.worktree_id, w.info.pid, w.info.start);
        self.pass_on_or_release(w, "exited");
        self.exiting.lock().remove(&key);
    }

    /// Last close: a watched holder neither of whose process tree is inside its worktree
    /// any more (working directory, root, program, open file, mapping) lets go as if it had
    /// exited (its lease passed to a process still inside, else released). Run by the
    /// sweeper every second; it reads only the holders' own trees. A holder whose tree
    /// cannot be read (no `/proc/<pid>/task/*/children`) keeps its lease until it exits.
    /// Returns how many let go.
    pub fn release_departed(self: &Arc<Self>) -> usize {
        if self.stopped.load(Ordering::Acquire) {
            return 0;
        }
        // Only a holder idle for a second (no request from a process it covers), watched
        // for a second: one at work, whatever its working directory (a program writing
        // through absolute paths), is not let go between its requests.
        let now = now_ms();
        let holders: Vec<(WorktreeId, ProcInfo, PathBuf)> = self
            .watched
            .lock()
            .iter()
            .filter(|w| {
                w.since.elapsed() >= std::time::Duration::from_secs(1)
                    && now - w.active.load(Ordering::Relaxed) >= 1000
            })
            .map(|w| (w.worktree_id, w.info.clone(), w.worktree_path.clone()))
            .collect();
        let mut n = 0;
        for (worktree_id, info, path) in holders {
            if tree_inside(info.pid, &path) != Some(false) {
                continue;
            }
            // Still the same process (not exited and reused meanwhile), still watched.
            if proc_info(info.pid).is_none_or(|p| p.start != info.start) {
                continue;
            }
            let w = {
                let mut watched = self.watched.lock();
                let Some(i) = watched
                    .iter()
                    .position(|w| w.worktree_id == worktree_id && w.info == info)
                else {
                    continue;
                };
                let w = watched.remove(i);
                self.exiting
                    .lock()
                    .insert((worktree_id, info.pid, info.start));
                w
            };
            tracing::info!(
                "process {} ({}) left {}: nothing of its process tree is inside",
                info.pid,
                info.command,
                path.display()
            );
            // On a thread of its own, as an exit is (its scans for an heir take a
            // while): the sweeper goes on.
            let me = self.clone();
            let _ = std::thread::Builder::new()
                .name("lease-left".into())
                .spawn(move || {
                    let key = (w.worktree_id, w.info.pid, w.info.start);
                    me.pass_on_or_release(w, "left (nothing of its process tree is inside)");
                    me.exiting.lock().remove(&key);
                });
            n += 1;
        }
        n
    }

    pub(super) fn pass_on_or_release(&self, w: Watched, how: &str) {
        let holder = NewLease::Process {
            pid: w.info.pid,
            start: w.info.start,
            command: String::new(),
        }
        .holder();
        self.drop_covered(w.worktree_id);
        // A setup's runner: what it left inside is its setup's (ended with it), and its
        // lease ends as its setup does (`lifecycle::setup`), never passed on here.
        if self.runners.is_setup_runner(w.worktree_id, w.info.pid) {
            return;
        }
        // A process that is forking or exiting right now may be missing from one scan (a
        // zombie has no working directory; a child not yet forked is not there): look
        // again twice before concluding nobody is inside. Still well within a second.
        // The heir is watched (pidfd open, start time checked) before its lease is taken,
        // so no lease is ever recorded for a process nobody watches.
        let mut heir: Option<(ProcInfo, OwnedFd)> = None;
        'scan: for wait_ms in [0, 50, 200] {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            // Processes that hold a lease here already keep their own; the exited holder's
            // parent (a shell whose command ended) comes first, then the rest by pid.
            let holders: HashSet<i32> = self
                .watched
                .lock()
                .iter()
                .filter(|x| x.worktree_id == w.worktree_id)
                .map(|x| x.info.pid)
                .collect();
            let mut inside: Vec<i32> = processes_inside(&w.worktree_path, w.info.pid)
                .into_iter()
                .filter(|p| !holders.contains(p))
                .collect();
            inside.sort_by_key(|p| (*p != w.info.ppid, *p));
            tracing::debug!(
                "holder {} of {} exited; inside without a lease: {inside:?}",
                w.info.pid,
                w.worktree_path.display()
            );
            for pid in inside {
                let Some(pidfd) = pidfd_open(pid) else {
                    continue;
                };
                let Some(info) = proc_info(pid) else { continue };
                heir = Some((info, pidfd));
                break 'scan;
            }
        }
        // Through the queue, in order behind anything not yet written (the exited
        // holder's own lease, if it was kept in memory).
        match heir {
            Some((info, pidfd)) => {
                // The heir's lease first, so the worktree never looks unheld.
                let heir_lease = NewLease::Process {
                    pid: info.pid,
                    start: info.start,
                    command: command_line(info.pid).unwrap_or_else(|| info.command.clone()),
                };
                let reason = format!("holder {} {how}; {} is still inside", w.info.pid, info.pid);
                if self.gate.enter_continuing(w.worktree_id).is_ok() {
                    self.enqueue(Op::Acquire {
                        worktree_id: w.worktree_id,
                        lease: heir_lease,
                        reason: reason.clone(),
                        since: crate::store::now_secs(),
                    });
                    self.watch(Watched {
                        worktree_id: w.worktree_id,
                        worktree_path: w.worktree_path.clone(),
                        info,
                        pidfd,
                        active: active_none(),
                        since: std::time::Instant::now(),
                    });
                    // The watcher polls the heir's pidfd from now on, not a second later.
                    let _ = nix::unistd::write(&self.wake.1, b"w");
                }
                self.enqueue(Op::Release {
                    worktree_id: w.worktree_id,
                    holder,
                    kind: "passed",
                    reason,
                });
            }
            None => self.enqueue(Op::Release {
                worktree_id: w.worktree_id,
                holder,
                kind: "released",
                reason: format!("holder {how}"),
            }),
        }
        let left = self.drain();
        if left > 0 {
            tracing::warn!(
                "the lease of process {} ({how}) is released once the database can be written ({left} change(s) waiting)",
                w.info.pid
            );
        }
        (self.on_change)();
    }

    /// The watcher: waits on every holder's pidfd and the wake pipe; and the writer, which
    /// records the lease changes kept in memory as soon as the database takes them (on a
    /// thread of its own: a database locked for long must not delay noticing exits).
    pub fn spawn_watcher(self: &Arc<Self>) {
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-writer".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_millis(250));
                if !me.queue.lock().is_empty() {
                    me.drain();
                }
            });
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-watcher".into())
            .spawn(move || loop {
                let mut fds: Vec<libc::pollfd> = vec![libc::pollfd {
                    fd: me.wake.0.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // Who each descriptor polled is: another thread (a holder that left) may
                // close one meanwhile and a new holder get its number, so what fired is
                // told by who was polled, not by the number.
                let polled: Vec<(WorktreeId, ProcInfo)> = {
                    let watched = me.watched.lock();
                    fds.extend(watched.iter().map(|w| libc::pollfd {
                        fd: w.pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                    watched
                        .iter()
                        .map(|w| (w.worktree_id, w.info.clone()))
                        .collect()
                };
                // SAFETY: fds is a valid array of pollfd for its length.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
                if n <= 0 {
                    continue;
                }
                if fds[0].revents != 0 {
                    let mut buf = [0u8; 64];
                    let _ = nix::unistd::read(me.wake.0.as_raw_fd(), &mut buf);
                }
                let fired: Vec<&(WorktreeId, ProcInfo)> = fds[1..]
                    .iter()
                    .zip(&polled)
                    .filter(|(p, _)| p.revents != 0)
                    .map(|(_, who)| who)
                    .collect();
                if fired.is_empty() {
                    continue;
                }
                let gone: Vec<Watched> = {
                    let mut watched = me.watched.lock();
                    // Exited for sure (a descriptor closed under the poll fires too): its
                    // process no longer runs with that start time.
                    let (gone, keep): (Vec<Watched>, Vec<Watched>) =
                        watched.drain(..).partition(|w| {
                            fired
                                .iter()
                                .any(|(id, info)| *id == w.worktree_id && *info == w.info)
                                && proc_info(w.info.pid)
                                    .is_none_or(|p| p.start != w.info.start || is_zombie_pid(p.pid))
                        });
                    *watched = keep;
                    me.exiting.lock().extend(
                        gone.iter()
                            .map(|w| (w.worktree_id, w.info.pid, w.info.start)),
                    );
                    gone
                };
                // Each on its own thread: one exit's rescans must not delay another's.
                for w in gone {
                    let me = me.clone();
                    let _ = std::thread::Builder::new()
                        .name("lease-exit".into())
                        .spawn(move || me.holder_exited(w));
                }
            });
    }
}
