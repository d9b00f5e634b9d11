//! Where a (thread, mm)'s lock state lives. With target slots (at most eight targets, no
//! `-a`), in THREAD_STATES, an array searched from the thread's index: a hash lookup in
//! LOCK_STATE (hashing the key, then the bucket and the element, cache lines likely cold after
//! the thread ran its own code) cost about 50-70 ns per event here, and acquire_returned and
//! released pay it inside the critical section, where every waiter pays it too. Otherwise
//! (system-wide, many targets: more threads than an array could place), in LOCK_STATE, an LRU.
//!
//! One map or the other for the whole trace, chosen by the read-only config: the verifier
//! explores only the one in use. Both at once (the array, then the hash for threads it had no
//! room for) gave every program two kinds of state pointer to carry through all of its paths,
//! and acquire_returned went past the verifier's million instructions.

use aya_ebpf::{macros::map, maps::Array};
use tracer_common::{
    thread_state_index, LockState, StateKey, ThreadState, THREAD_STATE_PROBES, THREAD_STATE_SLOTS,
};

use crate::{
    maps::{armed, atomic_add, config, BPF_NOEXIST, LOCK_STATE},
    pending,
};

#[map]
pub static THREAD_STATES: Array<ThreadState> = Array::with_max_entries(THREAD_STATE_SLOTS, 0);

/// The state of `key`, if it has one.
#[inline(always)]
pub fn lock_state(key: &StateKey) -> Option<*mut LockState> {
    if config().target_slots == 0 {
        return LOCK_STATE.get_ptr_mut(key);
    }
    own_entry(key.tid, key.mm).map(|entry| unsafe { &mut (*entry).state as *mut LockState })
}

/// The state of `key`, and whether it was created just now (the thread's first event since
/// the tracer attached, or since its entry was evicted or freed). None when there is no room.
#[inline(always)]
pub fn state_of(key: &StateKey) -> Option<(*mut LockState, bool)> {
    if config().target_slots == 0 {
        if let Some(state) = LOCK_STATE.get_ptr_mut(key) {
            return Some((state, false));
        }
        LOCK_STATE.insert(key, &LockState::ZERO, BPF_NOEXIST).ok()?;
        return LOCK_STATE.get_ptr_mut(key).map(|state| (state, true));
    }
    if let Some(entry) = own_entry(key.tid, key.mm) {
        return Some((unsafe { &mut (*entry).state }, false));
    }
    let entry = take_entry(key.tid, key.mm)?;
    Some((unsafe { &mut (*entry).state }, true))
}

/// The entry of (`tid`, `mm`): among the THREAD_STATE_PROBES entries from the thread's index.
/// A BPF-to-BPF call, as is `take_entry`: inlined, the probe's registers stayed live past
/// the search, and 6.1's verifier could not merge the paths that had found the entry at
/// different probes (acquire_returned past its million instructions).
#[inline(never)]
fn own_entry(tid: u32, mm: u64) -> Option<*mut ThreadState> {
    for probe in 0..THREAD_STATE_PROBES {
        let entry = THREAD_STATES.get_ptr_mut(thread_state_index(tid, probe))?;
        let found = unsafe { &*entry };
        if found.key.tid == tid && found.key.mm == mm {
            return Some(entry);
        }
    }
    None
}

/// A free entry among the thread's, taken for (`tid`, `mm`) with an idle state.
#[inline(never)]
fn take_entry(tid: u32, mm: u64) -> Option<*mut ThreadState> {
    for probe in 0..THREAD_STATE_PROBES {
        let entry = THREAD_STATES.get_ptr_mut(thread_state_index(tid, probe))?;
        let free = unsafe { &mut *entry };
        if free.key.tid == 0 && claim(free) {
            // From the constant (read-only data), not a copy on the stack: 6.1's verifier
            // allows 512 bytes of stack for the whole call chain.
            unsafe { core::ptr::copy_nonoverlapping(&LockState::ZERO, &mut free.state, 1) };
            free.key = StateKey { tid, _pad: 0, mm };
            return Some(entry);
        }
    }
    None
}

/// Takes a free entry unless another thread is taking it at the same time (see lean::claim).
#[inline(always)]
fn claim(entry: &mut ThreadState) -> bool {
    atomic_add(&mut entry.claims, 1);
    unsafe { core::ptr::read_volatile(&entry.claims) == 1 }
}

/// A thread that ended (at its exit, and again when its task is freed: exit_mm's lock comes
/// after sched_process_exit on recent kernels) aggregates what its last operations left, on
/// every mm it locked (its own, the one it had before an exec, a target's it read as an
/// outside locker), and frees its entries for the next threads. Disarmed, it leaves the
/// aggregation, and the entries holding it, for user space to fold.
#[inline(always)]
pub fn forget_thread(tid: u32) {
    if config().target_slots == 0 {
        return;
    }
    let flush = armed();
    for probe in 0..THREAD_STATE_PROBES {
        let Some(entry) = THREAD_STATES.get_ptr_mut(thread_state_index(tid, probe)) else {
            return;
        };
        let entry = unsafe { &mut *entry };
        if entry.key.tid != tid {
            continue;
        }
        if flush {
            pending::flush(&mut entry.state);
        }
        if !entry.state.has_pending() {
            entry.claims = 0;
            unsafe { core::ptr::write_volatile(&mut entry.key.tid, 0) };
        }
    }
}
