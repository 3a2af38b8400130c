//! What a snapshot takes: the include patterns (`.worktreeinclude`, `repo set
//! --include`) and the untracked and ignored paths they match, as git lists them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::beneath;
use crate::git::filters::{run_git, Owner, RunError};
use crate::lifecycle::error::LifecycleResult;
use crate::store::RepoRow;

use super::as_user::AsUser;

/// The file at the top of a source checkout that names what worktrees inherit.
pub const INCLUDE_FILE: &str = ".worktreeinclude";

/// The patterns of `repo`: its `.worktreeinclude`, then `repo add|set --include`.
pub(super) fn patterns(
    user: &AsUser,
    root: &std::sync::Arc<OwnedFd>,
    repo: &RepoRow,
    notes: &mut Vec<(String, String)>,
) -> LifecycleResult<Vec<String>> {
    let r = root.clone();
    let file = user.run(move || {
        beneath::read_regular(r.as_fd(), INCLUDE_FILE.as_bytes(), 1 << 20).map(|(b, _)| b)
    })?;
    let mut out = Vec::new();
    match file {
        Ok(bytes) => {
            for line in String::from_utf8_lossy(&bytes).lines() {
                let line = line.trim_end_matches('\r');
                if !line.trim().is_empty() && !line.starts_with('#') {
                    out.push(line.to_string());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => notes.push((INCLUDE_FILE.into(), format!("not read: {e}"))),
    }
    out.extend(repo.include.iter().cloned());
    Ok(out)
}

/// `git ls-files -z --others --ignored` with `patterns`, as `owner`, in the checkout.
pub(super) fn ls_files(
    owner: &Owner,
    repo: &RepoRow,
    patterns: &[String],
    directory: bool,
) -> LifecycleResult<Vec<Vec<u8>>> {
    let out = crate::git::blobcache::memfd(c"wtfs-warm-ls", b"")?;
    let mut args: Vec<std::ffi::OsString> = vec![
        format!("--work-tree={}", repo.path.display()).into(),
        "-c".into(),
        "safe.directory=*".into(),
        "-c".into(),
        "core.fsmonitor=false".into(),
        "ls-files".into(),
        "-z".into(),
        "--others".into(),
        "--ignored".into(),
    ];
    if directory {
        args.push("--directory".into());
    }
    for p in patterns {
        args.push(format!("--exclude={p}").into());
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let copy = out.try_clone()?;
    run_git(owner, &repo.gitdir, &args, None, copy).map_err(|e| {
        crate::lifecycle::error::failed(format!(
            "listing what the patterns match in {}: {}",
            repo.path.display(),
            match e {
                RunError::Spawn(s) | RunError::Failed(s) | RunError::NoSpace(s) => s,
                RunError::TimedOut(_) => "git ran past its time limit".into(),
            }
        ))
    })?;
    let mut out = out;
    let mut bytes = Vec::new();
    io::Seek::rewind(&mut out)?;
    io::Read::read_to_end(&mut out, &mut bytes)?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| p.strip_suffix(b"/").unwrap_or(p).to_vec())
        .collect())
}
