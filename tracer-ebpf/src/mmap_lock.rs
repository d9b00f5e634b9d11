//! The mmap_lock tracepoint family: start_locking, acquire_returned, released.
//!
//! Each hit is decoded, filtered to the targets' mms, fed to the per-(thread, mm) state machine
//! (tracer_common::lock_state), and its effects are aggregated in place.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::bpf_ktime_get_ns,
    macros::tracepoint,
    programs::{tracing::StackIdContext, TracePointContext},
};
use tracer_common::{
    totals_index, AggKey, AggValue, Counter, Effects, LockEvent, LockState, StateKey,
    TracepointFields, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE, NO_STACK,
};

use crate::{
    maps::{armed, config, count, AGG, AGG_FULL, LOCK_STATE, STACKS, TOTALS},
    target::{classify, fatal_signal_pending, Locker},
    timeline,
};

const BPF_NOEXIST: u64 = 1;
const E2BIG: i32 = 7;
const EEXIST: i32 = 17;
const EFAULT: i32 = 14;

#[derive(Clone, Copy)]
enum Hook {
    StartLocking,
    AcquireReturned,
    Released,
}

#[tracepoint]
pub fn mmap_lock_start_locking(ctx: TracePointContext) -> u32 {
    let _ = on_lock_event(&ctx, Hook::StartLocking);
    0
}

#[tracepoint]
pub fn mmap_lock_acquire_returned(ctx: TracePointContext) -> u32 {
    let _ = on_lock_event(&ctx, Hook::AcquireReturned);
    0
}

#[tracepoint]
pub fn mmap_lock_released(ctx: TracePointContext) -> u32 {
    let _ = on_lock_event(&ctx, Hook::Released);
    0
}

#[inline(always)]
fn on_lock_event(ctx: &TracePointContext, hook: Hook) -> Result<(), i64> {
    let cfg = config();
    let fields = match hook {
        Hook::StartLocking => cfg.start_locking,
        Hook::AcquireReturned => cfg.acquire_returned,
        Hook::Released => cfg.released,
    };
    let mm: u64 = unsafe { ctx.read_at(fields.mm as usize) }?;
    let Some(locker) = classify(mm) else {
        return Ok(());
    };
    if !armed() {
        return Ok(());
    }
    let event = decode(ctx, hook, &fields)?;
    let key = StateKey {
        tid: locker.tid,
        _pad: 0,
        mm,
    };
    let Some(state) = state_of(&key) else {
        count(Counter::StateMapFull);
        return Ok(());
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let (effects, idle) = unsafe { ((*state).step(event, now), (*state).is_idle()) };
    if idle {
        // Only threads inside a lock operation keep an entry. Left to LRU eviction, the
        // entries of exited threads would push out live ones (a process creating thousands of
        // threads a second fills any size), turning real waits into unpaired events.
        let _ = LOCK_STATE.remove(&key);
    }
    apply(ctx, &locker, &effects);
    Ok(())
}

#[inline(always)]
fn decode(ctx: &TracePointContext, hook: Hook, f: &TracepointFields) -> Result<LockEvent, i64> {
    let write: u8 = unsafe { ctx.read_at(f.write as usize) }?;
    let mode = if write != 0 { MODE_WRITE } else { MODE_READ };
    Ok(match hook {
        Hook::StartLocking => LockEvent::StartLocking { mode },
        Hook::Released => LockEvent::Released { mode },
        Hook::AcquireReturned => {
            let success: u8 = unsafe { ctx.read_at(f.success as usize) }?;
            let success = success != 0;
            LockEvent::AcquireReturned {
                mode,
                success,
                fatal_signal: !success && fatal_signal_pending(),
            }
        }
    })
}

#[inline(always)]
fn state_of(key: &StateKey) -> Option<*mut LockState> {
    if let Some(state) = LOCK_STATE.get_ptr_mut(key) {
        return Some(state);
    }
    LOCK_STATE
        .insert(key, &LockState::default(), BPF_NOEXIST)
        .ok()?;
    LOCK_STATE.get_ptr_mut(key)
}

#[inline(always)]
fn apply(ctx: &TracePointContext, locker: &Locker, fx: &Effects) {
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
    if let Some((mode, ns)) = fx.wait {
        add_totals(outside, mode, |t| t.add_wait(ns));
        let key = aggregate(ctx, locker, KIND_WAIT, mode, ns);
        timeline::emit(locker, &key, ns);
    }
    if let Some((mode, ns)) = fx.hold {
        add_totals(outside, mode, |t| t.add_hold(ns));
        let key = aggregate(ctx, locker, KIND_HOLD, mode, ns);
        timeline::emit(locker, &key, ns);
    }
}

#[inline(always)]
fn add_totals(outside: bool, mode: u8, f: impl FnOnce(&mut tracer_common::ModeTotals)) {
    if let Some(totals) = TOTALS.get_ptr_mut(totals_index(outside, mode)) {
        f(unsafe { &mut *totals });
    }
}

/// Adds one duration to its stack's entry. Stacks are taken only for durations over the
/// threshold: walking them costs microseconds, and acquire_returned / released run inside the
/// critical section, where every nanosecond is paid by all waiters. Returns the key (with its
/// stack ids) for the timeline.
#[inline(always)]
fn aggregate(ctx: &TracePointContext, locker: &Locker, kind: u8, mode: u8, ns: u64) -> AggKey {
    let cfg = config();
    let (kernel_stack, user_stack) = if ns >= cfg.stack_threshold_ns {
        let kernel = stack_id(
            ctx,
            0,
            Counter::KernelStackCollision,
            Counter::KernelStackFailed,
        );
        let user = if cfg.user_stacks != 0 {
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
    } else {
        (NO_STACK, NO_STACK)
    };
    let key = AggKey {
        pid: locker.pid,
        tid: if cfg.per_thread != 0 || locker.outside_pid != 0 {
            locker.tid
        } else {
            0
        },
        locker_pid: locker.outside_pid,
        kernel_stack,
        user_stack,
        kind,
        mode,
        _pad: [0; 2],
    };
    if let Some(value) = entry_of(&key) {
        unsafe { (*value).add(ns) };
    }
    key
}

#[inline(always)]
fn stack_id(ctx: &TracePointContext, flags: u64, collision: Counter, failed: Counter) -> i32 {
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

#[inline(always)]
fn entry_of(key: &AggKey) -> Option<*mut AggValue> {
    if let Some(value) = AGG.get_ptr_mut(key) {
        return Some(value);
    }
    if AGG_FULL.get(0).is_some_and(|full| *full != 0) {
        count(Counter::AggMapFull);
        return None;
    }
    if let Err(err) = AGG.insert(key, &AggValue::ZERO, BPF_NOEXIST) {
        if -err == E2BIG {
            if let Some(full) = AGG_FULL.get_ptr_mut(0) {
                unsafe { *full = 1 };
            }
        }
        // EEXIST: another CPU inserted the key first; the lookup below finds it.
        if -err != EEXIST {
            count(Counter::AggMapFull);
            return None;
        }
    }
    AGG.get_ptr_mut(key)
}
