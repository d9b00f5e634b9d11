//! The wakers family (sched_waking, as a BTF tracepoint): who woke a thread that slept while
//! holding a target's mmap_lock. It runs in the waker's context, so the stacks it walks are the
//! waker's. A writer asleep on a VMA's lock (6.4 on: inside its mmap_lock write hold, until the
//! page faults under that VMA's lock leave it) is woken by the last of those readers, at the
//! end of its fault: the thread the writer, and everyone queued behind it, waited for.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::HashMap,
    programs::BtfTracePointContext,
};
use tracer_common::{Counter, WakeKey, WakeValue};

use crate::{
    filter::target_of_mm,
    holding::holder,
    maps::{armed, atomic_add, slot_of, FULL_WAKERS},
    records::walk_stacks,
};

/// Sleeps of the targets' holders by who ended them.
#[map]
pub static WAKERS: HashMap<WakeKey, WakeValue> = HashMap::with_max_entries(4096, 0);

/// sched_waking(struct task_struct *p): p is about to be woken by the current task. Every
/// wakeup on the machine runs it; one that is not of a sleeping holder costs a lookup.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking(ctx: BtfTracePointContext) -> i32 {
    let wakee: u64 = ctx.arg(0);
    let Some(holder) = holder(wakee) else {
        return 0;
    };
    if !armed() {
        return 0;
    }
    let Some(asleep_ns) = holder.state.woken(unsafe { bpf_ktime_get_ns() }) else {
        return 0;
    };
    let Some(pid) = target_of_mm(holder.mm) else {
        return 0;
    };
    let (waker_kernel_stack, waker_user_stack) = walk_stacks(&ctx);
    let waker = bpf_get_current_pid_tgid();
    let key = WakeKey {
        pid,
        holder_tid: holder.tid,
        sleep_stack: holder.state.off_stack,
        waker_pid: (waker >> 32) as u32,
        waker_tid: waker as u32,
        waker_kernel_stack,
        waker_user_stack,
        mode: holder.state.timing.hold_mode,
        _pad: [0; 3],
    };
    add(&key, asleep_ns);
    0
}

#[inline(always)]
fn add(key: &WakeKey, asleep_ns: u64) {
    let zero = WakeValue {
        count: 0,
        asleep_ns: 0,
    };
    if let Some(value) = slot_of(&WAKERS, key, &zero, FULL_WAKERS, Counter::WakerMapFull) {
        // SAFETY: a map value, 8-byte aligned, live as long as the map.
        unsafe {
            atomic_add(&mut (*value).count, 1);
            atomic_add(&mut (*value).asleep_ns, asleep_ns);
        }
    }
}
