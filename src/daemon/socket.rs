//! The daemon's socket, `<state>/daemon.sock`: how a command asks the live daemon for what
//! only it may do. `reclaim`: the move to `deleting` must see the leases the daemon keeps
//! in memory (`lifecycle::gate`), so while a daemon serves a state directory, the removal
//! runs in the daemon. `unmount`, before it unmounts: the cleanups that run a teardown
//! command in their worktree must run while the mount still serves it.
//!
//! One request per connection, one JSON line; the answer is JSON lines, the last one the
//! result. The socket is the owner's only (0600 in the private state directory), and the
//! daemon answers only its own user and root (`SO_PEERCRED`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::fs::View;
use crate::lifecycle::cleanup::{request_removal, request_removal_gated, Outcome, RequestError};
use crate::lifecycle::gate::Gate;
use crate::state::StateDir;
use crate::store::Store;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Reclaim {
        repo: String,
        name: String,
        discard: bool,
    },
    /// An unmount is about to unmount: the worktrees it would clean up that have a
    /// teardown command are cleaned up now (`lifecycle::cleanup::tear_down_before_unmount`).
    BeforeUnmount { keep_sessions: bool },
    /// Take a checkpoint of a worktree (`daemon::checkpoints`).
    Checkpoint {
        repo: String,
        name: String,
        label: Option<String>,
    },
    /// Rewind a worktree to one of its checkpoints.
    Rewind { repo: String, name: String, to: u64 },
}

/// One line of an answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "answer", rename_all = "kebab-case")]
pub enum Answer {
    /// What `--discard` throws away, before it does.
    Discarding {
        lines: Vec<String>,
    },
    Removed {
        detail: String,
    },
    /// The removal ran and failed; the worktree is retained with its files.
    Retained {
        reason: String,
    },
    /// Refused: it holds work.
    HoldsWork {
        reason: String,
    },
    /// Refused: leased, in use, being cleaned up.
    Busy {
        message: String,
    },
    /// Already removed.
    Gone {
        message: String,
    },
    /// Refused: its removal runs a teardown command inside it, and nothing is mounted.
    NotMounted {
        message: String,
    },
    Error {
        message: String,
    },
    /// The cleanup before an unmount has begun (its first line: a daemon that does not
    /// say so at once, stopped or stuck, is not waited for).
    BeforeUnmountBegun,
    /// The cleanup before an unmount is over: how many worktrees it removed and retained,
    /// and how many it left for the cleanup after the mount has gone.
    CleanedBeforeUnmount {
        removed: usize,
        retained: usize,
        left: usize,
    },
    /// A checkpoint was taken.
    Checkpoint {
        checkpoint: super::checkpoints::CheckpointInfo,
    },
    /// A rewind was done: to which checkpoint, the one taken first to undo it, and how
    /// many paths it put back.
    Rewound {
        to: super::checkpoints::CheckpointInfo,
        before: super::checkpoints::CheckpointInfo,
        changed: usize,
    },
    /// Refused for now (the message names why and the ways out).
    Refused {
        message: String,
    },
}

/// Binds the socket (a stale one from a daemon that died is replaced: this daemon holds
/// the state directory's lock) and answers on a thread of its own.
pub(super) fn serve(
    state: &StateDir,
    view: Arc<View>,
    gate: Arc<Gate>,
    mountpoint: PathBuf,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = state.socket();
    let _ = std::fs::remove_file(&path);
    let (_dir, addr) = addressable(&path)?;
    let listener =
        UnixListener::bind(&addr).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let state = state.clone();
    let _ = std::thread::Builder::new()
        .name("socket".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors, say: not a reason to spin.
                        tracing::warn!("the daemon's socket cannot accept: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                };
                let (state, view, gate, mountpoint) = (
                    state.clone(),
                    view.clone(),
                    gate.clone(),
                    mountpoint.clone(),
                );
                let _ = std::thread::Builder::new()
                    .name("socket-request".into())
                    .spawn(move || {
                        if let Err(e) = answer(conn, &state, &view, &gate, &mountpoint) {
                            tracing::warn!("a request on the daemon's socket failed: {e:#}");
                        }
                    });
            }
        });
    Ok(())
}

/// A path to bind or connect `path` by: itself, or when it is longer than a socket address
/// holds (108 bytes), the same name through a descriptor of its directory
/// (`/proc/self/fd/N/daemon.sock`), which is returned to be kept open meanwhile.
fn addressable(path: &Path) -> anyhow::Result<(Option<std::fs::File>, PathBuf)> {
    use std::os::fd::AsRawFd;
    if path.as_os_str().len() < 100 {
        return Ok((None, path.to_path_buf()));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let f = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .join(path.file_name().unwrap_or_default());
    Ok((Some(f), short))
}

fn peer_uid(conn: &UnixStream) -> Option<u32> {
    peer_cred(conn).map(|c| c.uid)
}

fn peer_pid(conn: &UnixStream) -> Option<i32> {
    peer_cred(conn).map(|c| c.pid).filter(|p| *p > 0)
}

fn peer_cred(conn: &UnixStream) -> Option<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket descriptor and a buffer of the size given.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

fn send(conn: &mut UnixStream, a: &Answer) -> anyhow::Result<()> {
    let mut line = serde_json::to_string(a)?;
    line.push('\n');
    conn.write_all(line.as_bytes())?;
    Ok(())
}

fn answer(
    mut conn: UnixStream,
    state: &StateDir,
    view: &View,
    gate: &Gate,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    let caller = peer_pid(&conn);
    match peer_uid(&conn) {
        Some(uid) if uid == me || uid == 0 => {}
        other => {
            let who = other.map_or("a process whose uid cannot be read".to_string(), |u| {
                format!("uid {u}")
            });
            tracing::warn!("a request on the daemon's socket from {who} was refused");
            return send(
                &mut conn,
                &Answer::Error {
                    message: "only the daemon's own user may ask it".into(),
                },
            );
        }
    }
    // One line, soon and not endless (only the owner can connect, but a stuck client
    // must not keep a thread forever).
    conn.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut line = String::new();
    std::io::Read::take(BufReader::new(conn.try_clone()?), 64 << 10).read_line(&mut line)?;
    let req: Request = serde_json::from_str(line.trim()).context("reading the request")?;
    let (repo, name, discard) = match req {
        Request::Reclaim {
            repo,
            name,
            discard,
        } => (repo, name, discard),
        Request::BeforeUnmount { keep_sessions } => {
            send(&mut conn, &Answer::BeforeUnmountBegun)?;
            let _asked = super::request::AtUnmount::from_keep_sessions(keep_sessions).asking();
            let a = match clean_up_before_unmount(state, view, gate, mountpoint, keep_sessions) {
                Ok(d) => Answer::CleanedBeforeUnmount {
                    removed: d.removed,
                    retained: d.retained,
                    left: d.left,
                },
                Err(e) => Answer::Error {
                    message: format!("{e:#}"),
                },
            };
            return send(&mut conn, &a);
        }
        Request::Checkpoint { repo, name, label } => {
            let store = Store::open(&state.root)?;
            let a = super::checkpoints::take(view, &store, &repo, &name, label);
            return send(&mut conn, &checkpoint_answer(a));
        }
        Request::Rewind { repo, name, to } => {
            let store = Store::open(&state.root)?;
            let a =
                super::checkpoints::rewind(view, &store, mountpoint, (&repo, &name), to, caller);
            return send(&mut conn, &checkpoint_answer(a));
        }
    };
    let mut store = Store::open(&state.root)?;
    let Some(row) = live_row(&store, &repo, &name)? else {
        return send(
            &mut conn,
            &Answer::Gone {
                message: format!("worktree {repo}/{name} does not exist"),
            },
        );
    };
    // What `--discard` throws away goes to the command before anything goes.
    // A command that stops reading (a pager, ^Z) loses those lines rather than holding
    // the removal, and its lock, forever.
    let mut out = conn.try_clone()?;
    out.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    let r = request_removal_gated(
        gate,
        &|| view.catalog_changed(),
        state,
        &mut store,
        &row,
        mountpoint,
        &view.inspection(),
        discard,
        &mut |d| {
            let _ = send(&mut out, &Answer::Discarding { lines: d.lines() });
        },
    );
    view.catalog_changed();
    // The kernel forgets the worktree's name before the command hears it is gone.
    view.await_invalidations(Duration::from_secs(10));
    send(&mut conn, &to_answer(r))
}

/// The cleanup before an unmount (`lifecycle::cleanup::tear_down_before_unmount`), run
/// in this daemon: asked through the socket, or by a signal's unmount.
pub(super) fn clean_up_before_unmount(
    state: &StateDir,
    view: &View,
    gate: &Gate,
    mountpoint: &Path,
    keep_sessions: bool,
) -> crate::lifecycle::error::LifecycleResult<crate::lifecycle::cleanup::BeforeUnmount> {
    crate::lifecycle::cleanup::tear_down_before_unmount(
        state,
        mountpoint,
        &view.inspection(),
        gate,
        keep_sessions,
        &|| view.catalog_changed(),
    )
}

/// Worktree `repo/name` unless it is removed (or never was).
fn live_row(
    store: &Store,
    repo: &str,
    name: &str,
) -> crate::store::StoreResult<Option<crate::store::WorktreeRow>> {
    Ok(store
        .worktree(repo, name)?
        .filter(|w| w.state != crate::lease::State::Removed))
}

fn checkpoint_answer(d: super::checkpoints::Done) -> Answer {
    use super::checkpoints::Done;
    match d {
        Done::Taken(checkpoint) => Answer::Checkpoint { checkpoint },
        Done::Rewound {
            to,
            before,
            changed,
        } => Answer::Rewound {
            to,
            before,
            changed,
        },
        Done::Refused(message) => Answer::Refused { message },
        Done::Gone(message) => Answer::Gone { message },
        Done::Failed(message) => Answer::Error { message },
    }
}

fn to_answer(r: Result<Outcome, RequestError>) -> Answer {
    match r {
        Ok(Outcome::Removed(detail)) => Answer::Removed { detail },
        Ok(Outcome::Retained(reason)) => Answer::Retained { reason },
        Ok(Outcome::Waiting(message)) => Answer::Busy { message },
        Err(RequestError::HoldsWork(reason)) => Answer::HoldsWork { reason },
        Err(RequestError::Busy(message)) => Answer::Busy { message },
        Err(RequestError::Gone(message)) => Answer::Gone { message },
        Err(RequestError::Other(e)) => Answer::Error {
            message: format!("{e:#}"),
        },
    }
}

/// How long a command waits for the daemon to take its request before it gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a command waits for each line of the daemon's answer (an inspection of a
/// large worktree hashes what it holds).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// `reclaim`: asked of the live daemon serving `state` when there is one, else done here
/// (no daemon: no lease is kept in memory anywhere). Each answer line goes to `each`.
pub fn reclaim(
    state: &StateDir,
    repo: &str,
    name: &str,
    discard: bool,
    each: &mut dyn FnMut(&Answer),
) -> anyhow::Result<()> {
    let Some(holder) = super::instance::running_daemon(state) else {
        let mut store = Store::open_described(&state.root)?;
        let Some(row) = live_row(&store, repo, name)? else {
            each(&Answer::Gone {
                message: format!("worktree {repo}/{name} does not exist"),
            });
            return Ok(());
        };
        // Its teardown command runs inside the worktree, which only a mount serves: never
        // skipped for want of one.
        if let Some(command) = store.hooks_of(row.repo_id)?.on_remove {
            each(&Answer::NotMounted {
                message: format!(
                    "worktree {repo}/{name}'s repository has a teardown command (`{command}`), which runs inside the worktree before it goes, and nothing is mounted for state dir {}; mount it (`worktreefs mount`) and reclaim again, or take the command away first (`worktreefs repo set {} --no-on-remove`)",
                    state.root.display(),
                    row.repo
                ),
            });
            return Ok(());
        }
        let mountpoint = crate::lifecycle::create::mountpoint_of(state, &store);
        // What `--discard` throws away is shown before anything goes.
        // No daemon: inspected as a daemon of the default settings would, with no view.
        let how = crate::lifecycle::cleanup::Inspection::default();
        // Left `deleting` by a mount's end (it waited for a mount to run its teardown,
        // since taken away) or by a daemon that died: finished here by cleanup's rules,
        // nobody else being at it (its cleanup lock says so); one it retains can then be
        // discarded.
        if row.state == crate::lease::State::Deleting {
            let r = match crate::lifecycle::cleanup::try_lock(state, row.id) {
                Some(_lock) => {
                    crate::lifecycle::cleanup::finish(state, &mut store, &row, &mountpoint, &how)
                        .map_err(RequestError::Other)
                }
                None => Err(RequestError::Busy(format!(
                    "worktree {repo}/{name} is being cleaned up right now; try again in a moment"
                ))),
            };
            each(&to_answer(r));
            return Ok(());
        }
        let r = request_removal(
            state,
            &mut store,
            &row,
            &mountpoint,
            &how,
            discard,
            &mut |d| each(&Answer::Discarding { lines: d.lines() }),
        );
        each(&to_answer(r));
        return Ok(());
    };
    let request = Request::Reclaim {
        repo: repo.into(),
        name: name.into(),
        discard,
    };
    let conn = match send_request(state, &request) {
        Ok(c) => c,
        Err(e) => {
            each(&Answer::Busy {
                message: format!(
                    "the daemon serving this state dir (pid {}) did not take the request: {e}; it alone may remove a worktree while it runs: try again, or unmount first",
                    holder.pid,
                ),
            });
            return Ok(());
        }
    };
    let mut got_result = false;
    for line in BufReader::new(conn).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                each(&Answer::Busy {
                    message: format!(
                        "the daemon (pid {}) did not answer within {} s; the removal may still finish: see `worktreefs list`, and {}",
                        holder.pid,
                        ANSWER_TIMEOUT.as_secs(),
                        state.log_file().display()
                    ),
                });
                return Ok(());
            }
            Err(e) => return Err(anyhow!("reading the daemon's answer: {e}")),
        };
        let a: Answer = serde_json::from_str(&line)
            .map_err(|e| anyhow!("the daemon's answer {line:?} is not understood: {e}"))?;
        got_result = !matches!(a, Answer::Discarding { .. });
        each(&a);
    }
    if !got_result {
        bail!(
            "the daemon (pid {}) ended the request without an answer; see {}",
            holder.pid,
            state.log_file().display()
        );
    }
    Ok(())
}

/// Connects to the daemon's socket for `state` (trying for [`CONNECT_TIMEOUT`]) and sends
/// `request`; the connection is returned to read the answer from. Err: why not.
fn send_request(state: &StateDir, request: &Request) -> anyhow::Result<UnixStream> {
    let path = state.socket();
    let (_dir, addr) = addressable(&path)?;
    let deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
    let mut conn = loop {
        match UnixStream::connect(&addr) {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!("connecting to {}: {e}", path.display());
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => bail!("connecting to {}: {e}", path.display()),
        }
    };
    let mut req = serde_json::to_string(request)?;
    req.push('\n');
    conn.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    conn.write_all(req.as_bytes())?;
    Ok(conn)
}

/// Asks the daemon serving `state` to clean up, before it is unmounted, the worktrees
/// the unmount would clean up that have a teardown command (see
/// `lifecycle::cleanup::tear_down_before_unmount`). Returns (removed, retained, left).
/// Err: no daemon, or it did not do it (why); the unmount's own cleanup then leaves
/// their removals for the next mount, which runs the teardowns first.
pub fn before_unmount(
    state: &StateDir,
    keep_sessions: bool,
) -> anyhow::Result<(usize, usize, usize)> {
    let conn = send_request(state, &Request::BeforeUnmount { keep_sessions })?;
    conn.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut answers = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    answers
        .read_line(&mut line)
        .context("waiting for the daemon to begin")?;
    match serde_json::from_str::<Answer>(line.trim()) {
        Ok(Answer::BeforeUnmountBegun) => {}
        Ok(Answer::Error { message }) => bail!("{message}"),
        _ if line.is_empty() => bail!(
            "the daemon ended the request without an answer (a daemon older than this command does not know it)"
        ),
        _ => bail!("the daemon's answer {line:?} is not understood"),
    }
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    line.clear();
    if let Err(e) = answers.read_line(&mut line) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            bail!(
                "it is still at it after {} s (it finishes before the daemon exits)",
                ANSWER_TIMEOUT.as_secs()
            );
        }
        return Err(anyhow!("reading the daemon's answer: {e}"));
    }
    match serde_json::from_str::<Answer>(line.trim()) {
        Ok(Answer::CleanedBeforeUnmount {
            removed,
            retained,
            left,
        }) => Ok((removed, retained, left)),
        Ok(Answer::Error { message }) => bail!("{message}"),
        Ok(other) => bail!("the daemon answered {other:?}"),
        Err(_) if line.is_empty() => bail!("the daemon ended the request without an answer"),
        Err(e) => bail!("the daemon's answer {line:?} is not understood: {e}"),
    }
}

/// Asks the daemon serving `state` to do `request` (a checkpoint or a rewind) and
/// returns its answer. Err: no daemon serves it, or it did not answer.
pub fn ask(state: &StateDir, request: &Request) -> anyhow::Result<Answer> {
    if super::instance::running_daemon(state).is_none() {
        bail!(
            "nothing is mounted for state dir {}: checkpoints are taken and rewound by the daemon that serves the worktree; mount it first (`worktreefs mount`)",
            state.root.display()
        );
    }
    let conn = send_request(state, request)?;
    let mut line = String::new();
    BufReader::new(conn)
        .read_line(&mut line)
        .context("reading the daemon's answer")?;
    if line.is_empty() {
        bail!(
            "the daemon ended the request without an answer; see {}",
            state.log_file().display()
        );
    }
    serde_json::from_str(line.trim())
        .map_err(|e| anyhow!("the daemon's answer {line:?} is not understood: {e}"))
}
