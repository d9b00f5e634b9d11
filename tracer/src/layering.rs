//! The module graphs of this crate and of the eBPF programs' crate, read from their sources:
//! data flows one way (docs/ARCHITECTURE.md), so no two modules import each other, directly or
//! around a cycle, no module imports one of a layer above its own, the model imports nothing of
//! the layers around it, and no eBPF program file imports another. A parent module's use of its children and a child's use of its ancestors
//! (`super::Harvest`) are the usual Rust shape and do not count; siblings and cousins do. Test
//! code (`#[cfg(test)]` modules) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A crate's sources: its `src` directory and the file that is its root ("lib" or "main").
#[derive(Clone, Copy)]
struct Crate {
    dir: &'static str,
    root: &'static str,
}

/// This crate, the user-space side (its binary's `main.rs` is not a module).
const TRACER: Crate = Crate {
    dir: ".",
    root: "lib",
};

/// The eBPF programs' crate (its `lib.rs` is an empty library for cargo's rebuilds).
const EBPF: Crate = Crate {
    dir: "../tracer-ebpf",
    root: "main",
};

/// Module path ("" for the crate root, "model::sections") -> its source file.
fn modules(krate: Crate) -> BTreeMap<String, PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(krate.dir)
        .join("src");
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Some(name) = module_name(&src, &path, krate.root) {
                    found.insert(name, path);
                }
            }
        }
    }
    found
}

/// `src/model/mod.rs` -> "model"; the root (`src/lib.rs`) -> ""; the crate's other top-level
/// `lib.rs` or `main.rs` is not a module.
fn module_name(src: &Path, file: &Path, root: &str) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.last().map(String::as_str) {
        Some(name) if parts.len() == 1 && name == root => {
            parts.pop();
        }
        Some("main") | Some("lib") if parts.len() == 1 => return None,
        Some("mod") => {
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
fn graph(krate: Crate) -> BTreeMap<String, BTreeSet<String>> {
    let known = modules(krate);
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

/// Every cycle of `graph`, one per module on one.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    graph
        .keys()
        .filter_map(|m| cycle_through(graph, m))
        .map(|c| c.join(" -> "))
        .collect()
}

#[test]
fn no_two_modules_import_each_other_even_around_a_cycle() {
    let graph = graph(TRACER);
    assert!(graph.contains_key("model::report"), "sources not found");
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn no_two_ebpf_files_import_each_other_even_around_a_cycle() {
    let graph = graph(EBPF);
    assert!(graph.contains_key("mmap_lock"), "eBPF sources not found");
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_model_imports_nothing_of_the_layers_around_it() {
    let graph = graph(TRACER);
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

/// What the views (live view, interval printer, daemon, exports) must not name: the loop's
/// state and the kernel side. They are shown pure data (`collect::Shown`, a `Report`).
const BEYOND_THE_VIEWS: [&str; 6] = ["Watch", "Windows", "Session", "Forget", "Source", "Probes"];

/// The names of `BEYOND_THE_VIEWS` that the view modules' non-test code names.
fn views_reaching_back() -> Vec<String> {
    let known = modules(TRACER);
    let views = ["exports", "intervals", "live", "serve"];
    let mut found = Vec::new();
    for (module, file) in &known {
        if !views.iter().any(|v| within(module, v)) {
            continue;
        }
        let source = std::fs::read_to_string(file).unwrap();
        let mut paths = Paths::default();
        paths.visit_file(&syn::parse_file(&source).unwrap());
        for path in &paths.0 {
            if path
                .last()
                .is_some_and(|n| BEYOND_THE_VIEWS.contains(&n.as_str()))
            {
                found.push(format!("{module} names {}", path.join("::")));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn no_view_names_the_loops_state_or_the_kernel_side() {
    let found = views_reaching_back();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The eBPF crate's tiers, lowest first (docs/ARCHITECTURE.md): leaves (maps, registers, the
/// target filter, a hit decoded, where operations are recorded, their causes), the middle that
/// several programs share, then the program files, one per attachment family, which import no
/// other program file (`PROGRAM_TIER`), and the crate root that declares them all.
const EBPF_TIERS: [&[&str]; 4] = [
    &["causes", "context", "event", "filter", "maps", "records"],
    &[
        "blockers",
        "holding",
        "lean",
        "operation",
        "pending",
        "timeline",
        "user_stacks",
    ],
    &[
        "contention",
        "faults",
        "floor",
        "lifecycle",
        "mmap_lock",
        "sched",
        "syscalls",
        "wakers",
    ],
    &[""],
];

/// The tier of EBPF_TIERS whose files are programs.
const PROGRAM_TIER: usize = 2;

/// The layer of a module (of its top-level module) in `layers`, if it has one.
fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or("");
    layers.iter().position(|layer| layer.contains(&top))
}

/// The imports that point up `layers` in `graph` (or, in `apart`, across a layer whose modules
/// must not use one another), and the modules in no layer.
fn upward_imports(
    graph: &BTreeMap<String, BTreeSet<String>>,
    layers: &[&[&str]],
    apart: Option<usize>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, uses) in graph {
        let Some(at) = layer_of(layers, module) else {
            wrong.push(format!("{module} is in no layer"));
            continue;
        };
        for used in uses {
            match layer_of(layers, used) {
                Some(above) if above > at => {
                    wrong.push(format!("{module} uses {used}, a layer above it"))
                }
                Some(same) if same == at && apart == Some(at) => {
                    wrong.push(format!("{module} uses {used}, a file of its own layer"))
                }
                _ => {}
            }
        }
    }
    wrong
}

#[test]
fn no_module_imports_one_of_a_layer_above_it() {
    let mut graph = graph(TRACER);
    // This file is test code, compiled only into the tests.
    graph.remove("layering");
    let wrong = upward_imports(&graph, &LAYERS, None);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_ebpf_file_imports_one_of_a_tier_above_it_nor_a_program_file_another() {
    let graph = graph(EBPF);
    let wrong = upward_imports(&graph, &EBPF_TIERS, Some(PROGRAM_TIER));
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
        upward_imports(&graph, &LAYERS, None),
        [
            "newcomer is in no layer",
            "probes::mmap_lock uses cli, a layer above it",
        ]
    );
}

/// The eBPF crate's shape before its tiers: a program file as the library of others (lean
/// importing mmap_lock's helpers), and one program file calling another.
#[test]
fn an_ebpf_upward_import_or_one_between_program_files_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("lean", &["mmap_lock", "maps"][..]),
        ("contention", &["mmap_lock", "operation"][..]),
        ("maps", &[][..]),
    ]
    .iter()
    .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
    .collect();
    assert_eq!(
        upward_imports(&graph, &EBPF_TIERS, Some(PROGRAM_TIER)),
        [
            "contention uses mmap_lock, a file of its own layer",
            "lean uses mmap_lock, a layer above it",
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
