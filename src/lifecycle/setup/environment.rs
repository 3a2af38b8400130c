//! The environment a setup or teardown command starts with: its owner's.

use std::fs;

/// The environment a setup command starts with: the owner's, not the daemon's. `HOME`,
/// `SHELL`, `USER` and `LOGNAME` from the password database, the plain assignments of
/// `/etc/environment` (as pam_env reads them at a login; `PATH` from there, else the
/// usual one), and nothing else of this process's.
pub fn owner_environment(uid: u32) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: &str, v: String| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v));
    };
    if let Ok(text) = fs::read_to_string("/etc/environment") {
        for (k, v) in parse_environment(&text) {
            set(&mut env, &k, v);
        }
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        set(
            &mut env,
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        );
    }
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => {
            set(&mut env, "HOME", u.dir.display().to_string());
            set(&mut env, "SHELL", u.shell.display().to_string());
            set(&mut env, "USER", u.name.clone());
            set(&mut env, "LOGNAME", u.name);
        }
        _ => set(&mut env, "HOME", "/".into()),
    }
    env
}

/// `/etc/environment`'s assignments: `KEY=VALUE` lines, a value optionally in quotes;
/// comments, blank lines and anything else (no shell runs it) skipped.
fn parse_environment(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("export ").unwrap_or(line);
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            let valid = !k.is_empty()
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return None;
            }
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_environment_is_read_as_pam_env_reads_it() {
        let text = "# a comment\nPATH=\"/opt/bin:/usr/bin\"\nLANG=C.UTF-8\nexport EDITOR='vi'\n1BAD=x\nnot a line\nA-B=c\n";
        assert_eq!(
            parse_environment(text),
            vec![
                ("PATH".to_string(), "/opt/bin:/usr/bin".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("EDITOR".to_string(), "vi".to_string()),
            ]
        );
    }

    #[test]
    fn the_owners_environment_names_their_home_and_nothing_of_ours() {
        let env = owner_environment(0);
        assert!(
            env.iter().any(|(k, v)| k == "HOME" && v == "/root"),
            "{env:?}"
        );
        assert!(env.iter().any(|(k, _)| k == "PATH"));
        // This process's own variables are not passed on.
        assert!(!env.iter().any(|(k, _)| k == "CARGO_PKG_NAME"), "{env:?}");
    }
}
