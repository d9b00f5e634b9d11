//! The mmap_lock tracepoint family's programs: start_locking, acquire_returned, released, as
//! BTF tracepoints or, where the kernel lacks their BTF, classic ones (user space attaches one
//! set). Each reads the hit's arguments and hands them to the lock operation's state machine
//! (`operation`).

use aya_ebpf::{
    macros::btf_tracepoint,
    programs::{BtfTracePointContext, TracePointContext},
};

use crate::{
    context::{BtfRegs, ClassicRegs},
    event::{LockCall, HOOK_ACQUIRE, HOOK_RELEASE, HOOK_START},
    maps::config,
    operation::run,
};

// Classic tracepoints: the fallback where the kernel has no BTF for the events. The kernel
// formats a perf record for every hit before the program runs, about 15% of a lock-bound
// target's throughput on its own.

classic_tracepoint! {
    fn mmap_lock_start_locking(ctx) {
        classic::<HOOK_START>(&ctx);
    }
}

classic_tracepoint! {
    fn mmap_lock_acquire_returned(ctx) {
        classic::<HOOK_ACQUIRE>(&ctx);
    }
}

classic_tracepoint! {
    fn mmap_lock_released(ctx) {
        classic::<HOOK_RELEASE>(&ctx);
    }
}

// BTF tracepoints (tp_btf): the arguments straight from the trace call, no record. Two sets,
// for the two prototypes: (mm, write[, success]) since 6.13, (mm, memcg_path, write[,
// success]) before; user space loads the one the kernel's BTF names. Argument indices must be
// constants: the verifier refuses a context access at a computed offset.

#[btf_tracepoint(function = "mmap_lock_start_locking")]
pub fn btf_start_locking(ctx: BtfTracePointContext) -> i32 {
    btf::<1, HOOK_START>(&ctx)
}

#[btf_tracepoint(function = "mmap_lock_acquire_returned")]
pub fn btf_acquire_returned(ctx: BtfTracePointContext) -> i32 {
    btf::<1, HOOK_ACQUIRE>(&ctx)
}

#[btf_tracepoint(function = "mmap_lock_released")]
pub fn btf_released(ctx: BtfTracePointContext) -> i32 {
    btf::<1, HOOK_RELEASE>(&ctx)
}

#[btf_tracepoint(function = "mmap_lock_start_locking")]
pub fn btf_memcg_start_locking(ctx: BtfTracePointContext) -> i32 {
    btf::<2, HOOK_START>(&ctx)
}

#[btf_tracepoint(function = "mmap_lock_acquire_returned")]
pub fn btf_memcg_acquire_returned(ctx: BtfTracePointContext) -> i32 {
    btf::<2, HOOK_ACQUIRE>(&ctx)
}

#[btf_tracepoint(function = "mmap_lock_released")]
pub fn btf_memcg_released(ctx: BtfTracePointContext) -> i32 {
    btf::<2, HOOK_RELEASE>(&ctx)
}

/// `WRITE`: the index of the write argument (success follows it).
#[inline(always)]
fn btf<const WRITE: usize, const HOOK: u32>(ctx: &BtfTracePointContext) -> i32 {
    let write: u64 = ctx.arg(WRITE);
    let success = HOOK == HOOK_ACQUIRE && ctx.arg::<u64>(WRITE + 1) as u8 != 0;
    let mut call = LockCall::new(ctx.arg(0), write as u8 != 0, success);
    run::<BtfRegs, _, HOOK>(ctx, &mut call);
    0
}

#[inline(always)]
fn classic<const HOOK: u32>(ctx: &TracePointContext) {
    if let Ok(mut call) = classic_call(ctx, HOOK) {
        run::<ClassicRegs, _, HOOK>(ctx, &mut call);
    }
}

/// The fields of the perf record, where tracefs said they are.
#[inline(always)]
fn classic_call(ctx: &TracePointContext, hook: u32) -> Result<LockCall, i64> {
    let cfg = config();
    let f = match hook {
        HOOK_START => &cfg.mmap_lock.start_locking,
        HOOK_ACQUIRE => &cfg.mmap_lock.acquire_returned,
        _ => &cfg.mmap_lock.released,
    };
    let mm: u64 = unsafe { ctx.read_at(f.mm as usize) }?;
    let write: u8 = unsafe { ctx.read_at(f.write as usize) }?;
    let success: u8 = if hook == HOOK_ACQUIRE {
        unsafe { ctx.read_at(f.success as usize) }?
    } else {
        0
    };
    Ok(LockCall::new(mm, write != 0, success != 0))
}
