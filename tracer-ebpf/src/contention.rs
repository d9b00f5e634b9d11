//! The lock contention family (lock:contention_begin / contention_end): the part of a wait a
//! thread spent asleep in the rwsem slow path, as opposed to an uncontended acquisition or
//! optimistic spinning. Only the targets' mmap_locks are looked at. BTF tracepoints first (no
//! perf record is formatted per hit), classic ones where the kernel lacks their BTF.
//!
//! A wait's first contention_begin is also where the mmap_lock family names it
//! (`operation::wait_sleeps`): the thread is about to sleep, so the work costs it alone.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::btf_tracepoint,
    programs::{tracing::StackIdContext, BtfTracePointContext},
};
use tracer_common::{LockState, StateKey};

use crate::{
    context::{BtfRegs, ClassicRegs},
    filter::is_target_mm,
    maps::{armed, config, LOCK_STATE},
    operation,
    user_stacks::CopyUserStack,
};

classic_tracepoint! {
    fn contention_begin(ctx) {
        if let Ok(lock) = unsafe { ctx.read_at(config().contention.begin_lock as usize) } {
            begin::<ClassicRegs, _>(&ctx, lock);
        }
    }
}

classic_tracepoint! {
    fn contention_end(ctx) {
        if let Ok(lock) = unsafe { ctx.read_at(config().contention.end_lock as usize) } {
            end(lock);
        }
    }
}

/// contention_begin(void *lock, unsigned int flags).
#[btf_tracepoint(function = "contention_begin")]
pub fn btf_contention_begin(ctx: BtfTracePointContext) -> i32 {
    begin::<BtfRegs, _>(&ctx, ctx.arg(0));
    0
}

/// contention_end(void *lock, int ret).
#[btf_tracepoint(function = "contention_end")]
pub fn btf_contention_end(ctx: BtfTracePointContext) -> i32 {
    end(ctx.arg(0));
    0
}

#[inline(always)]
fn begin<R: CopyUserStack, C: StackIdContext>(ctx: &C, lock: u64) {
    let Some((state, mm)) = waiter_state(lock) else {
        return;
    };
    let first_sleep = state.slept == 0 && state.timing.wait_start_ns != 0;
    if first_sleep && config().attribution != 0 {
        operation::wait_sleeps::<R, C>(ctx, state, mm);
    }
    // After that work: the sleep is timed from when the thread goes to sleep.
    state.contention_begin(unsafe { bpf_ktime_get_ns() });
}

#[inline(always)]
fn end(lock: u64) {
    if let Some((state, _)) = waiter_state(lock) {
        state.contention_end(unsafe { bpf_ktime_get_ns() });
    }
}

/// The current thread's lock state and its mm when the contended lock is a target's
/// mmap_lock.
#[inline(always)]
fn waiter_state(lock: u64) -> Option<(&'static mut LockState, u64)> {
    let mm = lock.wrapping_sub(config().mm_mmap_lock_offset as u64);
    // Every contended lock of the machine comes here: the cheapest test first.
    if !is_target_mm(mm) || !armed() {
        return None;
    }
    let key = StateKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        mm,
    };
    LOCK_STATE
        .get_ptr_mut(&key)
        .map(|s| (unsafe { &mut *s }, mm))
}
