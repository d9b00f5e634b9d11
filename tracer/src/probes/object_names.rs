//! Checks `tracer_common::map_names` and `program_names` against the compiled eBPF object,
//! both ways: every name user space opens is a map (or the config global) or a program of the
//! object, and every map and program of the object has its name there, so that a renamed or
//! new `#[map]` static or program fails here rather than at the first trace that uses it.

use std::collections::BTreeSet;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::{map_names, program_names};

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
fn differences(named: &[&str], in_object: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let named: BTreeSet<String> = named.iter().map(|s| s.to_string()).collect();
    (
        named.difference(in_object).cloned().collect(),
        in_object.difference(&named).cloned().collect(),
    )
}

#[test]
fn every_map_name_is_a_map_of_the_object_and_every_map_is_named() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object is ELF");
    let (unknown, unnamed) = differences(&map_names::MAPS, &symbols_in(&elf, |s| s == "maps"));
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

#[test]
fn every_program_name_is_a_program_of_the_object_and_every_program_is_named() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object is ELF");
    // aya-ebpf's program sections: `tracepoint` (classic, attached by name from user space)
    // and `tp_btf/EVENT`.
    let in_object = symbols_in(&elf, |s| s == "tracepoint" || s.starts_with("tp_btf/"));
    let (unknown, unnamed) = differences(&program_names::PROGRAMS, &in_object);
    assert!(
        unknown.is_empty() && unnamed.is_empty(),
        "program_names lists programs the object lacks: {unknown:?}; the object has programs \
         program_names lacks: {unnamed:?}"
    );
}
