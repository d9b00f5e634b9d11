//! The report's sections that one probe family each adds (page faults, mm syscalls). A
//! family's whole model part is its module here: its raw counters as read from its maps (with
//! how a window of them is taken), its part of the report and how it is built, its lines in the
//! text report and its invariants. This module is the list that joins them, as `FAMILIES` is
//! for the probes: a new section is a module and one line in each list below.
//!
//! Every section module has the same four functions with the same parameters, used or not
//! (`Raw::since`, `build`, `text`, `check`), so that the lists read alike. `since`, `build` and
//! `text` destructure the structs field by field: a section left out of them does not
//! compile. `check` reads the JSON form and is a plain list: keep it in step.
//!
//! Sections are flattened into the report, so each is a top-level key of the JSON.

pub mod faults;
pub mod syscalls;
pub mod wakers;

use serde::Serialize;
use serde_json::Value;
use tracer_common::AggKey;

use super::{Cause, Frame, RawEntry, Report};

/// The families' raw counters, cumulative like the maps they are read from (`Harvest`'s
/// `sections`; each family's probes module fills its own, and the collect loop adds what only
/// /proc knows: the targets' page fault total).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawSections {
    pub faults: faults::Raw,
    pub syscalls: syscalls::Raw,
    pub wakers: wakers::Raw,
}

impl RawSections {
    /// What was counted after `before` (both cumulative snapshots of one trace).
    pub fn since(&self, before: &RawSections) -> RawSections {
        let RawSections {
            faults,
            syscalls,
            wakers,
        } = self;
        RawSections {
            faults: faults.since(&before.faults),
            syscalls: syscalls.since(&before.syscalls),
            wakers: wakers.since(&before.wakers),
        }
    }
}

/// What a section is built from besides its own counters.
pub struct Inputs<'a> {
    /// The harvest's aggregated waits and holds.
    pub entries: &'a [RawEntry],
    /// An entry's cause, as the report's rows show it (its kernel stack is symbolized).
    pub cause: &'a dyn Fn(&AggKey) -> Cause,
    /// A kernel stack's frames, without the tracing machinery.
    pub kernel_frames: &'a dyn Fn(i32) -> Vec<Frame>,
    /// A stack's frames (kernel stack, user stack, the process whose user stack it is): user
    /// frames then kernel frames, as the entries show them.
    pub frames: &'a dyn Fn(i32, i32, u32) -> Vec<Frame>,
    /// A process's name, "?" when unknown.
    pub name: &'a dyn Fn(u32) -> String,
}

/// The families' parts of the report, in the order of their JSON keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sections {
    pub faults: faults::Faults,
    /// Per mm syscall: count, time in the syscall, and its mmap_lock wait and hold.
    pub syscalls: syscalls::Syscalls,
    /// The holders' sleeps by who ended them (the per-VMA lock waits named).
    pub wakers: wakers::Wakers,
}

impl Sections {
    pub fn build(raw: &RawSections, inputs: &Inputs) -> Sections {
        let RawSections {
            faults,
            syscalls,
            wakers,
        } = raw;
        Sections {
            faults: faults::build(faults, inputs),
            syscalls: syscalls::build(syscalls, inputs),
            wakers: wakers::build(wakers, inputs),
        }
    }
}

/// The sections' lines in the text report, in order (each says nothing when its family was
/// not attached).
pub fn text(out: &mut String, report: &Report) {
    let Sections {
        faults,
        syscalls,
        wakers,
    } = &report.sections;
    faults::text(out, faults, report);
    syscalls::text(out, syscalls, report);
    wakers::text(out, wakers, report);
}

/// Each section's invariants, on the report's JSON form (see `invariants`).
pub fn check(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    faults::check(report, entries, broken);
    syscalls::check(report, entries, broken);
    wakers::check(report, entries, broken);
}

#[cfg(test)]
mod tests {
    use crate::model::build_report;
    use crate::model::report::tests::attributed;

    /// Flattened, the sections keep the places their keys had when they were fields of the
    /// report: between `in_flight` and `features`.
    #[test]
    fn sections_are_top_level_json_keys_in_their_place() {
        let (harvest, symbols, meta) = attributed();
        let json = serde_json::to_string(&build_report(&harvest, &symbols, &meta)).unwrap();
        let at = |key: &str| {
            json.find(key)
                .unwrap_or_else(|| panic!("no {key} in {json}"))
        };
        let places = [
            at(r#""in_flight":{"#),
            at(r#""faults":{"total":"#),
            at(r#""syscalls":{"brk":"#),
            at(r#""features":{"#),
        ];
        assert!(places.is_sorted(), "{places:?} in {json}");
    }
}
