//! Turns as the daemon keeps them: the running turns read from the store (`.control/turns`
//! lists them), and for a guarded one the gate the filesystem asks before every request
//! that would change the worktree. A request from a process that is neither the turn's
//! nor one of its descendants is refused (EBUSY); one that cannot be told is refused too.
//! Reads never ask.
//!
//! The turn's row is the truth (`store::turns`); this table is what the daemon read of it
//! last, re-read whenever the store changes (the CLI looks up `.control/refresh` after it
//! begins or ends a turn, so the gate is in place before the turn's command starts).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::ids::WorktreeId;
use crate::process;
use crate::store::TurnRow;

/// The running turns, by worktree.
#[derive(Default)]
pub struct Turns {
    running: RwLock<HashMap<WorktreeId, Running>>,
    /// How many of them are guarded: while none is, no request pays anything.
    guarded: AtomicUsize,
    /// Requests that change something in a worktree, in progress, counted by the epoch
    /// they began in and their worktree (`begin_change`): a guard is in place for every
    /// request once those in its worktree that began before it was set have ended
    /// (`settle` begins a new epoch and waits for the older ones there to end; a slow
    /// change in another worktree does not hold it up).
    in_flight: Mutex<Epochs>,
    /// One `settle_new` at a time.
    settling: Mutex<()>,
}

#[derive(Default)]
struct Epochs {
    now: u64,
    /// Requests in progress, by the epoch they began in and their worktree (no entry:
    /// none).
    by_epoch: std::collections::BTreeMap<(u64, WorktreeId), usize>,
}

/// The most refusals of one turn recorded as events (each process's first); past that,
/// refusals are only logged (a fork loop outside must not fill the database).
const REFUSAL_EVENTS: usize = 32;

struct Running {
    turn: TurnRow,
    /// The processes refused so far (each refusal is logged; the first of each process
    /// is an event too, up to `REFUSAL_EVENTS`).
    refused: Mutex<HashSet<i32>>,
    /// Its guard is in place for every request: those that began before it have ended.
    settled: std::sync::atomic::AtomicBool,
}

/// A request that changes something, in progress (counted until it is dropped).
/// One outside every worktree is not counted (no guard covers it).
pub struct Change<'a> {
    turns: &'a Turns,
    /// (epoch, worktree), when counted.
    key: Option<(u64, WorktreeId)>,
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        let Some(key) = self.key else {
            return;
        };
        let mut e = self.turns.in_flight.lock();
        if let Some(n) = e.by_epoch.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                e.by_epoch.remove(&key);
            }
        }
    }
}

/// A request the gate refuses.
#[derive(Debug)]
pub struct Refusal {
    pub turn: TurnRow,
    /// The process asking (thread group).
    pub pid: i32,
    /// Why, for the log line and the event.
    pub message: String,
    /// The first refusal of this process during this turn.
    pub first: bool,
}

impl Turns {
    /// Replaces the table with `rows` (a turn still running keeps what it refused).
    pub fn set(&self, rows: Vec<TurnRow>) {
        let mut map = self.running.write();
        let mut old = std::mem::take(&mut *map);
        for turn in rows {
            let (refused, settled) = old
                .remove(&turn.worktree_id)
                .filter(|r| r.turn == turn)
                .map(|r| (r.refused, r.settled))
                .unwrap_or_default();
            map.insert(
                turn.worktree_id,
                Running {
                    turn,
                    refused,
                    settled,
                },
            );
        }
        self.guarded.store(
            map.values().filter(|r| r.turn.guard).count(),
            Ordering::Release,
        );
    }

    /// Whether any running turn is guarded (one atomic load: the cost of the gate while
    /// none is).
    pub fn any_guarded(&self) -> bool {
        self.guarded.load(Ordering::Acquire) > 0
    }

    /// The running turns, by repository and worktree.
    pub fn running(&self) -> Vec<TurnRow> {
        let mut v: Vec<TurnRow> = self
            .running
            .read()
            .values()
            .map(|r| r.turn.clone())
            .collect();
        v.sort_by(|a, b| (&a.repo, &a.worktree).cmp(&(&b.repo, &b.worktree)));
        v
    }

    /// A request that changes something in `worktree` (None: in none) begins: counted
    /// until the token is dropped (after the request is answered), so `settle` can wait
    /// for those that began before a guard. Counted before the guard is looked at.
    pub fn begin_change(&self, worktree: Option<WorktreeId>) -> Change<'_> {
        let Some(w) = worktree else {
            return Change {
                turns: self,
                key: None,
            };
        };
        let mut e = self.in_flight.lock();
        let key = (e.now, w);
        *e.by_epoch.entry(key).or_default() += 1;
        Change {
            turns: self,
            key: Some(key),
        }
    }

    /// Waits (up to `limit`) until every change request in one of `worktrees` that began
    /// before now has ended: those still in progress when a guard was set may have been
    /// let through before it. True when they all ended.
    pub fn settle(&self, worktrees: &HashSet<WorktreeId>, limit: std::time::Duration) -> bool {
        let old = {
            let mut e = self.in_flight.lock();
            e.now += 1;
            e.now - 1
        };
        let end = std::time::Instant::now() + limit;
        loop {
            let older = self
                .in_flight
                .lock()
                .by_epoch
                .range(..=(old, WorktreeId(i64::MAX)))
                .any(|((_, w), _)| worktrees.contains(w));
            if !older {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Settles (as [`Turns::settle`]) once for the guarded turns not settled yet, so a
    /// guard costs one wait when it comes and none after; those settled are marked so.
    /// True when every guarded turn is settled. Serialized: a second caller waits for the
    /// first's settle and sees its turns marked.
    pub fn settle_new(&self, limit: std::time::Duration) -> bool {
        let _one = self.settling.lock();
        let unsettled = |map: &HashMap<WorktreeId, Running>| {
            map.values()
                .filter(|r| r.turn.guard && !r.settled.load(Ordering::Acquire))
                .map(|r| r.turn.clone())
                .collect::<Vec<_>>()
        };
        let due = unsettled(&self.running.read());
        if due.is_empty() {
            return true;
        }
        let worktrees: HashSet<WorktreeId> = due.iter().map(|t| t.worktree_id).collect();
        if !self.settle(&worktrees, limit) {
            return false;
        }
        let map = self.running.read();
        for t in due {
            if let Some(r) = map.get(&t.worktree_id).filter(|r| r.turn == t) {
                r.settled.store(true, Ordering::Release);
            }
        }
        true
    }

    /// Whether the thread `tid` may change worktree `worktree_id` now: always, unless a
    /// guarded turn runs there and `tid` is outside its process tree (or cannot be told).
    pub fn may_change(&self, worktree_id: WorktreeId, tid: u32) -> Result<(), Box<Refusal>> {
        if !self.any_guarded() {
            return Ok(());
        }
        // The row copied and the lock let go before /proc is read (a read of a process
        // that is stuck must not hold up a refresh of the table).
        let turn = match self.running.read().get(&worktree_id) {
            Some(r) if r.turn.guard => r.turn.clone(),
            _ => return Ok(()),
        };
        let root = (turn.pid, turn.pid_start);
        let tid = tid as i32;
        let why = match process::info::descends_from(tid, root) {
            Ok(true) => return Ok(()),
            Ok(false) => "outside its process tree".to_string(),
            Err(e) => format!("which cannot be told to be inside its process tree ({e})"),
        };
        let pid = process::info::tgid_of(tid).unwrap_or(tid);
        // Its name from `stat` (`cmdline` would wait for the process's memory map).
        let command = process::info::proc_info(pid)
            .map(|p| p.command)
            .unwrap_or_default();
        let first = match self.running.read().get(&worktree_id) {
            Some(r) if r.turn == turn => {
                let mut refused = r.refused.lock();
                refused.len() < REFUSAL_EVENTS && refused.insert(pid)
            }
            _ => false,
        };
        Err(Box::new(Refusal {
            message: format!(
                "pid {pid} ({command}) {why} may not change {}/{} during the guarded turn of \
                 session {} (pid {}: {})",
                turn.repo, turn.worktree, turn.session, turn.pid, turn.command
            ),
            turn,
            pid,
            first,
        }))
    }
}

pub use crate::report::Writer;

/// Every process but `skip` (and this one) writing a file below `dir` through a
/// descriptor or a shared writable mapping: writes the daemon never sees through the
/// gate, so a guarded turn does not start while they exist. Processes whose descriptors
/// this user cannot read are not seen (a root CLI sees all).
pub fn writers_inside(dir: &Path, skip: i32) -> Vec<Writer> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != skip && *pid != me);
    for pid in pids {
        let command = || process::info::command_line(pid).unwrap_or_default();
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for e in rd.flatten() {
                let Ok(target) = std::fs::read_link(e.path()) else {
                    continue;
                };
                if !target.starts_with(dir) {
                    continue;
                }
                let info = std::fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    e.file_name().to_string_lossy()
                ))
                .unwrap_or_default();
                if opened_for_writing(&info) {
                    out.push(Writer {
                        pid,
                        command: command(),
                        path: target,
                        how: "open for writing",
                    });
                }
            }
        }
        if let Ok(maps) = std::fs::read(format!("/proc/{pid}/maps")) {
            for line in maps.split(|b| *b == b'\n') {
                if let Some(path) = process::inside::shared_writable_below(line, dir) {
                    out.push(Writer {
                        pid,
                        command: command(),
                        path,
                        how: "mapped writable",
                    });
                }
            }
        }
    }
    out.dedup();
    out
}

/// Whether an `fdinfo` text's `flags:` (octal) open the file for writing.
fn opened_for_writing(fdinfo: &str) -> bool {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .is_some_and(|f| f & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(worktree_id: i64, pid: i64, start: i64, guard: bool) -> TurnRow {
        TurnRow {
            repo: "r".into(),
            worktree: format!("w{worktree_id}"),
            worktree_id: WorktreeId(worktree_id),
            session: "s".into(),
            pid,
            pid_start: start,
            command: "make".into(),
            guard,
            started_at: 1,
            took_lease: false,
        }
    }

    #[test]
    fn the_gate_refuses_only_outsiders_of_a_guarded_turn() {
        let me = process::info::proc_info(std::process::id() as i32).unwrap();
        let parent = process::info::proc_info(me.ppid).unwrap();
        let turns = Turns::default();
        // Nothing running, or not guarded: everyone may.
        assert!(turns.may_change(WorktreeId(1), me.pid as u32).is_ok());
        turns.set(vec![row(1, me.pid as i64, me.start as i64, false)]);
        assert!(turns.may_change(WorktreeId(1), parent.pid as u32).is_ok());
        // Guarded by this process: it and its threads may, its parent may not.
        turns.set(vec![row(1, me.pid as i64, me.start as i64, true)]);
        assert!(turns.may_change(WorktreeId(1), me.pid as u32).is_ok());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            let _ = done_rx.recv();
        });
        assert!(
            turns
                .may_change(WorktreeId(1), rx.recv().unwrap() as u32)
                .is_ok(),
            "its thread"
        );
        drop(done_tx);
        t.join().unwrap();
        let r = turns
            .may_change(WorktreeId(1), parent.pid as u32)
            .unwrap_err();
        assert!(r.first);
        assert!(
            r.message.contains("outside its process tree"),
            "{}",
            r.message
        );
        assert!(r.message.contains("session s"), "{}", r.message);
        assert!(
            !turns
                .may_change(WorktreeId(1), parent.pid as u32)
                .unwrap_err()
                .first
        );
        // Another worktree is not gated.
        assert!(turns.may_change(WorktreeId(2), parent.pid as u32).is_ok());
        // A child of this process is inside.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(turns.may_change(WorktreeId(1), child.id()).is_ok());
        child.kill().unwrap();
        child.wait().unwrap();
        // A pid that cannot be read is refused (fail closed).
        let gone = turns.may_change(WorktreeId(1), child.id()).unwrap_err();
        assert!(gone.message.contains("cannot be told"), "{}", gone.message);
        // A reused pid is not the turn's: another start time.
        turns.set(vec![row(1, me.pid as i64, me.start as i64 + 1, true)]);
        assert!(turns.may_change(WorktreeId(1), me.pid as u32).is_err());
        turns.set(Vec::new());
        assert!(turns.may_change(WorktreeId(1), parent.pid as u32).is_ok());
    }

    #[test]
    fn settle_waits_for_the_changes_that_began_before_it_in_its_worktree_and_only_those() {
        let turns = std::sync::Arc::new(Turns::default());
        let one: HashSet<WorktreeId> = [WorktreeId(1)].into();
        let limit = std::time::Duration::from_millis(20);
        assert!(turns.settle(&one, limit));
        let before = turns.begin_change(Some(WorktreeId(1)));
        assert!(!turns.settle(&one, limit), "one in flight");
        // A change in another worktree, or in none, does not hold it up.
        let elsewhere = turns.begin_change(Some(WorktreeId(2)));
        let nowhere = turns.begin_change(None);
        let t = turns.clone();
        let waiter = std::thread::spawn(move || {
            t.settle(&[WorktreeId(1)].into(), std::time::Duration::from_secs(5))
        });
        std::thread::sleep(limit);
        // One that begins now does not hold the settle up.
        let after = turns.begin_change(Some(WorktreeId(1)));
        std::thread::sleep(limit);
        drop(before);
        assert!(waiter.join().unwrap());
        assert!(
            !turns.settle(&[WorktreeId(2)].into(), limit),
            "worktree 2's is in flight"
        );
        drop(after);
        assert!(turns.settle(&one, limit));
        drop(elsewhere);
        drop(nowhere);
        assert!(turns.settle(&[WorktreeId(1), WorktreeId(2)].into(), limit));
    }

    #[test]
    fn writers_are_those_holding_a_file_open_for_writing_below_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "x").unwrap();
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec 3>>'{}'; exec 4<'{}'; exec sleep 5",
                path.display(),
                path.display()
            ))
            .spawn()
            .unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = Vec::new();
        while std::time::Instant::now() < end {
            found = writers_inside(dir.path(), 0);
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            found.len(),
            1,
            "only the descriptor open for writing: {found:?}"
        );
        assert_eq!(found[0].pid, child.id() as i32);
        assert_eq!(found[0].path, path);
        assert_eq!(found[0].how, "open for writing");
        assert!(writers_inside(dir.path(), 0).is_empty());
        assert!(opened_for_writing("pos:\t0\nflags:\t0102001\n"));
        assert!(!opened_for_writing("pos:\t0\nflags:\t0100000\n"));
    }
}
