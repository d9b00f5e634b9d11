//! The crate's module graph, read from its own sources: data flows one way
//! (docs/ARCHITECTURE.md), so no two modules import each other, directly or around a cycle, no
//! module imports one of a layer above its own, and the model imports nothing of the layers
//! around it. A parent module's use of its children and a child's use of its ancestors
//! (`super::Harvest`) are the usual Rust shape and do not count; siblings and cousins do. Test
//! code (`#[cfg(test)]` modules) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Module path ("" for the crate root, "model::sections") -> its source file.
fn modules() -> BTreeMap<String, PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Some(name) = module_name(&src, &path) {
                    found.insert(name, path);
                }
            }
        }
    }
    found
}

/// `src/model/mod.rs` -> "model"; `src/lib.rs` -> ""; the binary's `main.rs` is not a module.
fn module_name(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some("main") if parts.len() == 1 => return None,
        Some("mod") | Some("lib") => {
            parts.pop();
        }
        _ => {}
    }
    Some(parts.join("::"))
}

/// Every path a file's non-test code names, as segments (use trees flattened).
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        let is_test = module.attrs.iter().any(|a| {
            a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
        });
        if !is_test {
            syn::visit::visit_item_mod(self, module);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        flatten(&item.tree, Vec::new(), &mut self.0);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

fn flatten(tree: &syn::UseTree, prefix: Vec<String>, into: &mut Vec<Vec<String>>) {
    let with = |name: String| {
        let mut p = prefix.clone();
        p.push(name);
        p
    };
    match tree {
        syn::UseTree::Path(p) => flatten(&p.tree, with(p.ident.to_string()), into),
        syn::UseTree::Name(n) => into.push(with(n.ident.to_string())),
        syn::UseTree::Rename(r) => into.push(with(r.ident.to_string())),
        syn::UseTree::Glob(_) => into.push(prefix),
        syn::UseTree::Group(g) => g
            .items
            .iter()
            .for_each(|t| flatten(t, prefix.clone(), into)),
    }
}

/// The crate module a path named in module `from` lands in, if it is one of ours.
fn resolve(from: &str, path: &[String], known: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) if known.contains_key(&join(&base, &[first])) => {}
        _ => return None,
    }
    (0..=rest.len())
        .rev()
        .map(|n| {
            join(
                &base,
                &rest[..n].iter().map(String::as_str).collect::<Vec<_>>(),
            )
        })
        .find(|m| known.contains_key(m))
}

fn join(base: &[&str], rest: &[&str]) -> String {
    base.iter()
        .chain(rest)
        .copied()
        .collect::<Vec<_>>()
        .join("::")
}

/// Whether `module` is `ancestor` or lies under it.
fn within(module: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || module == ancestor || module.starts_with(&format!("{ancestor}::"))
}

/// Module -> the modules of ours its non-test code uses, leaving out itself and its ancestors.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let known = modules();
    known
        .iter()
        .map(|(name, file)| {
            let source = std::fs::read_to_string(file).unwrap();
            let parsed =
                syn::parse_file(&source).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut paths = Paths::default();
            paths.visit_file(&parsed);
            let uses = paths
                .0
                .iter()
                .filter_map(|p| resolve(name, p, &known))
                .filter(|target| !within(name, target))
                .collect();
            (name.clone(), uses)
        })
        .collect()
}

/// A cycle through `start`, if there is one (depth-first: any one names the problem).
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, trail)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == start {
                return Some([trail.clone(), vec![start.to_string()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [trail.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

#[test]
fn no_two_modules_import_each_other_even_around_a_cycle() {
    let graph = graph();
    assert!(graph.contains_key("model::report"), "sources not found");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|c| c.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_model_imports_nothing_of_the_layers_around_it() {
    let graph = graph();
    let outside: Vec<String> = graph
        .iter()
        .filter(|(m, _)| within(m, "model"))
        .flat_map(|(m, uses)| uses.iter().map(move |u| (m, u)))
        .filter(|(_, used)| !within(used, "model") && *used != "units")
        .map(|(m, used)| format!("{m} uses {used}"))
        .collect();
    assert!(outside.is_empty(), "{}", outside.join("\n"));
}

/// The crate's layers, lowest first (docs/ARCHITECTURE.md): a module may use modules of its
/// own layer and of those below, never one above. Leaves that several layers print with
/// (`text`, `units`) sit at the bottom; the options (`cli`) sit under the views that read them
/// and above everything that must not depend on a command line.
const LAYERS: [&[&str]; 8] = [
    &["text", "units"],
    &["model", "system"],
    &["launch", "probes", "symbolize", "unwind"],
    &["collect"],
    &["cli"],
    &["output", "present"],
    &["exports", "intervals", "live", "serve"],
    &["", "run"],
];

/// The layer of a module (of its top-level module), if it has one.
fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or("");
    LAYERS.iter().position(|layer| layer.contains(&top))
}

/// The imports that point up the layers in `graph`, and the modules in no layer.
fn upward_imports(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, uses) in graph {
        let Some(at) = layer_of(module) else {
            wrong.push(format!("{module} is in no layer of LAYERS"));
            continue;
        };
        for used in uses {
            if layer_of(used).is_some_and(|above| above > at) {
                wrong.push(format!("{module} uses {used}, a layer above it"));
            }
        }
    }
    wrong
}

#[test]
fn no_module_imports_one_of_a_layer_above_it() {
    let mut graph = graph();
    // This file is test code, compiled only into the tests.
    graph.remove("layering");
    let wrong = upward_imports(&graph);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn an_upward_import_or_an_unlayered_module_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("probes::mmap_lock", &["cli", "model::report"][..]),
        ("present::text", &["text", "model"][..]),
        ("newcomer", &[][..]),
    ]
    .iter()
    .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
    .collect();
    assert_eq!(
        upward_imports(&graph),
        [
            "newcomer is in no layer of LAYERS",
            "probes::mmap_lock uses cli, a layer above it",
        ]
    );
}

/// The graph finds what it must: a child module named by a parent, a sibling named through
/// `super::`, a group in a use tree; and a cycle when there is one.
#[test]
fn paths_resolve_to_modules_and_cycles_are_found() {
    let known: BTreeMap<String, PathBuf> = ["", "model", "model::report", "model::schema", "units"]
        .iter()
        .map(|m| (m.to_string(), PathBuf::new()))
        .collect();
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    let at = |from, p| resolve(from, &path(p), &known);
    assert_eq!(at("model", "report::build"), Some("model::report".into()));
    assert_eq!(
        at("model::report", "super::schema::Entry"),
        Some("model::schema".into())
    );
    assert_eq!(
        at("model::report", "crate::units::human_ns"),
        Some("units".into())
    );
    assert_eq!(at("model::report", "std::fmt::Write"), None);
    let mut uses = Vec::new();
    let tree: syn::ItemUse = syn::parse_str("use super::{schema::Entry, Harvest};").unwrap();
    flatten(&tree.tree, Vec::new(), &mut uses);
    assert_eq!(uses, [path("super::schema::Entry"), path("super::Harvest")]);

    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a"][..]),
        ("d", &["a"][..]),
    ]
    .iter()
    .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
    .collect();
    assert_eq!(cycle_through(&graph, "a").unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(cycle_through(&graph, "d"), None);
}
