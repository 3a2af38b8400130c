//! git's checkout conversions done in-process (`git::convert`) against git itself:
//! random blobs checked out by `git worktree add` with each end-of-line and `ident` rule.

use worktreefs::git::convert::{
    classify, clean_turns_crlf, round_trip_changes, AttrValue, ConvConfig, PathAttrs,
};

use std::path::{Path, PathBuf};

/// Runs git in `cwd` (no autocrlf of the user's), its stdout; fails the test on an error.
fn git(args: &[&str], cwd: &Path) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "core.autocrlf=false",
        ])
        .args(args)
        .current_dir(cwd)
        .env_remove("GIT_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository (in `dir`) whose one commit holds, for each of `rules` (`(ext, rule)`:
/// `*.ext rule` in its `.gitattributes`), 150 random blobs made of pieces that end-of-line
/// and `ident` rules act on, written as they are (no clean side on the way in), and a
/// detached checkout of it by `git worktree add` at `dir/wt`. Returns the checkout and
/// each file's name, blob and content.
fn checked_out(dir: &Path, rules: &[(&str, &str)]) -> (PathBuf, Vec<(String, git2::Oid, Vec<u8>)>) {
    let repo = dir.join("r");
    std::fs::create_dir(&repo).unwrap();
    git(&["init", "-q"], &repo);
    let mut attrs = String::new();
    for (ext, rule) in rules {
        attrs.push_str(&format!("*.{ext} {rule}\n"));
    }
    let pieces: [&[u8]; 14] = [
        b"a",
        b"\n",
        b"\r\n",
        b"\r",
        b"$Id$",
        b"$Id: x $",
        b"$Id: a b $",
        b"$Id:",
        b"$",
        b"Id",
        b"\0",
        b"\x1a",
        b" ",
        b"\t",
    ];
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let r = git2::Repository::open(&repo).unwrap();
    let mut tb = r.treebuilder(None).unwrap();
    tb.insert(
        ".gitattributes",
        r.blob(attrs.as_bytes()).unwrap(),
        0o100644,
    )
    .unwrap();
    let mut files = Vec::new();
    for i in 0..150 {
        let len = (next() % 24) as usize;
        let content: Vec<u8> = (0..len)
            .flat_map(|_| pieces[(next() % pieces.len() as u64) as usize].to_vec())
            .collect();
        let oid = r.blob(&content).unwrap();
        for (ext, _) in rules {
            let name = format!("f{i}.{ext}");
            tb.insert(&name, oid, 0o100644).unwrap();
            files.push((name, oid, content.clone()));
        }
    }
    let tree = r.find_tree(tb.write().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@t").unwrap();
    r.commit(Some("HEAD"), &sig, &sig, "x", &tree, &[]).unwrap();
    let wt = dir.join("wt");
    git(
        &["worktree", "add", "-q", "--detach", wt.to_str().unwrap()],
        &repo,
    );
    (wt, files)
}

/// The attributes `rule` (`text eol=crlf`) sets.
fn attrs_of(rule: &str) -> PathAttrs {
    let mut a = PathAttrs::default();
    for w in rule.split(' ') {
        match w.split_once('=') {
            Some((n, v)) => a.set(n, AttrValue::Value(v.into())),
            None => a.set(w, AttrValue::Set),
        }
    }
    a
}

const RULES: [(&str, &str); 11] = [
    ("tc", "text eol=crlf"),
    ("ac", "text=auto eol=crlf"),
    ("id", "ident"),
    ("ic", "ident text eol=crlf"),
    ("ia", "ident text=auto eol=crlf"),
    ("cr", "crlf"),
    ("ec", "eol=crlf"),
    ("tl", "text eol=lf"),
    ("tx", "text"),
    ("ci", "crlf=input"),
    ("el", "eol=lf"),
];

/// Against git itself: random contents checked out by `git worktree add` with each
/// rule, compared with what `Conv::apply` makes of the same blobs.
#[test]
fn apply_writes_what_a_checkout_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (wt, files) = checked_out(dir.path(), &RULES);
    let cfg = ConvConfig::default();
    for (name, oid, content) in files {
        let ext = name.rsplit('.').next().unwrap();
        let rule = RULES.iter().find(|r| r.0 == ext).unwrap().1;
        let ours = match classify(&attrs_of(rule), &cfg) {
            Some(c) => c.apply(oid, &content),
            None => content.clone(),
        };
        let theirs = std::fs::read(wt.join(&name)).unwrap();
        assert_eq!(
            ours,
            theirs,
            "{name} ({rule}) of {:?}",
            String::from_utf8_lossy(&content)
        );
    }
}

/// Against git itself: which blobs do not come back from a checkout and a clean, as
/// `git status` of that checkout says once every file is touched (it then cleans each
/// file and compares), and as worktreefs decides it from the blob (a CRLF under a rule
/// that is not `auto`, an expanded `$Id: … $` under `ident`).
#[test]
fn what_does_not_survive_a_checkout_is_what_git_status_lists_after_a_touch() {
    let dir = tempfile::tempdir().unwrap();
    let (wt, files) = checked_out(dir.path(), &RULES);
    // A second later than the index: git must look at every file's content.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let status = std::process::Command::new("sh")
        .args(["-c", "find . -path ./.git -prune -o -type f -exec touch {} + && git -c core.fsmonitor=false status --porcelain --untracked-files=no"])
        .current_dir(&wt)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let listed: std::collections::HashSet<String> = String::from_utf8_lossy(&status.stdout)
        .lines()
        .map(|l| l[3..].to_string())
        .collect();
    let cfg = ConvConfig::default();
    for (name, oid, content) in files {
        let ext = name.rsplit('.').next().unwrap();
        let rule = RULES.iter().find(|r| r.0 == ext).unwrap().1;
        let a = attrs_of(rule);
        let conv = classify(&a, &cfg);
        let ours = round_trip_changes(
            oid,
            &content,
            conv.as_ref(),
            clean_turns_crlf(&a, &cfg),
            a.ident == AttrValue::Set,
        );
        assert_eq!(
            ours,
            listed.contains(&name),
            "{name} ({rule}) of {:?}",
            String::from_utf8_lossy(&content)
        );
    }
}
