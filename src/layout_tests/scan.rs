//! What the layout tests read of the sources: every file's module path, its
//! code without tests and comments, the paths it refers to, and which file
//! each path lands in.
//!
//! A reference is any `crate::…` path, and `super::…` or `self::…` resolved
//! against the file's own module, outside `#[cfg(test)]` items and `//`
//! comments. It lands in the file of the deepest module on its path
//! (`crate::domain::budget::ledger::Row` → `crates/core/src/budget/ledger.rs`),
//! and through that file's `use` declarations when the name is imported
//! there: `crate::domain::budget::Settled` lands in `settle.rs`, where the
//! item is, not in `budget/mod.rs`, which re-exports it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module path, `["domain", "budget", "ledger"]`.
pub(super) type ModPath = Vec<String>;

/// One source file.
pub(super) struct Source {
    /// The file.
    pub file: PathBuf,
    /// The file from the workspace's root, `/`-separated, for messages.
    pub name: String,
    /// Its module path in the service's crate: `crates/server/src/api/mod.rs` → `[api]`,
    /// `src/lib.rs` → `[]`, `crates/core/src/plan.rs` → `[domain, plan]`
    /// (the core crate is mounted at `domain`).
    pub module: ModPath,
    /// The text, as read.
    pub text: String,
    /// The text without `#[cfg(test)]` items and `//` comment lines.
    pub code: String,
}

impl Source {
    /// The top-level module the file belongs to (`None`: the crate root).
    pub(super) fn top(&self) -> Option<&str> {
        self.module.first().map(String::as_str)
    }
}

/// Every source of the crates read, and where each module's file is.
pub(super) struct Tree {
    /// The files, sorted by path.
    pub sources: Vec<Source>,
    by_module: BTreeMap<ModPath, usize>,
    /// Per file: each name a `use` brings in → the path it names.
    imports: Vec<BTreeMap<String, ModPath>>,
}

/// A path one file refers to.
pub(super) struct Reference {
    /// As written after `crate::`, `super::` or `self::`, for messages.
    pub written: String,
    /// Resolved from the crate root.
    pub path: ModPath,
}

impl Tree {
    /// Reads every `.rs` file under each mount's `src` directory, its
    /// modules placed under the mount's module path (the crate re-exported
    /// there), and its `crate::` paths read as from the service's crate.
    /// Names are relative to `root`.
    pub(super) fn read(root: &Path, mounts: &[(PathBuf, ModPath)]) -> Tree {
        let mut sources = Vec::new();
        for (src, at) in mounts {
            for file in files(src) {
                let text = std::fs::read_to_string(&file).expect("a readable source");
                let rel = file.strip_prefix(root).expect("under the root").iter();
                let mut module = at.clone();
                module.extend(module_path(src, &file));
                let mut code = without_tests(&text);
                if !at.is_empty() {
                    code = code.replace("crate::", &format!("crate::{}::", at.join("::")));
                }
                sources.push(Source {
                    name: rel
                        .map(|p| p.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/"),
                    module,
                    code,
                    text,
                    file,
                });
            }
        }
        sources.sort_by(|a, b| a.file.cmp(&b.file));
        let by_module: BTreeMap<ModPath, usize> = (sources.iter().enumerate())
            .map(|(i, s)| (s.module.clone(), i))
            .collect();
        let imports = (sources.iter())
            .map(|s| imports(&s.module, &s.code, &by_module))
            .collect();
        Tree {
            sources,
            by_module,
            imports,
        }
    }

    /// The file `path` lands in: the deepest module on it that has a file,
    /// followed through that file's imports. `None` outside the crate's files
    /// (generated code, the crate root's inline modules).
    pub(super) fn file_of(&self, path: &[String]) -> Option<usize> {
        self.land(path, 0)
    }

    fn land(&self, path: &[String], depth: usize) -> Option<usize> {
        let (file, used) = (1..=path.len())
            .rev()
            .find_map(|n| self.by_module.get(&path[..n]).map(|&f| (f, n)))?;
        let imported = path.get(used).and_then(|name| self.imports[file].get(name));
        match imported {
            Some(target) if depth < 8 => {
                let mut next = target.clone();
                next.extend_from_slice(&path[used + 1..]);
                self.land(&next, depth + 1).or(Some(file))
            }
            _ => Some(file),
        }
    }
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
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
    out
}

/// The module path of `file` under `src`.
pub(super) fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: ModPath = rel
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

/// `text` without `#[cfg(test)]` items and without `//` comment lines.
pub(super) fn without_tests(text: &str) -> String {
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
            (Some(open), semi) if semi.is_none_or(|s| open < s) => open + closing(&item[open..]),
            (_, Some(semi)) => semi + 1,
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The length of `text` up to and including the brace that closes its first.
fn closing(text: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The paths `code`, written in module `here`, refers to.
pub(super) fn references(here: &[String], code: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for (path, _) in use_tree(&code[at..]) {
                out.push(Reference {
                    written: path.join("::"),
                    path: absolute(here, &path),
                });
            }
        }
    }
    out
}

/// Per name a `use` in `code` (module `here`) brings in, the path it names.
/// Paths into other crates are left out.
fn imports(
    here: &[String],
    code: &str,
    modules: &BTreeMap<ModPath, usize>,
) -> BTreeMap<String, ModPath> {
    let mut out = BTreeMap::new();
    for (at, _) in code.match_indices("use ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| !(c.is_whitespace() || c == ')' || c == ';' || c == '}')) {
            continue;
        }
        for (path, name) in use_tree(&code[at + 4..]) {
            // A bare path names a child module (`pub use ledger::Row;`) or
            // another crate.
            let mut child = here.to_vec();
            child.push(path[0].clone());
            if (is_keyword(&path[0]) || modules.contains_key(&child)) && !is_keyword(&name) {
                out.insert(name, absolute(here, &path));
            }
        }
    }
    out
}

/// `path` from the crate root: `crate`, `super` and `self` resolved.
fn absolute(here: &[String], path: &[String]) -> ModPath {
    let mut out = here.to_vec();
    for (i, segment) in path.iter().enumerate() {
        match segment.as_str() {
            "crate" if i == 0 => out.clear(),
            // In `a/mod.rs` (module `a`) and `a/b.rs` (module `a::b`) alike,
            // `super` is the module's parent.
            "super" => {
                out.pop();
            }
            "self" => {}
            _ => out.push(segment.clone()),
        }
    }
    out
}

/// The paths a use tree (or a path in an expression) at the start of `text`
/// names, each with the name it binds: `a::b::C` → `[a, b, C]` (`C`);
/// `a::{b, c::{D, E as F}}` → `[a, b]`, `[a, c, D]`, `[a, c, E]` (`F`).
pub(super) fn use_tree(text: &str) -> Vec<(ModPath, String)> {
    let mut out = Vec::new();
    tree(text, &mut Vec::new(), &mut out);
    out
}

/// Parses one tree of `text` under `prefix` into `out`; returns what follows it.
fn tree<'a>(text: &'a str, prefix: &mut ModPath, out: &mut Vec<(ModPath, String)>) -> &'a str {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        let mut rest = group;
        loop {
            rest = tree(rest, &mut prefix.clone(), out).trim_start();
            // Past an alias or anything else to this group's `,` or `}`.
            let stop = rest.find([',', '}']).unwrap_or(rest.len());
            rest = &rest[stop..];
            match rest.strip_prefix(',') {
                Some(next) => rest = next,
                None => return rest.strip_prefix('}').unwrap_or(rest),
            }
        }
    }
    let len = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    let (ident, rest) = text.split_at(len);
    if !ident.is_empty() {
        prefix.push(ident.to_string());
        if let Some(deeper) = rest.strip_prefix("::")
            && deeper.starts_with(|c: char| c == '{' || c == '_' || c.is_ascii_alphabetic())
        {
            return tree(deeper, prefix, out);
        }
    }
    if !prefix.is_empty() {
        let alias = rest.trim_start().strip_prefix("as ").map(|a| {
            let a = a.trim_start();
            a[..a
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(a.len())]
                .to_string()
        });
        let mut path = prefix.clone();
        if path.last().is_some_and(|p| p == "self") {
            path.pop();
        }
        let name = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
        out.push((path, name));
    }
    rest
}

fn is_keyword(segment: &str) -> bool {
    ["crate", "super", "self"].contains(&segment)
}
