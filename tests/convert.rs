//! git's checkout conversions done in-process (`git::convert`) against git itself:
//! random blobs checked out by `git worktree add` with each end-of-line and `ident` rule.

use worktreefs::git::convert::{classify, AttrValue, ConvConfig, PathAttrs};

/// Against git itself: random contents checked out by `git worktree add` with each
/// rule, compared with what `Conv::apply` makes of the same blobs.
#[test]
fn apply_writes_what_a_checkout_writes() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("r");
    let git = |args: &[&str], cwd: &std::path::Path| {
        let out = Command::new("git")
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
    };
    std::fs::create_dir(&repo).unwrap();
    git(&["init", "-q"], &repo);
    let rules = [
        ("tc", "text eol=crlf"),
        ("ac", "text=auto eol=crlf"),
        ("id", "ident"),
        ("ic", "ident text eol=crlf"),
        ("ia", "ident text=auto eol=crlf"),
        ("cr", "crlf"),
        ("ec", "eol=crlf"),
    ];
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
    // Blobs written as they are (no clean side on the way in), so a blob may hold any
    // pattern, an expanded or foreign `$Id: … $` included.
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
    let wt = dir.path().join("wt");
    git(
        &["worktree", "add", "-q", "--detach", wt.to_str().unwrap()],
        &repo,
    );
    let cfg = ConvConfig::default();
    for (name, oid, content) in files {
        let ext = name.rsplit('.').next().unwrap();
        let rule = rules.iter().find(|r| r.0 == ext).unwrap().1;
        let mut a = PathAttrs::default();
        for w in rule.split(' ') {
            match w.split_once('=') {
                Some((n, v)) => a.set(n, AttrValue::Value(v.into())),
                None => a.set(w, AttrValue::Set),
            }
        }
        let ours = match classify(&a, &cfg) {
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
