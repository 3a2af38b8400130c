//! Cleanup's inspection and removal called directly, with no mount: the upper layer is
//! written by hand in the documented on-disk format, the repository is real.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::common::*;
use worktreefs::lifecycle::cleanup::{self, ChangeKind, Findings, Head, Outcome, Target};
use worktreefs::state::StateDir;
use worktreefs::store::Store;

struct Fixture {
    env: Env,
    state: StateDir,
    store: Store,
}

impl Fixture {
    fn new() -> Fixture {
        let env = Env::new();
        let state = StateDir::open(&env.state()).unwrap();
        let store = Store::open(&state.root).unwrap();
        Fixture { env, state, store }
    }

    /// A new worktree and where its upper layer is.
    fn worktree(&mut self, name: &str) -> (Target, PathBuf) {
        let row = create_at_head(&self.state, &mut self.store, name);
        let repo = self.store.repo_by_id(row.repo_id).unwrap().unwrap();
        let t = Target::new(&self.state, &row, &repo, &self.env.mountpoint());
        let upper = t.upper.clone();
        (t, upper)
    }
}

fn write(path: PathBuf, content: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn changes(f: &Findings) -> Vec<String> {
    let mut v: Vec<String> = f.changes.iter().map(|c| c.to_string()).collect();
    v.sort();
    v
}

#[test]
fn inspection_sees_exactly_what_git_status_would() {
    let mut fx = Fixture::new();

    // Untouched: clean, HEAD on its branch, nothing unpushed.
    let (t, _) = fx.worktree("clean");
    let f = cleanup::inspect(&t).unwrap();
    assert_eq!(changes(&f), Vec::<String>::new());
    assert_eq!(f.head, Head::Branch("clean".into()));
    assert!(f.unpushed.is_empty());
    assert!(f.tip_elsewhere, "the base is main's tip");

    // Ignored only: by the base's .gitignore, by one in the upper layer, inside an ignored
    // directory; a file copied up without a change is no change either.
    let (t, up) = fx.worktree("ignored");
    write(up.join("target/debug/app"), "bin");
    write(up.join("src/lib/util.o"), "obj");
    write(up.join("src/.gitignore"), "*.tmp\n");
    write(up.join("src/scratch.tmp"), "tmp");
    write(up.join("README.md"), "# test repository\n");
    let f = cleanup::inspect(&t).unwrap();
    // The new src/.gitignore itself is untracked work.
    assert_eq!(changes(&f), ["untracked src/.gitignore"]);

    // Every kind of change.
    let (t, up) = fx.worktree("dirty");
    write(up.join("notes.txt"), "notes");
    write(up.join("src/main.rs"), "fn main() {}\n");
    fs::copy(fx.env.repo.path().join("build.sh"), up.join("build.sh")).unwrap();
    fs::set_permissions(up.join("build.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(up.join(".wtfs-wh.empty.txt"), "").unwrap();
    fs::create_dir_all(up.join("src/lib")).unwrap();
    fs::write(up.join("src/lib/.wtfs-opaque"), "").unwrap();
    fs::write(up.join("src/lib/mod.rs"), "pub mod util;\n").unwrap();
    std::os::unix::fs::symlink("src", up.join("link-to-readme")).unwrap();
    write(up.join("keep/empty-dir/.placeholder-not"), "");
    fs::remove_file(up.join("keep/empty-dir/.placeholder-not")).unwrap();
    let f = cleanup::inspect(&t).unwrap();
    assert_eq!(
        changes(&f),
        [
            "deleted empty.txt",
            "deleted src/lib/util.rs",
            "modified build.sh",
            "modified link-to-readme",
            "modified src/main.rs",
            "untracked notes.txt",
        ]
    );

    // Staged only: the index differs from HEAD, the files do not.
    let (t, _) = fx.worktree("staged");
    let repo = git2::Repository::open(&t.gitdir).unwrap();
    let blob = repo.blob(b"staged\n").unwrap();
    let mut index = git2::Index::open(&t.admin.join("index")).unwrap();
    let mut e = index
        .get_path(std::path::Path::new("README.md"), 0)
        .unwrap();
    e.id = blob;
    index.add(&e).unwrap();
    index.write().unwrap();
    let f = cleanup::inspect(&t).unwrap();
    assert_eq!(changes(&f), ["staged README.md"]);
    assert_eq!(f.changes[0].kind, ChangeKind::Staged);

    // A commit on the branch: unpushed until a remote-tracking ref has it.
    let (t, _) = fx.worktree("committed");
    let base = repo
        .find_commit(git2::Oid::from_str(&t.base_commit).unwrap())
        .unwrap();
    let sig = git2::Signature::now("T", "t@example.com").unwrap();
    let c = repo
        .commit(
            Some("refs/heads/committed"),
            &sig,
            &sig,
            "empty change",
            &base.tree().unwrap(),
            &[&base],
        )
        .unwrap();
    let f = cleanup::inspect(&t).unwrap();
    assert_eq!(f.unpushed, vec![c]);
    assert!(!f.tip_elsewhere);
    assert!(f.changes.is_empty());
    repo.reference("refs/remotes/origin/committed", c, false, "pushed")
        .unwrap();
    let f = cleanup::inspect(&t).unwrap();
    assert!(f.unpushed.is_empty());
    assert!(f.tip_elsewhere);

    // HEAD moved to another branch.
    let (t, _) = fx.worktree("moved");
    fs::write(t.admin.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let f = cleanup::inspect(&t).unwrap();
    assert_eq!(f.head, Head::Branch("main".into()));
}

#[test]
fn a_step_failing_in_the_middle_of_removal_retains_with_every_file_in_place() {
    let mut fx = Fixture::new();
    // Removals that keep nothing: the first step moves the upper layer away.
    worktreefs::lifecycle::cleanup::keep::KeepPolicy {
        keep_secs: 0,
        ..Default::default()
    }
    .record(&fx.store)
    .unwrap();
    let (t, up) = fx.worktree("w");
    write(up.join("target/out"), "ignored build output");
    // The git entry no longer says worktreefs made it: the second step refuses.
    fs::write(t.admin.join("locked"), "someone else's\n").unwrap();
    fx.store
        .begin_deleting(t.id, &[worktreefs::lease::State::Ready], "test")
        .unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    let out = cleanup::finish(
        &fx.state,
        &mut fx.store,
        &row,
        &fx.env.mountpoint(),
        &cleanup::Inspection::default(),
    )
    .unwrap();
    match out {
        Outcome::Retained(r) => assert!(
            r.starts_with("cleanup-error: removing git's worktree entry"),
            "{r}"
        ),
        other => panic!("{other:?}"),
    }
    // The first step (moving the upper layer away) was undone.
    assert_eq!(
        fs::read_to_string(up.join("target/out")).unwrap(),
        "ignored build output"
    );
    assert!(t.admin.join("HEAD").exists());
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    assert_eq!(row.state.as_str(), "retained");
    assert!(row.removal.is_none());
    assert_eq!(fx.store.retained().unwrap().len(), 1);
    // The branch is untouched.
    assert!(git(&fx.env.repo.path(), &["branch", "--list", "w"]).contains('w'));
}

/// A removal that keeps: its first step (git's HEAD and index copied, the tip and the
/// staged files kept under a ref) is undone when a later step fails, ref and all.
#[test]
fn a_failing_removal_that_keeps_undoes_what_it_kept() {
    use std::os::unix::fs::chown;
    let mut fx = Fixture::new();
    let (t, up) = fx.worktree("k");
    write(up.join("target/out"), "ignored build output");
    // The parking directory is not the daemon's own: parking git's entry fails, after
    // the keep and the move of the upper layer.
    let removing = fx.env.repo.path().join(".git/worktreefs/removing");
    fs::create_dir_all(&removing).unwrap();
    chown(&removing, Some(65534), Some(65534)).unwrap();
    fx.store
        .begin_deleting(t.id, &[worktreefs::lease::State::Ready], "test")
        .unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    let out = cleanup::finish(
        &fx.state,
        &mut fx.store,
        &row,
        &fx.env.mountpoint(),
        &cleanup::Inspection::default(),
    )
    .unwrap();
    match out {
        Outcome::Retained(r) => assert!(
            r.starts_with("cleanup-error: removing git's worktree entry")
                && r.contains("not worktreefs's own"),
            "{r}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fs::read_to_string(up.join("target/out")).unwrap(),
        "ignored build output"
    );
    assert!(!t.dir.join("kept").exists(), "kept/ undone");
    assert!(!fx.state.removed_dir(t.id).exists());
    assert_eq!(
        git(&fx.env.repo.path(), &["for-each-ref", "refs/worktreefs"]),
        "",
        "the kept ref undone"
    );
    assert!(fx.store.kept().unwrap().is_empty());
    // Once the directory is the daemon's again, the removal keeps.
    fs::remove_dir(&removing).unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    fx.store
        .begin_deleting(row.id, &[worktreefs::lease::State::Retained], "test")
        .unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    let out = cleanup::finish(
        &fx.state,
        &mut fx.store,
        &row,
        &fx.env.mountpoint(),
        &cleanup::Inspection::default(),
    )
    .unwrap();
    assert!(matches!(out, Outcome::Removed(_)), "{out:?}");
    let kept = fx.store.kept().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        fs::read_to_string(fx.state.removed_dir(t.id).join("upper/target/out")).unwrap(),
        "ignored build output"
    );
    assert!(fx.state.removed_dir(t.id).join("kept/index").exists());
    assert!(
        git(&fx.env.repo.path(), &["for-each-ref", "refs/worktreefs"])
            .contains(kept[0].tip_ref.as_deref().unwrap())
    );
}

/// Keeping is a safety net, never what stops a removal: a HEAD made a FIFO (which would
/// block a reader for good) is not opened, the removal goes on and says it kept nothing.
#[test]
fn a_removal_that_cannot_keep_goes_on_and_says_so() {
    let mut fx = Fixture::new();
    let (t, up) = fx.worktree("nk");
    write(up.join("target/out"), "ignored build output");
    fs::remove_file(t.admin.join("HEAD")).unwrap();
    nix::unistd::mkfifo(
        &t.admin.join("HEAD"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    fx.store
        .begin_deleting(t.id, &[worktreefs::lease::State::Ready], "test")
        .unwrap();
    // As a removal already decided (a `--discard`, or one carried on after a crash).
    fx.store.set_removal(t.id, "remove+keep").unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (state, mountpoint) = (fx.state.clone(), fx.env.mountpoint());
    let root = fx.state.root.clone();
    std::thread::spawn(move || {
        let mut store = Store::open(&root).unwrap();
        let _ = tx.send(
            cleanup::finish(
                &state,
                &mut store,
                &row,
                &mountpoint,
                &cleanup::Inspection::default(),
            )
            .map(|o| format!("{o:?}")),
        );
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the removal did not block")
        .unwrap();
    assert!(out.contains("Removed") && out.contains("not kept"), "{out}");
    assert!(
        out.contains("FIFO") || out.contains("not a regular file"),
        "{out}"
    );
    assert!(fx.store.kept().unwrap().is_empty());
    assert!(
        !fx.state.removed_dir(t.id).exists(),
        "not kept: deleted as before"
    );
    assert_eq!(
        git(&fx.env.repo.path(), &["for-each-ref", "refs/worktreefs"]),
        ""
    );
}

/// A branch's ref the repository's owner made a FIFO blocks whoever reads it: the keep
/// reads it on the owner's bounded thread, so the removal goes on after that thread's
/// limit (kept without its ref), and the thread, once the FIFO lets it go, makes no ref.
#[test]
fn a_fifo_ref_holds_a_removal_only_for_the_owner_threads_limit() {
    let mut fx = Fixture::new();
    let (t, up) = fx.worktree("ff");
    write(up.join("target/out"), "ignored build output");
    let fifo = fx.env.repo.path().join(".git/refs/heads/ff");
    fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    fx.store
        .begin_deleting(t.id, &[worktreefs::lease::State::Ready], "test")
        .unwrap();
    fx.store.set_removal(t.id, "remove+keep").unwrap();
    let row = fx.store.worktree_by_id(t.id).unwrap().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (state, mountpoint) = (fx.state.clone(), fx.env.mountpoint());
    let root = fx.state.root.clone();
    std::thread::spawn(move || {
        let mut store = Store::open(&root).unwrap();
        let _ = tx.send(
            cleanup::finish(
                &state,
                &mut store,
                &row,
                &mountpoint,
                &cleanup::Inspection::default(),
            )
            .map(|o| format!("{o:?}")),
        );
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(90))
        .expect("the removal is held by a FIFO ref")
        .unwrap();
    assert!(
        out.contains("Removed") && out.contains("restorable"),
        "{out}"
    );
    let kept = fx.store.kept().unwrap();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].tip.is_none(), "{:?}", kept[0]);
    // Let the blocked thread go (libgit2 reads a ref by its size: it reads nothing from
    // a FIFO, and fails): no ref is made afterwards.
    drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    std::thread::sleep(std::time::Duration::from_secs(2));
    let refs = fx.env.repo.path().join(".git/refs/worktreefs");
    let made = walk(&refs);
    assert!(made.is_empty(), "{made:?}");
    fs::remove_file(&fifo).unwrap();
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
