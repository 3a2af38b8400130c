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
    ("failure", 0),
    ("filecopy", 1),
    ("heap", 0),
    ("ids", 0),
    ("ino", 0),
    ("layout", 1),
    ("lease", 0),
    ("mounttable", 0),
    ("names", 0),
    ("process", 0),
    ("table", 0),
    ("target", 0),
    ("fuse", 0),
    ("state", 1),
    ("git", 1),
    ("store", 1),
    ("report", 2),
    ("checkpoint", 2),
    ("lifecycle", 3),
    ("fs", 4),
    ("daemon", 5),
];

/// The binary's own top-level modules (with `main.rs`): they may name every module of the
/// library, which names none of them.
const BINARY: &[&str] = &["main", "cli", "mcp", "completion", "logging"];

/// Folders that still have an import circle among their files, each to be broken (and
/// then taken off this list: the check fails while a folder here has none).
const CIRCLES_LEFT: &[&str] = &[];

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

/// The top-level module a source file (its path below `src/`) belongs to: `fs` for
/// `fs/view.rs`, `lease` for `lease.rs`.
fn top_module(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
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
        let top = top_module(rel);
        // The binary's own files (main.rs, the command line, the MCP server it serves,
        // the completion of names it prints, its logging) are above all.
        if BINARY.contains(&top.as_str()) || top == "lib" {
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

/// Libraries only one top-level module of the source may name; the rest of the code sees
/// that module's own types (the store's error and rows, not the database library's).
const OWNED_LIBRARIES: &[(&str, &str)] = &[("rusqlite", "store")];

/// The owned libraries that a file of top-level module `top` names (in code or comment).
fn foreign_libraries(text: &str, top: &str) -> Vec<&'static str> {
    OWNED_LIBRARIES
        .iter()
        .filter(|(lib, owner)| *owner != top && has_word(text, lib))
        .map(|(lib, _)| *lib)
        .collect()
}

#[test]
fn only_its_owner_names_an_owned_library() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = top_module(rel);
        for lib in foreign_libraries(&fs::read_to_string(file).unwrap(), &top) {
            wrong.push(format!("{} names {lib}", rel.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "libraries named outside the module that owns them:\n{}",
        wrong.join("\n")
    );
}

/// Where `anyhow` (one error type for everything, decided on by reading its words) may be
/// used: at the top, in the command line and the daemon, which show failures to a person.
/// Below them each layer returns an error type of its own that its callers decide on.
const ANYHOW_ALLOWED: &[&str] = &["main", "cli", "mcp", "completion", "logging", "daemon"];

/// Modules below the top that still use `anyhow`, each to be given its own error type
/// (and then taken off this list: the check fails while a module here has none).
const ANYHOW_LEFT: &[&str] = &[];

/// Whether the code of `text` (without comments and test modules) uses `anyhow`.
fn uses_anyhow(text: &str) -> bool {
    has_word(&code(&without_test_modules(text)), "anyhow")
}

#[test]
fn only_the_top_uses_anyhow() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    let mut left_using: Vec<String> = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = top_module(rel);
        if ANYHOW_ALLOWED.contains(&top.as_str()) || top == "lib" {
            continue;
        }
        if uses_anyhow(&fs::read_to_string(file).unwrap()) {
            if ANYHOW_LEFT.contains(&top.as_str()) {
                left_using.push(top);
            } else {
                wrong.push(rel.display().to_string());
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "anyhow used below the command line and the daemon (return an error type of the module's own):\n{}",
        wrong.join("\n")
    );
    for m in ANYHOW_LEFT {
        assert!(
            left_using.iter().any(|u| u == m),
            "{m} no longer uses anyhow: take it off ANYHOW_LEFT"
        );
    }
}

/// The check itself: `anyhow` in code is found, in a comment or a test module not.
#[test]
fn anyhow_in_code_is_found() {
    assert!(uses_anyhow("fn f() -> anyhow::Result<()> { Ok(()) }"));
    assert!(!uses_anyhow("// shown as anyhow shows one\nfn f() {}"));
    assert!(!uses_anyhow(
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() -> anyhow::Result<()> { Ok(()) }\n}\n"
    ));
}

/// The check itself: the database library named outside the store is found, inside it not.
#[test]
fn a_library_named_outside_its_owner_is_found() {
    let text = "fn f(e: &rusqlite::Error) {}";
    assert_eq!(foreign_libraries(text, "lifecycle"), vec!["rusqlite"]);
    assert!(foreign_libraries(text, "store").is_empty());
    assert!(foreign_libraries("let rusqlite_like = 1;", "fs").is_empty());
}

/// Where JSON may be made by hand (`json!`, or a `Value` patched: `v["field"] = …`): the
/// MCP server, which speaks JSON-RPC. What else prints JSON prints a typed shape of
/// `report::shapes`, which the examples of docs/cli.md are checked against.
const HAND_MADE_JSON_ALLOWED: &[&str] = &["mcp"];

/// Whether the code of `text` (without comments and test modules) makes JSON by hand.
fn makes_json_by_hand(text: &str) -> bool {
    let code = code(&without_test_modules(text));
    let patched = code
        .match_indices("\"] =")
        .any(|(i, m)| !code[i + m.len()..].starts_with('='));
    code.contains("json!") || patched
}

#[test]
fn only_the_mcp_server_makes_json_by_hand() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        if HAND_MADE_JSON_ALLOWED.contains(&top_module(rel).as_str()) {
            continue;
        }
        if makes_json_by_hand(&fs::read_to_string(file).unwrap()) {
            wrong.push(rel.display().to_string());
        }
    }
    assert!(
        wrong.is_empty(),
        "JSON made by hand (print a typed shape of report::shapes, with its example in docs/cli.md):\n{}",
        wrong.join("\n")
    );
}

/// The check itself: `json!` and a patched `Value` in code are found; a comparison, a
/// comment or a test module is not.
#[test]
fn json_made_by_hand_is_found() {
    assert!(makes_json_by_hand("let v = serde_json::json!({\"a\": 1});"));
    assert!(makes_json_by_hand("v[\"error\"] = \"busy\".into();"));
    assert!(!makes_json_by_hand("if v[\"error\"] == \"busy\" {}"));
    assert!(!makes_json_by_hand("// as json! would make it\nfn f() {}"));
    assert!(!makes_json_by_hand(
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() { json!({}); }\n}\n"
    ));
}

/// A source file's module path: `lifecycle/cleanup/inspect.rs` is `lifecycle::cleanup::
/// inspect`, a folder's `mod.rs` is the folder's module, `lib.rs` and `main.rs` the root.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.trim_end_matches(".rs") {
        "mod" | "lib" | "main" => {}
        name => parts.push(name.to_string()),
    }
    parts
}

/// The module paths, from the crate's root, that the code `text` of module `at` names:
/// `crate::a::b…` and `super::…` paths, one level of braces opened (`use
/// super::{info, pidfd}`). A path names more than modules (its last parts may be items):
/// it is cut to a module by [`the_module`].
fn named_paths(text: &str, at: &[String]) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", at[..at.len().saturating_sub(1)].to_vec()),
    ] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            // `worktreefs::x` in the binary names the library, not its own `crate`.
            let whole_word = i == 0 || {
                let c = rest.as_bytes()[i - 1];
                !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
            };
            rest = &rest[i + prefix.len()..];
            if !whole_word {
                continue;
            }
            let mut path = base.clone();
            let mut tail = rest;
            loop {
                if let Some(inner) = tail.strip_prefix('{') {
                    let end = inner.find('}').unwrap_or(inner.len());
                    for part in inner[..end].split(',') {
                        let mut p = path.clone();
                        p.extend(part.split("::").map(ident).filter(|s| !s.is_empty()));
                        out.push(p);
                    }
                    break;
                }
                let name = ident(tail);
                if name.is_empty() {
                    out.push(path.clone());
                    break;
                }
                tail = &tail[name.len()..];
                path.push(name);
                match tail.strip_prefix("::") {
                    Some(t) => tail = t,
                    None => {
                        out.push(path.clone());
                        break;
                    }
                }
            }
        }
    }
    out
}

/// `text` without its inline test modules: each `#[cfg(test)]` followed by `mod NAME {`,
/// to its closing brace.
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let is_mod = after.trim_start().starts_with("mod ");
        let open = after.find('{');
        match (is_mod, open) {
            (true, Some(o)) if !after[..o].contains(';') => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, c) in after[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => {
                out.push_str("#[cfg(test)]");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The `pub use CHILD::…` statements of a `mod.rs`: each child and the names it gives
/// (`X as Y` gives `Y`).
fn re_exports(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for stmt in text.split(';') {
        let s = stmt.trim();
        let Some(path) = s
            .strip_prefix("pub use ")
            .or_else(|| s.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let Some((child, tail)) = path.split_once("::") else {
            continue;
        };
        if child == "crate" || child == "super" || child == "self" {
            continue;
        }
        let tail = tail.trim().trim_start_matches('{').trim_end_matches('}');
        let names = tail
            .split(',')
            .filter_map(|n| {
                let n = n.trim();
                let n = n.rsplit_once(" as ").map_or(n, |(_, y)| y);
                let n = n.rsplit("::").next().unwrap_or(n).trim();
                (!n.is_empty() && n != "*" && n != "self").then(|| n.to_string())
            })
            .collect();
        out.push((child.trim().to_string(), names));
    }
    out
}

/// Whether `word` is in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        text[..i].chars().last().is_none_or(|c| !ident(c))
            && text[i + word.len()..]
                .chars()
                .next()
                .is_none_or(|c| !ident(c))
    })
}

/// The longest start of `path` that is a module.
fn the_module(path: &[String], modules: &[Vec<String>]) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

/// Every folder's import circles: for each folder, the groups of its files and subfolders
/// (a subfolder as one) that name one another round in a circle, and its `mod.rs` as
/// `mod`.
fn circles() -> Vec<(String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<Vec<String>> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).unwrap()))
        .collect();
    // Edges between modules, as (from, to).
    let mut edges: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for (file, at) in files.iter().zip(&modules) {
        // A file's inline test modules (`#[cfg(test)] mod tests { … }`, whose `super` is
        // the file itself) are left out; everything else is read.
        let text = without_test_modules(&code(&fs::read_to_string(file).unwrap()));
        let mut named = named_paths(&text, at);
        // A folder's mod.rs names its files by relative paths too (`session::answer`):
        // those count, but not its re-exports (`pub use session::Session`), which are the
        // folder's face, not a use.
        if file.file_name().is_some_and(|n| n == "mod.rs") {
            let used: String = text
                .lines()
                .filter(|l| {
                    !l.trim_start().starts_with("pub use")
                        && !l.trim_start().starts_with("pub(crate) use")
                })
                .collect::<Vec<_>>()
                .join("\n");
            // A re-export its own code uses is a use: `pub use device::Device` and a
            // trait method taking `&Device`.
            for (child, names) in re_exports(&text) {
                let mut path = at.clone();
                path.push(child);
                if names.iter().any(|n| has_word(&used, n)) && modules.contains(&path) {
                    named.push(path);
                }
            }
            for child in modules
                .iter()
                .filter(|m| m.len() == at.len() + 1 && m.starts_with(at))
            {
                let name = child.last().unwrap();
                let mut rest = used.as_str();
                while let Some(i) = rest.find(&format!("{name}::")) {
                    let before = &rest[..i];
                    rest = &rest[i + name.len() + 2..];
                    let alone = before
                        .chars()
                        .last()
                        .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
                    if alone || before.ends_with("self::") {
                        named.push(child.clone());
                    }
                }
            }
        }
        for p in named {
            if let Some(m) = the_module(&p, &modules) {
                if m != *at {
                    edges.push((at.clone(), m));
                }
            }
        }
    }
    let folders: Vec<&Vec<String>> = modules
        .iter()
        .filter(|m| {
            !m.is_empty()
                && modules
                    .iter()
                    .any(|o| o.len() > m.len() && o.starts_with(m))
        })
        .collect();
    let mut found = Vec::new();
    for folder in folders {
        let d = folder.len();
        // A module as its folder sees it: the child it is (or is inside), or `mod`.
        let child = |m: &Vec<String>| -> Option<String> {
            if !m.starts_with(folder) {
                return None;
            }
            Some(m.get(d).cloned().unwrap_or_else(|| "mod".to_string()))
        };
        let mut names: Vec<String> = modules.iter().filter_map(&child).collect();
        names.sort();
        names.dedup();
        let n = names.len();
        let at = |s: &str| names.iter().position(|x| x == s).unwrap();
        let mut reach = vec![vec![false; n]; n];
        for (a, b) in &edges {
            if let (Some(x), Some(y)) = (child(a), child(b)) {
                if x != y {
                    reach[at(&x)][at(&y)] = true;
                }
            }
        }
        for k in 0..n {
            for i in 0..n {
                for j in 0..n {
                    if reach[i][k] && reach[k][j] {
                        reach[i][j] = true;
                    }
                }
            }
        }
        let in_circle: Vec<String> = (0..n)
            .filter(|&i| reach[i][i])
            .map(|i| names[i].clone())
            .collect();
        if !in_circle.is_empty() {
            found.push((folder.join("/"), in_circle));
        }
    }
    found
}

/// No folder's files name one another round in a circle (a folder still on
/// [`CIRCLES_LEFT`] excepted, until its circle is broken).
#[test]
fn no_folder_has_an_import_circle() {
    let found = circles();
    let wrong: Vec<String> = found
        .iter()
        .filter(|(folder, _)| !CIRCLES_LEFT.contains(&folder.as_str()))
        .map(|(folder, members)| {
            format!(
                "src/{folder}/: {} name one another round",
                members.join(", ")
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "import circles inside folders:\n{}",
        wrong.join("\n")
    );
    let broken: Vec<&&str> = CIRCLES_LEFT
        .iter()
        .filter(|f| !found.iter().any(|(folder, _)| folder == *f))
        .collect();
    assert!(
        broken.is_empty(),
        "no circle is left in {broken:?}: take them off CIRCLES_LEFT"
    );
}

/// The circle check itself: paths are read as modules, and a circle is found.
#[test]
fn a_circle_inside_a_folder_is_found() {
    let at = vec!["cli".to_string(), "exit".to_string()];
    let paths = named_paths(
        "use crate::cli::report_file::{write_report, REPORT};\nuse super::{state, target::which};\nworktreefs::report::x",
        &at,
    );
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(paths.contains(&s(&["cli", "report_file", "write_report"])));
    assert!(paths.contains(&s(&["cli", "state"])));
    assert!(paths.contains(&s(&["cli", "target", "which"])));
    assert!(!paths
        .iter()
        .any(|p| p.first().is_some_and(|x| x == "report")));
    let modules = vec![
        s(&["cli"]),
        s(&["cli", "report_file"]),
        s(&["cli", "target"]),
    ];
    assert_eq!(
        the_module(&s(&["cli", "report_file", "write_report"]), &modules),
        Some(s(&["cli", "report_file"]))
    );
    assert_eq!(
        module_of(Path::new("lifecycle/cleanup/mod.rs")),
        s(&["lifecycle", "cleanup"])
    );
}

/// `docs/architecture.md` opens with a map of the source: every file under `src/` is
/// named there as a whole word, in its place: a top-level file in a `src/` line's first
/// column, a file of a folder in that folder's part of the map (a subfolder's file on the
/// subfolder's entry and the lines that continue it), a folder's `mod.rs` by its folder.
#[test]
fn every_source_file_is_on_the_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let map = doc
        .split("```")
        .nth(1)
        .expect("docs/architecture.md opens with the map in a code block");
    let lines: Vec<&str> = map.lines().collect();
    // A line's first column (the names), before the run of spaces that starts the text.
    let first_column = |l: &str| -> String {
        let t = l.trim_start();
        let indent = l.len() - t.len();
        let end = t.find("  ").unwrap_or(t.len());
        format!("{}{}", " ".repeat(indent), &t[..end])
    };
    // The entry starting at line `i`: it and the lines that only continue its text
    // (indented to the text's column).
    let entry = |i: usize| -> String {
        let mut out = lines[i].to_string();
        for l in &lines[i + 1..] {
            if l.len() - l.trim_start().len() >= 20 {
                out.push('\n');
                out.push_str(l);
            } else {
                break;
            }
        }
        out
    };
    // The part of top-level folder `top`: from its `src/TOP/` line to the next `src/`.
    let part = |top: &str| -> Vec<usize> {
        let start = format!("src/{top}/");
        let mut out = Vec::new();
        let mut inside = false;
        for (i, line) in lines.iter().enumerate() {
            if line.starts_with("src/") {
                inside = line.starts_with(&start);
            }
            if inside {
                out.push(i);
            }
        }
        out
    };
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let name = parts.last().unwrap().clone();
        let found = match parts.len() {
            1 => lines.iter().any(|l| {
                l.starts_with("src/")
                    && !first_column(l).trim_end().ends_with('/')
                    && has_word(&first_column(l), &name.replace("src/", ""))
            }),
            2 if name == "mod.rs" => lines
                .iter()
                .any(|l| l.starts_with(&format!("src/{}/", parts[0]))),
            2 => part(&parts[0])
                .iter()
                .any(|&i| has_word(&entry(i), &name) && !lines[i].starts_with("src/")),
            _ => {
                // The entry of the first subfolder below the top: `  NAME/`.
                let sub = format!("{}/", parts[1]);
                part(&parts[0]).iter().any(|&i| {
                    first_column(lines[i]).trim() == sub
                        && (name == "mod.rs" || has_word(&entry(i), &name))
                })
            }
        };
        if !found {
            missing.push(rel.display().to_string());
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "source files the map in docs/architecture.md does not name:\n{}",
        missing.join("\n")
    );
}

/// How many lines of `text` come before its tests: to the `#[cfg(test)]` that opens its
/// test module, or all of it.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .find(|&i| {
            lines[i] == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.starts_with("mod "))
        })
        .unwrap_or(lines.len())
}

/// A file is read whole by whoever enters it: none holds more than 800 lines before its
/// tests, and `main.rs` is the start of the binary alone (under 120). A file past that
/// holds more than one concern and is split by them.
#[test]
fn no_source_file_is_too_long_to_read_whole() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).unwrap();
            let n = lines_before_tests(&fs::read_to_string(f).unwrap());
            let limit = if rel == Path::new("main.rs") {
                120
            } else {
                800
            };
            (n > limit).then(|| format!("{} ({n} lines, at most {limit})", rel.display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "source files longer than a reader takes in whole, before their tests:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_lines_before_the_tests_are_counted() {
    assert_eq!(lines_before_tests("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
    assert_eq!(lines_before_tests("a\nb\nc\n"), 3);
    // A test-only item in the code is code: only the test module ends the count.
    assert_eq!(lines_before_tests("a\n#[cfg(test)]\nfn f() {}\nb\n"), 4);
    assert_eq!(lines_before_tests("a\n    #[cfg(test)]\n    mod t {}\n"), 3);
}
