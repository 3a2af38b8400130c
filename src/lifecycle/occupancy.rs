//! Who holds a worktree right now, for a command about to refuse because somebody does
//! (`reclaim`, and `rmdir` through the mount): every lease and every process inside, with each process lease's liveness
//! settled first. A holder that has exited, or whose process tree has left the worktree,
//! holds nothing; the daemon releases such a lease within two seconds (at once for an
//! exit, after a second of idleness for a departure), so a refusal waits for that rather
//! than naming a holder that is gone.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::process;
use crate::process::info::Liveness;
use crate::store::{LeaseRow, Store, StoreResult, WorktreeRow};

/// How long a command waits for the daemon to release the leases of holders that are
/// gone or have left, before it names them anyway: the daemon's last close lets go of a
/// holder idle for a second, checked every second.
pub const SETTLE: Duration = Duration::from_millis(3000);

/// One holder of a worktree.
#[derive(Debug, Clone)]
pub struct Holder {
    /// Its lease (None: a process inside that holds none, as after a bare `cd`).
    pub lease: Option<LeaseRow>,
    /// Its process, for a process holder.
    pub pid: Option<i64>,
    /// The process is the one asking or one of its ancestors (its own shell).
    pub yours: bool,
    /// Why its process could not be checked (it then counts as holding: fail closed).
    pub unchecked: Option<String>,
    /// Its process has exited or left, and the daemon has not released its lease yet.
    pub settling: bool,
}

/// Everything that holds worktree `row` (whose path under the mount, as the kernel names
/// it, is `path`), for process `me`. Waits up to [`SETTLE`] while a process lease's holder
/// is gone or has left (released by the daemon meanwhile); with `no_daemon`, nobody would
/// release those, so they are released here. Empty: nobody holds it.
pub fn holders_now(
    store: &mut Store,
    row: &WorktreeRow,
    path: &Path,
    me: i32,
    no_daemon: bool,
) -> StoreResult<Vec<Holder>> {
    let until = Instant::now() + SETTLE;
    loop {
        let (held, settling) = look(store, row, path, me)?;
        if no_daemon {
            for h in held.iter().filter(|h| h.settling) {
                if let Some(l) = &h.lease {
                    store.release_lease(
                        row.id,
                        &l.holder,
                        "released",
                        "holder gone (released by the command that asked, no daemon running)",
                    )?;
                }
            }
            if settling && Instant::now() < until {
                continue;
            }
        }
        if !settling || Instant::now() >= until {
            return Ok(held);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One look: the holders, and whether any of them is settling.
fn look(
    store: &Store,
    row: &WorktreeRow,
    path: &Path,
    me: i32,
) -> StoreResult<(Vec<Holder>, bool)> {
    let liveness = process::info::liveness_for(me);
    let mut out = Vec::new();
    let mut lease_pids = Vec::new();
    for l in store
        .leases()?
        .into_iter()
        .filter(|l| l.worktree_id == row.id)
    {
        let (pid, start) = match (l.pid, l.pid_start) {
            (Some(p), Some(s)) if l.holder_kind == "process" => (p, s),
            _ => {
                out.push(Holder {
                    lease: Some(l),
                    pid: None,
                    yours: false,
                    unchecked: None,
                    settling: false,
                });
                continue;
            }
        };
        lease_pids.push(pid);
        let (yours, unchecked, settling) = match liveness(pid, start) {
            Liveness::Gone => (false, None, true),
            Liveness::Unknown(why) => (false, Some(why), false),
            live => {
                // Alive, and none of its process tree inside: the daemon's last close
                // lets it go.
                let left = process::inside::tree_inside(pid as i32, path) == Some(false);
                (live == Liveness::Ours, None, left)
            }
        };
        out.push(Holder {
            lease: Some(l),
            pid: Some(pid),
            yours,
            unchecked,
            settling,
        });
    }
    let ours = |pid: i64| {
        process::info::proc_info(pid as i32)
            .is_some_and(|p| liveness(pid, p.start as i64) == Liveness::Ours)
    };
    for pid in process::inside::processes_inside(path, 0) {
        let pid = pid as i64;
        if lease_pids.contains(&pid) {
            continue;
        }
        out.push(Holder {
            lease: None,
            pid: Some(pid),
            yours: ours(pid),
            unchecked: None,
            settling: false,
        });
    }
    let settling = out.iter().any(|h| h.settling);
    Ok((out, settling))
}

/// The refusal of `reclaim` of `repo/name` while `held` hold it (waited `waited` seconds
/// for them with `--wait`): each holder named, since when and its last activity, whether
/// it is the caller's own (its shell), and the ways out, as a refused exclusive lease
/// names them (`occupied`, exit 3).
pub fn refusal(
    repo: &str,
    name: &str,
    held: &[Holder],
    waited: Option<u64>,
    now: i64,
) -> crate::report::Refusal {
    use crate::report::{holder_name, rfc3339, shapes, when};
    let target = format!("{repo}/{name}");
    let mut message = format!(
        "worktree '{target}' is held by {} holder{}, and reclaim removes a worktree only while nobody holds it:",
        held.len(),
        if held.len() == 1 { "" } else { "s" }
    );
    let mut holders = Vec::new();
    let mut releases = Vec::new();
    let mut any_process = false;
    for h in held {
        let command = h.pid.and_then(|p| process::info::command_line(p as i32));
        let named = match (&h.lease, h.pid) {
            (Some(l), _) => holder_name(l, command.as_deref()),
            (None, Some(pid)) => format!("pid {pid} ({})", command.as_deref().unwrap_or("?")),
            (None, None) => "?".to_string(),
        };
        message.push_str(&format!("\n  {named}"));
        match &h.lease {
            Some(l) => message.push_str(&format!(
                "{}, since {}, last active {}",
                if l.exclusive { ", exclusive" } else { "" },
                when(l.acquired_at, now),
                when(l.last_active(), now)
            )),
            None => message.push_str(", inside (no lease: it has made no request there yet)"),
        }
        if h.yours {
            message.push_str(" — yours: this command's own shell, or another of its ancestors");
        }
        if h.settling {
            message.push_str(" (it has exited or left; its lease is being released)");
        }
        if let Some(why) = &h.unchecked {
            message.push_str(&format!(
                " (whether it is still running cannot be checked: {why}; counted as holding it)"
            ));
        }
        match h.lease.as_ref().and_then(|l| l.session.as_deref()) {
            Some(s) => releases.push(format!("worktreefs lease release {target} --session {s}")),
            None => {
                any_process = true;
                releases.push(match h.pid {
                    Some(pid) if h.yours => {
                        format!("cd out of the worktree in your shell (pid {pid})")
                    }
                    Some(pid) => format!("pid {pid} leaves the worktree or exits"),
                    None => "the holder leaves the worktree".to_string(),
                });
            }
        }
        let l = h.lease.as_ref();
        holders.push(shapes::ReclaimHolderJson {
            holder: l.map(|l| l.holder.clone()),
            kind: l.map_or("process", |l| l.holder_kind.as_str()).to_string(),
            session: l.and_then(|l| l.session.clone()),
            pid: h.pid,
            command: command.or_else(|| l.and_then(|l| l.command.clone())),
            exclusive: l.is_some_and(|l| l.exclusive),
            acquired_at: l.map(|l| rfc3339(l.acquired_at)),
            last_active_at: l.map(|l| rfc3339(l.last_active())),
            leased: l.is_some(),
            yours: h.yours,
            settling: h.settling,
            unchecked: h.unchecked.clone(),
        });
    }
    if any_process {
        message.push_str("\na process lease ends by itself within two seconds once nothing of its process tree has its working directory or a file open inside the worktree, or when it exits");
    }
    if let Some(w) = waited {
        message.push_str(&format!("\n(waited {w} s for them to go)"));
    }
    message.push_str(&format!(
        "\nways out: {}, then reclaim again; or wait for them (`worktreefs reclaim {target} --wait SECS`)",
        releases.join("; ")
    ));
    crate::report::Refusal {
        json: shapes::value(shapes::ReclaimOccupiedJson {
            error: "occupied".into(),
            worktree: target,
            repo: repo.to_string(),
            name: name.to_string(),
            holders,
            waited_secs: waited,
            ways_out: shapes::ReclaimWaysOut {
                release: releases,
                wait: "--wait SECS".into(),
            },
        }),
        message,
        code: crate::report::EXIT_CONFLICT,
    }
}
