//! `worktreefs list`: every worktree, its state, leases and the processes inside, and
//! what it holds at a glance (changes, commits against its upstream, a running turn, its
//! setup, its last activity).

use std::collections::HashMap;

use clap::Args;
use worktreefs::ids::WorktreeId;
use worktreefs::lifecycle::{create, glance};
use worktreefs::report::shapes::{GlanceJson, ListedJson, SetupJson, WorktreeJson};
use worktreefs::report::{age, rfc3339, Column};
use worktreefs::state::StateDir;
use worktreefs::store::{LeaseRow, SetupRow, TurnRow, WorktreeRow};

use crate::cli::exit::Failed;
use crate::cli::output::{inside_counts, print_json, setup_column};
use crate::cli::state::open_store;

#[derive(Args)]
pub struct ListArgs {
    /// As a JSON array on stdout (see docs/cli.md).
    #[arg(long)]
    pub json: bool,
}

pub fn run(state: &StateDir, args: ListArgs) -> Result<(), Failed> {
    let ListArgs { json } = args;
    let store = open_store(state)?;
    let rows = store.worktrees()?;
    let mountpoint = create::mountpoint_of(state, &store);
    let inside = inside_counts(state);
    let leases = store.leases()?;
    let setups = store.setups()?;
    let turns = store.turns()?;
    let glances = glance::glance_all(state, &store.repos()?, &rows, &|r| {
        eprintln!(
            "worktreefs: repository '{}' ({}) did not answer within 5 s (a FIFO where git expects a file, or a hung file system?): its worktrees are listed without what they hold",
            r.name,
            r.gitdir.display()
        )
    });
    let seen = Seen {
        leases: &leases,
        setups: &setups,
        turns: &turns,
        glances: &glances,
    };
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|w| ListedJson {
                worktree: WorktreeJson {
                    processes_inside: Some(inside(w) as u64),
                    setup: seen.setup(w).map(SetupJson::of),
                    ..WorktreeJson::of(w, &mountpoint)
                },
                glance: seen.json(w),
            })
            .collect();
        print_json(out);
        return Ok(());
    }
    let now = worktreefs::store::now_secs();
    let changed = |w: &WorktreeRow| seen.count(w, |g| g.changed);
    let untracked = |w: &WorktreeRow| seen.count(w, |g| g.untracked);
    let graph = |w: &WorktreeRow| match seen.glances.get(&w.id).and_then(|g| g.graph.as_ref()) {
        Some(g) => format!(
            "+{}/-{}{}",
            g.ahead,
            g.behind,
            if g.upstream.is_none() { " base" } else { "" }
        ),
        None => "-".into(),
    };
    let turn = |w: &WorktreeRow| {
        seen.turn(w)
            .map_or_else(|| "-".into(), |t| t.session.clone())
    };
    let active = |w: &WorktreeRow| format!("{} ago", age(now - seen.last_activity(w)));
    let mut extra = vec![
        Column {
            header: "CHANGED",
            right: true,
            cell: &changed,
        },
        Column {
            header: "NEW",
            right: true,
            cell: &untracked,
        },
        Column {
            header: "AHEAD/BEHIND",
            right: false,
            cell: &graph,
        },
        Column {
            header: "TURN",
            right: false,
            cell: &turn,
        },
    ];
    let setup = setup_column(&setups);
    if let Some(f) = &setup {
        extra.push(Column {
            header: "SETUP",
            right: false,
            cell: f,
        });
    }
    extra.push(Column {
        header: "ACTIVE",
        right: false,
        cell: &active,
    });
    print!(
        "{}",
        worktreefs::report::status_table(&rows, &leases, Some(&inside), &extra)
    );
    Ok(())
}

/// What `list` read, to say of each worktree.
struct Seen<'a> {
    leases: &'a [LeaseRow],
    setups: &'a [SetupRow],
    turns: &'a [TurnRow],
    glances: &'a HashMap<WorktreeId, glance::Glance>,
}

impl Seen<'_> {
    fn setup(&self, w: &WorktreeRow) -> Option<&SetupRow> {
        self.setups.iter().find(|s| s.worktree_id == w.id)
    }

    fn turn(&self, w: &WorktreeRow) -> Option<&TurnRow> {
        self.turns.iter().find(|t| t.worktree_id == w.id)
    }

    /// A count of its glance, or `?` where its upper layer could not be read.
    fn count(&self, w: &WorktreeRow, f: impl Fn(&glance::Glance) -> u64) -> String {
        self.glances
            .get(&w.id)
            .map_or_else(|| "?".into(), |g| f(g).to_string())
    }

    /// The last time anything happened in it (seconds).
    fn last_activity(&self, w: &WorktreeRow) -> i64 {
        let leases = self
            .leases
            .iter()
            .filter(|l| l.worktree_id == w.id)
            .map(LeaseRow::last_active);
        let touched = self.glances.get(&w.id).and_then(|g| g.touched_at);
        let setup = self.setup(w).and_then(|s| s.ended_at.or(s.started_at));
        leases
            .chain(touched)
            .chain(setup)
            .chain([w.created_at, w.state_changed_at])
            .max()
            .unwrap_or(w.created_at)
    }

    fn json(&self, w: &WorktreeRow) -> GlanceJson {
        let g = self.glances.get(&w.id);
        let graph = g.and_then(|g| g.graph.as_ref());
        GlanceJson {
            changed: g.map(|g| g.changed),
            untracked: g.map(|g| g.untracked),
            ahead: graph.map(|g| g.ahead),
            behind: graph.map(|g| g.behind),
            compared_with: graph.map(|g| g.upstream.clone().unwrap_or_else(|| "base".into())),
            turn: self.turn(w).map(|t| t.session.clone()),
            last_activity_at: rfc3339(self.last_activity(w)),
        }
    }
}
