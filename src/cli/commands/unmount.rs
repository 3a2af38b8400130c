//! `worktreefs unmount`: every lease released, cleanup, the mount ended; its progress
//! read from the events the daemon writes meanwhile.

use std::time::Duration;

use clap::Args;
use worktreefs::daemon;
use worktreefs::lease::State;
use worktreefs::report;
use worktreefs::state::StateDir;
use worktreefs::store::Store;

use crate::cli::state::open_store;

#[derive(Args)]
pub struct UnmountArgs {
    /// Detach now even with processes inside; the daemon finishes the cleanup in the
    /// background once they have left.
    #[arg(long)]
    pub lazy: bool,
    /// A planned restart, not a reclaim: named leases and their worktrees are kept for
    /// the next mount; only process leases are released (and what nobody then holds
    /// is cleaned up). The systemd units stop this way.
    #[arg(long)]
    pub keep_sessions: bool,
    /// The outcome as one JSON object on stdout, with each worktree's cleanup (see
    /// docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: UnmountArgs) -> anyhow::Result<()> {
    cmd_unmount(state, args.lazy, args.keep_sessions, args.json)
}

/// From how many worktrees to clean up unmount numbers its lines (`[3/14] …`).
const PROGRESS_FROM: usize = 4;

fn cmd_unmount(
    state: &StateDir,
    lazy: bool,
    keep_sessions: bool,
    json: bool,
) -> anyhow::Result<()> {
    let store = open_store(state)?;
    let since = store.last_event_id()?;
    drop(store);
    // What cleanup does, a line per worktree as it goes (read from the events the daemon
    // writes meanwhile), numbered when there are many; with --json, kept for the outcome.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = {
        let stop = stop.clone();
        let root = state.root.clone();
        std::thread::spawn(move || {
            let mut cleaned = Vec::new();
            let Ok(store) = Store::open(&root) else {
                return cleaned;
            };
            let (mut after, mut to_clean, mut done) = (since, 0usize, 0usize);
            loop {
                let last = stop.load(std::sync::atomic::Ordering::SeqCst);
                for e in store.events(after, 10_000).unwrap_or_default() {
                    after = e.id;
                    let target = format!(
                        "{}/{}",
                        e.repo.as_deref().unwrap_or("-"),
                        e.worktree.as_deref().unwrap_or("-")
                    );
                    if e.kind == State::Deleting.as_str() {
                        to_clean += 1;
                    } else if json
                        && (e.kind == State::Removed.as_str() || e.kind == State::Retained.as_str())
                    {
                        cleaned.push(serde_json::json!({
                            "worktree": target,
                            "repo": e.repo,
                            "name": e.worktree,
                            "state": e.kind,
                            "reason": e.reason,
                            "at": report::rfc3339(e.at),
                        }));
                    } else if e.kind == State::Removed.as_str()
                        || e.kind == State::Retained.as_str()
                    {
                        if done == 0 && to_clean >= PROGRESS_FROM {
                            println!("cleaning up {to_clean} worktrees left without a lease");
                        }
                        done += 1;
                        let count = if to_clean >= PROGRESS_FROM {
                            format!("[{done}/{}] ", to_clean.max(done))
                        } else {
                            String::new()
                        };
                        println!(
                            "  {count}{target}: {} ({})",
                            e.kind,
                            e.reason.as_deref().unwrap_or("")
                        );
                    }
                }
                if last {
                    return cleaned;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Its refusals (`not-mounted`, `in-use`) are typed: JSON on stdout with --json.
    let outcome = daemon::unmount(
        state,
        lazy,
        daemon::AtUnmount::from_keep_sessions(keep_sessions),
        Duration::from_secs(300),
    )
    .map_err(|e| match e.downcast::<report::Refusal>() {
        Ok(mut r) => {
            r.json_to = json.then_some(report::JsonTo::Stdout);
            r.into()
        }
        Err(e) => e,
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let cleaned = progress.join().unwrap_or_default();
    if json {
        let v = match outcome? {
            daemon::Unmounted::Done(m) => serde_json::json!({
                "outcome": "unmounted",
                "mountpoint": m,
                "inside": [],
                "cleaned": cleaned,
            }),
            daemon::Unmounted::Detached(m, inside) => serde_json::json!({
                "outcome": "detached",
                "mountpoint": m,
                "inside": inside,
                "cleaned": cleaned,
            }),
        };
        println!("{v:#}");
        return Ok(());
    }
    match outcome? {
        daemon::Unmounted::Done(m) => println!("unmounted {}", m.display()),
        daemon::Unmounted::Detached(m, inside) => {
            println!(
                "detached {}; {} process(es) still inside: {}",
                m.display(),
                inside.len(),
                inside.join(", ")
            );
            println!("  cleanup runs in the background once they leave (see `worktreefs events`)");
        }
    }
    Ok(())
}
