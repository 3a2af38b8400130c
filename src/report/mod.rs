//! Human-readable tables shared by the CLI and `.control/status`.

use crate::store::{LeaseRow, WorktreeRow};
use crate::table::Table;

pub mod shapes;
mod times;

pub use times::{parse_rfc3339, rfc3339};

/// A column a caller adds to the table of worktrees: its header, whether it is aligned
/// right, and its cell for each worktree.
pub struct Column<'a> {
    pub header: &'static str,
    pub right: bool,
    pub cell: &'a dyn Fn(&WorktreeRow) -> String,
}

/// The table `list`, `status` and `.control/status` show: every worktree, its state, its
/// leases and, where `inside` says (`list`, `status`), the processes inside it that hold
/// none (a shell that `cd`-ed in and made no request yet), and the columns `extra` adds;
/// then every lease.
pub fn status_table(
    rows: &[WorktreeRow],
    leases: &[LeaseRow],
    inside: Option<&dyn Fn(&WorktreeRow) -> usize>,
    extra: &[Column<'_>],
) -> String {
    let mut headers = vec!["REPO", "WORKTREE", "STATE", "LEASES"];
    if inside.is_some() {
        headers.push("INSIDE");
    }
    headers.extend(["BRANCH", "BASE"]);
    let first_extra = headers.len();
    headers.extend(extra.iter().map(|c| c.header));
    let mut t = Table::new(&headers).right(3);
    if inside.is_some() {
        t = t.right(4);
    }
    for (i, c) in extra.iter().enumerate() {
        if c.right {
            t = t.right(first_extra + i);
        }
    }
    for w in rows {
        let n = leases.iter().filter(|l| l.worktree_id == w.id).count();
        let mut cells = vec![
            w.repo.clone(),
            w.name.clone(),
            w.state.to_string(),
            n.to_string(),
        ];
        if let Some(f) = inside {
            cells.push(f(w).to_string());
        }
        cells.push(w.branch.as_deref().unwrap_or("(detached)").to_string());
        cells.push(w.base_commit[..w.base_commit.len().min(12)].to_string());
        cells.extend(extra.iter().map(|c| (c.cell)(w)));
        t.row(cells);
    }
    let mut out = listing(
        &t,
        "no worktrees (create one with `worktreefs new REPO/NAME`)",
    );
    if !leases.is_empty() {
        let mut l = Table::new(&["LEASE", "HOLDER"]);
        for x in leases {
            l.row([x.entry_name(), x.holder_label().to_string()]);
        }
        out.push('\n');
        out.push_str(&l.render());
    }
    out
}

/// `word` as a shell reads it back, for commands printed to be pasted: as it is when it
/// holds nothing a shell treats specially, else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@%=,".contains(c));
    if plain {
        word.to_string()
    } else if word.starts_with('-') && !word.contains('\'') {
        // An option-looking word stays one: `--` before it is the command's business.
        format!("'{word}'")
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `table`, or when it has no row, the one line `empty` ("no leases"): every listing says
/// "nothing here" the same way.
pub fn listing(table: &Table, empty: &str) -> String {
    if table.is_empty() {
        format!("{empty}\n")
    } else {
        table.render()
    }
}

/// A duration in seconds as people say it: `40 s`, `3 min`, `5 h`, `2 d`.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// A past moment for people: `14:02:11 (3 min ago)`, with the date when not today.
pub fn when(secs: i64, now: i64) -> String {
    let full = rfc3339(secs);
    let today = rfc3339(now);
    let shown = if full[..10] == today[..10] {
        full[11..19].to_string()
    } else {
        format!("{} {}", &full[..10], &full[11..19])
    };
    format!("{shown} ({} ago)", age(now - secs))
}

/// The table `worktreefs removed` prints: each kept removal, its size, when it was
/// removed and when it goes.
pub fn kept_table(rows: &[crate::store::KeptRow], keep_secs: i64, now: i64) -> String {
    let mut t = Table::new(&[
        "WORKTREE", "ID", "SIZE", "REMOVED", "GOES IN", "HEAD", "HOW",
    ])
    .right(1)
    .right(2);
    for k in rows {
        let head = k
            .head
            .trim()
            .strip_prefix("ref: refs/heads/")
            .map(str::to_string)
            .unwrap_or_else(|| k.head.trim().chars().take(12).collect());
        t.row([
            format!("{}/{}", k.repo, k.worktree),
            k.worktree_id.to_string(),
            human_bytes(k.bytes.max(0) as u64),
            format!("{} ago", age(now - k.kept_at)),
            age(k.kept_at + keep_secs - now),
            head,
            k.how.clone(),
        ]);
    }
    t.render()
}

/// `1.5 GiB`, `312 KiB`, `12 B`.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// The exit codes a command chooses (`cli::exit::EXIT_CODES` says them all; `run` and
/// `turn` otherwise end with their command's): a request that could not be carried out.
pub const EXIT_FAILED: u8 = 1;

/// Bad usage: arguments that do not parse (clap's own code too).
pub const EXIT_USAGE: u8 = 2;

/// A typed conflict: the worktree cannot be had now (somebody else holds it, or it is
/// deleting, removed or unknown).
pub const EXIT_CONFLICT: u8 = 3;

/// The exit code of `turn` when its command ran past `--timeout` and was ended
/// (timeout(1)'s code).
pub const EXIT_TIMED_OUT: i32 = 124;

/// A typed refusal: its message (for people, on stderr), its JSON (when asked for: one
/// of the shapes of [`shapes`]), and the exit code. Not a `std::error::Error`: it ends a
/// command through the command line's exit trait (its code, its JSON), and so cannot be
/// wrapped in another error that would hide them.
#[derive(Debug)]
pub struct Refusal {
    pub message: String,
    pub json: serde_json::Value,
    pub code: u8,
}

/// How a holder is named: `session s1`, or `pid 4242 (make -j8)` with its command now.
pub fn holder_name(l: &LeaseRow, command_now: Option<&str>) -> String {
    match (&l.session, l.pid) {
        (Some(s), _) => format!("session {s}"),
        (None, Some(pid)) => format!(
            "pid {pid} ({})",
            command_now.or(l.command.as_deref()).unwrap_or("?")
        ),
        _ => l.holder.clone(),
    }
}

/// The refusal of a named acquisition of `repo/name` for the holders `occupants`:
/// each named, since when and its last activity, and the ways out. `exclusive`: what was
/// asked; `waited`: seconds waited (`--wait`). `command_now` gives a process's current
/// command line.
pub fn occupied(
    repo: &str,
    name: &str,
    occupants: &[crate::store::Occupant],
    exclusive: bool,
    waited: Option<u64>,
    now: i64,
    command_now: &dyn Fn(i64) -> Option<String>,
) -> Refusal {
    let target = format!("{repo}/{name}");
    let why = if exclusive {
        "an exclusive lease is granted only while nobody else holds it"
    } else {
        "they hold it exclusively"
    };
    let mut message = format!(
        "worktree '{target}' is held by {} other holder{}, and {why}:",
        occupants.len(),
        if occupants.len() == 1 { "" } else { "s" }
    );
    let mut holders = Vec::new();
    let mut releases = Vec::new();
    for o in occupants {
        let l = &o.lease;
        let cmd = l.pid.and_then(command_now);
        message.push_str(&format!(
            "\n  {}{}, since {}, last active {}",
            holder_name(l, cmd.as_deref()),
            if l.exclusive { ", exclusive" } else { "" },
            when(l.acquired_at, now),
            when(l.last_active(), now)
        ));
        if let Some(why) = &o.unchecked {
            message.push_str(&format!(
                " (whether it is still running cannot be checked: {why}; counted as holding it)"
            ));
        }
        match &l.session {
            Some(s) => releases.push(format!("worktreefs lease release {target} --session {s}")),
            None => releases.push(format!(
                "end pid {} (its lease ends when it exits)",
                l.pid.unwrap_or(0)
            )),
        }
        holders.push(shapes::HolderJson {
            holder: l.holder.clone(),
            kind: l.holder_kind.clone(),
            session: l.session.clone(),
            pid: l.pid,
            command: cmd.or_else(|| l.command.clone()),
            exclusive: l.exclusive,
            acquired_at: rfc3339(l.acquired_at),
            last_active_at: rfc3339(l.last_active()),
            unchecked: o.unchecked.clone(),
        });
    }
    if let Some(w) = waited {
        message.push_str(&format!("\n(waited {w} s for them to go)"));
    }
    message.push_str(&format!(
        "\nways out: work in another worktree (`worktreefs new {repo}/<name>`), release the holder ({}), or wait for it (`--wait SECS`)",
        releases.join("; ")
    ));
    Refusal {
        json: shapes::value(shapes::OccupiedJson {
            error: "occupied".into(),
            worktree: target,
            repo: repo.to_string(),
            name: name.to_string(),
            exclusive,
            holders,
            waited_secs: waited,
            ways_out: shapes::WaysOut {
                new: format!("worktreefs new {repo}/<name>"),
                release: releases,
                wait: "--wait SECS".into(),
            },
        }),
        message,
        code: EXIT_CONFLICT,
    }
}

/// The refusal of a lease on `repo/name`, which is `state` (deleting, removed) or does not
/// exist (`state` None): the worktree cannot be leased; the way out is a new one.
pub fn unleasable(repo: &str, name: &str, state: Option<crate::lease::State>) -> Refusal {
    let target = format!("{repo}/{name}");
    let (kind, message) = match state {
        None => ("not-found", format!(
            "worktree '{target}' does not exist; see `worktreefs list`, or create it with `worktreefs new {target}`"
        )),
        Some(crate::lease::State::Removed) => ("removed", format!(
            "worktree '{target}' is removed (cleaned up after its last lease), so it cannot be leased; create a new one with `worktreefs new {target}` (or bring it back with `worktreefs restore {target}`)"
        )),
        Some(st) => ("deleting", format!(
            "worktree '{target}' is {}: it had no lease and its cleanup has begun, so it cannot be leased; create a new worktree with `worktreefs new {repo}/<name>`",
            st.as_str()
        )),
    };
    Refusal {
        json: shapes::value(shapes::UnleasableJson {
            error: kind.into(),
            worktree: target,
            repo: repo.to_string(),
            name: name.to_string(),
            state: state.map(|s| s.as_str().to_string()),
            did_you_mean: None,
            session: None,
        }),
        message,
        code: EXIT_CONFLICT,
    }
}

/// The refusal of a turn on `repo/name` while `turn` runs there: its session, command and
/// since when, and the ways out. `unchecked`: why its process could not be checked (then
/// it counts as running); `waited`: seconds waited (`--wait`).
pub fn busy(
    turn: &crate::store::TurnRow,
    unchecked: Option<&str>,
    waited: Option<u64>,
    now: i64,
    mountpoint: Option<&std::path::Path>,
) -> Refusal {
    let target = format!("{}/{}", turn.repo, turn.worktree);
    let mut message = format!(
        "worktree '{target}' is busy: the turn of session {} runs there (pid {}: {}{}), since {}",
        turn.session,
        turn.pid,
        turn.command,
        if turn.guard { ", guarded" } else { "" },
        when(turn.started_at, now)
    );
    if let Some(why) = unchecked {
        message.push_str(&format!(
            "\n(whether it is still running cannot be checked: {why}; counted as running)"
        ));
    }
    if let Some(w) = waited {
        message.push_str(&format!(
            "\n(waited {w} s for the turn of session {} to end)",
            turn.session
        ));
    }
    message.push_str(&format!(
        "\nways out: wait for it (`--wait SECS`), end it by releasing its session (`worktreefs lease release {target} --session {}`), or work in another worktree (`worktreefs new {}/<name>`)",
        turn.session, turn.repo
    ));
    let t = shapes::TurnJson::of(turn, mountpoint);
    Refusal {
        json: shapes::value(shapes::BusyJson {
            error: "busy".into(),
            worktree: target.clone(),
            repo: turn.repo.clone(),
            name: turn.worktree.clone(),
            turn: t,
            unchecked: unchecked.map(str::to_string),
            waited_secs: waited,
            ways_out: shapes::WaysOut {
                wait: "--wait SECS".into(),
                release: vec![format!(
                    "worktreefs lease release {target} --session {}",
                    turn.session
                )],
                new: format!("worktreefs new {}/<name>", turn.repo),
            },
        }),
        message,
        code: EXIT_CONFLICT,
    }
}

/// A process outside a turn that holds a file in the worktree open for writing, or mapped
/// shared and writable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub pid: i32,
    pub command: String,
    pub path: std::path::PathBuf,
    /// "open for writing" or "mapped writable".
    pub how: &'static str,
}

/// The refusal of a guarded turn on `repo/name` while processes outside it write files
/// there through descriptors or mappings (writes that never reach the gate): `writers`,
/// and `through_mount` files the daemon counts open for writing through the mount (some
/// perhaps by processes this command cannot see); `waited`: seconds waited (`--wait`).
pub fn writers_inside(
    repo: &str,
    name: &str,
    writers: &[Writer],
    through_mount: usize,
    waited: Option<u64>,
) -> Refusal {
    let target = format!("{repo}/{name}");
    let mut message = format!(
        "a guarded turn on '{target}' cannot start: {} outside it write{} there (writes through descriptors opened before the turn never reach the gate):",
        if writers.len() == 1 { "a process" } else { "processes" },
        if writers.len() == 1 { "s" } else { "" }
    );
    for w in writers {
        message.push_str(&format!(
            "\n  pid {} ({}) has {} {}",
            w.pid,
            w.command,
            w.path.display(),
            w.how
        ));
    }
    message.push_str(
        "\nways out: close those files or end those processes, wait for them (`--wait SECS`), or run the turn without `--guard`",
    );
    if through_mount > 0 {
        message.push_str(&format!(
            "\n({through_mount} file(s) there are open for writing through the mount, by the daemon's count{})",
            if writers.is_empty() {
                ", by processes this command cannot see (another user, another namespace)"
            } else {
                ""
            }
        ));
    }
    if let Some(w) = waited {
        message.push_str(&format!("\n(waited {w} s for them to close those files)"));
    }
    Refusal {
        json: shapes::value(shapes::WritersInsideJson {
            error: "writers-inside".into(),
            worktree: target,
            repo: repo.to_string(),
            name: name.to_string(),
            writers: writers
                .iter()
                .map(|w| shapes::WriterJson {
                    pid: w.pid,
                    command: w.command.clone(),
                    path: w.path.clone(),
                    how: w.how.to_string(),
                })
                .collect(),
            open_for_writing: (through_mount > 0).then_some(through_mount as u64),
            waited_secs: waited,
        }),
        message,
        code: EXIT_CONFLICT,
    }
}

/// A refusal about one worktree that asks nothing somebody else has (exit 1): the
/// worktree with `error` and, when given, the `session`.
pub fn refused(
    w: &crate::store::WorktreeRow,
    mountpoint: &std::path::Path,
    error: &str,
    session: Option<&str>,
    message: String,
) -> Refusal {
    Refusal {
        message,
        json: shapes::value(shapes::RefusedJson {
            worktree: shapes::WorktreeJson::of(w, mountpoint),
            error: error.to_string(),
            session: session.map(str::to_string),
        }),
        code: EXIT_FAILED,
    }
}

/// A worktree as an outcome's JSON names it (`new`, `lease release`, `reclaim` with
/// `--json`): the worktree, its path under the mount, its state, its branch and base, and
/// when it was made and last changed state (RFC 3339).
pub fn worktree_json(
    w: &crate::store::WorktreeRow,
    mountpoint: &std::path::Path,
) -> serde_json::Value {
    shapes::value(shapes::WorktreeJson::of(w, mountpoint))
}

/// A lease (`leases --json`, `.control/leases`, `status --json`), with the names the
/// occupancy refusal gives its holders.
pub fn lease_json(l: &LeaseRow) -> serde_json::Value {
    shapes::value(shapes::LeaseJson::of(l))
}

/// An event (`events --json`, one per line).
pub fn event_json(e: &crate::store::EventRow) -> serde_json::Value {
    shapes::value(shapes::EventJson::of(e))
}

/// A retained worktree (`retained --json`, `.control/retained`).
pub fn retained_json(r: &crate::store::RetainedRow) -> serde_json::Value {
    shapes::value(shapes::RetainedJson::of(r))
}

/// A kept removal (`removed --json`, `.control/removed`): when it goes, and where its
/// copy is when `kept_dir` is given.
pub fn kept_json(
    k: &crate::store::KeptRow,
    keep_secs: i64,
    kept_dir: Option<&std::path::Path>,
) -> serde_json::Value {
    shapes::value(shapes::KeptJson::of(k, keep_secs, kept_dir))
}

/// A message as people read it: without libgit2's internals, the `; class=Os (2)` and
/// `; code=NotFound (-3)` its errors end with (they stay in debug logs).
pub fn for_people(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = ["; class=", "; code="]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 2..];
        // `class=Name (n)` or `code=Name (-n)`: a word, a space, a parenthesised number.
        let end = tail.find(')').filter(|&e| {
            let inner = &tail[..e];
            inner.split_once(" (").is_some_and(|(word, n)| {
                word.split_once('=')
                    .is_some_and(|(_, w)| w.chars().all(|c| c.is_ascii_alphanumeric()))
                    && n.trim_start_matches('-')
                        .chars()
                        .all(|c| c.is_ascii_digit())
            })
        });
        match end {
            Some(e) => rest = &tail[e + 1..],
            None => {
                out.push_str("; ");
                rest = tail;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod people_tests {
    use super::*;

    #[test]
    fn rfc3339_times_read_back_as_the_seconds_they_were() {
        for secs in [0, 1, 951_782_400, 1_796_389_816, 4_102_444_800] {
            assert_eq!(
                parse_rfc3339(&rfc3339(secs)),
                Some(secs),
                "{}",
                rfc3339(secs)
            );
        }
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(parse_rfc3339("1969-12-31T19:00:00-05:00"), Some(0));
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-01 00:00:00Z",
            "2026-12-01T00:00:00",
            "2026-12-01T00:00:00+0100",
            "+026-12-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn libgit2_internals_are_taken_out_and_nothing_else() {
        let t = [
            (
                "failed to resolve path '/x': No such file or directory; class=Os (2); code=NotFound (-3)",
                "failed to resolve path '/x': No such file or directory",
            ),
            ("revspec 'x' not found; class=Reference (4); code=NotFound (-3); then more", "revspec 'x' not found; then more"),
            ("a; class=broken", "a; class=broken"),
            ("no internals here", "no internals here"),
        ];
        for (i, o) in t {
            assert_eq!(super::for_people(i), o, "{i}");
        }
    }
}
