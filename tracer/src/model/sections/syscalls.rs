//! The mm syscall family's part of the report (`--syscall-times`): per syscall, how often it
//! ran, how long it took, and how much of that was mmap_lock wait and hold.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use tracer_common::{SyscallTotals, MM_SYSCALLS};

use super::Inputs;
use crate::model::json_figures::{expect, n};
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

pub fn build(raw: &Raw, _inputs: &Inputs) -> Syscalls {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::tests::attributed;
    use crate::model::{build_report, Report};

    fn report_with(totals: &[(usize, u64, u64)]) -> Report {
        let (mut harvest, symbols, meta) = attributed();
        harvest.sections.syscalls = Raw::default();
        for &(slot, count, total_ns) in totals {
            harvest.sections.syscalls.0[slot] = SyscallTotals {
                count,
                total_ns,
                ..SyscallTotals::default()
            };
        }
        build_report(&harvest, &symbols, &meta)
    }

    fn text_of(report: &Report) -> String {
        let mut out = String::new();
        text(&mut out, &report.sections.syscalls, report);
        out
    }

    #[test]
    fn only_the_syscalls_that_ran_are_listed_most_time_first() {
        let report = report_with(&[(0, 3, 1_000), (2, 1, 9_000_000)]);
        let text = text_of(&report);
        let rows: Vec<&str> = text
            .lines()
            .skip(3)
            .map(|l| l.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(rows, ["mprotect", "mmap"], "{text}");
        assert_eq!(report.sections.syscalls["munmap"].count, 0);
    }

    #[test]
    fn nothing_is_said_when_no_syscall_ran_or_they_were_not_traced() {
        assert_eq!(text_of(&report_with(&[])), "");
        let mut untraced = report_with(&[(1, 2, 5_000)]);
        assert!(!text_of(&untraced).is_empty());
        untraced.features.syscalls = false;
        assert_eq!(text_of(&untraced), "");
    }

    #[test]
    fn lock_time_beyond_the_syscall_is_named() {
        let report = report_with(&[(1, 2, 5_000)]);
        let mut json = serde_json::to_value(&report).unwrap();
        let mut broken = Vec::new();
        check(&json, &[], &mut broken);
        assert_eq!(broken, Vec::<String>::new());
        json["syscalls"]["munmap"]["lock_hold_ns"] = 6_000.into();
        check(&json, &[], &mut broken);
        assert_eq!(
            broken,
            ["munmap: 6000 ns of lock wait and hold in 5000 ns of syscall"]
        );
    }

    #[test]
    fn a_window_subtracts_every_total() {
        let munmap = |count, total_ns, lock_wait_ns, lock_hold_ns| {
            let mut raw = Raw::default();
            raw.0[1] = SyscallTotals {
                count,
                total_ns,
                lock_wait_ns,
                lock_hold_ns,
            };
            raw
        };
        let window = munmap(5, 500, 50, 100).since(&munmap(2, 200, 20, 40));
        assert_eq!(window, munmap(3, 300, 30, 60));
    }
}
