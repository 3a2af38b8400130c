//! `worktreefs man`: the manual pages, generated from the command definitions.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::cli::exit::Failed;

#[derive(Args)]
pub struct ManArgs {
    /// Where the pages go.
    pub dir: PathBuf,
}

/// `cli`: the whole command line's definition, each command of which gets a page.
pub fn run(args: ManArgs, cli: clap::Command) -> Result<(), Failed> {
    Ok(write_man_pages(&args.dir, cli)?)
}

/// The manual pages, generated from the command definitions: `worktreefs.1`, and one per
/// command and subcommand (`worktreefs-lease-acquire.1`), as `git` names its pages.
/// The sections every manual page ends with: EXIT STATUS, ENVIRONMENT, FILES and
/// EXAMPLES (the page `name`'s own examples, else the main page's), in roff.
fn man_sections(name: &str) -> String {
    let esc = |t: &str| {
        t.replace('\\', "\\e")
            .replace('-', "\\-")
            .lines()
            .map(|l| {
                if l.starts_with('.') || l.starts_with('\'') {
                    format!("\\&{l}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let section = |title: &str, items: &[(&str, &str)]| {
        let mut out = format!(".SH \"{title}\"\n");
        for (tag, text) in items {
            if tag.is_empty() {
                out.push_str(&format!(".PP\n{}\n", esc(text)));
            } else {
                out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", esc(tag), esc(text)));
            }
        }
        out
    };
    let mut out = section(
        "EXIT STATUS",
        &[
            ("0", "Success."),
            ("1", "The request could not be carried out; the message names the thing, its state and the way out."),
            ("2", "Bad usage."),
            ("3", "A typed conflict: the worktree cannot be had now (somebody holds it, another turn runs there, it is deleting or removed)."),
            ("124", "turn: its command ran past --timeout and was ended."),
            ("126, 127, 128+N", "run and turn: the command could not be run, was not found, or was ended by signal N; otherwise they exit with their command's status."),
        ],
    );
    out.push_str(&section(
        "ENVIRONMENT",
        &[
            ("WORKTREEFS_STATE_DIR", "The state directory, as --state-dir gives it."),
            ("XDG_STATE_HOME", "Where the default state directory is (XDG_STATE_HOME/worktreefs), else ~/.local/state/worktreefs."),
            ("RUST_LOG", "Log filter for the daemon and for commands (as --log-level; it takes precedence)."),
            ("WORKTREEFS_PROGRESS_AFTER_MS", "How long a creation may take before it says what it is doing (default 1000)."),
            ("NOTIFY_SOCKET", "Set by systemd for a Type=notify unit: mount --foreground reports readiness there."),
        ],
    ));
    out.push_str(&section(
        "FILES",
        &[
            ("~/.local/state/worktreefs/", "The default state directory (0700): the SQLite database worktreefs.db, every worktree's upper layer under worktrees/, the content store, caches, daemon.log and daemon.sock."),
            ("~/.local/state/worktreefs-mnt/", "The default mountpoint."),
            ("REPO/.git/worktreefs/", "The fsmonitor hook and the config that managed worktrees include (includeIf in REPO/.git/config)."),
            ("REPO/.worktreeinclude", "What warm worktrees inherit from the checkout (gitignore syntax)."),
        ],
    ));
    let examples: &[(&str, &str)] = match name {
        "worktreefs-mount" => &[
            ("worktreefs mount", "Inside a repository: register it, mount at the default place, and print the next steps."),
            ("worktreefs mount /srv/worktrees --allow-other", "Mount where given, open to other users."),
            ("mount -t fuse.worktreefs -o allow_other,umount_keeps_sessions /var/lib/worktreefs /srv/worktrees", "The same through mount(8) (link /sbin/mount.fuse.worktreefs to the binary)."),
        ],
        "worktreefs-unmount" => &[
            ("worktreefs unmount", "Release every lease, clean up, unmount: an admin's reclaim."),
            ("worktreefs unmount --keep-sessions", "A planned restart: named leases and their worktrees are kept."),
        ],
        "worktreefs-new" => &[
            ("worktreefs new myrepo/task-1", "A worktree on a new branch task-1 at HEAD."),
            ("worktreefs new myrepo/task-2 --warm", "With the repository's warm snapshot (node_modules/, target/, .env)."),
            ("worktreefs new myrepo/try --from task-1", "A fork of task-1 with its uncommitted changes."),
        ],
        "worktreefs-reclaim" => &[
            ("worktreefs reclaim myrepo/task-1 --wait 30", "Remove it when nothing would be lost, waiting up to 30 s for its holders to go."),
            ("worktreefs reclaim myrepo/task-1 --discard", "Throw its work away (listed first)."),
        ],
        "worktreefs-lease-acquire" | "worktreefs-lease-release" | "worktreefs-lease" => &[
            ("worktreefs lease acquire myrepo/task-1 --session s1 --exclusive", "Hold it for session s1, alone."),
            ("worktreefs lease release myrepo/task-1 --session s1 --reason done", "Let it go; cleanup runs after the grace period."),
        ],
        "worktreefs-turn" => &[
            ("worktreefs turn myrepo/task-1 --session s1 --timeout 600 -- make test", "Run make test as s1's turn, ended after ten minutes."),
        ],
        "worktreefs-run" => &[
            ("worktreefs run myrepo/task-1 -- cargo build", "Build inside, holding a lease while it runs."),
        ],
        _ => &[
            ("worktreefs mount", "Inside a repository: register it and mount."),
            ("worktreefs new myrepo/task-1 && cd ~/.local/state/worktreefs-mnt/myrepo/task-1", "Make a worktree and work in it."),
            ("worktreefs list", "Every worktree, its state, its leases and the processes inside."),
            ("cd && worktreefs unmount", "When you are done, from outside the mount."),
        ],
    };
    out.push_str(&section("EXAMPLES", examples));
    out
}

fn write_man_pages(dir: &Path, cli: clap::Command) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let cmd = cli.name("worktreefs");
    let mut written = Vec::new();
    fn walk(
        cmd: clap::Command,
        prefix: &str,
        dir: &Path,
        written: &mut Vec<PathBuf>,
    ) -> anyhow::Result<()> {
        let name = if prefix.is_empty() {
            cmd.get_name().to_string()
        } else {
            format!("{prefix}-{}", cmd.get_name())
        };
        let page = cmd
            .clone()
            .name(name.clone())
            .bin_name(name.replace('-', " "));
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        out.extend_from_slice(man_sections(&name).as_bytes());
        let path = dir.join(format!("{name}.1"));
        fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        for sub in cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
        {
            walk(sub.clone(), &name, dir, written)?;
        }
        Ok(())
    }
    let mut cmd = cmd;
    cmd.build();
    walk(cmd, "", dir, &mut written)?;
    println!(
        "wrote {} manual pages to {} (`man worktreefs`, once it is on MANPATH)",
        written.len(),
        dir.display()
    );
    Ok(())
}
