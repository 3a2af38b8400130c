//! The mount helper's command line: `-o` option lists and mount(8)'s argument order
//! translated into the flags `mount` takes.

use std::path::Path;

/// The `-o` options `mount` takes (as `mount.fuse3` and fstab give them), each with the
/// flag it stands for; `=` after a name: it takes a value.
pub const MOUNT_OPTIONS: &[(&str, &str)] = &[
    ("allow_other", "--allow-other"),
    ("threads=", "--threads"),
    ("linger=", "--linger"),
    ("cache_nodes=", "--cache-nodes"),
    ("no_passthrough", "--no-passthrough"),
    ("no_readdirplus", "--no-readdirplus"),
    ("uring=", "--uring"),
    ("yield_cpu=", "--yield-cpu"),
    ("xattr", "--xattr"),
    ("filter_timeout=", "--filter-timeout"),
    ("inspect_timeout=", "--inspect-timeout"),
    ("keep_removed=", "--keep-removed"),
    ("keep_min_free_percent=", "--keep-min-free-percent"),
    ("keep_min_free_gib=", "--keep-min-free-gib"),
    ("state_dir=", "--state-dir"),
    ("log_level=", "--log-level"),
    ("umount_keeps_sessions", "--umount-keeps-sessions"),
];

/// Options mount(8) and fstab pass that mean nothing here (or what worktreefs always
/// does: nosuid, nodev): accepted and ignored.
pub fn generic_mount_option(o: &str) -> bool {
    matches!(
        o,
        "rw" | "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "user"
            | "users"
            | "nouser"
            | "_netdev"
            | "nosuid"
            | "nodev"
            | "exec"
            | "noexec"
            | "atime"
            | "noatime"
            | "relatime"
            | "default_permissions"
    ) || o.starts_with("x-")
        || o.starts_with("comment=")
}

/// One `-o` list as the flags it stands for.
pub fn mount_option_flags(list: &str) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    for o in list.split(',').filter(|o| !o.is_empty()) {
        if generic_mount_option(o) {
            continue;
        }
        if o == "ro" {
            return Err("mount option 'ro': a worktreefs mount is always read-write (worktrees are for writing); leave it out".into());
        }
        let (key, value) = match o.split_once('=') {
            Some((k, v)) => (format!("{k}="), Some(v)),
            None => (o.to_string(), None),
        };
        let Some((_, flag)) = MOUNT_OPTIONS.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = MOUNT_OPTIONS
                .iter()
                .map(|(k, _)| k.trim_end_matches('='))
                .collect();
            return Err(format!(
                "unknown mount option '{o}'; worktreefs takes {} (and ignores mount(8)'s generic ones: rw, defaults, noauto, nofail, x-…)",
                known.join(", ")
            ));
        };
        flags.push(flag.to_string());
        if let Some(v) = value {
            if v.is_empty() {
                return Err(format!("mount option '{o}' needs a value"));
            }
            flags.push(v.to_string());
        }
    }
    Ok(flags)
}

/// The command line as clap should read it. `mount -o LIST` (and `-oLIST`) becomes the
/// flags it stands for. Run as a mount helper — as `mount.fuse.worktreefs` (or
/// `mount.worktreefs`), which mount(8) runs for `-t fuse.worktreefs` and fstab lines, or
/// as `worktreefs SOURCE MOUNTPOINT [-o …]`, as `mount.fuse3` runs a filesystem — the
/// arguments are `SOURCE MOUNTPOINT [-o LIST] [-s -f -n -v -w] [-t TYPE]`, SOURCE the
/// state directory (`worktreefs` or `none`: the default one).
pub fn mount_command_line(
    args: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, String> {
    use std::ffi::OsString;
    let Some(argv0) = args.first().cloned() else {
        return Ok(args);
    };
    let base = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let helper_name = base == "mount.fuse.worktreefs" || base == "mount.worktreefs";
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let as_mount_fuse = first
        .as_deref()
        .is_some_and(|f| (f.starts_with('/') || f.starts_with('.')) && args.len() >= 3);
    let mut out: Vec<OsString> = vec![argv0];
    let mut rest = args.into_iter().skip(1).peekable();
    if helper_name || as_mount_fuse {
        let (Some(source), Some(mountpoint)) = (rest.next(), rest.next()) else {
            return Err("as a mount helper: SOURCE MOUNTPOINT [-o OPTIONS] (SOURCE: the state directory, or `worktreefs` for the default one)".into());
        };
        out.push("mount".into());
        out.push(mountpoint);
        if source != "worktreefs" && source != "none" {
            out.push("--state-dir".into());
            out.push(source);
        }
        while let Some(a) = rest.next() {
            let a = a.to_string_lossy().into_owned();
            match a.as_str() {
                // mount(8)'s own: sloppy, fake, no mtab, verbose, read-write.
                "-s" | "-f" | "-n" | "-v" | "-w" => {}
                "-r" => return Err("mount option 'ro': a worktreefs mount is always read-write; leave it out".into()),
                "-t" => {
                    rest.next();
                }
                "-N" => return Err("mount -N (another mount namespace) is not supported: run the mount inside that namespace".into()),
                "-o" => {
                    let list = rest.next().ok_or("-o needs a list of options")?;
                    for f in mount_option_flags(&list.to_string_lossy())? {
                        out.push(f.into());
                    }
                }
                o if o.starts_with("-o") => {
                    for f in mount_option_flags(&o[2..])? {
                        out.push(f.into());
                    }
                }
                other => return Err(format!("as a mount helper: unexpected argument '{other}'")),
            }
        }
        return Ok(out);
    }
    // `worktreefs [GLOBAL…] mount … -o LIST …`: the options after `mount` expanded.
    let mut in_mount = false;
    while let Some(a) = rest.next() {
        let s = a.to_string_lossy().into_owned();
        if !in_mount {
            in_mount = s == "mount";
            out.push(a);
            continue;
        }
        if s == "--" {
            out.push(a);
            out.extend(rest);
            break;
        }
        if s == "-o" {
            let list = rest.next().ok_or("mount -o needs a list of options")?;
            out.extend(
                mount_option_flags(&list.to_string_lossy())?
                    .into_iter()
                    .map(OsString::from),
            );
        } else if let Some(list) = s.strip_prefix("-o") {
            out.extend(mount_option_flags(list)?.into_iter().map(OsString::from));
        } else {
            out.push(a);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Result<Vec<String>, String> {
        mount_command_line(args.iter().map(std::ffi::OsString::from).collect())
            .map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    /// mount.fuse3's conventions: `-o` lists, the helper's argument order, fstab's options.
    #[test]
    fn mount_options_and_the_helpers_arguments_become_flags() {
        let ok = |args: &[&str], want: &[&str]| assert_eq!(line(args).unwrap(), want, "{args:?}");
        ok(
            &[
                "worktreefs",
                "mount",
                "/m",
                "-o",
                "allow_other,linger=3",
                "-othreads=4",
            ],
            &[
                "worktreefs",
                "mount",
                "/m",
                "--allow-other",
                "--linger",
                "3",
                "--threads",
                "4",
            ],
        );
        ok(
            &[
                "worktreefs",
                "--state-dir",
                "/s",
                "mount",
                "-o",
                "rw,nofail,x-systemd.after=x",
            ],
            &["worktreefs", "--state-dir", "/s", "mount"],
        );
        ok(&["worktreefs", "list", "-o"], &["worktreefs", "list", "-o"]);
        ok(
            &[
                "/sbin/mount.fuse.worktreefs",
                "/var/lib/wt",
                "/mnt/wt",
                "-n",
                "-o",
                "rw,allow_other,threads=3",
            ],
            &[
                "/sbin/mount.fuse.worktreefs",
                "mount",
                "/mnt/wt",
                "--state-dir",
                "/var/lib/wt",
                "--allow-other",
                "--threads",
                "3",
            ],
        );
        ok(
            &[
                "mount.worktreefs",
                "worktreefs",
                "/mnt/wt",
                "-t",
                "fuse.worktreefs",
            ],
            &["mount.worktreefs", "mount", "/mnt/wt"],
        );
        ok(
            &["worktreefs", "/var/lib/wt", "/mnt/wt", "-o", "linger=1"],
            &[
                "worktreefs",
                "mount",
                "/mnt/wt",
                "--state-dir",
                "/var/lib/wt",
                "--linger",
                "1",
            ],
        );
        for (args, want) in [
            (
                &["worktreefs", "mount", "-o", "bogus"][..],
                "unknown mount option 'bogus'",
            ),
            (&["worktreefs", "mount", "-o", "ro"], "always read-write"),
            (&["worktreefs", "mount", "-o", "linger="], "needs a value"),
            (&["mount.fuse.worktreefs", "/s"], "SOURCE MOUNTPOINT"),
            (
                &["mount.fuse.worktreefs", "/s", "/m", "-N", "1"],
                "namespace",
            ),
        ] {
            let e = line(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
