//! eBPF programs of mmapsem-trace. One probe family per module; maps and the load-time
//! configuration in `maps`; target filtering in `target`.
#![no_std]
#![no_main]
// The atomic add intrinsic (maps::atomic_add): core's atomic types are disabled for BPF.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod blockers;
mod contention;
mod context;
mod faults;
mod lean;
mod maps;
mod mmap_lock;
mod sched;
mod syscalls;
mod target;
mod timeline;
mod user_stacks;

/// What a classic tracepoint program returns: non-zero keeps the event for the tracepoint's
/// other consumers (0 makes the kernel drop it for perf and every other tool on the event).
pub const KEEP_EVENT: u32 = 1;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible, so the programs may call GPL-only helpers such as bpf_get_stackid.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
