//! The fault family (exceptions:page_fault_user, filemap:mm_filemap_fault): how many faults a
//! target takes, how many fall back from the per-VMA lock to mmap_lock, and how many filemap
//! faults run while the thread holds mmap_lock.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use tracer_common::{
    FAULTS_FILEMAP, FAULTS_FILEMAP_UNDER_LOCK, FAULTS_TOOK_MMAP_LOCK, FAULTS_USER,
    FAULT_LOCK_WINDOW_NS,
};

use crate::{
    maps::{add_to, armed, FAULT_COUNTS, RECENT_FAULT, SYSCALLS_ACTIVE, TID_HOLDING},
    target::{is_target_tgid, Locker},
};

/// Low bit of a RECENT_FAULT timestamp: this fault was already counted as taking the lock
/// (its retry after a failed trylock must not count twice).
const COUNTED: u64 = 1;

#[tracepoint]
pub fn page_fault_user(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_target_tgid((pid_tgid >> 32) as u32) && armed() {
        add_to(&FAULT_COUNTS, FAULTS_USER, 1);
        let now = unsafe { bpf_ktime_get_ns() } & !COUNTED;
        let tid = pid_tgid as u32;
        // Every fault of the target passes here: overwrite in place, since an LRU insert
        // allocates a new element each time.
        match RECENT_FAULT.get_ptr_mut(&tid) {
            Some(seen) => unsafe { *seen = now },
            None => {
                let _ = RECENT_FAULT.insert(&tid, &now, 0);
            }
        }
    }
    0
}

#[tracepoint]
pub fn mm_filemap_fault(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_target_tgid((pid_tgid >> 32) as u32) && armed() {
        add_to(&FAULT_COUNTS, FAULTS_FILEMAP, 1);
        if unsafe { TID_HOLDING.get(&(pid_tgid as u32)) }.is_some_and(|mm| *mm != 0) {
            add_to(&FAULT_COUNTS, FAULTS_FILEMAP_UNDER_LOCK, 1);
        }
    }
    0
}

/// True when a lock attempt starting now serves the thread's user page fault: one began less
/// than FAULT_LOCK_WINDOW_NS ago and no mm syscall is in progress. Counts each such fault once.
#[inline(always)]
pub fn explains_lock(locker: &Locker) -> bool {
    if locker.outside_pid != 0 {
        return false;
    }
    let Some(seen) = RECENT_FAULT.get_ptr_mut(&locker.tid) else {
        return false;
    };
    let seen = unsafe { &mut *seen };
    let now = unsafe { bpf_ktime_get_ns() };
    if *seen == 0 || now.wrapping_sub(*seen & !COUNTED) > FAULT_LOCK_WINDOW_NS {
        return false;
    }
    if unsafe { SYSCALLS_ACTIVE.get(&locker.tid) }.is_some_and(|s| s.enter_ns != 0) {
        return false;
    }
    if *seen & COUNTED == 0 {
        *seen |= COUNTED;
        add_to(&FAULT_COUNTS, FAULTS_TOOK_MMAP_LOCK, 1);
    }
    true
}
