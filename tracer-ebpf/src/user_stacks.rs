//! The user stack family: for waits and holds that matter, a copy of the user registers and of
//! a window of the user stack, sent through a ring buffer so that user space can unwind it with
//! the objects' CFI (distribution binaries keep no frame pointers, so bpf_get_stackid stops
//! after about one frame).

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user_buf},
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use tracer_common::{
    AggKey, Config, Counter, OffCpu, UserStackEvent, UserStackRecord, NO_STACK, USER_STACK_MAX,
    USER_STACK_PAGE,
};

use crate::{
    maps::{config, count},
    target::Locker,
};

/// Sized by user space at load time (one page when no copies are asked for).
#[map]
pub static USER_STACKS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Slot 0: per-CPU count of short events seen, for 1-in-N sampling.
#[map]
static SAMPLE_TICK: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

const MAX_PAGES: usize = USER_STACK_MAX / USER_STACK_PAGE;
/// Highest user-space address on x86_64 (47-bit address space): saved registers beyond it mean
/// the offsets are wrong for this kernel, and nothing is sent.
const USER_TOP: u64 = 1 << 47;

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

/// Copies the user stack of the event just aggregated under `key` when it is long enough, or
/// when the sampler picks it. Outside lockers are skipped: their stacks are in another process.
#[inline(always)]
pub fn capture(locker: &Locker, key: &AggKey, ns: u64, share: EventShare) {
    let cfg = config();
    if cfg.user_stack_bytes == 0 || locker.outside_pid != 0 {
        return;
    }
    if ns < cfg.user_stack_threshold_ns && !(key.kernel_stack != NO_STACK && sampled(&cfg)) {
        return;
    }
    if send(&cfg, locker, key, ns, &share).is_none() {
        count(Counter::UserStackCopyDropped);
    }
}

/// One in `user_stack_sample` calls, per CPU.
#[inline(always)]
fn sampled(cfg: &Config) -> bool {
    let Some(tick) = SAMPLE_TICK.get_ptr_mut(0) else {
        return false;
    };
    let tick = unsafe { &mut *tick };
    *tick += 1;
    if cfg.user_stack_sample == 0 || *tick < cfg.user_stack_sample {
        return false;
    }
    *tick = 0;
    true
}

#[inline(always)]
fn send(cfg: &Config, locker: &Locker, key: &AggKey, ns: u64, share: &EventShare) -> Option<()> {
    let (ip, sp, bp) = user_registers(cfg)?;
    let mut entry = USER_STACKS.reserve::<UserStackRecord>(0)?;
    let record = entry.as_mut_ptr();
    let stack_start = sp & !(USER_STACK_PAGE as u64 - 1);
    let wanted = sp - stack_start + cfg.user_stack_bytes as u64;
    let copied = unsafe { copy_pages(&mut (*record).bytes, stack_start, wanted) };
    unsafe {
        (*record).event = UserStackEvent {
            key: *key,
            tid: locker.tid,
            stack_len: copied,
            duration_ns: ns,
            contended_ns: share.contended_ns,
            runnable_ns: share.runnable_ns,
            sleeping_ns: share.sleeping_ns,
            uninterruptible_ns: share.uninterruptible_ns,
            ip,
            sp,
            bp,
            stack_start,
        };
    }
    entry.submit(0);
    Some(())
}

/// The user ip, sp and bp saved at the top of the current task's kernel stack when it entered
/// the kernel (classic tracepoints cannot call bpf_task_pt_regs).
#[inline(always)]
fn user_registers(cfg: &Config) -> Option<(u64, u64, u64)> {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let stack_field = task.wrapping_add(cfg.task_stack_offset as usize) as *const u64;
    let stack = unsafe { bpf_probe_read_kernel(stack_field) }.ok()?;
    let regs = (stack + cfg.thread_size as u64 - cfg.pt_regs_size as u64) as *const u8;
    let read = |offset: u32| unsafe {
        bpf_probe_read_kernel(regs.wrapping_add(offset as usize) as *const u64)
    };
    let (ip, sp, bp) = (
        read(cfg.pt_regs_ip).ok()?,
        read(cfg.pt_regs_sp).ok()?,
        read(cfg.pt_regs_bp).ok()?,
    );
    (ip != 0 && ip < USER_TOP && sp != 0 && sp < USER_TOP).then_some((ip, sp, bp))
}

/// Copies whole pages of user memory from `start` until `wanted` bytes or the first page that
/// cannot be read (the top of the stack mapping). Returns the bytes copied.
#[inline(always)]
fn copy_pages(dst: &mut [u8; USER_STACK_MAX], start: u64, wanted: u64) -> u32 {
    let mut copied = 0usize;
    for page in 0..MAX_PAGES {
        if copied as u64 >= wanted {
            break;
        }
        let offset = page * USER_STACK_PAGE;
        let src = (start + offset as u64) as *const u8;
        let chunk = &mut dst[offset..offset + USER_STACK_PAGE];
        if unsafe { bpf_probe_read_user_buf(src, chunk) }.is_err() {
            break;
        }
        copied = offset + USER_STACK_PAGE;
    }
    copied as u32
}
