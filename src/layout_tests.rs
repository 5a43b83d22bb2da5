//! Keeps the source layout honest:
//!
//! - **Layers.** Every top-level module has a rank, its item's place in the
//!   `# Layout` list of `src/lib.rs` (lowest first; the modules one item names
//!   share its rank), and refers to no module of a higher rank.
//! - **No circle of files** inside a module: no file uses a file that uses it
//!   back, directly or around a longer loop. A file's uses of its own
//!   submodules (`mod x;`, `x::f()`, `pub use x::Y`) are how it owns them, not
//!   uses.
//! - **No circle of submodules** either, a directory counting as one: the
//!   files of `domain/budget/` may use the rest of `domain/`, or be used by
//!   it, not both (and so for every module's children).
//! - No file past 400 lines unless its module doc says why (a `//! Size:`
//!   line), and no output to stdout but through `cli::output`.
//!
//! What counts as a reference is in [`scan`]. This module, compiled for tests
//! only, is outside the layers. Function length is not checked here.

mod scan;

use scan::{Source, Tree, references};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest file that needs no `Size:` line.
const MAX_LINES: usize = 400;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every source of the workspace's crates, each crate where the service's
/// crate re-exports it: the core crate (`crates/core`) is `domain`; the
/// store, engine and server crates' modules keep the names they give them.
fn workspace() -> Tree {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mounts = [
        (src(), vec![]),
        (root.join("crates/core/src"), vec!["domain".to_string()]),
        (root.join("crates/store/src"), vec![]),
        (root.join("crates/engine/src"), vec![]),
        (root.join("crates/server/src"), vec![]),
    ];
    Tree::read(root, &mounts)
}

/// The sources the layout rules apply to: all but the crate root and this module.
fn layered(tree: &Tree) -> impl Iterator<Item = (usize, &Source)> {
    (tree.sources.iter().enumerate()).filter(|(_, s)| s.top().is_some_and(|t| t != "layout_tests"))
}

/// Module → rank, from the items of the `# Layout` list in `lib_rs`: each
/// `- ` item is one rank, above the items before it, and names its modules in
/// links before its colon (``- [`pb`] and [`envoy`]: …``).
fn ranks(lib_rs: &str) -> BTreeMap<String, usize> {
    let list = lib_rs
        .lines()
        .skip_while(|l| l.trim() != "//! # Layout")
        .skip(1)
        .take_while(|l| l.starts_with("//!") && !l.starts_with("//! #"));
    let items = list.filter_map(|l| l.trim_start_matches("//!").trim().strip_prefix("- "));
    let mut ranks = BTreeMap::new();
    for (rank, item) in items.enumerate() {
        let named = item.split(':').next().unwrap_or_default();
        for module in named.split("[`").skip(1) {
            let module = module.split('`').next().unwrap_or_default();
            ranks.insert(module.to_string(), rank);
        }
    }
    ranks
}

/// The circles in `uses` (file → the files it uses): each set of files that
/// reach one another, found from every file.
fn circles(uses: &BTreeMap<usize, BTreeSet<usize>>) -> BTreeSet<BTreeSet<usize>> {
    let reach = |from: usize| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(f) = todo.pop() {
            for &next in uses.get(&f).into_iter().flatten() {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<usize, BTreeSet<usize>> = uses.keys().map(|&f| (f, reach(f))).collect();
    reached
        .iter()
        .filter(|(f, r)| r.contains(f))
        .map(|(f, r)| {
            (r.iter().copied())
                .filter(|g| reached.get(g).is_some_and(|back| back.contains(f)))
                .collect()
        })
        .collect()
}

#[test]
fn every_module_has_a_rank_in_the_layout_of_lib_rs() {
    let tree = workspace();
    let ranks = ranks(&std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs"));
    for module in ["domain", "engine", "cli", "pb"] {
        assert!(
            ranks.contains_key(module),
            "the Layout list names {module}: {ranks:?}"
        );
    }
    let unranked: BTreeSet<&str> = layered(&tree)
        .filter_map(|(_, s)| s.top())
        .filter(|top| !ranks.contains_key(*top))
        .collect();
    assert!(
        unranked.is_empty(),
        "modules missing from the `# Layout` list of src/lib.rs (add each where it \
         belongs: above every module it imports, below every one that imports it): \
         {unranked:?}"
    );
}

#[test]
fn no_module_uses_a_higher_layer() {
    let tree = workspace();
    let ranks = ranks(&std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs"));
    let mut upward = Vec::new();
    for (_, source) in layered(&tree) {
        let from = source.top().expect("layered");
        let Some(&rank) = ranks.get(from) else {
            continue;
        };
        for r in references(&source.module, &source.code) {
            let Some(to) = r.path.first() else { continue };
            if let Some(&higher) = ranks.get(to).filter(|&&to_rank| to_rank > rank) {
                upward.push(format!(
                    "{}: `{}` — {from} (rank {rank}) uses {to} (rank {higher})",
                    source.name, r.written
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers of src/lib.rs's `# Layout` (move the item to the \
         lowest layer that uses it at run time):\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn no_file_uses_a_file_that_uses_it_back() {
    let tree = workspace();
    let mut uses: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut how: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (i, source) in layered(&tree) {
        uses.entry(i).or_default();
        for r in references(&source.module, &source.code) {
            let Some(j) = tree.file_of(&r.path) else {
                continue;
            };
            let target = &tree.sources[j];
            let own_submodule = target.module.starts_with(&source.module);
            if target.top() == source.top() && !own_submodule {
                uses.entry(i).or_default().insert(j);
                how.entry((i, j)).or_insert(r.written);
            }
        }
    }
    let mut found = Vec::new();
    for circle in circles(&uses) {
        let names: Vec<&str> = circle
            .iter()
            .map(|&f| tree.sources[f].name.as_str())
            .collect();
        let steps: Vec<String> = (how.iter())
            .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
            .map(|((a, b), written)| {
                let (a, b) = (&tree.sources[*a].name, &tree.sources[*b].name);
                format!("{a} → {b} (`{written}`)")
            })
            .collect();
        found.push(format!("{}: {}", names.join(", "), steps.join("; ")));
    }
    assert!(
        found.is_empty(),
        "files that use one another (move what both need into one of them, or into a \
         file both use):\n  {}",
        found.join("\n  ")
    );
}

/// The modules of `tree` that have a directory of children (`domain`,
/// `domain/budget`), tests aside.
fn parents(tree: &Tree) -> BTreeSet<&[String]> {
    (tree.sources.iter())
        .filter(|s| !is_test(s))
        .flat_map(|s| (1..s.module.len()).map(move |n| &s.module[..n]))
        .collect()
}

/// A file of tests (`x/tests.rs`): it uses what it tests, and is not used.
fn is_test(source: &Source) -> bool {
    source.module.iter().any(|m| m == "tests")
}

#[test]
fn no_submodules_use_one_another_around_a_circle() {
    let tree = workspace();
    let mut found = Vec::new();
    for parent in parents(&tree) {
        // Each child of `parent` (a file, or a directory with all its files) is
        // one node; the parent's own file, which declares them, is none.
        let child = |i: usize| {
            let m = &tree.sources[i].module;
            (m.len() > parent.len() && m.starts_with(parent) && !is_test(&tree.sources[i]))
                .then(|| m[parent.len()].clone())
        };
        let names: Vec<String> = (0..tree.sources.len())
            .filter_map(child)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let node = |i: usize| child(i).and_then(|c| names.iter().position(|n| *n == c));
        let mut uses: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        let mut how: BTreeMap<(usize, usize), String> = BTreeMap::new();
        for (i, source) in layered(&tree) {
            let Some(a) = node(i) else { continue };
            uses.entry(a).or_default();
            for r in references(&source.module, &source.code) {
                let Some(b) = tree.file_of(&r.path).and_then(node) else {
                    continue;
                };
                if a != b {
                    uses.entry(a).or_default().insert(b);
                    let at = format!("{} (`{}`)", source.name, r.written);
                    how.entry((a, b)).or_insert(at);
                }
            }
        }
        for circle in circles(&uses) {
            let steps: Vec<String> = (how.iter())
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|((a, b), at)| format!("{} → {}: {at}", names[*a], names[*b]))
                .collect();
            found.push(format!("in {}/: {}", parent.join("/"), steps.join("; ")));
        }
    }
    assert!(
        found.is_empty(),
        "submodules that use one another (a directory counts as one; move what both \
         need into the lower one, or into a file both use):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn long_files_say_why_they_are_long() {
    let mut offenders = Vec::new();
    for source in &workspace().sources {
        let lines = source.text.lines().count();
        let explained = (source.text.lines())
            .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
            .any(|l| {
                l.trim_start_matches("//!")
                    .trim_start()
                    .starts_with("Size:")
            });
        if lines > MAX_LINES && !explained {
            offenders.push(format!("{} ({lines} lines)", source.name));
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
    let writes = [
        "println!",
        "print!(",
        "io::stdout().lock()",
        "from_writer(std::io::stdout",
    ];
    let writes_to_stdout =
        |line: &str| (writes.iter()).any(|w| line.contains(w) && !line.contains(&format!("e{w}")));
    let offenders: Vec<String> = layered(&workspace())
        .filter(|(_, s)| s.name != "src/cli/output.rs")
        .filter(|(_, s)| s.code.lines().any(writes_to_stdout))
        .map(|(_, s)| s.name.clone())
        .collect();
    assert!(
        offenders.is_empty(),
        "these files print to stdout themselves; use `cli::output::outln!` or \
         `cli::output::Stdout`: {offenders:?}"
    );
}

#[test]
fn the_scanner_reads_nested_groups_aliases_and_super() {
    let code = "use crate::a::B;\n// use crate::c;\nuse super::{d, e::{F, G as H}};\n\
                #[cfg(test)]\nmod tests { use crate::g; fn f() { if x { } } }\n\
                fn f() { super::super::i::J::new() }\n";
    let here: Vec<String> = ["domain", "budget", "plan"].map(String::from).into();
    let found: Vec<String> = references(&here, &scan::without_tests(code))
        .iter()
        .map(|r| r.path.join("::"))
        .collect();
    let want = [
        "a::B",
        "domain::budget::d",
        "domain::budget::e::F",
        "domain::budget::e::G",
        "domain::i::J::new",
    ];
    assert_eq!(found, want);
    let (_, alias) = &scan::use_tree("e::{F, G as H}")[1];
    assert_eq!(alias, "H");
}

#[test]
fn ranks_follow_the_layout_list_and_circles_are_found() {
    let lib = "//! # Layout\n//! - [`a`]: lowest,\n//!   still a.\n\
               //! - [`b`] and [`c`]: above [`a`].\n//! # Other\n//! - [`d`]: not a layer.\n";
    let want = BTreeMap::from([("a".to_string(), 0), ("b".into(), 1), ("c".into(), 1)]);
    assert_eq!(ranks(lib), want);
    let uses = BTreeMap::from([
        (0, BTreeSet::from([1])),
        (1, BTreeSet::from([2])),
        (2, BTreeSet::from([0, 3])),
        (3, BTreeSet::new()),
    ]);
    assert_eq!(circles(&uses), BTreeSet::from([BTreeSet::from([0, 1, 2])]));
}
