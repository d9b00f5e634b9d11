//! The scheduler family: the target lifecycle (sched_process_exit/fork) and holders' off-CPU
//! time (sched_switch).

use crate::AggKey;

/// THREAD_EXITS slots: summed lifetimes inside the trace (ns) of the target threads that exited
/// while it ran, their number, and the number of traced processes whose last thread exited
/// (what tells a system-wide trace that it has processes to let go of).
pub const EXITED_LIFETIME_NS: u32 = 0;
pub const EXITED_THREADS: u32 = 1;
pub const EXITED_PROCESSES: u32 = 2;
pub const THREAD_EXITS_SLOTS: u32 = 3;

/// A hold (its aggregation key) and a kernel stack its thread slept in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SleepKey {
    pub hold: AggKey,
    pub stack: i32,
    pub _pad: u32,
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for SleepKey {}
