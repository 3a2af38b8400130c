//! The layering rule written at the top of `src/lib.rs`, checked on the source: every
//! module of the library names only modules below it (`crate::X` paths and `use` lines),
//! so imports run one way and never in a circle, and only `fs/` names the FUSE protocol
//! (`fuse/`).

use std::fs;
use std::path::{Path, PathBuf};

/// Each top-level module of the library and its floor; a module may name only modules on
/// a lower floor. Keep in step with `src/lib.rs` and `docs/architecture.md`.
const FLOORS: &[(&str, u32)] = &[
    ("asked", 0),
    ("beneath", 0),
    ("bounded", 0),
    ("durable", 0),
    ("heap", 0),
    ("ino", 0),
    ("layout", 1),
    ("lease", 0),
    ("names", 0),
    ("process", 0),
    ("table", 0),
    ("target", 0),
    ("fuse", 0),
    ("state", 0),
    ("git", 1),
    ("store", 1),
    ("report", 2),
    ("lifecycle", 3),
    ("fs", 4),
    ("daemon", 5),
];

fn floor(module: &str) -> Option<u32> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|(_, f)| *f)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its comments (line comments, doc comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `text` names through `crate::`.
fn named_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

#[test]
fn every_module_names_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // The binary's own files (main.rs, the MCP server it serves, the completion of
        // names it prints, its logging) are above all.
        if top == "lib" || top == "main" || top == "mcp" || top == "completion" || top == "logging"
        {
            continue;
        }
        let own = floor(&top)
            .unwrap_or_else(|| panic!("{}: module {top} has no floor in FLOORS", rel.display()));
        let text = code(&fs::read_to_string(file).unwrap());
        for named in named_modules(&text) {
            if named == top {
                continue;
            }
            match floor(&named) {
                Some(f) if f < own => {}
                Some(f) => wrong.push(format!(
                    "{} (floor {own}) names crate::{named} (floor {f})",
                    rel.display()
                )),
                None => wrong.push(format!(
                    "{} names crate::{named}, which has no floor",
                    rel.display()
                )),
            }
        }
        // The FUSE protocol is the filesystem's edge: only fs/ speaks it.
        if top != "fs" && top != "fuse" && named_modules(&text).iter().any(|m| m == "fuse") {
            wrong.push(format!(
                "{} names the FUSE protocol outside fs/",
                rel.display()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering rule:\n{}",
        wrong.join("\n")
    );
}

/// The check itself: an upward import and a circle are found.
#[test]
fn an_upward_import_is_found() {
    let text = code("use crate::fs::View; // crate::daemon in a comment is not code\n");
    assert_eq!(named_modules(&text), vec!["fs".to_string()]);
    assert!(floor("fs").unwrap() > floor("lifecycle").unwrap());
}
