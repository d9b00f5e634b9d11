//! The lock operation of one thread on one mm, from start_locking to release: the state
//! machine (tracer_common::lock_state) stepped by each hit, and its effects recorded in place:
//! durations per stack, waits charged to the holders they waited behind, holds with their
//! off-CPU time. Called by the mmap_lock programs, and by contention_begin when a wait sleeps.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns, macros::map, maps::PerCpuArray, programs::tracing::StackIdContext,
};
use tracer_common::{
    Counter, Effects, LockEvent, LockState, OffCpu, StateKey, KIND_HOLD, KIND_WAIT, MODE_WRITE,
    NO_STACK,
};

use crate::{
    blockers::{self, EndedHold},
    causes::{self, kernel_entry, Entry},
    context::Regs,
    context::{BtfRegs, ClassicRegs},
    event::{decode, decode_mode, Hook, LockCall, HOOK_ACQUIRE, HOOK_START},
    filter::{classified, current_is_exiting, Locker, NO_SLOT},
    lean::{self, Parts},
    maps::{armed, config, count, TID_HOLDING},
    pending,
    records::{add_sleep, add_totals, agg_key, state_of, walk_stacks, Reason},
    timeline,
    user_stacks::{self, CopyUserStack, EventShare},
};

/// What the global function returns: done, or call again with the stacks walked.
const DONE: i32 = 0;
const WANTS_STACKS: i32 = 1;
/// Or'ed into DONE: a wait, a hold ended; `ENDED` has it for the function that records it.
const WAIT_ENDED: i32 = 2;
const HOLD_ENDED: i32 = 4;

/// The family's work for one hit, as global functions: the verifier checks each once, apart
/// from the program around it and from the other global functions it calls, rather than once
/// per path through all of them inlined together (which took it past half its million
/// instructions). One per hook, so that each knows its hook; one set per kind of tracepoint,
/// since they read the user registers differently.
pub trait Family: Regs + CopyUserStack {
    fn event<const HOOK: u32>(st: *mut LockState, call: &mut LockCall) -> i32;
    fn wait_ended(st: *mut LockState, end: *const Ended);
    fn hold_ended(st: *mut LockState, end: *const Ended);
}

macro_rules! event_functions {
    ($regs:ty, [$start:ident, $acquire:ident, $release:ident], $wait:ident, $hold:ident) => {
        impl Family for $regs {
            #[inline(always)]
            fn event<const HOOK: u32>(st: *mut LockState, call: &mut LockCall) -> i32 {
                match HOOK {
                    HOOK_START => $start(st, call),
                    HOOK_ACQUIRE => $acquire(st, call),
                    _ => $release(st, call),
                }
            }

            #[inline(always)]
            fn wait_ended(st: *mut LockState, end: *const Ended) {
                $wait(st, end);
            }

            #[inline(always)]
            fn hold_ended(st: *mut LockState, end: *const Ended) {
                $hold(st, end);
            }
        }

        event_functions!(@step $regs, $start, Hook::StartLocking);
        event_functions!(@step $regs, $acquire, Hook::AcquireReturned);
        event_functions!(@step $regs, $release, Hook::Released);
        event_functions!(@ended $regs, $wait, wait_ended);
        event_functions!(@ended $regs, $hold, hold_ended);
    };
    (@step $regs:ty, $name:ident, $hook:expr) => {
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $name(st: *mut LockState, call: *mut LockCall) -> i32 {
            match unsafe { (st.as_mut(), call.as_mut()) } {
                (Some(st), Some(call)) => on_lock_event::<$regs>(st, call, $hook),
                _ => DONE,
            }
        }
    };
    (@ended $regs:ty, $name:ident, $record:ident) => {
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $name(st: *mut LockState, end: *const Ended) -> i32 {
            if let (Some(st), Some(end)) = unsafe { (st.as_mut(), end.as_ref()) } {
                $record::<$regs>(st, end);
            }
            0
        }
    };
}

event_functions!(
    BtfRegs,
    [
        mmap_lock_start_btf,
        mmap_lock_acquire_btf,
        mmap_lock_release_btf
    ],
    mmap_lock_wait_ended_btf,
    mmap_lock_hold_ended_btf
);
event_functions!(
    ClassicRegs,
    [
        mmap_lock_start_classic,
        mmap_lock_acquire_classic,
        mmap_lock_release_classic
    ],
    mmap_lock_wait_ended_classic,
    mmap_lock_hold_ended_classic
);

/// Hands the hit to the family's global functions: the target filter, the lean path or the
/// thread's state, then the step (again with the stacks if it asks for them), then the
/// recording of what ended. Called from here, one level deep each, rather than from one
/// another: 6.1's verifier holds the frames of the deepest chain of calls to 512 bytes.
#[inline(always)]
pub fn run<F: Family, C: StackIdContext, const HOOK: u32>(ctx: &C, call: &mut LockCall) {
    let Some(locker) = classified(&call.mm) else {
        return;
    };
    if !armed() {
        return;
    }
    if lean::takes(&locker) {
        let done = match HOOK {
            HOOK_START => lean::lean_start(&locker, call),
            HOOK_ACQUIRE => lean::lean_acquire(&locker, call),
            _ => lean::lean_release(&locker, call),
        };
        if done == lean::WANTS_CAUSE {
            // A long wait or hold: named by what the thread entered the kernel for.
            let entry = kernel_entry::<F>(&locker);
            lean::lean_add_ended(&locker, entry.syscall as u32, entry.fault as u32);
        }
        return;
    }
    let key = StateKey {
        tid: locker.tid,
        _pad: 0,
        mm: call.mm,
    };
    let Some((state, created)) = state_of(&key) else {
        count(Counter::StateMapFull);
        return;
    };
    if HOOK == HOOK_START && config().attribution != 0 && unsafe { (*state).pending } != 0 {
        // A thread about to wait for the lock is outside it: the aggregation its last
        // operation on the mm left (see `pending`) is done now, before the wait is timed.
        pending::pending_flush(state);
    }
    call.locker = locker;
    call.first_seen = created as u32;
    let mut done = F::event::<HOOK>(state, call);
    if done == WANTS_STACKS {
        (call.kernel_stack, call.user_stack) = walk_stacks(ctx);
        call.walked = 1;
        done = F::event::<HOOK>(state, call);
    }
    if done & (WAIT_ENDED | HOLD_ENDED) != 0 {
        let Some(end) = ENDED.get_ptr_mut(0) else {
            return;
        };
        if done & WAIT_ENDED != 0 {
            F::wait_ended(state, end);
        }
        if done & HOLD_ENDED != 0 {
            F::hold_ended(state, end);
        }
    }
    let st = unsafe { &mut *state };
    if st.is_idle() {
        // Reset in place rather than deleting: the thread's next lock operation finds its
        // entry with a lookup instead of an LRU insert (which allocates), and a delete per
        // operation cost as much again. Entries of exited threads are the least recently used
        // and go first when the map fills; a live one is touched at every event of its lock
        // operation, which lasts far less than the thousands of inserts it takes to age out.
        st.reset_keeping_history();
    }
}

#[inline(always)]
fn on_lock_event<R: Family>(st: &mut LockState, call: &mut LockCall, hook: Hook) -> i32 {
    let args = call.args(hook);
    let cfg = config();
    let mm = args.mm;
    let locker = call.locker;
    let event = decode(&args);
    let first_seen = call.first_seen != 0;
    let is_start = matches!(event, LockEvent::StartLocking { .. });
    let now = unsafe { bpf_ktime_get_ns() };

    let attribute = cfg.attribution != 0;
    let new_wait = is_start && !st.timing.continues_miss(decode_mode(&args), now);
    let entry = if attribute && is_start {
        kernel_entry::<R>(&locker)
    } else {
        Entry::UNKNOWN
    };
    // Whatever asks for stacks does so here, before the state changes: the second call, with
    // the stacks, takes the same decisions.
    // `--stack-threshold 0` asks for every stack: each operation is walked (and copied, within
    // the budget) at start_locking, as the sampled ones are.
    let every_stack = cfg.stack_threshold_ns == 0;
    let sampled = attribute && new_wait && (every_stack || sampled_once(&locker, call, now));
    let wants_stacks = if is_start {
        sampled
    } else {
        ends_past_late_threshold(st, event, now)
    };
    if wants_stacks && call.walked == 0 {
        return WANTS_STACKS;
    }
    let late_stacks = if is_start {
        (NO_STACK, NO_STACK)
    } else {
        (call.kernel_stack, call.user_stack)
    };

    let (held_since, held_mode) = (st.timing.hold_start_ns, st.timing.hold_mode);
    let waiting_for_write = st.timing.wait_start_ns != 0 && st.timing.wait_mode == MODE_WRITE;
    let mut effects = st.step(event, now);
    if first_seen {
        effects.note_seen_first(event);
    }

    if new_wait {
        if attribute && begin_attributed_wait::<R>(&locker, st, now, entry, sampled, call) {
            // The wait is timed from after the tracer's own work (microseconds of stack walks
            // and copying): what the thread spends waiting for the lock, not for the tracer.
            st.timing.wait_start_ns = unsafe { bpf_ktime_get_ns() };
        }
    } else if entry.fault {
        st.fault = 1;
    }
    let mut ended = EndedHold::default();
    let mut syscall = 0;
    if attribute {
        // A writer whose wait ended without the lock (interrupted, trylock missed) leaves the
        // queue. Plain field tests rather than matching the Option effects: LLVM packs those
        // into code the verifier rejects here.
        if waiting_for_write && st.timing.wait_start_ns == 0 && st.timing.hold_start_ns != now {
            blockers::abandon_wait(&locker, mm);
        }
        ended = blockers::track_holders(&locker, mm, held_since, held_mode, st);
        if locker.slot == NO_SLOT || locker.outside_pid != 0 {
            track_holding_thread(
                locker.tid,
                mm,
                held_since != 0,
                st.timing.hold_start_ns != 0,
            );
        }
        syscall = causes::charge(st, &effects);
    }
    let reason = Reason {
        syscall,
        fault: st.fault,
    };
    apply(&locker, &effects, reason, st, ended, late_stacks)
}

/// Whether the sampler picked this new wait's operation for stacks and a user stack copy
/// (`user_copy_sampled` keeps them whatever its length), so that the common short paths are
/// named; it draws once, in the first call. No operation is walked for what it is expected to
/// be: the others get their stacks when their wait goes to sleep (`wait_sleeps`) or, past the
/// late threshold, when they end.
#[inline(always)]
fn sampled_once(locker: &Locker, call: &mut LockCall, now: u64) -> bool {
    if call.walked == 0 {
        call.sampled = user_stacks::sample_at_start(locker, now) as u32;
    }
    call.sampled != 0
}

/// A new wait with attribution on: whether it serves a fault, its cause and, when sampled, its
/// stacks (walked by the program) and user stack copy. Returns whether it took them.
#[inline(always)]
fn begin_attributed_wait<R: CopyUserStack>(
    locker: &Locker,
    st: &mut LockState,
    now: u64,
    entry: Entry,
    sampled: bool,
    call: &LockCall,
) -> bool {
    st.fault = entry.fault as u8;
    if entry.fault {
        causes::count_fault_lock();
    }
    st.cause = entry.syscall;
    if !sampled {
        return false;
    }
    st.user_copy_sampled = 1;
    if st.start_kernel_stack != NO_STACK {
        return false;
    }
    (st.start_kernel_stack, st.start_user_stack) = (call.kernel_stack, call.user_stack);
    user_stacks::copy_at_start::<R>(locker, st, now);
    true
}

/// lock:contention_begin on a target's mmap_lock, in a wait with attribution on: the thread
/// is about to sleep, so what names its wait is done now, once, where it costs the sleeper
/// alone: the holders it queues behind (charged when it ends), and its stacks and user stack
/// copy, which the hold that follows reuses. Waits that never sleep (an uncontended lock, a
/// writer's short optimistic spin) pay none of it.
#[inline(always)]
pub fn wait_sleeps<R: CopyUserStack, C: StackIdContext>(ctx: &C, st: &mut LockState, mm: u64) {
    st.slept = 1;
    let Some(locker) = classified(&mm) else {
        return;
    };
    let write = st.timing.wait_mode == MODE_WRITE;
    blockers::begin_wait(&locker, mm, write, &mut st.blockers);
    if st.start_kernel_stack == NO_STACK {
        (st.start_kernel_stack, st.start_user_stack) = walk_stacks(ctx);
        user_stacks::copy_at_start::<R>(&locker, st, unsafe { bpf_ktime_get_ns() });
    }
}

/// Whether this acquire or release ends a wait or hold that `agg_key` will want stacks for and
/// that has none from its start_locking: one past the late threshold.
#[inline(always)]
fn ends_past_late_threshold(st: &LockState, event: LockEvent, now: u64) -> bool {
    st.start_kernel_stack == NO_STACK
        && st
            .timing
            .ending_began(event)
            .is_some_and(|began| now.wrapping_sub(began) >= config().late_stack_threshold_ns)
}

/// sched_switch finds the state of a holder that is not a listed target's own thread through
/// its tid alone (a listed target's thread, through its own mm: no entry here, so no lookup
/// inside the critical section). The entry stays and is overwritten in place (mm while
/// holding, 0 after), so a hold costs a lookup, not an insert and a delete; sched_process_exit
/// deletes it, and an exiting thread (exit_mm's lock, after sched_process_exit on recent
/// kernels) inserts none again.
#[inline(always)]
fn track_holding_thread(tid: u32, mm: u64, was_holding: bool, holding: bool) {
    if holding == was_holding {
        return;
    }
    let value = if holding { mm } else { 0 };
    match TID_HOLDING.get_ptr_mut(&tid) {
        Some(slot) => unsafe { *slot = value },
        None if holding && !current_is_exiting() => {
            if TID_HOLDING.insert(&tid, &mm, 0).is_err() {
                count(Counter::ThreadMapFull);
            }
        }
        None => {}
    }
}

/// Counts what the step produced, and leaves a wait or hold that ended in `ENDED` for the
/// program to have it recorded; returns DONE with WAIT_ENDED or HOLD_ENDED.
#[inline(always)]
fn apply(
    locker: &Locker,
    fx: &Effects,
    reason: Reason,
    st: &LockState,
    ended: EndedHold,
    late_stacks: (i32, i32),
) -> i32 {
    if let Some(counter) = fx.counter {
        count(counter);
    }
    let outside = locker.outside_pid != 0;
    if let Some(mode) = fx.acquired {
        add_totals(outside, mode, |t| t.acquisitions += 1);
    }
    if let Some(mode) = fx.failed_trylock {
        add_totals(outside, mode, |t| t.failed_trylocks += 1);
    }
    if let Some(mode) = fx.interrupted {
        add_totals(outside, mode, |t| t.interrupted += 1);
    }
    if fx.downgraded {
        add_totals(outside, MODE_WRITE, |t| t.downgrades += 1);
    }
    // A wait and a hold never end at once (a downgrade ends a hold without a wait).
    let (done, (mode, ns)) = match (fx.wait, fx.hold) {
        (Some(wait), _) => (WAIT_ENDED, wait),
        (None, Some(hold)) => (HOLD_ENDED, hold),
        (None, None) => return DONE,
    };
    // In a per-CPU scratch value rather than on the stack: the frames of the program and of
    // the function that records it together stay within 6.1's 512 bytes. The lock programs run
    // in process context without preemption: nothing else on this CPU uses the value until
    // they return.
    let Some(end) = ENDED.get_ptr_mut(0) else {
        return DONE;
    };
    let end = unsafe { &mut *end };
    *end = Ended {
        locker: *locker,
        ns,
        contended_ns: fx.wait_contended_ns,
        hold_start_ns: ended.hold_start_ns,
        off: fx.hold_offcpu,
        late_stacks: [late_stacks.0, late_stacks.1],
        mode,
        syscall: reason.syscall,
        fault: reason.fault,
        blocked: ended.blocked as u8,
        // A downgrade ends the write hold and begins a read hold: the copy serves that too.
        last_use: (st.timing.hold_start_ns == 0) as u8,
        _pad: [0; 3],
    };
    done
}

/// Slot 0: the wait or hold `apply` hands to the global function that records it.
#[map]
static ENDED: PerCpuArray<Ended> = PerCpuArray::with_max_entries(1, 0);

/// A wait or hold that just ended, as `apply` hands it to the global functions that record it
/// (at most five scalars or pointers: the rest in memory).
#[repr(C)]
pub struct Ended {
    pub locker: Locker,
    pub ns: u64,
    /// A wait: the part asleep in the rwsem slow path.
    pub contended_ns: u64,
    /// A hold that blocked someone: when it began (its identity for its waiters).
    pub hold_start_ns: u64,
    /// A hold: where it went off CPU.
    pub off: OffCpu,
    /// Walked inside the critical section for an operation past the late threshold.
    pub late_stacks: [i32; 2],
    pub mode: u8,
    pub syscall: u8,
    pub fault: u8,
    pub blocked: u8,
    /// This is the operation's last use of its user stack copy.
    pub last_use: u8,
    pub _pad: [u8; 3],
}

/// Records a finished wait: totals, key, timeline, user stack event, and its aggregation: in
/// LEAN_AGG when short and charged to nobody, else left pending until the thread is outside
/// the lock.
#[inline(always)]
fn wait_ended<R: CopyUserStack>(st: &mut LockState, end: &Ended) {
    let locker = end.locker;
    let (mode, ns) = (end.mode, end.ns);
    let reason = end.reason();
    add_totals(locker.outside_pid != 0, mode, |t| t.add_wait(ns));
    let late = (end.late_stacks[0], end.late_stacks[1]);
    let waiter = agg_key(&locker, KIND_WAIT, mode, ns, reason, false, st, late);
    timeline::emit(&locker, &waiter, ns);
    let share = EventShare::waited(end.contended_ns);
    user_stacks::send_event::<R>(&locker, st, &waiter, ns, share, end.last_use != 0);
    let parts = Parts::Wait {
        contended_ns: end.contended_ns,
    };
    if st.blockers.count == 0 && lean::add_short(&locker, &waiter, ns, parts) {
        return;
    }
    pending::defer_wait(st, waiter, ns, end.contended_ns);
}

/// Records a finished hold: as a wait, plus its off-CPU sleep stack and, when it blocked
/// someone, its record for its waiters.
#[inline(always)]
fn hold_ended<R: CopyUserStack>(st: &mut LockState, end: &Ended) {
    let locker = end.locker;
    let (mode, ns) = (end.mode, end.ns);
    let reason = end.reason();
    add_totals(locker.outside_pid != 0, mode, |t| t.add_hold(ns));
    let off = &end.off;
    let late = (end.late_stacks[0], end.late_stacks[1]);
    // A hold that blocked someone gets its stacks whatever its length: its waiters need them.
    let blocked = end.blocked != 0;
    let hold = agg_key(&locker, KIND_HOLD, mode, ns, reason, blocked, st, late);
    timeline::emit(&locker, &hold, ns);
    let share = EventShare::held(off);
    user_stacks::send_event::<R>(&locker, st, &hold, ns, share, end.last_use != 0);
    if off.sleeping_ns > 0 {
        add_sleep(&hold, off.longest_sleep_stack, off.sleeping_ns);
    }
    if blocked {
        // Kept now, not later with the aggregation: its waiters, charged when they leave
        // the lock, must find it.
        blockers::remember_holder(locker.tid, &hold, end.hold_start_ns);
    } else if lean::add_short(&locker, &hold, ns, Parts::Hold(off)) {
        return;
    }
    pending::defer_hold(st, hold, ns, off);
}

impl Ended {
    #[inline(always)]
    fn reason(&self) -> Reason {
        Reason {
            syscall: self.syscall,
            fault: self.fault,
        }
    }
}
