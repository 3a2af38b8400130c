//! Work that may block for good (libgit2 opening a FIFO a user put where a file of their
//! repository was; a file of a filesystem that hangs), bounded in time: it runs on a
//! thread of its own, whoever waits for it waits at most a limit, and while one such
//! piece of work is still blocked past its limit, the next for the same thing does not
//! start (one stuck thread per thing at most, however often it is asked for).

use std::time::{Duration, Instant};

/// The work's outcome.
pub enum Bounded<T> {
    Done(T),
    /// It did not finish within the limit; its thread is left to end by itself (its
    /// answer goes nowhere).
    TimedOut,
    /// An earlier run for the same thing is still blocked, since that long.
    StillBlocked(Duration),
    /// So many runs (of any thing) are blocked that no other starts.
    TooMany(usize),
    /// Its thread ended without an answer (a panic: the daemon's log says why), or no
    /// thread could be had.
    Failed,
}

/// At most this many blocked runs per gate: past it, nothing more starts (each holds a
/// thread for good; the one who asks for more is told at once).
pub const MAX_BLOCKED: usize = 64;

/// One run: its key, its own number, since when it runs (or is blocked), and whether it
/// is past its limit.
struct Run<K> {
    key: K,
    id: u64,
    since: Instant,
    blocked: bool,
}

/// The runs of a gate, running or blocked past their limit.
pub struct Gate<K> {
    runs: parking_lot::Mutex<Vec<Run<K>>>,
    next: std::sync::atomic::AtomicU64,
}

impl<K: PartialEq + Clone + Send + 'static> Default for Gate<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Takes a run off its gate when its thread ends, however (a panic too).
struct Unmark<K: PartialEq + 'static> {
    runs: &'static parking_lot::Mutex<Vec<Run<K>>>,
    id: u64,
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<K: PartialEq + 'static> Drop for Unmark<K> {
    fn drop(&mut self) {
        let mut runs = self.runs.lock();
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        runs.retain(|r| r.id != self.id);
    }
}

impl<K: PartialEq + Clone + Send + 'static> Gate<K> {
    pub const fn new() -> Gate<K> {
        Gate {
            runs: parking_lot::const_mutex(Vec::new()),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Runs `work` for `key` on a thread named `name`, waiting at most `limit`.
    pub fn run<T: Send + 'static>(
        &'static self,
        key: K,
        name: String,
        limit: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Bounded<T> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut runs = self.runs.lock();
            if let Some(r) = runs.iter().find(|r| r.blocked && r.key == key) {
                return Bounded::StillBlocked(r.since.elapsed() + limit);
            }
            let blocked = runs.iter().filter(|r| r.blocked).count();
            if blocked >= MAX_BLOCKED {
                return Bounded::TooMany(blocked);
            }
            runs.push(Run {
                key,
                id,
                since: Instant::now(),
                blocked: false,
            });
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // Set when the run ends, under the gate's lock (so a timeout that marks it
        // blocked and its end that unmarks it never cross).
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let unmark = Unmark {
            runs: &self.runs,
            id,
            ended: ended.clone(),
        };
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let _unmark = unmark;
            let out = work();
            let _ = tx.send(out);
        });
        if let Err(e) = spawned {
            // Never run here instead: the caller may be one a blocked run must not hold
            // (a FUSE worker). The closure, and with it the mark, is gone.
            tracing::warn!("no thread for bounded work: {e}");
            return Bounded::Failed;
        }
        match rx.recv_timeout(limit) {
            Ok(out) => Bounded::Done(out),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Bounded::Failed,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let mut runs = self.runs.lock();
                if ended.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(runs);
                    // It ended just now.
                    return match rx.recv() {
                        Ok(out) => Bounded::Done(out),
                        Err(_) => Bounded::Failed,
                    };
                }
                if let Some(r) = runs.iter_mut().find(|r| r.id == id) {
                    r.blocked = true;
                    r.since = Instant::now();
                }
                Bounded::TimedOut
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static GATE: Gate<u32> = Gate::new();

    #[test]
    fn blocked_work_times_out_and_blocks_the_next_until_it_ends() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let r = GATE.run(1, "t".into(), Duration::from_millis(100), move || {
            let _ = wait.recv();
            5
        });
        assert!(matches!(r, Bounded::TimedOut));
        let r = GATE.run(1, "t".into(), Duration::from_millis(100), || 6);
        assert!(matches!(r, Bounded::StillBlocked(_)));
        // Another key is not held up.
        assert!(matches!(
            GATE.run(2, "t".into(), Duration::from_secs(5), || 7),
            Bounded::Done(7)
        ));
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match GATE.run(1, "t".into(), Duration::from_secs(5), || 8) {
                Bounded::Done(8) => break,
                Bounded::StillBlocked(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => panic!("the ended work still blocks"),
            }
        }
        // A run that panics after its limit does not block its key for good.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let r = GATE.run(3, "t".into(), Duration::from_millis(50), move || {
            let _ = wait.recv();
            panic!("a test's panic");
        });
        assert!(matches!(r, Bounded::TimedOut));
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !matches!(
            GATE.run(3, "t".into(), Duration::from_secs(5), || 9),
            Bounded::Done(9)
        ) {
            assert!(Instant::now() < deadline, "the panicked run still blocks");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
