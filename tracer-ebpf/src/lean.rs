//! The lean path: `--lean` (timing only) with at most FAST_TARGETS listed targets, at a
//! constant cost per event. A listed target's thread locking its own mm is recognised by
//! comparing with the TARGET_SLOTS entries (an array, which the verifier inlines, not a hash
//! lookup); its state costs one hash lookup (inserted once per thread); durations go to the
//! per-CPU LEAN_AGG array by (target, kind, mode), with their log2 histogram; nothing is
//! inserted. Outside lockers of a target's mm, which need their own identity, and the tracer's
//! own discovery take the general path.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    lean_agg_index, totals_index, AggValue, Counter, FastTargets, ModeTotals, StateKey,
    FAST_TARGETS, KIND_HOLD, KIND_WAIT, LEAN_AGG_SLOTS, MODE_WRITE,
};

use crate::{
    maps::{armed, config, count, TOTALS},
    mmap_lock::{decode, state_of, LockArgs},
    target::{current_mm, register},
};

/// Slot 0: the lean path's targets (pids written by user space, mms learnt here).
#[map]
pub static TARGET_SLOTS: Array<FastTargets> = Array::with_max_entries(1, 0);

/// Waits and holds of the listed targets' own threads, by `lean_agg_index`.
#[map]
pub static LEAN_AGG: PerCpuArray<AggValue> = PerCpuArray::with_max_entries(LEAN_AGG_SLOTS, 0);

const NO_SLOT: usize = FAST_TARGETS;

/// Handles the event when it is the lean path's (Some), or leaves it to the general path
/// (None): the tracer's own discovery, and outside lockers of a target's mm.
#[inline(always)]
pub fn on_lock_event(args: &LockArgs) -> Option<Result<(), i64>> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let targets = unsafe { &mut *TARGET_SLOTS.get_ptr_mut(0)? };
    let slot = slot_of_pid(targets, tgid);
    if slot == NO_SLOT {
        let known_mm = slot_of_mm(targets, args.mm) != NO_SLOT;
        return (!known_mm && tgid != config().tracer_tgid).then_some(Ok(()));
    }
    if targets.mms[slot] != args.mm && !learn_mm(targets, slot, args.mm, tgid) {
        // A target thread locking another process's mm (reading its /proc files).
        return Some(Ok(()));
    }
    if !armed() {
        return Some(Ok(()));
    }
    let key = StateKey {
        tid: pid_tgid as u32,
        _pad: 0,
        mm: args.mm,
    };
    let Some(state) = state_of(&key) else {
        count(Counter::StateMapFull);
        return Some(Ok(()));
    };
    let st = unsafe { &mut *state };
    let fx = st.step(decode(args), unsafe { bpf_ktime_get_ns() });
    if let Some(counter) = fx.counter {
        count(counter);
    }
    if let Some(mode) = fx.acquired {
        with_totals(mode, |t| t.acquisitions += 1);
    }
    if let Some(mode) = fx.failed_trylock {
        with_totals(mode, |t| t.failed_trylocks += 1);
    }
    if let Some(mode) = fx.interrupted {
        with_totals(mode, |t| t.interrupted += 1);
    }
    if fx.downgraded {
        with_totals(MODE_WRITE, |t| t.downgrades += 1);
    }
    if let Some((mode, ns)) = fx.wait {
        with_totals(mode, |t| t.add_wait(ns));
        add(slot, KIND_WAIT, mode, ns);
    }
    if let Some((mode, ns)) = fx.hold {
        with_totals(mode, |t| t.add_hold(ns));
        add(slot, KIND_HOLD, mode, ns);
    }
    Some(Ok(()))
}

/// Records `mm` as target `pid`'s when discovery or the general path learns it, so that the
/// lean path sees outside lockers of an idle target's mm.
#[inline(always)]
pub fn note_mm(pid: u32, mm: u64) {
    if config().fast_targets == 0 {
        return;
    }
    let Some(targets) = TARGET_SLOTS.get_ptr_mut(0) else {
        return;
    };
    let targets = unsafe { &mut *targets };
    let slot = slot_of_pid(targets, pid);
    if slot != NO_SLOT {
        targets.mms[slot] = mm;
    }
}

#[inline(always)]
fn slot_of_pid(targets: &FastTargets, tgid: u32) -> usize {
    for i in 0..FAST_TARGETS {
        if targets.pids[i] == tgid {
            return i;
        }
    }
    NO_SLOT
}

#[inline(always)]
fn slot_of_mm(targets: &FastTargets, mm: u64) -> usize {
    for i in 0..FAST_TARGETS {
        if targets.mms[i] == mm {
            return i;
        }
    }
    NO_SLOT
}

/// A listed target's thread locks an mm its slot does not know: its own (the first lock, or
/// the first after an exec) is learnt, and registered for user space and the other programs.
#[inline(always)]
fn learn_mm(targets: &mut FastTargets, slot: usize, mm: u64, tgid: u32) -> bool {
    if current_mm(config().task_mm_offset) != mm {
        return false;
    }
    targets.mms[slot % FAST_TARGETS] = mm;
    register(mm, tgid, false);
    true
}

/// The targets' own totals for `mode` (outside lockers take the general path).
#[inline(always)]
fn with_totals(mode: u8, f: impl FnOnce(&mut ModeTotals)) {
    if let Some(totals) = TOTALS.get_ptr_mut(totals_index(false, mode)) {
        f(unsafe { &mut *totals });
    }
}

#[inline(always)]
fn add(slot: usize, kind: u8, mode: u8, ns: u64) {
    if let Some(value) = LEAN_AGG.get_ptr_mut(lean_agg_index(slot, kind, mode)) {
        unsafe { (*value).add(ns) };
    }
}
