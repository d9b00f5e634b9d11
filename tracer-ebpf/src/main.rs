//! eBPF programs of mmapsem-trace. One probe family per module; maps and the load-time
//! configuration in `maps`; target filtering in `target`.
#![no_std]
#![no_main]

mod blockers;
mod contention;
mod faults;
mod floor;
mod maps;
mod mmap_lock;
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
