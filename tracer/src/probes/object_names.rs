//! Checks the map and program names each family gives (`Family::maps`, `Family::programs`,
//! the core's in `probes/mod.rs`, the bench floor's) against the compiled eBPF object, both
//! ways: every name user space opens is a map (or the config global) or a program of the
//! object, and every map and program of the object is named by some family, so that a renamed
//! or new `#[map]` static or program fails here rather than at the first trace that uses it.

use std::collections::BTreeSet;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::{floor, CONFIG, CORE_MAPS, FAMILIES};

/// The names of the global symbols defined in the sections whose name `section` accepts.
fn symbols_in(elf: &object::File, section: impl Fn(&str) -> bool) -> BTreeSet<String> {
    elf.symbols()
        .filter(|symbol| symbol.is_global())
        .filter(|symbol| {
            symbol
                .section_index()
                .and_then(|i| elf.section_by_index(i).ok())
                .is_some_and(|s| s.name().is_ok_and(&section))
        })
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .collect()
}

/// What `named` lists that the object lacks, and what the object has that it does not list.
fn differences<'a>(
    named: impl IntoIterator<Item = &'a str>,
    in_object: &BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    let named: BTreeSet<String> = named.into_iter().map(str::to_string).collect();
    (
        named.difference(in_object).cloned().collect(),
        in_object.difference(&named).cloned().collect(),
    )
}

/// Every name, once: a name given twice (two families claiming one map) fails as well.
fn all_named<'a>(lists: impl IntoIterator<Item = &'a [&'a str]>) -> Vec<&'a str> {
    let names: Vec<&str> = lists.into_iter().flatten().copied().collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a name given twice: {names:?}");
    names
}

#[test]
fn every_map_name_is_a_map_of_the_object_and_every_map_is_named() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object is ELF");
    let named =
        all_named(std::iter::once(&CORE_MAPS[..]).chain(FAMILIES.iter().map(|family| family.maps)));
    let (unknown, unnamed) = differences(named, &symbols_in(&elf, |s| s == "maps"));
    assert!(
        unknown.is_empty() && unnamed.is_empty(),
        "the families name maps the object lacks: {unknown:?}; the object has maps no family \
         names: {unnamed:?}"
    );
    let globals = elf
        .symbols()
        .filter_map(|s| s.name().ok())
        .any(|name| name == CONFIG);
    assert!(globals, "no {CONFIG} global in the object");
}

#[test]
fn every_program_name_is_a_program_of_the_object_and_every_program_is_named() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object is ELF");
    // aya-ebpf's program sections: `tracepoint` (classic, attached by name from user space)
    // and `tp_btf/EVENT`.
    let in_object = symbols_in(&elf, |s| s == "tracepoint" || s.starts_with("tp_btf/"));
    let named = all_named(
        std::iter::once(&floor::PROGRAMS[..]).chain(FAMILIES.iter().map(|family| family.programs)),
    );
    let (unknown, unnamed) = differences(named, &in_object);
    assert!(
        unknown.is_empty() && unnamed.is_empty(),
        "the families name programs the object lacks: {unknown:?}; the object has programs \
         no family names: {unnamed:?}"
    );
}
