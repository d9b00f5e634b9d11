//! eBPF programs of mmapsem-trace. One probe family per program file; maps and the load-time
//! configuration in `maps`; target filtering in `filter`.
#![no_std]
#![no_main]
// The atomic add intrinsic (maps::atomic_add): core's atomic types are disabled for BPF.
#![allow(internal_features)]
#![feature(core_intrinsics)]

/// What a classic tracepoint program returns: non-zero keeps the event for the tracepoint's
/// other consumers (0 makes the kernel drop it for perf and every other tool on the event).
pub const KEEP_EVENT: u32 = 1;

/// A classic tracepoint program (attached by name from user space) whose `body` runs with the
/// context bound to `ctx`, and which returns KEEP_EVENT. aya-ebpf 0.2's `#[tracepoint]` returns
/// 0 whatever the function returns, which blinds perf and bpftrace on the same events.
macro_rules! classic_tracepoint {
    ($(#[$doc:meta])* fn $name:ident($ctx:ident) $body:block) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        #[unsafe(link_section = "tracepoint")]
        pub fn $name($ctx: *mut core::ffi::c_void) -> u32 {
            #[allow(unused_variables)]
            let $ctx = aya_ebpf::programs::TracePointContext::new($ctx);
            $body
            crate::KEEP_EVENT
        }
    };
}

// In tiers (docs/ARCHITECTURE.md; tracer/src/layering.rs checks them): a file uses files of
// its own tier or below, and a program file no other program file.
// Leaves: the maps, the registers, the target filter, a hit decoded, where operations are
// recorded, their causes.
mod causes;
mod context;
mod event;
mod filter;
mod maps;
mod records;
// The middle: what the programs share beyond the leaves.
mod blockers;
mod holding;
mod lean;
mod operation;
mod pending;
mod timeline;
mod user_stacks;
// Programs, one file per attachment family.
mod contention;
mod faults;
mod floor;
mod lifecycle;
mod mmap_lock;
mod sched;
mod syscalls;
mod wakers;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible, so the programs may call GPL-only helpers such as bpf_get_stackid.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
