//! Mounted tests: a real daemon, a real repository, the real `git`, ordinary std::fs calls.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirEntryExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::*;

fn porcelain(dir: &Path) -> String {
    git(dir, &["status", "--porcelain", "--untracked-files=all"])
}

/// `git status` in its default mode (untracked directories collapsed), the one whose
/// untracked cache the index written at creation carries; `truth` turns off fsmonitor and
/// the untracked cache, so git looks at every file and directory itself.
fn status_default(dir: &Path, truth: bool) -> String {
    let mut args = vec!["status", "--porcelain"];
    if truth {
        args = vec![
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.untrackedCache=false",
            "status",
            "--porcelain",
        ];
    }
    git(dir, &args)
}

/// The ground truth: git looking at every file and directory itself.
fn status_without_fsmonitor(dir: &Path) -> String {
    git(
        dir,
        &[
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.untrackedCache=false",
            "status",
            "--porcelain",
            "--untracked-files=all",
        ],
    )
}

#[test]
fn fresh_view_is_clean_and_git_status_reads_no_content() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/fresh"]);
    let m = env.mount();
    // The kernel names the mount as fstab and fusermount3 do: type fuse.worktreefs.
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == m.mountpoint.to_str())
        .unwrap_or_else(|| panic!("no mount at {}: {mounts}", m.mountpoint.display()));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f[0], f[2]), ("worktreefs", "fuse.worktreefs"), "{line}");
    assert!(
        f[3].contains("nosuid") && f[3].contains("nodev") && f[3].contains("default_permissions"),
        "{line}"
    );
    let wt = m.wt("repo", "fresh");
    // Without the untracked scan, git compares every tracked file by stat data alone.
    assert_eq!(
        git(&wt, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    git(&wt, &["diff", "--exit-code"]);
    let stats = m.stats();
    assert_eq!(
        stats["content_reads"], 0,
        "git status read file content: {stats}"
    );
    assert_eq!(
        stats["blob_fills"], 0,
        "git status materialized blobs: {stats}"
    );
    // The full status also lists untracked files, for which git reads the ignore rules
    // (`.gitignore`), as in any checkout; it reads no other file.
    assert_eq!(porcelain(&wt), "", "a fresh view must be clean");
    let paths = m.content_paths();
    assert!(
        paths.iter().all(|p| p.ends_with("/.gitignore")),
        "git status read more than ignore rules: {paths:?}"
    );
    // HEAD is on the new branch, named after the worktree, at the base commit.
    assert_eq!(
        git(&wt, &["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/fresh"
    );
    assert_eq!(git(&wt, &["rev-parse", "HEAD"]).trim(), env.repo.head());
    // git knows the worktree, and it is locked so prune cannot drop it.
    let list = git(&env.repo.path(), &["worktree", "list", "--porcelain"]);
    assert!(
        list.contains(&format!("worktree {}", wt.display())),
        "{list}"
    );
    assert!(list.contains("locked"), "{list}");
    git(&env.repo.path(), &["worktree", "prune"]);
    assert_eq!(porcelain(&wt), "");
    // Reading a file now does count, so the counter above could have failed.
    fs::read(wt.join("README.md")).unwrap();
    assert!(m.stats()["content_reads"].as_u64().unwrap() > 0);
}

#[test]
fn base_tree_shapes_appear_as_in_a_checkout() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/shapes"]);
    let m = env.mount();
    let wt = m.wt("repo", "shapes");
    let src = env.repo.path();
    // Executable bit, symlinks, empty blob, large file, deep path, non-ASCII names.
    let exec = fs::metadata(wt.join("build.sh")).unwrap();
    assert_eq!(exec.permissions().mode() & 0o777, 0o755);
    assert_eq!(run_ok("./build.sh", &[], &wt), "building\n");
    assert_eq!(
        fs::metadata(wt.join("README.md"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    assert_eq!(
        fs::read_link(wt.join("link-to-readme")).unwrap(),
        Path::new("README.md")
    );
    assert_eq!(
        fs::read_to_string(wt.join("link-to-readme")).unwrap(),
        "# test repository\n"
    );
    assert_eq!(
        fs::read_link(wt.join("docs/src-link")).unwrap(),
        Path::new("../src")
    );
    assert!(wt.join("docs/src-link/main.rs").exists());
    assert_eq!(fs::metadata(wt.join("empty.txt")).unwrap().len(), 0);
    assert_eq!(fs::read(wt.join("empty.txt")).unwrap(), b"");
    let large = fs::read(wt.join("assets/large.bin")).unwrap();
    assert_eq!(large, fs::read(src.join("assets/large.bin")).unwrap());
    let deep = (0..24)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join("/");
    assert_eq!(
        fs::read_to_string(wt.join(&deep).join("leaf.txt")).unwrap(),
        "deep leaf\n"
    );
    assert_eq!(
        fs::read_to_string(wt.join("docs/naïve café.md")).unwrap(),
        "non-ASCII name\n"
    );
    assert_eq!(
        fs::read_to_string(wt.join("docs/日本語.txt")).unwrap(),
        "こんにちは\n"
    );
    // A gitlink is an empty directory, as in a fresh `git worktree add`.
    let sub = wt.join("vendor/sub");
    assert!(fs::metadata(&sub).unwrap().is_dir());
    assert_eq!(fs::read_dir(&sub).unwrap().count(), 0);
    // The listing matches the source checkout (plus .git, minus nothing).
    let mut names: Vec<_> = fs::read_dir(&wt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<_> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    want.sort();
    assert_eq!(names, want);
    assert!(fs::read_to_string(wt.join(".git"))
        .unwrap()
        .starts_with("gitdir: "));
    // Stat data is stable: same inode and mtime on a second look.
    let a = fs::symlink_metadata(wt.join("src/main.rs")).unwrap();
    let b = fs::symlink_metadata(wt.join("src/main.rs")).unwrap();
    assert_eq!(
        (a.ino(), a.mtime(), a.size()),
        (b.ino(), b.mtime(), b.size())
    );
    assert_eq!(porcelain(&wt), "");
}

#[test]
fn git_works_inside_the_view() {
    let env = Env::new();
    let remote = env.dir.path().join("remote.git");
    run_ok(
        "git",
        &["init", "-q", "--bare", remote.to_str().unwrap()],
        env.dir.path(),
    );
    wtfs_ok(&env.state(), &["new", "repo/agent"]);
    let m = env.mount();
    let wt = m.wt("repo", "agent");
    fs::write(wt.join("README.md"), "# changed\n").unwrap();
    fs::write(wt.join("src/new.rs"), "// new\n").unwrap();
    assert_eq!(porcelain(&wt), " M README.md\n?? src/new.rs\n");
    assert!(git(&wt, &["diff"]).contains("+# changed"));
    git(&wt, &["add", "-A"]);
    git(&wt, &["commit", "-q", "-m", "agent work"]);
    assert_eq!(porcelain(&wt), "");
    assert!(git(&wt, &["log", "--oneline"]).contains("agent work"));
    // The commit is visible from the source repository (shared object database and refs).
    assert!(git(&env.repo.path(), &["log", "--oneline", "agent"]).contains("agent work"));
    // stash
    fs::write(wt.join("src/main.rs"), "fn main() {}\n").unwrap();
    git(&wt, &["stash"]);
    assert_eq!(porcelain(&wt), "");
    git(&wt, &["stash", "pop"]);
    assert_eq!(porcelain(&wt), " M src/main.rs\n");
    // checkout -b, commit, reset --hard
    git(&wt, &["checkout", "-q", "-b", "side"]);
    git(&wt, &["commit", "-q", "-am", "side work"]);
    fs::write(wt.join("scratch.txt"), "x").unwrap();
    fs::remove_file(wt.join("build.sh")).unwrap();
    git(&wt, &["reset", "-q", "--hard", "HEAD~1"]);
    assert_eq!(porcelain(&wt), "?? scratch.txt\n");
    assert_eq!(
        fs::read_to_string(wt.join("src/main.rs")).unwrap(),
        "fn main() { println!(\"hi\"); }\n"
    );
    assert!(wt.join("build.sh").exists());
    // push to a local bare remote
    git(&wt, &["checkout", "-q", "agent"]);
    git(&wt, &["push", "-q", remote.to_str().unwrap(), "agent"]);
    let pushed = run_ok("git", &["log", "--oneline", "agent"], &remote);
    assert!(pushed.contains("agent work"), "{pushed}");
}

#[test]
fn posix_operations_work_through_the_view() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/posix"]);
    let m = env.mount();
    let wt = m.wt("repo", "posix");

    // create, write, read back, truncate
    let p = wt.join("notes.txt");
    fs::write(&p, "hello world").unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), "hello world");
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(5)
        .unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), "hello");
    // append to a base file (copy-up keeps the content)
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(wt.join("README.md"))
        .unwrap();
    f.write_all(b"more\n").unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(wt.join("README.md")).unwrap(),
        "# test repository\nmore\n"
    );
    // read/write at offsets in one handle
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(wt.join("src/lib/util.rs"))
        .unwrap();
    f.seek(SeekFrom::Start(4)).unwrap();
    f.write_all(b"FN").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "pub FN one() -> u32 { 1 }\n");
    f.sync_all().unwrap();
    drop(f);

    // rename: file onto an existing base file, across directories
    fs::write(wt.join("tmp.rs"), "replacement\n").unwrap();
    fs::rename(wt.join("tmp.rs"), wt.join("src/main.rs")).unwrap();
    assert_eq!(
        fs::read_to_string(wt.join("src/main.rs")).unwrap(),
        "replacement\n"
    );
    assert!(!wt.join("tmp.rs").exists());
    fs::rename(wt.join("empty.txt"), wt.join("docs/moved-empty.txt")).unwrap();
    assert!(!wt.join("empty.txt").exists());
    assert!(wt.join("docs/moved-empty.txt").exists());
    // rename a base directory with content
    fs::rename(wt.join("src/lib"), wt.join("lib2")).unwrap();
    assert!(!wt.join("src/lib").exists());
    assert_eq!(
        fs::read_to_string(wt.join("lib2/mod.rs")).unwrap(),
        "pub mod util;\n"
    );
    assert_eq!(
        fs::read_to_string(wt.join("lib2/util.rs")).unwrap(),
        "pub FN one() -> u32 { 1 }\n"
    );
    // and back onto a name the base has (must not resurrect base content)
    fs::rename(wt.join("lib2"), wt.join("src/lib")).unwrap();
    let mut names: Vec<_> = fs::read_dir(wt.join("src/lib"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, vec!["mod.rs", "util.rs"]);

    // unlink a base file; rmdir a base dir after emptying; mkdir same name is empty
    fs::remove_file(wt.join("README.md")).unwrap();
    assert!(!wt.join("README.md").exists());
    fs::remove_dir_all(wt.join("assets")).unwrap();
    assert!(!wt.join("assets").exists());
    fs::create_dir(wt.join("assets")).unwrap();
    assert_eq!(fs::read_dir(wt.join("assets")).unwrap().count(), 0);
    assert_eq!(
        fs::remove_dir(wt.join("src")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );

    // symlink, readlink; hard link within the upper layer
    std::os::unix::fs::symlink("src/main.rs", wt.join("main-link")).unwrap();
    assert_eq!(
        fs::read_to_string(wt.join("main-link")).unwrap(),
        "replacement\n"
    );
    fs::hard_link(wt.join("notes.txt"), wt.join("notes-hard.txt")).unwrap();
    assert_eq!(fs::metadata(wt.join("notes.txt")).unwrap().nlink(), 2);
    fs::write(wt.join("notes-hard.txt"), "via link").unwrap();
    assert_eq!(
        fs::read_to_string(wt.join("notes.txt")).unwrap(),
        "via link"
    );

    // chmod: the executable bit matters to git
    fs::set_permissions(wt.join("src/lib/mod.rs"), fs::Permissions::from_mode(0o755)).unwrap();
    let diff = git(&wt, &["diff", "--summary", "--", "src/lib/mod.rs"]);
    assert!(diff.contains("mode change 100644 => 100755"), "{diff}");

    // utimens
    let c = std::ffi::CString::new(wt.join("notes.txt").as_os_str().as_encoded_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 2_000_000,
            tv_nsec: 0,
        },
    ];
    // SAFETY: valid path and times.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
        0
    );
    assert_eq!(
        fs::metadata(wt.join("notes.txt")).unwrap().mtime(),
        2_000_000
    );

    // mmap read and shared write
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(wt.join("notes.txt"))
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: mapping 8 bytes of an 8-byte file we hold open.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED);
        let bytes = std::slice::from_raw_parts_mut(ptr as *mut u8, 8);
        assert_eq!(bytes, b"via link");
        bytes[0] = b'V';
        assert_eq!(libc::msync(ptr, 8, libc::MS_SYNC), 0);
        libc::munmap(ptr, 8);
    }
    drop(f);
    assert_eq!(
        fs::read_to_string(wt.join("notes.txt")).unwrap(),
        "Via link"
    );

    // flock and fcntl locks
    let f = fs::File::open(wt.join("notes.txt")).unwrap();
    // SAFETY: plain flock on an open descriptor.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let g = fs::File::open(wt.join("notes.txt")).unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::flock(g.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        -1
    );
    drop((f, g));
    // POSIX record locks (fcntl): a second process sees the first one's write lock.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(wt.join("notes.txt"))
        .unwrap();
    let lock = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: a valid descriptor and lock description.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) },
        0
    );
    let probe = run(
        "python3",
        &[
            "-c",
            "import fcntl,sys; f=open(sys.argv[1],'r+'); fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB)",
            wt.join("notes.txt").to_str().unwrap(),
        ],
        &wt,
    );
    assert!(
        !probe.status.success(),
        "a second process took a lock held by the first"
    );
    drop(f);

    // extended attributes: a clear ENOTSUP
    let name = std::ffi::CString::new("user.test").unwrap();
    // SAFETY: valid strings.
    let rc = unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"v".as_ptr() as *const _, 1, 0) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );

    // reserved names are refused with EINVAL
    let err = fs::write(wt.join(".wtfs-wh.x"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    // the .git file cannot be removed
    assert!(fs::remove_file(wt.join(".git")).is_err());

    // git agrees with what we did
    let status = porcelain(&wt);
    for expect in [
        " D README.md",
        " D empty.txt",
        " M src/main.rs",
        " D assets/large.bin",
        "?? notes.txt",
    ] {
        assert!(status.contains(expect), "missing {expect:?} in:\n{status}");
    }
}

#[test]
fn everything_survives_a_remount() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/keep"]);
    let (ino_before, status_before) = {
        let m = env.mount();
        let wt = m.wt("repo", "keep");
        fs::write(wt.join("new.txt"), "kept\n").unwrap();
        fs::write(wt.join("src/main.rs"), "changed\n").unwrap();
        fs::remove_file(wt.join("build.sh")).unwrap();
        fs::remove_dir_all(wt.join("docs")).unwrap();
        fs::create_dir(wt.join("docs")).unwrap();
        fs::write(wt.join("docs/only.md"), "only\n").unwrap();
        git(&wt, &["add", "new.txt"]);
        let ino = fs::metadata(wt.join("src/lib/util.rs")).unwrap().ino();
        (ino, porcelain(&wt))
    };
    let m = env.mount();
    let wt = m.wt("repo", "keep");
    assert_eq!(fs::read_to_string(wt.join("new.txt")).unwrap(), "kept\n");
    assert_eq!(
        fs::read_to_string(wt.join("src/main.rs")).unwrap(),
        "changed\n"
    );
    assert!(!wt.join("build.sh").exists());
    let docs: Vec<_> = fs::read_dir(wt.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(docs, vec!["only.md"]);
    assert_eq!(
        fs::metadata(wt.join("src/lib/util.rs")).unwrap().ino(),
        ino_before
    );
    assert_eq!(porcelain(&wt), status_before);
    assert!(git(&wt, &["diff", "--cached", "--name-only"]).contains("new.txt"));
}

#[test]
fn blobs_are_materialized_once_for_all_worktrees() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/one"]);
    wtfs_ok(&env.state(), &["new", "repo/two"]);
    let m = env.mount();
    let a = fs::read(m.wt("repo", "one").join("assets/large.bin")).unwrap();
    assert_eq!(m.stats()["blob_fills"], 1);
    let b = fs::read(m.wt("repo", "two").join("assets/large.bin")).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        m.stats()["blob_fills"],
        1,
        "the second worktree must read the cached blob"
    );
    // A change in one worktree is not seen in the other.
    fs::write(m.wt("repo", "one").join("README.md"), "one\n").unwrap();
    assert_eq!(
        fs::read_to_string(m.wt("repo", "two").join("README.md")).unwrap(),
        "# test repository\n"
    );
}

/// Two worktrees are two filesystems to their users: rename and link between
/// them answer EXDEV (it used to succeed and lose the file from both views until a
/// remount), and `mv` falls back to a copy, which each view then shows at once.
#[test]
fn a_file_moved_between_worktrees_is_copied_not_lost() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/one"]);
    wtfs_ok(&env.state(), &["new", "repo/two"]);
    let m = env.mount();
    let (one, two) = (m.wt("repo", "one"), m.wt("repo", "two"));
    let xdev = |e: std::io::Error| e.raw_os_error();
    let err = fs::rename(one.join("README.md"), two.join("moved.md")).unwrap_err();
    assert_eq!(xdev(err), Some(libc::EXDEV));
    let err = fs::hard_link(one.join("README.md"), two.join("linked.md")).unwrap_err();
    assert_eq!(xdev(err), Some(libc::EXDEV));
    let err = fs::rename(one.join("src"), two.join("src2")).unwrap_err();
    assert_eq!(xdev(err), Some(libc::EXDEV));
    let err = fs::rename(one.join("README.md"), m.mountpoint.join(".control/x")).unwrap_err();
    assert_eq!(xdev(err), Some(libc::EXDEV));
    assert!(one.join("README.md").exists() && !two.join("moved.md").exists());

    run_ok("mv", &["src", two.join("src2").to_str().unwrap()], &one);
    assert!(!one.join("src").exists());
    assert_eq!(
        fs::read_to_string(two.join("src2/main.rs")).unwrap(),
        "fn main() { println!(\"hi\"); }\n"
    );
    assert!(
        porcelain(&one).contains("src/main.rs"),
        "{}",
        porcelain(&one)
    );
    assert!(porcelain(&two).contains("src2/"), "{}", porcelain(&two));
}

#[test]
fn mkdir_creates_a_worktree_and_bad_names_are_refused() {
    let env = Env::new();
    let m = env.mount();
    let repo_dir = m.mountpoint.join("repo");
    fs::create_dir(repo_dir.join("by-mkdir")).unwrap();
    let wt = repo_dir.join("by-mkdir");
    assert!(wt.join("README.md").exists());
    assert_eq!(porcelain(&wt), "");
    assert!(wtfs_ok(&env.state(), &["list"]).contains("by-mkdir"));
    for bad in ["has space", ".hidden", "-dash", &"x".repeat(65)] {
        let err = fs::create_dir(repo_dir.join(bad)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
    }
    assert_eq!(
        fs::create_dir(repo_dir.join("by-mkdir"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EEXIST)
    );
    // Nothing half-made for the refused names.
    let list = git(&env.repo.path(), &["worktree", "list"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        m.log().contains("worktree name 'has space'"),
        "the refusal is logged with its reason"
    );
}

#[test]
fn a_repository_added_while_mounted_appears_at_once() {
    let env = Env::new();
    let m = env.mount();
    let _other = env.add_repo("other");
    assert!(m.mountpoint.join("other").is_dir());
    wtfs_ok(&env.state(), &["new", "other/w"]);
    assert!(m.wt("other", "w").join("README.md").exists());
    let mut top: Vec<_> = fs::read_dir(&m.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    top.sort();
    assert_eq!(top, vec![".control", "other", "repo"]);
    let entries: Vec<_> = fs::read_dir(m.mountpoint.join(".control/worktrees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, vec!["other:w"]);
    let json: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(m.mountpoint.join(".control/worktrees/other:w")).unwrap(),
    )
    .unwrap();
    // This test process looked inside (README.md above): it holds a process lease.
    assert_eq!(json["state"], "active");
    let me = format!("other:w@pid:{}:", std::process::id());
    assert!(
        fs::read_dir(m.mountpoint.join(".control/leases"))
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().starts_with(&me)),
        "no lease for {me}"
    );
    assert!(fs::read_to_string(m.mountpoint.join(".control/status"))
        .unwrap()
        .contains("other"));
    // `ls -l` sizes are real: a listing sends the generated files' entries without their
    // content, and stat after it still gives each one's length.
    for dir in ["leases", "worktrees"] {
        let dir = m.mountpoint.join(".control").join(dir);
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let size = fs::symlink_metadata(&path).unwrap().len();
            assert!(size > 0, "{}", path.display());
            assert_eq!(
                size,
                fs::read(&path).unwrap().len() as u64,
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn the_daemon_backgrounds_and_a_second_one_is_refused() {
    let env = Env::new();
    let mp = env.mountpoint();
    fs::create_dir_all(&mp).unwrap();
    let out = wtfs_ok(&env.state(), &["mount", mp.to_str().unwrap()]);
    assert!(out.contains("mounted at"), "{out}");
    assert!(is_mounted(&fs::canonicalize(&mp).unwrap()));
    // From here on, make sure we unmount whatever happens.
    let _g = UnmountOnDrop {
        state: env.state(),
        mountpoint: mp.clone(),
    };
    let other_mp = env.dir.path().join("mnt2");
    fs::create_dir_all(&other_mp).unwrap();
    let second = wtfs(&env.state(), &["mount", other_mp.to_str().unwrap()]);
    assert!(!second.status.success());
    let msg = String::from_utf8_lossy(&second.stderr);
    assert!(msg.contains("is served already, by daemon pid"), "{msg}");
    assert!(
        msg.contains(&fs::canonicalize(&mp).unwrap().display().to_string()),
        "names where it serves: {msg}"
    );
    assert!(!is_mounted(&other_mp));
    let out = wtfs_ok(&env.state(), &["unmount"]);
    assert!(out.contains("unmounted"), "{out}");
    assert!(!is_mounted(&fs::canonicalize(&mp).unwrap()));
}

/// The first ten minutes, as a newcomer follows them: `mount` in a repository prints next
/// steps that run as printed (this program's own path, it not being on PATH; the state
/// dir it was given), in order, in one shell, ending with the unmount; `mount` in a second
/// repository while the daemon serves registers that one and prints the steps again.
#[test]
fn the_first_ten_minutes_run_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let first = TestRepo::new();
    let second = TestRepo::new();
    let mount = |repo: &TestRepo| {
        std::process::Command::new(BIN)
            .args(["--state-dir", state.to_str().unwrap(), "mount"])
            .current_dir(repo.path())
            .env_remove("WORKTREEFS_STATE_DIR")
            .output()
            .unwrap()
    };
    let out = mount(&first);
    let mp = state.with_file_name("state-mnt");
    let _g = UnmountOnDrop {
        state: state.clone(),
        mountpoint: mp.clone(),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let me = format!("{BIN} --state-dir {}", state.display());
    assert!(said.contains(&format!("{me} new ")), "{said}");
    // A second repository, while the daemon serves: registered, steps printed.
    let out = mount(&second);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(again.contains("registered repository"), "{again}");
    // Both test repositories are directories named `repo`: the second is `repo-2`.
    assert!(again.contains("new repo-2/task-1"), "{again}");
    let listed: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["repo", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    // An unmount from a shell inside is refused, and says that shell is the caller's.
    let out = run(
        "sh",
        &["-c", &format!("cd {}/repo && {me} unmount", mp.display())],
        Path::new("/"),
    );
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains(
            "in repository repo's directory (working directory) — yours: this command's own shell"
        ),
        "{msg}"
    );
    assert!(msg.contains("your own shell is inside"), "{msg}");
    // The steps, in order, in one shell (comments dropped), as a person pastes them.
    let steps: Vec<String> = said
        .lines()
        .skip_while(|l| l.trim() != "next:")
        .skip(1)
        .map(|l| l.split(" # ").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(steps.len(), 4, "{said}");
    assert!(steps.last().unwrap().ends_with(" unmount"), "{steps:?}");
    let script = format!("set -e\n{}\n", steps.join("\n"));
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(first.path())
        .env_remove("WORKTREEFS_STATE_DIR")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mp), "the last step unmounts");
}

/// A refused mount leaves nothing behind: no state directory (later commands would take
/// its skeleton for a real one), no default mountpoint it made.
#[test]
fn a_refused_mount_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::new();
    let file = dir.path().join("a-file");
    fs::write(&file, "x").unwrap();
    for (n, target) in [("s1", dir.path().join("missing/dir")), ("s2", file.clone())] {
        let state = dir.path().join(n);
        let out = std::process::Command::new(BIN)
            .args(["--state-dir", state.to_str().unwrap(), "mount"])
            .arg(&target)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{target:?}");
        assert!(
            !state.exists(),
            "a refused mount of {target:?} left {state:?}"
        );
    }
    // The default mountpoint's place taken by a file: refused, and nothing is made.
    let state = dir.path().join("s3");
    fs::write(state.with_file_name("s3-mnt"), "x").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--state-dir", state.to_str().unwrap(), "mount"])
        .current_dir(repo.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!state.exists());
}

#[test]
fn mountpoint_must_be_an_empty_directory() {
    let env = Env::new();
    let mp = env.dir.path().join("full");
    fs::create_dir_all(&mp).unwrap();
    fs::write(mp.join("x"), "x").unwrap();
    let out = wtfs(&env.state(), &["mount", mp.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    let file = env.dir.path().join("file");
    fs::write(&file, "x").unwrap();
    let out = wtfs(&env.state(), &["mount", file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    assert!(!is_mounted(&mp));
}

#[test]
fn fsynced_data_survives_kill_9_of_the_daemon() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/crash"]);
    let m = env.mount();
    let wt = m.wt("repo", "crash");
    let mut f = fs::File::create(wt.join("durable.txt")).unwrap();
    f.write_all(b"fsync'd bytes").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(wt.join("README.md"), "edited\n").unwrap();
    fs::remove_file(wt.join("build.sh")).unwrap();
    m.kill9();
    let m = env.mount();
    let wt = m.wt("repo", "crash");

    assert_eq!(
        fs::read_to_string(wt.join("durable.txt")).unwrap(),
        "fsync'd bytes"
    );
    assert_eq!(
        fs::read_to_string(wt.join("README.md")).unwrap(),
        "edited\n"
    );
    assert!(!wt.join("build.sh").exists());
    let status = porcelain(&wt);
    assert!(
        status.contains(" M README.md") && status.contains(" D build.sh"),
        "{status}"
    );
}

#[test]
fn changes_to_the_source_repository_do_not_break_a_worktree() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/steady"]);
    let m = env.mount();
    let wt = m.wt("repo", "steady");
    let repo = env.repo.path();
    fs::write(repo.join("README.md"), "moved on\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "upstream change"]);
    git(&repo, &["gc", "-q", "--prune=now"]);
    git(&repo, &["worktree", "prune"]);
    assert_eq!(porcelain(&wt), "");
    assert_eq!(
        fs::read_to_string(wt.join("README.md")).unwrap(),
        "# test repository\n"
    );
    assert_eq!(
        fs::read(wt.join("assets/large.bin")).unwrap().len(),
        3_000_000
    );
    assert!(git(&repo, &["worktree", "list"]).contains("steady"));
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn listings_the_kernel_caches_follow_every_change() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/first"]);
    let m = env.mount();
    let repo_dir = m.mountpoint.join("repo");
    assert_eq!(names(&repo_dir), vec!["first"]);
    // Created by the CLI, another process: listed as soon as the command returns.
    wtfs_ok(&env.state(), &["new", "repo/second"]);
    assert_eq!(names(&repo_dir), vec!["first", "second"]);
    // Created through the mount.
    fs::create_dir(repo_dir.join("third")).unwrap();
    assert_eq!(names(&repo_dir), vec!["first", "second", "third"]);
    let other = TestRepo::new();
    assert_eq!(names(&m.mountpoint), vec![".control", "repo"]);
    wtfs_ok(
        &env.state(),
        &[
            "repo",
            "add",
            other.path().to_str().unwrap(),
            "--name",
            "other",
        ],
    );
    assert_eq!(names(&m.mountpoint), vec![".control", "other", "repo"]);

    // Inside a worktree: a name looked up while absent, then created, is found; listings
    // read before a change show it after.
    let wt = m.wt("repo", "first");
    let src = wt.join("src");
    assert!(!src.join("added.rs").exists());
    let before = names(&src);
    fs::write(src.join("added.rs"), "x").unwrap();
    assert!(src.join("added.rs").exists());
    let mut want = before.clone();
    want.push("added.rs".into());
    want.sort();
    assert_eq!(names(&src), want);
    fs::rename(src.join("added.rs"), src.join("renamed.rs")).unwrap();
    assert!(!src.join("added.rs").exists());
    assert!(names(&src).contains(&"renamed.rs".to_string()));
    fs::remove_file(src.join("renamed.rs")).unwrap();
    assert_eq!(names(&src), before);
    fs::remove_file(src.join("main.rs")).unwrap();
    assert!(!names(&src).contains(&"main.rs".to_string()));
    assert!(!src.join("main.rs").exists());
    fs::write(src.join("main.rs"), "back").unwrap();
    assert_eq!(fs::read_to_string(src.join("main.rs")).unwrap(), "back");
    // Another worktree at the same commit is not affected by any of it.
    assert!(m.wt("repo", "second").join("src/main.rs").exists());
    assert_eq!(
        fs::read_to_string(m.wt("repo", "second").join("src/main.rs")).unwrap(),
        "fn main() { println!(\"hi\"); }\n"
    );
    // .control listings are never stale either.
    let listed = names(&m.mountpoint.join(".control/worktrees"));
    assert_eq!(listed, vec!["repo:first", "repo:second", "repo:third"]);
    wtfs_ok(&env.state(), &["new", "other/w"]);
    assert_eq!(names(&m.mountpoint.join(".control/worktrees")).len(), 4);
}

#[test]
fn random_operations_through_the_mount_agree_with_a_plain_directory() {
    let env = Env::new();
    for seed in 1..=4u64 {
        wtfs_ok(&env.state(), &["new", &format!("repo/model{seed}")]);
    }
    let m = env.mount();
    let paths = MODEL_PATHS;
    for seed in 1..=4u64 {
        let wt = m.wt("repo", &format!("model{seed}"));
        let plain = tempfile::tempdir().unwrap();
        run_ok(
            "git",
            &[
                "--work-tree",
                plain.path().to_str().unwrap(),
                "checkout",
                "HEAD",
                "--",
                ".",
            ],
            &env.repo.path(),
        );
        fs::create_dir_all(plain.path().join("vendor/sub")).unwrap();
        let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut log = Vec::new();
        for step in 0..80 {
            let a = rng.pick(&paths);
            let b = rng.pick(&paths);
            let kind = rng.below(6);
            let apply = |root: &Path| -> bool {
                let r = match kind {
                    0 => fs::write(root.join(a), format!("{seed}-{step}")),
                    1 => fs::remove_file(root.join(a)),
                    2 => fs::create_dir(root.join(a)),
                    3 => fs::remove_dir(root.join(a)),
                    4 => {
                        if b.starts_with(&format!("{a}/")) {
                            return false; // the kernel refuses moving a directory into itself
                        }
                        fs::rename(root.join(a), root.join(b))
                    }
                    _ => fs::read(root.join(a)).map(|_| ()),
                };
                r.is_ok()
            };
            let want = apply(plain.path());
            let got = apply(&wt);
            log.push(format!("op {kind} {a} {b}: plain {want}, view {got}"));
            assert_eq!(got, want, "seed {seed} step {step}\n{}", log.join("\n"));
            assert_eq!(
                snapshot(&wt),
                snapshot(plain.path()),
                "seed {seed} step {step}\n{}",
                log.join("\n")
            );
            if step % 5 == 4 {
                // What the daemon tells git through fsmonitor, and the untracked cache
                // written at creation, must never hide a change.
                assert_eq!(
                    porcelain(&wt),
                    status_without_fsmonitor(&wt),
                    "seed {seed} step {step}\n{}",
                    log.join("\n")
                );
                assert_eq!(
                    status_default(&wt, false),
                    status_default(&wt, true),
                    "seed {seed} step {step}\n{}",
                    log.join("\n")
                );
            }
        }
    }
}

#[test]
fn git_asks_the_daemon_what_changed_and_misses_nothing() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/fsm"]);
    let wt_changes = |wt: &Path| {
        fs::write(wt.join("README.md"), "changed\n").unwrap();
        fs::write(wt.join("src/new.rs"), "new\n").unwrap();
        fs::remove_file(wt.join("build.sh")).unwrap();
        fs::rename(wt.join("src/lib"), wt.join("lib-moved")).unwrap();
        fs::remove_dir_all(wt.join("docs")).unwrap();
        fs::create_dir(wt.join("docs")).unwrap();
        fs::set_permissions(wt.join("src/main.rs"), fs::Permissions::from_mode(0o755)).unwrap();
    };
    {
        let m = env.mount();
        let wt = m.wt("repo", "fsm");
        assert_eq!(
            git(&wt, &["config", "core.fsmonitor"]).trim(),
            env.repo
                .path()
                .join(".git/worktreefs/fsmonitor-hook")
                .to_str()
                .unwrap()
        );
        // The source repository's own worktree is not affected.
        assert!(run("git", &["config", "core.fsmonitor"], &env.repo.path())
            .stdout
            .is_empty());
        assert_eq!(porcelain(&wt), "");
        wt_changes(&wt);
        let status = porcelain(&wt);
        assert_eq!(status, status_without_fsmonitor(&wt));
        for expect in [
            " M README.md",
            "?? src/new.rs",
            " D build.sh",
            " D src/lib/mod.rs",
            "?? lib-moved/mod.rs",
            " D docs/src-link",
            " M src/main.rs",
        ] {
            assert!(status.contains(expect), "missing {expect:?}:\n{status}");
        }

        // A file opened for writing before a query and written after it is reported by
        // that write: open, let git record the file as clean with a new token, then write.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(wt.join(".gitignore"))
            .unwrap();
        git(&wt, &["update-index", "-q", "--refresh"]);
        assert!(!porcelain(&wt).contains(".gitignore"));
        git(&wt, &["update-index", "-q", "--refresh"]);
        f.write_all(b"X").unwrap();
        f.flush().unwrap();
        assert!(
            porcelain(&wt).contains(" M .gitignore"),
            "{}",
            porcelain(&wt)
        );
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(b"t").unwrap(); // the original first byte
        drop(f);
        assert_eq!(porcelain(&wt), status_without_fsmonitor(&wt));
        assert!(!porcelain(&wt).contains(".gitignore"), "{}", porcelain(&wt));
    }
    // A new daemon does not know the old one's tokens: it answers from the upper layer.
    let m = env.mount();
    let wt = m.wt("repo", "fsm");
    assert_eq!(porcelain(&wt), status_without_fsmonitor(&wt));
    fs::write(wt.join("after-remount.txt"), "x").unwrap();
    assert!(porcelain(&wt).contains("?? after-remount.txt"));
    assert_eq!(porcelain(&wt), status_without_fsmonitor(&wt));
}

#[test]
fn lookup_counts_hold_across_listings_and_forgets() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/many"]);
    let m = env.mount();
    let wt = m.wt("repo", "many");
    let dir = wt.join("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..300 {
        fs::write(dir.join(format!("file-{i:03}")), format!("{i}")).unwrap();
    }
    for round in 0..3 {
        // Listings return attributes for every entry (several replies for 300 entries);
        // then the kernel drops what it cached and forgets the inodes.
        assert_eq!(names(&dir).len(), 300, "round {round}");
        assert_eq!(names(&wt.join("src")), vec!["lib", "main.rs"]);
        let _ = fs::write("/proc/sys/vm/drop_caches", "2");
        for i in (0..300).step_by(7) {
            let p = dir.join(format!("file-{i:03}"));
            assert_eq!(
                fs::read_to_string(&p).unwrap(),
                format!("{i}"),
                "round {round}"
            );
        }
        assert_eq!(
            fs::read_to_string(wt.join("src/lib/mod.rs")).unwrap(),
            "pub mod util;\n"
        );
    }
    assert_eq!(porcelain(&wt).lines().count(), 300);
    assert!(
        !m.log().contains("is not known"),
        "a node the kernel still had was dropped"
    );
}

#[test]
fn a_fresh_view_needs_no_directory_listing_for_git_status() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/untr"]);
    let m = env.mount();
    let wt = m.wt("repo", "untr");
    let before = m.stats();
    assert_eq!(status_default(&wt, false), "");
    let after = m.stats();
    // The untracked cache in the index written at creation answers for every directory.
    assert_eq!(
        after["readdirs"], before["readdirs"],
        "git listed directories: {after}"
    );
    // Untracked files appear, in new and in existing directories, collapsed as usual.
    fs::create_dir_all(wt.join("newdir/inner")).unwrap();
    fs::write(wt.join("newdir/inner/f"), "x").unwrap();
    fs::write(wt.join("src/lib/untracked.rs"), "x").unwrap();
    fs::write(wt.join("d0/d1/d2/deep-untracked"), "x").unwrap();
    fs::write(wt.join("ignored.o"), "x").unwrap();
    let status = status_default(&wt, false);
    assert_eq!(status, status_default(&wt, true));
    for expect in [
        "?? newdir/",
        "?? src/lib/untracked.rs",
        "?? d0/d1/d2/deep-untracked",
    ] {
        assert!(status.contains(expect), "missing {expect:?}:\n{status}");
    }
    assert!(!status.contains("ignored.o"), "{status}");
    // Removing them, and a change to an ignore file, are seen too.
    fs::remove_dir_all(wt.join("newdir")).unwrap();
    fs::write(wt.join(".gitignore"), "target/\n").unwrap();
    let status = status_default(&wt, false);
    assert_eq!(status, status_default(&wt, true));
    assert!(
        status.contains("?? ignored.o") && !status.contains("newdir"),
        "{status}"
    );
}

/// Every tracked file's stat data as the worktree's index records it (`git ls-files
/// --debug`): path -> (ctime, mtime, ino (32 bits), uid, gid, size).
fn index_stat_data(wt: &Path) -> std::collections::BTreeMap<String, [u64; 6]> {
    let out = git(wt, &["-c", "core.quotePath=false", "ls-files", "--debug"]);
    let mut map = std::collections::BTreeMap::new();
    let mut lines = out.lines().peekable();
    while let Some(path) = lines.next() {
        let mut nums = Vec::new();
        while let Some(l) = lines.peek().filter(|l| l.starts_with(' ')) {
            for (k, v) in l
                .split_whitespace()
                .collect::<Vec<_>>()
                .chunks(2)
                .map(|c| (c[0], c[1]))
            {
                if matches!(k, "ctime:" | "mtime:") {
                    nums.push(v.split(':').next().unwrap().parse::<u64>().unwrap());
                } else if matches!(k, "ino:" | "uid:" | "gid:" | "size:") {
                    nums.push(v.parse::<u64>().unwrap());
                }
            }
            lines.next();
        }
        map.insert(path.to_string(), nums.try_into().unwrap());
    }
    map
}

/// Walks `wt` as `ls -lR` does (lists each directory, then stats each entry by its path)
/// and returns every file's stat data in the form of [`index_stat_data`]; checks that
/// each entry's inode in the listing is the one stat gives.
fn walk_stat_data(wt: &Path) -> std::collections::BTreeMap<String, [u64; 6]> {
    let mut seen = std::collections::BTreeMap::new();
    let mut dirs = vec![String::new()];
    while let Some(rel) = dirs.pop() {
        for e in fs::read_dir(wt.join(&rel)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let meta = fs::symlink_metadata(e.path()).unwrap();
            assert_eq!(
                e.ino(),
                meta.ino(),
                "{path}: the listing's inode is not stat's"
            );
            if meta.is_dir() {
                dirs.push(path);
            } else if path != ".git" {
                let data = [
                    meta.ctime() as u64,
                    meta.mtime() as u64,
                    meta.ino() & 0xffff_ffff,
                    meta.uid() as u64,
                    meta.gid() as u64,
                    meta.size(),
                ];
                seen.insert(path, data);
            }
        }
    }
    seen
}

#[test]
fn a_listing_brings_each_entrys_attributes_exactly_as_the_index_recorded() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/plus"]);
    let lookups = |m: &Mounted| m.stats()["lookups"].as_u64().unwrap();
    let m = env.mount();
    let wt = m.wt("repo", "plus");
    let mut index = index_stat_data(&wt);
    // Walked through an open descriptor of the worktree, so no path walk passes the
    // repository's directory (whose entry lives 1 s) and looks it up again.
    let top = fs::File::open(&wt).unwrap();
    let at = Path::new("/proc/self/fd").join(top.as_raw_fd().to_string());
    let before = lookups(&m);
    let seen = walk_stat_data(&at);
    let looked_up = lookups(&m) - before;
    // A submodule's entry is a directory in the view (as in a checkout).
    index.retain(|path, _| !fs::symlink_metadata(wt.join(path)).unwrap().is_dir());
    assert_eq!(
        seen, index,
        "stat data after a listing differs from the index's"
    );
    // The listings came with the entries' attributes (READDIRPLUS): no name of the view
    // was looked up. (Reading `.control/stats` looks up `.control` and `stats`, whose
    // entries live 0 s: those two, against one per entry without READDIRPLUS.)
    assert_eq!(looked_up, 2, "the walk looked names up");
    // The kernel holds every entry it was given: each is still known to the daemon.
    assert_eq!(
        fs::read_to_string(wt.join("src/lib/util.rs")).unwrap(),
        "pub fn one() -> u32 { 1 }\n"
    );
    assert_eq!(status_without_fsmonitor(&wt), "");
    assert!(
        !m.log().contains("is not known"),
        "a node the kernel still had was dropped:\n{}",
        m.log()
    );
    drop(m);

    // Without READDIRPLUS the same walk looks every name up, and sees the same.
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/plain"]);
    let m = env.mount_with(&["--no-readdirplus"]);
    let wt = m.wt("repo", "plain");
    let mut index = index_stat_data(&wt);
    let before = lookups(&m);
    let seen = walk_stat_data(&wt);
    let looked_up = lookups(&m) - before;
    index.retain(|path, _| !fs::symlink_metadata(wt.join(path)).unwrap().is_dir());
    assert_eq!(seen, index);
    assert!(
        looked_up >= index.len() as u64,
        "{looked_up} lookups for {} files",
        index.len()
    );
}

#[test]
fn a_listing_longer_than_one_reply_leaves_no_inode_behind() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/long"]);
    let m = env.mount();
    let wt = m.wt("repo", "long");
    let dir = wt.join("long");
    fs::create_dir(&dir).unwrap();
    for i in 0..1500 {
        fs::write(
            dir.join(format!("a-name-long-enough-to-fill-replies-{i:05}")),
            "x",
        )
        .unwrap();
    }
    let nodes = || m.stats()["nodes"].as_u64().unwrap();
    // The kernel forgets every inode nobody uses (this needs root); the daemon's count
    // then stops moving (forgets arrive in the background): the same three times in a row.
    let settled = || {
        fs::write("/proc/sys/vm/drop_caches", "2").expect("dropping the kernel's caches");
        let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = vec![nodes()];
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            seen.push(nodes());
            let n = seen.len();
            if n >= 3 && seen[n - 3..].iter().all(|&c| c == seen[n - 1]) {
                return seen[n - 1];
            }
            assert!(std::time::Instant::now() < end, "never settled: {seen:?}");
        }
    };
    let before = settled();
    // 1,500 entries take several replies. Each entry is stat'ed as the listing goes, as
    // `ls -l` would, so every reply after the first carries attributes too (the kernel
    // turns READDIRPLUS back on for a directory whose names were looked at); each such
    // reply ends with an entry that did not fit, whose lookup the daemon gives back.
    let mut listed = 0;
    for e in fs::read_dir(&dir).unwrap() {
        fs::symlink_metadata(e.unwrap().path()).unwrap();
        listed += 1;
    }
    assert_eq!(listed, 1500);
    assert_eq!(
        settled(),
        before,
        "a listing left inodes behind that the kernel does not hold"
    );
    assert!(!m.log().contains("is not known"), "{}", m.log());
}

#[test]
fn a_file_whose_attributes_cannot_be_read_is_listed_and_its_stat_fails() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/broken"]);
    // README.md's blob is gone from the object database, and no cached index tells its
    // size: its attributes cannot be had.
    let repo = env.repo.path();
    let oid = git(&repo, &["rev-parse", "HEAD:README.md"]);
    let oid = oid.trim();
    let object = repo.join(".git/objects").join(&oid[..2]).join(&oid[2..]);
    fs::remove_file(&object).expect("the fixture's blob is a loose object");
    fs::remove_dir_all(env.state().join("index-cache")).unwrap();
    let m = env.mount();
    let wt = m.wt("repo", "broken");
    // Listed as without READDIRPLUS (a walk must not skip it without a word), and its
    // stat gives the error.
    let listed = names(&wt);
    assert!(listed.contains(&"README.md".to_string()), "{listed:?}");
    assert!(listed.contains(&"build.sh".to_string()), "{listed:?}");
    let err = fs::symlink_metadata(wt.join("README.md")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(
        fs::read_to_string(wt.join("src/lib/util.rs")).unwrap(),
        "pub fn one() -> u32 { 1 }\n"
    );
}

#[test]
fn a_write_through_a_hard_link_is_a_change_at_every_name_git_watches() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/ln"]);
    let m = env.mount_with(&["--linger", "600"]);
    let wt = m.wt("repo", "ln");
    // git trusts README.md (fsmonitor-valid), a second name of a file first known by
    // another (the view's node is named `other`); that name gets a same-size edit and
    // goes. The hook must report README.md too, or git would call the edit clean.
    run_ok(
        "sh",
        &[
            "-c",
            "mv README.md other && ln other README.md && git status --porcelain >/dev/null && \
             git status --porcelain >/dev/null && \
             printf '# TEST REPOSITORY\\n' | dd of=other conv=notrunc status=none && rm other",
        ],
        &wt,
    );
    // (git with its fsmonitor first: without, it would look at every file and mend it.)
    assert_eq!(status_default(&wt, false), " M README.md\n");
    assert_eq!(status_without_fsmonitor(&wt), " M README.md\n");
    wait_for_state(&env, "ln", "lingering", std::time::Duration::from_secs(10));
    let out = wtfs(&env.state(), &["reclaim", "repo/ln"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("modified README.md"),
        "{out:?}"
    );
    drop(m);
}

/// `mount --json` (a background mount) says where it mounted, which daemon serves it and
/// the repositories registered, as one JSON object on stdout; a refused mount is JSON too.
#[test]
fn mount_answers_json_with_where_and_which_daemon() {
    let env = Env::new();
    let mp = env.mountpoint();
    fs::create_dir_all(&mp).unwrap();
    let o = wtfs(&env.state(), &["mount", mp.to_str().unwrap(), "--json"]);
    let _g = UnmountOnDrop {
        state: env.state(),
        mountpoint: mp.clone(),
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    let canonical = fs::canonicalize(&mp).unwrap();
    assert_eq!(v["mountpoint"], canonical.to_str().unwrap(), "{v}");
    assert_eq!(v["state_dir"], env.state().to_str().unwrap(), "{v}");
    let pid = v["pid"].as_u64().unwrap_or_else(|| panic!("{v}"));
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("mount"),
        "pid {pid} is not the daemon: {}",
        String::from_utf8_lossy(&cmdline)
    );
    assert_eq!(v["repos"][0]["repo"], "repo", "{v}");
    assert!(v.get("registered").is_some(), "{v}");
    // A second mount of the same state dir is refused, as JSON.
    let other = env.dir.path().join("mnt2");
    fs::create_dir_all(&other).unwrap();
    let o = wtfs(&env.state(), &["mount", other.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["error"], "failed", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("is served already, by daemon pid"),
        "{v}"
    );
    // A foreground daemon reports readiness to systemd, not as JSON.
    let o = wtfs(&env.state(), &["mount", "--foreground", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!is_mounted(&other));
}
