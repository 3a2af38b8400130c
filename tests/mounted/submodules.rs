//! Submodules as views of their own (`new --submodules`): an initialized submodule shows
//! at its recorded commit, git works inside it, cleanup counts what it holds as the
//! worktree's work and removes its git entry with the worktree.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;

/// A library repository, added to the test repository as the submodule `vendor/lib`
/// (initialized in the source checkout: its repository is `.git/modules/vendor/lib`).
fn with_submodule(env: &Env) -> (tempfile::TempDir, PathBuf) {
    let lib_dir = tempfile::tempdir().unwrap();
    let lib = lib_dir.path().join("lib");
    fs::create_dir(&lib).unwrap();
    git(&lib, &["init", "-q", "-b", "main"]);
    fs::write(lib.join("l.txt"), b"library\n").unwrap();
    fs::create_dir(lib.join("src")).unwrap();
    fs::write(lib.join("src/lib.c"), b"int lib(void) { return 1; }\n").unwrap();
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-q", "-m", "lib"]);
    let repo = env.repo.path();
    git(
        &repo,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            lib.to_str().unwrap(),
            "vendor/lib",
        ],
    );
    git(&repo, &["commit", "-q", "-m", "add the library"]);
    (lib_dir, lib)
}

fn admin_entries(repo: &Path) -> Vec<String> {
    fs::read_dir(repo.join(".git/modules/vendor/lib/worktrees"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_initialized_submodule_is_a_view_of_its_own_repository() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/s", "--submodules"]);
    wtfs_ok(&env.state(), &["new", "repo/plain"]);
    // Creation made nothing for the submodule yet.
    assert!(admin_entries(&repo).is_empty());
    let m = env.mount();
    let wt = m.wt("repo", "s");
    assert_eq!(run_ok("cat", &["vendor/lib/l.txt"], &wt), "library\n");
    assert_eq!(
        run_ok("ls", &["-A", "vendor/sub"], &wt),
        "",
        "not initialized: empty"
    );
    assert_eq!(admin_entries(&repo).len(), 1);
    // Byte for byte what a checkout with `git submodule update --init` holds.
    let out = tempfile::tempdir().unwrap();
    let checkout = out.path().join("checkout");
    git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "--detach",
            checkout.to_str().unwrap(),
        ],
    );
    git(
        &checkout,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "update",
            "-q",
            "--init",
            "vendor/lib",
        ],
    );
    assert_eq!(
        snapshot(&wt.join("vendor/lib")),
        snapshot(&checkout.join("vendor/lib"))
    );
    // git sees both clean, the superproject and the submodule.
    assert_eq!(
        git(&wt, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    let sub = wt.join("vendor/lib");
    assert_eq!(
        git(&sub, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    assert_eq!(
        git(&sub, &["rev-parse", "HEAD"]),
        git(&checkout.join("vendor/lib"), &["rev-parse", "HEAD"])
    );
    // Without the flag: an empty directory, as in a fresh `git worktree add`.
    assert_eq!(
        run_ok("ls", &["-A", "vendor/lib"], &m.wt("repo", "plain")),
        ""
    );
    // A change in the submodule shows in both, as git shows it.
    run_ok("sh", &["-c", "echo more >> l.txt"], &sub);
    assert_eq!(git(&sub, &["status", "--porcelain"]), " M l.txt\n");
    assert_eq!(git(&wt, &["status", "--porcelain"]), " M vendor/lib\n");
    run_ok("sh", &["-c", "git checkout -q l.txt"], &sub);
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    // A new commit in the submodule: the superproject sees it, in this daemon's life (the
    // journal) and after a restart (the answer from the layers).
    git(&sub, &["commit", "-q", "--allow-empty", "-m", "new"]);
    assert_eq!(git(&wt, &["status", "--porcelain"]), " M vendor/lib\n");
    drop(m);
    let m = env.mount();
    assert_eq!(git(&wt, &["status", "--porcelain"]), " M vendor/lib\n");
    git(&sub, &["reset", "-q", "--hard", "HEAD~1"]);
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    // A branch made inside the submodule at the same commit changes nothing git sees.
    git(&sub, &["checkout", "-q", "-b", "topic"]);
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "s")).unwrap();
    assert!(found.changes.is_empty(), "{:?}", found.changes);
    git(&sub, &["checkout", "-q", "--detach"]);
    assert!(run_ok("cat", &["vendor/lib/l.txt"], &wt).contains("library"));
    drop(m);
    git(
        &repo,
        &["worktree", "remove", "--force", checkout.to_str().unwrap()],
    );
}

#[test]
fn work_in_a_submodule_is_the_worktrees_work() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    for name in ["dirty", "committed", "pushed", "clean"] {
        wtfs_ok(
            &env.state(),
            &["new", &format!("repo/{name}"), "--submodules"],
        );
    }
    let m = env.mount_with(&["--linger", "600"]);
    // Uncommitted work inside the submodule.
    let dirty = m.wt("repo", "dirty").join("vendor/lib");
    run_ok("sh", &["-c", "echo draft > draft.txt"], &dirty);
    // A commit inside it, pushed nowhere.
    let committed = m.wt("repo", "committed").join("vendor/lib");
    run_ok(
        "sh",
        &["-c", "echo v2 > l.txt && git commit -q -am 'lib v2'"],
        &committed,
    );
    // A commit inside it, pushed to the submodule's remote.
    let pushed = m.wt("repo", "pushed").join("vendor/lib");
    run_ok(
        "sh",
        &["-c", "echo v3 > l.txt && git commit -q -am 'lib v3' && git push -q origin HEAD:refs/heads/from-view"],
        &pushed,
    );
    assert_eq!(
        git(&pushed, &["rev-parse", "HEAD"]),
        git(&pushed, &["rev-parse", "origin/from-view"])
    );
    // Looked at only.
    run_ok("cat", &["vendor/lib/l.txt"], &m.wt("repo", "clean"));
    assert_eq!(admin_entries(&repo).len(), 4);
    for name in ["dirty", "committed", "pushed", "clean"] {
        wait_for_state(&env, name, "lingering", Duration::from_secs(10));
    }
    // Retained, saying why (a reclaim that keeps a worktree exits 1).
    let kept = |name: &str| {
        let out = wtfs(&env.state(), &["reclaim", &format!("repo/{name}")]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let out = kept("dirty");
    assert!(
        out.contains("uncommitted-changes in submodule vendor/lib") && out.contains("draft.txt"),
        "{out}"
    );
    let out = kept("committed");
    assert!(
        out.contains("unpushed-commits in submodule vendor/lib"),
        "{out}"
    );
    // The superproject sees the new submodule commit as a change too, as git does.
    assert!(out.contains("modified vendor/lib"), "{out}");
    // Pushed: nothing of the submodule's is at risk; the superproject still records the
    // old commit, a change of its own that git lists too.
    let out = kept("pushed");
    assert!(!out.contains("in submodule"), "{out}");
    assert!(out.contains("modified vendor/lib"), "{out}");
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/clean"]);
    assert!(out.contains("removed repo/clean"), "{out}");
    // Its submodule's git entry went with it; the retained ones keep theirs.
    assert_eq!(admin_entries(&repo).len(), 3);
    drop(m);
}

#[test]
fn discarding_a_worktree_names_what_its_submodule_loses() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    wtfs_ok(&env.state(), &["new", "repo/d", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    let sub = m.wt("repo", "d").join("vendor/lib");
    run_ok(
        "sh",
        &[
            "-c",
            "echo draft > draft.txt && echo v2 > l.txt && git commit -q -am 'lib v2' && echo again >> l.txt",
        ],
        &sub,
    );
    let commit = git(&sub, &["rev-parse", "--short=10", "HEAD"]);
    wait_for_state(&env, "d", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/d", "--discard"]);
    assert!(out.contains("vendor/lib/draft.txt"), "{out}");
    assert!(out.contains("vendor/lib/l.txt"), "{out}");
    assert!(out.contains(commit.trim()), "{out}");
    assert!(out.contains("removed repo/d"), "{out}");
    drop(m);
}

#[test]
fn a_submodule_view_that_cannot_be_read_back_keeps_the_worktree() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    wtfs_ok(&env.state(), &["new", "repo/c", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "c");
    run_ok("sh", &["-c", "echo work > vendor/lib/new.txt"], &wt);
    wait_for_state(&env, "c", "lingering", Duration::from_secs(10));
    // Its record damaged (a crash, a version that wrote it otherwise).
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let id = store.worktree("repo", "c").unwrap().unwrap().id;
    let dir = fs::read_dir(state.subs(id))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::write(dir.join("record"), b"{ not a record").unwrap();
    let out = wtfs(&env.state(), &["reclaim", "repo/c"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cleanup-error") && err.contains("record"),
        "{err}"
    );
    assert!(dir.join("upper/new.txt").exists());
    drop(m);
}

#[test]
fn a_submodule_repository_reached_through_a_symlink_is_not_shown() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    // The submodule's repository made a link to another place.
    let elsewhere = tempfile::tempdir().unwrap();
    let module = repo.join(".git/modules/vendor/lib");
    fs::rename(&module, elsewhere.path().join("lib")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("lib"), &module).unwrap();
    // (Its checkout still found from there, as a real setup would have it.)
    git(
        &repo,
        &[
            "config",
            "--file",
            elsewhere.path().join("lib/config").to_str().unwrap(),
            "core.worktree",
            repo.join("vendor/lib").to_str().unwrap(),
        ],
    );
    wtfs_ok(&env.state(), &["new", "repo/l", "--submodules"]);
    let m = env.mount();
    assert_eq!(run_ok("ls", &["-A", "vendor/lib"], &m.wt("repo", "l")), "");
    assert!(!elsewhere.path().join("lib/worktrees").exists());
    drop(m);
}

#[test]
fn a_submodule_entry_someone_else_made_is_left_alone() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/o", "--submodules"]);
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let row = store.worktree("repo", "o").unwrap().unwrap();
    let key = worktreefs::layout::submodules::key_of(b"vendor/lib");
    let name = format!("{}-{}-{}", row.admin_name, row.id, &key[..8]);
    let foreign = repo.join(".git/modules/vendor/lib/worktrees").join(&name);
    fs::create_dir_all(&foreign).unwrap();
    fs::write(
        foreign.join("locked"),
        b"managed by worktreefs (state dir /elsewhere)\n",
    )
    .unwrap();
    fs::write(
        foreign.join("HEAD"),
        b"0123456789012345678901234567890123456789\n",
    )
    .unwrap();
    fs::write(foreign.join("index"), b"theirs").unwrap();
    let m = env.mount();
    let out = run("ls", &["vendor/lib"], &m.wt("repo", "o"));
    assert!(!out.status.success(), "{out:?}");
    assert!(
        m.log().contains("is not this worktree's entry"),
        "{}",
        m.log()
    );
    assert_eq!(fs::read(foreign.join("index")).unwrap(), b"theirs");
    drop(m);
}

#[test]
fn a_submodule_of_a_users_worktree_is_the_users_to_commit_in() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let (lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    for d in [env.dir.path(), env.repo.dir.path(), lib_dir.path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The user's own repository, submodule included.
    let chown = run(
        "chown",
        &["-R", &format!("{NOBODY}:{NOBODY}"), repo.to_str().unwrap()],
        Path::new("/"),
    );
    assert!(chown.status.success(), "{chown:?}");
    // The daemon opens users' repositories with libgit2's owner check off; so does this.
    libgit2_owner_check_off();
    create_owned_by(&env, "mine", NOBODY, true);
    let m = env.mount_with(&["--linger", "600", "--allow-other"]);
    let sub = m.wt("repo", "mine").join("vendor/lib");
    let out = as_nobody(
        &sub,
        "export HOME=/tmp GIT_AUTHOR_NAME=n GIT_AUTHOR_EMAIL=n@n GIT_COMMITTER_NAME=n GIT_COMMITTER_EMAIL=n@n; \
         echo mine >> l.txt && git commit -q -am mine && git status --porcelain && git log --oneline | wc -l",
    );
    assert!(out.status.success(), "{out:?}\n{}", m.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    drop(m);
}

#[test]
fn a_submodule_repository_replaced_by_a_symlink_later_is_not_followed() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/later", "--submodules"]);
    let m = env.mount();
    assert_eq!(
        run_ok("cat", &["vendor/lib/l.txt"], &m.wt("repo", "later")),
        "library\n"
    );
    // Work of its own, so the unmount keeps it.
    run_ok(
        "sh",
        &["-c", "echo keep > keep.txt"],
        &m.wt("repo", "later"),
    );
    drop(m);
    let elsewhere = tempfile::tempdir().unwrap();
    let module = repo.join(".git/modules/vendor/lib");
    fs::rename(&module, elsewhere.path().join("lib")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("lib"), &module).unwrap();
    let m = env.mount();
    let out = run("ls", &["vendor/lib"], &m.wt("repo", "later"));
    assert!(!out.status.success(), "{out:?}");
    assert!(m.log().contains("no longer a directory"), "{}", m.log());
    drop(m);
}

/// A checkout of HEAD with its submodule initialized, beside the mount, for comparing.
fn checkout_with_submodule(repo: &Path, at: &Path) {
    git(
        repo,
        &["worktree", "add", "-q", "--detach", at.to_str().unwrap()],
    );
    git(
        at,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "update",
            "-q",
            "--init",
            "vendor/lib",
        ],
    );
}

#[test]
fn a_submodule_is_removed_and_moved_as_in_a_checkout() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    for name in ["rm", "deinit", "mv", "cwd"] {
        wtfs_ok(
            &env.state(),
            &["new", &format!("repo/{name}"), "--submodules"],
        );
    }
    wtfs_ok(&env.state(), &["new", "repo/plain"]);
    let out = tempfile::tempdir().unwrap();
    let m = env.mount_with(&["--linger", "600"]);
    let status = |d: &Path| git(d, &["status", "--porcelain", "--untracked-files=all"]);

    // `git rm` of the submodule: its directory goes, as in a checkout.
    let wt = m.wt("repo", "rm");
    let co = out.path().join("rm");
    checkout_with_submodule(&repo, &co);
    assert!(run_ok("cat", &["vendor/lib/l.txt"], &wt).contains("library"));
    git(&co, &["rm", "-q", "vendor/lib"]);
    let r = run("git", &["rm", "-q", "vendor/lib"], &wt);
    assert!(r.status.success(), "{r:?}");
    assert!(!wt.join("vendor/lib").exists());
    assert_eq!(status(&wt), status(&co));
    assert_eq!(status(&wt), "M  .gitmodules\nD  vendor/lib\n");
    git(&wt, &["commit", "-q", "-m", "drop the library"]);
    assert_eq!(status(&wt), "");
    // Cleanup counts none of it as work left behind: the files went with an explicit
    // removal, and the superproject's commit is its own work (unpushed here).
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "rm")).unwrap();
    assert!(found.changes.is_empty(), "{:?}", found.changes);
    for (path, s) in &found.submodules {
        assert!(s.changes.is_empty(), "{path}: {:?}", s.changes);
        assert!(s.unpushed.is_empty(), "{path}: {:?}", s.unpushed);
    }
    // Without submodule views (an empty directory) too: git stages the `.gitmodules` it
    // rewrote (it trusts fsmonitor's word for files it rewrites itself).
    let plain = m.wt("repo", "plain");
    git(&plain, &["rm", "-q", "vendor/lib"]);
    assert_eq!(status(&plain), "M  .gitmodules\nD  vendor/lib\n");
    // A process whose directory the view was makes nothing there once it is gone (ENOENT,
    // as on ext4).
    let r = run(
        "sh",
        &[
            "-c",
            "cd vendor/lib && rm -rf ./* .git && rmdir ../lib && if touch x 2>/dev/null; then echo made; else echo refused; fi",
        ],
        &m.wt("repo", "cwd"),
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout), "refused\n", "{r:?}");
    assert_eq!(status(&m.wt("repo", "cwd")), " D vendor/lib\n");
    // After a remount the path is still gone, and git still agrees.
    drop(m);
    let m = env.mount_with(&["--linger", "600"]);
    assert!(!wt.join("vendor/lib").exists());
    assert_eq!(status(&wt), "");

    // `git submodule deinit`: an empty directory stays, as in a checkout.
    let wt = m.wt("repo", "deinit");
    let co = out.path().join("deinit");
    checkout_with_submodule(&repo, &co);
    assert!(run_ok("cat", &["vendor/lib/l.txt"], &wt).contains("library"));
    let r = run("git", &["submodule", "deinit", "-q", "vendor/lib"], &wt);
    assert!(r.status.success(), "{r:?}");
    assert_eq!(run_ok("ls", &["-A", "vendor/lib"], &wt), "");
    git(&co, &["submodule", "deinit", "-q", "-f", "vendor/lib"]);
    assert_eq!(status(&wt), status(&co));
    assert_eq!(status(&wt), "");
    // The directory is the superproject's now: a file there is as in a checkout's.
    run_ok("sh", &["-c", "echo x > vendor/lib/own.txt"], &wt);
    run_ok("sh", &["-c", "echo x > vendor/lib/own.txt"], &co);
    assert_eq!(status(&wt), status(&co));
    run_ok("rm", &["vendor/lib/own.txt"], &wt);

    // `mv` of a directory above the submodule: the view moves with it, as in a checkout.
    let wt = m.wt("repo", "mv");
    let co = out.path().join("mv");
    checkout_with_submodule(&repo, &co);
    let sub = wt.join("vendor/lib");
    run_ok("sh", &["-c", "echo draft > draft.txt"], &sub);
    run_ok(
        "sh",
        &["-c", "echo draft > draft.txt"],
        &co.join("vendor/lib"),
    );
    run_ok("mv", &["vendor", "third_party"], &wt);
    run_ok("mv", &["vendor", "third_party"], &co);
    assert!(!wt.join("vendor").exists());
    assert_eq!(
        run_ok("cat", &["third_party/lib/draft.txt"], &wt),
        "draft\n"
    );
    assert_eq!(
        snapshot(&wt.join("third_party/lib"))
            .into_iter()
            .filter(|(k, _)| k != ".git")
            .collect::<Vec<_>>(),
        snapshot(&co.join("third_party/lib"))
            .into_iter()
            .filter(|(k, _)| k != ".git")
            .collect::<Vec<_>>()
    );
    assert_eq!(status(&wt), status(&co));
    // git inside the moved view works (in the checkout a plain `mv` leaves the
    // submodule's `core.worktree` naming the old path: git there fails until `git mv`
    // or `git submodule absorbgitdirs` repairs it).
    let moved = wt.join("third_party/lib");
    assert_eq!(status(&moved), "?? draft.txt\n");
    assert_eq!(
        git(&moved, &["rev-parse", "HEAD"]),
        git(&wt, &["rev-parse", "HEAD:vendor/lib"])
    );
    // The moved tree is the superproject's untracked work: cleanup keeps it.
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "mv")).unwrap();
    assert!(
        found
            .changes
            .iter()
            .any(|c| c.path.starts_with("third_party/")),
        "{:?}",
        found.changes
    );

    // The deinitialized directory stays empty.
    let sub = m.wt("repo", "deinit").join("vendor/lib");
    assert!(!sub.join("l.txt").exists());
    drop(m);
    for name in ["rm", "deinit", "mv"] {
        git(
            &repo,
            &[
                "worktree",
                "remove",
                "--force",
                "--force",
                out.path().join(name).to_str().unwrap(),
            ],
        );
    }
}

#[test]
fn a_submodule_commit_outlives_the_removal_of_its_directory() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    wtfs_ok(&env.state(), &["new", "repo/c", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "c");
    run_ok(
        "sh",
        &[
            "-c",
            "cd vendor/lib && echo v2 > l.txt && git commit -q -am 'lib v2' && cd ../.. && git rm -q -f vendor/lib && git commit -q -m gone",
        ],
        &wt,
    );
    // (Looked at by a child: the test's own process would take a lease.)
    assert!(run("test", &["!", "-e", "vendor/lib"], &wt)
        .status
        .success());
    wait_for_state(&env, "c", "lingering", Duration::from_secs(10));
    let out = wtfs(&env.state(), &["reclaim", "repo/c"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unpushed-commits in submodule vendor/lib"),
        "{err}"
    );
    assert!(!err.contains("uncommitted-changes in submodule"), "{err}");
    drop(m);
}

/// `args` with file:// submodule URLs allowed.
fn with_file<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [&["-c", "protocol.file.allow=always"][..], args].concat()
}

/// `deep`, a submodule of `lib`, a submodule of the test repository at `vendor/lib`; all
/// initialized in the source checkout. The directory holding their repositories is
/// returned, to be kept while the test runs.
fn with_nested_submodules(env: &Env) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("deep");
    fs::create_dir(&deep).unwrap();
    git(&deep, &["init", "-q", "-b", "main"]);
    fs::write(deep.join("d.txt"), b"deep\n").unwrap();
    git(&deep, &["add", "-A"]);
    git(&deep, &["commit", "-q", "-m", "deep"]);
    let lib = dir.path().join("lib");
    fs::create_dir(&lib).unwrap();
    git(&lib, &["init", "-q", "-b", "main"]);
    fs::write(lib.join("l.txt"), b"library\n").unwrap();
    git(&lib, &["add", "-A"]);
    git(
        &lib,
        &with_file(&[
            "submodule",
            "add",
            "-q",
            deep.to_str().unwrap(),
            "third/deep",
        ]),
    );
    git(&lib, &["commit", "-q", "-m", "lib"]);
    let repo = env.repo.path();
    git(
        &repo,
        &with_file(&[
            "submodule",
            "add",
            "-q",
            lib.to_str().unwrap(),
            "vendor/lib",
        ]),
    );
    git(
        &repo,
        &with_file(&[
            "submodule",
            "update",
            "-q",
            "--init",
            "--recursive",
            "vendor/lib",
        ]),
    );
    git(&repo, &["commit", "-q", "-m", "add the library"]);
    dir
}

#[test]
fn nested_submodules_are_views_too() {
    let env = Env::new();
    let _dir = with_nested_submodules(&env);
    let repo = env.repo.path();
    for name in ["n", "work", "rmn"] {
        wtfs_ok(
            &env.state(),
            &["new", &format!("repo/{name}"), "--submodules"],
        );
    }
    let out = tempfile::tempdir().unwrap();
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "n");
    // As a recursive checkout has it, byte for byte; git clean at each level.
    let co = out.path().join("co");
    git(
        &repo,
        &["worktree", "add", "-q", "--detach", co.to_str().unwrap()],
    );
    git(
        &co,
        &with_file(&[
            "submodule",
            "update",
            "-q",
            "--init",
            "--recursive",
            "vendor/lib",
        ]),
    );
    assert_eq!(
        run_ok("cat", &["vendor/lib/third/deep/d.txt"], &wt),
        "deep\n"
    );
    // (Compared by a child: the test's own process would take a lease.)
    let diff = run(
        "diff",
        &[
            "-r",
            "-x",
            ".git",
            "vendor",
            co.join("vendor").to_str().unwrap(),
        ],
        &wt,
    );
    assert!(diff.status.success(), "{diff:?}");
    let status = |d: &Path| git(d, &["status", "--porcelain", "--untracked-files=all"]);
    for d in ["", "vendor/lib", "vendor/lib/third/deep"] {
        assert_eq!(status(&wt.join(d)), "", "{d}");
    }
    let deep_view = wt.join("vendor/lib/third/deep");
    assert_eq!(
        git(&deep_view, &["rev-parse", "HEAD"]),
        git(&co.join("vendor/lib/third/deep"), &["rev-parse", "HEAD"])
    );
    // A change at the bottom shows at each level as git shows it.
    run_ok("sh", &["-c", "echo more >> d.txt"], &deep_view);
    run_ok(
        "sh",
        &["-c", "echo more >> d.txt"],
        &co.join("vendor/lib/third/deep"),
    );
    for d in ["", "vendor/lib", "vendor/lib/third/deep"] {
        assert_eq!(status(&wt.join(d)), status(&co.join(d)), "{d}");
    }
    run_ok("sh", &["-c", "git checkout -q d.txt"], &deep_view);
    assert_eq!(status(&wt), "");

    // Work at the bottom is the worktree's work, named by its path.
    let deep_work = m.wt("repo", "work").join("vendor/lib/third/deep");
    run_ok(
        "sh",
        &[
            "-c",
            "echo v2 > d.txt && git commit -q -am 'deep v2' && echo draft > draft.txt",
        ],
        &deep_work,
    );
    wait_for_state(&env, "n", "lingering", Duration::from_secs(10));
    wait_for_state(&env, "work", "lingering", Duration::from_secs(10));
    let out_w = wtfs(&env.state(), &["reclaim", "repo/work"]);
    assert_eq!(out_w.status.code(), Some(1), "{out_w:?}");
    let err = String::from_utf8_lossy(&out_w.stderr);
    assert!(
        err.contains("uncommitted-changes in submodule vendor/lib/third/deep")
            && err.contains("draft.txt"),
        "{err}"
    );
    assert!(
        err.contains("unpushed-commits in submodule vendor/lib/third/deep"),
        "{err}"
    );
    // lib sees its submodule moved on, as `git status` in lib says.
    assert!(
        err.contains("in submodule vendor/lib (1 path: modified third/deep)"),
        "{err}"
    );
    // `rm -r` of a submodule with a view inside: both go; git and cleanup agree.
    let rmn = m.wt("repo", "rmn");
    run_ok("cat", &["vendor/lib/third/deep/d.txt"], &rmn);
    // A view with views of its own submodules made in it does not move, nor a directory
    // above it (their records are keyed by paths through it): EXDEV, nothing changed.
    for from in ["vendor/lib", "vendor"] {
        let r = run(
            "perl",
            &["-e", &format!("rename('{from}', 'moved') or die \"$!\\n\"")],
            &rmn,
        );
        assert!(
            String::from_utf8_lossy(&r.stderr).contains("cross-device"),
            "{from}: {r:?}"
        );
    }
    assert_eq!(
        run_ok("cat", &["vendor/lib/third/deep/d.txt"], &rmn),
        "deep\n"
    );
    run_ok("rm", &["-rf", "vendor/lib"], &rmn);
    assert_eq!(status(&rmn), " D vendor/lib\n");
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "rmn")).unwrap();
    assert_eq!(
        found
            .changes
            .iter()
            .map(|c| c.path.as_str())
            .collect::<Vec<_>>(),
        ["vendor/lib"]
    );
    assert_eq!(found.submodules.len(), 2);
    assert!(found.submodules.iter().all(|(_, s)| s.changes.is_empty()));
    // Untouched below: removed with every level's git entry.
    let deep_entries = |repo: &Path| {
        fs::read_dir(repo.join(".git/modules/vendor/lib/modules/third/deep/worktrees"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(deep_entries(&repo), 3);
    let r = wtfs_ok(&env.state(), &["reclaim", "repo/n"]);
    assert!(r.contains("removed repo/n"), "{r}");
    assert_eq!(deep_entries(&repo), 2);
    assert_eq!(admin_entries(&repo).len(), 2);
    drop(m);
    git(
        &repo,
        &[
            "worktree",
            "remove",
            "--force",
            "--force",
            co.to_str().unwrap(),
        ],
    );
}

#[test]
fn a_removed_submodule_whose_repository_is_deleted_leaves_nothing_to_keep() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/g", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "g");
    // The submodule's `.git` is listed last: a removal cut short keeps it.
    let listed = run_ok("ls", &["-f", "-A", "vendor/lib"], &wt);
    assert_eq!(listed.lines().last(), Some(".git"), "{listed}");
    // The usual recipe: `git rm`, then the submodule's repository goes by hand.
    git(&wt, &["rm", "-q", "vendor/lib"]);
    fs::remove_dir_all(repo.join(".git/modules/vendor/lib")).unwrap();
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "g"));
    let found = found.expect("inspection does not fail over a submodule it no longer shows");
    assert!(found.submodules.is_empty(), "{:?}", found.submodules);
    drop(m);
}

/// The superproject's owner can rename any submodule entry in `modules/<name>/worktrees`
/// into another's name; a removal takes only the entry of its own submodule view (its
/// `gitdir` names that view's `.git`), and a mount repoints only that one.
#[test]
fn a_removal_takes_only_its_own_submodule_entry() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/mine", "--submodules"]);
    wtfs_ok(&env.state(), &["new", "repo/theirs", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    // Work of each kept at the unmount, so both are there at the next mount.
    for name in ["mine", "theirs"] {
        run_ok(
            "sh",
            &["-c", "cat vendor/lib/l.txt && echo draft > draft.txt"],
            &m.wt("repo", name),
        );
    }
    let worktrees = repo.join(".git/modules/vendor/lib/worktrees");
    let entry_of = |name: &str| {
        admin_entries(&repo)
            .into_iter()
            .find(|e| {
                fs::read_to_string(worktrees.join(e).join("gitdir"))
                    .unwrap()
                    .ends_with(&format!("/repo/{name}/vendor/lib/.git\n"))
            })
            .unwrap()
    };
    let (mine, theirs) = (entry_of("mine"), entry_of("theirs"));
    m.unmount();
    fs::rename(worktrees.join(&mine), worktrees.join("mine-away")).unwrap();
    fs::rename(worktrees.join(&theirs), worktrees.join(&mine)).unwrap();
    let theirs_gitdir = fs::read_to_string(worktrees.join(&mine).join("gitdir")).unwrap();
    // The mount does not point the other view's entry at this one.
    let m = env.mount_with(&["--linger", "600"]);
    assert_eq!(
        fs::read_to_string(worktrees.join(&mine).join("gitdir")).unwrap(),
        theirs_gitdir,
        "the mount rewrote the other view's entry"
    );
    let out = wtfs(&env.state(), &["reclaim", "repo/mine", "--discard"]);
    assert_eq!(state_of(&env, "mine"), "removed", "{out:?}");
    assert!(
        worktrees.join(&mine).join("HEAD").exists(),
        "the other view's entry was deleted: {:?}",
        admin_entries(&repo)
    );
    assert_eq!(
        fs::read_to_string(worktrees.join(&mine).join("gitdir")).unwrap(),
        theirs_gitdir
    );
    m.unmount();
}

/// `git mv` of a submodule (and `mv` of its directory) moves its view, as in a checkout:
/// git writes its `.git` anew there, naming the same entry; what is in it, uncommitted or
/// committed, moves with it, stays across a remount, and cleanup names it by its new
/// path.
#[test]
fn a_submodule_view_moves_with_git_mv() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/mv", "--submodules"]);
    let out = tempfile::tempdir().unwrap();
    let co = out.path().join("co");
    checkout_with_submodule(&repo, &co);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "mv");
    let status = |d: &Path| git(d, &["status", "--porcelain", "--untracked-files=all"]);
    for d in [&wt, &co] {
        run_ok("sh", &["-c", "echo draft > vendor/lib/draft.txt"], d);
        let r = run("git", &["mv", "vendor/lib", "lib"], d);
        assert!(r.status.success(), "{}: {r:?}", d.display());
    }
    assert!(!run("test", &["-e", "vendor/lib"], &wt).status.success());
    assert_eq!(run_ok("cat", &["lib/l.txt"], &wt), "library\n");
    assert_eq!(run_ok("cat", &["lib/draft.txt"], &wt), "draft\n");
    assert_eq!(status(&wt), status(&co));
    assert_eq!(status(&wt.join("lib")), status(&co.join("lib")));
    assert_eq!(status(&wt.join("lib")), "?? draft.txt\n");
    // Its .git names the same entry, as it did.
    let gitfile = run_ok("cat", &["lib/.git"], &wt);
    assert!(
        gitfile.contains("modules/vendor/lib/worktrees/"),
        "{gitfile}"
    );
    // One naming anything else is refused.
    let r = run(
        "sh",
        &["-c", "printf 'gitdir: /elsewhere\\n' > lib/.git"],
        &wt,
    );
    assert!(!r.status.success(), "{r:?}");
    assert_eq!(run_ok("cat", &["lib/.git"], &wt), gitfile);
    // Committed in both, the superproject and the submodule; then moved back by mv.
    for d in [&wt, &co] {
        git(d, &["commit", "-q", "-m", "move the library"]);
        git(&d.join("lib"), &["add", "draft.txt"]);
        git(&d.join("lib"), &["commit", "-q", "-m", "draft"]);
    }
    assert_eq!(status(&wt), status(&co));
    assert_eq!(status(&wt), " M lib\n");
    let lib_head = git(&wt.join("lib"), &["rev-parse", "HEAD"]);
    run_ok("mkdir", &["third_party"], &wt);
    run_ok("mv", &["lib", "third_party/lib"], &wt);
    assert_eq!(
        run_ok("cat", &["third_party/lib/draft.txt"], &wt),
        "draft\n"
    );
    assert_eq!(
        git(&wt.join("third_party/lib"), &["rev-parse", "HEAD"]),
        lib_head
    );
    run_ok("mv", &["third_party/lib", "lib"], &wt);
    assert_eq!(status(&wt), " M lib\n");
    // Onto a name whose base file was removed (a whiteout there), and back: the removed
    // file stays removed.
    run_ok(
        "sh",
        &["-c", "rm README.md && mv lib README.md && mv README.md lib"],
        &wt,
    );
    assert!(!run("test", &["-e", "README.md"], &wt).status.success());
    assert_eq!(git(&wt.join("lib"), &["rev-parse", "HEAD"]), lib_head);
    assert_eq!(status(&wt), " D README.md\n M lib\n");
    git(&wt, &["checkout", "-q", "--", "README.md"]);
    assert_eq!(status(&wt), " M lib\n");
    // After a remount: where it was moved, with what it holds; git agrees.
    m.unmount();
    let m = env.mount_with(&["--linger", "600"]);
    assert!(!run("test", &["-e", "vendor/lib"], &wt).status.success());
    assert_eq!(run_ok("cat", &["lib/draft.txt"], &wt), "draft\n");
    assert_eq!(git(&wt.join("lib"), &["rev-parse", "HEAD"]), lib_head);
    assert_eq!(status(&wt), " M lib\n");
    assert_eq!(status(&wt.join("lib")), "");
    // Cleanup names its work by where it is now.
    wait_for_state(&env, "mv", "lingering", Duration::from_secs(10));
    let said = reclaim_kept(&env, "repo/mv", Duration::from_secs(30));
    assert!(said.contains("unpushed-commits in submodule lib"), "{said}");
    // Removed where it is now, as in a checkout.
    for d in [&wt, &co] {
        let r = run("git", &["rm", "-q", "-f", "lib"], d);
        assert!(r.status.success(), "{}: {r:?}", d.display());
    }
    assert!(!run("test", &["-e", "lib"], &wt).status.success());
    assert_eq!(status(&wt), status(&co));
    m.unmount();
    git(
        &repo,
        &[
            "worktree",
            "remove",
            "--force",
            "--force",
            co.to_str().unwrap(),
        ],
    );
}

/// A directory above submodule views moves with them, as in a checkout: `git mv vendor
/// third_party` (git writes each view's `.git` anew), and a plain rename of a directory
/// whose submodule was never looked at; across a remount too.
#[test]
fn a_directory_above_a_submodule_view_moves_with_it() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/d", "--submodules"]);
    wtfs_ok(&env.state(), &["new", "repo/unseen", "--submodules"]);
    let out = tempfile::tempdir().unwrap();
    let co = out.path().join("co");
    checkout_with_submodule(&repo, &co);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "d");
    let status = |d: &Path| git(d, &["status", "--porcelain", "--untracked-files=all"]);
    for d in [&wt, &co] {
        run_ok("sh", &["-c", "echo draft > vendor/lib/draft.txt"], d);
        let r = run("git", &["mv", "vendor", "third_party"], d);
        assert!(r.status.success(), "{}: {r:?}", d.display());
    }
    assert!(!run("test", &["-e", "vendor"], &wt).status.success());
    assert_eq!(status(&wt), status(&co));
    let sub = wt.join("third_party/lib");
    assert_eq!(status(&sub), status(&co.join("third_party/lib")));
    assert_eq!(status(&sub), "?? draft.txt\n");
    for d in [&wt, &co] {
        git(d, &["commit", "-q", "-m", "move the vendored tree"]);
    }
    assert_eq!(status(&wt), status(&co));
    // Never looked at before the rename: shown at its new place all the same.
    let unseen = m.wt("repo", "unseen");
    run_ok(
        "perl",
        &["-e", "rename('vendor', 'elsewhere') or die \"$!\\n\""],
        &unseen,
    );
    assert_eq!(
        run_ok("cat", &["elsewhere/lib/l.txt"], &unseen),
        "library\n"
    );
    assert_eq!(status(&unseen.join("elsewhere/lib")), "");
    // Moved back, a submodule that is not initialized is a plain directory, as before;
    // a file made in it is work cleanup sees (git lists the gitlink as modified content).
    run_ok(
        "sh",
        &["-c", "mv elsewhere vendor && echo w > vendor/sub/w.txt"],
        &unseen,
    );
    assert_eq!(run_ok("ls", &["vendor/sub"], &unseen), "w.txt\n");
    let found = worktreefs::lifecycle::cleanup::inspect(&target_of(&env, &m, "unseen")).unwrap();
    assert!(
        found.changes.iter().any(|c| c.path == "vendor/sub"),
        "{:?}",
        found.changes
    );
    // After a remount, where they were moved.
    m.unmount();
    let m = env.mount_with(&["--linger", "600"]);
    assert_eq!(status(&sub), "?? draft.txt\n");
    assert_eq!(status(&wt), status(&co));
    assert_eq!(run_ok("cat", &["vendor/lib/l.txt"], &unseen), "library\n");
    assert_eq!(run_ok("ls", &["vendor/sub"], &unseen), "w.txt\n");
    wait_for_state(&env, "d", "lingering", Duration::from_secs(10));
    let said = reclaim_kept(&env, "repo/d", Duration::from_secs(30));
    assert!(
        said.contains("uncommitted-changes in submodule third_party/lib"),
        "{said}"
    );
    m.unmount();
    git(
        &repo,
        &[
            "worktree",
            "remove",
            "--force",
            "--force",
            co.to_str().unwrap(),
        ],
    );
}

/// A FIFO the superproject's owner put where the submodule's repository has a file
/// (libgit2 opens it, and would wait for a writer for good): the lookup that makes the
/// view answers within the timeout, the next one at once, the rest of the worktree is
/// served meanwhile; once the file is a file again the view is made.
#[test]
fn a_submodule_repository_that_blocks_does_not_hold_the_mount() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/b", "--submodules"]);
    let config = repo.join(".git/modules/vendor/lib/config");
    let saved = fs::read(&config).unwrap();
    fs::remove_file(&config).unwrap();
    run_ok("mkfifo", &[config.to_str().unwrap()], Path::new("/"));
    let m = env.mount_with(&["--linger", "600", "--inspect-timeout", "2"]);
    let wt = m.wt("repo", "b");
    let started = std::time::Instant::now();
    let r = run("ls", &["vendor/lib"], &wt);
    assert!(!r.status.success(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(m.log().contains("not made within 2"), "{}", m.log());
    let started = std::time::Instant::now();
    let r = run("ls", &["vendor/lib"], &wt);
    assert!(!r.status.success(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(m.log().contains("still blocked"), "{}", m.log());
    assert!(!run_ok("cat", &["README.md"], &wt).is_empty());
    // A writer lets the blocked reader go; the file made a file again, the view is made.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _w = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&config)
            .unwrap();
    }
    fs::remove_file(&config).unwrap();
    fs::write(&config, saved).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = run("cat", &["vendor/lib/l.txt"], &wt);
        if r.status.success() {
            assert_eq!(String::from_utf8_lossy(&r.stdout), "library\n");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{r:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    m.unmount();
}

/// A worktree whose directory in the state dir was removed by hand (its submodule views'
/// records with it): its views' git entries are found by name and removed with it, and
/// another worktree's are left.
#[test]
fn a_worktree_removed_by_hand_takes_its_submodule_entries() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/gone", "--submodules"]);
    wtfs_ok(&env.state(), &["new", "repo/kept", "--submodules"]);
    let m = env.mount_with(&["--linger", "600"]);
    for name in ["gone", "kept"] {
        run_ok(
            "sh",
            &["-c", "echo draft > vendor/lib/draft.txt"],
            &m.wt("repo", name),
        );
    }
    m.unmount();
    assert_eq!(admin_entries(&repo).len(), 2);
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let id = store.worktree("repo", "gone").unwrap().unwrap().id;
    fs::remove_dir_all(env.state().join("worktrees").join(id.to_string())).unwrap();
    let m = env.mount_with(&["--linger", "600"]);
    assert_eq!(state_of(&env, "gone"), "removed");
    let left = admin_entries(&repo);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        run_ok("cat", &["vendor/lib/draft.txt"], &m.wt("repo", "kept")),
        "draft\n"
    );
    m.unmount();
}

/// A rewind puts a submodule view moved since the checkpoint back where it was: the
/// superproject's names and the view's record both (its own files are its own layer's,
/// which no checkpoint keeps: they move with it, unchanged). Its undo moves it again.
#[test]
fn a_rewind_puts_a_moved_submodule_view_back_where_it_was() {
    let env = Env::new();
    let (_lib_dir, _lib) = with_submodule(&env);
    wtfs_ok(&env.state(), &["new", "repo/w", "--submodules"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    let status = |d: &Path| git(d, &["status", "--porcelain", "--untracked-files=all"]);
    run_ok("sh", &["-c", "echo draft > vendor/lib/draft.txt"], &wt);
    let before = status(&wt);
    let lib_head = git(&wt.join("vendor/lib"), &["rev-parse", "HEAD"]);
    let taken = |label: &str| -> u64 {
        let out = wtfs_ok(
            &env.state(),
            &["checkpoint", "repo/w", "--label", label, "--json"],
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["checkpoint"]
            .as_u64()
            .unwrap()
    };
    let rewind = |to: u64| -> u64 {
        let out = wtfs_ok(
            &env.state(),
            &["rewind", "repo/w", "--to", &to.to_string(), "--json"],
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["undo"]["checkpoint"]
            .as_u64()
            .unwrap()
    };
    let at_first = taken("before the move");
    git(&wt, &["mv", "vendor/lib", "lib"]);
    assert_eq!(run_ok("cat", &["lib/draft.txt"], &wt), "draft\n");
    let undo = rewind(at_first);
    let back_at = |at: &str, gone: &str| {
        assert!(
            !run("test", &["-e", gone], &wt).status.success(),
            "{gone} is still there"
        );
        assert_eq!(run_ok("cat", &[&format!("{at}/l.txt")], &wt), "library\n");
        assert_eq!(run_ok("cat", &[&format!("{at}/draft.txt")], &wt), "draft\n");
        assert_eq!(git(&wt.join(at), &["rev-parse", "HEAD"]), lib_head);
        assert_eq!(status(&wt.join(at)), "?? draft.txt\n");
    };
    back_at("vendor/lib", "lib");
    assert_eq!(status(&wt), before);
    // Its undo moves it again; a remount keeps what the last rewind said.
    rewind(undo);
    back_at("lib", "vendor/lib");
    m.unmount();
    let m = env.mount();
    back_at("lib", "vendor/lib");
    rewind(at_first);
    back_at("vendor/lib", "lib");
    assert_eq!(status(&wt), before);
    // Removed: a rewind shows its directory again (what the removal deleted inside it
    // is its own layer's, not kept).
    let kept = taken("before the removal");
    git(&wt, &["rm", "-q", "-f", "vendor/lib"]);
    assert!(!run("test", &["-e", "vendor/lib"], &wt).status.success());
    rewind(kept);
    assert!(run("test", &["-d", "vendor/lib"], &wt).status.success());
    let record = fs::read_dir(
        env.state()
            .join("worktrees")
            .join(id_of(&env, "w").to_string())
            .join("subs"),
    )
    .unwrap()
    .flatten()
    .map(|e| fs::read_to_string(e.path().join("record")).unwrap())
    .collect::<Vec<_>>();
    assert_eq!(record.len(), 1);
    assert!(record[0].contains("\"removed\": false"), "{}", record[0]);
    m.unmount();
}

/// Nested views (a submodule's own submodule) are their parent view's to show: a rewind
/// leaves a nested view moved inside its parent where it is (the parent's layer, which
/// holds that move, is not rewound), and refuses to move back a view that has nested
/// views of its own, saying how to go on.
#[test]
fn a_rewind_leaves_nested_views_to_their_parent_and_refuses_moving_one_back() {
    let env = Env::new();
    let _dir = with_nested_submodules(&env);
    wtfs_ok(&env.state(), &["new", "repo/w", "--submodules"]);
    let m = env.mount();
    let wt = m.wt("repo", "w");
    let taken = || -> String {
        let out = wtfs_ok(&env.state(), &["checkpoint", "repo/w", "--json"]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["checkpoint"]
            .as_u64()
            .unwrap()
            .to_string()
    };
    // Moved inside its parent view: the rewind leaves it there.
    assert_eq!(
        run_ok("cat", &["vendor/lib/third/deep/d.txt"], &wt),
        "deep\n"
    );
    let before = taken();
    git(&wt.join("vendor/lib"), &["mv", "third/deep", "deep2"]);
    wtfs_ok(&env.state(), &["rewind", "repo/w", "--to", &before]);
    assert_eq!(run_ok("cat", &["vendor/lib/deep2/d.txt"], &wt), "deep\n");
    assert!(!run("test", &["-e", "vendor/lib/third/deep"], &wt)
        .status
        .success());
    // A view with a nested view, moved since the checkpoint: refused, nothing changed.
    let m2 = {
        m.unmount();
        wtfs_ok(&env.state(), &["new", "repo/v", "--submodules"]);
        env.mount()
    };
    let v = m2.wt("repo", "v");
    assert_eq!(run_ok("cat", &["vendor/lib/l.txt"], &v), "library\n");
    let out = wtfs_ok(&env.state(), &["checkpoint", "repo/v", "--json"]);
    let at = serde_json::from_str::<serde_json::Value>(&out).unwrap()["checkpoint"]
        .as_u64()
        .unwrap()
        .to_string();
    // Moved before its nested view is made (git mv would rewrite that view's .git).
    run_ok("mv", &["vendor/lib", "lib"], &v);
    assert_eq!(run_ok("cat", &["lib/third/deep/d.txt"], &v), "deep\n");
    let r = wtfs(&env.state(), &["rewind", "repo/v", "--to", &at]);
    let said = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(!r.status.success(), "{said}");
    assert!(said.contains("has submodule views of its own"), "{said}");
    assert!(said.contains("submodule deinit"), "{said}");
    assert_eq!(run_ok("cat", &["lib/third/deep/d.txt"], &v), "deep\n");
    assert!(!run("test", &["-e", "vendor/lib"], &v).status.success());
    m2.unmount();
}
