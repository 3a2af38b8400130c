//! `worktreefs new`: a worktree made (or, with `--from`, forked from another), and
//! where to go next.

use anyhow::anyhow;
use clap::Args;
use worktreefs::daemon;
use worktreefs::lease::State;
use worktreefs::lifecycle::create::{self, CreateRequest};
use worktreefs::lifecycle::{setup, warm};
use worktreefs::report::shapes::{
    CopiedJson, ForkJson, NewJson, SetupJson, WarmShownJson, WorktreeJson,
};
use worktreefs::state::StateDir;
use worktreefs::store::{SetupRow, SetupState, Store, WorktreeRow};

use crate::cli::exit::{Failed, Status};
use crate::cli::output::{print_cd, print_json, print_path, print_taken};
use crate::cli::progress::{Meter, Slow};
use crate::cli::state::open_store;
use crate::cli::target::which;

#[derive(Args)]
pub struct NewArgs {
    /// REPO/NAME: the registered repository and the new worktree's name (or the path
    /// it will have under the mount).
    pub target: String,
    /// Base revision (default: HEAD of the repository, or the branch's tip with --branch).
    #[arg(long)]
    pub base: Option<String>,
    /// Branch to check out (default: a new branch named after the worktree).
    #[arg(long)]
    pub branch: Option<String>,
    /// Show each initialized submodule (`.git/modules/<name>`) at its recorded commit
    /// as a view of its own repository, made when it is first looked at; without it
    /// (and without `git config worktreefs.submodules true` in the repository) a
    /// submodule is an empty directory, as in a fresh `git worktree add`.
    #[arg(long)]
    pub submodules: bool,
    /// Fork this worktree (PARENT, or REPO/PARENT of the same repository): a new
    /// branch at its HEAD, with its index and a copy of every uncommitted, untracked
    /// and ignored change it has (it keeps running; the copy costs what it changed).
    #[arg(long, value_name = "PARENT", conflicts_with_all = ["base", "submodules"])]
    pub from: Option<String>,
    /// Show the repository's warm snapshot (its source checkout's files that
    /// `.worktreeinclude` or `repo set --include` name: node_modules/, target/, .env),
    /// copy-on-write; the first one takes the snapshot (`worktreefs warm REPO`).
    #[arg(long, conflicts_with_all = ["from", "cold"])]
    pub warm: bool,
    /// Without the warm snapshot, where the repository is warm by default.
    #[arg(long)]
    pub cold: bool,
    /// The new worktree as JSON on stdout (its path, state, branch, base; for --from
    /// what was copied; for a warm one the snapshot, and whether it was taken now).
    #[arg(long)]
    pub json: bool,
    /// Only the worktree's path on stdout (`cd "$(worktreefs new REPO/NAME
    /// --print-path)"`); what else there is to say goes to stderr.
    #[arg(long, conflicts_with = "json")]
    pub print_path: bool,
    /// When REPO/NAME exists already (and is not being deleted), use it rather than
    /// refuse: nothing is made, and it is shown as a new one would be
    /// (`worktreefs shell-init` relies on it).
    #[arg(long)]
    pub reuse: bool,
    /// Wait for the repository's setup command to end in the new worktree, and exit with
    /// its status.
    #[arg(long, conflicts_with = "no_setup")]
    pub wait_setup: bool,
    /// Run no setup command in it (`worktreefs setup` runs it later).
    #[arg(long)]
    pub no_setup: bool,
}

/// What `new` does about the setup command.
#[derive(Clone, Copy)]
struct SetupAsk {
    skip: bool,
    wait: bool,
}

/// How `new` shows the worktree it made or found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Show {
    /// What was made, and where to go next.
    Text,
    Json,
    /// The path alone.
    Path,
}

pub fn run(state: &StateDir, args: NewArgs) -> Result<(), Failed> {
    let NewArgs {
        target,
        base,
        branch,
        submodules,
        from,
        warm,
        cold,
        json,
        print_path: path_only,
        reuse,
        wait_setup,
        no_setup,
    } = args;
    let ask = SetupAsk {
        skip: no_setup,
        wait: wait_setup,
    };
    let show = match (json, path_only) {
        (true, _) => Show::Json,
        (_, true) => Show::Path,
        _ => Show::Text,
    };
    let json = show == Show::Json;
    let target = which(state, Some(&target), true)?;
    let (repo, name) = target.split_once('/').ok_or_else(|| {
        anyhow!("'{target}' is not REPO/NAME; for example `worktreefs new myrepo/task-1`")
    })?;
    // What says how to make a worktree: an existing one is used as it is.
    let making: Vec<&str> = [
        ("--from", from.is_some()),
        ("--base", base.is_some()),
        ("--branch", branch.is_some()),
        ("--warm", warm),
        ("--cold", cold),
        ("--submodules", submodules),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    if reuse && show_existing(state, repo, name, show, &making)? {
        return Ok(());
    }
    if let Some(from) = from {
        return cmd_fork(state, repo, name, &from, branch.as_deref(), show, ask);
    }
    let mut store = open_store(state)?;
    refuse_unrunnable_wait(state, &store, repo, ask)?;
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let repo_row = store.repo_by_name(repo)?;
    let mut took_snapshot = None;
    // What moved in the source since a snapshot made before: looked at on a thread while
    // the worktree is made (it costs about what that does), joined after.
    let mut moved: Option<std::thread::JoinHandle<Option<warm::Moved>>> = None;
    let snapshot = match repo_row {
        Some(r) if warm || (r.warm_default && !cold) => {
            let meter = Meter::new(format!("taking the warm snapshot of {repo}"));
            let tell = |c| meter.tell(c);
            let ensured = warm::ensure(state, &mut store, &r, uid, gid, Some(&tell));
            drop(meter);
            let (snap, taken) = ensured?;
            if let Some(t) = taken.as_ref().filter(|_| show == Show::Text) {
                print_taken(repo, t);
            }
            if taken.is_none() {
                let (state, r, snap) = (state.clone(), r.clone(), snap.clone());
                moved = std::thread::Builder::new()
                    .name("moved-since".into())
                    .spawn(move || warm::moved_since(&state, &r, &snap, MOVED_WITHIN))
                    .ok();
            }
            took_snapshot = taken.map(|t| t.took);
            Some(snap)
        }
        _ => None,
    };
    let slow = Slow::start(format!("creating {repo}/{name}"));
    let note = |phase: &str| slow.note(phase);
    let row = create::create_worktree(
        state,
        &mut store,
        &CreateRequest {
            repo,
            name,
            base: base.as_deref(),
            branch: branch.as_deref(),
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            submodules,
            warm: snapshot.as_ref(),
            progress: Some(&note),
            filter_timeout: worktreefs::git::filters::DEFAULT_TIMEOUT,
        },
    );
    slow.finish(row.is_ok());
    let moved = moved.and_then(|t| t.join().ok()).flatten();
    let row = row?;
    let setup = start_setup(state, &store, &row, ask)?;
    let mountpoint = create::mountpoint_of(state, &store);
    if json {
        print_json(NewJson {
            worktree: WorktreeJson {
                setup: setup.as_ref().map(SetupJson::of),
                ..WorktreeJson::of(&row, &mountpoint)
            },
            warm: snapshot.as_ref().map(|s| WarmShownJson {
                warm_snapshot_files: s.files,
                warm_snapshot_bytes: s.bytes,
                warm_snapshot_took_ms: took_snapshot.map(|d| d.as_millis() as u64),
                warm_snapshot_taken_at: worktreefs::report::rfc3339(s.taken_at),
                warm_snapshot_moved_files: moved.map(|m| m.files),
                warm_snapshot_moved_dirs: moved.map(|m| m.dirs),
                warm_snapshot_moved_complete: moved.map(|m| m.complete),
            }),
            reused: false,
        });
        return setup_status(ask, setup.as_ref());
    }
    let path = mountpoint.join(&row.repo).join(&row.name);
    if show == Show::Path {
        print_path(state, &path);
        return setup_status(ask, setup.as_ref());
    }
    println!(
        "created {}/{} on branch {} at {}{}",
        row.repo,
        row.name,
        row.branch.as_deref().unwrap_or("(detached)"),
        &row.base_commit[..12],
        match &snapshot {
            Some(s) => format!(
                " with warm snapshot {} ({} files, {}, taken {})",
                s.id,
                s.files,
                worktreefs::report::human_bytes(s.bytes),
                match took_snapshot {
                    Some(_) => "now".to_string(),
                    None => format!(
                        "{} ago",
                        worktreefs::report::age(worktreefs::store::now_secs() - s.taken_at)
                    ),
                }
            ),
            None => String::new(),
        }
    );
    if let Some(m) = moved.filter(|m| m.files + m.dirs > 0) {
        println!(
            "  since it was taken, {}{} of its files changed in the source and {} of its directories gained or lost entries: `worktreefs warm {repo}` takes a new one",
            if m.complete { "" } else { "at least " },
            m.files,
            m.dirs
        );
    }
    say_setup(state, &row, ask, setup.as_ref());
    print_cd(state, &path);
    setup_status(ask, setup.as_ref())
}

/// How long `new --warm` looks at the source for what moved since its snapshot, on a
/// thread while the worktree is made: less than making it costs, so the look adds
/// little (a snapshot of 30,000 files gets its directories and some of its files looked
/// at; the rest is "at least").
const MOVED_WITHIN: std::time::Duration = std::time::Duration::from_millis(10);

/// `--wait-setup` with nothing mounted to run the setup: refused before anything is made
/// (the worktree would be made and the wait refused after it).
fn refuse_unrunnable_wait(
    state: &StateDir,
    store: &Store,
    repo: &str,
    ask: SetupAsk,
) -> Result<(), Failed> {
    if !ask.wait || daemon::running_daemon(state).is_some() {
        return Ok(());
    }
    let has_setup = match store.repo_by_name(repo)? {
        Some(r) => store.hooks_of(r.id)?.on_create.is_some(),
        None => false,
    };
    if has_setup {
        return Err(anyhow!(
            "--wait-setup: nothing is mounted for state dir {} to run the setup of {repo}'s new worktrees, so nothing was made; start it with `worktreefs mount`, or leave out --wait-setup (the setup then runs at the next mount)",
            state.root.display()
        )
        .into());
    }
    Ok(())
}

/// Queues the new worktree's run of its repository's setup command (unless asked not
/// to), has the daemon look, and with `--wait-setup` waits for it. Returns the run, as
/// it ended when waited for.
fn start_setup(
    state: &StateDir,
    store: &Store,
    row: &WorktreeRow,
    ask: SetupAsk,
) -> Result<Option<SetupRow>, Failed> {
    let queued = match ask.skip {
        true => None,
        false => setup::queue_for_new(store, row),
    };
    daemon::poke(state);
    match queued {
        Some(_) if ask.wait => crate::cli::commands::setup::wait_for(state, store, row),
        other => Ok(other),
    }
}

/// Says whether the setup command runs in the new worktree, and how to follow it.
fn say_setup(state: &StateDir, row: &WorktreeRow, ask: SetupAsk, run: Option<&SetupRow>) {
    let target = format!("{}/{}", row.repo, row.name);
    match run {
        Some(r) if !r.state.in_progress() => {
            println!("setup: {} (its output: `worktreefs setup-log {target}`)", r.summary())
        }
        Some(r) if daemon::running_daemon(state).is_none() => println!(
            "setup: `{}` runs once the state dir is mounted (`worktreefs mount`)",
            r.command
        ),
        Some(r) => println!(
            "setup: `{}` is running (`worktreefs setup-log {target}`; `worktreefs list` shows when it is done)",
            r.command
        ),
        None if ask.skip => println!("setup: not run (--no-setup; `worktreefs setup {target}` runs it)"),
        None => {}
    }
}

/// With `--wait-setup`: the setup's status as the command's (its exit code when it
/// failed, else 1).
fn setup_status(ask: SetupAsk, run: Option<&SetupRow>) -> Result<(), Failed> {
    match run {
        Some(r) if ask.wait && r.state != SetupState::Ok => {
            eprintln!("worktreefs: the setup {}", r.summary());
            Err(Status::of(r.exit_code.unwrap_or(1)).into())
        }
        _ => Ok(()),
    }
}

/// With `--reuse`: shows worktree `repo/name` as `new` would have shown it made, when it
/// exists (true): ready, in use, in its grace period or retained (its work is there to go
/// on with). False when there is none to use: one being deleted or removed is not, and
/// its creation is refused or made as without `--reuse`.
fn show_existing(
    state: &StateDir,
    repo: &str,
    name: &str,
    show: Show,
    making: &[&str],
) -> anyhow::Result<bool> {
    let store = open_store(state)?;
    let Some(row) = store.worktree(repo, name)? else {
        return Ok(false);
    };
    if matches!(row.state, State::Deleting | State::Removed) {
        return Ok(false);
    }
    if !making.is_empty() {
        eprintln!(
            "worktreefs: {repo}/{name} exists and is used as it is: {} not applied (they say how to make a new one; pick another name for that)",
            making.join(", ")
        );
    }
    let mountpoint = create::mountpoint_of(state, &store);
    let path = mountpoint.join(&row.repo).join(&row.name);
    match show {
        Show::Json => print_json(NewJson {
            worktree: WorktreeJson::of(&row, &mountpoint),
            warm: None,
            reused: true,
        }),
        Show::Path => print_path(state, &path),
        Show::Text => {
            println!(
                "{}/{} exists (on branch {}, {}): using it",
                row.repo,
                row.name,
                row.branch.as_deref().unwrap_or("(detached)"),
                row.state.as_str()
            );
            print_cd(state, &path);
        }
    }
    Ok(true)
}

/// `new REPO/NAME --from PARENT`: a fork of another worktree.
fn cmd_fork(
    state: &StateDir,
    repo: &str,
    name: &str,
    from: &str,
    branch: Option<&str>,
    show: Show,
    ask: SetupAsk,
) -> Result<(), Failed> {
    let parent = match from.split_once('/') {
        Some((r, p)) if r == repo => p,
        Some((r, _)) => {
            return Err(anyhow!(
                "--from {from} is a worktree of repository '{r}', not '{repo}'; a fork stays in its parent's repository: `worktreefs new {r}/{name} --from {from}`"
            )
            .into())
        }
        None => from,
    };
    let mut store = open_store(state)?;
    refuse_unrunnable_wait(state, &store, repo, ask)?;
    let forked = worktreefs::lifecycle::fork::fork_worktree(
        state,
        &mut store,
        &worktreefs::lifecycle::fork::ForkRequest {
            repo,
            name,
            from: parent,
            branch,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
    )?;
    let setup = start_setup(state, &store, &forked.row, ask)?;
    let c = &forked.copied;
    let mountpoint = create::mountpoint_of(state, &store);
    let path = mountpoint.join(&forked.row.repo).join(&forked.row.name);
    if show == Show::Path {
        print_path(state, &path);
        return setup_status(ask, setup.as_ref());
    }
    if show == Show::Json {
        print_json(ForkJson {
            worktree: WorktreeJson {
                setup: setup.as_ref().map(SetupJson::of),
                ..WorktreeJson::of(&forked.row, &mountpoint)
            },
            forked_from: format!("{repo}/{parent}"),
            head: forked.head.to_string(),
            copied: CopiedJson {
                files: c.files,
                bytes: c.bytes,
                dirs: c.dirs,
                other: c.other,
                took_ms: c.took.as_millis() as u64,
            },
            notes: forked.notes.clone(),
        });
        return setup_status(ask, setup.as_ref());
    }
    println!(
        "forked {repo}/{parent} as {}/{} on branch {} at {} (copied {} file(s), {}, {} dir(s), {} other entries, in {} ms)",
        forked.row.repo,
        forked.row.name,
        forked.row.branch.as_deref().unwrap_or("(detached)"),
        &forked.head.to_string()[..12],
        c.files,
        worktreefs::report::human_bytes(c.bytes),
        c.dirs,
        c.other,
        c.took.as_millis()
    );
    for n in &forked.notes {
        println!("  note: {n}");
    }
    say_setup(state, &forked.row, ask, setup.as_ref());
    print_cd(state, &path);
    setup_status(ask, setup.as_ref())
}
