//! The ports something listens on (TCP) or is bound to (UDP) now, which no block given
//! may hold.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

/// The ports something listens on (TCP) or is bound to (UDP), as `/proc/net` lists
/// them.
pub(super) fn listening_ports() -> HashSet<u16> {
    let mut out = HashSet::new();
    for (file, tcp) in [
        ("tcp", true),
        ("tcp6", true),
        ("udp", false),
        ("udp6", false),
    ] {
        let Ok(text) = fs::read_to_string(Path::new("/proc/net").join(file)) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(st)) = (f.get(1), f.get(3)) else {
                continue;
            };
            // TCP: only a socket in LISTEN (0A); UDP: any bound socket.
            if tcp && *st != "0A" {
                continue;
            }
            if let Some(port) = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                out.insert(port);
            }
        }
    }
    out
}
