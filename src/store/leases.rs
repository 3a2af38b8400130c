//! Leases and the lifecycle transitions they drive, each in one transaction, and the
//! event log.

use crate::process::info::Liveness;
use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::steps::{event, lease_count, release_in, set_state, state_of};
use super::*;
use crate::ids::WorktreeId;

/// A lease to record: who holds it.
#[derive(Debug, Clone)]
pub enum NewLease {
    /// A process, identified by pid and start time (so a reused pid is never the holder).
    Process {
        pid: i32,
        start: u64,
        command: String,
    },
    /// A named lease of an orchestrator's session.
    Session { id: String },
}

/// A lease as its row's columns say it.
pub struct LeaseColumns {
    pub kind: &'static str,
    pub pid: Option<i64>,
    pub start: Option<i64>,
    pub command: Option<String>,
    pub session: Option<String>,
}

impl NewLease {
    /// The columns of its row (holder kind, pid and start time, command, session).
    pub fn columns(&self) -> LeaseColumns {
        match self {
            NewLease::Process {
                pid,
                start,
                command,
            } => LeaseColumns {
                kind: "process",
                pid: Some(*pid as i64),
                start: Some(*start as i64),
                command: Some(command.clone()),
                session: None,
            },
            NewLease::Session { id } => LeaseColumns {
                kind: "session",
                pid: None,
                start: None,
                command: None,
                session: Some(id.clone()),
            },
        }
    }

    /// The holder's key, unique per worktree: `pid:<pid>:<start>` or `session:<id>`.
    pub fn holder(&self) -> String {
        match self {
            NewLease::Process { pid, start, .. } => format!("pid:{pid}:{start}"),
            NewLease::Session { id } => format!("session:{id}"),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaseRow {
    pub repo: String,
    pub worktree: String,
    pub worktree_id: WorktreeId,
    pub holder_kind: String,
    pub holder: String,
    pub pid: Option<i64>,
    pub pid_start: Option<i64>,
    pub command: Option<String>,
    pub session: Option<String>,
    pub acquired_at: i64,
    /// Granted only while nobody else held the worktree; refuses other named leases.
    pub exclusive: bool,
    /// The last request the daemon saw from a process it covers (None: none seen since
    /// it was acquired).
    pub active_at: Option<i64>,
}

impl LeaseRow {
    /// Its last activity: the last request seen from a process it covers, else when it
    /// was acquired.
    pub fn last_active(&self) -> i64 {
        self.active_at
            .unwrap_or(self.acquired_at)
            .max(self.acquired_at)
    }

    /// The entry name under `.control/leases`.
    pub fn entry_name(&self) -> String {
        format!("{}:{}@{}", self.repo, self.worktree, self.holder)
    }

    /// Who holds it, for a person: the command line or the session id.
    pub fn holder_label(&self) -> &str {
        self.command
            .as_deref()
            .or(self.session.as_deref())
            .unwrap_or("")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    pub id: i64,
    pub at: i64,
    pub repo: Option<String>,
    pub worktree: Option<String>,
    pub kind: String,
    pub holder: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug)]
pub enum LeaseError {
    /// The worktree is deleting or removed; `state` names it.
    Conflict(crate::lease::Conflict, crate::lease::State),
    /// Somebody else holds it: an exclusive lease was asked while they do, or they hold
    /// one. Never for a process entering (the filesystem refuses no one).
    Occupied(Vec<Occupant>),
    Db(StoreError),
}

/// A holder that keeps a lease from being granted.
#[derive(Debug, Clone, Serialize)]
pub struct Occupant {
    #[serde(flatten)]
    pub lease: LeaseRow,
    /// Why its process could not be checked (then it counts: refusals fail closed).
    pub unchecked: Option<String>,
}

/// What a named acquisition asks, besides the lease.
pub struct Ask<'a> {
    /// Only while nobody else holds the worktree.
    pub exclusive: bool,
    /// How a process holder `(pid, start)` stands.
    pub liveness: &'a dyn Fn(i64, i64) -> Liveness,
}

impl From<rusqlite::Error> for LeaseError {
    fn from(e: rusqlite::Error) -> Self {
        LeaseError::Db(e.into())
    }
}

impl From<StoreError> for LeaseError {
    fn from(e: StoreError) -> Self {
        LeaseError::Db(e)
    }
}

pub(super) const LEASE_COLUMNS: &str =
    "r.name, w.name, l.worktree_id, l.holder_kind, l.holder, l.pid, \
     l.pid_start, l.command, l.session, l.acquired_at, l.exclusive, l.active_at";

pub(super) fn lease_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok(LeaseRow {
        repo: row.get(0)?,
        worktree: row.get(1)?,
        worktree_id: row.get(2)?,
        holder_kind: row.get(3)?,
        holder: row.get(4)?,
        pid: row.get(5)?,
        pid_start: row.get(6)?,
        command: row.get(7)?,
        session: row.get(8)?,
        acquired_at: row.get(9)?,
        exclusive: row.get(10)?,
        active_at: row.get(11)?,
    })
}

impl Store {
    /// Takes a lease on a worktree: refused while it is deleting or removed; a retained
    /// worktree leaves the retained store. One transaction. Returns false when the holder
    /// already had it. Occupancy is not looked at: a process entering is never refused.
    pub fn acquire_lease(
        &mut self,
        worktree_id: WorktreeId,
        lease: &NewLease,
        reason: &str,
    ) -> Result<bool, LeaseError> {
        self.acquire(worktree_id, lease, reason, None)
    }

    /// A named acquisition (`lease acquire`, `run`): as [`Store::acquire_lease`], and
    /// refused ([`LeaseError::Occupied`], naming them) while somebody else holds the
    /// worktree exclusively, or, when `ask` is exclusive, while somebody else holds it at
    /// all. A holder that already has it and asks exclusive has it so from now on.
    pub fn acquire_named(
        &mut self,
        worktree_id: WorktreeId,
        lease: &NewLease,
        reason: &str,
        ask: &Ask<'_>,
    ) -> Result<bool, LeaseError> {
        self.acquire(worktree_id, lease, reason, Some(ask))
    }

    /// The holders other than `holder` that refuse what `ask` asks.
    fn occupants(
        tx: &rusqlite::Transaction<'_>,
        worktree_id: WorktreeId,
        holder: &str,
        ask: &Ask<'_>,
    ) -> StoreResult<Vec<Occupant>> {
        let mut stmt = tx.prepare(&format!(
            "SELECT {LEASE_COLUMNS} FROM leases l JOIN worktrees w ON w.id = l.worktree_id
             JOIN repos r ON r.id = w.repo_id WHERE l.worktree_id = ?1 AND l.holder != ?2
             ORDER BY l.acquired_at, l.holder"
        ))?;
        let rows = stmt.query_map(params![worktree_id, holder], lease_from_row)?;
        let mut out = Vec::new();
        for l in rows {
            let l = l?;
            if !ask.exclusive && !l.exclusive {
                continue;
            }
            let unchecked = match (&l.pid, &l.pid_start) {
                (Some(pid), Some(start)) if l.holder_kind == "process" => {
                    match (ask.liveness)(*pid, *start) {
                        Liveness::Ours | Liveness::Gone => continue,
                        Liveness::Alive => None,
                        Liveness::Unknown(why) => Some(why),
                    }
                }
                _ => None,
            };
            out.push(Occupant {
                lease: l,
                unchecked,
            });
        }
        Ok(out)
    }

    fn acquire(
        &mut self,
        worktree_id: WorktreeId,
        lease: &NewLease,
        reason: &str,
        ask: Option<&Ask<'_>>,
    ) -> Result<bool, LeaseError> {
        use crate::lease::{on_acquire, State};
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let state = state_of(&tx, worktree_id)?;
        let next = on_acquire(state).map_err(|c| LeaseError::Conflict(c, state))?;
        let holder = lease.holder();
        // A holder that has it exclusively already asks nothing new (processes may have
        // entered since: they do not take it away).
        let held_exclusive: bool = tx
            .query_row(
                "SELECT exclusive FROM leases WHERE worktree_id = ?1 AND holder = ?2",
                params![worktree_id, holder],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false);
        if let Some(ask) = ask.filter(|_| !held_exclusive) {
            let occupants = Self::occupants(&tx, worktree_id, &holder, ask)?;
            if !occupants.is_empty() {
                return Err(LeaseError::Occupied(occupants));
            }
        }
        let exclusive = ask.is_some_and(|a| a.exclusive);
        let LeaseColumns {
            kind,
            pid,
            start,
            command,
            session,
        } = lease.columns();
        let inserted = tx.execute(
            "INSERT OR IGNORE INTO leases(worktree_id, holder_kind, holder, pid, pid_start, command, session, acquired_at, exclusive)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![worktree_id, kind, holder, pid, start, command, session, now_secs(), exclusive],
        )? == 1;
        if !inserted && exclusive {
            let upgraded = tx.execute(
                "UPDATE leases SET exclusive = 1 WHERE worktree_id = ?1 AND holder = ?2 AND exclusive = 0",
                params![worktree_id, holder],
            )? == 1;
            if upgraded {
                event(&tx, worktree_id, "exclusive", Some(&holder), reason)?;
            }
        }
        if state != next {
            set_state(&tx, worktree_id, next)?;
        }
        if state == State::Retained {
            tx.execute("DELETE FROM retained WHERE worktree_id = ?1", [worktree_id])?;
        }
        if inserted && state != State::Active {
            // A worktree taken up again after its last release (by a session or a
            // process) starts afresh: an earlier holder's reason is not this episode's.
            tx.execute(
                "UPDATE worktrees SET holder_reason = NULL WHERE id = ?1",
                [worktree_id],
            )?;
        }
        if inserted {
            let reason = if exclusive {
                format!("{reason} (exclusive)")
            } else {
                reason.to_string()
            };
            event(&tx, worktree_id, "acquired", Some(&holder), &reason)?;
        }
        tx.commit()?;
        Ok(inserted)
    }

    /// Sets whether `holder`'s lease on the worktree is exclusive (a run that made a plain
    /// lease exclusive gives it back as it was). True when its row changed.
    pub fn set_exclusive(
        &mut self,
        worktree_id: WorktreeId,
        holder: &str,
        exclusive: bool,
    ) -> StoreResult<bool> {
        Ok(self.conn.execute(
            "UPDATE leases SET exclusive = ?3 WHERE worktree_id = ?1 AND holder = ?2 AND exclusive != ?3",
            params![worktree_id, holder, exclusive],
        )? == 1)
    }

    /// Releases one holder's lease; the last release moves the worktree to `lingering`, in
    /// the same transaction. Returns false when there was no such lease.
    pub fn release_lease(
        &mut self,
        worktree_id: WorktreeId,
        holder: &str,
        kind: &str,
        reason: &str,
    ) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let removed = release_in(&tx, worktree_id, holder, kind, reason)?;
        if removed {
            super::steps::end_turn_of_session(
                &tx,
                worktree_id,
                holder,
                "its session's lease was released",
            )?;
        }
        tx.commit()?;
        Ok(removed)
    }

    /// Releases session lease `holder` (`session:<id>`) giving the holder's `reason` (e.g.
    /// `force-killed`): kept with the release event and on the worktree, shown with the
    /// retained entry if it is retained. As [`Store::release_lease`] otherwise.
    pub fn release_with_reason(
        &mut self,
        worktree_id: WorktreeId,
        holder: &str,
        reason: &str,
    ) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let said = format!("{}: {reason}", holder.replacen(':', " ", 1));
        let removed = release_in(
            &tx,
            worktree_id,
            holder,
            "released",
            &format!("named lease released: {reason}"),
        )?;
        if removed {
            super::steps::end_turn_of_session(
                &tx,
                worktree_id,
                holder,
                "its session's lease was released",
            )?;
            tx.execute(
                "UPDATE worktrees SET holder_reason = ?1 WHERE id = ?2",
                params![said, worktree_id],
            )?;
        }
        tx.commit()?;
        Ok(removed)
    }

    /// For every lingering worktree whose grace period is over and which has no lease:
    /// the `deleting` mark, written in the same transaction that finds no lease. Returns
    /// the ids marked.
    pub fn mark_deleting_after_grace(&mut self, linger: i64) -> StoreResult<Vec<WorktreeId>> {
        let ids: Vec<WorktreeId> = {
            let mut stmt = self.conn.prepare(&format!(
                "SELECT id FROM worktrees WHERE state = '{LINGERING}'"
            ))?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut marked = Vec::new();
        for id in ids {
            if self.mark_deleting_if_grace_over(id, linger)? {
                marked.push(id);
            }
        }
        Ok(marked)
    }

    /// Worktree `id`, when it is lingering past its grace period with no lease: the
    /// `deleting` mark, in the transaction that finds no lease. True when marked.
    pub fn mark_deleting_if_grace_over(
        &mut self,
        id: WorktreeId,
        linger: i64,
    ) -> StoreResult<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let state = state_of(&tx, id)?;
        let since: i64 = tx.query_row(
            "SELECT state_changed_at FROM worktrees WHERE id = ?1",
            [id],
            |r| r.get(0),
        )?;
        let over =
            crate::lease::grace_over(state, lease_count(&tx, id)?, since, now_secs(), linger);
        if over {
            set_state(&tx, id, crate::lease::State::Deleting)?;
            event(&tx, id, DELETING, None, &format!("no lease for {linger} s"))?;
        }
        tx.commit()?;
        Ok(over)
    }

    /// Lingering worktrees whose grace period is over: (id, repo, name).
    pub fn lingering_past(&self, linger: i64) -> StoreResult<Vec<(WorktreeId, String, String)>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT w.id, r.name, w.name FROM worktrees w JOIN repos r ON r.id = w.repo_id
             WHERE w.state = '{LINGERING}' AND ?1 - w.state_changed_at >= ?2"
        ))?;
        let rows = stmt.query_map(params![now_secs(), linger], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn leases(&self) -> StoreResult<Vec<LeaseRow>> {
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM leases l JOIN worktrees w ON w.id = l.worktree_id
             JOIN repos r ON r.id = w.repo_id ORDER BY r.name, w.name, l.holder"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], lease_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The newest `limit` events, oldest first, after event id `after`.
    pub fn events(&self, after: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT * FROM (
                SELECT e.id, e.at, r.name, w.name, e.kind, e.holder, e.reason
                FROM events e LEFT JOIN worktrees w ON w.id = e.worktree_id
                LEFT JOIN repos r ON r.id = w.repo_id
                WHERE e.id > ?1 ORDER BY e.id DESC LIMIT ?2
             ) ORDER BY 1",
        )?;
        let rows = stmt.query_map(params![after, limit], |row| {
            Ok(EventRow {
                id: row.get(0)?,
                at: row.get(1)?,
                repo: row.get(2)?,
                worktree: row.get(3)?,
                kind: row.get(4)?,
                holder: row.get(5)?,
                reason: row.get(6)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
    /// Releases every lease (unmount): each release is its own transaction and event.
    /// Returns how many were released.
    pub fn release_all_leases(&mut self, reason: &str) -> StoreResult<usize> {
        let mut n = 0;
        for l in self.leases()? {
            if self.release_lease(l.worktree_id, &l.holder, "released", reason)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Releases every process lease (an unmount that keeps the sessions' named leases).
    /// Returns how many were released.
    pub fn release_process_leases(&mut self, reason: &str) -> StoreResult<usize> {
        let mut n = 0;
        for l in self
            .leases()?
            .into_iter()
            .filter(|l| l.holder_kind == "process")
        {
            if self.release_lease(l.worktree_id, &l.holder, "released", reason)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Releases worktree `id`'s leases as an unmount's cleanup of it before the mount goes
    /// may: the process leases whose process is `gone` (pid, start time), and the named
    /// ones too when `named`: all of them, or none when one would be left (a live
    /// process's, a named one kept). Returns how many would be left.
    pub fn release_leases_of(
        &mut self,
        id: WorktreeId,
        named: bool,
        gone: &dyn Fn(i64, i64) -> bool,
        reason: &str,
    ) -> StoreResult<usize> {
        let (mut release, mut left) = (Vec::new(), 0);
        for l in self.leases()?.into_iter().filter(|l| l.worktree_id == id) {
            let goes = match (l.holder_kind.as_str(), l.pid, l.pid_start) {
                ("process", Some(pid), Some(start)) => gone(pid, start),
                ("process", ..) => false,
                _ => named,
            };
            if goes {
                release.push(l);
            } else {
                left += 1;
            }
        }
        if left > 0 {
            return Ok(left);
        }
        // In one transaction: all of them go, or none.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for l in release {
            if release_in(&tx, l.worktree_id, &l.holder, "released", reason)? {
                super::steps::end_turn_of_session(
                    &tx,
                    l.worktree_id,
                    &l.holder,
                    "its session's lease was released",
                )?;
            }
        }
        tx.commit()?;
        Ok(0)
    }

    /// The id of the newest event (0 when there is none).
    pub fn last_event_id(&self) -> StoreResult<i64> {
        Ok(self
            .conn
            .query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| r.get(0))?)
    }
}
