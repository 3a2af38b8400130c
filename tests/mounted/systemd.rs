//! Running under systemd: a `Type=notify` unit learns the mount is ready from the daemon
//! (READY=1 and its pid on $NOTIFY_SOCKET), only once the mount answers.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::common::*;

#[test]
fn the_foreground_daemon_tells_systemd_when_the_mount_is_ready() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let sock_path = env.dir.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // In the daemon's environment only: this process's is shared by every test of the
    // harness, which run processes of their own meanwhile.
    let m = Mounted::start_with_envs(
        &env.state(),
        &env.mountpoint(),
        &["--linger", "600"],
        &[("NOTIFY_SOCKET", sock_path.as_os_str())],
    );
    let mut buf = [0u8; 512];
    let n = sock
        .recv(&mut buf)
        .expect("no readiness message within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    let status: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["status", "--json"])).unwrap();
    let pid = status["daemon_pid"].as_i64().unwrap();
    assert!(
        msg.lines().any(|l| l == format!("MAINPID={pid}")),
        "{msg} (daemon pid {pid})"
    );
    // Sent once the mount answers: by now it does.
    assert!(std::fs::read_dir(m.wt("repo", "t")).is_ok());
    drop(m);
}

/// The units run the binary where the README's install puts it (`cargo install --path .
/// --root /usr/local` for the system unit, `cargo install --path .` into ~/.cargo/bin for
/// the user unit), stop as a planned restart (named leases kept), and `systemd-analyze
/// verify` passes with the binary installed there: in a mount namespace of the test's own,
/// so nothing of the machine's /usr/local changes. Without the binary it fails, so the
/// check can fail.
#[test]
fn the_units_verify_where_the_readmes_install_puts_the_binary() {
    let top = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(top.join("README.md")).unwrap();
    assert!(
        readme.contains("cargo install --path . --root /usr/local"),
        "README"
    );
    let system = top.join("contrib/systemd/worktreefs.service");
    let user = top.join("contrib/systemd/worktreefs-user.service");
    let unit = std::fs::read_to_string(&system).unwrap();
    assert!(
        unit.contains("\nExecStart=/usr/local/bin/worktreefs mount "),
        "{unit}"
    );
    assert!(unit.contains("unmount --keep-sessions"), "{unit}");
    let unit = std::fs::read_to_string(&user).unwrap();
    assert!(
        unit.contains("\nExecStart=%h/.cargo/bin/worktreefs mount "),
        "{unit}"
    );
    assert!(unit.contains("unmount --keep-sessions"), "{unit}");
    if run(
        "sh",
        &["-c", "command -v systemd-analyze"],
        std::path::Path::new("/"),
    )
    .stdout
    .is_empty()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "systemd-analyze is missing under CI: .ci/run installs systemd"
        );
        eprintln!("skipped: no systemd-analyze on this machine");
        return;
    }
    // The system unit, with /usr/local/bin/worktreefs installed (a tmpfs over
    // /usr/local/bin, in this command's own mount namespace).
    let verify_system = |install: bool| {
        let script = format!(
            "mount -t tmpfs tmpfs /usr/local/bin && {} systemd-analyze verify '{}'",
            if install {
                format!("cp '{BIN}' /usr/local/bin/worktreefs &&")
            } else {
                String::new()
            },
            system.display()
        );
        run(
            "unshare",
            &["-m", "sh", "-c", &script],
            std::path::Path::new("/"),
        )
    };
    let out = verify_system(true);
    assert!(out.status.success(), "{out:?}");
    let out = verify_system(false);
    assert!(
        !out.status.success(),
        "verify passed without the binary: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/usr/local/bin/worktreefs"),
        "{out:?}"
    );
    // The user unit, for a user whose home has ~/.cargo/bin/worktreefs.
    let home = tempfile::tempdir().unwrap();
    let runtime = home.path().join("run");
    std::fs::create_dir_all(home.path().join(".cargo/bin")).unwrap();
    std::fs::create_dir(&runtime).unwrap();
    std::fs::copy(BIN, home.path().join(".cargo/bin/worktreefs")).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["--user", "verify"])
        .arg(&user)
        .env("HOME", home.path())
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
