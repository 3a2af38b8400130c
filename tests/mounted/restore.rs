//! Removal you can undo: every removal keeps what it removed, `removed` and
//! `.control/removed` list it, `restore` brings it back as it was, and kept copies are
//! purged after their time or when the disk is low — mounted, with a real repository and
//! the real `git` binary.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

fn removed(env: &Env) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["removed", "--json"])).unwrap();
    json.as_array().unwrap().clone()
}

fn kept_of(env: &Env, name: &str) -> Option<serde_json::Value> {
    removed(env).into_iter().find(|k| k["name"] == name)
}

/// An agent: a shell that works inside the worktree and exits.
fn agent(dir: &Path, script: &str) {
    run_ok("sh", &["-c", script], dir);
}

#[test]
fn every_kind_of_removal_can_be_undone_as_it_was() {
    let env = Env::new();
    let repo = env.repo.path();
    fs::write(repo.join(".git/info/exclude"), "build/\n").unwrap();
    for n in ["discarded", "detached", "fresh", "lingered", "unmounted"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount_with(&["--linger", "1"]);

    // 1. reclaim --discard of staged, unstaged, untracked and ignored work with an
    // unpushed commit.
    let wt = m.wt("repo", "discarded");
    agent(
        &wt,
        "echo one > committed.txt && git add committed.txt && git commit -q -m one \
         && echo staged > staged.txt && git add staged.txt \
         && echo more >> README.md && chmod +x src/main.rs \
         && echo new > untracked.txt && mkdir -p build && echo out > build/out.o \
         && rm empty.txt && ln -s README.md new-link",
    );
    let before = (git_state(&wt), tree_listing(&wt));
    wait_for_state(&env, "discarded", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/discarded", "--discard"]);
    assert!(out.contains("removed repo/discarded"), "{out}");
    assert!(out.contains("worktreefs restore repo/discarded"), "{out}");
    assert_eq!(state_of(&env, "discarded"), "removed");
    assert!(!git(&repo, &["worktree", "list"]).contains("/discarded"));
    let k = kept_of(&env, "discarded").expect("kept");
    assert!(k["bytes"].as_i64().unwrap() > 0, "{k}");
    assert!(k["how"].as_str().unwrap().contains("discard"), "{k}");
    let tip_ref = k["tip_ref"].as_str().unwrap().to_string();
    assert!(tip_ref.starts_with("refs/worktreefs/removed/"), "{k}");
    // Listed in .control/removed, with its details.
    let entry = format!("repo:discarded#{}", k["id"]);
    let listed = run_ok(
        "ls",
        &[m.mountpoint.join(".control/removed").to_str().unwrap()],
        Path::new("/"),
    );
    assert!(listed.contains(&entry), "{listed}");
    let shown = run_ok(
        "cat",
        &[m.mountpoint
            .join(".control/removed")
            .join(&entry)
            .to_str()
            .unwrap()],
        Path::new("/"),
    );
    assert!(shown.contains("\"expires_at\""), "{shown}");
    let table = wtfs_ok(&env.state(), &["removed"]);
    assert!(table.contains("repo/discarded"), "{table}");
    // `git gc` keeps the kept tip.
    git(&repo, &["gc", "-q", "--prune=now"]);
    let out = wtfs_ok(&env.state(), &["restore", "repo/discarded"]);
    assert!(out.contains("restored repo/discarded"), "{out}");
    assert_eq!(state_of(&env, "discarded"), "ready");
    assert_eq!(
        (git_state(&wt), tree_listing(&wt)),
        before,
        "restored as it was"
    );
    assert!(kept_of(&env, "discarded").is_none());
    assert_eq!(git(&repo, &["for-each-ref", "refs/worktreefs"]), "");
    // And it is an ordinary worktree again: it diverges, commits.
    agent(
        &wt,
        "git add -A && git commit -q -m two && echo x > after.txt",
    );
    assert!(run_ok("git", &["log", "--oneline"], &wt).contains("two"));

    // 2. A detached HEAD with a commit on no branch: discarded, gc'd, restored.
    let wt = m.wt("repo", "detached");
    agent(
        &wt,
        "git checkout -q --detach && echo d > d.txt && git add d.txt && git commit -q -m detached",
    );
    let before = (git_state(&wt), tree_listing(&wt));
    let head = run_ok("git", &["rev-parse", "HEAD"], &wt);
    wait_for_state(&env, "detached", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/detached", "--discard"]);
    assert!(out.contains("on no branch"), "{out}");
    git(&repo, &["gc", "-q", "--prune=now"]);
    wtfs_ok(&env.state(), &["restore", "repo/detached"]);
    assert_eq!((git_state(&wt), tree_listing(&wt)), before);
    assert_eq!(run_ok("git", &["rev-parse", "HEAD"], &wt), head);

    // 3. rmdir of a worktree holding only ignored build output: removed, then restored
    // with it, its branch (deleted as merged) made again.
    let wt = m.wt("repo", "fresh");
    agent(
        &wt,
        "mkdir -p build target && echo obj > build/a.o && echo bin > target/app",
    );
    let before = (git_state(&wt), tree_listing(&wt));
    wait_for_state(&env, "fresh", "lingering", Duration::from_secs(10));
    fs::remove_dir(&wt).unwrap();
    assert_eq!(state_of(&env, "fresh"), "removed");
    assert!(!git(&repo, &["branch", "--list", "fresh"]).contains("fresh"));
    let out = wtfs_ok(&env.state(), &["restore", "repo/fresh"]);
    assert!(out.contains("branch fresh made again"), "{out}");
    assert_eq!((git_state(&wt), tree_listing(&wt)), before);

    // 4. Cleanup after the last lease.
    let wt = m.wt("repo", "lingered");
    agent(&wt, "mkdir -p build && echo o > build/l.o");
    let before = (git_state(&wt), tree_listing(&wt));
    wait_for_state(&env, "lingered", "removed", Duration::from_secs(20));
    assert!(kept_of(&env, "lingered").is_some());
    // Its name used again: the restore says so and suggests --as.
    wtfs_ok(
        &env.state(),
        &[
            "new",
            "repo/lingered",
            "--branch",
            "other",
            "--base",
            "HEAD",
        ],
    );
    let out = wtfs(&env.state(), &["restore", "repo/lingered"]);
    assert_eq!(out.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("in use again") && msg.contains("--as"),
        "{msg}"
    );
    assert!(
        kept_of(&env, "lingered").is_some(),
        "a refused restore keeps the copy"
    );
    let out = wtfs_ok(
        &env.state(),
        &["restore", "repo/lingered", "--as", "lingered2"],
    );
    assert!(out.contains("as repo/lingered2"), "{out}");
    assert_eq!(
        (
            git_state(&m.wt("repo", "lingered2")),
            tree_listing(&m.wt("repo", "lingered2"))
        ),
        before
    );

    // 5. Unmount: the session's lease goes, cleanup removes, a later mount restores.
    let wt = m.wt("repo", "unmounted");
    agent(&wt, "mkdir -p build && echo u > build/u.o");
    let before = (git_state(&wt), tree_listing(&wt));
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/unmounted", "--session", "s1"],
    );
    // Every worktree of this mount is left without a lease: release the ones in use.
    m.unmount();
    assert_eq!(state_of(&env, "unmounted"), "removed");
    wtfs_ok(&env.state(), &["restore", "repo/unmounted"]);
    let m = env.mount();
    assert_eq!(
        (
            git_state(&m.wt("repo", "unmounted")),
            tree_listing(&m.wt("repo", "unmounted"))
        ),
        before
    );
    // A branch moved since the removal: the restore is on it, and the ref keeps the
    // commits the removed worktree had.
    wtfs_ok(&env.state(), &["new", "repo/moved"]);
    let wt = m.wt("repo", "moved");
    agent(
        &wt,
        "echo c > c.txt && git add c.txt && git commit -q -m mine",
    );
    let mine = run_ok("git", &["rev-parse", "HEAD"], &wt);
    wait_for_state(&env, "moved", "lingering", Duration::from_secs(10));
    wtfs_ok(&env.state(), &["reclaim", "repo/moved", "--discard"]);
    git(&repo, &["branch", "-f", "moved", "main"]);
    let out = wtfs_ok(&env.state(), &["restore", "repo/moved"]);
    assert!(
        out.contains("has moved since") && out.contains("stay under refs/worktreefs/removed/"),
        "{out}"
    );
    let refs = git(
        &repo,
        &["for-each-ref", "--format=%(refname)", "refs/worktreefs"],
    );
    let kept_ref = refs
        .lines()
        .find(|r| r.contains("/moved-"))
        .unwrap_or_else(|| panic!("no kept ref of moved: {refs}"));
    assert_eq!(git(&repo, &["rev-parse", &format!("{kept_ref}^")]), mine);
    // git's entry deleted by hand: inspection cannot run, `--discard` removes it, and
    // the copy is kept all the same; its restore makes an index of HEAD's tree.
    wtfs_ok(&env.state(), &["new", "repo/noentry"]);
    let wt = m.wt("repo", "noentry");
    agent(&wt, "echo keep me > mine.txt");
    wait_for_state(&env, "noentry", "lingering", Duration::from_secs(10));
    fs::remove_dir_all(repo.join(".git/worktrees/wtfs-noentry")).unwrap();
    wtfs_ok(&env.state(), &["reclaim", "repo/noentry", "--discard"]);
    assert!(kept_of(&env, "noentry").is_some());
    let out = wtfs_ok(&env.state(), &["restore", "repo/noentry"]);
    assert!(out.contains("its index was not kept"), "{out}");
    assert_eq!(run_ok("cat", &["mine.txt"], &wt), "keep me\n");
    assert_eq!(
        run_ok("git", &["status", "--porcelain"], &wt),
        "?? mine.txt\n"
    );
    // Nothing asked for is kept twice: a name never removed says so.
    let out = wtfs(&env.state(), &["restore", "repo/nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("worktreefs removed"));
    drop(m);
}

#[test]
fn kept_copies_go_after_their_time_and_when_the_disk_is_low() {
    let env = Env::new();
    let repo = env.repo.path();
    for n in ["short", "low"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    // Kept for 2 s.
    let m = env.mount_with(&["--keep-removed", "0.00056"]);
    let wt = m.wt("repo", "short");
    fs::remove_dir(&wt).unwrap();
    let k = kept_of(&env, "short").expect("kept");
    let id = k["id"].as_i64().unwrap();
    let dir = env.state().join("removed").join(id.to_string());
    assert!(dir.is_dir());
    assert_ne!(git(&repo, &["for-each-ref", "refs/worktreefs"]), "");
    wait_until("the purge", Duration::from_secs(20), || {
        kept_of(&env, "short").is_none()
    });
    assert!(!dir.exists());
    assert_eq!(git(&repo, &["for-each-ref", "refs/worktreefs"]), "");
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(
        events.contains("purged") && events.contains("--keep-removed"),
        "{events}"
    );
    let out = wtfs(&env.state(), &["restore", "repo/short"]);
    assert_eq!(out.status.code(), Some(1));
    m.unmount();

    // A disk that has less free than the mount asks for: kept copies give way, oldest
    // first (here at the boot reconcile), and a removal then keeps nothing, saying why.
    let m = env.mount();
    fs::remove_dir(m.wt("repo", "low")).unwrap();
    assert!(kept_of(&env, "low").is_some());
    wtfs_ok(&env.state(), &["new", "repo/low2"]);
    m.unmount();
    let m = env.mount_with(&["--keep-min-free-gib", "100000000"]);
    wait_until("the low-disk purge", Duration::from_secs(20), || {
        kept_of(&env, "low").is_none()
    });
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(
        events.contains("purged") && events.contains("disk has"),
        "{events}"
    );
    fs::remove_dir(m.wt("repo", "low2")).unwrap();
    assert!(kept_of(&env, "low2").is_none());
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(
        events.contains("(not kept: the state directory's disk has"),
        "{events}"
    );
    m.unmount();

    // --keep-removed 0 keeps nothing.
    wtfs_ok(&env.state(), &["new", "repo/none"]);
    let m = env.mount_with(&["--keep-removed", "0"]);
    fs::remove_dir(m.wt("repo", "none")).unwrap();
    assert!(kept_of(&env, "none").is_none());
    assert_eq!(
        fs::read_dir(env.state().join("removed")).unwrap().count(),
        0
    );
    drop(m);
}

/// A restore killed after it put the kept directory in place, before its row: a purge
/// leaves the copy to the restore's rollback, which (at the next mount, or the next
/// restore) puts it back where it was kept; nothing is lost and it can be restored.
#[test]
fn a_restore_killed_half_way_puts_the_copy_back() {
    use worktreefs::lifecycle::cleanup::{self, keep::purge_kept, Outcome};
    use worktreefs::lifecycle::create::roll_back_dead_creations;
    use worktreefs::lifecycle::restore::{restore_worktree, RestoreRequest};
    use worktreefs::store::{CreationRow, Store};
    let env = Env::new();
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&env.state()).unwrap();
    let row = create_at_head(&state, &mut store, "w");
    let out = state.upper(row.id).join("target/out");
    fs::create_dir_all(out.parent().unwrap()).unwrap();
    fs::write(&out, "build output").unwrap();
    store
        .begin_deleting(row.id, &[worktreefs::lease::State::Ready], "test")
        .unwrap();
    let row = store.worktree_by_id(row.id).unwrap().unwrap();
    let done = cleanup::finish(
        &state,
        &mut store,
        &row,
        &env.mountpoint(),
        &cleanup::Inspection::default(),
    )
    .unwrap();
    assert!(matches!(done, Outcome::Removed(_)), "{done:?}");
    assert!(store.kept_by_id(row.id).unwrap().is_some());
    // The restore's record (its creator, pid 1 with another start time, is gone), and
    // the kept directory where the restore had put it.
    let repo = store.repo_by_name("repo").unwrap().unwrap();
    let record = CreationRow {
        worktree_id: worktreefs::ids::WorktreeId(0),
        repo_id: repo.id,
        name: "w".into(),
        branch: None,
        base_commit: env.repo.head(),
        admin_name: "wtfs-w".into(),
        pid: 1,
        pid_start: 1,
        started_at: 0,
        restored_from: Some(row.id),
    };
    let new_id = store.begin_creation(&record).unwrap();
    fs::rename(state.removed_dir(row.id), state.worktree_dir(new_id)).unwrap();
    // A purge meanwhile (its time over, the disk low) leaves it.
    assert!(!purge_kept(&state, &mut store, row.id, "test").unwrap());
    assert!(store.kept_by_id(row.id).unwrap().is_some());
    // The next mount rolls the restore back: the copy is where it was kept.
    assert_eq!(roll_back_dead_creations(&state, &mut store).unwrap(), 1);
    assert!(!state.worktree_dir(new_id).exists());
    assert_eq!(
        fs::read_to_string(state.removed_dir(row.id).join("upper/target/out")).unwrap(),
        "build output"
    );
    let back = restore_worktree(
        &state,
        &mut store,
        &RestoreRequest {
            repo: "repo",
            name: "w",
            as_name: None,
            id: None,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        fs::read_to_string(state.upper(back.row.id).join("target/out")).unwrap(),
        "build output"
    );
    assert!(store.kept().unwrap().is_empty());
}
