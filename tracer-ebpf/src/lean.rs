//! The lean path: `--lean` (timing only) without per-thread rows, on targets listed in
//! TARGET_SLOTS, at a constant cost per event: the target filter through the slots, the
//! thread's timing in its LEAN_THREADS entry (an index, not a hash; one cache line), and
//! durations added to the per-CPU LEAN_AGG array by (target, kind, mode) with their log2
//! histogram, which also stands for the targets' own totals of acquisitions, waits and holds.
//! Nothing is inserted per event.
//!
//! A wait or hold of LEAN_CAUSE_THRESHOLD_NS or more is added by cause: its step leaves it in
//! `LEAN_ENDED` and asks the program (`WANTS_CAUSE`), which reads the saved registers (the
//! program knows how: BTF or classic) and hands the cause to `lean_add_ended`.
//!
//! The defaults add their short operations to the same array, by cause as well (`add_short`):
//! a wait or hold of a listed target's own thread with no stacks, no thread id and nobody to
//! charge it to, which is most of them on a busy lock, costs an array add instead of a hash
//! lookup and atomic adds left pending to the thread's next step.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, PerCpuArray},
};
use tracer_common::{
    fast_cause, lean_agg_index, lean_thread_index, AggKey, AggValue, Counter, LeanThread,
    LockTiming, OffCpu, StateKey, KIND_HOLD, KIND_WAIT, LEAN_AGG_SLOTS, LEAN_CAUSE_THRESHOLD_NS,
    LEAN_THREAD_SLOTS, MODE_WRITE, NO_STACK,
};

use crate::{
    event::{decode, Hook, LockArgs, LockCall},
    filter::{Locker, NO_SLOT},
    maps::{add_duration, atomic_add, config, count, BPF_F_MMAPABLE, LOCK_STATE},
    records::{add_totals, agg_value, state_of},
};

/// Waits and holds of the listed targets' own threads, by `lean_agg_index`.
#[map]
pub static LEAN_AGG: PerCpuArray<AggValue> = PerCpuArray::with_max_entries(LEAN_AGG_SLOTS, 0);

/// The lean path's per-thread lock timing, by `lean_thread_index`. A LockState (in LOCK_STATE)
/// spans seven cache lines and a hash lookup; with eight threads on two CPUs, each event found
/// its lines cold, and the state cost more than the filter, the clock and the sums together.
/// Page-aligned, each entry is one cache line.
#[map]
pub static LEAN_THREADS: Array<LeanThread> =
    Array::with_max_entries(LEAN_THREAD_SLOTS, BPF_F_MMAPABLE);

/// What a lean step returns: done, or a long wait or hold waits in LEAN_ENDED for its cause.
pub const LEAN_DONE: i32 = 0;
pub const WANTS_CAUSE: i32 = 1;

/// A long wait or hold a lean step ended, until the program hands in its cause.
#[derive(Clone, Copy)]
pub struct LeanEnded {
    kind: u8,
    mode: u8,
    ns: u64,
}

/// Slot 0: the long wait or hold of the step that returned WANTS_CAUSE on this CPU (the lock
/// programs run without preemption: the program's next call takes it).
#[map]
static LEAN_ENDED: PerCpuArray<LeanEnded> = PerCpuArray::with_max_entries(1, 0);

/// Whether the lean path takes this event: a process's own lock, in timing-only mode without
/// per-thread rows (a listed target's, or any process's with `-a` and `serve`). Outside lockers
/// keep the general path: their entries name them.
#[inline(always)]
pub fn takes(locker: &Locker) -> bool {
    let cfg = config();
    cfg.attribution == 0 && cfg.per_thread == 0 && locker.outside_pid == 0
}

/// One hit of the lean path, as global functions, one per hook: the verifier checks each once,
/// apart from the program around it. Inlined, its pairing was explored once per path of the
/// rest of the program (120 000 instructions for acquire_returned on 6.18, 0.2 s to load).
macro_rules! lean_steps {
    ($($name:ident: $hook:expr),*) => {$(
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $name(locker: *const Locker, call: *const LockCall) -> i32 {
            match unsafe { (locker.as_ref(), call.as_ref()) } {
                (Some(locker), Some(call)) => on_lock_event(locker, &call.args($hook)),
                _ => LEAN_DONE,
            }
        }
    )*};
}

/// Adds the long wait or hold the last step on this CPU left in LEAN_ENDED, under the cause
/// the program read (1 + index into MM_SYSCALLS or 0, and whether a fault).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn lean_add_ended(locker: *const Locker, syscall: u32, fault: u32) -> i32 {
    let (Some(locker), Some(ended)) = (unsafe { locker.as_ref() }, LEAN_ENDED.get_ptr(0)) else {
        return 0;
    };
    let ended = unsafe { *ended };
    add(
        locker,
        ended.kind,
        ended.mode,
        ended.ns,
        (syscall as u8, fault as u8),
    );
    0
}

lean_steps!(
    lean_start: Hook::StartLocking,
    lean_acquire: Hook::AcquireReturned,
    lean_release: Hook::Released
);

#[inline(always)]
fn on_lock_event(locker: &Locker, args: &LockArgs) -> i32 {
    let key = StateKey {
        tid: locker.tid,
        _pad: 0,
        mm: args.mm,
    };
    let Some((timing, first_seen)) = timing_of(&key) else {
        count(Counter::StateMapFull);
        return LEAN_DONE;
    };
    // No reset to idle afterwards: the timing clears itself.
    let event = decode(args);
    let mut fx = timing.step(event, unsafe { bpf_ktime_get_ns() }, &mut ());
    if first_seen {
        fx = fx.seen_first(event);
    }
    if let Some(counter) = fx.counter {
        count(counter);
    }
    // Acquisitions, waits and holds are counted in LEAN_AGG alone (user space folds them into
    // the totals: every acquisition ends a wait); only the rare outcomes touch TOTALS here.
    if let Some(mode) = fx.failed_trylock {
        add_totals(false, mode, |t| t.failed_trylocks += 1);
    }
    if let Some(mode) = fx.interrupted {
        add_totals(false, mode, |t| t.interrupted += 1);
    }
    if fx.downgraded {
        add_totals(false, MODE_WRITE, |t| t.downgrades += 1);
    }
    match (fx.wait, fx.hold) {
        (Some((mode, ns)), None) => ended(locker, KIND_WAIT, mode, ns),
        (None, Some((mode, ns))) => ended(locker, KIND_HOLD, mode, ns),
        (wait, hold) => {
            // Both at once (a start while holding): neither waits for a cause.
            if let Some((mode, ns)) = wait {
                add(locker, KIND_WAIT, mode, ns, (0, 0));
            }
            if let Some((mode, ns)) = hold {
                add(locker, KIND_HOLD, mode, ns, (0, 0));
            }
            LEAN_DONE
        }
    }
}

/// A wait or hold that ended: added now when short, else left in LEAN_ENDED for its cause.
#[inline(always)]
fn ended(locker: &Locker, kind: u8, mode: u8, ns: u64) -> i32 {
    if ns < LEAN_CAUSE_THRESHOLD_NS {
        add(locker, kind, mode, ns, (0, 0));
        return LEAN_DONE;
    }
    let Some(slot) = LEAN_ENDED.get_ptr_mut(0) else {
        add(locker, kind, mode, ns, (0, 0));
        return LEAN_DONE;
    };
    unsafe { *slot = LeanEnded { kind, mode, ns } };
    WANTS_CAUSE
}

/// A listed target's duration goes to its LEAN_AGG slot, which stands for its totals too;
/// another process's (`-a`, `serve`) to its AGG entry without stacks, and to the totals. Both
/// by `cause` (syscall, fault), known for the long ones.
#[inline(always)]
fn add(locker: &Locker, kind: u8, mode: u8, ns: u64, (syscall, fault): (u8, u8)) {
    if locker.slot != NO_SLOT {
        // A fault inside an mm syscall has no slot of its own: the syscall names it.
        let cause = fast_cause(syscall, fault)
            .or_else(|| fast_cause(syscall, 0))
            .unwrap_or(0);
        if let Some(value) = LEAN_AGG.get_ptr_mut(lean_agg_index(locker.slot, kind, mode, cause)) {
            unsafe { (*value).add(ns) };
        }
        return;
    }
    if kind == KIND_WAIT {
        add_totals(false, mode, |t| {
            t.acquisitions += 1;
            t.add_wait(ns);
        });
    } else {
        add_totals(false, mode, |t| t.add_hold(ns));
    }
    let key = AggKey {
        pid: locker.pid,
        kind,
        mode,
        kernel_stack: NO_STACK,
        user_stack: NO_STACK,
        syscall,
        fault,
        ..AggKey::default()
    };
    if let Some(value) = agg_value(&key) {
        add_duration(value, ns);
    }
}

/// What a short operation of the defaults adds beside its duration: the part of a wait spent
/// asleep, or the off-CPU parts of a hold.
pub enum Parts<'a> {
    Wait { contended_ns: u64 },
    Hold(&'a OffCpu),
}

/// Adds a finished wait or hold of the defaults to LEAN_AGG when its key needs nothing else
/// (no stacks, no thread id, a listed target's own thread, a cause with a slot); the caller
/// has checked that it is charged to nobody. False: the caller aggregates it by its key.
#[inline(always)]
pub fn add_short(locker: &Locker, key: &AggKey, ns: u64, parts: Parts) -> bool {
    let plain = key.kernel_stack == NO_STACK
        && key.user_stack == NO_STACK
        && key.tid == 0
        && key.locker_pid == 0
        && locker.slot != NO_SLOT;
    let Some(cause) = fast_cause(key.syscall, key.fault).filter(|_| plain) else {
        return false;
    };
    let index = lean_agg_index(locker.slot, key.kind, key.mode, cause);
    let Some(value) = LEAN_AGG.get_ptr_mut(index) else {
        return false;
    };
    let value = unsafe { &mut *value };
    value.add(ns);
    match parts {
        Parts::Wait { contended_ns } => value.contended_ns += contended_ns,
        Parts::Hold(off) => {
            value.runnable_ns += off.runnable_ns;
            value.sleeping_ns += off.sleeping_ns;
            value.uninterruptible_ns += off.uninterruptible_ns;
        }
    }
    true
}

/// The lock timing of `key`, and whether it was created just now (the thread's first event, or
/// its first on a new mm). Its LEAN_THREADS entry when it has it or can take it; else, and for
/// an operation already begun there, in LOCK_STATE. An entry changes hands only when its thread
/// exits (`forget_thread`): two live threads at one index, both running, each stepping the
/// other's timing, would pair one's start with the other's release.
#[inline(always)]
fn timing_of(key: &StateKey) -> Option<(&'static mut LockTiming, bool)> {
    let entry = unsafe { &mut *LEAN_THREADS.get_ptr_mut(lean_thread_index(key.tid))? };
    if entry.key.tid == key.tid && entry.key.mm == key.mm {
        return Some((&mut entry.timing, false));
    }
    if let Some(state) = LOCK_STATE.get_ptr_mut(key) {
        return Some((unsafe { &mut (*state).timing }, false));
    }
    let own_idle = entry.key.tid == key.tid && entry.timing.is_idle();
    if own_idle || (entry.key.tid == 0 && claim(entry)) {
        entry.key = *key;
        entry.timing.reset();
        return Some((&mut entry.timing, true));
    }
    let (state, first_seen) = state_of(key)?;
    Some((unsafe { &mut (*state).timing }, first_seen))
}

/// Takes a free entry unless another thread is taking it at the same time. Without a
/// compare-and-swap (the object is built for BPF v1), an atomic add and a read of the sum:
/// the adds to one word are ordered, so at most one thread reads back 1.
#[inline(always)]
fn claim(entry: &mut LeanThread) -> bool {
    atomic_add(&mut entry.claims, 1);
    unsafe { core::ptr::read_volatile(&entry.claims) == 1 }
}

/// An exiting thread frees its entry for the next thread at its index.
#[inline(always)]
pub fn forget_thread(tid: u32) {
    let Some(entry) = LEAN_THREADS.get_ptr_mut(lean_thread_index(tid)) else {
        return;
    };
    let entry = unsafe { &mut *entry };
    if entry.key.tid == tid {
        entry.timing.reset();
        entry.claims = 0;
        unsafe { core::ptr::write_volatile(&mut entry.key.tid, 0) };
    }
}
