//! File data through FUSE passthrough (the kernel reads and writes the backing file), and
//! the same behaviour through the daemon where passthrough is off.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn passthrough_opens(m: &Mounted) -> u64 {
    m.stats()["passthrough_opens"].as_u64().unwrap()
}

fn sh(dir: &Path, script: &str) -> String {
    run_ok("sh", &["-c", script], dir)
}

/// Reads, writes, appends, truncation, mmap and git through one mount; the figures must
/// match a plain checkout.
fn exercise(m: &Mounted, env: &Env, name: &str) {
    wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    let wt = m.wt("repo", name);
    let large = fs::read(env.repo.path().join("assets/large.bin")).unwrap();
    let out = Command::new("cat")
        .arg(wt.join("assets/large.bin"))
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.stdout.len(), large.len());
    assert!(out.stdout == large, "large file content differs");
    // Append to a base file (copy-up), overwrite in the middle, truncate, new file.
    sh(&wt, "echo appended >> README.md");
    assert_eq!(sh(&wt, "cat README.md"), "# test repository\nappended\n");
    sh(
        &wt,
        "printf XY | dd of=src/main.rs bs=1 seek=3 conv=notrunc status=none",
    );
    assert!(sh(&wt, "cat src/main.rs").starts_with("fn XYin()"));
    sh(&wt, "truncate -s 4 build.sh");
    assert_eq!(sh(&wt, "cat build.sh"), "#!/b");
    assert_eq!(sh(&wt, "stat -c %s build.sh").trim(), "4");
    // A file created for appending, written at an offset through another open while the
    // first is still open (both opens pass through to the inode's one backing file): the
    // appends append, the offset write lands at its offset.
    sh(
        &wt,
        "exec 3>>fresh.log; echo one >&3; printf X | dd of=fresh.log bs=1 seek=0 conv=notrunc status=none; echo two >&3; exec 3>&-",
    );
    assert_eq!(sh(&wt, "cat fresh.log"), "Xne\ntwo\n");
    // The same the other way round: created read-write (its descriptor is what the
    // daemon registers for passthrough), appended to through another open.
    sh(
        &wt,
        "exec 3<>fresh2.log; echo one >&3; echo two >> fresh2.log; printf X >&3; exec 3>&-",
    );
    assert_eq!(sh(&wt, "cat fresh2.log"), "one\nXwo\n");
    sh(&wt, "rm fresh.log fresh2.log");
    sh(&wt, "seq 1 20000 > new.txt");
    assert_eq!(sh(&wt, "wc -l < new.txt").trim(), "20000");
    // mmap: python writes through a shared mapping.
    if Command::new("python3").arg("-c").arg("1").status().is_ok() {
        sh(
            &wt,
            "python3 -c \"import mmap;f=open('new.txt','r+b');m=mmap.mmap(f.fileno(),0);m[0:1]=b'9';m.flush();m.close();f.close()\"",
        );
        assert!(sh(&wt, "head -c 1 new.txt") == "9");
    }
    // A program built in the view runs, and runs again after a rebuild.
    if Command::new("cc").arg("--version").output().is_ok() {
        sh(
            &wt,
            "printf 'int main(void) { return 7; }\\n' > prog.c && cc -o prog prog.c",
        );
        assert_eq!(sh(&wt, "./prog; echo $?"), "7\n");
        sh(
            &wt,
            "printf 'int main(void) { return 8; }\\n' > prog.c && cc -o prog prog.c",
        );
        assert_eq!(sh(&wt, "./prog; echo $?"), "8\n");
        sh(&wt, "rm -f prog prog.c");
    }
    // git sees every change, fsmonitor included.
    let status = git(&wt, &["status", "--porcelain"]);
    for want in [
        " M README.md",
        " M src/main.rs",
        " M build.sh",
        "?? new.txt",
    ] {
        assert!(status.contains(want), "missing {want}: {status}");
    }
    assert_eq!(
        status,
        git(
            &wt,
            &["-c", "core.fsmonitor=false", "status", "--porcelain"]
        )
    );
    // A file written while open, after a git query: reported at the next query.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec 3>>empty.txt; read line; echo late >&3; read line")
        .current_dir(&wt)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = git(&wt, &["status", "--porcelain"]);
    assert!(!before.contains("empty.txt"), "{before}");
    use std::io::Write;
    writeln!(stdin).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while sh(&wt, "cat empty.txt") != "late\n" {
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = git(&wt, &["status", "--porcelain"]);
    assert!(after.contains(" M empty.txt"), "{after}");
    writeln!(stdin).unwrap();
    drop(stdin);
    child.wait().unwrap();
    assert!(git(&wt, &["status", "--porcelain"]).contains(" M empty.txt"));
}

#[test]
fn passthrough_serves_file_data_and_git_sees_every_write() {
    let env = Env::new();
    let m = env.mount();
    exercise(&m, &env, "pt");
    // Where the kernel has no passthrough the daemon says so and serves everything.
    let log = m.log();
    if log.contains("FUSE passthrough: off (this kernel does not offer it)") {
        eprintln!("this kernel has no FUSE passthrough: only the fallback was exercised");
        return;
    }
    assert!(
        log.contains("FUSE passthrough: on"),
        "passthrough was neither used nor reported missing: {}",
        log.lines()
            .filter(|l| l.contains("passthrough"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(passthrough_opens(&m) > 0);

    // A base file open for reading when another process writes it (copy-up): the open
    // handle reads the new content, as on a local filesystem.
    let wt = m.wt("repo", "pt");
    let mut reader = Command::new("sh")
        .arg("-c")
        .arg("exec 3<docs/src-link/lib/util.rs; read line; cat <&3")
        .current_dir(&wt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    sh(&wt, "echo '// more' >> src/lib/util.rs");
    assert_eq!(
        sh(&wt, "cat src/lib/util.rs"),
        "pub fn one() -> u32 { 1 }\n// more\n"
    );
    {
        use std::io::Write;
        let mut stdin = reader.stdin.take().unwrap();
        writeln!(stdin).unwrap();
    }
    let out = reader.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pub fn one() -> u32 { 1 }\n// more\n"
    );
    // Once every handle is closed (the kernel sends the reader's release on its own
    // time), the copied-up file passes through again.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let before = passthrough_opens(&m);
        sh(&wt, "cat src/lib/util.rs > /dev/null");
        if passthrough_opens(&m) > before {
            break;
        }
        assert!(
            Instant::now() < end,
            "the copied-up file never passed through"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn without_passthrough_the_daemon_serves_the_same() {
    let env = Env::new();
    let m = env.mount_with(&["--linger", "600", "--no-passthrough"]);
    exercise(&m, &env, "daemon");
    assert!(m.log().contains("FUSE passthrough: off (--no-passthrough)"));
    assert_eq!(passthrough_opens(&m), 0);
    assert!(m.stats()["content_reads"].as_u64().unwrap() > 0);
}

#[test]
fn an_ioctl_is_answered_at_once_and_quietly() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/io"]);
    // The daemon's default log level, for every library.
    let m = Mounted::start_env(
        &env.state(),
        &env.mountpoint(),
        Duration::from_secs(120),
        &["--linger", "600"],
        "warn",
    );
    let wt = m.wt("repo", "io");
    // isatty() asks TCGETS of the file: "not a tty", and no log line per call.
    for _ in 0..3 {
        let out = sh(&wt, "test -t 0 < README.md && echo tty || echo notty");
        assert_eq!(out, "notty\n");
    }
    assert!(
        !m.log().contains("[Not Implemented] ioctl"),
        "every ioctl was logged as a warning: {}",
        m.log()
    );
}

fn nodes(m: &Mounted) -> u64 {
    m.stats()["nodes"].as_u64().unwrap()
}

#[test]
fn idle_worktrees_give_their_inodes_back_when_the_table_is_over_budget() {
    let env = Env::new();
    for n in ["idle", "held"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount_with(&["--linger", "600", "--cache-nodes", "20"]);
    wtfs_ok(
        &env.state(),
        &["lease", "acquire", "repo/held", "--session", "s"],
    );
    let read_all = "find . -type f -exec cat {} + > /dev/null";
    sh(&m.wt("repo", "held"), read_all);
    let held_only = nodes(&m);
    sh(&m.wt("repo", "idle"), read_all);
    let both = nodes(&m);
    assert!(both > held_only + 20, "{held_only} -> {both}");
    // The idle worktree (its reader has exited) is dropped from the kernel's caches and
    // its inodes are forgotten; the held one keeps them.
    let end = Instant::now() + Duration::from_secs(10);
    while nodes(&m) > held_only + 2 {
        assert!(
            Instant::now() < end,
            "nodes stayed at {} (held only: {held_only}, both: {both})",
            nodes(&m)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        nodes(&m) >= held_only - 2,
        "the held worktree lost its inodes"
    );
    // Nothing changed for the idle worktree's users: it reads as before.
    assert_eq!(
        sh(&m.wt("repo", "idle"), "cat README.md src/lib/util.rs"),
        "# test repository\npub fn one() -> u32 { 1 }\n"
    );
    assert_eq!(sh(&m.wt("repo", "idle"), "git status --porcelain"), "");
}

/// Reading `.control/stats` (which counts the inode table) while other requests add
/// inodes must never hang: found when the count was taken under a lock the request
/// already held, which deadlocks once a writer queues in between.
#[test]
fn stats_stay_readable_while_requests_add_inodes() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/busy"]);
    let m = Mounted::start_limited(&env.state(), &env.mountpoint(), Duration::from_secs(60));
    let wt = m.wt("repo", "busy");
    let stats = m.mountpoint.join(".control/stats");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let stats = stats.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    fs::read_to_string(&stats).expect("reading .control/stats");
                    n += 1;
                }
                n
            })
        })
        .collect();
    // New names: each lookup and create adds an inode (the table's write lock).
    let end = Instant::now() + Duration::from_secs(8);
    let mut i = 0;
    while Instant::now() < end {
        let p = wt.join(format!("new-{i}"));
        assert!(fs::metadata(&p).is_err());
        fs::write(&p, b"x").expect("creating a file while stats are read");
        i += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 100 && i > 100, "{reads} stats reads, {i} files");
    m.unmount();
}

/// Extended attributes are not supported, and the kernel is told so once (ENOSYS) rather
/// than asked again on every write: each `write(2)` checks the file's
/// `security.capability`, which would otherwise be one more round trip per write.
#[test]
fn the_kernel_stops_asking_for_extended_attributes() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/xa"]);
    let m = Mounted::start_limited(&env.state(), &env.mountpoint(), Duration::from_secs(120));
    let wt = m.wt("repo", "xa");
    for i in 0..20 {
        fs::write(wt.join(format!("new-{i}.txt")), b"x").unwrap();
        fs::write(wt.join("README.md"), format!("edit {i}\n")).unwrap();
    }
    let path = std::ffi::CString::new(wt.join("README.md").as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new("user.test").unwrap();
    for _ in 0..2 {
        // SAFETY: valid strings; a null buffer of size 0 asks for the size.
        let get = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        assert_eq!(get, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        // SAFETY: as above.
        let set =
            unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
        assert_eq!(set, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }
    // Asked once for reading (by the first write, or the first getxattr) and once for
    // writing; declined with ENOTSUP, the loop above alone would ask four times, and each
    // write (its truncate drops privileges) once more.
    let asked = m.stats()["xattr_requests"].as_u64().unwrap();
    assert!(
        asked <= 2,
        "the daemon was asked for extended attributes {asked} times (once per kind at most)"
    );
    assert_eq!(sh(&wt, "cat new-3.txt README.md"), "xedit 19\n");
}
