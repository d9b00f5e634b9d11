//! The mm syscall family (syscalls:sys_{enter,exit}_{mmap,munmap,mprotect,mremap,madvise,brk}):
//! per-syscall count and time, and the lock wait and hold spent inside each. Classic
//! per-syscall tracepoints rather than BTF ones on the raw sys_enter/sys_exit: those fire for
//! every syscall on the machine, and measured no cheaper per mm syscall on the small-files
//! workload (half its syscalls are mm syscalls; most programs make far fewer).

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns};
use aya_ebpf::{macros::map, maps::PerCpuArray};
use tracer_common::{Counter, StateKey, SyscallState, SyscallTotals, MM_SYSCALLS};

use crate::{
    causes::SYSCALLS_ACTIVE,
    filter::{current_mm, is_target_tgid},
    maps::{armed, config, count, LOCK_STATE},
    pending,
};

#[map]
pub static SYSCALL_TOTALS: PerCpuArray<SyscallTotals> =
    PerCpuArray::with_max_entries(MM_SYSCALLS.len() as u32, 0);

classic_tracepoint! {
    /// Attached to every sys_enter_* of MM_SYSCALLS.
    fn mm_syscall_enter(ctx) {
        if let Ok(nr) = unsafe { ctx.read_at::<i32>(config().syscalls.nr_offset as usize) } {
            enter(nr);
        }
    }
}

classic_tracepoint! {
    /// Attached to every sys_exit_* of MM_SYSCALLS.
    fn mm_syscall_exit(ctx) {
        exit();
    }
}

#[inline(always)]
fn enter(nr: i32) {
    let Some(index) = config().syscalls.nrs.iter().position(|&n| n == nr) else {
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target_tgid((pid_tgid >> 32) as u32) || !armed() {
        return;
    }
    let tid = pid_tgid as u32;
    let state = SyscallState {
        index: index as u32,
        _pad: 0,
        enter_ns: unsafe { bpf_ktime_get_ns() },
    };
    // Overwrite in place when the thread has an entry: an LRU insert allocates each time.
    match SYSCALLS_ACTIVE.get_ptr_mut(&tid) {
        Some(active) => unsafe { *active = state },
        None => {
            if SYSCALLS_ACTIVE.insert(&tid, &state, 0).is_err() {
                count(Counter::ThreadMapFull);
            }
        }
    }
}

#[inline(always)]
fn exit() {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(active) = SYSCALLS_ACTIVE.get_ptr_mut(&tid) else {
        return;
    };
    let state = unsafe { *active };
    if state.enter_ns == 0 {
        return;
    }
    // Mark the entry finished rather than deleting it: the thread's next syscall reuses it.
    unsafe { (*active).enter_ns = 0 };
    let index = state.index as usize;
    if index >= MM_SYSCALLS.len() {
        return;
    }
    let (lock_wait_ns, lock_hold_ns) = take_lock_time(tid);
    if let Some(totals) = SYSCALL_TOTALS.get_ptr_mut(index as u32) {
        let totals = unsafe { &mut *totals };
        totals.count += 1;
        totals.total_ns += unsafe { bpf_ktime_get_ns() }.wrapping_sub(state.enter_ns);
        totals.lock_wait_ns += lock_wait_ns;
        totals.lock_hold_ns += lock_hold_ns;
    }
}

/// The lock wait and hold the exiting syscall's lock operations left in the thread's state
/// (under its own mm), taken out of it; their pending aggregation is done on the way.
#[inline(always)]
fn take_lock_time(tid: u32) -> (u64, u64) {
    let key = StateKey {
        tid,
        _pad: 0,
        mm: current_mm(config().task_mm_offset),
    };
    let Some(st) = LOCK_STATE.get_ptr_mut(&key) else {
        return (0, 0);
    };
    let st = unsafe { &mut *st };
    if armed() {
        // Out of the lock and out of the syscall: the aggregation its lock operations left.
        pending::flush(st);
    }
    let taken = (st.syscall_wait_ns, st.syscall_hold_ns);
    (st.syscall_wait_ns, st.syscall_hold_ns) = (0, 0);
    taken
}
