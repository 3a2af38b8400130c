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
    /// Its thread ended without an answer (a panic: the daemon's log says why).
    Failed,
}

/// The things whose work is blocked past its limit, and since when.
pub struct Gate<K> {
    blocked: parking_lot::Mutex<Vec<(K, Instant)>>,
}

impl<K: PartialEq + Clone + Send + 'static> Default for Gate<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: PartialEq + Clone + Send + 'static> Gate<K> {
    pub const fn new() -> Gate<K> {
        Gate {
            blocked: parking_lot::const_mutex(Vec::new()),
        }
    }

    /// Runs `work` for `key` on a thread named `name`, waiting at most `limit`. Where no
    /// thread can be had, runs it here, unbounded, rather than not at all.
    pub fn run<T: Send + 'static>(
        &'static self,
        key: K,
        name: String,
        limit: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Bounded<T> {
        if let Some((_, since)) = self.blocked.lock().iter().find(|(k, _)| *k == key) {
            return Bounded::StillBlocked(since.elapsed() + limit);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // Set by the work when it ends, under the gate's lock (so a timeout that marks
        // the key blocked and an end that unmarks it never cross).
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended = done.clone();
        let mine = key.clone();
        let work = std::sync::Arc::new(parking_lot::Mutex::new(Some(work)));
        let handed = work.clone();
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let Some(work) = handed.lock().take() else {
                return;
            };
            let out = work();
            let mut blocked = self.blocked.lock();
            ended.store(true, std::sync::atomic::Ordering::Relaxed);
            blocked.retain(|(k, _)| *k != mine);
            drop(blocked);
            let _ = tx.send(out);
        });
        if let Err(e) = spawned {
            tracing::warn!("no thread for bounded work ({e}); run unbounded");
            return match work.lock().take() {
                Some(work) => Bounded::Done(work()),
                None => Bounded::Failed,
            };
        }
        match rx.recv_timeout(limit) {
            Ok(out) => Bounded::Done(out),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Bounded::Failed,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let mut blocked = self.blocked.lock();
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(blocked);
                    // It ended just now.
                    return match rx.recv() {
                        Ok(out) => Bounded::Done(out),
                        Err(_) => Bounded::Failed,
                    };
                }
                blocked.push((key, Instant::now()));
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
    }
}
