//! The user stack family: for waits and holds that matter, a copy of the user registers and of
//! a window of the user stack, sent through a ring buffer so that user space can unwind it with
//! the objects' CFI (distribution binaries keep no frame pointers, so bpf_get_stackid stops
//! after about one frame).

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user_buf},
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use tracer_common::{
    AggKey, Config, CopyBudget, Counter, LockState, OffCpu, UserStackCopy, UserStackCopyHeader,
    UserStackEvent, NO_STACK, USER_STACK_BUDGET_WINDOW_NS, USER_STACK_MAX_PAGES, USER_STACK_PAGE,
    USER_STACK_RECORD_COPY, USER_STACK_RECORD_EVENT, USER_STACK_SMALL_PAGES,
};

use crate::{
    context::{BtfRegs, ClassicRegs, Regs},
    filter::Locker,
    maps::{config, count},
};

/// Sized by user space at load time (one page when no copies are asked for).
#[map]
pub static USER_STACKS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Slot 0: per-CPU count of candidate events seen, for 1-in-N sampling, and when this CPU last
/// picked one.
#[map]
static SAMPLE_TICK: PerCpuArray<SampleTick> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct SampleTick {
    seen: u32,
    _pad: u32,
    last_ns: u64,
}

/// The shortest time between two samples on one CPU: at most 100 a second each, whatever the
/// rate of lock operations (a sample walks two stacks and copies the user stack: about 10 us).
const SAMPLE_GAP_NS: u64 = 10_000_000;

/// Slot 0: per-CPU copies made in the current budget window.
#[map]
static COPY_BUDGET: PerCpuArray<CopyBudget> = PerCpuArray::with_max_entries(1, 0);

/// Highest user-space address on x86_64 (47-bit address space): saved registers beyond it mean
/// the offsets are wrong for this kernel, and nothing is sent.
const USER_TOP: u64 = 1 << 47;
/// User space polls the ring on its own clock: waking it from inside a lock operation would
/// only add an irq_work to every record.
const SUBMIT_FLAGS: u64 = BPF_RB_NO_WAKEUP as u64;

/// The AggValue fields one event added besides its duration, so that user space can move the
/// event out of its entry exactly.
pub struct EventShare {
    pub contended_ns: u64,
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
}

impl EventShare {
    #[inline(always)]
    pub fn waited(contended_ns: u64) -> Self {
        Self {
            contended_ns,
            runnable_ns: 0,
            sleeping_ns: 0,
            uninterruptible_ns: 0,
        }
    }

    #[inline(always)]
    pub fn held(off: &OffCpu) -> Self {
        Self {
            contended_ns: 0,
            runnable_ns: off.runnable_ns,
            sleeping_ns: off.sleeping_ns,
            uninterruptible_ns: off.uninterruptible_ns,
        }
    }
}

/// At start_locking of a new operation: whether the sampler picks it for stacks and a copy
/// whatever its length (one in `user_stack_sample`, at most 100 a second, per CPU), so that
/// the common short paths are unwound too.
#[inline(always)]
pub fn sample_at_start(locker: &Locker, now: u64) -> bool {
    let cfg = config();
    cfg.user_stack_copies.bytes != 0 && locker.outside_pid == 0 && sampled(cfg, now)
}

/// Where an operation's stacks are walked outside the lock (its wait goes to sleep, or the
/// sampler picked it at start_locking): copies the user stack now, before the lock is taken. The user stack does not change while the thread is in the kernel, so the wait and
/// the hold that follow use this copy, and no waiter pays for it inside the critical section.
#[inline(always)]
pub fn copy_at_start<R: CopyUserStack>(locker: &Locker, st: &mut LockState, now: u64) {
    let cfg = config();
    if cfg.user_stack_copies.bytes == 0 || locker.outside_pid != 0 || !within_budget(cfg, now) {
        return;
    }
    if R::copy_user_stack(locker, now) {
        st.user_copy_id = now;
    } else {
        count(Counter::UserStackCopyDropped);
    }
}

/// Takes one copy from this CPU's budget for the current window; false when it is spent (the
/// operation then keeps its frame-pointer stack: a sample, not a loss).
#[inline(always)]
fn within_budget(cfg: &Config, now: u64) -> bool {
    let Some(budget) = COPY_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let budget = unsafe { &mut *budget };
    if now.wrapping_sub(budget.window_start_ns) >= USER_STACK_BUDGET_WINDOW_NS {
        budget.window_start_ns = now;
        budget.used = 0;
    }
    if budget.used >= cfg.user_stack_budget {
        return false;
    }
    budget.used += 1;
    true
}

/// At the end of a wait or hold just aggregated under `key`: tells user space to unwind it with
/// the operation's copy. A wait or hold past the copy threshold whose operation has no copy
/// (it was not sampled and its wait never slept) is copied now, inside the critical section:
/// the one case that costs waiters, rare past a millisecond. Outside lockers are skipped:
/// their stacks are in another process.
#[inline(always)]
pub fn send_event<R: CopyUserStack>(
    locker: &Locker,
    st: &mut LockState,
    key: &AggKey,
    ns: u64,
    share: EventShare,
    last_use: bool,
) {
    let cfg = config();
    if cfg.user_stack_copies.bytes == 0 || locker.outside_pid != 0 || key.kernel_stack == NO_STACK {
        return;
    }
    let long = ns >= cfg.user_stack_copies.threshold_ns;
    let mut late_copy = false;
    if st.user_copy_id == 0 {
        if !long {
            return;
        }
        let now = unsafe { bpf_ktime_get_ns() };
        if !within_budget(cfg, now) {
            return;
        }
        if !R::copy_user_stack(locker, now) {
            count(Counter::UserStackCopyDropped);
            return;
        }
        st.user_copy_id = now;
        late_copy = true;
    }
    // Written in place in the ring: built on the stack, it added its size to the frame of the
    // lock programs' deepest chain of calls, which 6.1's verifier holds to 512 bytes.
    let Some(mut entry) = USER_STACKS.reserve::<UserStackEvent>(0) else {
        count(Counter::UserStackCopyDropped);
        return;
    };
    unsafe {
        entry.as_mut_ptr().write(UserStackEvent {
            record: USER_STACK_RECORD_EVENT,
            tid: locker.tid,
            copy_id: st.user_copy_id,
            key: *key,
            duration_ns: ns,
            contended_ns: share.contended_ns,
            runnable_ns: share.runnable_ns,
            sleeping_ns: share.sleeping_ns,
            uninterruptible_ns: share.uninterruptible_ns,
            last_use: last_use as u8,
            late_copy: late_copy as u8,
            _pad: [0; 6],
        })
    };
    entry.submit(SUBMIT_FLAGS);
}

/// One in `user_stack_sample` calls, per CPU, and no more often than every SAMPLE_GAP_NS.
#[inline(always)]
fn sampled(cfg: &Config, now: u64) -> bool {
    let Some(tick) = SAMPLE_TICK.get_ptr_mut(0) else {
        return false;
    };
    let tick = unsafe { &mut *tick };
    tick.seen += 1;
    if cfg.user_stack_copies.sample == 0
        || tick.seen < cfg.user_stack_copies.sample
        || now.wrapping_sub(tick.last_ns) < SAMPLE_GAP_NS
    {
        return false;
    }
    tick.seen = 0;
    tick.last_ns = now;
    true
}

/// The copy as a global function per kind of tracepoint, verified once: its page loop, inlined
/// at each of its two call sites, was explored once per path of the lock programs.
pub trait CopyUserStack {
    /// Sends the copy of (`locker`'s thread, `now`); false when it could not.
    fn copy_user_stack(locker: &Locker, now: u64) -> bool;
}

impl CopyUserStack for BtfRegs {
    #[inline(always)]
    fn copy_user_stack(locker: &Locker, now: u64) -> bool {
        user_stack_copy_btf(locker.tid as u64, locker.pid as u64, now) != 0
    }
}

impl CopyUserStack for ClassicRegs {
    #[inline(always)]
    fn copy_user_stack(locker: &Locker, now: u64) -> bool {
        user_stack_copy_classic(locker.tid as u64, locker.pid as u64, now) != 0
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn user_stack_copy_btf(tid: u64, pid: u64, now: u64) -> i32 {
    send_copy::<BtfRegs>(config(), tid as u32, pid as u32, now).is_some() as i32
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn user_stack_copy_classic(tid: u64, pid: u64, now: u64) -> i32 {
    send_copy::<ClassicRegs>(config(), tid as u32, pid as u32, now).is_some() as i32
}

/// Sends the current thread's user registers and stack window, in the smaller record when the
/// window fits it.
#[inline(always)]
fn send_copy<R: Regs>(cfg: &Config, tid: u32, pid: u32, now: u64) -> Option<()> {
    let (ip, sp, bp) = user_registers::<R>(cfg)?;
    let stack_start = sp & !(USER_STACK_PAGE as u64 - 1);
    let header = UserStackCopyHeader {
        record: USER_STACK_RECORD_COPY,
        tid,
        copy_id: now,
        pid,
        stack_len: 0,
        ip,
        sp,
        bp,
        stack_start,
    };
    let wanted = sp - stack_start + cfg.user_stack_copies.bytes as u64;
    if wanted <= (USER_STACK_SMALL_PAGES * USER_STACK_PAGE) as u64 {
        send_pages::<USER_STACK_SMALL_PAGES>(header, wanted)
    } else {
        send_pages::<USER_STACK_MAX_PAGES>(header, wanted)
    }
}

#[inline(always)]
fn send_pages<const PAGES: usize>(mut header: UserStackCopyHeader, wanted: u64) -> Option<()> {
    let mut entry = USER_STACKS.reserve::<UserStackCopy<PAGES>>(0)?;
    let record = entry.as_mut_ptr();
    header.stack_len = unsafe { copy_pages(&mut (*record).pages, header.stack_start, wanted) };
    unsafe { (*record).header = header };
    entry.submit(SUBMIT_FLAGS);
    Some(())
}

/// The user ip, sp and bp saved when the current task entered the kernel.
#[inline(always)]
fn user_registers<R: Regs>(cfg: &Config) -> Option<(u64, u64, u64)> {
    let regs = R::user_regs()? as *const u8;
    let read = |offset: u32| unsafe {
        bpf_probe_read_kernel(regs.wrapping_add(offset as usize) as *const u64)
    };
    let (ip, sp, bp) = (
        read(cfg.user_regs.pt_regs_ip).ok()?,
        read(cfg.user_regs.pt_regs_sp).ok()?,
        read(cfg.user_regs.pt_regs_bp).ok()?,
    );
    (ip != 0 && ip < USER_TOP && sp != 0 && sp < USER_TOP).then_some((ip, sp, bp))
}

/// Copies whole pages of user memory from `start` until `wanted` bytes or the first page that
/// cannot be read (the top of the stack mapping). Returns the bytes copied.
#[inline(always)]
fn copy_pages<const PAGES: usize>(
    dst: &mut [[u8; USER_STACK_PAGE]; PAGES],
    start: u64,
    wanted: u64,
) -> u32 {
    let mut copied = 0usize;
    for (page, chunk) in dst.iter_mut().enumerate() {
        if copied as u64 >= wanted {
            break;
        }
        let src = (start + (page * USER_STACK_PAGE) as u64) as *const u8;
        if unsafe { bpf_probe_read_user_buf(src, chunk) }.is_err() {
            break;
        }
        copied = (page + 1) * USER_STACK_PAGE;
    }
    copied as u32
}
