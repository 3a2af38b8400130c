//! Faults: a full disk, a database held by another process. Mounted, with a
//! real repository; each test bounded by the mount's watchdog and unmounted by its guard.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A small tmpfs at a path, detached when dropped (declare it before the mount it holds,
/// so it goes last).
struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    fn new(path: &Path, size: &str, inodes: u32) -> SmallDisk {
        fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},nr_inodes={inodes},mode=0755"))
            .arg("wtfs-test-disk")
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs at {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    /// Takes every inode and every block left; returns what to delete to give them back.
    fn fill(&self) -> PathBuf {
        let fill = self.path.join("fill");
        fs::create_dir(&fill).unwrap();
        let mut i = 0;
        loop {
            match fs::File::create(fill.join(format!("i{i}"))) {
                Ok(_) => i += 1,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling inodes: {e}"),
            }
            assert!(i < 1_000_000, "the disk never ran out of inodes");
        }
        // The last inode went to a file; its blocks go to one big file (which exists
        // already: the first name).
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(fill.join("i0"))
            .unwrap();
        let chunk = vec![7u8; 1 << 16];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling blocks: {e}"),
            }
        }
        fill
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// The first line a child writes to its piped standard output.
fn first_line(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    line
}

/// Runs `script` in a new shell in `dir` (a process of its own: it takes its own lease)
/// and returns its exit status and stderr.
fn sh(dir: &Path, script: &str) -> (bool, String) {
    let out = run("sh", &["-c", script], dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits up to 5 s for a shell step to succeed (space freed: the kernel may need a moment
/// to hand it back).
fn eventually(dir: &Path, script: &str) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (ok, err) = sh(dir, script);
        if ok {
            return;
        }
        assert!(Instant::now() < end, "`{script}` kept failing: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_full_state_disk_answers_enospc_and_the_daemon_survives_it() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&dir.path().join("state"), "24m", 4000);
    let env = Env::in_dir(dir);
    assert_eq!(env.state(), disk.path);
    let m = env.mount();
    let wt = m.wt("repo", "full");
    fs::create_dir(&wt).unwrap();
    // Something already in the upper layer, and a directory to rename into.
    let (ok, err) = sh(&wt, "echo before > mine.txt && mkdir there");
    assert!(ok, "{err}");

    let fill = disk.fill();
    // Every change that needs space says so, as ext4 would.
    let steps: &[(&str, &str)] = &[
        ("copy-up of a base file", "echo more >> README.md"),
        ("a new file", "echo x > new.txt"),
        ("a new directory", "mkdir newdir"),
        ("removing a base file (its whiteout)", "rm src/main.rs"),
        ("renaming a base file", "mv build.sh there/"),
        (
            "growing an upper file",
            "head -c 1048576 /dev/zero >> mine.txt",
        ),
        ("a new worktree", "mkdir ../another"),
    ];
    for (what, script) in steps {
        let (ok, err) = sh(&wt, script);
        assert!(!ok, "{what} succeeded on a full disk");
        assert!(
            err.contains("No space left on device"),
            "{what}: expected ENOSPC, got: {err}"
        );
    }
    // Reads still work, for processes that were not seen before too.
    for _ in 0..3 {
        let (ok, err) = sh(
            &wt,
            "cat README.md src/lib/util.rs > /dev/null && ls -R . > /dev/null",
        );
        assert!(ok, "a read on a full disk failed: {err}");
    }
    // The daemon is up: its log cannot be written, and it does not care.
    assert!(
        fs::read_to_string(m.mountpoint.join(".control/stats")).is_ok(),
        "the daemon is gone"
    );

    // Space comes back: everything works again.
    fs::remove_dir_all(&fill).unwrap();
    eventually(&wt, "echo more >> README.md");
    for (_, script) in steps {
        eventually(&wt, script);
    }
    assert!(fs::read_to_string(wt.join("README.md"))
        .unwrap()
        .ends_with("more\n"));
    assert!(!wt.join("src/main.rs").exists());
    assert!(wt.join("there/build.sh").exists());
    m.unmount();
}

/// Holds the store's write lock from another process for `secs` seconds (SQLite's own
/// locking, as any tool opening the file could). Returns once the lock is held.
fn hold_database(state: &Path, secs: u32) -> std::process::Child {
    let db = state.join("worktreefs.db");
    let script = format!(
        "import sqlite3,sys,time\n\
         c=sqlite3.connect({db:?},isolation_level=None)\n\
         c.execute('BEGIN EXCLUSIVE')\n\
         print('held',flush=True)\n\
         time.sleep({secs})\n\
         c.execute('COMMIT')\n"
    );
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    assert_eq!(line.trim(), "held");
    child
}

#[test]
fn a_database_held_by_another_process_stalls_no_request() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "held");
    fs::create_dir(&wt).unwrap();
    let (ok, err) = sh(&wt, "cat README.md > /dev/null");
    assert!(ok, "{err}");

    let mut holder = hold_database(&env.state(), 8);
    // New processes enter, read and write; `ls .control` lists. None of it waits for the
    // database.
    let started = Instant::now();
    for i in 0..3 {
        let t = Instant::now();
        let (ok, err) = sh(
            &wt,
            &format!("cat README.md src/main.rs > /dev/null && echo {i} > new{i}.txt"),
        );
        assert!(ok, "{err}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a new process entering waited {:?} for the database",
            t.elapsed()
        );
    }
    let t = Instant::now();
    let (ok, err) = sh(&m.mountpoint, "ls .control/ .control/leases > /dev/null");
    assert!(ok, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "ls .control waited {:?} for the database",
        t.elapsed()
    );
    // A process that stays holds its lease in memory meanwhile, and `.control` shows it.
    let mut stay = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read l < '{}/README.md' && echo in && exec sleep 5",
            wt.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut stay);
    assert_eq!(line.trim(), "in");
    let names: Vec<String> = fs::read_dir(m.mountpoint.join(".control/leases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let _ = stay.kill();
    let _ = stay.wait();
    assert!(
        names
            .iter()
            .any(|n| n.contains(&format!("@pid:{}:", stay.id()))),
        "the lease kept in memory is not in .control/leases: {names:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "the requests took as long as the lock was held"
    );
    let _ = holder.wait();
    // The leases kept in memory meanwhile are written once the database is free, each
    // with its event.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let events = wtfs_ok(&env.state(), &["events"]);
        // One before the hold, then one for each of the three shells (one may take an
        // earlier shell's lease as its heir, still inside when that one's exit is seen).
        if events.matches(" acquired ").count() >= 4 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the leases taken while the database was held were not recorded: {events}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    m.unmount();
}

#[test]
fn a_live_mount_of_another_state_dir_is_never_taken_over() {
    let a = Env::new();
    let b = Env::new();
    // B mounted at A's mountpoint first, then died there: its mount is stale.
    let mb = Mounted::start(&b.state(), &a.mountpoint());
    mb.kill9();
    // A takes the mountpoint: the dead mount is detached.
    let ma = a.mount();
    let wt = ma.wt("repo", "live");
    fs::create_dir(&wt).unwrap();
    assert!(wt.join("README.md").exists());

    // B again, in the background and in the foreground: refused, naming A's daemon.
    let amp = a.mountpoint();
    for extra in [&[][..], &["--foreground"][..]] {
        let mut args = vec!["mount", amp.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = wtfs(&b.state(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "mount over a live mount succeeded");
        assert!(
            err.contains("is in use") && err.contains(&format!("pid {}", ma.pid())),
            "the refusal does not say who serves it: {err}"
        );
        assert!(err.contains(a.state().to_str().unwrap()), "{err}");
    }
    // B's unmount (its last mountpoint is A's now) leaves A alone too.
    let out = wtfs(&b.state(), &["unmount"]);
    assert!(!out.status.success(), "B's unmount detached A's mount");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A is untouched and still serving.
    assert!(is_mounted(&ma.mountpoint));
    assert_eq!(
        fs::read_to_string(wt.join("README.md")).unwrap(),
        "# test repository\n"
    );
    assert!(fs::read_to_string(ma.mountpoint.join(".control/stats")).is_ok());
    ma.unmount();
}

/// A worktreefs mount whose connection outlives its daemon answers nothing (the kernel
/// ends a killed daemon's io_uring queues after the daemon is gone; a `/dev/fuse`
/// descriptor left in another process holds a connection open): the next mount of the
/// state directory whose daemon left it takes the mountpoint over, as it does a mount
/// that answers ENOTCONN, rather than calling it in use. Another state directory's mount
/// there is still refused: a mount that does not answer may be a busy daemon's.
#[test]
fn a_mount_no_daemon_serves_is_taken_over_even_when_it_never_answers() {
    let env = Env::new();
    let mp = env.mountpoint();
    let m = env.mount();
    // A copy of the daemon's /dev/fuse descriptor, held here: killed, the daemon leaves a
    // connection that nobody answers and that does not end.
    let pid = m.pid() as i32;
    let fd: i32 = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| fs::read_link(e.path()).is_ok_and(|l| l == Path::new("/dev/fuse")))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .expect("the daemon holds /dev/fuse");
    // SAFETY: pidfd_open and pidfd_getfd on a child of this test; both return a new
    // descriptor or -1.
    let held = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let held = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as i32;
        libc::close(pidfd);
        assert!(
            held >= 0,
            "pidfd_getfd: {}",
            std::io::Error::last_os_error()
        );
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(held)
    };
    m.kill9();
    // Another state directory does not take it: nothing says its daemon is gone.
    let other = Env::new();
    let out = wtfs(&other.state(), &["mount", mp.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "another state dir took a mount that may be live"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = wtfs(&env.state(), &["mount", mp.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // The connection goes with its descriptor; a mount left by a failure goes with `env`.
    drop(held);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("detached the stale mount"), "{err}");
    let wt = mp.join("repo").join("taken");
    fs::create_dir(&wt).unwrap();
    assert!(wt.join("README.md").exists());
    let out = wtfs(&env.state(), &["unmount"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A mount made there since by someone else (another connection, which no daemon of
    // this state dir made) is not taken for the one its daemon left, answer or not.
    let dev = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0",
        std::os::fd::AsRawFd::as_raw_fd(&dev)
    );
    nix::mount::mount(
        Some("worktreefs"),
        &mp,
        Some("fuse.worktreefs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .unwrap();
    let out = wtfs(&env.state(), &["mount", mp.to_str().unwrap()]);
    drop(dev);
    assert!(
        !out.status.success(),
        "took a mount its daemon did not make"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A worktree's state as the daemon's `.control` shows it (the CLI's `list` would wait for
/// a database held by someone else).
fn removed(env: &Env, name: &str) -> bool {
    state_of(env, name) == "removed"
}

#[test]
fn reclaim_racing_a_process_entering_never_removes_the_worktree_under_it() {
    let env = Env::new();
    let m = env.mount();
    for i in 0..8 {
        let name = format!("race-{i}");
        let wt = m.wt("repo", &name);
        fs::create_dir(&wt).unwrap();
        // A shell enters, reads a file of it and stays inside (its working directory: a
        // process with nothing inside lets go within two seconds: the last close).
        // Every other round with
        // the database held by another process: that lease is then kept in memory, where
        // only the daemon sees it.
        let holder = (i % 2 == 0).then(|| hold_database(&env.state(), 2));
        // (`exec`: the shell becomes the sleep, so killing it ends everything it started.)
        let mut enter = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cd '{}' && read line < README.md && echo entered && exec sleep 5",
                wt.display()
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100 + 60 * i as u64));
        let reclaim = wtfs(&env.state(), &["reclaim", &format!("repo/{name}")]);
        if let Some(mut h) = holder {
            let _ = h.wait();
        }
        // Read whether it got in (it prints before sleeping).
        let line = first_line(&mut enter);
        let entered = line.trim() == "entered";
        eprintln!(
            "round {i}: entered {entered}: {}",
            String::from_utf8_lossy(&reclaim.stderr)
        );
        let gone = removed(&env, &name);
        assert!(
            !(entered && gone),
            "round {i}: {name} was removed while a process that entered it is inside (reclaim: {} {})",
            reclaim.status,
            String::from_utf8_lossy(&reclaim.stderr)
        );
        if entered {
            assert!(
                !reclaim.status.success(),
                "round {i}: reclaim says it removed {name}"
            );
            assert!(wt.join("README.md").exists());
        }
        let _ = enter.kill();
        let _ = enter.wait();
    }
    m.unmount();
}

/// A repository of `n` files in one commit on `main`, made with git fast-import (quick).
fn big_repo(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("big");
    fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let mut stream = String::from(
        "commit refs/heads/main\ncommitter T <t@example.com> 1700000000 +0000\ndata 4\nbig\n",
    );
    for i in 0..n {
        let body = format!("file {i}\n");
        stream.push_str(&format!(
            "M 100644 inline d{}/e{}/f{i}.txt\ndata {}\n{body}\n",
            i % 50,
            i % 7,
            body.len()
        ));
    }
    let mut child = Command::new("git")
        .args(["fast-import", "--quiet"])
        .current_dir(&repo)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    dir
}

/// What a creation leaves: directories under `<state>/worktrees`, git admin entries of
/// the repository, and its branches, each of which must belong to a worktree's row.
fn assert_nothing_half_made(state: &Path, gitdir: &Path) {
    let store = worktreefs::store::Store::open(state).unwrap();
    assert_eq!(
        store.creations().unwrap(),
        vec![],
        "creations left recorded"
    );
    let rows = store.worktrees().unwrap();
    for e in fs::read_dir(state.join("worktrees")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            rows.iter().any(|w| w.id.to_string() == name),
            "{name} in the state dir's worktrees belongs to no worktree"
        );
    }
    if let Ok(rd) = fs::read_dir(gitdir.join("worktrees")) {
        for e in rd {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                rows.iter().any(|w| w.admin_name == name),
                "git admin entry {name} belongs to no worktree"
            );
        }
    }
    let branches = run_ok(
        "git",
        &["for-each-ref", "--format=%(refname:short)", "refs/heads/"],
        gitdir,
    );
    for b in branches.lines().filter(|b| *b != "main") {
        assert!(
            rows.iter().any(|w| w.branch.as_deref() == Some(b)),
            "branch {b} belongs to no worktree"
        );
    }
}

#[test]
fn new_killed_at_any_point_leaves_nothing_in_the_way() {
    let env = Env::new();
    let big = big_repo(20_000);
    let big_path = big.path().join("big");
    wtfs_ok(
        &env.state(),
        &["repo", "add", big_path.to_str().unwrap(), "--name", "big"],
    );
    // The first creation at a commit builds its index; later ones copy it. Kill times
    // spread over a whole creation of the kind the loop makes.
    wtfs_ok(&env.state(), &["new", "big/first"]);
    let t = Instant::now();
    wtfs_ok(&env.state(), &["new", "big/second"]);
    let span = t.elapsed().max(Duration::from_millis(20)).as_micros() as u64 * 3 / 2;
    let mut rng = Rng::new(15);
    let mut by_mount = Vec::new();
    for i in 0..16 {
        let name = format!("big/k{i}");
        let mut child = Command::new(BIN)
            .args(["--state-dir", env.state().to_str().unwrap(), "new", &name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(span)));
        let _ = child.kill();
        let _ = child.wait();
        if i % 2 == 0 {
            // The next `new` of that name rolls back what the killed one left.
            let out = wtfs(&env.state(), &["new", &name]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || err.contains("already exists"),
                "new {name} after a kill: {err}"
            );
        } else {
            by_mount.push(name);
        }
    }
    // The next mount rolls back the rest.
    let m = env.mount();
    assert_nothing_half_made(&env.state(), &big_path.join(".git"));
    for name in &by_mount {
        let out = wtfs(&env.state(), &["new", name]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("already exists"),
            "new {name} after a kill and a mount: {err}"
        );
    }
    // Every worktree made is whole.
    for i in 0..16 {
        let wt = m.wt("big", &format!("k{i}"));
        assert_eq!(
            fs::read_to_string(wt.join("d3/e3/f3.txt")).unwrap(),
            "file 3\n"
        );
        let status = run_ok("git", &["status", "--porcelain"], &wt);
        assert_eq!(status, "", "k{i} is not clean");
    }
    m.unmount();
    assert_nothing_half_made(&env.state(), &big_path.join(".git"));
}

#[test]
fn a_rollback_touches_only_what_its_creation_made() {
    use worktreefs::lifecycle::create::roll_back_dead_creations;
    use worktreefs::store::{CreationRow, Store};
    let env = Env::new();
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let mut store = Store::open(&env.state()).unwrap();
    let repo = store.repo_by_name("repo").unwrap().unwrap();
    let head = env.repo.head();
    // Creations killed before their first step (their creator, pid 1 with another start
    // time, is gone): meanwhile a user made the branch one of them meant to, and another
    // state directory's worktreefs the admin entry the other one chose.
    for (name, admin) in [("mine", "wtfs-mine"), ("theirs", "wtfs-theirs")] {
        let r = CreationRow {
            worktree_id: worktreefs::ids::WorktreeId(0),
            repo_id: repo.id,
            name: name.into(),
            branch: Some(name.into()),
            base_commit: head.clone(),
            admin_name: admin.into(),
            pid: 1,
            pid_start: 1,
            started_at: 0,
            restored_from: None,
        };
        store.begin_creation(&r).unwrap();
    }
    git(&env.repo.path(), &["branch", "mine", &head]);
    let other = env.repo.path().join(".git/worktrees/wtfs-theirs");
    fs::create_dir_all(&other).unwrap();
    fs::write(
        other.join("locked"),
        "managed by worktreefs (state dir /elsewhere)\n",
    )
    .unwrap();
    assert_eq!(roll_back_dead_creations(&state, &mut store).unwrap(), 2);
    assert!(store.creations().unwrap().is_empty());
    assert_eq!(
        git(&env.repo.path(), &["rev-parse", "refs/heads/mine"]).trim(),
        head,
        "the user's branch was deleted"
    );
    assert!(
        other.join("locked").exists(),
        "another state dir's entry was removed"
    );
}

#[test]
fn a_full_repository_disk_answers_enospc_to_a_new_worktree() {
    let env = Env::new();
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&dir.path().join("disk"), "16m", 2000);
    let small = disk.path.join("small");
    run_ok(
        "git",
        &[
            "clone",
            "-q",
            env.repo.path().to_str().unwrap(),
            small.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    wtfs_ok(
        &env.state(),
        &["repo", "add", small.to_str().unwrap(), "--name", "small"],
    );
    let m = env.mount();
    let fill = disk.fill();
    let err = fs::create_dir(m.mountpoint.join("small/wt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // Nothing half-made stays in the way: with room again, the name can be used.
    fs::remove_dir_all(&fill).unwrap();
    fs::create_dir(m.mountpoint.join("small/wt")).unwrap();
    assert!(m.mountpoint.join("small/wt/README.md").exists());
    m.unmount();
}

#[test]
fn rmdir_while_another_process_holds_the_database_answers_ebusy() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "later");
    fs::create_dir(&wt).unwrap();
    let mut holder = hold_database(&env.state(), 3);
    let t = Instant::now();
    let err = fs::remove_dir(&wt).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EBUSY),
        "rmdir with the database held: {err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "rmdir waited {:?}",
        t.elapsed()
    );
    let _ = holder.wait();
    // Free again: the removal goes through.
    fs::remove_dir(&wt).unwrap();
    assert!(!wt.exists());
    m.unmount();
}

#[test]
fn mkdir_of_a_worktree_while_another_process_holds_the_database_answers_ebusy_soon() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "soon");
    let mut holder = hold_database(&env.state(), 4);
    let t = Instant::now();
    let err = fs::create_dir(&wt).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "mkdir waited {:?} for the database",
        t.elapsed()
    );
    let _ = holder.wait();
    // Nothing was left half-made: the name can be used at once.
    fs::create_dir(&wt).unwrap();
    assert!(wt.join("README.md").exists());
    m.unmount();
}

#[test]
fn a_fork_that_runs_out_of_space_half_way_leaves_nothing_and_its_parent_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&dir.path().join("state"), "64m", 20000);
    let env = Env::in_dir(dir);
    wtfs_ok(&env.state(), &["new", "repo/parent"]);
    let m = env.mount();
    let parent = m.wt("repo", "parent");
    let (ok, err) = sh(
        &parent,
        "mkdir big && for i in $(seq 1 20); do head -c 1048576 /dev/urandom > big/f$i; done && echo n > notes.txt && rm empty.txt",
    );
    assert!(ok, "{err}");
    let listing = |wt: &Path| {
        run_ok(
            "sh",
            &[
                "-c",
                "find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum",
            ],
            wt,
        )
    };
    let before = listing(&parent);
    let repo = env.repo.path();
    let refs = || git(&repo, &["for-each-ref", "--format=%(refname)"]);
    let refs_before = refs();
    // About 8 MiB and a few hundred inodes left: the copy of 20 MiB stops half-way.
    let fill = disk.fill();
    for i in 1..300 {
        let _ = fs::remove_file(fill.join(format!("i{i}")));
    }
    let big = fs::OpenOptions::new()
        .write(true)
        .open(fill.join("i0"))
        .unwrap();
    let len = big.metadata().unwrap().len();
    big.set_len(len.saturating_sub(8 << 20)).unwrap();
    drop(big);

    let out = wtfs(&env.state(), &["new", "repo/child", "--from", "parent"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the fork fit: {said}");
    assert!(
        said.contains("No space left on device") && said.contains("free some space"),
        "{said}"
    );
    assert!(
        said.contains("big/f") && said.contains("of 'repo/parent'"),
        "the fork stopped half-way through the copy: {said}"
    );
    // Nothing of it is left: no worktree, branch, git entry, staging copy or record.
    assert!(!wtfs_ok(&env.state(), &["list", "--json"]).contains("\"child\""));
    assert_eq!(refs(), refs_before);
    assert!(!repo.join(".git/worktrees/wtfs-child").exists());
    let staged: Vec<_> = fs::read_dir(env.state().join("worktrees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".new-"))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");
    let store = worktreefs::store::Store::open(&env.state()).unwrap();
    assert!(store.creations().unwrap().is_empty());
    drop(store);
    assert_eq!(listing(&parent), before, "the parent is as it was");

    // With the space back, the same fork is made, equal to its parent.
    fs::remove_dir_all(&fill).unwrap();
    wtfs_ok(&env.state(), &["new", "repo/child", "--from", "parent"]);
    assert_eq!(listing(&m.wt("repo", "child")), before);
    m.unmount();
}

#[test]
fn a_warm_snapshot_that_would_not_fit_is_refused_naming_the_sizes_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::new(&dir.path().join("state"), "16m", 4000);
    let env = Env::in_dir(dir);
    assert_eq!(env.state(), disk.path);
    let repo = env.repo.path();
    // 24 MiB of build output on a 16 MiB state disk.
    fs::create_dir_all(repo.join("target")).unwrap();
    for i in 0..3 {
        fs::write(repo.join(format!("target/big-{i}")), vec![i as u8; 8 << 20]).unwrap();
    }
    fs::write(repo.join(".worktreeinclude"), "target/\n").unwrap();
    let out = wtfs(&env.state(), &["new", "repo/w", "--warm"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs 24.0 MiB (3 files)") && err.contains("free"),
        "{err}"
    );
    let out = wtfs(&env.state(), &["warm", "repo"]);
    assert!(!out.status.success());
    // Nothing recorded, nothing made, nothing stored.
    let events = wtfs_ok(&env.state(), &["events"]);
    assert!(!events.contains("warm-snapshot"), "{events}");
    assert!(!wtfs_ok(&env.state(), &["list", "--json"]).contains("\"w\""));
    // The snapshot lock is the only thing in the snapshot directory.
    let made: Vec<_> = fs::read_dir(env.state().join("warm"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".lock")
        .collect();
    assert!(made.is_empty(), "{made:?}");
    let stored: u64 = walkdir_size(&env.state().join("blobs"));
    assert!(stored < 1 << 20, "{stored} bytes stored");
}

fn walkdir_size(dir: &Path) -> u64 {
    let mut n = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            walkdir_size(&e.path())
        } else {
            m.len()
        };
    }
    n
}
