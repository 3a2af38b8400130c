//! Turns: at most one running turn per worktree among all its holders (the row's key is
//! the worktree), each for a session holding a named lease, run by one process (pid and
//! start time, so a reused pid is never the turn's). A turn ends when its command exits,
//! when its session's lease is released (same transaction), or when its process is found
//! gone (by the next one to ask, the daemon's sweeper, boot reconcile).

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::steps::{event, release_in, state_of};
use super::*;
use crate::ids::WorktreeId;
use crate::process::info::Liveness;

/// A turn to begin.
#[derive(Debug, Clone)]
pub struct NewTurn {
    pub session: String,
    pub pid: i32,
    pub start: u64,
    pub command: String,
    pub guard: bool,
    /// It took its session's lease: the lease goes when the turn ends, however it ends.
    pub took_lease: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TurnRow {
    pub repo: String,
    pub worktree: String,
    pub worktree_id: WorktreeId,
    pub session: String,
    pub pid: i64,
    pub pid_start: i64,
    pub command: String,
    pub guard: bool,
    pub started_at: i64,
    pub took_lease: bool,
}

impl TurnRow {
    /// The entry name under `.control/turns`.
    pub fn entry_name(&self) -> String {
        format!("{}:{}", self.repo, self.worktree)
    }

    /// The holder key of its session's lease.
    pub fn holder(&self) -> String {
        format!("session:{}", self.session)
    }
}

#[derive(Debug)]
pub enum TurnError {
    /// Another turn runs; `unchecked` says why its process could not be checked (then it
    /// counts as running: a refusal fails closed).
    Busy {
        turn: Box<TurnRow>,
        unchecked: Option<String>,
    },
    /// The session holds no lease on the worktree (released meanwhile).
    NotHeld,
    /// The worktree is not active (deleting, removed, retained...).
    State(crate::lease::State),
    Db(StoreError),
}

impl From<rusqlite::Error> for TurnError {
    fn from(e: rusqlite::Error) -> Self {
        TurnError::Db(e.into())
    }
}

impl From<StoreError> for TurnError {
    fn from(e: StoreError) -> Self {
        TurnError::Db(e)
    }
}

const TURN_COLUMNS: &str = "r.name, w.name, t.worktree_id, t.session, t.pid, t.pid_start, \
     t.command, t.guard, t.started_at, t.took_lease";

fn turn_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<TurnRow> {
    Ok(TurnRow {
        repo: row.get(0)?,
        worktree: row.get(1)?,
        worktree_id: row.get(2)?,
        session: row.get(3)?,
        pid: row.get(4)?,
        pid_start: row.get(5)?,
        command: row.get(6)?,
        guard: row.get(7)?,
        started_at: row.get(8)?,
        took_lease: row.get(9)?,
    })
}

fn turn_of(
    tx: &rusqlite::Transaction<'_>,
    worktree_id: WorktreeId,
) -> StoreResult<Option<TurnRow>> {
    Ok(tx
        .query_row(
            &format!(
                "SELECT {TURN_COLUMNS} FROM turns t JOIN worktrees w ON w.id = t.worktree_id
             JOIN repos r ON r.id = w.repo_id WHERE t.worktree_id = ?1"
            ),
            [worktree_id],
            turn_from_row,
        )
        .optional()?)
}

/// Ends `running` in the caller's transaction, giving back the session's lease if the
/// turn took it.
fn end_in(tx: &rusqlite::Transaction<'_>, running: &TurnRow, reason: &str) -> StoreResult<()> {
    let id = running.worktree_id;
    tx.execute("DELETE FROM turns WHERE worktree_id = ?1", [id])?;
    event(tx, id, "turn-ended", Some(&running.holder()), reason)?;
    if running.took_lease {
        release_in(
            tx,
            id,
            &running.holder(),
            "released",
            "its turn, which took it, ended",
        )?;
    }
    Ok(())
}

impl Store {
    /// Begins `turn` on the worktree, in one transaction: refused while another turn runs
    /// (one whose process `liveness` finds gone is ended first), unless the session holds
    /// a lease on the worktree and the worktree is active.
    pub fn begin_turn(
        &mut self,
        worktree_id: WorktreeId,
        turn: &NewTurn,
        liveness: &dyn Fn(i64, i64) -> Liveness,
    ) -> Result<TurnRow, TurnError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if let Some(running) = turn_of(&tx, worktree_id)? {
            match liveness(running.pid, running.pid_start) {
                Liveness::Gone => {
                    end_in(
                        &tx,
                        &running,
                        &format!("its process {} is gone", running.pid),
                    )?;
                }
                // Its own ancestor is running a turn: a second turn all the same.
                Liveness::Ours | Liveness::Alive => {
                    return Err(TurnError::Busy {
                        turn: Box::new(running),
                        unchecked: None,
                    })
                }
                Liveness::Unknown(why) => {
                    return Err(TurnError::Busy {
                        turn: Box::new(running),
                        unchecked: Some(why),
                    })
                }
            }
        }
        let state = state_of(&tx, worktree_id)?;
        if state != crate::lease::State::Active {
            return Err(TurnError::State(state));
        }
        let holder = format!("session:{}", turn.session);
        let held: bool = tx.query_row(
            "SELECT count(*) > 0 FROM leases WHERE worktree_id = ?1 AND holder = ?2",
            params![worktree_id, holder],
            |r| r.get(0),
        )?;
        if !held {
            return Err(TurnError::NotHeld);
        }
        tx.execute(
            "INSERT INTO turns(worktree_id, session, pid, pid_start, command, guard, started_at, took_lease)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                worktree_id,
                turn.session,
                turn.pid,
                turn.start as i64,
                turn.command,
                turn.guard,
                now_secs(),
                turn.took_lease
            ],
        )?;
        let what = format!(
            "pid {}: {}{}",
            turn.pid,
            turn.command,
            if turn.guard { " (guarded)" } else { "" }
        );
        event(&tx, worktree_id, "turn-started", Some(&holder), &what)?;
        let row = turn_of(&tx, worktree_id)?.expect("the row just written");
        tx.commit()?;
        Ok(row)
    }

    /// Ends the worktree's turn if it is still the one run by `(pid, start)` (a turn that
    /// ended meanwhile, and another begun since, are left alone). True when it ended.
    pub fn end_turn(
        &mut self,
        worktree_id: WorktreeId,
        (pid, start): (i64, i64),
        reason: &str,
    ) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let Some(running) = turn_of(&tx, worktree_id)? else {
            return Ok(false);
        };
        if (running.pid, running.pid_start) != (pid, start) {
            return Ok(false);
        }
        end_in(&tx, &running, reason)?;
        tx.commit()?;
        Ok(true)
    }

    /// Every running turn, by repository and worktree.
    pub fn turns(&self) -> StoreResult<Vec<TurnRow>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {TURN_COLUMNS} FROM turns t JOIN worktrees w ON w.id = t.worktree_id
             JOIN repos r ON r.id = w.repo_id ORDER BY r.name, w.name"
        ))?;
        let rows = stmt.query_map([], turn_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Ends every turn whose process `liveness` finds gone (the sweeper, boot reconcile).
    /// Returns those ended.
    pub fn end_dead_turns(
        &mut self,
        liveness: &dyn Fn(i64, i64) -> Liveness,
    ) -> StoreResult<Vec<TurnRow>> {
        let mut ended = Vec::new();
        for t in self.turns()? {
            if liveness(t.pid, t.pid_start) == Liveness::Gone
                && self.end_turn(
                    t.worktree_id,
                    (t.pid, t.pid_start),
                    &format!("its process {} is gone", t.pid),
                )?
            {
                ended.push(t);
            }
        }
        Ok(ended)
    }

    /// Writes one event outside any other change (a refusal the filesystem made).
    pub fn note_event(
        &mut self,
        worktree_id: WorktreeId,
        kind: &str,
        holder: Option<&str>,
        reason: &str,
    ) -> StoreResult<()> {
        let tx = self.conn.transaction()?;
        event(&tx, worktree_id, kind, holder, reason)?;
        Ok(tx.commit()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::store_with_worktree;
    use crate::store::NewLease;

    fn session(id: &str) -> NewLease {
        NewLease::Session { id: id.into() }
    }

    fn turn(session: &str, pid: i32) -> NewTurn {
        NewTurn {
            session: session.into(),
            pid,
            start: 7,
            command: "make".into(),
            guard: false,
            took_lease: false,
        }
    }

    #[test]
    fn one_turn_per_worktree_a_dead_ones_gate_opens_and_a_release_ends_it() {
        let (_d, mut s, id) = store_with_worktree();
        let alive = |_: i64, _: i64| Liveness::Alive;
        let gone = |_: i64, _: i64| Liveness::Gone;
        // No lease, no turn.
        assert!(matches!(
            s.begin_turn(id, &turn("a", 10), &alive),
            Err(TurnError::State(_) | TurnError::NotHeld)
        ));
        s.acquire_lease(id, &session("a"), "t").unwrap();
        s.acquire_lease(id, &session("b"), "t").unwrap();
        assert!(matches!(
            s.begin_turn(id, &turn("c", 10), &alive),
            Err(TurnError::NotHeld)
        ));
        let a = s.begin_turn(id, &turn("a", 10), &alive).unwrap();
        assert_eq!((a.session.as_str(), a.pid), ("a", 10));
        match s.begin_turn(id, &turn("b", 11), &alive) {
            Err(TurnError::Busy { turn, unchecked }) => {
                assert_eq!(turn.session, "a");
                assert_eq!(unchecked, None);
            }
            other => panic!("{other:?}"),
        }
        let unknown = |_: i64, _: i64| Liveness::Unknown("hidden".into());
        assert!(matches!(
            s.begin_turn(id, &turn("b", 11), &unknown),
            Err(TurnError::Busy {
                unchecked: Some(_),
                ..
            })
        ));
        // Ending someone else's turn changes nothing.
        assert!(!s.end_turn(id, (11, 7), "not mine").unwrap());
        assert_eq!(s.turns().unwrap().len(), 1);
        // Its process gone: the next one takes the gate.
        let b = s.begin_turn(id, &turn("b", 11), &gone).unwrap();
        assert_eq!(b.session, "b");
        // The sweeper ends dead turns only.
        assert!(s.end_dead_turns(&alive).unwrap().is_empty());
        // Releasing b's lease ends its turn in the same transaction.
        assert!(s.release_lease(id, "session:b", "released", "t").unwrap());
        assert!(s.turns().unwrap().is_empty());
        let kinds: Vec<String> = s
            .events(0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| k.starts_with("turn-"))
                .collect::<Vec<_>>(),
            ["turn-started", "turn-ended", "turn-started", "turn-ended"]
        );
        s.begin_turn(id, &turn("a", 12), &alive).unwrap();
        assert_eq!(s.end_dead_turns(&gone).unwrap().len(), 1);
        assert!(s.turns().unwrap().is_empty());
        // A turn that took its session's lease gives it back when it ends, dead or not.
        s.acquire_lease(id, &session("c"), "t").unwrap();
        let took = NewTurn {
            took_lease: true,
            ..turn("c", 13)
        };
        s.begin_turn(id, &took, &alive).unwrap();
        assert_eq!(s.end_dead_turns(&gone).unwrap().len(), 1);
        let holders: Vec<String> = s.leases().unwrap().into_iter().map(|l| l.holder).collect();
        assert_eq!(holders, ["session:a"]);
        s.acquire_lease(id, &session("c"), "t").unwrap();
        s.begin_turn(id, &took, &alive).unwrap();
        assert!(s.end_turn(id, (13, 7), "its command ended").unwrap());
        assert!(!s.leases().unwrap().iter().any(|l| l.holder == "session:c"));
    }
}
