//! The mm syscall family's part of the report (`--syscall-times`): per syscall, how often it
//! ran, how long it took, and how much of that was mmap_lock wait and hold.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use tracer_common::{SyscallTotals, MM_SYSCALLS};

use super::Seen;
use crate::model::invariants::{expect, n};
use crate::model::Report;
use crate::units::human_ns;

/// The kernel's per-syscall totals (SYSCALL_TOTALS, in `MM_SYSCALLS` order), cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Raw(pub [SyscallTotals; MM_SYSCALLS.len()]);

impl Raw {
    /// Every total is a running one.
    pub fn since(&self, before: &Raw) -> Raw {
        Raw(std::array::from_fn(|i| self.0[i].since(&before.0[i])))
    }
}

/// Per mm syscall by name: count, time in the syscall, and its mmap_lock wait and hold.
pub type Syscalls = BTreeMap<&'static str, SyscallTotals>;

pub fn build(raw: &Raw, _seen: &Seen) -> Syscalls {
    MM_SYSCALLS
        .iter()
        .zip(raw.0)
        .map(|(name, totals)| (*name, totals))
        .collect()
}

/// The syscalls that ran, most time first.
pub fn text(out: &mut String, syscalls: &Syscalls, r: &Report) {
    if !r.features.syscalls || syscalls.values().all(|s| s.count == 0) {
        return;
    }
    let _ = writeln!(out, "\nSyscalls:");
    let _ = writeln!(
        out,
        "{:<9} {:>9} {:>10} {:>10} {:>12} {:>12}",
        "syscall", "count", "total", "avg", "lock wait", "lock hold"
    );
    let mut rows: Vec<_> = syscalls.iter().filter(|(_, s)| s.count > 0).collect();
    rows.sort_by_key(|(_, s)| std::cmp::Reverse(s.total_ns));
    for (name, s) in rows {
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>10} {:>10} {:>12} {:>12}",
            name,
            s.count,
            human_ns(s.total_ns),
            human_ns(s.total_ns / s.count.max(1)),
            human_ns(s.lock_wait_ns),
            human_ns(s.lock_hold_ns)
        );
    }
}

/// A syscall's lock wait and hold fit in the time spent in it.
pub fn check(report: &Value, _entries: &[Value], broken: &mut Vec<String>) {
    let Some(syscalls) = report["syscalls"].as_object() else {
        return;
    };
    for (name, s) in syscalls {
        let lock = n(s, "lock_wait_ns") + n(s, "lock_hold_ns");
        expect(broken, lock <= n(s, "total_ns"), || {
            format!(
                "{name}: {lock} ns of lock wait and hold in {} ns of syscall",
                n(s, "total_ns")
            )
        });
    }
}
