//! The lean path: `--lean` (timing only) without per-thread rows, on targets listed in
//! TARGET_SLOTS, at a constant cost per event: the target filter through the slots, one hash
//! lookup for the thread's state (inserted once per thread), and durations added to the
//! per-CPU LEAN_AGG array by (target, kind, mode) with their log2 histogram, which also stands
//! for the targets' own totals of acquisitions, waits and holds. Nothing is inserted per
//! event.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray};
use tracer_common::{
    lean_agg_index, AggValue, Counter, StateKey, KIND_HOLD, KIND_WAIT, LEAN_AGG_SLOTS, MODE_WRITE,
};

use crate::{
    maps::{config, count},
    mmap_lock::{add_totals, decode, state_of, LockArgs},
    target::{Locker, NO_SLOT},
};

/// Waits and holds of the listed targets' own threads, by `lean_agg_index`.
#[map]
pub static LEAN_AGG: PerCpuArray<AggValue> = PerCpuArray::with_max_entries(LEAN_AGG_SLOTS, 0);

/// Whether the lean path takes this event: a listed target's own lock, in timing-only mode
/// without per-thread rows. Outside lockers keep the general path: their entries name them.
#[inline(always)]
pub fn takes(locker: &Locker) -> bool {
    let cfg = config();
    cfg.attribution == 0 && cfg.per_thread == 0 && locker.outside_pid == 0 && locker.slot != NO_SLOT
}

#[inline(always)]
pub fn on_lock_event(locker: &Locker, args: &LockArgs) {
    let key = StateKey {
        tid: locker.tid,
        _pad: 0,
        mm: args.mm,
    };
    let Some((state, first_seen)) = state_of(&key) else {
        count(Counter::StateMapFull);
        return;
    };
    let st = unsafe { &mut *state };
    // No reset to idle afterwards: the lean path uses only the timestamps, which the state
    // machine clears itself.
    let event = decode(args);
    let mut fx = st.step(event, unsafe { bpf_ktime_get_ns() });
    if first_seen {
        fx = fx.seen_first(event);
    }
    if let Some(counter) = fx.counter {
        count(counter);
    }
    // Acquisitions, waits and holds are counted in LEAN_AGG alone (user space folds them into
    // the totals: every acquisition ends a wait); only the rare outcomes touch TOTALS here.
    if let Some(mode) = fx.failed_trylock {
        add_totals(false, mode, |t| t.failed_trylocks += 1);
    }
    if let Some(mode) = fx.interrupted {
        add_totals(false, mode, |t| t.interrupted += 1);
    }
    if fx.downgraded {
        add_totals(false, MODE_WRITE, |t| t.downgrades += 1);
    }
    if let Some((mode, ns)) = fx.wait {
        add(locker.slot, KIND_WAIT, mode, ns);
    }
    if let Some((mode, ns)) = fx.hold {
        add(locker.slot, KIND_HOLD, mode, ns);
    }
}

#[inline(always)]
fn add(slot: usize, kind: u8, mode: u8, ns: u64) {
    if let Some(value) = LEAN_AGG.get_ptr_mut(lean_agg_index(slot, kind, mode)) {
        unsafe { (*value).add(ns) };
    }
}
