//! The page-fault family's part of the report: how many faults the targets took, how many of
//! them fell back to mmap_lock, and the filemap faults taken under it.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;
use tracer_common::{
    FAULTS_FILEMAP, FAULTS_FILEMAP_UNDER_LOCK, FAULTS_TOOK_MMAP_LOCK, FAULTS_USER, FAULT_SLOTS,
    KIND_WAIT,
};

use super::Inputs;
use crate::model::json_figures::{expect, n};
use crate::model::{Cause, Report};

/// The kernel's fault counters (FAULT_COUNTS, indexed by `FAULTS_*`), cumulative; the
/// `FAULTS_USER` slot is filled by user space from /proc (`set_taken_from_proc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Raw(pub [u64; FAULT_SLOTS as usize]);

impl Raw {
    /// Every slot is a running count.
    pub fn since(&self, before: &Raw) -> Raw {
        Raw(std::array::from_fn(|i| {
            self.0[i].saturating_sub(before.0[i])
        }))
    }

    /// The targets' faults of every kind, which only /proc counts.
    pub fn set_taken_from_proc(&mut self, faults: u64) {
        self.0[FAULTS_USER as usize] = faults;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    /// Page faults of the targets on their memory, minor and major, taken in user mode or in
    /// the kernel (copy_to_user in a syscall), from /proc/PID/stat.
    pub total: u64,
    /// Lock operations begun by user-mode page faults (that fell back from the per-VMA lock),
    /// told by the kernel entering through an exception; a fault retried after dropping the
    /// lock for I/O counts once per attempt. Kernel-mode faults are not counted here.
    pub took_mmap_lock: u64,
    pub filemap: u64,
    /// filemap faults while the faulting thread held the target's mmap_lock.
    pub filemap_under_mmap_lock: u64,
    /// Holds of mmap_lock by the targets' page faults (the entries' `page_fault` cause) that
    /// came from user mode.
    pub user_mode_holds: u64,
    /// Holds of mmap_lock by the targets' page faults taken in the kernel, inside a syscall
    /// that is not an mm syscall (copy_to_user in read(), futex, ...): told by the kernel
    /// stack, not counted in `took_mmap_lock`. x86 sends them straight to mmap_lock, without
    /// trying the per-VMA lock.
    pub kernel_mode_holds: u64,
}

pub fn build(raw: &Raw, inputs: &Inputs) -> Faults {
    let (user_mode_holds, kernel_mode_holds) = fault_holds(inputs);
    let slot = |i: u32| raw.0[i as usize];
    Faults {
        total: slot(FAULTS_USER),
        took_mmap_lock: slot(FAULTS_TOOK_MMAP_LOCK),
        filemap: slot(FAULTS_FILEMAP),
        filemap_under_mmap_lock: slot(FAULTS_FILEMAP_UNDER_LOCK),
        user_mode_holds,
        kernel_mode_holds,
    }
}

/// Holds by the targets' own page faults: (from user mode, from the kernel). A lock taken
/// for a fault outside any mm syscall is a user-mode fault when the kernel was entered
/// through the exception (`fault` set), else a fault inside another syscall.
fn fault_holds(inputs: &Inputs) -> (u64, u64) {
    let mut holds = (0, 0);
    for raw in inputs.entries {
        let k = &raw.key;
        if k.kind == KIND_WAIT || k.locker_pid != 0 || (inputs.cause)(k) != Cause::PageFault {
            continue;
        }
        if k.fault != 0 {
            holds.0 += raw.value.count;
        } else {
            holds.1 += raw.value.count;
        }
    }
    holds
}

/// The fault figures, each saying which faults it counts: the /proc total counts every fault,
/// the kernel's counter only user-mode ones (an exception entry), and the "page fault" cause
/// rows both, kernel-mode ones told by their kernel stack.
pub fn text(out: &mut String, f: &Faults, r: &Report) {
    if !r.features.faults {
        return;
    }
    let who = if r.target.system_wide {
        "traced processes"
    } else {
        "target"
    };
    let _ = writeln!(
        out,
        "\nPage faults: {} by the {who} (minor + major, in user mode and in the kernel, from /proc)",
        f.total
    );
    let user_mode = if r.features.per_vma_locks {
        "user-mode faults that fell back from the per-VMA lock"
    } else {
        "user-mode faults (this kernel has no per-VMA locks: every one takes mmap_lock)"
    };
    let _ = writeln!(
        out,
        "  {user_mode}: took mmap_lock {} times (each retry counts), held it {} times",
        f.took_mmap_lock, f.user_mode_holds
    );
    let _ = writeln!(
        out,
        "  kernel-mode faults (inside a syscall, e.g. copy_to_user in read(); no per-VMA lock): \
         held mmap_lock {} times, counting holds with a kernel stack only (the others are in \
         `in read()`, `in write()` and `in a syscall`)",
        f.kernel_mode_holds
    );
    if r.features.filemap {
        let _ = writeln!(
            out,
            "  filemap faults: {}, {} of them under mmap_lock",
            f.filemap, f.filemap_under_mmap_lock
        );
    } else {
        let _ = writeln!(
            out,
            "  filemap faults: not traced (the kernel lacks filemap:mm_filemap_fault, Linux 6.4)"
        );
    }
}

/// The filemap faults under the lock are some of the filemap faults, and the page-fault holds
/// split into user-mode and kernel-mode ones add up to the targets' own "page fault" hold
/// entries.
pub fn check(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    let faults = &report["faults"];
    expect(
        broken,
        n(faults, "filemap_under_mmap_lock") <= n(faults, "filemap"),
        || "more filemap faults under mmap_lock than filemap faults".to_string(),
    );
    let split = n(faults, "user_mode_holds") + n(faults, "kernel_mode_holds");
    let holds: u64 = entries
        .iter()
        .filter(|e| e["kind"] == "hold" && e["cause"] == "page_fault")
        .filter(|e| e["outside_locker"] == false)
        .map(|e| n(e, "count"))
        .sum();
    expect(broken, split == holds, || {
        format!("page-fault holds: {split} user- and kernel-mode, the entries {holds}")
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::tests::attributed;
    use crate::model::{build_report, RawEntry};
    use tracer_common::{AggKey, AggValue, KIND_HOLD};

    /// Debian 12's 6.1: no per-VMA locks (every fault takes mmap_lock), no filemap event.
    #[test]
    fn fault_lines_on_a_kernel_without_per_vma_locks_or_filemap_faults() {
        let (mut harvest, symbols, meta) = attributed();
        harvest.features.per_vma_locks = false;
        harvest.features.filemap = false;
        let report = build_report(&harvest, &symbols, &meta);
        let mut text = String::new();
        super::text(&mut text, &report.sections.faults, &report);
        assert!(!text.contains("fell back from the per-VMA lock"), "{text}");
        for line in [
            "  user-mode faults (this kernel has no per-VMA locks: every one takes mmap_lock): \
             took mmap_lock 3 times (each retry counts), held it 2 times\n",
            "  filemap faults: not traced (the kernel lacks filemap:mm_filemap_fault, Linux 6.4)\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    /// Only the targets' own page-fault holds count, split by how the kernel was entered.
    #[test]
    fn fault_holds_split_by_user_and_kernel_mode() {
        let hold = |fault, locker_pid, count| {
            let key = AggKey {
                kind: KIND_HOLD,
                fault,
                locker_pid,
                ..AggKey::default()
            };
            let value = AggValue {
                count,
                ..AggValue::default()
            };
            RawEntry::exact(key, value)
        };
        let mut wait = hold(1, 0, 100);
        wait.key.kind = KIND_WAIT;
        let mut munmap = hold(0, 0, 1000);
        munmap.key.syscall = 2;
        let entries = [
            hold(1, 0, 3),
            hold(1, 0, 4),
            hold(0, 0, 5),
            hold(1, 42, 10_000),
            wait,
            munmap,
        ];
        let inputs = Inputs {
            entries: &entries,
            cause: &|k| {
                if k.syscall == 2 {
                    Cause::Munmap
                } else {
                    Cause::PageFault
                }
            },
            kernel_frames: &|_| Vec::new(),
            frames: &|_, _, _| Vec::new(),
            name: &|_| String::new(),
        };
        let faults = build(&Raw([9, 8, 7, 6]), &inputs);
        assert_eq!((faults.user_mode_holds, faults.kernel_mode_holds), (7, 5));
        assert_eq!(
            (faults.total, faults.took_mmap_lock, faults.filemap),
            (9, 8, 7)
        );
        assert_eq!(faults.filemap_under_mmap_lock, 6);
    }

    /// Each impossible figure of the section is named, and the built section has none.
    #[test]
    fn impossible_fault_figures_are_named() {
        let (harvest, symbols, meta) = attributed();
        let json = serde_json::to_value(build_report(&harvest, &symbols, &meta)).unwrap();
        let broken = |edit: &dyn Fn(&mut Value)| {
            let mut v = json.clone();
            edit(&mut v);
            let mut broken = Vec::new();
            check(
                &v,
                crate::model::json_figures::array(&v, "entries"),
                &mut broken,
            );
            broken
        };
        assert_eq!(broken(&|_| ()), Vec::<String>::new());
        let found = broken(&|v| v["faults"]["filemap_under_mmap_lock"] = 11.into());
        assert!(
            found[0].contains("more filemap faults under mmap_lock"),
            "{found:?}"
        );
        let found = broken(&|v| v["faults"]["user_mode_holds"] = 3.into());
        assert!(found[0].contains("page-fault holds: 4"), "{found:?}");
    }

    #[test]
    fn a_window_subtracts_every_counter() {
        let mut now = Raw([100, 50, 20, 10]);
        now.set_taken_from_proc(150);
        assert_eq!(now.since(&Raw([40, 10, 5, 10])), Raw([110, 40, 15, 0]));
    }
}
