//! The scheduler family (sched_switch, as a BTF tracepoint): where a holder's time went while it
//! was off CPU: preempted (runnable) or asleep, and for sleeps, the kernel stack it slept in.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::btf_tracepoint, programs::BtfTracePointContext};
use tracer_common::{Counter, NO_STACK, OFF_RUNNABLE, OFF_SLEEPING, OFF_UNINTERRUPTIBLE};

use crate::{holding::holder, records::stack_id};

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
    if let Some(state) = holder(prev).map(|h| h.state) {
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
    if let Some(state) = holder(next).map(|h| h.state) {
        state.switched_in(now);
    }
    0
}
