//! eBPF programs of mmapsem-trace. One probe family per module; maps and the load-time
//! configuration in `maps`; target filtering in `target`.
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

mod blockers;
mod contention;
mod context;
mod faults;
mod floor;
mod lean;
mod maps;
mod mmap_lock;
mod pending;
mod sched;
mod syscalls;
mod target;
mod timeline;
mod user_stacks;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible, so the programs may call GPL-only helpers such as bpf_get_stackid.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
