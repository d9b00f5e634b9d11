//! What the lock family's global functions need from the kind of tracepoint (classic or BTF)
//! that carries the event: the current task's saved user registers, and which global function
//! serves that kind. Stack walks need the program's context (`bpf_get_stackid`), which a
//! global function cannot take: the programs walk them and hand the ids in.

use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs,
};

use crate::maps::config;

pub trait Regs {
    /// Kernel address of the `struct pt_regs` the current task saved when it entered the
    /// kernel (its user registers), or None when it cannot be found.
    fn user_regs() -> Option<u64>;

    /// The saved `orig_ax` of the current task's user registers: the syscall number in a
    /// syscall, -1 in an exception; None when the register offsets are unknown.
    #[inline(always)]
    fn entry_nr() -> Option<i64> {
        let cfg = config();
        if cfg.user_regs.known == 0 {
            return None;
        }
        let orig_ax = (Self::user_regs()? + cfg.user_regs.pt_regs_orig_ax as u64) as *const i64;
        unsafe { bpf_probe_read_kernel(orig_ax) }.ok()
    }
}

/// BTF tracepoints are tracing programs: `bpf_task_pt_regs` gives the registers wherever the
/// kernel keeps them (FRED and KASAN kernels move them).
pub struct BtfRegs;

impl Regs for BtfRegs {
    #[inline(always)]
    fn user_regs() -> Option<u64> {
        let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
        (regs != 0).then_some(regs)
    }
}

/// Classic tracepoints cannot call `bpf_task_pt_regs`: the registers sit at the top of the
/// task's kernel stack (x86_64 without FRED or KASAN; a wrong guess shows as registers outside
/// user space, which the callers refuse).
pub struct ClassicRegs;

impl Regs for ClassicRegs {
    #[inline(always)]
    fn user_regs() -> Option<u64> {
        let cfg = config();
        let task = unsafe { bpf_get_current_task() } as *const u8;
        let stack_field = task.wrapping_add(cfg.user_regs.task_stack_offset as usize) as *const u64;
        let stack = unsafe { bpf_probe_read_kernel(stack_field) }.ok()?;
        Some(stack + cfg.user_regs.thread_size as u64 - cfg.user_regs.pt_regs_size as u64)
    }
}
