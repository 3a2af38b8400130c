//! Leases and the worktree lifecycle (docs/contract.md, "Leases", "Worktree lifecycle").
//!
//! ```text
//! ready ──lease──▶ active ──last release──▶ lingering ──grace over──▶ deleting ──▶ removed
//!   ▲                ▲                          │                         │
//!   │                └──────── lease ───────────┘                         └──▶ retained
//!   └──────────────────────────── lease / reclaim ◀──────────────────────────────┘
//! ```
//!
//! The decisions are pure functions here, tested row by row; `store/leases.rs` applies them inside
//! SQLite transactions (the last release and the `deleting` mark each in one).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Ready,
    Active,
    Lingering,
    Deleting,
    Removed,
    Retained,
}

impl State {
    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "ready" => State::Ready,
            "active" => State::Active,
            "lingering" => State::Lingering,
            "deleting" => State::Deleting,
            "removed" => State::Removed,
            "retained" => State::Retained,
            _ => return None,
        })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            State::Ready => "ready",
            State::Active => "active",
            State::Lingering => "lingering",
            State::Deleting => "deleting",
            State::Removed => "removed",
            State::Retained => "retained",
        }
    }
}

impl fmt::Display for State {
    /// Padded like a string (`{:<10}` in the status table).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Why a lease was refused: the worktree is on its way out or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    Deleting,
    Removed,
}

/// The state a worktree moves to when a lease is taken, or why it cannot be.
pub fn on_acquire(state: State) -> Result<State, Conflict> {
    match state {
        State::Deleting => Err(Conflict::Deleting),
        State::Removed => Err(Conflict::Removed),
        State::Ready | State::Active | State::Lingering | State::Retained => Ok(State::Active),
    }
}

/// The state after a release that leaves `remaining` leases.
pub fn on_release(state: State, remaining: usize) -> State {
    match (state, remaining) {
        (State::Active, 0) => State::Lingering,
        (s, _) => s,
    }
}

/// Whether a lingering worktree with no lease becomes `deleting` now: its grace period
/// (`linger` seconds, 0 allowed) has passed since it started lingering.
pub fn grace_over(
    state: State,
    leases: usize,
    lingering_since: i64,
    now: i64,
    linger: i64,
) -> bool {
    state == State::Lingering && leases == 0 && now - lingering_since >= linger
}

/// A session id for a named lease: 1 to 128 of `[A-Za-z0-9._:-]`.
pub fn validate_session(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err(format!(
            "session id '{id}' must be 1 to 128 characters long"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "session id '{id}' contains {c:?}: use only A-Z a-z 0-9 . _ : -"
        ));
    }
    Ok(())
}

/// A holder's reason for a release (`lease release --reason`): one line of at most 200
/// characters, no control characters (it is shown in tables and kept in events).
pub fn validate_reason(reason: &str) -> Result<(), String> {
    if reason.trim().is_empty() || reason.chars().count() > 200 {
        return Err(format!(
            "release reason {reason:?} must be 1 to 200 characters of text"
        ));
    }
    if let Some(c) = reason.chars().find(|c| c.is_control()) {
        return Err(format!(
            "release reason {reason:?} contains the control character {c:?}: give one line of text, e.g. force-killed"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_reason_is_one_line_of_text() {
        assert!(validate_reason("force-killed").is_ok());
        assert!(validate_reason("exited with unsaved work").is_ok());
        assert!(validate_reason(" ").is_err());
        assert!(validate_reason("a\nb").is_err());
        assert!(validate_reason("\u{1b}[31m").is_err());
        assert!(validate_reason(&"x".repeat(201)).is_err());
    }

    /// A state formats like its name, padding included (the status table aligns on it).
    #[test]
    fn a_state_formats_as_its_name_with_padding() {
        assert_eq!(format!("{:<10}|", State::Ready), "ready     |");
        assert_eq!(format!("{}", State::Deleting), "deleting");
        for s in [
            "ready",
            "active",
            "lingering",
            "deleting",
            "removed",
            "retained",
        ] {
            assert_eq!(State::parse(s).map(State::as_str), Some(s));
        }
    }
    use State::*;

    #[test]
    fn acquire_table() {
        let rows = [
            (Ready, Ok(Active)),
            (Active, Ok(Active)),
            (Lingering, Ok(Active)),
            (Retained, Ok(Active)),
            (Deleting, Err(Conflict::Deleting)),
            (Removed, Err(Conflict::Removed)),
        ];
        for (state, want) in rows {
            assert_eq!(on_acquire(state), want, "{state}");
        }
    }

    #[test]
    fn release_table() {
        let rows = [
            (Active, 0, Lingering),
            (Active, 1, Active),
            (Active, 3, Active),
            (Ready, 0, Ready),
            (Deleting, 0, Deleting),
            (Retained, 0, Retained),
        ];
        for (state, remaining, want) in rows {
            assert_eq!(on_release(state, remaining), want, "{state} {remaining}");
        }
    }

    #[test]
    fn grace_table() {
        // (state, leases, lingering since, now, linger) -> deleting?
        let rows = [
            (Lingering, 0, 100, 104, 5, false),
            (Lingering, 0, 100, 105, 5, true),
            (Lingering, 0, 100, 100, 0, true),
            (Lingering, 1, 100, 200, 5, false),
            (Active, 0, 100, 200, 5, false),
            (Ready, 0, 100, 200, 5, false),
            (Retained, 0, 100, 200, 5, false),
        ];
        for (state, leases, since, now, linger, want) in rows {
            assert_eq!(
                grace_over(state, leases, since, now, linger),
                want,
                "{state} {leases} {since} {now} {linger}"
            );
        }
    }

    #[test]
    fn states_round_trip() {
        for s in [Ready, Active, Lingering, Deleting, Removed, Retained] {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::parse("gone"), None);
    }

    #[test]
    fn session_ids() {
        assert!(validate_session("agent-7:run.3").is_ok());
        assert!(validate_session("").is_err());
        assert!(validate_session("has space").is_err());
        assert!(validate_session(&"x".repeat(129)).is_err());
    }
}
