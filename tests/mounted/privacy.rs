//! Private by default: the state directory, its database and caches are the
//! owner's only; a mount is the mounting user's unless `--allow-other`, and then a
//! repository's worktrees are no more open than its own directory. Mounted tests are
//! bounded by the mount's watchdog and unmounted by their guards.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::*;

/// The test's temporary directory opened, so that only the state directory's own modes
/// keep nobody out.
fn open_to_others(env: &Env) {
    fs::set_permissions(env.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Every path below `root`, itself included.
fn walk(root: &Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(root.to_path_buf());
    if fs::symlink_metadata(root).unwrap().is_dir() {
        for e in fs::read_dir(root).unwrap() {
            walk(&e.unwrap().path(), out);
        }
    }
}

#[test]
fn a_fresh_state_directory_is_the_owners_only() {
    let env = Env::new();
    open_to_others(&env);
    let state = env.state();
    // Everything a state directory comes to hold: a worktree with a changed file, blobs
    // in the cache, a prebuilt index, the daemon's lock and log (a background mount).
    let mp = env.mountpoint();
    fs::create_dir(&mp).unwrap();
    let _guard = UnmountOnDrop {
        state: state.clone(),
        mountpoint: mp.clone(),
    };
    wtfs_ok(&state, &["mount", mp.to_str().unwrap()]);
    let wt = mp.join("repo/private");
    fs::create_dir(&wt).unwrap();
    assert_eq!(
        fs::read_to_string(wt.join("README.md")).unwrap(),
        "# test repository\n"
    );
    fs::write(wt.join("secret.txt"), b"a worktree's own content\n").unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(wt.join("src/main.rs"))
        .unwrap();

    assert_eq!(mode(&state), 0o700, "the state directory");
    let mut all = Vec::new();
    walk(&state, &mut all);
    for name in ["worktreefs.db", "daemon.lock", "daemon.log"] {
        assert_eq!(
            mode(&state.join(name)) & 0o077,
            0,
            "{name} is open to others"
        );
    }
    for e in fs::read_dir(&state).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(
            mode(&p) & 0o077,
            0,
            "{} is open to others ({:o})",
            p.display(),
            mode(&p)
        );
    }
    let blobs: Vec<_> = all
        .iter()
        .filter(|p| p.starts_with(state.join("blobs")) && p.is_file())
        .collect();
    assert!(!blobs.is_empty(), "reading a base file filled no blob");
    for b in &blobs {
        assert_eq!(mode(b), 0o400, "{}", b.display());
    }
    // Nobody reads or lists anything in it, by any path.
    let files: Vec<String> = all
        .iter()
        .filter(|p| p.is_file())
        .map(|p| format!("'{}'", p.display()))
        .collect();
    assert!(files.iter().any(|f| f.contains("secret.txt")));
    let out = as_nobody(
        Path::new("/"),
        &format!(
            "n=0; for f in {}; do cat \"$f\" >/dev/null 2>&1 && {{ echo \"read $f\"; n=1; }}; done; \
             ls '{}' >/dev/null 2>&1 && echo 'listed the state dir'; exit 0",
            files.join(" "),
            state.display()
        ),
    );
    let leaked = String::from_utf8_lossy(&out.stdout);
    assert!(leaked.trim().is_empty(), "nobody could: {leaked}");
    wtfs_ok(&state, &["unmount"]);
}

#[test]
fn a_state_directory_made_public_before_is_made_private() {
    let env = Env::new();
    let state = env.state();
    fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(
        state.join("worktreefs.db"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    wtfs_ok(&state, &["list"]);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("worktreefs.db")), 0o600);
}

#[test]
fn a_mount_is_private_unless_allow_other() {
    let env = Env::new();
    open_to_others(&env);
    let script = |mp: &Path| {
        format!(
            "cat '{}/repo/shared/README.md' && ls '{}' >/dev/null",
            mp.display(),
            mp.display()
        )
    };
    {
        let m = env.mount();
        fs::create_dir(m.wt("repo", "shared")).unwrap();
        let out = as_nobody(Path::new("/"), &script(&m.mountpoint));
        assert!(!out.status.success(), "nobody read a private mount");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Permission denied"), "{err}");
        m.unmount();
    }
    {
        let m = env.mount_with(&["--linger", "600", "--allow-other"]);
        let out = as_nobody(Path::new("/"), &script(&m.mountpoint));
        assert!(
            out.status.success(),
            "nobody could not read through --allow-other: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "# test repository\n");
        // `.control` (every lease, with its command line) is the mount owner's alone.
        for what in ["ls .control", "ls .control/leases", "cat .control/status"] {
            let out = as_nobody(&m.mountpoint, &format!("{what} > /dev/null"));
            assert!(!out.status.success(), "nobody could `{what}`");
        }
        assert!(fs::read_to_string(m.mountpoint.join(".control/status")).is_ok());
        // A worktree belongs to the user who created it: root's to root, and one that
        // nobody makes (in a repository of nobody's) to nobody.
        assert_eq!(fs::metadata(m.wt("repo", "shared")).unwrap().uid(), 0);
        std::os::unix::fs::chown(env.repo.path(), Some(NOBODY), Some(NOBODY)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let out = as_nobody(
            Path::new("/"),
            &format!(
                "mkdir '{}' && echo mine > '{}/new.txt'",
                m.wt("repo", "nobodys").display(),
                m.wt("repo", "nobodys").display()
            ),
        );
        assert!(
            out.status.success(),
            "nobody could not create a worktree in its repository: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            m.log()
        );
        let md = fs::metadata(m.wt("repo", "nobodys")).unwrap();
        assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY));
        let f = fs::metadata(m.wt("repo", "nobodys").join("README.md")).unwrap();
        assert_eq!(f.uid(), NOBODY, "its files are nobody's too");
        // And git's entry of it, where git inside writes its index and HEAD.
        let admin = env.repo.path().join(".git/worktrees/wtfs-nobodys");
        for name in ["", "HEAD", "index", "gitdir", "locked"] {
            let md = fs::symlink_metadata(admin.join(name)).unwrap();
            assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "{name}");
        }
        std::os::unix::fs::chown(env.repo.path(), Some(0), Some(0)).unwrap();
        // A repository kept to its owner keeps its worktrees to its owner.
        // (Within a second: the kernel keeps a repository directory's attributes that long.)
        fs::set_permissions(env.repo.path(), fs::Permissions::from_mode(0o700)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let out = as_nobody(Path::new("/"), &script(&m.mountpoint));
        assert!(
            !out.status.success(),
            "nobody read a worktree of a 0700 repository"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Its owner still can.
        assert_eq!(
            fs::read_to_string(m.wt("repo", "shared").join("README.md")).unwrap(),
            "# test repository\n"
        );
        m.unmount();
    }
}

#[test]
fn a_user_who_cannot_use_the_state_directory_is_told_so() {
    let env = Env::new();
    open_to_others(&env);
    let out = as_nobody(
        Path::new("/"),
        &format!("'{BIN}' --state-dir '{}' list", env.state().display()),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot be used by this user") || err.contains("not writable by this user"),
        "{err}"
    );
    assert!(err.contains(env.state().to_str().unwrap()), "{err}");
    assert!(!err.contains("readonly database"), "{err}");
    assert!(err.contains("--state-dir"), "no way out: {err}");
}

#[test]
fn a_damaged_database_is_named_with_the_way_out() {
    let env = Env::new();
    let db = env.state().join("worktreefs.db");
    for f in ["worktreefs.db-wal", "worktreefs.db-shm"] {
        let _ = fs::remove_file(env.state().join(f));
    }
    fs::write(&db, vec![0x5au8; 8192]).unwrap();
    for args in [&["list"][..], &["mount", "--foreground"][..]] {
        let mut full: Vec<&str> = args.to_vec();
        let mp = env.mountpoint();
        if args[0] == "mount" {
            fs::create_dir_all(&mp).unwrap();
            full.insert(1, mp.to_str().unwrap());
        }
        let out = wtfs(&env.state(), &full);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(db.to_str().unwrap()), "{err}");
        assert!(err.contains("move it aside"), "{err}");
        assert!(!is_mounted(&mp));
    }
}
