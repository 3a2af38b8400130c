//! A filesystem you can trust: every operation reaches the file a node is, not
//! whatever holds its name now. Mounted, with a real repository; each test bounded by the
//! mount's watchdog and unmounted by its guard.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

/// The test's directories, which nobody must be able to walk through to the mount.
/// (The mount must be made with `--allow-other` too: it is private to root otherwise.)
fn open_to_others(env: &Env) {
    fs::set_permissions(env.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
}

/// A root-owned directory outside the mount, with a file in it, as an attacker would aim
/// at: returns its path and a fingerprint (mode, owner, mtime, entries, content).
fn target(env: &Env) -> (std::path::PathBuf, impl Fn() -> String) {
    let t = env.dir.path().join("root-owned");
    fs::create_dir(&t).unwrap();
    fs::write(t.join("secret"), b"root's file\n").unwrap();
    fs::set_permissions(t.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&t, fs::Permissions::from_mode(0o700)).unwrap();
    let p = t.clone();
    let print = move || {
        let m = fs::symlink_metadata(&p).unwrap();
        let f = fs::symlink_metadata(p.join("secret")).unwrap();
        let mut names: Vec<_> = fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        format!(
            "dir {:o} {}:{} mtime {}.{} entries {names:?}; secret {:o} {}:{} size {} mtime {}.{} {:?}",
            m.mode(),
            m.uid(),
            m.gid(),
            m.mtime(),
            m.mtime_nsec(),
            f.mode(),
            f.uid(),
            f.gid(),
            f.len(),
            f.mtime(),
            f.mtime_nsec(),
            fs::read(p.join("secret")).unwrap()
        )
    };
    (t, print)
}

/// Through a descriptor whose name now holds a symlink to a root-owned directory, an
/// unprivileged user changes nothing outside the mount: not the directory's mode, owner,
/// times or entries, not the file in it. Each attack is tried on a directory and on a file
/// in it, new ones (in the upper layer) and committed ones (in the base).
#[test]
fn a_stale_descriptor_never_reaches_outside_the_upper_layer() {
    let env = Env::new();
    open_to_others(&env);
    let (t, print) = target(&env);
    let before = print();
    let m = env.mount_with(&["--linger", "600", "--allow-other"]);
    let wt = m.wt("repo", "attack");
    fs::create_dir(&wt).unwrap();
    std::os::unix::fs::chown(&wt, Some(NOBODY), Some(NOBODY)).unwrap();
    let t = t.display();
    // Each: a setup leaving descriptor 3 open on something that is then removed and
    // replaced by a symlink to the target, then the attack through /proc/self/fd/3 (the
    // kernel's own inode of the descriptor, as fchmod and friends reach it).
    let setups = [
        // A new directory.
        format!("mkdir d && exec 3<d && rmdir d && ln -s {t} d"),
        // A new file in a new directory.
        format!("mkdir e && echo x > e/secret && exec 3<e/secret && rm -r e && ln -s {t} e"),
        // A committed directory, and a committed file in one, after rm -rf.
        format!("exec 3<src/lib && rm -rf src/lib && ln -s {t} src/lib"),
        format!("exec 3<src/lib/util.rs && rm -rf src/lib && ln -s {t} src/lib"),
    ];
    let attacks = [
        "chmod 777 /proc/self/fd/3",
        "touch -d 2001-01-01 /proc/self/fd/3",
        "chown nobody /proc/self/fd/3",
        ": > /proc/self/fd/3",
        "echo owned >> /proc/self/fd/3",
        "cat /proc/self/fd/3 > /dev/null",
        "ls /proc/self/fd/3/ > /dev/null",
        "touch /proc/self/fd/3/new",
        "mkdir /proc/self/fd/3/newdir",
        "ln -s x /proc/self/fd/3/newlink",
        "mv /proc/self/fd/3/secret /proc/self/fd/3/moved",
        "rm -f /proc/self/fd/3/secret",
    ];
    for (i, setup) in setups.iter().enumerate() {
        for attack in attacks {
            // A fresh copy of the setup's names for each attack.
            let reset = "rm -rf d e; git checkout -q -- src 2>/dev/null; true";
            let out = as_nobody(&wt, &format!("{reset}; {setup} && {attack}"));
            let after = print();
            assert_eq!(
                after,
                before,
                "setup {i} ({setup}), attack {attack}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // Nothing appeared outside the worktree's upper layer: the state directory holds no
    // file named like the attack's.
    let strays: Vec<_> = walk_names(&env.state())
        .into_iter()
        .filter(|p| {
            ["new", "newdir", "newlink", "moved"]
                .iter()
                .any(|n| p.rsplit('/').next() == Some(n))
        })
        .filter(|p| !p.contains("/upper/"))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
    m.unmount();
}

fn walk_names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p.clone());
            }
            out.push(p.display().to_string());
        }
    }
    out
}

/// An open file whose name is gone (unlinked, or renamed over) works as on ext4: fstat
/// says nlink 0, and ftruncate, fchmod, fchown, futimens, fallocate, reads and writes all
/// reach it. For a committed file (in the base), a new one, and one renamed over.
#[test]
fn an_open_file_whose_name_is_gone_stays_usable() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "gone");
    fs::create_dir(&wt).unwrap();
    fs::write(wt.join("new.txt"), b"new file\n").unwrap();
    fs::write(wt.join("over.txt"), b"to be renamed over\n").unwrap();
    fs::write(wt.join("other.txt"), b"the replacement\n").unwrap();
    type Case<'a> = (&'a str, &'a [u8], Box<dyn Fn() + 'a>);
    let cases: [Case; 3] = [
        (
            "README.md",
            b"# test repository\n",
            Box::new(|| fs::remove_file(wt.join("README.md")).unwrap()),
        ),
        (
            "new.txt",
            b"new file\n",
            Box::new(|| fs::remove_file(wt.join("new.txt")).unwrap()),
        ),
        (
            "over.txt",
            b"to be renamed over\n",
            Box::new(|| fs::rename(wt.join("other.txt"), wt.join("over.txt")).unwrap()),
        ),
    ];
    for (name, content, remove) in cases {
        let mut ro = fs::File::open(wt.join(name)).unwrap();
        let mut rw = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(wt.join(name))
            .unwrap();
        remove();
        let meta = ro
            .metadata()
            .unwrap_or_else(|e| panic!("{name}: fstat: {e}"));
        assert_eq!(meta.nlink(), 0, "{name}");
        assert_eq!(meta.len(), content.len() as u64, "{name}");
        let mut read = Vec::new();
        ro.read_to_end(&mut read).unwrap();
        assert_eq!(read, content, "{name}");

        rw.set_permissions(fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{name}: fchmod: {e}"));
        std::os::unix::fs::fchown(&rw, Some(1), Some(1))
            .unwrap_or_else(|e| panic!("{name}: fchown: {e}"));
        rw.set_len(4)
            .unwrap_or_else(|e| panic!("{name}: ftruncate: {e}"));
        // SAFETY: posix_fallocate on a descriptor this File owns.
        let r = unsafe { libc::posix_fallocate(rw.as_raw_fd(), 0, 8192) };
        assert_eq!(
            r,
            0,
            "{name}: posix_fallocate: {}",
            std::io::Error::from_raw_os_error(r)
        );
        rw.seek(SeekFrom::Start(0)).unwrap();
        rw.write_all(b"WXYZ").unwrap();
        // Last: the writes above change the time too.
        let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        rw.set_modified(when)
            .unwrap_or_else(|e| panic!("{name}: futimens: {e}"));
        let meta = rw.metadata().unwrap();
        assert_eq!(
            (
                meta.nlink(),
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid(),
                meta.mtime()
            ),
            (0, 0o600, 1, 1, 1_000_000_000),
            "{name}"
        );
        assert_eq!(meta.len(), 8192, "{name}");
        let mut fresh = fs::File::open(format!("/proc/self/fd/{}", rw.as_raw_fd())).unwrap();
        let mut head = [0u8; 4];
        fresh.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"WXYZ", "{name}");
        let kept = m.stats()["removed_files_kept_open"].as_u64().unwrap();
        assert!(kept >= 1, "{name}: {kept} kept open");
        drop((ro, rw, fresh));
    }
    // Closed, the removed files are forgotten by the kernel, and let go by the daemon.
    let end = Instant::now() + Duration::from_secs(10);
    while m.stats()["removed_files_kept_open"].as_u64().unwrap() != 0 {
        assert!(Instant::now() < end, "{}", m.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The replacement kept its own content; the removed names stay removed.
    assert_eq!(fs::read(wt.join("over.txt")).unwrap(), b"the replacement\n");
    assert!(!wt.join("README.md").exists() && !wt.join("new.txt").exists());
    m.unmount();
}

/// A content with its own checksum in front: readers tell a whole file from a torn one.
fn framed(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let body: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let mut out = fnv(&body).to_le_bytes().to_vec();
    out.extend_from_slice(&(len as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

fn whole(data: &[u8]) -> bool {
    data.len() >= 16
        && u64::from_le_bytes(data[8..16].try_into().unwrap()) as usize == data.len() - 16
        && u64::from_le_bytes(data[..8].try_into().unwrap()) == fnv(&data[16..])
}

/// Three writers replace three files atomically (write a temporary file, fsync, rename it
/// over) while three readers open and read them: every open succeeds and every read is a
/// whole file, with passthrough on and off.
fn atomic_replace(extra: &[&str]) {
    let env = Env::new();
    let m = env.mount_with(extra);
    let wt = m.wt("repo", "replace");
    fs::create_dir(&wt).unwrap();
    let targets: Vec<_> = (0..3).map(|i| wt.join(format!("target{i}"))).collect();
    for (i, t) in targets.iter().enumerate() {
        fs::write(t, framed(i as u64, 1000)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let mut threads = Vec::new();
    for w in 0..3u64 {
        let (wt, targets, stop) = (wt.clone(), targets.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let tmp = wt.join(format!(".tmp-{w}-{n}"));
                let len = 1 + ((w * 7919 + n * 104_729) % 200_000) as usize;
                let mut f = fs::File::create(&tmp).unwrap();
                f.write_all(&framed(w << 32 | n, len)).unwrap();
                f.sync_all().unwrap();
                drop(f);
                fs::rename(&tmp, &targets[(n % 3) as usize]).unwrap();
            }
        }));
    }
    for r in 0..3usize {
        let (targets, stop) = (targets.clone(), stop.clone());
        let (reads, bad, errors) = (reads.clone(), bad.clone(), errors.clone());
        threads.push(std::thread::spawn(move || {
            let mut k = r;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let t = &targets[k % 3];
                let got = fs::File::open(t).and_then(|mut f| {
                    let mut v = Vec::new();
                    f.read_to_end(&mut v).map(|_| v)
                });
                reads.fetch_add(1, Ordering::Relaxed);
                let problem = match got {
                    Ok(v) if whole(&v) => continue,
                    Ok(v) => format!("{}: a torn read of {} bytes", t.display(), v.len()),
                    Err(e) => format!("{}: {e}", t.display()),
                };
                bad.fetch_add(1, Ordering::Relaxed);
                let mut e = errors.lock();
                if e.len() < 10 {
                    e.push(problem);
                }
            }
        }));
    }
    let end = Instant::now() + Duration::from_secs(6);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let (reads, bad) = (reads.load(Ordering::Relaxed), bad.load(Ordering::Relaxed));
    assert!(reads > 100, "only {reads} reads");
    assert_eq!(bad, 0, "{bad} of {reads} reads failed: {:?}", errors.lock());
    let log = m.log();
    assert!(
        !log.contains("another backing file"),
        "{}",
        log.lines()
            .filter(|l| l.contains("another backing"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    m.unmount();
}

#[test]
fn atomic_replace_under_concurrency_serves_whole_files_with_passthrough() {
    atomic_replace(&["--linger", "600"]);
}

#[test]
fn atomic_replace_under_concurrency_serves_whole_files_without_passthrough() {
    atomic_replace(&["--linger", "600", "--no-passthrough"]);
}

/// Runs the Perl program `script` as nobody with umask `umask` (its system calls made
/// exactly as a user's program makes them: Perl is in every Debian, `perl-base`).
fn perl_as_nobody(umask: u32, script: &str) {
    let out = as_nobody(
        Path::new("/"),
        &format!("umask {umask:03o} && exec perl -MPOSIX -MFcntl -e '{script}'"),
    );
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn c(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn sys(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Modes and owners of new entries are the ones ext4 gives: the caller's umask (the
/// kernel's, never the daemon's), set-id bits as asked, a set-group-id directory's group
/// and bit passed on, access mode 3 opened, and chown(f, -1, -1) moving the change time.
#[test]
fn modes_and_owners_are_the_ones_ext4_gives() {
    let env = Env::new();
    open_to_others(&env);
    let m = env.mount_with(&["--linger", "600", "--allow-other"]);
    let wt = m.wt("repo", "modes");
    fs::create_dir(&wt).unwrap();
    std::os::unix::fs::chown(&wt, Some(NOBODY), Some(NOBODY)).unwrap();
    let plain = Path::new(env.dir.path()).join("plain");
    fs::create_dir(&plain).unwrap();
    std::os::unix::fs::chown(&plain, Some(NOBODY), Some(NOBODY)).unwrap();
    // A set-group-id directory of a group nobody is not in.
    let mut modes = Vec::new();
    for dir in [wt.clone(), plain.clone()] {
        let sg = dir.join("sg");
        fs::create_dir(&sg).unwrap();
        std::os::unix::fs::chown(&sg, Some(NOBODY), Some(4242)).unwrap();
        fs::set_permissions(&sg, fs::Permissions::from_mode(0o2777)).unwrap();
        let d = dir.display();
        let create = |name: &str, mode: u32| {
            format!("sysopen(my $f, \"{d}/{name}\", O_CREAT|O_WRONLY, {mode:#o}) or die \"{name}: $!\";")
        };
        let mkdir = |name: &str, mode: u32| {
            format!("mkdir(\"{d}/{name}\", {mode:#o}) or die \"{name}: $!\";")
        };
        perl_as_nobody(
            0,
            &[
                create("f0", 0o666),
                mkdir("dn", 0o777),
                format!("mkfifo(\"{d}/p0\", 0666) or die \"p0: $!\";"),
                create("s0", 0o6777),
                mkdir("t0", 0o1777),
                create("sg/f", 0o644),
                mkdir("sg/d", 0o755),
                create("sg/s", 0o2755),
            ]
            .concat(),
        );
        perl_as_nobody(0o002, &create("f2", 0o666));
        let got: Vec<String> = ["f0", "dn", "p0", "s0", "t0", "f2", "sg/f", "sg/d", "sg/s"]
            .iter()
            .map(|n| {
                let m = fs::symlink_metadata(dir.join(n)).unwrap();
                format!("{n} {:o} {}:{}", m.mode(), m.uid(), m.gid())
            })
            .collect();
        modes.push(got);
    }
    assert_eq!(modes[0], modes[1], "the view, then ext4");

    // Access mode 3 opens (for neither reads nor writes), as on ext4.
    for f in [wt.join("README.md"), plain.join("f0")] {
        let fd = unsafe { libc::open(c(&f).as_ptr(), libc::O_WRONLY | libc::O_RDWR) };
        assert!(
            fd >= 0,
            "{}: {}",
            f.display(),
            std::io::Error::last_os_error()
        );
        let mut b = [0u8; 1];
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        assert_eq!(
            (n, std::io::Error::last_os_error().raw_os_error()),
            (-1, Some(libc::EBADF))
        );
        unsafe { libc::close(fd) };
    }

    // chown(f, -1, -1) changes nothing but the change time: of a committed file and a
    // new one.
    for f in [wt.join("build.sh"), wt.join("f0")] {
        let before = fs::symlink_metadata(&f).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        sys(unsafe { libc::chown(c(&f).as_ptr(), u32::MAX, u32::MAX) }).unwrap();
        let after = fs::symlink_metadata(&f).unwrap();
        assert!(
            (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
            "{}",
            f.display()
        );
        assert_eq!(
            (after.mode(), after.uid(), after.gid()),
            (before.mode(), before.uid(), before.gid())
        );
    }
    m.unmount();
}

/// Names of 255 bytes work everywhere (a whiteout spends none of them), 256 answer
/// ENAMETOOLONG from every operation, a lookup included, and statfs says 255; paths work
/// to PATH_MAX relative to the worktree and deeper by `cd`.
#[test]
fn long_names_and_deep_paths_work_as_on_ext4() {
    let env = Env::new();
    let long = "n".repeat(255);
    let repo = env.repo.path();
    fs::write(repo.join(&long), b"a committed file with a long name\n").unwrap();
    fs::create_dir(repo.join(format!("{}d", "n".repeat(254)))).unwrap();
    fs::write(repo.join(format!("{}d/f", "n".repeat(254))), b"below\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "long names"]);
    let m = env.mount();
    let wt = m.wt("repo", "long");
    fs::create_dir(&wt).unwrap();
    let long_dir = format!("{}d", "n".repeat(254));
    // Committed long names read, and go (each leaves a whiteout at its own name).
    assert_eq!(
        fs::read(wt.join(&long)).unwrap(),
        b"a committed file with a long name\n"
    );
    fs::remove_file(wt.join(&long)).unwrap();
    fs::remove_dir_all(wt.join(&long_dir)).unwrap();
    assert!(!wt.join(&long).exists() && !wt.join(&long_dir).exists());
    // New long names, over those whiteouts too.
    fs::write(wt.join(&long), b"new").unwrap();
    fs::create_dir(wt.join(&long_dir)).unwrap();
    assert!(
        fs::read_dir(wt.join(&long_dir)).unwrap().next().is_none(),
        "opaque"
    );
    let other = "o".repeat(255);
    fs::rename(wt.join(&long), wt.join(&other)).unwrap();
    fs::hard_link(wt.join(&other), wt.join(&long)).unwrap();
    std::os::unix::fs::symlink(&other, wt.join(format!("{}s", "n".repeat(254)))).unwrap();
    let status = porcelain(&wt);
    assert!(status.contains(&format!("?? {other}")), "{status}");

    // 256 bytes: ENAMETOOLONG from each.
    let too = wt.join("x".repeat(256));
    let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    let enametoolong = Some(libc::ENAMETOOLONG);
    assert_eq!(
        errno(fs::symlink_metadata(&too).map(|_| ())),
        enametoolong,
        "lookup"
    );
    assert_eq!(errno(fs::write(&too, b"")), enametoolong, "create");
    assert_eq!(errno(fs::create_dir(&too)), enametoolong, "mkdir");
    assert_eq!(
        errno(fs::rename(wt.join(&other), &too)),
        enametoolong,
        "rename"
    );
    assert_eq!(
        errno(fs::hard_link(wt.join(&other), &too)),
        enametoolong,
        "link"
    );
    assert_eq!(
        errno(std::os::unix::fs::symlink("x", &too)),
        enametoolong,
        "symlink"
    );
    assert_eq!(errno(fs::remove_file(&too)), enametoolong, "unlink");
    let sfs = nix::sys::statfs::statfs(&wt).unwrap();
    assert_eq!(sfs.maximum_name_length(), 255);

    // A relative path of PATH_MAX - 1 bytes, and 30 levels of 200-byte names by cd.
    let part = "p".repeat(250);
    let mut rel = String::new();
    while rel.len() + part.len() + 1 < 4095 - 10 {
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(&part);
    }
    let file = format!("{rel}/{}", "f".repeat(4095 - rel.len() - 1));
    assert_eq!(file.len(), 4095);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "mkdir -p {rel} && echo deep > {file} && cat {file} && \
             perl -e '$d = \"d\" x 200; for (1..30) {{ mkdir $d or die \"mkdir $_: $!\"; \
             chdir $d or die \"chdir $_: $!\" }} open(F, \">f\") or die; print F \"deeper\\n\"; \
             close F; open(F, \"f\") or die; print <F>'"
        ))
        .current_dir(&wt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "deep\ndeeper\n");
    m.unmount();
}

/// An upper layer written in format 1 (whiteouts as `.wtfs-wh.N` files) is rewritten at
/// mount: what was removed stays removed, git sees the same, and no old name is left.
#[test]
fn a_format_1_upper_layer_is_rewritten_at_mount() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/old"]);
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let row = store
        .worktrees()
        .unwrap()
        .into_iter()
        .find(|w| w.name == "old")
        .unwrap();
    let (upper, work) = (state.upper(row.id), state.work(row.id));
    fs::create_dir_all(upper.join("src")).unwrap();
    fs::create_dir_all(&work).unwrap();
    // Format 1: README.md and src/main.rs removed; src/ in the upper layer.
    fs::write(upper.join(".wtfs-wh.README.md"), b"").unwrap();
    fs::write(upper.join("src/.wtfs-wh.main.rs"), b"").unwrap();
    let _ = fs::remove_file(work.join("format-2"));
    let m = env.mount();
    let wt = m.wt("repo", "old");
    assert!(!wt.join("README.md").exists() && !wt.join("src/main.rs").exists());
    assert!(wt.join("src/lib/util.rs").exists());
    let status = porcelain(&wt);
    assert!(
        status.contains(" D README.md") && status.contains(" D src/main.rs"),
        "{status}"
    );
    let left: Vec<_> = walk_names(&upper)
        .into_iter()
        .filter(|p| p.contains(".wtfs-wh."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(work.join("format-2").exists());
    assert!(m.log().contains("format 2"), "{}", m.log());
    m.unmount();
}

fn porcelain(dir: &Path) -> String {
    git(dir, &["status", "--porcelain", "--untracked-files=all"])
}

/// Cleanup inspects what a user put in the upper layer without trusting it: a FIFO named
/// `.gitignore` is not opened (which would block the inspection, and with it every
/// removal, for good), and the worktree is kept for what it holds.
#[test]
fn a_fifo_named_gitignore_does_not_block_cleanup() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/fifo"]);
    let m = env.mount();
    let wt = m.wt("repo", "fifo");
    // From a process of its own, whose lease ends with it (this one's would not).
    run_ok("sh", &["-c", "mkfifo src/.gitignore"], &wt);
    let end = Instant::now() + Duration::from_secs(10);
    while state_of(&env, "fifo") != "lingering" {
        assert!(Instant::now() < end, "{}", state_of(&env, "fifo"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = reclaim_kept(&env, "repo/fifo", Duration::from_secs(30));
    assert!(said.contains("src/.gitignore"), "{said}");
    assert!(wt.join("README.md").exists(), "kept: {said}");
    m.unmount();
}

/// A user owns its repository, and with it git's entry of the worktree there: its index
/// and HEAD may be made anything. Cleanup reads them without following a symlink (which
/// would have root read a file the user chose) and without blocking on a FIFO (which
/// would hold the inspection, and every removal after it, for good); the worktree is kept
/// with a reason naming the file.
#[test]
fn a_fifo_or_a_symlink_in_gits_worktree_entry_does_not_block_or_steer_cleanup() {
    let env = Env::new();
    let elsewhere = env.dir.path().join("elsewhere-index");
    for name in ["fifo-index", "link-index", "fifo-head"] {
        wtfs_ok(&env.state(), &["new", &format!("repo/{name}")]);
    }
    let m = env.mount();
    for name in ["fifo-index", "link-index", "fifo-head"] {
        // Used (a lease of its own process, ended with it), then left.
        run_ok(
            "sh",
            &["-c", "cat README.md >/dev/null"],
            &m.wt("repo", name),
        );
        wait_for_state(&env, name, "lingering", Duration::from_secs(10));
    }
    let admin = |name: &str| {
        env.repo
            .path()
            .join(".git/worktrees")
            .join(format!("wtfs-{name}"))
    };
    fs::copy(admin("link-index").join("index"), &elsewhere).unwrap();
    fs::remove_file(admin("fifo-index").join("index")).unwrap();
    run_ok(
        "mkfifo",
        &[admin("fifo-index").join("index").to_str().unwrap()],
        Path::new("/"),
    );
    fs::remove_file(admin("link-index").join("index")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, admin("link-index").join("index")).unwrap();
    fs::remove_file(admin("fifo-head").join("HEAD")).unwrap();
    run_ok(
        "mkfifo",
        &[admin("fifo-head").join("HEAD").to_str().unwrap()],
        Path::new("/"),
    );
    for (name, file) in [
        ("fifo-index", "index"),
        ("link-index", "index"),
        ("fifo-head", "HEAD"),
    ] {
        let said = reclaim_kept(&env, &format!("repo/{name}"), Duration::from_secs(30));
        let path = admin(name).join(file);
        assert!(said.contains(&path.display().to_string()), "{name}: {said}");
        assert!(said.contains("not a regular file"), "{name}: {said}");
        assert!(m.wt("repo", name).join("README.md").exists(), "{name} kept");
    }
    m.unmount();
}

/// At mount, every worktree's git entry is pointed at where the mount is: its `gitdir`
/// file, which the repository's owner may have made a symlink to a file of root's, is
/// never written through; and a FIFO there does not hold the mount. An entry whose
/// `gitdir` is not a file cannot be told to be this worktree's (it names the worktree it
/// belongs to): it is left as it is, saying so, and git there still works.
#[test]
fn pointing_gits_entry_at_the_mount_never_writes_through_a_symlink() {
    let env = Env::new();
    let (aim, print) = target(&env);
    let before = print();
    wtfs_ok(&env.state(), &["new", "repo/linked"]);
    wtfs_ok(&env.state(), &["new", "repo/fifo"]);
    let admin = |name: &str| {
        env.repo
            .path()
            .join(".git/worktrees")
            .join(format!("wtfs-{name}"))
    };
    let gitdir = admin("linked").join("gitdir");
    fs::remove_file(&gitdir).unwrap();
    std::os::unix::fs::symlink(aim.join("secret"), &gitdir).unwrap();
    let fifo = admin("fifo").join("gitdir");
    fs::remove_file(&fifo).unwrap();
    run_ok("mkfifo", &[fifo.to_str().unwrap()], Path::new("/"));
    let m = env.mount();
    assert_eq!(
        print(),
        before,
        "root's file was written through the symlink"
    );
    assert!(fs::symlink_metadata(&gitdir).unwrap().is_symlink());
    assert!(m.log().contains("its gitdir cannot be read"), "{}", m.log());
    let st = run("git", &["status", "--porcelain"], &m.wt("repo", "linked"));
    assert!(st.status.success(), "{st:?}");
    // Made a file again, as the message says, it is pointed at the mount the next time.
    fs::remove_file(&gitdir).unwrap();
    fs::remove_file(&fifo).unwrap();
    let wt = m.wt("repo", "linked");
    run_ok("git", &["worktree", "repair"], &wt);
    assert_eq!(
        fs::read_to_string(&gitdir).unwrap(),
        format!("{}\n", wt.join(".git").display())
    );
    assert_eq!(
        print(),
        before,
        "root's file was written through the symlink"
    );
    m.unmount();
}

/// git's entry of a new worktree is made in the repository's `worktrees/` directory,
/// which its owner may have made a symlink to a directory of root's: it is not followed
/// (root would make a directory there and give it, and files in it, to the user); the
/// creation is refused with the way out and leaves nothing behind.
#[test]
fn a_symlinked_worktrees_directory_is_not_followed() {
    let env = Env::new();
    let (aim, print) = target(&env);
    let before = print();
    let worktrees = env.repo.path().join(".git/worktrees");
    let _ = fs::remove_dir_all(&worktrees);
    std::os::unix::fs::symlink(&aim, &worktrees).unwrap();
    let out = wtfs(&env.state(), &["new", "repo/aimed"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&worktrees.display().to_string()), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(print(), before, "root's directory was written in");
    assert_eq!(state_of(&env, "aimed"), "removed", "nothing half-made");
    // Put back as git makes it, the same name is made.
    fs::remove_file(&worktrees).unwrap();
    wtfs_ok(&env.state(), &["new", "repo/aimed"]);
    let m = env.mount();
    let st = run("git", &["status", "--porcelain"], &m.wt("repo", "aimed"));
    assert!(st.status.success(), "{st:?}");
    m.unmount();
}

/// worktreefs's fsmonitor hook and its config live in the repository's git directory
/// (`.git/worktreefs/`), which its owner may have made anything: at mount they are
/// replaced, never written through (a symlink to a file of root's stays untouched; root
/// truncated it and wrote the hook there, then made it mode 0755), and a FIFO there does
/// not hold the mount.
#[test]
fn the_fsmonitor_hook_is_installed_through_no_symlink() {
    let env = Env::new();
    let (aim, print) = target(&env);
    wtfs_ok(&env.state(), &["new", "repo/hooked"]);
    env.mount().unmount();
    let dir = env.repo.path().join(".git/worktreefs");
    let hook = dir.join("fsmonitor-hook");
    assert!(
        fs::symlink_metadata(&hook).unwrap().is_file(),
        "installed at mount"
    );
    let before = print();
    fs::remove_file(&hook).unwrap();
    std::os::unix::fs::symlink(aim.join("secret"), &hook).unwrap();
    std::os::unix::fs::symlink(aim.join("secret"), dir.join(".fsmonitor-hook.tmp")).unwrap();
    fs::remove_file(dir.join("config")).unwrap();
    run_ok(
        "mkfifo",
        &[dir.join("config").to_str().unwrap()],
        Path::new("/"),
    );
    let m = env.mount();
    assert_eq!(print(), before, "root's file was written through a symlink");
    for f in [&hook, &dir.join("config")] {
        assert!(
            fs::symlink_metadata(f).unwrap().is_file(),
            "{}",
            f.display()
        );
    }
    assert_eq!(
        fs::metadata(&hook).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // git there asks the hook again.
    let st = run("git", &["status", "--porcelain"], &m.wt("repo", "hooked"));
    assert!(st.status.success(), "{st:?}");
    assert_eq!(String::from_utf8_lossy(&st.stdout), "");
    m.unmount();
}

/// The repository's config gets the include line that enables the hook: written as the
/// repository's owner, so a config that is a symlink to a file of root's is not written
/// through (libgit2's lock file and rename follow the link: as root, the file it named
/// was replaced).
#[test]
fn the_repository_config_is_written_as_its_owner() {
    let env = Env::new();
    open_to_others(&env);
    let (aim, print) = target(&env);
    let config = env.repo.path().join(".git/config");
    // A config without the include line (the registration added one to the real one).
    fs::write(
        aim.join("config"),
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n",
    )
    .unwrap();
    fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink(aim.join("config"), &config).unwrap();
    run_ok(
        "chown",
        &[
            "-R",
            "-h",
            &format!("{NOBODY}:{NOBODY}"),
            env.repo.path().to_str().unwrap(),
        ],
        Path::new("/"),
    );
    let before = print();
    let config_before = fs::read(aim.join("config")).unwrap();
    let m = env.mount();
    assert_eq!(print(), before, "root's directory was written in");
    assert_eq!(fs::read(aim.join("config")).unwrap(), config_before);
    assert!(fs::symlink_metadata(&config)
        .unwrap()
        .file_type()
        .is_symlink());
    m.unmount();
}

/// The same at `repo remove` (the include line taken out), run by a root whose
/// supplementary groups include one that may write a file the config links to: the
/// owner's identity does not keep root's groups (the thread that writes as the owner
/// had them).
#[test]
fn the_repository_config_is_written_without_roots_groups() {
    let env = Env::new();
    open_to_others(&env);
    let (aim, _) = target(&env);
    // The config as the registration left it (with the include line), moved into a
    // directory of root's that root's group 0 may write, and linked to.
    let config = env.repo.path().join(".git/config");
    fs::copy(&config, aim.join("config")).unwrap();
    fs::set_permissions(aim.join("config"), fs::Permissions::from_mode(0o660)).unwrap();
    fs::set_permissions(&aim, fs::Permissions::from_mode(0o770)).unwrap();
    fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink(aim.join("config"), &config).unwrap();
    run_ok(
        "chown",
        &[
            "-R",
            "-h",
            &format!("{NOBODY}:{NOBODY}"),
            env.repo.path().to_str().unwrap(),
        ],
        Path::new("/"),
    );
    let config_before = fs::read(aim.join("config")).unwrap();
    let out = {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(BIN);
        cmd.args([
            "--state-dir",
            env.state().to_str().unwrap(),
            "repo",
            "remove",
            "repo",
        ]);
        // SAFETY: setgroups is async-signal-safe; nothing else runs here.
        unsafe {
            cmd.pre_exec(|| {
                let groups = [0 as libc::gid_t];
                if libc::setgroups(1, groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.output().unwrap()
    };
    assert_eq!(
        fs::read(aim.join("config")).unwrap(),
        config_before,
        "root's group's file was written: {out:?}"
    );
}

/// The registered git directory replaced by a symlink to another user's repository (its
/// owner can do that to their own `.git`): the mount writes nothing there, neither the
/// hook's files (as root) nor the include line in its config (as that repository's
/// owner, found through the link).
#[test]
fn a_git_directory_replaced_by_a_symlink_is_not_written_through() {
    let env = Env::new();
    let theirs = TestRepo::new();
    let their_git = theirs.path().join(".git");
    let config_before = fs::read(their_git.join("config")).unwrap();
    let git_dir = env.repo.path().join(".git");
    fs::rename(&git_dir, env.repo.path().join("git-away")).unwrap();
    std::os::unix::fs::symlink(&their_git, &git_dir).unwrap();
    let m = env.mount();
    assert_eq!(
        fs::read(their_git.join("config")).unwrap(),
        config_before,
        "the other repository's config was written"
    );
    assert!(
        !their_git.join("worktreefs").exists(),
        "root wrote in the other repository"
    );
    assert!(
        m.log()
            .contains("cannot be reached through no symbolic link"),
        "{}",
        m.log()
    );
    m.unmount();
}

/// A removal parks git's entry in `.git/worktreefs/removing/` before deleting it: made a
/// symlink to a directory of root's, it is not followed (root moved the user's entry
/// into that directory and deleted it there); the worktree is kept with the reason.
#[test]
fn a_removal_parks_gits_entry_through_no_symlink() {
    let env = Env::new();
    let (aim, print) = target(&env);
    wtfs_ok(&env.state(), &["new", "repo/parked"]);
    let m = env.mount();
    let dir = env.repo.path().join(".git/worktreefs");
    fs::create_dir_all(&dir).unwrap();
    let _ = fs::remove_dir_all(dir.join("removing"));
    std::os::unix::fs::symlink(&aim, dir.join("removing")).unwrap();
    let before = print();
    let said = reclaim_kept(&env, "repo/parked", Duration::from_secs(30));
    assert!(said.contains("removing"), "{said}");
    assert_eq!(print(), before, "root's directory was written in");
    assert!(env
        .repo
        .path()
        .join(".git/worktrees/wtfs-parked/locked")
        .is_file());
    run_ok("test", &["-f", "README.md"], &m.wt("repo", "parked"));
    m.unmount();
}

/// The parking directory is the daemon's: one the repository's owner made (or renamed
/// into its place) could hold anything, another user's entry among them, under the name
/// a removal deletes. It is refused, and what is in it stays.
#[test]
fn a_parking_directory_the_repositorys_owner_made_is_refused() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/parked"]);
    let state = worktreefs::state::StateDir::open(&env.state()).unwrap();
    let store = worktreefs::store::Store::open(&state.root).unwrap();
    let id = store.worktree("repo", "parked").unwrap().unwrap().id;
    let m = env.mount();
    let removing = env.repo.path().join(".git/worktreefs/removing");
    let planted = removing.join(format!("{id}-wtfs-parked"));
    fs::create_dir_all(&planted).unwrap();
    fs::write(planted.join("HEAD"), b"theirs\n").unwrap();
    run_ok(
        "chown",
        &["-R", "nobody", removing.to_str().unwrap()],
        Path::new("/"),
    );
    let said = reclaim_kept(&env, "repo/parked", Duration::from_secs(30));
    assert!(said.contains("not worktreefs's own"), "{said}");
    assert_eq!(fs::read(planted.join("HEAD")).unwrap(), b"theirs\n");
    assert!(env
        .repo
        .path()
        .join(".git/worktrees/wtfs-parked/locked")
        .is_file());
    run_ok("test", &["-f", "README.md"], &m.wt("repo", "parked"));
    m.unmount();
}

/// A removal takes only its own worktree's git entry: one renamed into its entry's name
/// (another worktree's, as a repository's owner can rename any entry in `worktrees/`)
/// is refused, and stays; the worktree is kept with the reason. (Inspection sees the
/// other's HEAD and keeps it; `--discard`, which removes whatever inspection finds, is
/// where only the entry's own check stands, as for a swap made after inspection.)
#[test]
fn a_removal_takes_only_its_own_worktrees_entry() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/mine"]);
    wtfs_ok(&env.state(), &["new", "repo/theirs"]);
    let m = env.mount();
    let worktrees = env.repo.path().join(".git/worktrees");
    fs::rename(worktrees.join("wtfs-mine"), worktrees.join("mine-away")).unwrap();
    fs::rename(worktrees.join("wtfs-theirs"), worktrees.join("wtfs-mine")).unwrap();
    let theirs = fs::read_to_string(worktrees.join("wtfs-mine/gitdir")).unwrap();
    let said = reclaim_kept(&env, "repo/mine", Duration::from_secs(30));
    assert!(said.contains("branch-moved"), "{said}");
    let out = wtfs(&env.state(), &["reclaim", "repo/mine", "--discard"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(said.contains("is not this worktree's entry"), "{said}");
    assert_eq!(
        fs::read_to_string(worktrees.join("wtfs-mine/gitdir")).unwrap(),
        theirs,
        "the other worktree's entry was taken"
    );
    m.unmount();
}

/// The same, with the entries swapped before the mount: the mount points only this
/// worktree's own entry at it (rewriting another's `gitdir` to name this worktree would
/// make it pass for this one's, and a removal would take it).
#[test]
fn a_mount_points_only_its_own_worktrees_entry() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/mine"]);
    wtfs_ok(&env.state(), &["new", "repo/theirs"]);
    let worktrees = env.repo.path().join(".git/worktrees");
    fs::rename(worktrees.join("wtfs-mine"), worktrees.join("mine-away")).unwrap();
    fs::rename(worktrees.join("wtfs-theirs"), worktrees.join("wtfs-mine")).unwrap();
    let theirs = fs::read_to_string(worktrees.join("wtfs-mine/gitdir")).unwrap();
    let m = env.mount_with(&["--linger", "600"]);
    assert_eq!(
        fs::read_to_string(worktrees.join("wtfs-mine/gitdir")).unwrap(),
        theirs,
        "the mount pointed the other worktree's entry at this one"
    );
    assert!(
        m.log().contains("wtfs-mine") && m.log().contains("not this worktree's entry"),
        "{}",
        m.log()
    );
    let out = wtfs(&env.state(), &["reclaim", "repo/mine", "--discard"]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(
        fs::read_to_string(worktrees.join("wtfs-mine/gitdir")).unwrap(),
        theirs,
        "the other worktree's entry was taken"
    );
    m.unmount();
}

/// Whatever else in the repository blocks a read (a FIFO where a branch's ref was, which
/// libgit2 opens as a file), the inspection ends within `--inspect-timeout`, and the
/// worktree is kept with a reason that says so and what to do.
#[test]
fn an_inspection_that_blocks_ends_within_its_timeout() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/stuck"]);
    let m = env.mount_with(&["--inspect-timeout", "2"]);
    run_ok(
        "sh",
        &["-c", "cat README.md >/dev/null"],
        &m.wt("repo", "stuck"),
    );
    wait_for_state(&env, "stuck", "lingering", Duration::from_secs(10));
    let r = env.repo.path().join(".git/refs/heads/stuck");
    fs::remove_file(&r).unwrap();
    run_ok("mkfifo", &[r.to_str().unwrap()], Path::new("/"));
    let started = Instant::now();
    let said = reclaim_kept(&env, "repo/stuck", Duration::from_secs(30));
    assert!(said.contains("did not finish within 2"), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_ne!(state_of(&env, "stuck"), "removed");
    // While that inspection is blocked, no other one starts (one thread at most).
    let started = Instant::now();
    let said = reclaim_kept(&env, "repo/stuck", Duration::from_secs(30));
    assert!(said.contains("still blocked"), "{said}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    run_ok("test", &["-f", "README.md"], &m.wt("repo", "stuck"));
    // Unblocked, the next reclaim inspects again: a writer lets the blocked reader go,
    // and the ref is put back as it was.
    use std::os::unix::fs::OpenOptionsExt;
    drop(
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&r)
            .unwrap(),
    );
    fs::remove_file(&r).unwrap();
    git(
        env.repo.path().as_path(),
        &["branch", "-f", "stuck", "HEAD"],
    );
    wait_for_state(&env, "stuck", "lingering", Duration::from_secs(10));
    let out = wtfs_ok(&env.state(), &["reclaim", "repo/stuck"]);
    assert!(out.contains("removed repo/stuck"), "{out}");
    m.unmount();
}

/// A committed file still open after its name went, in a directory then moved (which
/// copies the directory's tree up): the descriptor still reads and changes it.
#[test]
fn an_open_removed_file_survives_the_move_of_its_directory() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "moved");
    fs::create_dir(&wt).unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .open(wt.join("src/lib/util.rs"))
        .unwrap();
    fs::remove_file(wt.join("src/lib/util.rs")).unwrap();
    fs::rename(wt.join("src/lib"), wt.join("src/lib2")).unwrap();
    let mut content = String::new();
    f.read_to_string(&mut content).unwrap();
    assert_eq!(content, "pub fn one() -> u32 { 1 }\n");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
    assert!(!wt.join("src/lib2/util.rs").exists());
    assert!(wt.join("src/lib2/mod.rs").exists());
    m.unmount();
}

/// Requests on open directories and files never fail while an ancestor is renamed back
/// and forth (the node table learns a rename just after the disk does; a request made in
/// between looks again once the rename is done), as on ext4.
#[test]
fn open_descriptors_work_while_an_ancestor_is_renamed() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "moving");
    fs::create_dir(&wt).unwrap();
    fs::create_dir_all(wt.join("a/b/c")).unwrap();
    for i in 0..20 {
        fs::write(wt.join(format!("a/b/c/f{i}")), format!("{i}")).unwrap();
    }
    let dir = fs::File::open(wt.join("a/b/c")).unwrap();
    let file = fs::File::open(wt.join("a/b/c/f3")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (wt, stop) = (wt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (from, to) = if n.is_multiple_of(2) {
                    ("a", "z")
                } else {
                    ("z", "a")
                };
                fs::rename(wt.join(from), wt.join(to)).unwrap();
                n += 1;
            }
            n
        })
    };
    let (mut ops, mut errors) = (0u64, Vec::new());
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        let via = format!("/proc/self/fd/{}", dir.as_raw_fd());
        // A change inside, so the kernel drops its copy of the listing and asks again.
        let tmp = format!("{via}/tmp");
        if let Err(e) = fs::write(&tmp, b"x").and_then(|_| fs::remove_file(&tmp)) {
            errors.push(format!("create and remove: {e}"));
        }
        match fs::read_dir(&via).map(|d| d.count()) {
            Ok(20) => {}
            Ok(n) => errors.push(format!("listed {n} entries")),
            Err(e) => errors.push(format!("listing: {e}")),
        }
        if let Err(e) = file.metadata() {
            errors.push(format!("fstat: {e}"));
        }
        let mut s = String::new();
        match fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .and_then(|mut f| f.read_to_string(&mut s))
        {
            Ok(_) if s == "3" => {}
            other => errors.push(format!("reopen: {other:?} {s:?}")),
        }
        ops += 1;
        if errors.len() > 10 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let renames = mover.join().unwrap();
    assert!(renames > 10 && ops > 10, "{renames} renames, {ops} rounds");
    assert!(
        errors.is_empty(),
        "{} rounds, {renames} renames: {errors:?}",
        ops
    );
    m.unmount();
}

/// A name removed in a directory that is then moved (which copies the directory up and
/// makes it opaque, keeping its whiteouts) can be made again, by create, mkdir, symlink
/// or link, there and after a move back; and a file cannot be renamed over the
/// worktree's own `.git`.
#[test]
fn a_removed_name_in_a_moved_directory_can_be_made_again() {
    let env = Env::new();
    let m = env.mount();
    let wt = m.wt("repo", "again");
    fs::create_dir(&wt).unwrap();
    fs::remove_file(wt.join("src/lib/util.rs")).unwrap();
    fs::remove_file(wt.join("src/lib/mod.rs")).unwrap();
    fs::remove_file(wt.join("src/main.rs")).unwrap();
    fs::rename(wt.join("src"), wt.join("moved")).unwrap();
    for d in ["moved/lib", "moved"] {
        assert!(fs::read_dir(wt.join(d)).unwrap().all(|e| {
            let n = e.unwrap().file_name();
            n == "lib"
        }));
    }
    fs::write(wt.join("moved/lib/util.rs"), b"again\n").unwrap();
    fs::create_dir(wt.join("moved/main.rs")).unwrap();
    std::os::unix::fs::symlink("x", wt.join("moved/lib/mod.rs")).unwrap();
    fs::remove_dir(wt.join("moved/main.rs")).unwrap();
    fs::hard_link(wt.join("moved/lib/util.rs"), wt.join("moved/main.rs")).unwrap();
    fs::rename(wt.join("moved"), wt.join("src")).unwrap();
    assert_eq!(fs::read(wt.join("src/lib/util.rs")).unwrap(), b"again\n");
    assert_eq!(fs::read(wt.join("src/main.rs")).unwrap(), b"again\n");
    fs::write(wt.join("notgit"), b"x").unwrap();
    let err = fs::rename(wt.join("notgit"), wt.join(".git")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    assert!(fs::read_to_string(wt.join(".git"))
        .unwrap()
        .starts_with("gitdir: "));
    assert!(wt.join("notgit").exists());
    m.unmount();
}

/// Worktrees change side by side (each has its own lock on changes): three agents' runs
/// of creates, renames of directories, links, removals and git commands at the same
/// moment, while checkpoints of one are taken, each end as the same run in a plain
/// checkout ends, file for file.
#[test]
fn worktrees_changed_side_by_side_each_end_as_a_checkout_does() {
    let env = Env::new();
    let names = ["a", "b", "c"];
    for n in names {
        wtfs_ok(&env.state(), &["new", &format!("repo/{n}")]);
    }
    let m = env.mount();
    let run = "set -e
        for i in $(seq 1 30); do mkdir -p d$i/e; for j in 1 2 3 4; do echo $i.$j > d$i/e/f$j; done; done
        for i in $(seq 1 30); do mv d$i d$i.m; ln -s d$i.m/e/f1 s$i; ln d$i.m/e/f2 h$i; mv d$i.m/e/f3 g$i; done
        for i in $(seq 1 15); do rm -r d$i.m; done
        git add -A; git -c user.name=t -c user.email=t@example.com commit -qm side
        git checkout -q HEAD~1; git checkout -q -
        for i in $(seq 16 30); do echo more >> d$i.m/e/f4; chmod 600 d$i.m/e/f4; done";
    let plain = env.dir.path().join("plain");
    run_ok(
        "git",
        &[
            "clone",
            "-q",
            env.repo.path().to_str().unwrap(),
            plain.to_str().unwrap(),
        ],
        Path::new("/"),
    );
    run_ok("sh", &["-c", run], &plain);
    // A directory's link count aside: the view's are 2 (as overlayfs's), ext4 counts
    // subdirectories.
    let listing = |wt: &Path| {
        tree_listing(wt)
            .lines()
            .map(|l| match l.split(' ').collect::<Vec<_>>().as_slice() {
                ["==", name, mode, _links, ""] if mode.starts_with('d') => {
                    format!("== {name} {mode}")
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let want = listing(&plain);
    let taking = Arc::new(AtomicBool::new(true));
    let state = env.state();
    let taker = {
        let taking = taking.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while taking.load(Ordering::Relaxed) {
                wtfs_ok(&state, &["checkpoint", "repo/a"]);
                n += 1;
            }
            n
        })
    };
    let agents: Vec<_> = names
        .iter()
        .map(|n| {
            let wt = m.wt("repo", n);
            std::thread::spawn(move || run_ok("sh", &["-c", run], &wt))
        })
        .collect();
    for a in agents {
        a.join().unwrap();
    }
    taking.store(false, Ordering::Relaxed);
    assert!(taker.join().unwrap() > 0);
    for n in names {
        let wt = m.wt("repo", n);
        assert_eq!(listing(&wt), want, "repo/{n}");
        assert_eq!(
            run_ok("git", &["rev-parse", "HEAD^{tree}"], &wt),
            run_ok("git", &["rev-parse", "HEAD^{tree}"], &plain),
            "repo/{n}"
        );
        assert_eq!(git_state(&wt)[0], git_state(&plain)[0], "repo/{n}");
    }
    m.unmount();
}
