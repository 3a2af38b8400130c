//! Warm worktrees: what a new worktree inherits of its source checkout's
//! ignored and untracked files (`.worktreeinclude`, `repo set --include`, `new --warm`,
//! `warm REPO`) — mounted, with a real repository and the real `git` binary.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use crate::common::*;

/// Every entry below `dir` with its type, mode and content (read by a child
/// process), `.git` and `.worktreeinclude` aside.
fn files_of(dir: &Path) -> String {
    run_ok(
        "sh",
        &[
            "-c",
            "find . -path ./.git -prune -o -name .worktreeinclude -prune -o -print | LC_ALL=C sort | while read f; do printf '== %s %s\\n' \"$f\" \"$(stat -c %A \"$f\")\"; if [ -L \"$f\" ]; then readlink \"$f\"; elif [ -f \"$f\" ]; then md5sum < \"$f\"; fi; done",
        ],
        dir,
    )
}

/// What git says of a worktree: the status as an agent sees it, the full one (ignored
/// files, every untracked file), and the diff.
fn git_view(wt: &Path) -> (String, String, String) {
    (
        run_ok("git", &["status", "--porcelain"], wt),
        run_ok(
            "git",
            &[
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--ignored",
            ],
            wt,
        ),
        run_ok("git", &["diff"], wt),
    )
}

fn write(root: &Path, rel: &str, content: &str, mode: u32) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(&p, content).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A source checkout with what an agent needs and a fresh checkout lacks: dependencies,
/// build output, a secret; and a `.worktreeinclude` naming them (and one name that
/// matches nothing).
fn warm_source(repo: &Path) {
    fs::write(repo.join(".gitignore"), "target/\n*.o\nnode_modules/\n").unwrap();
    git(repo, &["commit", "-qam", "ignore node_modules"]);
    write(
        repo,
        "node_modules/left-pad/index.js",
        "module.exports = 1;\n",
        0o644,
    );
    write(repo, "node_modules/left-pad/package.json", "{}\n", 0o444);
    write(
        repo,
        "node_modules/.bin/tool",
        "#!/bin/sh\necho tool\n",
        0o755,
    );
    std::os::unix::fs::symlink("../left-pad/index.js", repo.join("node_modules/.bin/lp")).unwrap();
    // A link out of the checkout is kept as a link: never followed, nothing of /etc taken.
    std::os::unix::fs::symlink("/etc", repo.join("node_modules/etc-link")).unwrap();
    write(repo, "target/debug/app", "\x7fELF binary\n", 0o755);
    write(repo, "target/debug/app.d", "app: src/main.rs\n", 0o644);
    write(repo, "src/main.o", "object\n", 0o644);
    write(repo, ".env", "SECRET=1\n", 0o600);
    write(repo, "scratch.txt", "not inherited\n", 0o644);
    // Old times, as a finished build leaves them: a build looks at them.
    run_ok(
        "touch",
        &[
            "-h",
            "-d",
            "2021-03-04 05:06:07",
            "target/debug/app",
            "node_modules/.bin/lp",
        ],
        repo,
    );
    fs::write(
        repo.join(".worktreeinclude"),
        "# what agents need\nnode_modules/\ntarget/\n.env\n*.o\nnothing-here/\n",
    )
    .unwrap();
}

#[test]
fn a_warm_worktree_shows_the_source_checkouts_files_copy_on_write_and_each_snapshot_stays_with_its_worktrees(
) {
    let env = Env::new();
    let repo = env.repo.path();
    warm_source(&repo);
    let out = wtfs_ok(&env.state(), &["new", "repo/a", "--warm"]);
    assert!(out.contains("took warm snapshot 1 of repo"), "{out}");
    assert!(
        out.contains("pattern 'nothing-here/' matches nothing"),
        "{out}"
    );
    assert!(out.contains("with warm snapshot 1"), "{out}");
    let plain = wtfs_ok(&env.state(), &["new", "repo/cold"]);
    assert!(!plain.contains("warm"), "{plain}");

    // The checkout a user would make by hand: the same commit, the same files copied in.
    let hand = env.dir.path().join("hand");
    git(
        &repo,
        &["worktree", "add", "-q", "--detach", hand.to_str().unwrap()],
    );
    run_ok(
        "cp",
        &[
            "-a",
            "node_modules",
            "target",
            ".env",
            hand.to_str().unwrap(),
        ],
        &repo,
    );
    run_ok(
        "cp",
        &["-a", "src/main.o", hand.join("src").to_str().unwrap()],
        &repo,
    );

    let m = env.mount();
    let a = m.wt("repo", "a");
    // Untouched, git lists only the directories the snapshot adds to and reads no content
    // but ignore rules.
    let porcelain = run_ok("git", &["status", "--porcelain"], &a);
    assert_eq!(porcelain, "?? .env\n");
    let read = m.content_paths();
    assert!(
        read.iter().all(|p| p.ends_with("/.gitignore")),
        "git status read more than ignore rules: {read:?}"
    );

    // What git and a reader see is what the hand-made checkout holds, inherited files
    // with their times (tracked ones have the view's own).
    assert_eq!(files_of(&a), files_of(&hand));
    let mtime = |p: &Path| fs::symlink_metadata(p).unwrap().mtime();
    for rel in [
        "target/debug/app",
        "node_modules/.bin/lp",
        ".env",
        "src/main.o",
    ] {
        assert_eq!(mtime(&a.join(rel)), mtime(&repo.join(rel)), "{rel}");
    }
    assert_eq!(git_view(&a), git_view(&hand));
    let view = run_ok("git", &["status", "--porcelain", "--ignored"], &a);
    assert_eq!(
        view,
        "?? .env\n!! node_modules/\n!! src/main.o\n!! target/\n"
    );
    assert!(!a.join("scratch.txt").exists() && !a.join(".worktreeinclude").exists());
    assert!(fs::symlink_metadata(a.join("node_modules/etc-link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::metadata(a.join(".env")).unwrap().mode() & 0o7777, 0o600);
    let cold = m.wt("repo", "cold");
    assert!(!cold.join("node_modules").exists() && !cold.join(".env").exists());

    // Writes go to the worktree's own layer; the source checkout never changes.
    run_ok(
        "sh",
        &[
            "-c",
            "echo MORE=2 >> .env && echo 'module.exports = 2;' > node_modules/left-pad/index.js && chmod 700 node_modules/.bin/tool && rm target/debug/app.d && mv node_modules/left-pad node_modules/right-pad",
        ],
        &a,
    );
    assert_eq!(
        fs::read_to_string(a.join(".env")).unwrap(),
        "SECRET=1\nMORE=2\n"
    );
    assert_eq!(
        fs::read_to_string(a.join("node_modules/.bin/lp"))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound,
        "the link follows the move"
    );
    assert_eq!(
        fs::read_to_string(a.join("node_modules/right-pad/index.js")).unwrap(),
        "module.exports = 2;\n"
    );
    assert_eq!(fs::read_to_string(repo.join(".env")).unwrap(), "SECRET=1\n");
    assert_eq!(
        fs::read_to_string(repo.join("node_modules/left-pad/index.js")).unwrap(),
        "module.exports = 1;\n"
    );
    assert!(repo.join("target/debug/app.d").exists());
    assert_eq!(
        fs::metadata(repo.join("node_modules/.bin/tool"))
            .unwrap()
            .mode()
            & 0o777,
        0o755
    );

    // A new snapshot: new worktrees show it, the old one keeps its own.
    write(&repo, ".env", "SECRET=2\n", 0o600);
    write(&repo, "node_modules/new-pkg/index.js", "new\n", 0o644);
    let out = wtfs_ok(&env.state(), &["warm", "repo"]);
    assert!(out.contains("took warm snapshot 2 of repo"), "{out}");
    wtfs_ok(&env.state(), &["new", "repo/b", "--warm"]);
    let b = m.wt("repo", "b");
    assert_eq!(fs::read_to_string(b.join(".env")).unwrap(), "SECRET=2\n");
    assert!(b.join("node_modules/new-pkg/index.js").exists());
    assert!(b.join("node_modules/left-pad/index.js").exists());
    assert_eq!(
        fs::read_to_string(a.join(".env")).unwrap(),
        "SECRET=1\nMORE=2\n"
    );
    assert!(!a.join("node_modules/new-pkg").exists());
    // The unmount removes the untouched warm worktree (nothing of it is work) and keeps
    // the changed one, which shows its own snapshot after a restart.
    m.unmount();
    assert_eq!(state_of(&env, "b"), "removed");
    assert_eq!(state_of(&env, "a"), "retained");
    let m = env.mount();
    let a = m.wt("repo", "a");
    assert_eq!(
        fs::read_to_string(a.join(".env")).unwrap(),
        "SECRET=1\nMORE=2\n"
    );
    assert!(!a.join("node_modules/new-pkg").exists());
    assert!(a.join("node_modules/.bin/tool").exists());
    m.unmount();
}

#[test]
fn inherited_files_are_never_work_and_changed_ones_are() {
    let env = Env::new();
    let repo = env.repo.path();
    warm_source(&repo);
    wtfs_ok(
        &env.state(),
        &["repo", "set", "repo", "--warm-default", "true"],
    );
    let out = wtfs_ok(&env.state(), &["new", "repo/untouched"]);
    assert!(out.contains("with warm snapshot"), "{out}");
    wtfs_ok(&env.state(), &["new", "repo/changed"]);
    wtfs_ok(&env.state(), &["new", "repo/built"]);
    wtfs_ok(&env.state(), &["new", "repo/touched"]);
    wtfs_ok(&env.state(), &["new", "repo/chmodded"]);
    let out = wtfs_ok(&env.state(), &["new", "repo/plain", "--cold"]);
    assert!(!out.contains("warm"), "{out}");
    let m = env.mount_with(&["--linger", "1"]);
    // Each agent works and leaves: its lease goes with it.
    run_ok(
        "sh",
        &[
            "-c",
            "git status --porcelain; cat .env node_modules/.bin/tool >/dev/null",
        ],
        &m.wt("repo", "untouched"),
    );
    run_ok(
        "sh",
        &["-c", "echo TOKEN=x >> .env"],
        &m.wt("repo", "changed"),
    );
    // Touched, opened for writing, rewritten with the same bytes: copied up, yet the
    // same file as inherited (content and mode), so not work.
    run_ok(
        "sh",
        &[
            "-c",
            "touch .env && : >> .env && cat .env > /tmp/wtfs-same-$$ && cat /tmp/wtfs-same-$$ > .env && rm /tmp/wtfs-same-$$ && touch -h node_modules/.bin/lp",
        ],
        &m.wt("repo", "touched"),
    );
    // Its mode changed: that is a change, kept.
    run_ok("chmod", &["0644", ".env"], &m.wt("repo", "chmodded"));
    // Build output (ignored) changes: not work, as in any worktree.
    run_ok(
        "sh",
        &["-c", "echo rebuilt > target/debug/app"],
        &m.wt("repo", "built"),
    );
    run_ok(
        "sh",
        &["-c", "ls node_modules 2>/dev/null; true"],
        &m.wt("repo", "plain"),
    );
    let limit = Duration::from_secs(60);
    wait_for_state(&env, "untouched", "removed", limit);
    wait_for_state(&env, "built", "removed", limit);
    wait_for_state(&env, "plain", "removed", limit);
    wait_for_state(&env, "touched", "removed", limit);
    wait_for_state(&env, "changed", "retained", limit);
    wait_for_state(&env, "chmodded", "retained", limit);
    let retained = wtfs_ok(&env.state(), &["retained", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&retained).unwrap();
    let mut reasons: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r["name"].to_string(), r["reason"].to_string()))
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{retained}");
    for ((name, reason), want) in reasons.iter().zip(["changed", "chmodded"]) {
        assert_eq!(name, &format!("\"{want}\""), "{retained}");
        assert!(reason.contains("untracked .env"), "{name}: {retained}");
    }
    // The retained one comes back with its snapshot and its change after a restore too.
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/changed", "--discard"]);
    assert!(out.contains("removed") || out.contains("discard"), "{out}");
    wtfs_ok(&env.state(), &["restore", "repo/changed"]);
    let back = m.wt("repo", "changed");
    assert_eq!(
        run_ok("cat", &[".env", "node_modules/left-pad/index.js"], &back),
        "SECRET=1\nTOKEN=x\nmodule.exports = 1;\n"
    );
    // A fork of a warm worktree shows the same snapshot and the parent's change.
    wtfs_ok(&env.state(), &["new", "repo/fork", "--from", "changed"]);
    assert_eq!(
        run_ok("cat", &[".env", "target/debug/app"], &m.wt("repo", "fork")),
        "SECRET=1\nTOKEN=x\n\x7fELF binary\n"
    );
    m.unmount();
}

#[test]
fn a_snapshot_takes_only_what_the_asking_user_can_read_and_keeps_modes() {
    let env = Env::new();
    let repo = env.repo.path();
    warm_source(&repo);
    write(&repo, "node_modules/public.js", "public\n", 0o644);
    write(&repo, "node_modules/private.js", "private\n", 0o600);
    write(&repo, "node_modules/closed/inner.js", "inner\n", 0o644);
    // A file the group `nogroup` may read: its group bits mean nothing in the view.
    write(&repo, "node_modules/grouped.js", "grouped\n", 0o640);
    std::os::unix::fs::chown(repo.join("node_modules/grouped.js"), None, Some(65534)).unwrap();
    // The checkout must be reachable by the user: the test's directories are private.
    let mut p = repo.clone();
    while p != Path::new("/tmp") && p.parent().is_some() {
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p = p.parent().unwrap().to_path_buf();
    }
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let mut store = worktreefs::store::Store::open(&env.state()).unwrap();
    let row = store.repo_by_name("repo").unwrap().unwrap();
    let taken =
        worktreefs::lifecycle::warm::take(&state, &mut store, &row, 65534, 65534, None).unwrap();
    let skipped: Vec<&str> = taken.skipped.iter().map(|(p, _)| p.as_str()).collect();
    assert!(skipped.contains(&".env"), "{:?}", taken.skipped);
    assert!(
        skipped.contains(&"node_modules/private.js"),
        "{:?}",
        taken.skipped
    );
    assert!(
        taken
            .skipped
            .iter()
            .all(|(_, why)| why.contains("not readable")),
        "{:?}",
        taken.skipped
    );
    assert_eq!(taken.row.uid, 65534);
    // As root, both are taken; each user's `new --warm` uses the snapshot of their own.
    let root = worktreefs::lifecycle::warm::take(&state, &mut store, &row, 0, 0, None).unwrap();
    assert!(root.skipped.is_empty(), "{:?}", root.skipped);
    assert_eq!(root.row.files, taken.row.files + 2);
    fs::set_permissions(
        repo.join("node_modules/closed"),
        fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let again = worktreefs::lifecycle::warm::take(&state, &mut store, &row, 0, 0, None).unwrap();
    assert_eq!(again.row.files, root.row.files);
    assert_eq!(
        store.latest_warm(row.id, 65534).unwrap().unwrap().id,
        taken.row.id
    );
    drop(store);
    wtfs_ok(&env.state(), &["new", "repo/w", "--warm"]);
    let m = env.mount();
    let w = m.wt("repo", "w");
    let mode = |rel: &str| fs::symlink_metadata(w.join(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("node_modules/private.js"), 0o600);
    assert_eq!(mode("node_modules/left-pad/package.json"), 0o444);
    assert_eq!(mode("node_modules/.bin/tool"), 0o755);
    assert_eq!(
        mode("node_modules/grouped.js"),
        0o600,
        "no group bits of another group"
    );
    // A private directory stays private when a write below it copies it up.
    assert_eq!(mode("node_modules/closed"), 0o700);
    run_ok(
        "sh",
        &["-c", "echo more >> node_modules/closed/inner.js"],
        &w,
    );
    assert_eq!(mode("node_modules/closed"), 0o700);
    assert_eq!(mode("node_modules/closed/inner.js"), 0o644);
    // (The kernel may answer from its cache: the upper layer says what the view will.)
    let upper = |rel: &str| {
        let dirs: Vec<_> = fs::read_dir(env.state().join("worktrees"))
            .unwrap()
            .map(|e| e.unwrap().path().join("upper").join(rel))
            .filter(|p| p.exists())
            .collect();
        assert_eq!(dirs.len(), 1, "{rel}: {dirs:?}");
        fs::symlink_metadata(&dirs[0]).unwrap().mode() & 0o7777
    };
    assert_eq!(upper("node_modules/closed"), 0o700);
    // So does one a rename copies up whole.
    run_ok("sh", &["-c", "mv node_modules node_modules.old"], &w);
    let mode = |rel: &str| fs::symlink_metadata(w.join(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("node_modules.old/closed"), 0o700);
    assert_eq!(upper("node_modules.old/closed"), 0o700);
    assert_eq!(upper("node_modules.old/left-pad"), 0o755);
    assert_eq!(mode("node_modules.old/left-pad/package.json"), 0o444);
    assert_eq!(
        fs::symlink_metadata(w.join("target/debug/app"))
            .unwrap()
            .mtime(),
        fs::symlink_metadata(repo.join("target/debug/app"))
            .unwrap()
            .mtime()
    );
    m.unmount();
}

/// The blob cache's file of `content`.
fn blob_file(env: &Env, content: &str) -> std::path::PathBuf {
    let mut child = std::process::Command::new("git")
        .args(["hash-object", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(content.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let hex = String::from_utf8(out.stdout).unwrap().trim().to_string();
    env.state().join("blobs").join(&hex[..2]).join(&hex[2..])
}

/// The manifests in the state directory (their lists of directories aside).
fn manifests(env: &Env) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(env.state().join("warm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && !n.ends_with(".dirs") && !n.ends_with(".ident"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_snapshot_nothing_needs_goes_with_the_contents_only_it_held() {
    let env = Env::new();
    let repo = env.repo.path();
    warm_source(&repo);
    // Also inherited: a copy of a committed file (its blob is git's too).
    fs::write(
        repo.join("target/README.copy"),
        fs::read(repo.join("README.md")).unwrap(),
    )
    .unwrap();
    wtfs_ok(&env.state(), &["new", "repo/a", "--warm"]);
    let first = manifests(&env);
    assert_eq!(first.len(), 1);
    // The source changes; a new snapshot. The first is a's: both stay.
    fs::write(repo.join(".env"), "SECRET=2\n").unwrap();
    let out = wtfs_ok(&env.state(), &["warm", "repo"]);
    assert!(!out.contains("deleted"), "{out}");
    assert_eq!(manifests(&env).len(), 2);
    let old_env = blob_file(&env, "SECRET=1\n");
    let shared = blob_file(&env, "module.exports = 1;\n");
    let tracked = blob_file(&env, &fs::read_to_string(repo.join("README.md")).unwrap());
    assert!(old_env.exists() && shared.exists() && tracked.exists());
    // A snapshot superseded and used by no worktree goes at once, with a manifest no row
    // names (a take that died before its row).
    let orphan = env.state().join("warm").join("1-0-1");
    fs::copy(env.state().join("warm").join(&first[0]), &orphan).unwrap();
    fs::write(repo.join("scratch.o"), "third\n").unwrap();
    let out = wtfs_ok(&env.state(), &["warm", "repo"]);
    assert!(out.contains("deleted 1 older snapshot"), "{out}");
    assert!(!orphan.exists());
    let now = manifests(&env);
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.contains(&first[0]), "a's snapshot stays: {now:?}");
    assert!(old_env.exists() && blob_file(&env, "third\n").exists());

    // a goes (nothing kept of it): its snapshot is needed no more, nor what only it held.
    let m = env.mount_with(&["--linger", "1", "--keep-removed", "0"]);
    run_ok("cat", &[".env"], &m.wt("repo", "a"));
    wait_for_state(&env, "a", "removed", Duration::from_secs(60));
    wait_until("the prune", Duration::from_secs(30), || {
        !manifests(&env).contains(&first[0])
    });
    assert_eq!(manifests(&env).len(), 1);
    assert!(
        !old_env.exists(),
        "a content only the deleted snapshot held stays"
    );
    assert!(
        shared.exists(),
        "a content the newest snapshot holds too went"
    );
    assert!(tracked.exists(), "a content git holds went");
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(events.contains("warm-pruned"), "{events}");
    // The newest one serves a new worktree whole.
    wtfs_ok(&env.state(), &["new", "repo/b", "--warm"]);
    assert_eq!(
        run_ok(
            "cat",
            &[
                ".env",
                "node_modules/left-pad/index.js",
                "scratch.o",
                "target/README.copy"
            ],
            &m.wt("repo", "b")
        ),
        format!(
            "SECRET=2\nmodule.exports = 1;\nthird\n{}",
            fs::read_to_string(repo.join("README.md")).unwrap()
        )
    );
    m.unmount();
}

#[test]
fn without_patterns_a_warm_worktree_is_refused_and_nothing_is_made() {
    let env = Env::new();
    let out = wtfs(&env.state(), &["new", "repo/w", "--warm"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(".worktreeinclude") && err.contains("repo set repo --include"),
        "{err}"
    );
    assert!(
        !wtfs_ok(&env.state(), &["list", "--json"]).contains("\"w\""),
        "nothing is made"
    );
    // Patterns from the command line alone work too.
    fs::create_dir_all(env.repo.path().join("target")).unwrap();
    fs::write(env.repo.path().join("target/out"), "o\n").unwrap();
    wtfs_ok(
        &env.state(),
        &["repo", "set", "repo", "--include", "target/"],
    );
    let out = wtfs_ok(&env.state(), &["new", "repo/w", "--warm"]);
    assert!(out.contains("1 files and links"), "{out}");
    // Unregistering the repository (its worktree reclaimed first) takes its snapshots'
    // manifests with it, and the contents only they held.
    assert_eq!(manifests(&env).len(), 1);
    assert!(env
        .state()
        .join("warm")
        .join(format!("{}.dirs", manifests(&env)[0]))
        .exists());
    let out_blob = blob_file(&env, "o\n");
    assert!(out_blob.exists());
    wtfs_ok(&env.state(), &["reclaim", "repo/w"]);
    wtfs_ok(&env.state(), &["repo", "remove", "repo"]);
    let left: Vec<_> = fs::read_dir(env.state().join("warm"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != ".lock")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!out_blob.exists());
}

#[test]
fn a_file_rewritten_while_the_snapshot_is_taken_is_held_whole_or_reported() {
    let env = Env::new();
    let repo = env.repo.path();
    fs::write(repo.join(".worktreeinclude"), "target/\n").unwrap();
    fs::create_dir_all(repo.join("target")).unwrap();
    let a = "A".repeat(1 << 20);
    fs::write(repo.join("target/hot"), &a).unwrap();
    fs::write(repo.join("target/still"), "still\n").unwrap();
    // A build rewriting its output in place, all the time the snapshot is taken.
    let mut writer = std::process::Command::new("sh")
        .args([
            "-c",
            "a=$(head -c 1048576 /dev/zero | tr '\\0' A); b=$(head -c 1048576 /dev/zero | tr '\\0' B); while :; do printf %s \"$a\" > target/hot; printf %s \"$b\" > target/hot; done",
        ])
        .current_dir(&repo)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let out = wtfs(&env.state(), &["warm", "repo", "--json"]);
    let _ = writer.kill();
    let _ = writer.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let skipped = json["skipped"].as_array().unwrap();
    wtfs_ok(&env.state(), &["new", "repo/w", "--warm"]);
    let m = env.mount();
    let w = m.wt("repo", "w");
    assert_eq!(
        fs::read_to_string(w.join("target/still")).unwrap(),
        "still\n"
    );
    if skipped.is_empty() {
        // What the file held at one instant: a truncation is an instant too (empty, or
        // part-written), but never two writes' bytes mixed, and the size the view gives
        // is the content's.
        let hot = fs::read(w.join("target/hot")).unwrap();
        assert!(hot.len() <= 1 << 20);
        assert_eq!(
            fs::metadata(w.join("target/hot")).unwrap().len(),
            hot.len() as u64
        );
        assert!(
            hot.iter()
                .all(|b| *b == hot.first().copied().unwrap_or(b'A'))
                && hot.first().is_none_or(|c| *c == b'A' || *c == b'B'),
            "one instant's content, not two writes mixed"
        );
    } else {
        assert_eq!(skipped[0]["path"], "target/hot", "{skipped:?}");
        assert!(
            skipped[0]["reason"]
                .as_str()
                .unwrap()
                .contains("changed each"),
            "{skipped:?}"
        );
        assert!(!w.join("target/hot").exists());
    }
    m.unmount();
}

#[test]
fn an_inherited_gitignore_rules_cleanup_as_it_rules_git() {
    let env = Env::new();
    let repo = env.repo.path();
    // HEAD ignores every log; the inherited `logs/.gitignore` re-includes one.
    fs::write(repo.join(".gitignore"), "*.log\n").unwrap();
    git(&repo, &["add", ".gitignore"]);
    git(&repo, &["commit", "-qm", "ignore logs"]);
    write(&repo, "logs/.gitignore", "!keep.log\n", 0o644);
    write(&repo, "logs/build.log", "built\n", 0o644);
    // Untracked, not ignored, inherited too.
    write(&repo, "conf/a", "setting\n", 0o644);
    fs::write(repo.join(".worktreeinclude"), "logs/\nconf/\n").unwrap();
    wtfs_ok(&env.state(), &["new", "repo/kept", "--warm"]);
    wtfs_ok(&env.state(), &["new", "repo/clean", "--warm"]);
    wtfs_ok(&env.state(), &["new", "repo/remade", "--warm"]);
    let m = env.mount_with(&["--linger", "1"]);
    let status = run_ok(
        "sh",
        &[
            "-c",
            "echo mine > logs/keep.log && echo more >> logs/build.log && git status --porcelain -uall",
        ],
        &m.wt("repo", "kept"),
    );
    // git sees the re-included file as untracked, the other log as ignored.
    assert!(status.contains("?? logs/keep.log"), "{status}");
    assert!(!status.contains("build.log"), "{status}");
    let status = run_ok(
        "sh",
        &[
            "-c",
            "echo x > logs/other.log && git status --porcelain -uall",
        ],
        &m.wt("repo", "clean"),
    );
    assert!(!status.contains("other.log"), "{status}");
    // The inherited directory deleted and made again, its file written anew with the
    // inherited bytes: the view no longer shows the snapshot there, so it is new work.
    run_ok(
        "sh",
        &[
            "-c",
            "cat conf/a > /tmp/wtfs-remade-$$ && rm -r conf && mkdir conf && cat /tmp/wtfs-remade-$$ > conf/a && rm /tmp/wtfs-remade-$$",
        ],
        &m.wt("repo", "remade"),
    );
    let limit = Duration::from_secs(60);
    wait_for_state(&env, "clean", "removed", limit);
    wait_for_state(&env, "kept", "retained", limit);
    wait_for_state(&env, "remade", "retained", limit);
    let retained = wtfs_ok(&env.state(), &["retained", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&retained).unwrap();
    assert_eq!(rows.len(), 2, "{retained}");
    let reason_of = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .map(|r| r["reason"].to_string())
            .unwrap_or_else(|| panic!("{name} not retained: {retained}"))
    };
    let reason = reason_of("kept");
    assert!(reason.contains("logs/keep.log"), "{retained}");
    assert!(!reason.contains("build.log"), "{retained}");
    assert!(reason_of("remade").contains("conf/a"), "{retained}");
    // A snapshot cleanup cannot read leaves it blind to the inherited rules: the
    // inspection fails, naming it, and nothing is removed on a partial view.
    wtfs_ok(&env.state(), &["new", "repo/blind", "--warm"]);
    let target = target_of(&env, &m, "blind");
    assert!(worktreefs::lifecycle::cleanup::inspect(&target).is_ok());
    let manifest = target.warm.clone().unwrap();
    fs::rename(&manifest, manifest.with_extension("moved")).unwrap();
    let err = worktreefs::lifecycle::cleanup::inspect(&target).unwrap_err();
    assert!(err.contains("reading its warm snapshot"), "{err}");
    fs::rename(manifest.with_extension("moved"), &manifest).unwrap();
    m.unmount();
}

/// `new --warm` says how old the snapshot it shows is (taken now, or so long ago; its
/// time in the JSON), and while a snapshot is taken a terminal sees the files copied so
/// far, a pipe nothing of it.
#[test]
fn a_warm_worktree_says_its_snapshots_age_and_a_take_shows_progress_on_a_terminal() {
    let env = Env::new();
    warm_source(&env.repo.path());
    // Older than a take by two seconds: a later take trusts what it recorded of them.
    std::thread::sleep(Duration::from_millis(2100));
    let state = env.state();
    // Through a pipe: the summary alone.
    let piped = wtfs(&state, &["warm", "repo"]);
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&piped.stderr).contains("of those found")
            && !String::from_utf8_lossy(&piped.stderr).contains("files, "),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    let snap: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["warm", "repo", "--json"])).unwrap();
    // On a terminal (script(1) gives the command one): files and bytes so far, then wiped.
    let cmd = format!("{BIN} --state-dir {} warm repo", state.display());
    let tty = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{seen}");
    assert!(
        seen.contains("taking the warm snapshot of repo: ") && seen.contains(" files, "),
        "{seen:?}"
    );
    assert!(seen.contains("\r\x1b[K"), "the line is wiped: {seen:?}");
    assert!(seen.contains("took warm snapshot"), "{seen:?}");

    // The newest snapshot is shown: its time in the JSON, its age in the text.
    let v: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["new", "repo/aged", "--warm", "--json"])).unwrap();
    let taken_at = v["warm_snapshot_taken_at"].as_str().unwrap().to_string();
    assert!(v["warm_snapshot_took_ms"].is_null(), "{v}");
    assert!(
        taken_at.as_str() >= snap["snapshot"]["taken_at"].as_str().unwrap(),
        "{v} {snap}"
    );
    let text = wtfs_ok(&state, &["new", "repo/aged-2", "--warm"]);
    assert!(
        text.contains(" s ago)") && text.contains("with warm snapshot"),
        "{text}"
    );
    // Nothing of the source moved since: it says none did.
    assert_eq!(v["warm_snapshot_moved_files"], 0, "{v}");
    assert_eq!(v["warm_snapshot_moved_dirs"], 0, "{v}");
    assert_eq!(v["warm_snapshot_moved_complete"], true, "{v}");
    // A file of the snapshot rewritten and one added where it has a directory: the next
    // warm worktree says so, and a new take reads only what moved.
    let src = env.repo.path();
    fs::write(
        src.join("node_modules/left-pad/index.js"),
        "module.exports = 2;\n",
    )
    .unwrap();
    fs::write(src.join("node_modules/left-pad/extra.js"), "x\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(&wtfs_ok(
        &state,
        &["new", "repo/aged-3", "--warm", "--json"],
    ))
    .unwrap();
    assert_eq!(v["warm_snapshot_moved_files"], 1, "{v}");
    assert_eq!(v["warm_snapshot_moved_dirs"], 1, "{v}");
    let text = wtfs_ok(&state, &["new", "repo/aged-4", "--warm"]);
    assert!(
        text.contains("1 of its files changed in the source and 1 of its directories"),
        "{text}"
    );
    let again: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["warm", "repo", "--json"])).unwrap();
    let files = snap["snapshot"]["files"].as_u64().unwrap() - snap["links"].as_u64().unwrap();
    // Every file but the rewritten one (the added one is new: read too).
    assert_eq!(
        again["unchanged"].as_u64().unwrap(),
        files - 1,
        "{again} {snap}"
    );
    let fresh = Env::new();
    warm_source(&fresh.repo.path());
    let text = wtfs_ok(&fresh.state(), &["new", "repo/first", "--warm"]);
    assert!(text.contains("taken now)"), "{text}");
}
