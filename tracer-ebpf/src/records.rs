//! Where lock operations are recorded: the per-thread state, the aggregation keys and values,
//! the totals, the stacks and the hold sleeps.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK, macros::map, maps::HashMap, programs::tracing::StackIdContext,
};
use tracer_common::{
    totals_index, AggKey, AggValue, Counter, LockState, ModeTotals, SleepKey, StateKey, KEYS_AGG,
    NO_STACK,
};

use crate::{
    filter::Locker,
    maps::{
        atomic_add, config, count, count_key, keeps_thread, on_stack, slot_of, AGG, BPF_NOEXIST,
        EEXIST, FULL_AGG, FULL_SLEEPS, LOCK_STATE, STACKS, TOTALS,
    },
};

/// Sleeping time of holds per kernel stack of the sleep.
#[map]
pub static SLEEPS: HashMap<SleepKey, u64> = HashMap::with_max_entries(4096, 0);

pub const EFAULT: i32 = 14;

/// Why the lock was taken, as far as it is known without a stack.
#[derive(Clone, Copy)]
pub struct Reason {
    /// 1 + index into MM_SYSCALLS, or 0.
    pub syscall: u8,
    pub fault: u8,
}

/// The thread's state for this mm, and whether it was created just now (the thread's first
/// event since the tracer attached, or since its entry was evicted).
#[inline(always)]
pub fn state_of(key: &StateKey) -> Option<(*mut LockState, bool)> {
    if let Some(state) = LOCK_STATE.get_ptr_mut(key) {
        return Some((state, false));
    }
    LOCK_STATE.insert(key, &LockState::ZERO, BPF_NOEXIST).ok()?;
    LOCK_STATE.get_ptr_mut(key).map(|state| (state, true))
}

#[inline(always)]
pub fn add_totals(outside: bool, mode: u8, f: impl FnOnce(&mut ModeTotals)) {
    if let Some(totals) = TOTALS.get_ptr_mut(totals_index(outside, mode)) {
        f(unsafe { &mut *totals });
    }
}

#[inline(always)]
pub fn add_sleep(hold: &AggKey, stack: i32, ns: u64) {
    let key = SleepKey {
        hold: *hold,
        stack,
        _pad: 0,
    };
    if let Some(total) = slot_of(&SLEEPS, &key, &0, FULL_SLEEPS, Counter::SleepMapFull) {
        atomic_add(total, ns);
    }
}

/// The aggregation key of one duration. Stacks are kept for durations over the stack
/// threshold (or when `force`: a hold that blocked someone, a sampled operation): the ones
/// walked outside the critical section, at start_locking for a sampled operation or at
/// contention_begin for a wait that slept (the caller that locks is the one that unlocks: the
/// same code path serves the hold). One that was not gets its stacks walked inside the critical
/// section, where all waiters pay for the microseconds it takes, only past the late threshold
/// (1 ms unless every stack is asked for): `late_stacks`, which the program walked when
/// `ends_past_late_threshold` asked; shorter ones are grouped without a stack, by cause.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn agg_key(
    locker: &Locker,
    kind: u8,
    mode: u8,
    ns: u64,
    reason: Reason,
    force: bool,
    st: &LockState,
    late_stacks: (i32, i32),
) -> AggKey {
    let cfg = config();
    let force = force || st.user_copy_sampled != 0;
    let (kernel_stack, user_stack) = if !(force || ns >= cfg.stack_threshold_ns) {
        (NO_STACK, NO_STACK)
    } else if st.start_kernel_stack != NO_STACK {
        (st.start_kernel_stack, st.start_user_stack)
    } else if ns >= cfg.late_stack_threshold_ns {
        late_stacks
    } else {
        (NO_STACK, NO_STACK)
    };
    AggKey {
        pid: locker.pid,
        tid: if locker.outside_pid != 0 || keeps_thread(KEYS_AGG) {
            locker.tid
        } else {
            0
        },
        locker_pid: locker.outside_pid,
        kernel_stack,
        user_stack,
        kind,
        mode,
        syscall: reason.syscall,
        fault: reason.fault,
    }
}

/// The AGG value of `key`, inserted (and counted, for folding thread ids) if new.
#[inline(always)]
pub fn agg_value(key: &AggKey) -> Option<*mut AggValue> {
    // Its callers may hold the key in a state a global function was handed.
    let key = on_stack(key);
    if let Some(value) = AGG.get_ptr_mut(&key) {
        return Some(value);
    }
    let value = slot_of(&AGG, &key, &AggValue::ZERO, FULL_AGG, Counter::AggMapFull)?;
    count_key(KEYS_AGG);
    Some(value)
}

/// The current kernel stack, and the user stack unless --no-user-stacks.
#[inline(always)]
pub fn walk_stacks<C: StackIdContext>(ctx: &C) -> (i32, i32) {
    let kernel = stack_id(
        ctx,
        0,
        Counter::KernelStackCollision,
        Counter::KernelStackFailed,
    );
    let user = if config().user_stacks != 0 {
        stack_id(
            ctx,
            BPF_F_USER_STACK as u64,
            Counter::UserStackCollision,
            Counter::UserStackFailed,
        )
    } else {
        NO_STACK
    };
    (kernel, user)
}

/// The STACKS id of the current stack. The map is a hash table without chaining: a stack whose
/// bucket another stack holds fails with EEXIST and is counted. A retry without the innermost
/// (tracing machinery) frame would hash elsewhere, but it took 6.1's verifier from 350 000 to
/// 850 000 of its million instructions on acquire_returned.
#[inline(always)]
pub fn stack_id<C: StackIdContext>(
    ctx: &C,
    flags: u64,
    collision: Counter,
    failed: Counter,
) -> i32 {
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        Err(err) => {
            let err = -err;
            if err == EEXIST {
                count(collision);
            } else if err != EFAULT {
                // EFAULT: no user stack (a kernel thread such as khugepaged); not a loss.
                count(failed);
            }
            NO_STACK
        }
    }
}
