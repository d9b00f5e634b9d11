//! Empty programs on the three mmap_lock events, for `cargo xtask bench` (`mmapsem-trace
//! --bench-floor`): what merely running a program there costs, as classic tracepoints and as
//! BTF tracepoints. The tracer's own programs are measured against these floors.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

classic_tracepoint! {
    fn floor_classic_start_locking(ctx) {}
}

classic_tracepoint! {
    fn floor_classic_acquire_returned(ctx) {}
}

classic_tracepoint! {
    fn floor_classic_released(ctx) {}
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
