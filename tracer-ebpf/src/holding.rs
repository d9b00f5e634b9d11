//! The lock state of a task that holds a target's mmap_lock, found from its task_struct: what
//! the scheduler programs (sched_switch, sched_waking) look up on every switch and wakeup.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use tracer_common::{LockState, StateKey};

use crate::{
    filter::is_target_mm,
    maps::{config, LOCK_STATE, TID_HOLDING},
};

#[inline(always)]
pub fn task_pid(task: u64) -> u32 {
    let field = (task + config().task_pid_offset as u64) as *const i32;
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0) as u32
}

/// A thread that holds a target's mmap_lock (or was switched out while holding it).
pub struct Holder {
    pub tid: u32,
    pub mm: u64,
    pub state: &'static mut LockState,
}

/// The holder `task` is, if it is one: a listed target's own thread is found through its own
/// mm (so that its acquire and release need not record it); any other (an outside locker, or
/// targets found by hash) through TID_HOLDING.
#[inline(always)]
pub fn holder(task: u64) -> Option<Holder> {
    let tid = task_pid(task);
    if tid == 0 {
        return None;
    }
    if config().target_slots != 0 {
        let mm = task_mm(task);
        if is_target_mm(mm) {
            // Only a holder (or one switched out while holding): a waiter going to sleep in the
            // rwsem must not cost a stack walk.
            let state =
                state(tid, mm).filter(|st| st.timing.hold_start_ns != 0 || st.off_since_ns != 0)?;
            return Some(Holder { tid, mm, state });
        }
    }
    let mm = *unsafe { TID_HOLDING.get(&tid) }?;
    if mm == 0 {
        return None;
    }
    let state = state(tid, mm)?;
    Some(Holder { tid, mm, state })
}

#[inline(always)]
fn state(tid: u32, mm: u64) -> Option<&'static mut LockState> {
    let key = StateKey { tid, _pad: 0, mm };
    LOCK_STATE.get_ptr_mut(&key).map(|s| unsafe { &mut *s })
}

#[inline(always)]
pub fn task_mm(task: u64) -> u64 {
    let field = (task + config().task_mm_offset as u64) as *const u64;
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0)
}
