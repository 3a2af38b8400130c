//! The operations programs expect beyond the common ones, in a worktree as on the
//! machine's own filesystem: on a range of an open file, `fallocate` (allocate, keep size,
//! punch a hole, zero a range; a base file copied up first), `lseek` to data and to a hole
//! (base, upper and sparse files), and `copy_file_range` (from a base file and from an
//! upper one); files with no name (`O_TMPFILE`, linked into the tree after); `user.`
//! attributes. The same script runs in a view and in a plain directory holding the same
//! files; their outputs must agree.

use std::path::Path;

use crate::common::*;

/// What the script says of the files below `dir`, which holds README.md (a base file in a
/// view) as the repository has it.
fn probe(dir: &Path) -> String {
    run_ok(
        "python3",
        &[
            "-c",
            r#"
import hashlib, os
out = []
def st(p):
    s = os.stat(p)
    return f"{p} size={s.st_size} blocks>0={s.st_blocks > 0}"
# fallocate: a new file, mode 0 and keep-size; a hole punched, a range zeroed.
fd = os.open("alloc", os.O_CREAT | os.O_RDWR, 0o644)
os.posix_fallocate(fd, 0, 1 << 20)
out.append(st("alloc"))
os.close(fd)
os.system("fallocate -n -o 0 -l 65536 README.md")  # keep size, on a base file
out.append(st("README.md"))
with open("README.md", "rb") as f:
    out.append(f"README.md sha1={hashlib.sha1(f.read()).hexdigest()}")
with open("punch", "wb") as f:
    f.write(b"x" * 65536)
assert os.system("fallocate -p -o 4096 -l 8192 punch") == 0
assert os.system("fallocate -z -o 20000 -l 100 punch") == 0
with open("punch", "rb") as f:
    d = f.read()
out.append(f"punch len={len(d)} zeros={d.count(0)} at4096={d[4096]} at20050={d[20050]}")
# lseek to data and to a hole.
def seeks(p):
    fd = os.open(p, os.O_RDONLY)
    r = []
    for whence, name in ((os.SEEK_DATA, "data"), (os.SEEK_HOLE, "hole")):
        for off in (0, 4096, 1 << 22):
            try:
                r.append(f"{name}@{off}={os.lseek(fd, off, whence)}")
            except OSError as e:
                r.append(f"{name}@{off}=errno{e.errno}")
    os.close(fd)
    return f"{p}: " + " ".join(r)
with open("sparse", "wb") as f:
    f.truncate(1 << 21)
    f.seek(1 << 20)
    f.write(b"data")
out.append(seeks("sparse"))
out.append(seeks("punch"))
out.append(seeks("base-seek"))
# copy_file_range from a base file and from an upper one.
for src, dst in (("base-copy", "copy1"), ("punch", "copy2")):
    fi = os.open(src, os.O_RDONLY)
    fo = os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644)
    n = 0
    while True:
        c = os.copy_file_range(fi, fo, 1 << 20)
        if c == 0:
            break
        n += c
    os.close(fi)
    os.close(fo)
    a = open(src, "rb").read()
    b = open(dst, "rb").read()
    out.append(f"{src}->{dst} copied={n} same={a == b}")
print("\n".join(out))
"#,
        ],
        dir,
    )
}

/// What the Python `script` prints in the view `view`, which must be what it prints in the
/// plain directory `plain`.
fn agreeing(script: &str, view: &Path, plain: &Path) -> String {
    let here = run_ok("python3", &["-c", script], view);
    let there = run_ok("python3", &["-c", script], plain);
    assert_eq!(
        here, there,
        "in the view:\n{here}\non the machine's filesystem:\n{there}"
    );
    here
}

#[test]
fn ranges_in_a_view_behave_as_on_the_machines_filesystem() {
    let env = Env::new();
    let repo = env.repo.path();
    // Two more base files: one to seek in, one to copy from.
    std::fs::write(repo.join("base-seek"), vec![b'a'; 10_000]).unwrap();
    std::fs::write(repo.join("base-copy"), vec![b'b'; 300_000]).unwrap();
    git(&repo, &["add", "base-seek", "base-copy"]);
    git(&repo, &["commit", "-qm", "ranges"]);
    wtfs_ok(&env.state(), &["new", "repo/r"]);
    let m = env.mount();
    let view = m.wt("repo", "r");
    let plain = tempfile::tempdir().unwrap();
    for f in ["README.md", "base-seek", "base-copy"] {
        std::fs::copy(repo.join(f), plain.path().join(f)).unwrap();
    }
    let there = probe(plain.path());
    let here = probe(&view);
    assert_eq!(
        here, there,
        "in the view:\n{here}\non the machine's filesystem:\n{there}"
    );
    // git sees the fallocated base file as it is.
    let status = run_ok("git", &["status", "--porcelain"], &view);
    assert!(status.contains("alloc"), "{status}");
    drop(m);
}

/// `user.` attributes in a view (mounted with `--xattr`) as on the machine's own
/// filesystem: set on a base file
/// (copied up for it), a new file and a directory, read, listed, replaced, removed, and
/// refused on a symlink; `trusted.` and `security.` are never written for a caller (the
/// daemon would write them as root), where ext4 lets root write them.
#[test]
fn user_attributes_in_a_view_behave_as_on_the_machines_filesystem() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/x"]);
    let m = env.mount_with(&["--xattr"]);
    let view = m.wt("repo", "x");
    let plain = tempfile::tempdir().unwrap();
    std::fs::copy(
        env.repo.path().join("README.md"),
        plain.path().join("README.md"),
    )
    .unwrap();
    let script = r#"
import errno, os
out = []
def tryit(what, f):
    try:
        r = f()
        out.append(f"{what}: {r!r}")
    except OSError as e:
        out.append(f"{what}: {errno.errorcode[e.errno]}")
open("new", "w").write("n")
os.mkdir("dir")
os.symlink("new", "link")
for p in ("README.md", "new", "dir"):
    tryit(f"get {p} none", lambda: os.getxattr(p, "user.k"))
    tryit(f"list {p} none", lambda: os.listxattr(p))
    tryit(f"set {p}", lambda: os.setxattr(p, "user.k", b"v1"))
    tryit(f"create {p} again", lambda: os.setxattr(p, "user.k", b"v2", os.XATTR_CREATE))
    tryit(f"replace {p}", lambda: os.setxattr(p, "user.k", b"v3", os.XATTR_REPLACE))
    tryit(f"set2 {p}", lambda: os.setxattr(p, "user.big", b"x" * 3000))
    tryit(f"get {p}", lambda: os.getxattr(p, "user.k"))
    tryit(f"list {p}", lambda: sorted(os.listxattr(p)))
    tryit(f"remove {p}", lambda: os.removexattr(p, "user.k"))
    tryit(f"remove {p} again", lambda: os.removexattr(p, "user.k"))
    tryit(f"list {p} after", lambda: sorted(os.listxattr(p)))
tryit("set on a symlink", lambda: os.setxattr("link", "user.k", b"v", follow_symlinks=False))
tryit("get other namespace", lambda: os.getxattr("new", "trusted.nope"))
print("\n".join(out))
"#;
    agreeing(script, &view, plain.path());
    // Never written for a caller, though ext4 lets root write them.
    let refused = run_ok(
        "python3",
        &[
            "-c",
            r#"
import errno, os
for name in ("trusted.k", "security.k"):
    try:
        os.setxattr("new", name, b"v")
        print(name, "set")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
"#,
        ],
        &view,
    );
    assert_eq!(refused, "trusted.k EPERM\nsecurity.k EPERM\n");
    // The attributes stay across a remount.
    drop(m);
    let m = env.mount_with(&["--xattr"]);
    let kept = run_ok(
        "python3",
        &["-c", "import os; print(sorted(os.listxattr('dir')))"],
        &m.wt("repo", "x"),
    );
    assert_eq!(kept.trim(), "['user.big']");
    drop(m);
}

/// `O_TMPFILE` in a view as on the machine's own filesystem: a file with no name, in a
/// directory of the base and in a new one, written, then linked into the tree through
/// `/proc/self/fd` (and linked a second time); with `O_EXCL` no link can name it; one
/// never linked leaves nothing behind, in the view or in the upper layer.
#[test]
fn files_with_no_name_in_a_view_behave_as_on_the_machines_filesystem() {
    let env = Env::new();
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let view = m.wt("repo", "t");
    let plain = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(plain.path().join("src/lib")).unwrap();
    for f in ["src/lib/mod.rs", "src/lib/util.rs"] {
        std::fs::copy(repo.join(f), plain.path().join(f)).unwrap();
    }
    let script = r#"
import errno, os
out = []
proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
def link(fd, to):
    try:
        os.link(f"self/fd/{fd}", to, src_dir_fd=proc, follow_symlinks=True)
        return "linked"
    except OSError as e:
        return errno.errorcode[e.errno]
os.mkdir("new")
for d in ("src/lib", "new"):
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o640)
    os.write(fd, b"made with no name")
    st = os.fstat(fd)
    out.append(f"{d}: nlink={st.st_nlink} mode={oct(st.st_mode)} size={st.st_size}")
    out.append(f"{d}: listed {sorted(os.listdir(d))}")
    out.append(f"{d}: {link(fd, f'{d}/named')} nlink={os.fstat(fd).st_nlink}")
    os.write(fd, b", then named")
    out.append(f"{d}: reads {open(f'{d}/named', 'rb').read()!r}")
    out.append(f"{d}: again {link(fd, f'{d}/again')} nlink={os.stat(f'{d}/named').st_nlink}")
    out.append(f"{d}: onto a name {link(fd, f'{d}/named')}")
    os.close(fd)
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
    out.append(f"{d}: exclusive {link(fd, f'{d}/excl')}")
    os.close(fd)
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.write(fd, b"dropped")
    os.close(fd)
    out.append(f"{d}: listed at the end {sorted(os.listdir(d))}")
print("\n".join(out))
"#;
    let here = agreeing(script, &view, plain.path());
    assert!(here.contains("src/lib: linked nlink=1"), "{here}");
    // git sees the named files; the others left nothing, after a remount too.
    let status = run_ok("git", &["status", "--porcelain", "-uall"], &view);
    assert_eq!(
        status, "?? new/again\n?? new/named\n?? src/lib/again\n?? src/lib/named\n",
        "{status}"
    );
    drop(m);
    let m = env.mount();
    let listed = run_ok(
        "find",
        &["src/lib", "new", "-type", "f"],
        &m.wt("repo", "t"),
    );
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "new/again",
            "new/named",
            "src/lib/again",
            "src/lib/mod.rs",
            "src/lib/named",
            "src/lib/util.rs"
        ]
    );
    drop(m);
}

/// A file with no name open for writing is no path git should look at: the fsmonitor's
/// answer while it is open does not name its directory (which would have git look at
/// everything below it at each status).
#[test]
fn a_file_with_no_name_is_no_path_for_the_fsmonitor() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let m = env.mount();
    let view = m.wt("repo", "t");
    let control = m.mountpoint.join(".control/fsmonitor");
    let script = r#"
import os, sys
q = sys.argv[1]
token = open(q + "@none", "rb").read().split(b"\0")[0].decode()
fd = os.open("src/lib", os.O_TMPFILE | os.O_WRONLY, 0o600)
os.write(fd, b"written with no name")
answer = open(q + "@" + token, "rb").read().split(b"\0")[1:]
os.close(fd)
print(sorted(p.decode() for p in answer if p))
"#;
    let out = run_ok(
        "python3",
        &["-c", script, control.join("repo:t").to_str().unwrap()],
        &view,
    );
    assert!(!out.contains("'src/lib/'"), "{out}");
    drop(m);
}
