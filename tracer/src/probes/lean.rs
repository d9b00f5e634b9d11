//! Reading the per-CPU LEAN_AGG array of listed targets, by target, kind, mode and cause: with
//! `--lean` all their operations, which stand for their totals too, beside the operations its
//! threads (LEAN_THREADS) have in flight; with the defaults their short operations charged to
//! nobody, which the kernel counted in the totals already.

use std::collections::HashMap;

use anyhow::Result;
use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    cause_parts, lean_agg_index, totals_index, AggKey, AggValue, LeanThread, ModeTotals,
    FAST_CAUSES, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE, NO_STACK, TOTALS_SLOTS,
};

use super::{Family, Probes};
use crate::model::{Harvest, RawEntry};

pub(super) const FAMILY: Family = Family {
    read,
    maps: &[LEAN_AGG, LEAN_THREADS, LEAN_ENDED],
    ..Family::NOTHING
};

const LEAN_AGG: &str = "LEAN_AGG";
const LEAN_THREADS: &str = "LEAN_THREADS";
/// The kernel side's scratch for a long wait or hold waiting for its cause; never read here.
const LEAN_ENDED: &str = "LEAN_ENDED";

/// Adds the array's entries (with `--lean`, its totals too), and the operations in flight of
/// the lean path's threads.
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    if let Some(slots) = &probes.slots {
        let lean = read_lean_entries(&super::map_ref(&probes.ebpf, LEAN_AGG)?, slots)?;
        if probes.lean_array {
            add_lean_totals(&mut harvest.totals, &lean);
        }
        merge_entries(&mut harvest.entries, lean);
    }
    if !probes.lean_threads {
        return Ok(());
    }
    // Beside those of LOCK_STATE, where a thread goes whose entry another thread has (read by
    // the mmap_lock family first).
    let threads: Vec<LeanThread> = super::read_shared_array(&probes.ebpf, LEAN_THREADS)?;
    let mms = super::read_target_mms(&probes.ebpf)?;
    super::mmap_lock::add_in_flight(
        &mut harvest.in_flight,
        threads.iter().map(|thread| (&thread.key, &thread.timing)),
        &mms,
    );
    Ok(())
}

/// The targets' own acquisitions, waits and holds, which the lean path counts in its entries
/// only (each acquisition ends a wait).
fn add_lean_totals(totals: &mut [ModeTotals; TOTALS_SLOTS as usize], lean: &[RawEntry]) {
    for entry in lean {
        let totals = &mut totals[totals_index(false, entry.key.mode) as usize];
        let v = &entry.value;
        let (count, ns, max) = if entry.key.kind == KIND_WAIT {
            totals.acquisitions += v.count;
            (
                &mut totals.waits,
                &mut totals.wait_ns,
                &mut totals.max_wait_ns,
            )
        } else {
            (
                &mut totals.holds,
                &mut totals.hold_ns,
                &mut totals.max_hold_ns,
            )
        };
        *count += v.count;
        *ns += v.total_ns;
        *max = (*max).max(v.max_ns);
    }
}

/// Adds `lean` to `entries`: an entry of the same key (the general path's share of it: a short
/// operation that was charged to someone) takes its sums.
fn merge_entries(entries: &mut Vec<RawEntry>, lean: Vec<RawEntry>) {
    let unstacked: HashMap<AggKey, usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.key.kernel_stack == NO_STACK && e.key.user_stack == NO_STACK)
        .map(|(i, e)| (e.key, i))
        .collect();
    for entry in lean {
        match unstacked.get(&entry.key) {
            Some(&i) => entries[i].value.merge(&entry.value),
            None => entries.push(entry),
        }
    }
}

/// The per-CPU array as entries without stacks, one per target, kind, mode and cause.
fn read_lean_entries(
    map: &PerCpuArray<&MapData, AggValue>,
    slots: &[u32],
) -> Result<Vec<RawEntry>> {
    let mut out = Vec::new();
    for (slot, &pid) in slots.iter().enumerate() {
        for kind in [KIND_WAIT, KIND_HOLD] {
            for mode in [MODE_READ, MODE_WRITE] {
                for cause in 0..FAST_CAUSES {
                    let mut value = AggValue::ZERO;
                    for v in map.get(&lean_agg_index(slot, kind, mode, cause), 0)?.iter() {
                        value.merge(v);
                    }
                    if value.count == 0 {
                        continue;
                    }
                    let (syscall, fault) = cause_parts(cause);
                    let key = AggKey {
                        pid,
                        kind,
                        mode,
                        syscall,
                        fault,
                        kernel_stack: NO_STACK,
                        user_stack: NO_STACK,
                        ..AggKey::default()
                    };
                    out.push(RawEntry {
                        key,
                        value,
                        max_is_upper_bound: false,
                    });
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lean_entry(kind: u8, mode: u8, durations: &[u64]) -> RawEntry {
        let mut value = AggValue::ZERO;
        for &ns in durations {
            value.add(ns);
        }
        RawEntry {
            key: AggKey {
                kind,
                mode,
                kernel_stack: NO_STACK,
                user_stack: NO_STACK,
                ..AggKey::default()
            },
            value,
            max_is_upper_bound: false,
        }
    }

    #[test]
    fn an_entry_of_the_general_path_takes_the_sums_of_the_same_key() {
        let general = lean_entry(KIND_WAIT, MODE_WRITE, &[40]);
        let mut stacked = lean_entry(KIND_WAIT, MODE_WRITE, &[90]);
        stacked.key.kernel_stack = 3;
        let mut entries = vec![general, stacked];
        let mut other_cause = lean_entry(KIND_WAIT, MODE_WRITE, &[1]);
        other_cause.key.syscall = 2;
        merge_entries(
            &mut entries,
            vec![lean_entry(KIND_WAIT, MODE_WRITE, &[10, 60]), other_cause],
        );
        assert_eq!(entries.len(), 3);
        let v = &entries[0].value;
        assert_eq!((v.count, v.total_ns, v.max_ns), (3, 110, 60));
        assert_eq!(entries[1].value.count, 1, "a stacked entry is another key");
        assert_eq!(entries[2].key.syscall, 2);
    }

    #[test]
    fn lean_entries_stand_for_the_targets_own_totals() {
        let mut totals = [ModeTotals::default(); TOTALS_SLOTS as usize];
        totals[totals_index(false, MODE_WRITE) as usize].failed_trylocks = 2;
        totals[totals_index(true, MODE_WRITE) as usize].waits = 7;
        let lean = [
            lean_entry(KIND_WAIT, MODE_WRITE, &[10, 30]),
            lean_entry(KIND_WAIT, MODE_WRITE, &[5]),
            lean_entry(KIND_HOLD, MODE_READ, &[100]),
        ];
        add_lean_totals(&mut totals, &lean);
        let write = totals[totals_index(false, MODE_WRITE) as usize];
        assert_eq!(
            (
                write.acquisitions,
                write.waits,
                write.wait_ns,
                write.max_wait_ns
            ),
            (3, 3, 45, 30)
        );
        assert_eq!(write.failed_trylocks, 2, "kept from the kernel's totals");
        let read = totals[totals_index(false, MODE_READ) as usize];
        assert_eq!((read.holds, read.hold_ns, read.max_hold_ns), (1, 100, 100));
        assert_eq!(read.acquisitions, 0);
        assert_eq!(
            totals[totals_index(true, MODE_WRITE) as usize].waits,
            7,
            "outside lockers are not lean entries"
        );
    }
}
