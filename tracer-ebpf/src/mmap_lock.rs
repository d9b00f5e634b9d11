//! The mmap_lock tracepoint family: start_locking, acquire_returned, released, as BTF
//! tracepoints or, where the kernel lacks their BTF, classic ones (user space attaches one set).
//!
//! Each hit is decoded, filtered to the targets' mms, fed to the per-(thread, mm) state machine
//! (tracer_common::lock_state), and its effects are aggregated in place: durations per stack,
//! waits charged to the holders they waited behind, holds with their off-CPU time.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::btf_tracepoint,
    programs::{tracing::StackIdContext, BtfTracePointContext, TracePointContext},
};
use aya_ebpf::{macros::map, maps::HashMap};
use tracer_common::{
    totals_index, AggKey, AggValue, Counter, Effects, LockEvent, LockState, ModeTotals, SleepKey,
    StateKey, KEYS_AGG, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE, NO_STACK,
};

use crate::{
    blockers::{self, EndedHold},
    context::LockContext,
    faults, lean,
    maps::{
        armed, atomic_add, config, count, count_key, keeps_thread, slot_of, AGG, BPF_NOEXIST,
        EEXIST, FULL_AGG, FULL_SLEEPS, LOCK_STATE, STACKS, TID_HOLDING, TOTALS,
    },
    pending, syscalls,
    target::{classify, fatal_signal_pending, Locker, NO_SLOT},
    timeline,
    user_stacks::{self, EventShare},
};

/// Sleeping time of holds per kernel stack of the sleep.
#[map]
pub static SLEEPS: HashMap<SleepKey, u64> = HashMap::with_max_entries(4096, 0);

const EFAULT: i32 = 14;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    StartLocking,
    AcquireReturned,
    Released,
}

/// One hit's arguments, however the tracepoint carried them.
#[derive(Clone, Copy)]
pub struct LockArgs {
    pub hook: Hook,
    pub mm: u64,
    pub write: bool,
    /// acquire_returned only.
    pub success: bool,
}

// Classic tracepoints: the fallback where the kernel has no BTF for the events. The kernel
// formats a perf record for every hit before the program runs, about 15% of a lock-bound
// target's throughput on its own.

classic_tracepoint! {
    fn mmap_lock_start_locking(ctx) {
        classic(&ctx, Hook::StartLocking);
    }
}

classic_tracepoint! {
    fn mmap_lock_acquire_returned(ctx) {
        classic(&ctx, Hook::AcquireReturned);
    }
}

classic_tracepoint! {
    fn mmap_lock_released(ctx) {
        classic(&ctx, Hook::Released);
    }
}

// BTF tracepoints (tp_btf): the arguments straight from the trace call, no record. Two sets,
// for the two prototypes: (mm, write[, success]) since 6.13, (mm, memcg_path, write[,
// success]) before; user space loads the one the kernel's BTF names. Argument indices must be
// constants: the verifier refuses a context access at a computed offset.

#[btf_tracepoint(function = "mmap_lock_start_locking")]
pub fn btf_start_locking(ctx: BtfTracePointContext) -> i32 {
    btf::<1>(&ctx, Hook::StartLocking)
}

#[btf_tracepoint(function = "mmap_lock_acquire_returned")]
pub fn btf_acquire_returned(ctx: BtfTracePointContext) -> i32 {
    btf::<1>(&ctx, Hook::AcquireReturned)
}

#[btf_tracepoint(function = "mmap_lock_released")]
pub fn btf_released(ctx: BtfTracePointContext) -> i32 {
    btf::<1>(&ctx, Hook::Released)
}

#[btf_tracepoint(function = "mmap_lock_start_locking")]
pub fn btf_memcg_start_locking(ctx: BtfTracePointContext) -> i32 {
    btf::<2>(&ctx, Hook::StartLocking)
}

#[btf_tracepoint(function = "mmap_lock_acquire_returned")]
pub fn btf_memcg_acquire_returned(ctx: BtfTracePointContext) -> i32 {
    btf::<2>(&ctx, Hook::AcquireReturned)
}

#[btf_tracepoint(function = "mmap_lock_released")]
pub fn btf_memcg_released(ctx: BtfTracePointContext) -> i32 {
    btf::<2>(&ctx, Hook::Released)
}

/// `WRITE`: the index of the write argument (success follows it).
#[inline(always)]
fn btf<const WRITE: usize>(ctx: &BtfTracePointContext, hook: Hook) -> i32 {
    let write: u64 = ctx.arg(WRITE);
    let args = LockArgs {
        hook,
        mm: ctx.arg(0),
        write: write as u8 != 0,
        success: hook == Hook::AcquireReturned && ctx.arg::<u64>(WRITE + 1) as u8 != 0,
    };
    flush_before_start(&args);
    let _ = on_lock_event(ctx, args);
    0
}

#[inline(always)]
fn classic(ctx: &TracePointContext, hook: Hook) {
    if let Ok(args) = classic_args(ctx, hook) {
        flush_before_start(&args);
        let _ = on_lock_event(ctx, args);
    }
}

/// A thread about to wait for the lock is outside it: the aggregation its last operation on the
/// mm left (see `pending`) is done now, before the wait is timed. Here, before the target
/// filter, with a lookup of its own: after the filter (or handing the state it found to the
/// filter's paths), the verifier explores the flush once per path through the filter, past its
/// limit of a million instructions.
#[inline(always)]
fn flush_before_start(args: &LockArgs) {
    if args.hook == Hook::StartLocking && config().attribution != 0 && armed() {
        pending::flush_thread(&StateKey {
            tid: bpf_get_current_pid_tgid() as u32,
            _pad: 0,
            mm: args.mm,
        });
    }
}

/// The fields of the perf record, where tracefs said they are.
#[inline(always)]
fn classic_args(ctx: &TracePointContext, hook: Hook) -> Result<LockArgs, i64> {
    let cfg = config();
    let f = match hook {
        Hook::StartLocking => &cfg.mmap_lock.start_locking,
        Hook::AcquireReturned => &cfg.mmap_lock.acquire_returned,
        Hook::Released => &cfg.mmap_lock.released,
    };
    let mm: u64 = unsafe { ctx.read_at(f.mm as usize) }?;
    let write: u8 = unsafe { ctx.read_at(f.write as usize) }?;
    let success: u8 = if hook == Hook::AcquireReturned {
        unsafe { ctx.read_at(f.success as usize) }?
    } else {
        0
    };
    Ok(LockArgs {
        hook,
        mm,
        write: write != 0,
        success: success != 0,
    })
}

/// Why the lock was taken, as far as it is known without a stack.
#[derive(Clone, Copy)]
pub struct Reason {
    /// 1 + index into MM_SYSCALLS, or 0.
    pub syscall: u8,
    pub fault: u8,
}

/// How a target thread beginning a lock operation entered the kernel.
#[derive(Clone, Copy)]
pub struct Entry {
    /// Through an exception: a user page fault.
    pub fault: bool,
    /// 1 + index into MM_SYSCALLS of the mm syscall it is in, or 0.
    pub syscall: u8,
}

impl Entry {
    const UNKNOWN: Entry = Entry {
        fault: false,
        syscall: 0,
    };
}

/// From the registers the thread saved when it entered the kernel (`orig_ax`: -1 for an
/// exception, else the syscall number), read once: no per-syscall program has to track the
/// syscall in progress, so no syscall tracepoint is attached for it (any one of them sends
/// every syscall on the machine through the kernel's slow path). Where the registers cannot
/// be found, the mm syscall the syscall programs saw enter (`--syscall-times`), if any.
#[inline(always)]
fn kernel_entry<C: LockContext>(ctx: &C, locker: &Locker) -> Entry {
    if locker.outside_pid != 0 {
        return Entry::UNKNOWN;
    }
    match ctx.entry_nr() {
        Some(nr) => Entry {
            fault: faults::is_exception(nr),
            syscall: syscalls::cause_of(nr),
        },
        None => Entry {
            fault: false,
            syscall: syscalls::current(locker),
        },
    }
}

#[inline(always)]
fn on_lock_event<C: LockContext>(ctx: &C, args: LockArgs) -> Result<(), i64> {
    let cfg = config();
    let mm = args.mm;
    let Some(locker) = classify(mm) else {
        return Ok(());
    };
    if !armed() {
        return Ok(());
    }
    if lean::takes(&locker) {
        lean::on_lock_event(&locker, &args);
        return Ok(());
    }
    let event = decode(&args);
    let key = StateKey {
        tid: locker.tid,
        _pad: 0,
        mm,
    };
    let Some((state, first_seen)) = state_of(&key) else {
        count(Counter::StateMapFull);
        return Ok(());
    };
    let st = unsafe { &mut *state };
    let is_start = matches!(event, LockEvent::StartLocking { .. });

    let attribute = cfg.attribution != 0;
    let entry = if attribute && is_start {
        kernel_entry(ctx, &locker)
    } else {
        Entry::UNKNOWN
    };
    let (held_since, held_mode) = (st.timing.hold_start_ns, st.timing.hold_mode);
    let waiting_for_write = st.timing.wait_start_ns != 0 && st.timing.wait_mode == MODE_WRITE;
    let now = unsafe { bpf_ktime_get_ns() };
    let mut effects = st.step(event, now);
    if first_seen {
        effects = effects.seen_first(event);
    }

    if is_start && st.timing.wait_start_ns == now {
        // A new wait (not the fault path's lock after its failed trylock).
        if attribute && begin_attributed_wait(ctx, &locker, mm, st, now, entry) {
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
        syscall = syscalls::charge(st, &effects);
    }
    let reason = Reason {
        syscall,
        fault: st.fault,
    };
    apply(ctx, &locker, &effects, reason, st, ended);
    if st.is_idle() {
        // Reset in place rather than deleting: the thread's next lock operation finds its
        // entry with a lookup instead of an LRU insert (which allocates), and a delete per
        // operation cost as much again. Entries of exited threads are the least recently used
        // and go first when the map fills; a live one is touched at every event of its lock
        // operation, which lasts far less than the thousands of inserts it takes to age out.
        st.reset_keeping_history();
    }
    Ok(())
}

/// A new wait with attribution on: whether it serves a fault, which holders it waits behind,
/// and, when it is expected to be long, its stacks (and user stack copy) taken now. Returns
/// whether it walked them.
#[inline(always)]
fn begin_attributed_wait<C: LockContext>(
    ctx: &C,
    locker: &Locker,
    mm: u64,
    st: &mut LockState,
    now: u64,
    entry: Entry,
) -> bool {
    st.fault = entry.fault as u8;
    if entry.fault {
        faults::count_fault_lock();
    }
    st.blockers = blockers::begin_wait(locker, mm, st.timing.wait_mode == MODE_WRITE);
    // Walk the stacks now, when this operation is expected to be long, rather than at acquire
    // or release, which run inside the critical section where every waiter pays for the walk.
    // A wait is expected long when it queued behind a hold that has already lasted the stack
    // threshold, or behind anyone when this thread's last wait for the same cause crossed it;
    // a hold, when its predecessor for the same cause did. Merely queueing predicts nothing:
    // on a busy lock most waits behind a holder last microseconds. A sample of the other
    // operations gets its stacks too (`user_copy_sampled` keeps them whatever their length),
    // so that the common short paths are named.
    let cause = entry.syscall;
    st.cause = cause;
    let queued = st.blockers.count != 0;
    let expected_long = (queued
        && (st.blockers.longest_held(now) >= config().stack_threshold_ns
            || st.expects_long_wait(cause)))
        || st.expects_long_hold(cause)
        || user_stacks::sample_at_start(locker, st);
    if st.start_kernel_stack != NO_STACK || !expected_long {
        return false;
    }
    (st.start_kernel_stack, st.start_user_stack) = walk_stacks(ctx);
    user_stacks::copy_at_start(ctx, locker, st, now);
    true
}

/// The state machine's view of one hit.
#[inline(always)]
pub fn decode(args: &LockArgs) -> LockEvent {
    let mode = if args.write { MODE_WRITE } else { MODE_READ };
    match args.hook {
        Hook::StartLocking => LockEvent::StartLocking { mode },
        Hook::Released => LockEvent::Released { mode },
        Hook::AcquireReturned => LockEvent::AcquireReturned {
            mode,
            success: args.success,
            fatal_signal: !args.success && fatal_signal_pending(),
        },
    }
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

/// sched_switch finds the state of a holder that is not a listed target's own thread through
/// its tid alone (a listed target's thread, through its own mm: no entry here, so no lookup
/// inside the critical section). The entry stays and is overwritten in place (mm while
/// holding, 0 after), so a hold costs a lookup, not an insert and a delete.
#[inline(always)]
fn track_holding_thread(tid: u32, mm: u64, was_holding: bool, holding: bool) {
    if holding == was_holding {
        return;
    }
    let value = if holding { mm } else { 0 };
    match TID_HOLDING.get_ptr_mut(&tid) {
        Some(slot) => unsafe { *slot = value },
        None if holding => {
            if TID_HOLDING.insert(&tid, &mm, 0).is_err() {
                count(Counter::ThreadMapFull);
            }
        }
        None => {}
    }
}

#[inline(always)]
fn apply<C: LockContext>(
    ctx: &C,
    locker: &Locker,
    fx: &Effects,
    reason: Reason,
    st: &mut LockState,
    ended: EndedHold,
) {
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
        st.note_wait_length(reason.syscall, ns >= config().stack_threshold_ns);
        let waiter = agg_key(ctx, locker, KIND_WAIT, mode, ns, reason, false, st);
        timeline::emit(locker, &waiter, ns);
        let last_use = fx.hold.is_none() && st.timing.hold_start_ns == 0;
        let share = EventShare::waited(fx.wait_contended_ns);
        user_stacks::send_event(ctx, locker, st, &waiter, ns, share, last_use);
        pending::defer_wait(st, waiter, ns, fx.wait_contended_ns);
    }
    if let Some((mode, ns)) = fx.hold {
        add_totals(outside, mode, |t| t.add_hold(ns));
        st.note_hold_length(reason.syscall, ns >= config().stack_threshold_ns);
        let off = fx.hold_offcpu;
        // A hold that blocked someone gets its stacks whatever its length: its waiters need them.
        let hold = agg_key(ctx, locker, KIND_HOLD, mode, ns, reason, ended.blocked, st);
        timeline::emit(locker, &hold, ns);
        // A downgrade ends the write hold and begins a read hold: the copy serves that too.
        let last_use = st.timing.hold_start_ns == 0;
        user_stacks::send_event(ctx, locker, st, &hold, ns, EventShare::held(&off), last_use);
        if off.sleeping_ns > 0 {
            add_sleep(&hold, off.longest_sleep_stack, off.sleeping_ns);
        }
        if ended.blocked {
            // Kept now, not later with the aggregation: its waiters, charged when they leave
            // the lock, must find it.
            blockers::remember_holder(locker.tid, &hold, ended.hold_start_ns);
        }
        pending::defer_hold(st, hold, ns, &off);
    }
}

#[inline(always)]
pub fn add_totals(outside: bool, mode: u8, f: impl FnOnce(&mut ModeTotals)) {
    if let Some(totals) = TOTALS.get_ptr_mut(totals_index(outside, mode)) {
        f(unsafe { &mut *totals });
    }
}

#[inline(always)]
fn add_sleep(hold: &AggKey, stack: i32, ns: u64) {
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
/// walked at start_locking, outside the critical section, when the operation was expected to be
/// long or was sampled (the caller that locks is the one that unlocks: the same code path). One
/// that was not gets its stacks walked here, inside the critical section where all waiters pay
/// for the microseconds it takes, only past the late threshold (1 ms unless every stack is
/// asked for); shorter ones are grouped without a stack.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn agg_key<C: LockContext>(
    ctx: &C,
    locker: &Locker,
    kind: u8,
    mode: u8,
    ns: u64,
    reason: Reason,
    force: bool,
    st: &LockState,
) -> AggKey {
    let cfg = config();
    let force = force || st.user_copy_sampled != 0;
    let (kernel_stack, user_stack) = if !(force || ns >= cfg.stack_threshold_ns) {
        (NO_STACK, NO_STACK)
    } else if st.start_kernel_stack != NO_STACK {
        (st.start_kernel_stack, st.start_user_stack)
    } else if ns >= cfg.late_stack_threshold_ns {
        walk_stacks(ctx)
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
    if let Some(value) = AGG.get_ptr_mut(key) {
        return Some(value);
    }
    let value = slot_of(&AGG, key, &AggValue::ZERO, FULL_AGG, Counter::AggMapFull)?;
    count_key(KEYS_AGG);
    Some(value)
}

/// The current kernel stack, and the user stack unless --no-user-stacks.
#[inline(always)]
fn walk_stacks<C: LockContext>(ctx: &C) -> (i32, i32) {
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
