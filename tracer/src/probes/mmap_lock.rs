//! Loading and attaching the mmap_lock tracepoint family: as BTF tracepoints (`tp_btf`) where
//! the kernel has their prototypes, else as classic tracepoints. The classic mechanism formats
//! a perf record on every hit before the program runs: on a lock-bound target that alone cost
//! about 15% of its throughput, against 4% for the BTF ones.

use anyhow::{anyhow, Context as _, Result};
use aya::{
    programs::{BtfTracePoint, TracePoint},
    Ebpf,
};
use std::collections::HashMap;
use std::time::Instant;

use tracer_common::{AggKey, AggValue, Config, LockState, LockTiming, ModeTotals, StateKey};

use super::{Family, Probes};
use crate::model::{Harvest, InFlight, LockTracepoints, RawEntry};
use crate::system::btf::{KernelOffsets, LockArgIndices, LOCK_EVENTS};
use crate::system::tracefs::{
    Needed, Tracefs, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START,
};

/// In LOCK_EVENTS order.
const CLASSIC: [Needed; 3] = [MMAP_LOCK_START, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED];

/// Fills where the classic programs find their fields.
fn configure(tracefs: &Tracefs, config: &mut Config) -> Result<()> {
    config.mmap_lock.start_locking = tracefs.mmap_lock_fields(&MMAP_LOCK_START)?;
    config.mmap_lock.acquire_returned = tracefs.mmap_lock_fields(&MMAP_LOCK_ACQUIRED)?;
    config.mmap_lock.released = tracefs.mmap_lock_fields(&MMAP_LOCK_RELEASED)?;
    Ok(())
}

/// Always attached: the lock events themselves (BTF or classic) and the targets' lifecycle.
pub(super) const FAMILY: Family = Family {
    configure: |setup, config| configure(setup.tracefs, config),
    attach: |at, features| {
        let classic = at.setup.settings.classic_tracepoints;
        features.lock_tracepoints = attach(at.ebpf, at.setup.offsets, classic)?;
        Ok(())
    },
    read,
    // AGG, TOTALS and LOCK_STATE, which it reads, are the core's (named in probes/mod.rs):
    // every family's programs write them. ENDED is the programs' own scratch, never read.
    maps: &[ENDED],
    programs: &PROGRAMS,
};

/// Per-CPU scratch between the lock programs' global functions (the wait or hold that ended).
const ENDED: &str = "ENDED";

// The programs, each set in the order of the three events (start_locking, acquire_returned,
// released).
/// BTF tracepoints for the `(mm, write[, success])` prototypes (6.13 on).
pub(super) const MMAP_LOCK_BTF: [&str; 3] =
    ["btf_start_locking", "btf_acquire_returned", "btf_released"];
/// BTF tracepoints for the `(mm, memcg_path, write[, success])` prototypes (before 6.13).
const MMAP_LOCK_BTF_MEMCG: [&str; 3] = [
    "btf_memcg_start_locking",
    "btf_memcg_acquire_returned",
    "btf_memcg_released",
];
/// The classic tracepoints' fallback (named as the events are).
const MMAP_LOCK_CLASSIC: [&str; 3] = [
    "mmap_lock_start_locking",
    "mmap_lock_acquire_returned",
    "mmap_lock_released",
];
/// The targets' lifecycle, attached with the lock programs.
const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
const SCHED_PROCESS_FORK: &str = "sched_process_fork";
const SCHED_PROCESS_EXEC: &str = "sched_process_exec";

const PROGRAMS: [&str; 12] = [
    MMAP_LOCK_BTF[0],
    MMAP_LOCK_BTF[1],
    MMAP_LOCK_BTF[2],
    MMAP_LOCK_BTF_MEMCG[0],
    MMAP_LOCK_BTF_MEMCG[1],
    MMAP_LOCK_BTF_MEMCG[2],
    MMAP_LOCK_CLASSIC[0],
    MMAP_LOCK_CLASSIC[1],
    MMAP_LOCK_CLASSIC[2],
    SCHED_PROCESS_EXIT,
    SCHED_PROCESS_FORK,
    SCHED_PROCESS_EXEC,
];

/// The aggregated waits and holds (AGG), the per-mode totals, and the operations still in
/// flight.
fn read(probes: &Probes, harvest: &mut Harvest) -> Result<()> {
    let ebpf = &probes.ebpf;
    harvest.entries = super::read_shared(ebpf, super::AGG)?
        .into_iter()
        .map(|(key, mut value): (AggKey, AggValue)| {
            // The programs count into the histogram only (tracer-ebpf's add_duration).
            value.count = value.hist.iter().sum();
            RawEntry::exact(key, value)
        })
        .collect();
    harvest.totals = super::read_array(&super::map_ref(ebpf, super::TOTALS)?, ModeTotals::merge)?;
    let target_mms = super::read_target_mms(ebpf)?;
    let states = super::read_shared::<StateKey, LockState>(ebpf, super::LOCK_STATE)?;
    harvest.in_flight = InFlight::default();
    add_in_flight(
        &mut harvest.in_flight,
        states.iter().map(|(key, state)| (key, &state.timing)),
        &target_mms,
    );
    Ok(())
}

/// Adds the waits and holds still open when tracing stopped, of the target mms: neither timed
/// nor lost.
pub(super) fn add_in_flight<'a>(
    in_flight: &mut InFlight,
    timings: impl Iterator<Item = (&'a StateKey, &'a LockTiming)>,
    mms: &HashMap<u64, u32>,
) {
    for (_, timing) in timings.filter(|(key, _)| mms.contains_key(&key.mm)) {
        in_flight.add(timing);
    }
}

/// The BTF programs written for the kernel's prototypes of the three trace calls, if any.
fn btf_programs(args: &[LockArgIndices; 3]) -> Option<[&'static str; 3]> {
    let layout = |write: u32| {
        args.iter().enumerate().all(|(i, a)| {
            // acquire_returned (index 1) also passes success, right after write.
            a.mm == 0 && a.write == write && (i != 1 || a.success == write + 1)
        })
    };
    if layout(1) {
        Some(MMAP_LOCK_BTF)
    } else if layout(2) {
        Some(MMAP_LOCK_BTF_MEMCG)
    } else {
        None
    }
}

/// Verifies the three programs before attaching any (verification takes milliseconds), then
/// attaches them back to back; the programs ignore events until the tracer arms them. BTF
/// tracepoints unless `force_classic` or the kernel lacks their BTF or refuses them.
fn attach(
    ebpf: &mut Ebpf,
    offsets: &KernelOffsets,
    force_classic: bool,
) -> Result<LockTracepoints> {
    attach_target_lifecycle(ebpf);
    let programs = offsets.lock_args.as_ref().and_then(btf_programs);
    if let (false, None) = (force_classic, programs) {
        log::warn!(
            "kernel BTF has no known prototype of the mmap_lock trace calls ({:?}): using \
             classic tracepoints",
            offsets.lock_args
        );
    }
    if let (false, Some(programs)) = (force_classic, programs) {
        // A refused load falls back; a refused attach is an error like any other, since the
        // programs attached before it would then see every event twice.
        match load_btf(ebpf, &programs) {
            Ok(()) => {
                attach_btf(ebpf, &programs)?;
                return Ok(LockTracepoints::Btf);
            }
            Err(err) => log::warn!(
                "BTF tracepoints unavailable ({}): using classic tracepoints, which cost the \
                 target more",
                crate::text::error_line(&err)
            ),
        }
    }
    attach_classic(ebpf, &MMAP_LOCK_CLASSIC)?;
    Ok(LockTracepoints::Classic)
}

/// sched_process_exit forgets a target's mm when its last thread exits, before the freed
/// mm_struct is reused by a process that is not traced, and sums exiting threads' lifetimes.
/// Without it (no BTF), a reused mm's first locks by its new owner end the registration
/// instead, and exec's locks before them count as outside lockers. sched_process_fork follows
/// a traced command's new processes (`-- CMD`); sched_process_exec renames those an exec
/// renames.
fn attach_target_lifecycle(ebpf: &mut Ebpf) {
    for (name, without) in [
        (
            SCHED_PROCESS_EXIT,
            "a target's mm reused after it exits may show its new owner's exec as an outside \
             locker, and exited threads' time is left out of thread time",
        ),
        (
            SCHED_PROCESS_FORK,
            "the processes a traced command starts are not traced",
        ),
        (
            SCHED_PROCESS_EXEC,
            "a process that ends before the tracer reads its name may be named as the one \
             that started it",
        ),
    ] {
        let attached = super::kernel_btf().and_then(|btf| {
            let started = Instant::now();
            let program = super::program::<BtfTracePoint>(ebpf, name)?;
            program
                .load(name, &btf)
                .map_err(|e| super::load_failed(e, &format!("loading {name}")))?;
            super::log_verified(name, program.info(), started.elapsed());
            program.attach()?;
            Ok(())
        });
        if let Err(err) = attached {
            log::warn!("cannot attach tp_btf/{name} ({err:#}): {without}");
        }
    }
}

/// Loads `programs` (in LOCK_EVENTS order) as BTF tracepoints on the three events.
pub(super) fn load_btf(ebpf: &mut Ebpf, programs: &[&str; 3]) -> Result<()> {
    let btf = super::kernel_btf()?;
    for (name, event) in programs.iter().zip(LOCK_EVENTS) {
        let program = super::program::<BtfTracePoint>(ebpf, name)?;
        let started = Instant::now();
        program
            .load(event, &btf)
            .map_err(|e| super::load_failed(e, &format!("loading {name}")))?;
        super::log_verified(name, program.info(), started.elapsed());
    }
    Ok(())
}

pub(super) fn attach_btf(ebpf: &mut Ebpf, programs: &[&str; 3]) -> Result<()> {
    for (name, event) in programs.iter().zip(LOCK_EVENTS) {
        super::program::<BtfTracePoint>(ebpf, name)?
            .attach()
            .map_err(|e| {
                super::explain_permission(anyhow!(e), &format!("attaching tp_btf/{event}"))
            })
            .with_context(|| format!("tp_btf/{event}"))?;
    }
    Ok(())
}

/// Loads `programs` (in LOCK_EVENTS order) and attaches them to the classic tracepoints.
pub(super) fn attach_classic(ebpf: &mut Ebpf, programs: &[&str; 3]) -> Result<()> {
    for name in programs {
        let program = super::program::<TracePoint>(ebpf, name)?;
        let started = Instant::now();
        program
            .load()
            .map_err(|e| super::load_failed(e, &format!("loading {name}")))?;
        super::log_verified(name, program.info(), started.elapsed());
    }
    for (name, tp) in programs.iter().zip(CLASSIC) {
        super::program::<TracePoint>(ebpf, name)?
            .attach(tp.category, tp.name)
            .map_err(|e| {
                super::explain_permission(
                    anyhow!(e),
                    &format!("attaching {}:{}", tp.category, tp.name),
                )
            })
            .with_context(|| format!("tracepoint {}:{}", tp.category, tp.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(write: u32) -> [LockArgIndices; 3] {
        let plain = LockArgIndices {
            mm: 0,
            write,
            success: 0,
        };
        let acquired = LockArgIndices {
            success: write + 1,
            ..plain
        };
        [plain, acquired, plain]
    }

    #[test]
    fn each_prototype_gets_its_programs() {
        assert_eq!(btf_programs(&args(1)).unwrap()[0], "btf_start_locking");
        assert_eq!(
            btf_programs(&args(2)).unwrap()[1],
            "btf_memcg_acquire_returned"
        );
        assert_eq!(btf_programs(&args(3)), None, "an unknown layout falls back");
        let mut odd = args(1);
        odd[1].success = 3;
        assert_eq!(btf_programs(&odd), None);
    }
}
