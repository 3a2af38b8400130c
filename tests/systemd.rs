//! Running under systemd: a `Type=notify` unit learns the mount is ready from the daemon
//! (READY=1 and its pid on $NOTIFY_SOCKET), only once the mount answers.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use common::*;

#[test]
fn the_foreground_daemon_tells_systemd_when_the_mount_is_ready() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let sock_path = env.dir.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The daemon inherits it (this test binary runs this one test only).
    std::env::set_var("NOTIFY_SOCKET", &sock_path);
    let m = env.mount();
    std::env::remove_var("NOTIFY_SOCKET");
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
