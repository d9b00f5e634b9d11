//! The scheduler family (sched_switch, as a BTF tracepoint): where a holder's time went while it
//! was off CPU: preempted (runnable) or asleep, and for sleeps, the kernel stack it slept in.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use tracer_common::{
    Counter, LockState, StateKey, NO_STACK, OFF_RUNNABLE, OFF_SLEEPING, OFF_UNINTERRUPTIBLE,
};

use crate::{
    filter::is_target_mm,
    maps::{config, LOCK_STATE, TID_HOLDING},
    records::stack_id,
};

/// TASK_UNINTERRUPTIBLE in prev_state: a D sleep, usually I/O.
const TASK_UNINTERRUPTIBLE: u64 = 0x2;

/// sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state), run in prev's context.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(state) = holder_state(prev) {
        let (kind, stack) = if prev_state == 0 {
            (OFF_RUNNABLE, NO_STACK)
        } else {
            let kind = if prev_state & TASK_UNINTERRUPTIBLE != 0 {
                OFF_UNINTERRUPTIBLE
            } else {
                OFF_SLEEPING
            };
            // prev is the current task here: its kernel stack is where it goes to sleep.
            let stack = stack_id(
                &ctx,
                0,
                Counter::KernelStackCollision,
                Counter::KernelStackFailed,
            );
            (kind, stack)
        };
        state.switched_out(now, kind, stack);
    }
    if let Some(state) = holder_state(next) {
        state.switched_in(now);
    }
    0
}

#[inline(always)]
fn task_pid(task: u64) -> u32 {
    let field = (task + config().task_pid_offset as u64) as *const i32;
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0) as u32
}

/// The lock state of a thread that holds a target's mmap_lock: for a listed target's own
/// thread, found through its own mm (so that its acquire and release need not record it);
/// for any other (an outside locker, or targets found by hash), through TID_HOLDING.
#[inline(always)]
fn holder_state(task: u64) -> Option<&'static mut LockState> {
    let tid = task_pid(task);
    if tid == 0 {
        return None;
    }
    if config().target_slots != 0 {
        let mm = task_mm(task);
        if is_target_mm(mm) {
            // Only a holder (or one switched out while holding): a waiter going to sleep in the
            // rwsem must not cost a stack walk.
            return state(tid, mm)
                .filter(|st| st.timing.hold_start_ns != 0 || st.off_since_ns != 0);
        }
    }
    let mm = *unsafe { TID_HOLDING.get(&tid) }?;
    if mm == 0 {
        return None;
    }
    state(tid, mm)
}

#[inline(always)]
fn state(tid: u32, mm: u64) -> Option<&'static mut LockState> {
    let key = StateKey { tid, _pad: 0, mm };
    LOCK_STATE.get_ptr_mut(&key).map(|s| unsafe { &mut *s })
}

#[inline(always)]
fn task_mm(task: u64) -> u64 {
    let field = (task + config().task_mm_offset as u64) as *const u64;
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0)
}
