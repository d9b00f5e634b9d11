//! Aggregation moved out of the critical section. acquire_returned and released run while the
//! lock is held, so every nanosecond they spend is paid by all the waiters queued behind: there
//! the programs only time the wait or hold and name its key (stacks included), and leave the
//! aggregation (a shared hash map's atomic adds, the charge to the blockers) in the thread's
//! state, to be done at its next step outside the lock: its next start_locking on the mm, the
//! exit of its mm syscall, or its exit. User space folds what is still pending at the end of the
//! trace.

use core::ptr::addr_of_mut;

use tracer_common::{AggKey, LockState, OffCpu, PendingAgg};

use crate::{
    blockers,
    maps::{add_duration, atomic_add, config, LOCK_STATE},
    records::agg_value,
};

/// Leaves a finished wait for later; its blockers stay in `st.blockers` until then.
#[inline(always)]
pub fn defer_wait(st: &mut LockState, key: AggKey, ns: u64, contended_ns: u64) {
    if st.pending_wait.is_some() {
        // Two waits without a start_locking between them (never seen): the first one now.
        flush_wait(st);
    }
    st.pending_wait = PendingAgg {
        key,
        count: 1,
        ns,
        parts: [contended_ns, 0, 0],
    };
    st.pending = 1;
    if !deferred() {
        flush_wait(st);
    }
}

/// Leaves a finished hold for later.
#[inline(always)]
pub fn defer_hold(st: &mut LockState, key: AggKey, ns: u64, off: &OffCpu) {
    st.pending = 1;
    let slot = if !st.pending_holds[0].is_some() {
        &mut st.pending_holds[0]
    } else {
        if st.pending_holds[1].is_some() {
            // Three holds without a step outside the lock (never seen): one is aggregated
            // now, inside the critical section.
            flush_hold(&mut st.pending_holds[1]);
        }
        &mut st.pending_holds[1]
    };
    // Field by field, in place: a PendingAgg built on the stack and copied added its 64 bytes
    // to the deepest chain of calls, which 6.1's verifier holds to 512 bytes.
    slot.key = key;
    slot.count = 1;
    slot.ns = ns;
    slot.parts = [off.runnable_ns, off.sleeping_ns, off.uninterruptible_ns];
    if !deferred() {
        flush_hold(slot);
    }
}

/// Whether aggregation waits for the thread's next step outside the lock. Without attribution
/// (`--lean`, whose own path aggregates in a per-CPU array) start_locking does not flush.
#[inline(always)]
fn deferred() -> bool {
    config().attribution != 0
}

/// Aggregates what the thread's last lock operation left pending. Call outside the lock only.
#[inline(always)]
pub fn flush(st: &mut LockState) {
    if st.pending == 0 {
        return;
    }
    st.pending = 0;
    if st.pending_wait.is_some() {
        flush_wait(st);
    }
    for hold in st.pending_holds.iter_mut() {
        if hold.is_some() {
            flush_hold(hold);
        }
    }
}

/// `flush` as a global function, verified once apart from the program that calls it, for a
/// state the caller found (a lock program, before a new wait).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pending_flush(st: *mut LockState) -> i32 {
    if let Some(st) = unsafe { st.as_mut() } {
        flush(st);
    }
    0
}

/// `flush` for the state of `key`, if it has one (an exiting thread).
#[inline(always)]
pub fn flush_thread(key: &tracer_common::StateKey) {
    if let Some(st) = LOCK_STATE.get_ptr_mut(key) {
        pending_flush(st);
    }
}

/// Reads the pending wait in place: a copy of it compiled to a call to memcpy, one more
/// frame on the chain start_locking -> pending_flush -> flush_wait, and 6.1's verifier
/// (without the private stacks of 6.14) refuses a chain over 512 bytes, each frame counted
/// as at least 32.
#[inline(never)]
fn flush_wait(st: &mut LockState) {
    let (ns, contended_ns) = (st.pending_wait.ns, st.pending_wait.parts[0]);
    st.pending_wait.count = 0;
    if let Some(value) = agg_value(&st.pending_wait.key) {
        add_duration(value, ns);
        atomic_add(unsafe { addr_of_mut!((*value).contended_ns) }, contended_ns);
    }
    blockers::charge(&st.pending_wait.key, &st.blockers, ns);
    st.blockers.count = 0;
}

/// Reads the pending hold in place, as `flush_wait` does: a copy of it doubled the frame this
/// call adds to acquire_returned's, which 6.1's verifier holds to 512 bytes together.
#[inline(never)]
fn flush_hold(hold: &mut PendingAgg) {
    let (ns, parts) = (hold.ns, hold.parts);
    hold.count = 0;
    if let Some(value) = agg_value(&hold.key) {
        add_duration(value, ns);
        unsafe {
            atomic_add(addr_of_mut!((*value).runnable_ns), parts[0]);
            atomic_add(addr_of_mut!((*value).sleeping_ns), parts[1]);
            atomic_add(addr_of_mut!((*value).uninterruptible_ns), parts[2]);
        }
    }
}
