//! Events written off the caller's thread. A filesystem request that refuses something
//! records why, but it must answer at once: the store's write can wait for another
//! connection's lock (up to the busy timeout), so the request only queues the event and
//! one writer thread, with its own connection, writes it.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

use super::Store;
use crate::ids::WorktreeId;

struct Event {
    worktree_id: WorktreeId,
    kind: String,
    holder: Option<String>,
    reason: String,
}

/// The queue and its writer, started on the first event (most views never record one).
pub struct EventQueue {
    state_dir: PathBuf,
    tx: OnceLock<Mutex<Sender<Event>>>,
}

impl EventQueue {
    pub fn new(state_dir: PathBuf) -> EventQueue {
        EventQueue {
            state_dir,
            tx: OnceLock::new(),
        }
    }

    /// Queues one event; never waits for the database.
    pub fn note(&self, worktree_id: WorktreeId, kind: &str, holder: Option<&str>, reason: &str) {
        let tx = self.tx.get_or_init(|| Mutex::new(self.start()));
        let ev = Event {
            worktree_id,
            kind: kind.into(),
            holder: holder.map(Into::into),
            reason: reason.into(),
        };
        if tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(ev)
            .is_err()
        {
            tracing::warn!("the event writer has stopped; a {kind} event was not recorded");
        }
    }

    fn start(&self) -> Sender<Event> {
        let (tx, rx) = channel::<Event>();
        let dir = self.state_dir.clone();
        let spawned = std::thread::Builder::new()
            .name("wtfs-events".into())
            .spawn(move || {
                let mut store = match Store::open(&dir) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("the event writer cannot open the store: {e}");
                        return;
                    }
                };
                // Ends when the queue's sender (the view) is dropped.
                for ev in rx {
                    if let Err(e) =
                        store.note_event(ev.worktree_id, &ev.kind, ev.holder.as_deref(), &ev.reason)
                    {
                        tracing::warn!("recording a {} event: {e}", ev.kind);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("starting the event writer: {e}");
        }
        tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event queued while another connection holds the write lock is written once the
    /// lock goes; the queueing itself returns at once.
    #[test]
    fn a_queued_event_waits_for_the_lock_and_not_the_caller() {
        let (dir, store, id) = crate::store::tests::store_with_worktree();
        let blocker = rusqlite::Connection::open(dir.path().join(super::super::DB_FILE)).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let q = EventQueue::new(dir.path().to_path_buf());
        let t = std::time::Instant::now();
        q.note(id, "turn-refused", Some("session a"), "busy");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        blocker.execute_batch("ROLLBACK").unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let events = store.events(0, 100).unwrap();
            if events.iter().any(|e| e.kind == "turn-refused") {
                break;
            }
            assert!(
                std::time::Instant::now() < end,
                "the event was never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
