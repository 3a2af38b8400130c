//! `worktreefs repo add|set|list|remove`: registered repositories.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use clap::Subcommand;
use worktreefs::daemon;
use worktreefs::git;
use worktreefs::lease::State;
use worktreefs::names::{sanitize_name, validate_name};
use worktreefs::report;
use worktreefs::report::shapes::{self, HasWorktreesJson, RepoJson, RepoRemovedJson};
use worktreefs::report::shell_word;
use worktreefs::state::StateDir;
use worktreefs::store::{RepoHooks, Store};
use worktreefs::table::Table;

use crate::cli::exit::Failed;
use crate::cli::output::{print_json, prune_warm};
use crate::cli::state::open_store;

#[derive(Subcommand)]
pub enum RepoCmd {
    /// Register a repository.
    Add {
        /// The repository: its checkout, or any directory inside it.
        path: PathBuf,
        /// The name its worktrees go under (default: the checkout directory's name).
        #[arg(long)]
        name: Option<String>,
        /// What warm worktrees inherit from the checkout (gitignore patterns, besides its
        /// `.worktreeinclude`).
        #[arg(long, num_args = 1.., value_name = "PATTERN")]
        include: Vec<String>,
        /// Make every new worktree warm (`new --cold` for one that is not).
        #[arg(long)]
        warm_default: bool,
        #[command(flatten)]
        hooks: HookArgs,
        /// The repository as one JSON object on stdout, as `repo list --json` gives it.
        #[arg(long)]
        json: bool,
    },
    /// Change a registered repository's settings: warm, setup and teardown commands.
    Set {
        /// The registered repository (see `worktreefs repo list`).
        name: String,
        /// Replace the include patterns (gitignore syntax).
        #[arg(long, num_args = 1.., value_name = "PATTERN", conflicts_with = "no_include")]
        include: Vec<String>,
        /// Clear the include patterns (`.worktreeinclude` still counts).
        #[arg(long)]
        no_include: bool,
        /// Whether new worktrees are warm without `--warm`.
        #[arg(long, value_name = "BOOL")]
        warm_default: Option<bool>,
        #[command(flatten)]
        hooks: HookArgs,
        /// Take the setup command away: new worktrees run none.
        #[arg(long, conflicts_with = "on_create")]
        no_on_create: bool,
        /// Take the teardown command away: removals run none.
        #[arg(long, conflicts_with = "on_remove")]
        no_on_remove: bool,
        /// The repository as one JSON object on stdout, as `repo list --json` gives it.
        #[arg(long)]
        json: bool,
    },
    /// List registered repositories.
    List {
        /// As a JSON array on stdout (see docs/cli.md).
        #[arg(long)]
        json: bool,
    },
    /// Unregister a repository that has no worktrees.
    Remove {
        /// The registered repository (see `worktreefs repo list`).
        name: String,
        /// The repository removed as one JSON object on stdout (with `purged`, the kept
        /// removals that went with it).
        #[arg(long)]
        json: bool,
    },
}

/// A repository's setup command, as `repo add` and `repo set` take it.
#[derive(clap::Args)]
pub struct HookArgs {
    /// A command `/bin/sh -c` runs in every new worktree, as the worktree's owner, with
    /// the owner's HOME, SHELL and PATH and the worktree's variables (see `worktreefs
    /// env`); `list` shows how it went, `worktreefs setup-log` what it printed.
    #[arg(long, value_name = "CMD")]
    pub on_create: Option<String>,
    /// How long the setup command may run before it is ended (default 1800).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub setup_timeout: Option<u64>,
    /// A command `/bin/sh -c` runs in a worktree cleanup found removable, before it goes
    /// (every removal made while mounted: cleanup, rmdir, reclaim), as the worktree's
    /// owner with the same environment; its failure is logged and the removal goes on.
    #[arg(long, value_name = "CMD")]
    pub on_remove: Option<String>,
    /// How long the teardown command may run before it is ended (default 60).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub teardown_timeout: Option<u64>,
}

impl HookArgs {
    fn given(&self) -> bool {
        self.on_create.is_some()
            || self.setup_timeout.is_some()
            || self.on_remove.is_some()
            || self.teardown_timeout.is_some()
    }

    /// `hooks` with these applied (`clear`: without a setup command, without a teardown
    /// command).
    fn apply(&self, mut hooks: RepoHooks, clear: (bool, bool)) -> anyhow::Result<RepoHooks> {
        for (flag, given, to) in [
            ("on-create", &self.on_create, &mut hooks.on_create),
            ("on-remove", &self.on_remove, &mut hooks.on_remove),
        ] {
            if let Some(cmd) = given {
                if cmd.trim().is_empty() {
                    bail!("--{flag} needs a command; to have none, give --no-{flag}");
                }
                *to = Some(cmd.clone());
            }
        }
        if clear.0 {
            hooks.on_create = None;
        }
        if clear.1 {
            hooks.on_remove = None;
        }
        if let Some(t) = self.setup_timeout {
            hooks.create_timeout = Some(t);
        }
        if let Some(t) = self.teardown_timeout {
            hooks.remove_timeout = Some(t);
        }
        Ok(hooks)
    }
}

/// The repository as JSON, with its setup command.
fn repo_json(store: &Store, row: &worktreefs::store::RepoRow) -> RepoJson {
    let hooks = store.hooks_of(row.id).unwrap_or_default();
    RepoJson::of(row).with_hooks(&hooks)
}

pub fn run(state: &StateDir, cmd: RepoCmd) -> Result<(), Failed> {
    match cmd {
        RepoCmd::Add {
            path,
            name,
            include,
            warm_default,
            hooks,
            json,
        } => {
            let store = open_store(state)?;
            // Checked before anything is registered: a refusal leaves nothing.
            let set = hooks.apply(RepoHooks::default(), (false, false))?;
            let row = add_repo(&store, &path, name.as_deref())?;
            if hooks.given() {
                store.set_hooks(row.id, &set)?;
            }
            if !include.is_empty() || warm_default {
                store.set_repo_warm(
                    row.id,
                    (!include.is_empty()).then_some(&include[..]),
                    Some(warm_default),
                )?;
            }
            daemon::enable_fsmonitor(&store);
            daemon::poke(state);
            if json {
                let row = store.repo_by_id(row.id)?.unwrap_or(row);
                print_json(repo_json(&store, &row));
                return Ok(());
            }
            println!(
                "registered repository '{}' -> {}",
                row.name,
                row.path.display()
            );
            Ok(())
        }
        RepoCmd::Set {
            name,
            include,
            no_include,
            warm_default,
            hooks,
            no_on_create,
            no_on_remove,
            json,
        } => {
            let store = open_store(state)?;
            let repo = store.repo_by_name(&name)?.ok_or_else(|| {
                anyhow!("repository '{name}' is not registered (see `worktreefs repo list`)")
            })?;
            let hooks_given = hooks.given() || no_on_create || no_on_remove;
            if include.is_empty() && !no_include && warm_default.is_none() && !hooks_given {
                return Err(anyhow!("nothing to set for '{name}': give --include PATTERN…, --no-include, --warm-default true|false, --on-create CMD, --no-on-create, --setup-timeout SECS, --on-remove CMD, --no-on-remove or --teardown-timeout SECS").into());
            }
            let set = hooks.apply(store.hooks_of(repo.id)?, (no_on_create, no_on_remove))?;
            let patterns = (!include.is_empty() || no_include).then_some(&include[..]);
            store.set_repo_warm(repo.id, patterns, warm_default)?;
            if hooks_given {
                store.set_hooks(repo.id, &set)?;
            }
            let repo = store.repo_by_id(repo.id)?.expect("just set");
            if json {
                print_json(repo_json(&store, &repo));
                return Ok(());
            }
            if hooks_given {
                match &set.on_create {
                    Some(cmd) => println!(
                        "repository '{name}': new worktrees run `{cmd}` (limit {} s); `worktreefs setup REPO/WT` runs it in one made before",
                        set.create_timeout.unwrap_or(worktreefs::lifecycle::setup::DEFAULT_TIMEOUT.as_secs())
                    ),
                    None => println!("repository '{name}': new worktrees run no setup command"),
                }
                match &set.on_remove {
                    Some(cmd) => println!(
                        "repository '{name}': a removal runs `{cmd}` first (limit {} s)",
                        set.remove_timeout
                            .unwrap_or(worktreefs::lifecycle::setup::TEARDOWN_TIMEOUT.as_secs())
                    ),
                    None => println!("repository '{name}': removals run no teardown command"),
                }
                if include.is_empty() && !no_include && warm_default.is_none() {
                    return Ok(());
                }
            }
            println!(
                "repository '{name}': include {}; new worktrees are {} by default (a new snapshot: `worktreefs warm {name}`)",
                if repo.include.is_empty() {
                    "only what .worktreeinclude names".to_string()
                } else {
                    repo.include.join(" ")
                },
                if repo.warm_default { "warm" } else { "cold" }
            );
            Ok(())
        }
        RepoCmd::List { json } => {
            let store = open_store(state)?;
            let repos = store.repos()?;
            if json {
                print_json(
                    repos
                        .iter()
                        .map(|r| repo_json(&store, r))
                        .collect::<Vec<_>>(),
                );
            } else {
                let mut t = Table::new(&["REPO", "PATH"]);
                for r in repos {
                    t.row([r.name, r.path.display().to_string()]);
                }
                print!(
                    "{}",
                    report::listing(
                        &t,
                        "no repositories (register one with `worktreefs repo add PATH`)"
                    )
                );
            }
            Ok(())
        }
        RepoCmd::Remove { name, json } => {
            let mut store = open_store(state)?;
            let repo = store.repo_by_name(&name)?.ok_or_else(|| {
                anyhow!("repository '{name}' is not registered (see `worktreefs repo list`)")
            })?;
            let n = store.worktree_count(repo.id)?;
            if n > 0 {
                let left: Vec<String> = store
                    .worktrees()?
                    .into_iter()
                    .filter(|w| w.repo_id == repo.id && w.state != State::Removed)
                    .map(|w| format!("{}/{} ({})", w.repo, w.name, w.state))
                    .collect();
                let json = shapes::value(HasWorktreesJson {
                    repo: RepoJson::of(&repo),
                    error: "has-worktrees".into(),
                    worktrees: left.clone(),
                });
                return Err(report::Refusal {
                    message: format!(
                        "repository '{name}' still has {n} worktree{}: {}; remove {} first (`worktreefs reclaim REPO/WT`, `--discard` to throw away what one holds), then `worktreefs repo remove {name}` again",
                        if n == 1 { "" } else { "s" },
                        left.join(", "),
                        if n == 1 { "it" } else { "them" }
                    ),
                    json,
                    code: report::EXIT_FAILED,
                }
                .into());
            }
            let purged =
                worktreefs::lifecycle::cleanup::keep::purge_repo(state, &mut store, &name)?;
            if purged > 0 && !json {
                println!("purged {purged} kept removal(s) of '{name}'");
            }
            for (id, made) in store.remove_repo(repo.id)? {
                worktreefs::lifecycle::setup::remove_log(state, id, made);
            }
            // Its warm snapshots' manifests (`<repo id>-<uid>-<ns>`, and `.dirs`) no row
            // names now: a prune deletes them with the contents only they held. While a
            // snapshot is being taken a prune waits for the next: the manifests go now,
            // their contents stay in the cache.
            if prune_warm(state, &mut store).is_none() {
                if let Ok(rd) = fs::read_dir(state.warm()) {
                    let prefix = format!("{}-", repo.id);
                    for e in rd.flatten() {
                        if e.file_name().to_string_lossy().starts_with(&prefix) {
                            let _ = fs::remove_file(e.path());
                        }
                    }
                }
            }
            if let Err(e) = worktreefs::git::fsmonitor::disable_for_repo(&repo.gitdir) {
                eprintln!(
                    "worktreefs: could not remove the fsmonitor include from {}/config: {e:#}; remove the includeIf section naming {}/worktreefs by hand",
                    repo.gitdir.display(),
                    repo.gitdir.display()
                );
            }
            daemon::poke(state);
            if json {
                print_json(RepoRemovedJson {
                    repo: RepoJson::of(&repo),
                    removed: true,
                    purged: purged as u64,
                });
                return Ok(());
            }
            println!("unregistered repository '{name}'");
            Ok(())
        }
    }
}

fn add_repo(
    store: &Store,
    path: &Path,
    name: Option<&str>,
) -> anyhow::Result<worktreefs::store::RepoRow> {
    if let Some(n) = name {
        validate_name("repository", n).map_err(|e| anyhow!(e))?;
    }
    let (gitdir, workdir) = git::discover(path)?;
    let top = workdir.clone().unwrap_or_else(|| gitdir.clone());
    let name = match name {
        Some(n) => n.to_string(),
        None => {
            let raw = top
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".git").to_string())
                .unwrap_or_default();
            sanitize_name(&raw)
        }
    };
    // A worktree is a view of a commit: a repository with none has nothing to show.
    let has_commit = git2::Repository::open(&gitdir).is_ok_and(|r| {
        r.head().is_ok_and(|h| h.peel_to_commit().is_ok())
            || r.branches(Some(git2::BranchType::Local))
                .is_ok_and(|mut b| b.next().is_some())
    });
    if !has_commit {
        bail!(
            "repository {} has no commit yet, and a worktree is a view of a commit; commit something first (`git -C {} commit --allow-empty -m init`), then register it",
            top.display(),
            shell_word(&top.display().to_string())
        );
    }
    if let Some(existing) = store.repo_by_gitdir(&gitdir)? {
        bail!(
            "repository {} is already registered as '{}'",
            top.display(),
            existing.name
        );
    }
    if let Some(existing) = store.repo_by_name(&name)? {
        bail!(
            "the name '{name}' is already used by repository {}; pass --name with another name",
            existing.path.display()
        );
    }
    Ok(store.add_repo(&name, &top, &gitdir)?)
}

/// `repo add` of the repository at `path` for `mount`'s embedded defaults, which take no
/// `--name`: its directory's name, or with `-2`, `-3`… when another repository has it.
pub fn add_repo_here(store: &Store, path: &Path) -> anyhow::Result<worktreefs::store::RepoRow> {
    let (gitdir, workdir) = git::discover(path)?;
    let top = workdir.unwrap_or(gitdir);
    let base = sanitize_name(
        top.file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".git").to_string())
            .as_deref()
            .unwrap_or_default(),
    );
    let mut name = base.clone();
    for n in 2..100 {
        if store.repo_by_name(&name)?.is_none() {
            break;
        }
        let suffix = format!("-{n}");
        name = format!(
            "{}{suffix}",
            &base[..base
                .len()
                .min(worktreefs::names::MAX_NAME_LEN - suffix.len())]
        );
    }
    add_repo(store, path, Some(&name))
}
