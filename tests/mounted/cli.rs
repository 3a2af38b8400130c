//! The command line without a mount: creation, listings, and bad input that must leave
//! nothing half-created (no row, no directory, no git worktree entry, no branch).

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Everything a creation could leave behind, to compare before and after a refusal.
fn footprint(env: &Env) -> (String, String, Vec<String>, String) {
    let repo = env.repo.path();
    let branches = git(&repo, &["branch", "--list", "--format=%(refname)"]);
    let worktrees = git(&repo, &["worktree", "list", "--porcelain"]);
    let mut upper: Vec<String> = fs::read_dir(env.state().join("worktrees"))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    upper.sort();
    let rows = wtfs_ok(&env.state(), &["list", "--json"]);
    (branches, worktrees, upper, rows)
}

#[test]
fn new_creates_branch_admin_entry_index_and_row() {
    let env = Env::new();
    let out = wtfs_ok(&env.state(), &["new", "repo/task-1"]);
    assert!(
        out.contains("created repo/task-1 on branch task-1"),
        "{out}"
    );
    let repo = env.repo.path();
    assert_eq!(git(&repo, &["rev-parse", "task-1"]).trim(), env.repo.head());
    let admin = repo.join(".git/worktrees/wtfs-task-1");
    assert!(admin.join("locked").exists());
    assert_eq!(
        fs::read_to_string(admin.join("HEAD")).unwrap(),
        "ref: refs/heads/task-1\n"
    );
    assert!(fs::read_to_string(admin.join("gitdir"))
        .unwrap()
        .ends_with("/repo/task-1/.git\n"));
    // git itself can read the index we wrote: every tracked path is in it.
    let listed = run_ok(
        "git",
        &["--git-dir", admin.to_str().unwrap(), "ls-files", "--stage"],
        &repo,
    );
    let expected = git(&repo, &["ls-files", "--stage"]);
    assert_eq!(listed, expected);
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    assert_eq!(json[0]["name"], "task-1");
    assert_eq!(json[0]["state"], "ready");
    assert_eq!(json[0]["base_commit"], env.repo.head());
    let repos: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["repo", "list", "--json"])).unwrap();
    assert_eq!(repos[0]["repo"], "repo");
    assert!(
        repos[0]["added_at"].as_str().unwrap().contains('T'),
        "{repos}"
    );
}

#[test]
fn new_with_base_and_existing_branch() {
    let env = Env::new();
    let repo = env.repo.path();
    let first = env.repo.head();
    fs::write(repo.join("second.txt"), "2").unwrap();
    git(&repo, &["add", "second.txt"]);
    git(&repo, &["commit", "-q", "-m", "second"]);
    wtfs_ok(&env.state(), &["new", "repo/old", "--base", &first]);
    assert_eq!(git(&repo, &["rev-parse", "old"]).trim(), first);
    git(&repo, &["branch", "feature", &first]);
    wtfs_ok(&env.state(), &["new", "repo/feat", "--branch", "feature"]);
    let json: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&env.state(), &["list", "--json"])).unwrap();
    let feat = json
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "feat")
        .unwrap();
    assert_eq!(feat["branch"], "feature");
    assert_eq!(feat["branch_created"], false);
    // The same branch cannot be checked out twice.
    let out = wtfs(&env.state(), &["new", "repo/feat2", "--branch", "feature"]);
    assert!(
        stderr(&out).contains("already checked out"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_input_is_refused_and_leaves_nothing_behind() {
    let env = Env::new();
    // A repository without a commit: nothing a worktree could show.
    let empty_repo = env.dir.path().join("empty");
    run_ok(
        "git",
        &["init", "-q", empty_repo.to_str().unwrap()],
        Path::new("/"),
    );
    wtfs_ok(&env.state(), &["new", "repo/exists"]);
    let before = footprint(&env);
    let cases: &[(&[&str], &str)] = &[
        (
            &["new", "repo/bad name"],
            "worktree name 'bad name' contains ' '",
        ),
        (&["new", "repo/.hidden"], "starts with '.'"),
        (&["new", "repo/-x"], "starts with '-'"),
        (
            &["new", "nosuch/x"],
            "repository 'nosuch' is not registered",
        ),
        (&["new", "repo-without-slash"], "is not REPO/NAME"),
        (
            &["new", "repo/x", "--base", "no-such-rev"],
            "base revision 'no-such-rev' does not resolve",
        ),
        (
            &["new", "repo/exists"],
            "worktree 'repo/exists' already exists",
        ),
        (&["new", "repo/main"], "branch 'main' already exists"),
        // Checked out in the repository's own worktree: --branch is no way out there.
        (&["new", "repo/main"], "is checked out in"),
        (
            &["new", "repo/y", "--branch", "bad..branch"],
            "'bad..branch' is not a name git allows for a branch: it contains '..'",
        ),
        // Names that would become branches git refuses.
        (
            &["new", "repo/HEAD"],
            "worktree name 'HEAD' would be its new branch's name",
        ),
        (&["new", "repo/HEAD"], "--branch"),
        (&["new", "repo/x.lock"], "ends with '.lock'"),
        (&["new", "repo/bad..name"], "contains '..'"),
        (&["new", "repo/dot."], "ends with '.'"),
        (&["new", "repo/y", "--branch", "HEAD"], "HEAD names"),
        (&["new", "rpeo/x"], "did you mean 'repo'?"),
        (&["new", "repo/a/b"], "'repo/a/b' is not REPO/WT"),
        (&["new", "repo/"], "names repository repo but no worktree"),
        (
            &["repo", "add", "/nonexistent/path"],
            "is not a git repository",
        ),
        (
            &["repo", "add", "/tmp", "--name", "bad name"],
            "repository name",
        ),
        (&["repo", "remove", "nosuch"], "is not registered"),
        (
            &["repo", "add", empty_repo.to_str().unwrap()],
            "has no commit yet",
        ),
        (
            &["repo", "remove", "repo"],
            "still has 1 worktree: repo/exists (ready)",
        ),
        (&["unmount"], "nothing is mounted"),
        (&["reclaim", "repo/exist"], "did you mean repo/exists?"),
        (
            &["lease", "acquire", "repo/exits", "--session", "s"],
            "did you mean repo/exists?",
        ),
    ];
    for (args, want) in cases {
        let out = wtfs(&env.state(), args);
        let code = if args[0] == "lease" { 3 } else { 1 };
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?} should fail with exit {code}"
        );
        assert!(
            stderr(&out).contains(want),
            "{args:?}: expected {want:?} in {:?}",
            stderr(&out)
        );
        // libgit2's internals (`class=Os (2); code=NotFound (-3)`) are not for people.
        assert!(
            !stderr(&out).contains("class=") && !stderr(&out).contains("code="),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // A repository that is already registered, under any name.
    let out = wtfs(
        &env.state(),
        &[
            "repo",
            "add",
            env.repo.path().to_str().unwrap(),
            "--name",
            "again",
        ],
    );
    assert!(
        stderr(&out).contains("already registered as 'repo'"),
        "{}",
        stderr(&out)
    );
    assert_eq!(footprint(&env), before, "a refused command changed state");
    // A state dir that is a file is named as such, not "File exists (os error 17)".
    let file = env.dir.path().join("a-file");
    fs::write(&file, "x").unwrap();
    for args in [&["list"][..], &["repo", "add", "."], &["mount"]] {
        let out = wtfs(&file, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains("is a file, not a directory"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // Bad usage is exit 2.
    let out = wtfs(&env.state(), &["new"]);
    assert_eq!(out.status.code(), Some(2));
    let out = wtfs(&env.state(), &["--log-level", "bogus", "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bogus"), "{}", stderr(&out));
    wtfs_ok(&env.state(), &["--log-level", "debug", "list"]);
    wtfs_ok(
        &env.state(),
        &["--log-level", "worktreefs=trace,warn", "list"],
    );
    // A state directory that does not exist is said so, and not made, by commands that
    // only look.
    let none = env.state().with_file_name("no-such-state");
    for args in [
        &["list"][..],
        &["status"],
        &["unmount"],
        &["retained"],
        &["leases"],
        &["events"],
        &["reclaim", "repo/x"],
    ] {
        let out = wtfs(&none, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains("no-such-state") && stderr(&out).contains("does not exist"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(!none.exists(), "{args:?} made the state directory");
    }
}

/// At the default level a command's standard error holds sentences for people
/// (`worktreefs: warning: …`), never a log record with its time, level and target; those
/// come with `--log-level`. An older git's warning (a git 2.39 stood in for by a script
/// that says so) is the case met in the field.
#[test]
fn a_commands_warnings_are_sentences_not_log_records() {
    let env = Env::new();
    let bin = env.dir.path().join("oldgit");
    fs::create_dir(&bin).unwrap();
    let real = run_ok("sh", &["-c", "command -v git"], Path::new("/"));
    fs::write(
        bin.join("git"),
        format!(
            "#!/bin/sh\nif [ \"$1\" = version ]; then echo 'git version 2.39.5'; exit 0; fi\nexec '{}' \"$@\"\n",
            real.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        bin.join("git"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    fs::write(env.repo.path().join(".gitattributes"), "* text=auto\n").unwrap();
    git(&env.repo.path(), &["add", ".gitattributes"]);
    git(&env.repo.path(), &["commit", "-qm", "attributes"]);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let new = |name: &str, extra: &[&str]| {
        std::process::Command::new(BIN)
            .arg("--state-dir")
            .arg(env.state())
            .args(extra)
            .args(["new", &format!("repo/{name}")])
            .env("PATH", &path)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let o = new("plain", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stderr(&o);
    assert!(
        said.contains("worktreefs: warning: git version 2.39.5 cannot read attributes"),
        "{said}"
    );
    for line in said.lines() {
        assert!(line.starts_with("worktreefs: "), "not a sentence: {line:?}");
        assert!(
            !line.contains(" WARN ") && !line.contains("worktreefs::"),
            "{line:?}"
        );
    }
    // Asked for, the records are there.
    let o = new("logged", &["--log-level", "warn"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("WARN"), "{}", stderr(&o));
}

/// `events --last 0` prints no past event, and with `--follow` only those from then on.
#[test]
fn events_last_zero_prints_none_and_follows_only_new_ones() {
    use std::io::BufRead;
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/before"]);
    assert!(wtfs_ok(&env.state(), &["events"]).contains("repo/before"));
    assert_eq!(wtfs_ok(&env.state(), &["events", "--last", "0"]), "");
    assert_eq!(
        wtfs_ok(&env.state(), &["events", "--last", "0", "--json"]),
        ""
    );
    let one = wtfs_ok(&env.state(), &["events", "--last", "1", "--json"]);
    assert_eq!(one.lines().count(), 1, "{one}");
    let mut follow = std::process::Command::new(BIN)
        .arg("--state-dir")
        .arg(env.state())
        .args(["events", "--follow", "--last", "0", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its first look is done once it has slept a round; then a new event comes.
    std::thread::sleep(std::time::Duration::from_millis(500));
    wtfs_ok(&env.state(), &["new", "repo/after"]);
    let mut line = String::new();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = lines.read_line(&mut line);
        let _ = tx.send(line);
    });
    let first = rx.recv_timeout(std::time::Duration::from_secs(20));
    let _ = follow.kill();
    let _ = follow.wait();
    let first = first.expect("no event followed within 20 s");
    assert!(
        first.contains("repo/after") || first.contains("\"after\""),
        "{first}"
    );
    assert!(!first.contains("before"), "{first}");
}

/// `mkdir` of a worktree whose name git refuses as a branch answers EINVAL (not EEXIST:
/// nothing is there), makes nothing, and the daemon's log says why.
#[test]
fn mkdir_of_a_name_git_refuses_as_a_branch_is_einval_with_the_reason_logged() {
    let env = Env::new();
    let before = footprint(&env);
    let m = env.mount();
    for name in ["HEAD", "bad..name", "x.lock", "dot."] {
        let err = fs::create_dir(m.wt("repo", name)).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EINVAL),
            "mkdir {name}: {err}"
        );
        assert!(!m.wt("repo", name).exists(), "{name}");
    }
    let log = m.log();
    assert!(
        log.contains("worktree name 'HEAD' would be its new branch's name"),
        "{log}"
    );
    assert!(log.contains("'x.lock'"), "{log}");
    drop(m);
    assert_eq!(footprint(&env), before, "a refused mkdir changed state");
    let head = git(&env.repo.path(), &["rev-parse", "--abbrev-ref", "HEAD"]);
    assert_eq!(head.trim(), "main");
}

#[test]
fn a_failure_midway_rolls_back_the_branch_and_admin_entry() {
    let env = Env::new();
    let before = footprint(&env);
    // Make the upper-layer step fail: the worktrees directory is a file.
    let worktrees = env.state().join("worktrees");
    fs::remove_dir_all(&worktrees).unwrap();
    fs::write(&worktrees, "not a directory").unwrap();
    let out = wtfs(&env.state(), &["new", "repo/doomed"]);
    fs::remove_file(&worktrees).unwrap();
    fs::create_dir(&worktrees).unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("upper layer") || stderr(&out).contains("state dir"),
        "{}",
        stderr(&out)
    );
    assert_eq!(footprint(&env), before);
    assert!(!Path::new(&env.repo.path().join(".git/worktrees/wtfs-doomed")).exists());
}

#[test]
fn mount_without_a_fuse_device_is_refused_with_the_reason() {
    let env = Env::new();
    let mp = env.dir.path().join("mnt");
    fs::create_dir_all(&mp).unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "--state-dir",
            env.state().to_str().unwrap(),
            "mount",
            mp.to_str().unwrap(),
        ])
        .env("WORKTREEFS_FUSE_DEVICE", "/nonexistent/fuse")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let msg = stderr(&out);
    assert!(
        msg.contains("/nonexistent/fuse is missing") && msg.contains("modprobe fuse"),
        "{msg}"
    );
    assert!(!is_mounted(&fs::canonicalize(&mp).unwrap()));
    // A device that exists but cannot be opened for FUSE.
    let out = std::process::Command::new(BIN)
        .args([
            "--state-dir",
            env.state().to_str().unwrap(),
            "mount",
            mp.to_str().unwrap(),
        ])
        .env("WORKTREEFS_FUSE_DEVICE", env.dir.path())
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("needs permission to use FUSE"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn repo_add_enables_fsmonitor_for_managed_worktrees_only_and_remove_undoes_it() {
    let repo = TestRepo::new();
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("s");
    wtfs_ok(
        &state,
        &["repo", "add", repo.path().to_str().unwrap(), "--name", "r"],
    );
    let config = fs::read_to_string(repo.path().join(".git/config")).unwrap();
    assert!(config.contains("/worktrees/wtfs-*\"]"), "{config}");
    let hook = repo.path().join(".git/worktreefs/fsmonitor-hook");
    assert!(hook.exists());
    // The repository's own worktree does not use it.
    assert!(run("git", &["config", "core.fsmonitor"], &repo.path())
        .stdout
        .is_empty());
    // A second `repo add` elsewhere does not add it twice.
    let other_state = state.with_file_name("t");
    wtfs_ok(
        &other_state,
        &["repo", "add", repo.path().to_str().unwrap(), "--name", "r"],
    );
    let config = fs::read_to_string(repo.path().join(".git/config")).unwrap();
    assert_eq!(config.matches("includeIf").count(), 1, "{config}");
    wtfs_ok(&state, &["repo", "remove", "r"]);
    let config = fs::read_to_string(repo.path().join(".git/config")).unwrap();
    assert!(!config.contains("includeIf"), "{config}");
    assert!(!hook.exists());
}

/// (path, size recorded in the index) for every entry of a worktree's index.
fn index_sizes(repo: &Path, admin: &str) -> Vec<(String, u64)> {
    let gitdir = repo.join(".git/worktrees").join(admin);
    let out = run_ok(
        "git",
        &[
            "-c",
            "core.quotePath=false",
            "--git-dir",
            gitdir.to_str().unwrap(),
            "ls-files",
            "--debug",
        ],
        repo,
    );
    let mut rows = Vec::new();
    let mut path = String::new();
    for line in out.lines() {
        if !line.starts_with(' ') {
            path = line.to_string();
        } else if let Some(rest) = line.trim().strip_prefix("size: ") {
            let size = rest.split_whitespace().next().unwrap().parse().unwrap();
            rows.push((path.clone(), size));
        }
    }
    rows
}

#[test]
fn index_sizes_are_the_blob_sizes_also_when_learnt_from_an_earlier_index() {
    let env = Env::new();
    let repo = env.repo.path();
    wtfs_ok(&env.state(), &["new", "repo/before"]);
    // A second commit changes sizes of some files and adds one.
    fs::write(repo.join("README.md"), "a much longer readme than before\n").unwrap();
    fs::write(repo.join("src/added.rs"), "// added\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "second"]);
    wtfs_ok(&env.state(), &["new", "repo/after"]);
    for admin in ["wtfs-before", "wtfs-after"] {
        let sizes = index_sizes(&repo, admin);
        assert!(sizes.len() > 10, "{sizes:?}");
        let rev = if admin == "wtfs-before" {
            "HEAD~1"
        } else {
            "HEAD"
        };
        for (path, size) in sizes {
            if path == "vendor/sub" {
                continue; // a gitlink has no size
            }
            let want: u64 = git(&repo, &["cat-file", "-s", &format!("{rev}:{path}")])
                .trim()
                .parse()
                .unwrap();
            assert_eq!(size, want, "{admin}: {path}");
        }
    }
}

/// Completions and manual pages come from the command definitions, and neither needs
/// (nor makes) a state directory: the bash script completes subcommands and their
/// options; there is a page per command and subcommand, each naming its options.
#[test]
fn completions_and_manual_pages_cover_every_command_and_make_no_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("no-state");
    let out = wtfs(&state, &["completions", "bash"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = dir.path().join("worktreefs.bash");
    fs::write(&script, &out.stdout).unwrap();
    // Complete as bash would: the function `complete -F` names (clap's, then the names of
    // repositories and worktrees, read by this program, found on PATH).
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    let complete = |words: &str| -> String {
        let probe = format!(
            "export PATH={bin_dir}:$PATH; source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); _worktreefs_with_names worktreefs \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let o = std::process::Command::new("bash")
            .args(["-c", &probe])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let subs = complete("worktreefs lea");
    assert!(subs.lines().any(|l| l == "lease"), "{subs}");
    assert!(subs.lines().any(|l| l == "leases"), "{subs}");
    let opts = complete("worktreefs lease acquire --ex");
    assert!(opts.lines().any(|l| l == "--exclusive"), "{opts}");
    // Repository and worktree names come from the state directory given.
    let named = Env::new();
    wtfs_ok(&named.state(), &["new", "repo/exists"]);
    let sd = named.state().display().to_string();
    let got = complete(&format!("worktreefs --state-dir {sd} reclaim rep"));
    assert_eq!(got.trim(), "repo/exists", "{got}");
    let got = complete(&format!("worktreefs --state-dir {sd} lease acquire repo/e"));
    assert_eq!(got.trim(), "repo/exists", "{got}");
    let got = complete(&format!("worktreefs --state-dir {sd} new r"));
    assert_eq!(got.trim(), "repo/", "{got}");
    zsh_completes_names(&state, &named);
    let out = wtfs(&state, &["completions", "fish"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("turn"));
    let out = wtfs(&state, &["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a shell it cannot write for is bad usage"
    );

    let man = dir.path().join("man1");
    let out = wtfs(&state, &["man", man.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    for page in [
        "worktreefs.1",
        "worktreefs-mount.1",
        "worktreefs-lease-acquire.1",
        "worktreefs-turns-end.1",
        "worktreefs-repo-add.1",
    ] {
        let text = fs::read_to_string(man.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
        for section in ["EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"] {
            assert!(
                text.contains(&format!(".SH \"{section}\"")),
                "{page}: no {section}"
            );
        }
    }
    let page = fs::read_to_string(man.join("worktreefs-lease-acquire.1")).unwrap();
    assert!(page.contains("exclusive"), "{page}");
    assert!(
        !man.join("worktreefs-help.1").exists(),
        "no page for clap's help"
    );
    // Rendered by man where it is installed: the synopsis names the command's words.
    if Path::new("/usr/bin/man").exists() {
        let o = std::process::Command::new("man")
            .args(["-l", "-P", "cat"])
            .arg(man.join("worktreefs-lease-acquire.1"))
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains("worktreefs lease acquire ["), "{text}");
        assert!(words.contains("EXIT STATUS"), "{text}");
        assert!(
            words.contains("worktreefs lease acquire myrepo/task-1 --session s1 --exclusive"),
            "{text}"
        );
    }
    assert!(!state.exists(), "no state directory was made");
}

/// zsh, as a user's interactive shell completes (compinit, the script in `fpath`, TAB on
/// a line typed into a pseudo-terminal): subcommands from clap's part, names from the
/// state directory given. `named` holds worktree repo/exists. Needs zsh (CI installs it).
fn zsh_completes_names(no_state: &Path, named: &Env) {
    if !Path::new("/usr/bin/zsh").exists() && !Path::new("/bin/zsh").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI installs zsh");
        eprintln!("zsh completion not checked: no zsh");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fpath = dir.path().join("functions");
    fs::create_dir(&fpath).unwrap();
    let out = wtfs(no_state, &["completions", "zsh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    fs::write(fpath.join("_worktreefs"), &out.stdout).unwrap();
    // Every match zsh is given is printed as `hit:NAME` between the markers, and the shell
    // exits once the completion is done.
    let setup = dir.path().join("setup.zsh");
    fs::write(
        &setup,
        format!(
            r#"PROMPT=
fpath=({} $fpath)
autoload -U compinit && compinit -u -D
bindkey '^I' complete-word
_capture_begin() {{ print -r -- '<<<' }}
_capture_end() {{ print -r -- '>>>'; exit }}
compprefuncs=(_capture_begin)
comppostfuncs=(_capture_end)
compadd() {{
    if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi
    local -a hits
    builtin compadd -A hits "$@"
    (( $#hits )) && print -rl -- "hit:"${{^hits}}
    builtin compadd "$@"
}}
"#,
            fpath.display()
        ),
    )
    .unwrap();
    let drive = dir.path().join("drive.zsh");
    fs::write(
        &drive,
        format!(
            r#"zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "source {}"
zpty -w -n z "$1"$'\t'
local line
while zpty -r z line; do print -rn -- "$line"; done
"#,
            setup.display()
        ),
    )
    .unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    let complete = |line: &str| -> Vec<String> {
        let o = std::process::Command::new("timeout")
            .args(["30", "zsh", "-f"])
            .arg(&drive)
            .arg(line)
            .env("PATH", &path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).replace('\r', "");
        let (_, after) = text
            .split_once("<<<")
            .unwrap_or_else(|| panic!("no completion ran for {line:?}: {text:?} {}", stderr(&o)));
        let (hits, _) = after
            .split_once(">>>")
            .unwrap_or_else(|| panic!("completion of {line:?} did not end: {text:?}"));
        hits.lines()
            .filter_map(|l| l.strip_prefix("hit:"))
            .map(str::to_string)
            .collect()
    };
    let subs = complete("worktreefs lea");
    assert!(subs.iter().any(|l| l == "lease"), "{subs:?}");
    assert!(subs.iter().any(|l| l == "leases"), "{subs:?}");
    let opts = complete("worktreefs lease acquire --ex");
    assert!(opts.iter().any(|l| l == "--exclusive"), "{opts:?}");
    let sd = named.state().display().to_string();
    for (line, want) in [
        (
            format!("worktreefs --state-dir {sd} reclaim rep"),
            "repo/exists",
        ),
        (
            format!("worktreefs --state-dir {sd} lease acquire repo/e"),
            "repo/exists",
        ),
        (format!("worktreefs --state-dir {sd} new r"), "repo"),
    ] {
        let got = complete(&line);
        assert_eq!(got, [want], "{line}");
    }
}

/// The helper mount(8) runs for `-t fuse.worktreefs` (and so for an fstab line): a link
/// named mount.fuse.worktreefs to the binary, given `STATE_DIR MOUNTPOINT -o OPTIONS`.
/// The mount comes up as type fuse.worktreefs with the options' settings, and `umount`
/// ends it (the daemon's cleanup runs as for `worktreefs unmount`).
#[test]
fn an_fstab_line_mounts_through_the_mount_fuse_worktreefs_helper() {
    let helper = Path::new("/sbin/mount.fuse.worktreefs");
    if !Path::new("/usr/bin/mount").exists() && !Path::new("/bin/mount").exists() {
        eprintln!("skipped: no mount(8)");
        return;
    }
    /// The link, removed again however the test ends (only if this test made it).
    struct Link(Option<&'static Path>);
    impl Drop for Link {
        fn drop(&mut self) {
            if let Some(p) = self.0 {
                let _ = fs::remove_file(p);
            }
        }
    }
    let _link = if fs::symlink_metadata(helper).is_err() {
        std::os::unix::fs::symlink(BIN, helper).unwrap();
        Link(Some(helper))
    } else {
        Link(None)
    };
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/t"]);
    let mnt = env.mountpoint();
    fs::create_dir_all(&mnt).unwrap();
    let fstab = env.dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.worktreefs rw,noauto,nofail,linger=7,threads=3 0 0\n",
            env.state().display(),
            mnt.display()
        ),
    )
    .unwrap();
    let o = std::process::Command::new("timeout")
        .args(["60", "mount", "-T"])
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    /// Unmounted however the test ends.
    struct Umount(PathBuf, PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            if is_mounted(&self.0) {
                let _ = wtfs(&self.1, &["unmount"]);
            }
            if is_mounted(&self.0) {
                detach(&self.0);
            }
        }
    }
    let mnt = fs::canonicalize(&mnt).unwrap();
    let _umount = Umount(mnt.clone(), env.state());
    assert!(o.status.success(), "mount -T: {}", stderr(&o));
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == mnt.to_str())
        .unwrap_or_else(|| panic!("nothing mounted at {}: {mounts}", mnt.display()));
    assert!(
        line.starts_with("worktreefs ") && line.contains(" fuse.worktreefs "),
        "{line}"
    );
    // The options reached the daemon: its command line has them as flags.
    let status = wtfs_ok(&env.state(), &["status", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&status).unwrap();
    let pid = j["daemon_pid"].as_i64().unwrap();
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args[i + 1].clone())
    };
    assert_eq!(after("--linger").as_deref(), Some("7"), "{args:?}");
    assert_eq!(after("--threads").as_deref(), Some("3"), "{args:?}");
    assert!(fs::read_dir(mnt.join("repo/t")).is_ok());
    // umount(8) ends it, and the daemon with it.
    let o = std::process::Command::new("timeout")
        .args(["60", "umount"])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(o.status.success(), "umount: {}", stderr(&o));
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            std::time::Instant::now() < end,
            "the daemon did not exit after umount"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!is_mounted(&mnt));
}

/// Every command asked for `--json` answers a failure in JSON too: a typed refusal says
/// its `error`, anything else is `failed` with the message people get (also on stderr,
/// or only there, as JSON, for `run`, whose stdout is its command's). A `--json` after
/// `--` is the command's, not ours.
#[test]
fn failures_of_json_commands_are_json_too() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/exists"]);
    let cases: &[(&[&str], &str)] = &[
        (&["new", "repo/exists", "--json"], "already exists"),
        (&["new", "nosuch/x", "--json"], "is not registered"),
        (&["warm", "nosuch", "--json"], "is not registered"),
        (&["restore", "repo/never", "--json"], "repo/never"),
    ];
    for (args, says) in cases {
        let o = wtfs(&env.state(), args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: no JSON on stdout ({e}): {}", stderr(&o)));
        assert_eq!(j["error"], "failed", "{args:?}: {j}");
        assert!(
            j["message"].as_str().unwrap().contains(says),
            "{args:?}: {j}"
        );
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // Without --json, nothing on stdout.
    let o = wtfs(&env.state(), &["new", "repo/exists"]);
    assert!(o.stdout.is_empty());
    // `run`: the JSON is all stderr says.
    let o = wtfs(&env.state(), &["run", "nosuch/x", "--json", "--", "true"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(o.stdout.is_empty());
    let j: serde_json::Value = serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|e| panic!("not JSON on stderr ({e}): {}", stderr(&o)));
    assert!(j["error"].is_string(), "{j}");
    // After `--`, `--json` is the command's argument: the failure is for people.
    let o = wtfs(&env.state(), &["run", "nosuch/x", "--", "echo", "--json"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).starts_with("worktreefs: "), "{}", stderr(&o));
}

/// The objects `--json` prints have their keys in alphabetical order (docs/cli.md's
/// conventions: `du` and `doctor` aside), whatever order a type declares its fields in:
/// each output is what its JSON, read and printed again in that order, is.
#[test]
fn json_outputs_have_their_keys_in_alphabetical_order() {
    let env = Env::new();
    let commands: &[&[&str]] = &[
        &["new", "repo/task-1", "--json"],
        &["list", "--json"],
        &["status", "--json"],
        &["repo", "list", "--json"],
        &["leases", "--json"],
        &["retained", "--json"],
        &["removed", "--json"],
        &["turns", "--json"],
    ];
    for args in commands {
        let out = wtfs_ok(&env.state(), args);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            out.trim_end(),
            serde_json::to_string_pretty(&v).unwrap(),
            "{args:?}: keys out of order"
        );
    }
}

/// A creation that takes long says what it is doing (on stderr: stdout stays the
/// result's), from the threshold on: the first worktree at a commit builds the tree's
/// index, a later one reads it back. A quick one says nothing.
#[test]
fn a_slow_creation_says_what_it_is_doing() {
    let env = Env::new();
    let new = |name: &str, after_ms: &str| {
        std::process::Command::new(BIN)
            .arg("--state-dir")
            .arg(env.state())
            .args(["new", &format!("repo/{name}"), "--json"])
            .env("WORKTREEFS_PROGRESS_AFTER_MS", after_ms)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .current_dir("/")
            .output()
            .unwrap()
    };
    let head = env.repo.head();
    let o = new("first", "0");
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stderr(&o);
    assert!(
        said.contains(&format!(
            "worktreefs: creating repo/first: building the index of the tree at {}",
            &head[..12]
        )),
        "{said}"
    );
    assert!(
        said.contains("worktreefs: creating repo/first: done in "),
        "{said}"
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["worktree"], "repo/first");
    // The commit was made a moment ago: a later creation, a second or more after it (as on
    // a loaded machine), still finds the index the first one built.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let o = new("second", "0");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("creating repo/second: reading the cached index of the tree at"),
        "{}",
        stderr(&o)
    );
    let o = new("third", "60000");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "a quick creation is silent");
}

/// Every command that changes something answers `--json` (`repo add|set|remove`,
/// `unmount`), and every command names an unknown, removed or unmounted worktree with the
/// same typed refusal: `reclaim` says `not-found` with `did_you_mean` (or `removed`), and
/// `run` says `not-mounted` as `turn` does.
#[test]
fn commands_that_change_something_answer_json_and_refusals_are_typed_alike() {
    let env = Env::new();
    wtfs_ok(&env.state(), &["new", "repo/exists"]);
    let json = |args: &[&str], code: i32| -> serde_json::Value {
        let o = wtfs(&env.state(), args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: no JSON on stdout ({e}): {}", stderr(&o)))
    };
    // reclaim of a worktree that does not exist: not-found, the close name as a field.
    let v = json(&["reclaim", "repo/exist", "--json"], 1);
    assert_eq!(v["error"], "not-found", "{v}");
    assert_eq!(v["did_you_mean"], "repo/exists", "{v}");
    assert_eq!(v["worktree"], "repo/exist", "{v}");
    let v = json(&["reclaim", "repo/zzzzzz", "--json"], 1);
    assert_eq!(v["error"], "not-found", "{v}");
    assert!(v.get("did_you_mean").is_none(), "{v}");
    // ... and of one that is removed: removed, with the way back.
    wtfs_ok(&env.state(), &["new", "repo/gone"]);
    wtfs_ok(&env.state(), &["reclaim", "repo/gone", "--discard"]);
    let o = wtfs(&env.state(), &["reclaim", "repo/gone", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["error"], "removed", "{v}");
    assert_eq!(v["outcome"], "already-removed", "{v}");
    assert_eq!(v["state"], "removed", "{v}");
    assert!(
        stderr(&o).contains("worktreefs restore repo/gone"),
        "{}",
        stderr(&o)
    );
    // run with nothing mounted: not-mounted, the worktree object, on stderr.
    let o = wtfs(
        &env.state(),
        &[
            "run",
            "repo/exists",
            "--session",
            "s",
            "--json",
            "--",
            "true",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let v: serde_json::Value = serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|e| panic!("not JSON on stderr ({e}): {}", stderr(&o)));
    assert_eq!(v["error"], "not-mounted", "{v}");
    assert_eq!(v["worktree"], "repo/exists", "{v}");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["session"], "s", "{v}");
    assert!(v["path"].as_str().unwrap().ends_with("/repo/exists"), "{v}");
    // A removed worktree is refused as removed by run and turn, mounted or not (a mount
    // would not help).
    for args in [
        &["run", "repo/gone", "--json", "--", "true"][..],
        &[
            "turn",
            "repo/gone",
            "--session",
            "s",
            "--json",
            "--",
            "true",
        ],
    ] {
        let o = wtfs(&env.state(), args);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stderr)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON on stderr ({e}): {}", stderr(&o)));
        assert_eq!(v["error"], "removed", "{args:?}: {v}");
    }
    // unmount with nothing mounted: not-mounted too.
    let v = json(&["unmount", "--json"], 1);
    assert_eq!(v["error"], "not-mounted", "{v}");
    // repo add, set and remove give the repository as `repo list --json` does.
    let other = TestRepo::new();
    let v = json(
        &[
            "repo",
            "add",
            other.path().to_str().unwrap(),
            "--name",
            "other",
            "--include",
            "node_modules/",
            "--json",
        ],
        0,
    );
    let listed = json(&["repo", "list", "--json"], 0);
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["repo"] == "other")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(v, row);
    assert_eq!(v["include"], serde_json::json!(["node_modules/"]), "{v}");
    let v = json(
        &["repo", "set", "other", "--warm-default", "true", "--json"],
        0,
    );
    assert_eq!(v["warm_default"], true, "{v}");
    assert_eq!(v["repo"], "other", "{v}");
    let v = json(&["repo", "remove", "repo", "--json"], 1);
    assert_eq!(v["error"], "has-worktrees", "{v}");
    assert_eq!(
        v["worktrees"],
        serde_json::json!(["repo/exists (ready)"]),
        "{v}"
    );
    let v = json(&["repo", "remove", "other", "--json"], 0);
    assert_eq!(v["repo"], "other", "{v}");
    assert_eq!(v["removed"], true, "{v}");
    assert_eq!(v["purged"], 0, "{v}");
    let v = json(&["repo", "remove", "other", "--json"], 1);
    assert_eq!(v["error"], "failed", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("'other' is not registered"),
        "{v}"
    );
}

/// A command whose reader went away (`worktreefs list | head -1`) ends as other tools
/// do, quietly, by SIGPIPE: no panic message, no exit status 101. Its standard output is
/// a pipe whose reading end is already closed, so every write fails.
#[test]
fn output_into_a_closed_pipe_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new();
    for i in 0..3 {
        wtfs_ok(&env.state(), &["new", &format!("repo/p{i}")]);
    }
    for cmd in [
        &["list"][..],
        &["status"],
        &["leases"],
        &["completions", "bash"],
        &["--help"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(BIN)
            .arg("--state-dir")
            .arg(env.state())
            .args(cmd)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{cmd:?}: {:?}; {err}",
            out.status
        );
    }
}

/// `new --print-path` prints the path alone; `--reuse` finds a worktree that exists
/// instead of refusing it; the function `shell-init` prints goes into a worktree in bash,
/// zsh and fish, making it the first time and finding it the second.
#[test]
fn one_step_into_a_worktree_from_bash_zsh_and_fish() {
    let env = Env::new();
    let m = env.mount();
    let state = env.state();
    let s = state.to_str().unwrap();
    let path = m.wt("repo", "p1");

    // The path alone on stdout, for `cd "$(...)"`.
    let out = wtfs_ok(&state, &["new", "repo/p1", "--print-path"]);
    assert_eq!(out, format!("{}\n", path.display()));
    assert!(path.join("README.md").exists());
    // Again: refused without --reuse, found with it (nothing made).
    let again = wtfs(&state, &["new", "repo/p1", "--print-path"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
    let out = wtfs_ok(&state, &["new", "repo/p1", "--print-path", "--reuse"]);
    assert_eq!(out, format!("{}\n", path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["new", "repo/p1", "--reuse", "--json"])).unwrap();
    assert_eq!(v["reused"], true, "{v}");
    assert_eq!(v["path"], path.to_str().unwrap(), "{v}");
    let made: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["new", "repo/p2", "--reuse", "--json"])).unwrap();
    assert!(made.get("reused").is_none(), "{made}");
    let text = wtfs_ok(&state, &["new", "repo/p1", "--reuse"]);
    assert!(text.contains("exists") && text.contains("cd "), "{text}");
    // Options that say how to make one are not applied to one that exists, and it says so.
    let told = wtfs(
        &state,
        &["new", "repo/p1", "--reuse", "--base", "HEAD", "--warm"],
    );
    assert!(told.status.success());
    assert!(
        stderr(&told).contains("--base, --warm not applied"),
        "{}",
        stderr(&told)
    );
    let list: serde_json::Value =
        serde_json::from_str(&wtfs_ok(&state, &["list", "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    // With --json it is refused as a conflict of options.
    let both = wtfs(&state, &["new", "repo/p3", "--print-path", "--json"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));

    // A name that is not a shell word is refused.
    let bad = wtfs(&state, &["shell-init", "bash", "--name", "go;rm"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("cannot name a shell function"),
        "{}",
        stderr(&bad)
    );
    let bad = wtfs(&state, &["shell-init", "bash", "--name", "cd"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("pick another name"),
        "{}",
        stderr(&bad)
    );
    // A relative state dir is named by its absolute path (the function runs anywhere).
    let rel = run(
        BIN,
        &["--state-dir", "rel-state", "shell-init", "bash"],
        env.dir.path(),
    );
    assert!(
        String::from_utf8_lossy(&rel.stdout).contains(&format!(
            "--state-dir {}",
            env.dir.path().join("rel-state").display()
        )),
        "{}",
        String::from_utf8_lossy(&rel.stdout)
    );

    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    for shell in ["bash", "zsh", "fish"] {
        if which(shell).is_none() {
            assert!(std::env::var_os("CI").is_none(), "CI installs {shell}");
            eprintln!("shell-init not checked in {shell}: not installed");
            continue;
        }
        let init = wtfs_ok(&state, &["shell-init", shell, "--name", "go"]);
        assert!(init.contains(&format!("--state-dir {s}")), "{init}");
        let script = env.dir.path().join(format!("init.{shell}"));
        fs::write(&script, &init).unwrap();
        let name = format!("in-{shell}");
        // Made the first time, found the second; each time the shell ends up inside.
        let body = match shell {
            "fish" => format!(
                "set -x PATH {bin_dir} $PATH; source {sc}; go repo/{name}; and pwd; cd /; go repo/{name}; and pwd; go nope/x; or echo refused $status",
                sc = script.display()
            ),
            _ => format!(
                "export PATH={bin_dir}:$PATH; source {sc}; go repo/{name} && pwd; cd /; go repo/{name} && pwd; go nope/x || echo refused $?",
                sc = script.display()
            ),
        };
        let out = std::process::Command::new(shell)
            .args(["-c", &body])
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let want = m.wt("repo", &name);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [want.to_str().unwrap(), want.to_str().unwrap(), "refused 1"],
            "{shell}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(want.join("README.md").exists());
    }
    m.unmount();
}

/// The program `name` on PATH, if any.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
