//! The lock contention family (lock:contention_begin / contention_end): the part of a wait a
//! thread spent asleep in the rwsem slow path, as opposed to an uncontended acquisition or
//! optimistic spinning. Only the targets' mmap_locks are looked at.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use tracer_common::StateKey;

use crate::maps::{armed, config, LOCK_STATE, TARGET_MMS};

#[tracepoint]
pub fn contention_begin(ctx: TracePointContext) -> u32 {
    let offset = config().contention_begin_lock;
    if let Some(state) = waiter_state(&ctx, offset) {
        state.contention_begin(unsafe { bpf_ktime_get_ns() });
    }
    0
}

#[tracepoint]
pub fn contention_end(ctx: TracePointContext) -> u32 {
    let offset = config().contention_end_lock;
    if let Some(state) = waiter_state(&ctx, offset) {
        state.contention_end(unsafe { bpf_ktime_get_ns() });
    }
    0
}

/// The current thread's lock state when the contended lock is a target's mmap_lock.
#[inline(always)]
fn waiter_state(
    ctx: &TracePointContext,
    lock_offset: u32,
) -> Option<&'static mut tracer_common::LockState> {
    let lock: u64 = unsafe { ctx.read_at(lock_offset as usize) }.ok()?;
    let mm = lock.wrapping_sub(config().mm_mmap_lock_offset as u64);
    unsafe { TARGET_MMS.get(&mm) }?;
    if !armed() {
        return None;
    }
    let key = StateKey {
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        mm,
    };
    LOCK_STATE.get_ptr_mut(&key).map(|s| unsafe { &mut *s })
}
