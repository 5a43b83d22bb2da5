//! Keeps the source layout honest: no import cycle between modules, no
//! file past 400 lines unless its module doc says why (a `//! Size:` line),
//! and no output to stdout but through `cli::output`.
//!
//! The modules are the crate's top-level ones, except that each of
//! `domain`'s submodules is a module of its own (the domain must stay a tree
//! of small parts). A reference is any `crate::…` path, and `super::…` or
//! `self::…` resolved against the file's own module, outside `#[cfg(test)]`
//! items and `//` comments. Function length is not checked here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest file that needs no `Size:` line.
const MAX_LINES: usize = 400;

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file: `src/domain/plan.rs` → `[domain, plan]`,
/// `src/api/mod.rs` → `[api]`, `src/lib.rs` → `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The node a module path belongs to: its top-level module, or
/// `domain::<submodule>`. `None` for the crate root and generated code.
fn node(path: &[String]) -> Option<String> {
    let top = path.first()?;
    if top == "pb" {
        return None;
    }
    match path.get(1) {
        Some(sub) if top == "domain" && sub.starts_with(|c: char| c.is_ascii_lowercase()) => {
            Some(format!("domain::{sub}"))
        }
        _ => Some(top.clone()),
    }
}

/// `text` without `#[cfg(test)]` items and without `//` comment lines.
fn without_tests(text: &str) -> String {
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item ends at its first `;` or, if a `{` comes first, at the
        // brace that closes it.
        let end = match (item.find('{'), item.find(';')) {
            (Some(open), semi) if semi.is_none_or(|s| open < s) => {
                let mut depth = 0usize;
                let mut close = item.len();
                for (i, c) in item[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                close = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                close
            }
            (_, Some(semi)) => semi + 1,
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The module paths `code`, written in module `here`, refers to.
fn references(here: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start) {
            let at = from + found;
            from = at + start.len();
            let boundary =
                at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            if !boundary {
                continue;
            }
            let base: Vec<String> = match start {
                "crate::" => Vec::new(),
                // In `a/mod.rs` (module `a`) and `a/b.rs` (module `a::b`)
                // alike, `super` is the module's parent.
                "super::" => here[..here.len().saturating_sub(1)].to_vec(),
                _ => here.to_vec(),
            };
            for tail in paths_after(&code[from..]) {
                let mut path = base.clone();
                path.extend(tail);
                out.push(path);
            }
        }
    }
    out
}

/// The paths a `use` tail starts with: `a::b::C` → `[[a, b, C]]`, `{a, b::c}`
/// → `[[a], [b, c]]` (two segments at most matter for nodes).
fn paths_after(tail: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(group) = tail.strip_prefix('{') {
        let inner = &group[..group.find('}').unwrap_or(group.len())];
        return inner
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| p.split("::").take(2).map(ident).collect())
            .collect();
    }
    let first = ident(tail);
    if first.is_empty() {
        return Vec::new();
    }
    let mut path = vec![first.clone()];
    if let Some(next) = tail[first.len()..].strip_prefix("::") {
        let second = ident(next);
        if !second.is_empty() {
            path.push(second);
        }
    }
    vec![path]
}

/// Module → the modules it refers to, over every source under `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(src) {
        let here = module_path(src, &file);
        let Some(from) = node(&here) else { continue };
        let text = std::fs::read_to_string(&file).expect("a readable source");
        let edges = graph.entry(from.clone()).or_default();
        for path in references(&here, &without_tests(&text)) {
            if let Some(to) = node(&path)
                && to != from
            {
                edges.insert(to);
            }
        }
    }
    graph
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph(&src());
    assert!(
        graph.contains_key("domain::plan") && graph.contains_key("engine"),
        "the scan found the modules: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle: {}; move the shared item to the module both can import",
            cycle.join(" → ")
        );
    }
}

#[test]
fn long_files_say_why_they_are_long() {
    let mut offenders = Vec::new();
    for file in sources(&src()) {
        let text = std::fs::read_to_string(&file).expect("a readable source");
        let lines = text.lines().count();
        let explained = text
            .lines()
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .any(|l| {
                l.trim_start_matches("//!")
                    .trim_start()
                    .starts_with("Size:")
            });
        if lines > MAX_LINES && !explained {
            offenders.push(format!("{} ({lines} lines)", file.display()));
        }
    }
    assert!(
        offenders.is_empty(),
        "files past {MAX_LINES} lines whose module doc has no `Size:` line saying why \
         (split them, or explain): {offenders:?}"
    );
}

#[test]
fn only_the_cli_output_module_writes_to_stdout() {
    // `println!` panics on a closed pipe (`ctxbudget inspect … | head`);
    // `cli::output::Stdout` ends the command quietly instead.
    // This file names the macros it looks for.
    let allowed = [
        src().join("cli").join("output.rs"),
        src().join("layout_tests.rs"),
    ];
    let mut offenders = Vec::new();
    for file in sources(&src()) {
        let code = without_tests(&std::fs::read_to_string(&file).expect("a readable source"));
        let writes = [
            "println!",
            "print!(",
            "io::stdout().lock()",
            "from_writer(std::io::stdout",
        ];
        if !allowed.contains(&file)
            && code.lines().any(|l| {
                writes
                    .iter()
                    .any(|w| l.contains(w) && !l.contains(&format!("e{w}")))
            })
        {
            offenders.push(file.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "these files print to stdout themselves; use `cli::output::outln!` or \
         `cli::output::Stdout`: {offenders:?}"
    );
}

#[test]
fn the_scanner_sees_through_tests_comments_and_groups() {
    let code = "use crate::a::B;\n// use crate::c;\nuse super::{d, e::F};\n\
                #[cfg(test)]\nmod tests { use crate::g; fn f() { if x { } } }\nuse crate::h;\n";
    let here = vec!["domain".to_string(), "plan".to_string()];
    let refs: Vec<Option<String>> = references(&here, &without_tests(code))
        .iter()
        .map(|p| node(p))
        .collect();
    let want = ["a", "h", "domain::d", "domain::e"].map(|s| Some(s.to_string()));
    assert_eq!(refs.len(), want.len(), "{refs:?}");
    for w in want {
        assert!(refs.contains(&w), "{w:?} in {refs:?}");
    }
    let cyclic: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert!(find_cycle(&cyclic).is_some());
}
