//! The JSON shapes the rows are printed in (`--json`, `.control/`), one type each, so the
//! shapes `docs/cli.md` shows are checked against them (the tests below read it). Each
//! is made from its row and printed through `serde_json`; fields are named as printed.
//! `rows.rs` holds the rows' shapes, `outcomes.rs` what a command did, `refusals.rs` what
//! it would not do, `checkpoints.rs` checkpoints and rewinds.

mod checkpoints;
mod outcomes;
mod refusals;
mod rows;

pub use checkpoints::{CheckpointJson, CheckpointTakenJson, CheckpointsJson, RewoundJson};
pub use outcomes::{
    AcquiredJson, CheckJson, CheckStatus, CleanedJson, ControlTurnJson, CopiedJson, DuJson,
    EnvJson, ForkJson, KeptUsageJson, MountJson, NewJson, ReclaimJson, ReleasedJson,
    RepoRemovedJson, RestoredJson, SkippedJson, StatsJson, TurnEndedJson, TurnOutcomeJson,
    UnknownWorktreeJson, UnmountJson, UsageJson, WarmJson, WarmShownJson, WorktreeUsageJson,
};
pub use refusals::{
    BusyJson, FailedJson, HasWorktreesJson, HolderJson, OccupiedJson, ReclaimHolderJson,
    ReclaimOccupiedJson, ReclaimWaysOut, RefusedJson, SetupFailedJson, TimedOutJson,
    UnleasableJson, UnmountRefusedJson, WaysOut, WriterJson, WritersInsideJson,
};
pub use rows::{
    EventJson, GlanceJson, KeptJson, LeaseJson, ListedJson, RepoJson, RetainedJson, SetupJson,
    SnapshotJson, StatusJson, TurnJson, WorktreeJson,
};

use serde::Serialize;

/// `shape` as a JSON value (the shapes hold strings, numbers and paths: always encodable).
pub fn value(shape: impl Serialize) -> serde_json::Value {
    serde_json::to_value(shape).expect("a shape of plain values encodes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::Value;

    /// The examples of `docs/cli.md` under the heading that starts with `heading`: each
    /// code block up to the next heading of its level or above, parsed (a block of one
    /// object per line gives each line; a block marked `json` must parse whole). An
    /// array's `"…"` (more of the same) is dropped.
    fn examples(heading: &str) -> Vec<Value> {
        let doc = cli_md();
        let start = doc
            .lines()
            .position(|l| l.starts_with(heading))
            .unwrap_or_else(|| panic!("docs/cli.md has no heading {heading:?}"));
        let level = heading.split(' ').next().unwrap().len();
        examples_in(doc.lines().skip(start + 1), level, heading)
    }

    fn cli_md() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
            .expect("docs/cli.md")
    }

    /// The examples of `lines`, up to a heading of `level` or above (0: to the end).
    fn examples_in<'a>(
        lines: impl Iterator<Item = &'a str>,
        level: usize,
        heading: &str,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        let mut block: Option<Vec<&str>> = None;
        let mut marked_json = false;
        for line in lines {
            let hashes = line.chars().take_while(|&c| c == '#').count();
            if block.is_none() && hashes > 0 && hashes <= level {
                break;
            }
            match (&mut block, line.starts_with("```")) {
                (None, true) => {
                    block = Some(Vec::new());
                    marked_json = line.trim() == "```json";
                }
                (Some(lines), true) => {
                    let text = lines.join("\n");
                    if let Ok(v) = serde_json::from_str::<Value>(&text) {
                        out.push(v);
                    } else if marked_json {
                        panic!("{heading}: a block marked json does not parse:\n{text}");
                    } else {
                        // One object per line (`events`, `.control` files), or not JSON
                        // (a command, a table): only what parses counts.
                        out.extend(
                            lines
                                .iter()
                                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                                .filter(Value::is_object),
                        );
                    }
                    block = None;
                }
                (Some(lines), false) => lines.push(line),
                (None, false) => {}
            }
        }
        out.into_iter()
            .flat_map(|v| match v {
                Value::Array(items) => items
                    .into_iter()
                    .filter(|i| i.as_str() != Some("…"))
                    .collect(),
                other => vec![other],
            })
            .collect()
    }

    thread_local! {
        /// The examples this thread's checks read (see
        /// `every_json_example_in_the_docs_is_checked`).
        static CHECKED: std::cell::RefCell<Vec<Value>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Every example under `heading` is a `T` to the field, and prints back as shown.
    fn shows<T: DeserializeOwned + Serialize>(heading: &str) -> usize {
        shows_where::<T>(heading, |_| true)
    }

    /// As [`shows`], for the examples under `heading` that `pick` picks.
    fn shows_where<T: DeserializeOwned + Serialize>(
        heading: &str,
        pick: impl Fn(&Value) -> bool,
    ) -> usize {
        let found: Vec<Value> = examples(heading).into_iter().filter(|v| pick(v)).collect();
        assert!(!found.is_empty(), "no example under {heading:?}");
        CHECKED.with(|c| c.borrow_mut().extend(found.iter().cloned()));
        for example in &found {
            let typed: T = serde_json::from_value(example.clone()).unwrap_or_else(|e| {
                panic!(
                    "{heading}: the example is not a {}: {e}\n{example:#}",
                    std::any::type_name::<T>()
                )
            });
            assert_eq!(
                &value(&typed),
                example,
                "{heading}: printed back differently"
            );
        }
        found.len()
    }

    #[test]
    fn the_shared_shapes_in_the_docs_are_the_types() {
        shared_shapes();
    }

    #[test]
    fn the_outcomes_in_the_docs_are_the_types() {
        outcomes();
    }

    /// No JSON example of `docs/cli.md` goes unread: each is one of those the two checks
    /// above compare with a type.
    #[test]
    fn every_json_example_in_the_docs_is_checked() {
        CHECKED.with(|c| c.borrow_mut().clear());
        shared_shapes();
        outcomes();
        let checked = CHECKED.with(|c| c.borrow().clone());
        let doc = cli_md();
        let unread: Vec<Value> = examples_in(doc.lines(), 0, "docs/cli.md")
            .into_iter()
            .filter(|v| !checked.contains(v))
            .collect();
        assert!(
            unread.is_empty(),
            "examples in docs/cli.md no check reads (give each a heading and a check):\n{}",
            unread
                .iter()
                .map(|v| format!("{v:#}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    fn shared_shapes() {
        assert_eq!(shows::<WorktreeJson>("### The worktree object"), 2);
        assert_eq!(shows::<LeaseJson>("### The lease object"), 2);
        assert!(shows::<LeaseJson>("## `leases --json`") >= 2);
        assert!(shows::<RetainedJson>("## `retained --json`") >= 1);
        assert!(shows::<KeptJson>("## `removed --json`") >= 1);
        assert!(shows::<RepoJson>("## `repo list --json`") >= 1);
        assert!(shows::<EventJson>("## `events --json`") >= 2);
        assert_eq!(shows::<OccupiedJson>("### Refusal `occupied`"), 1);
        assert_eq!(
            shows_where::<TurnJson>("## `turns --json`", |v| v.get("open_for_writing").is_none()),
            1
        );
        assert_eq!(
            shows_where::<ControlTurnJson>("## `turns --json`", |v| v
                .get("open_for_writing")
                .is_some()),
            1
        );
        assert_eq!(shows::<FailedJson>("### The failure object"), 1);
        assert!(shows::<ListedJson>("## `list --json`") >= 1);
        assert!(shows::<StatusJson>("## `status --json`") >= 2);
        let error = |e: &'static str| move |v: &Value| v["error"] == e;
        assert_eq!(
            shows::<UnleasableJson>("### The unknown-worktree refusal"),
            1
        );
        assert_eq!(
            shows::<UnleasableJson>("### Refusals `not-found`, `removed`"),
            1
        );
        assert_eq!(
            shows_where::<BusyJson>("## `turn --json`", error("busy")),
            1
        );
    }

    /// What a command prints besides the rows, checked the same way: each outcome and
    /// refusal against the examples under its command's heading.
    fn outcomes() {
        let error = |e: &'static str| move |v: &Value| v["error"] == e;
        let no_error = |v: &Value| v.get("error").is_none();
        assert_eq!(shows::<NewJson>("### `new --warm --json`"), 1);
        assert_eq!(shows::<NewJson>("### `new --reuse --json`"), 1);
        assert_eq!(shows::<EnvJson>("## `env --json`"), 1);
        assert_eq!(shows_where::<SetupJson>("## `setup --json`", no_error), 1);
        assert_eq!(
            shows_where::<SetupFailedJson>("## `setup --json`", error("setup-failed")),
            1
        );
        assert_eq!(shows::<ForkJson>("### `new --from --json`"), 1);
        assert_eq!(shows::<RestoredJson>("## `restore --json`"), 1);
        assert_eq!(shows::<CheckpointTakenJson>("## `checkpoint --json`"), 1);
        assert_eq!(
            shows_where::<RewoundJson>("## `rewind --json`", no_error),
            1
        );
        assert_eq!(
            shows_where::<FailedJson>("## `rewind --json`", error("not-found")),
            1
        );
        assert_eq!(shows::<CheckpointsJson>("## `checkpoints --json`"), 1);
        assert_eq!(shows::<WarmJson>("## `warm --json`"), 1);
        assert_eq!(
            shows_where::<AcquiredJson>("## `lease acquire --json`", no_error),
            1
        );
        assert_eq!(shows::<ReleasedJson>("## `lease release --json`"), 1);
        assert_eq!(
            shows_where::<TurnEndedJson>("## `turns end --json`", no_error),
            1
        );
        assert_eq!(
            shows_where::<TimedOutJson>("### Past `--timeout`", error("timed-out")),
            1
        );
        assert_eq!(
            shows_where::<TurnOutcomeJson>("### Past `--timeout`", |v| v["outcome"] == "ended"),
            1
        );
        let reclaim = "## `reclaim --json`";
        assert_eq!(
            shows_where::<ReclaimJson<WorktreeJson>>(reclaim, |v| v.get("id").is_some()),
            4
        );
        assert_eq!(
            shows_where::<ReclaimJson<UnknownWorktreeJson>>(reclaim, |v| v.get("id").is_none()
                && v["error"] != "occupied"),
            1
        );
        assert_eq!(
            shows_where::<ReclaimOccupiedJson>(reclaim, error("occupied")),
            1
        );
        let unmount = "## `unmount --json`";
        assert_eq!(shows_where::<UnmountJson>(unmount, no_error), 2);
        assert_eq!(
            shows_where::<UnmountRefusedJson>(unmount, |v| v.get("error").is_some()),
            1
        );
        assert_eq!(shows::<MountJson>("## `mount --json`"), 1);
        assert_eq!(shows::<StatsJson>("## `.control/stats`"), 1);
        assert_eq!(shows::<DuJson>("## `du --json`"), 1);
        assert_eq!(shows::<CheckJson>("## `doctor --json`"), 1);
        let repo = "## `repo add|set|remove --json`";
        assert_eq!(
            shows_where::<RepoJson>(repo, |v| no_error(v) && v.get("removed").is_none()),
            1
        );
        assert_eq!(
            shows_where::<RepoRemovedJson>(repo, |v| v.get("removed").is_some()),
            1
        );
        assert_eq!(
            shows_where::<HasWorktreesJson>(repo, error("has-worktrees")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `run --json`", error("not-mounted")),
            1
        );
        assert_eq!(
            shows_where::<OccupiedJson>("## `run --json`", error("occupied")),
            1
        );
        assert_eq!(
            shows_where::<FailedJson>("## `run --json`", error("failed")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `turn --json`", error("not-mounted")),
            1
        );
        assert_eq!(
            shows_where::<RefusedJson>("## `turns end --json`", error("other-session")),
            1
        );
        assert_eq!(
            shows_where::<WritersInsideJson>("## `turn --json`", error("writers-inside")),
            2
        );
    }

    /// The check itself: a field the type lacks, or one it has that the example lacks,
    /// is found.
    #[test]
    fn a_shape_that_differs_from_its_type_is_found() {
        let w = serde_json::json!({
            "id": 1, "worktree": "r/a", "repo": "r", "name": "a", "path": "/m/r/a",
            "state": "ready", "branch": null, "branch_created": false, "base_commit": "c",
            "warm_snapshot": null, "created_at": "t", "state_changed_at": "t"
        });
        let typed: WorktreeJson = serde_json::from_value(w.clone()).unwrap();
        assert_eq!(value(&typed), w);
        let mut extra = w.clone();
        extra["size"] = 0.into();
        assert!(serde_json::from_value::<WorktreeJson>(extra).is_err());
        let mut missing = w;
        missing.as_object_mut().unwrap().remove("state");
        assert!(serde_json::from_value::<WorktreeJson>(missing).is_err());
    }
}
