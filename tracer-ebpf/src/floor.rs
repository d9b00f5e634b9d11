//! Empty programs on the three mmap_lock events, for `cargo xtask bench` (`mmapsem-trace
//! --bench-floor`): what merely running a program there costs, as classic tracepoints and as
//! BTF tracepoints. The tracer's own programs are measured against these floors.

use core::ffi::c_void;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

/// What a classic tracepoint program returns to let the event go on to perf and every other
/// consumer (0 drops it for all of them). Written without `#[tracepoint]`: aya-ebpf 0.2's
/// macro returns 0 whatever the function returns.
const KEEP_EVENT: u32 = 1;

#[unsafe(no_mangle)]
#[unsafe(link_section = "tracepoint")]
pub fn floor_classic_start_locking(_ctx: *mut c_void) -> u32 {
    KEEP_EVENT
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "tracepoint")]
pub fn floor_classic_acquire_returned(_ctx: *mut c_void) -> u32 {
    KEEP_EVENT
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "tracepoint")]
pub fn floor_classic_released(_ctx: *mut c_void) -> u32 {
    KEEP_EVENT
}

#[btf_tracepoint(function = "mmap_lock_start_locking")]
pub fn floor_btf_start_locking(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "mmap_lock_acquire_returned")]
pub fn floor_btf_acquire_returned(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "mmap_lock_released")]
pub fn floor_btf_released(_ctx: BtfTracePointContext) -> i32 {
    0
}
