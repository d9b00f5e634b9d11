//! The fault family: which lock operations serve a user page fault (one that fell back from
//! the per-VMA lock to mmap_lock), and how many filemap faults run while the thread holds
//! mmap_lock (filemap:mm_filemap_fault).
//!
//! No program runs on every page fault: a lock operation begun from a user-mode exception is
//! recognised at start_locking by the registers the kernel saved on entry (orig_ax is -1 for
//! exceptions, the syscall number for syscalls). The total of the targets' faults comes from
//! /proc in user space.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use tracer_common::{StateKey, FAULTS_FILEMAP, FAULTS_FILEMAP_UNDER_LOCK};

use crate::{
    causes::FAULT_COUNTS,
    filter::{current_mm, is_target_tgid},
    maps::{add_to, armed, config, LOCK_STATE, TID_HOLDING},
};

classic_tracepoint! {
    fn mm_filemap_fault(ctx) {
        let pid_tgid = bpf_get_current_pid_tgid();
        if is_target_tgid((pid_tgid >> 32) as u32) && armed() {
            add_to(&FAULT_COUNTS, FAULTS_FILEMAP, 1);
            if holding_now(pid_tgid as u32) {
                add_to(&FAULT_COUNTS, FAULTS_FILEMAP_UNDER_LOCK, 1);
            }
        }
    }
}

/// Whether the current target thread holds its mm's mmap_lock: through its state under its own
/// mm with target slots (its acquire and release keep no TID_HOLDING entry then), else
/// through TID_HOLDING.
#[inline(always)]
fn holding_now(tid: u32) -> bool {
    if config().target_slots != 0 {
        let key = StateKey {
            tid,
            _pad: 0,
            mm: current_mm(config().task_mm_offset),
        };
        return unsafe { LOCK_STATE.get(&key) }.is_some_and(|st| st.timing.hold_start_ns != 0);
    }
    unsafe { TID_HOLDING.get(&tid) }.is_some_and(|mm| *mm != 0)
}
