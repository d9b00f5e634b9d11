//! Checks `tracer_common::map_names` against the compiled eBPF object, both ways: every name
//! user space opens is a map (or the config global) of the object, and every map of the object
//! has its name there, so that a renamed or new `#[map]` static fails here rather than at the
//! first trace that reads it.

use std::collections::BTreeSet;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::map_names;

/// The names of the symbols defined in the sections called `section`.
fn symbols_in(elf: &object::File, section: &str) -> BTreeSet<String> {
    elf.symbols()
        .filter(|symbol| {
            symbol
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok())
                .is_some_and(|s| s.name() == Ok(section))
        })
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .collect()
}

#[test]
fn every_map_name_is_a_map_of_the_object_and_every_map_is_named() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object is ELF");
    let in_object = symbols_in(&elf, "maps");
    let named: BTreeSet<String> = map_names::MAPS.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<_> = named.difference(&in_object).collect();
    let unnamed: Vec<_> = in_object.difference(&named).collect();
    assert!(
        unknown.is_empty() && unnamed.is_empty(),
        "map_names lists maps the object lacks: {unknown:?}; the object has maps map_names \
         lacks: {unnamed:?}"
    );
    let globals = elf
        .symbols()
        .filter_map(|s| s.name().ok())
        .any(|name| name == map_names::CONFIG);
    assert!(globals, "no {} global in the object", map_names::CONFIG);
}
