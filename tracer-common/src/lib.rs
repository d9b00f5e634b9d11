//! Types shared across the kernel line, and the per-(thread, mm) lock state machine.
//!
//! Everything here is `no_std` and `#[repr(C)]`: the eBPF programs and user space read the same
//! bytes. The state machine lives here (not in the eBPF crate) so that the exact code the kernel
//! runs is unit-tested on the host.
//!
//! One module per probe family (its config, keys and values, Pod beside each type), as in
//! tracer-ebpf and tracer's probes; the crate root keeps what every family's records carry:
//! modes and kinds, the aggregation key and value, the per-mode totals and the loss counters.
#![no_std]

pub mod config;
pub mod contention;
pub mod faults;
pub mod holders;
pub mod lock_state;
pub mod mmap_lock;
pub mod sched;
pub mod syscalls;
pub mod targets;
pub mod timeline;
pub mod user_stacks;
pub mod wakers;

// Re-exported whole: the programs and the tracer name these types from the crate root.
pub use config::*;
pub use contention::*;
pub use faults::*;
pub use mmap_lock::*;
pub use sched::*;
pub use syscalls::*;
pub use targets::*;
pub use timeline::*;
pub use user_stacks::*;
pub use wakers::*;

pub use holders::{
    holder_slot, BlockKey, BlockValue, Blockers, HoldId, HolderKey, HolderRecord, HolderRef,
    Holders, LAST_HOLD, MAX_BLOCKERS, MAX_READERS, QUEUED,
};
pub use lock_state::{
    Effects, LockEvent, LockState, LockTiming, OffCpu, PendingAgg, TimingHooks,
    MISS_CONTINUATION_NS, OFF_RUNNABLE, OFF_SLEEPING, OFF_UNINTERRUPTIBLE,
};

/// `mode` values: which side of the rwsem.
pub const MODE_READ: u8 = 0;
pub const MODE_WRITE: u8 = 1;

/// `kind` values: time spent waiting for the lock, or holding it.
pub const KIND_WAIT: u8 = 0;
pub const KIND_HOLD: u8 = 1;

/// Log2 histogram slots over nanoseconds: slot `i` holds values in `[2^(i-1), 2^i)`, slot 0 holds 0.
pub const HIST_SLOTS: usize = 64;

/// Stack id stored when no stack was taken (event below the stack threshold) or it failed.
pub const NO_STACK: i32 = -1;

/// Aggregation key: one row of the report before symbolization.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AggKey {
    /// Target process (tgid) whose mm this lock belongs to.
    pub pid: u32,
    /// Thread id when per-thread aggregation is on, else 0.
    pub tid: u32,
    /// Tgid of a process that is not the target but locked the target's mm (a /proc reader,
    /// khugepaged, a debugger); 0 for the target's own threads.
    pub locker_pid: u32,
    pub kernel_stack: i32,
    pub user_stack: i32,
    pub kind: u8,
    pub mode: u8,
    /// 1 + index into MM_SYSCALLS of the mm syscall in progress, or 0.
    pub syscall: u8,
    /// 1 when the lock was taken by a user page fault that fell back from the per-VMA lock.
    pub fault: u8,
}

/// Aggregated durations for one key (per CPU in the kernel, merged in user space).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggValue {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Waits: the part spent asleep in the rwsem slow path (lock:contention_begin/end).
    pub contended_ns: u64,
    /// Holds: the parts spent off CPU (see OffCpu); running = total - runnable - sleeping.
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
    pub hist: [u64; HIST_SLOTS],
}

impl Default for AggValue {
    fn default() -> Self {
        Self::ZERO
    }
}

impl AggValue {
    pub const ZERO: AggValue = AggValue {
        count: 0,
        total_ns: 0,
        max_ns: 0,
        contended_ns: 0,
        runnable_ns: 0,
        sleeping_ns: 0,
        uninterruptible_ns: 0,
        hist: [0; HIST_SLOTS],
    };

    #[inline(always)]
    pub fn add_offcpu(&mut self, off: &OffCpu) {
        self.runnable_ns += off.runnable_ns;
        self.sleeping_ns += off.sleeping_ns;
        self.uninterruptible_ns += off.uninterruptible_ns;
    }

    #[inline(always)]
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        self.total_ns += ns;
        self.max_ns = max(self.max_ns, ns);
        let slot = log2_slot(ns);
        // The mask is a no-op for real slots; it proves the index in bounds to the verifier.
        self.hist[slot & (HIST_SLOTS - 1)] += 1;
    }

    /// Adds another CPU's copy of the same key.
    pub fn merge(&mut self, other: &AggValue) {
        self.count += other.count;
        self.total_ns += other.total_ns;
        self.max_ns = max(self.max_ns, other.max_ns);
        self.contended_ns += other.contended_ns;
        self.runnable_ns += other.runnable_ns;
        self.sleeping_ns += other.sleeping_ns;
        self.uninterruptible_ns += other.uninterruptible_ns;
        for (mine, theirs) in self.hist.iter_mut().zip(other.hist.iter()) {
            *mine += theirs;
        }
    }
}

/// Histogram slot of a duration: the number of significant bits, clamped to the last slot.
/// Written with shifts because the BPF target has no count-leading-zeros instruction.
#[inline(always)]
pub fn log2_slot(mut v: u64) -> usize {
    let mut bits = 0usize;
    if v >= 1 << 32 {
        v >>= 32;
        bits += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        bits += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        bits += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        bits += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        bits += 2;
    }
    if v >= 1 << 1 {
        v >>= 1;
        bits += 1;
    }
    bits += v as usize;
    if bits >= HIST_SLOTS {
        HIST_SLOTS - 1
    } else {
        bits
    }
}

/// Per-mode totals, exact even when the aggregation map overflows.
/// Indexed in the kernel by `totals_index(outside, mode)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct ModeTotals {
    pub acquisitions: u64,
    pub failed_trylocks: u64,
    pub interrupted: u64,
    pub downgrades: u64,
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
}

impl ModeTotals {
    #[inline(always)]
    pub fn add_wait(&mut self, ns: u64) {
        self.waits += 1;
        self.wait_ns += ns;
        self.max_wait_ns = max(self.max_wait_ns, ns);
    }

    #[inline(always)]
    pub fn add_hold(&mut self, ns: u64) {
        self.holds += 1;
        self.hold_ns += ns;
        self.max_hold_ns = max(self.max_hold_ns, ns);
    }

    pub fn merge(&mut self, o: &ModeTotals) {
        self.acquisitions += o.acquisitions;
        self.failed_trylocks += o.failed_trylocks;
        self.interrupted += o.interrupted;
        self.downgrades += o.downgrades;
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
        self.max_wait_ns = max(self.max_wait_ns, o.max_wait_ns);
        self.holds += o.holds;
        self.hold_ns += o.hold_ns;
        self.max_hold_ns = max(self.max_hold_ns, o.max_hold_ns);
    }

    /// What these running totals gained since `before` (the same totals, read earlier).
    /// Maxima do not subtract: they come back 0, for the caller to take from the window's
    /// entries.
    pub fn since(&self, before: &ModeTotals) -> ModeTotals {
        ModeTotals {
            acquisitions: self.acquisitions.saturating_sub(before.acquisitions),
            failed_trylocks: self.failed_trylocks.saturating_sub(before.failed_trylocks),
            interrupted: self.interrupted.saturating_sub(before.interrupted),
            downgrades: self.downgrades.saturating_sub(before.downgrades),
            waits: self.waits.saturating_sub(before.waits),
            wait_ns: self.wait_ns.saturating_sub(before.wait_ns),
            max_wait_ns: 0,
            holds: self.holds.saturating_sub(before.holds),
            hold_ns: self.hold_ns.saturating_sub(before.hold_ns),
            max_hold_ns: 0,
        }
    }
}

#[inline(always)]
fn max(a: u64, b: u64) -> u64 {
    if a > b {
        a
    } else {
        b
    }
}

/// Slots of the totals array: target threads' read/write, then outside lockers' read/write.
pub const TOTALS_SLOTS: u32 = 4;

#[inline(always)]
pub fn totals_index(outside: bool, mode: u8) -> u32 {
    (outside as u32) * 2 + (mode as u32 & 1)
}

/// Every way an event can be dropped or left unpaired. Index into the `COUNTERS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// acquire_returned with no start_locking before it (and not a downgrade).
    UnpairedAcquire = 0,
    /// released with no acquisition seen (lock taken before tracing, or unlocked by another task).
    UnpairedRelease,
    /// start_locking while a wait was already pending: the earlier wait is discarded untimed.
    StartWhileWaiting,
    /// start_locking while this thread still held the lock: the hold is discarded untimed.
    StartWhileHolding,
    /// acquire/release whose mode differs from the pending state: discarded untimed.
    ModeMismatch,
    /// The per-(thread, mm) state map was full: the event could not be tracked.
    StateMapFull,
    /// The aggregation map was full: the duration is in the totals but in no stack entry.
    AggMapFull,
    /// The target-mm map was full.
    TargetMapFull,
    /// bpf_get_stackid found another stack in the bucket (kernel / user).
    KernelStackCollision,
    UserStackCollision,
    /// bpf_get_stackid failed otherwise, e.g. the stack map is full (kernel / user).
    KernelStackFailed,
    UserStackFailed,
    /// More concurrent readers than Holders tracks: their waiters are charged to nobody.
    ReaderOverflow,
    /// A wait could not be charged to its holder: the blocked-by map was full.
    BlockedMapFull,
    /// A holder's stacks could not be kept for its waiters: the holder-info map was full, or
    /// the holder was still holding when the wait ended (charged with no holder stack).
    HolderStackMissing,
    /// The sleep-stack map was full: a hold's sleep is in its totals but not located.
    SleepMapFull,
    /// A per-thread map (syscalls in progress, holding threads) refused an insert.
    ThreadMapFull,
    /// The timeline ring buffer was full (or user space kept too many events): a wait or hold
    /// over the timeline threshold is in the totals and stacks but not in the timeline.
    TimelineDropped,
    /// A user stack copy (`--user-stack dwarf`) did not fit in its ring buffer, or the task's
    /// saved user registers could not be read: that event keeps its frame-pointer stack.
    UserStackCopyDropped,
    /// The first event the tracer saw of a thread was an acquire or a release: a lock
    /// operation already in progress when tracing started. Neither timed nor a loss.
    BeganBeforeAttach,
    /// A per-process name could not be kept (the name map was full): the process is shown
    /// by pid only.
    NameMapFull,
    /// Who woke a sleeping holder could not be kept (the wakers map was full).
    WakerMapFull,
    /// A process's cgroup could not be kept (the cgroup map was full): it is shown without.
    CgroupMapFull,
}

impl Counter {
    pub const ALL: [Counter; 23] = [
        Counter::UnpairedAcquire,
        Counter::UnpairedRelease,
        Counter::StartWhileWaiting,
        Counter::StartWhileHolding,
        Counter::ModeMismatch,
        Counter::StateMapFull,
        Counter::AggMapFull,
        Counter::TargetMapFull,
        Counter::KernelStackCollision,
        Counter::UserStackCollision,
        Counter::KernelStackFailed,
        Counter::UserStackFailed,
        Counter::ReaderOverflow,
        Counter::BlockedMapFull,
        Counter::HolderStackMissing,
        Counter::SleepMapFull,
        Counter::ThreadMapFull,
        Counter::TimelineDropped,
        Counter::UserStackCopyDropped,
        Counter::BeganBeforeAttach,
        Counter::NameMapFull,
        Counter::WakerMapFull,
        Counter::CgroupMapFull,
    ];

    /// Stable name used in every output format.
    pub fn name(self) -> &'static str {
        match self {
            Counter::UnpairedAcquire => "unpaired_acquire",
            Counter::UnpairedRelease => "unpaired_release",
            Counter::StartWhileWaiting => "start_while_waiting",
            Counter::StartWhileHolding => "start_while_holding",
            Counter::ModeMismatch => "mode_mismatch",
            Counter::StateMapFull => "state_map_full",
            Counter::AggMapFull => "aggregation_map_full",
            Counter::TargetMapFull => "target_map_full",
            Counter::KernelStackCollision => "kernel_stack_collision",
            Counter::UserStackCollision => "user_stack_collision",
            Counter::KernelStackFailed => "kernel_stack_failed",
            Counter::UserStackFailed => "user_stack_failed",
            Counter::ReaderOverflow => "reader_overflow",
            Counter::BlockedMapFull => "blocked_map_full",
            Counter::HolderStackMissing => "holder_stack_missing",
            Counter::SleepMapFull => "sleep_map_full",
            Counter::ThreadMapFull => "thread_map_full",
            Counter::TimelineDropped => "timeline_dropped",
            Counter::UserStackCopyDropped => "user_stack_copy_dropped",
            Counter::BeganBeforeAttach => "began_before_attach",
            Counter::NameMapFull => "name_map_full",
            Counter::WakerMapFull => "waker_map_full",
            Counter::CgroupMapFull => "cgroup_map_full",
        }
    }
}

pub const COUNTER_SLOTS: u32 = Counter::ALL.len() as u32;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these types are #[repr(C)], Copy, made of integers only, with explicit padding.
    // (Each family's own types are Pod beside their definitions.)
    unsafe impl aya::Pod for super::AggKey {}
    unsafe impl aya::Pod for super::AggValue {}
    unsafe impl aya::Pod for super::ModeTotals {}
    unsafe impl aya::Pod for super::LockState {}
    unsafe impl aya::Pod for super::Holders {}
    unsafe impl aya::Pod for super::Blockers {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_slot_matches_bit_length() {
        assert_eq!(log2_slot(0), 0);
        assert_eq!(log2_slot(1), 1);
        assert_eq!(log2_slot(2), 2);
        assert_eq!(log2_slot(3), 2);
        assert_eq!(log2_slot(4), 3);
        assert_eq!(log2_slot(1023), 10);
        assert_eq!(log2_slot(1024), 11);
        for v in [5u64, 77, 1 << 20, (1 << 40) + 3, u64::MAX >> 2] {
            assert_eq!(log2_slot(v), (64 - v.leading_zeros()) as usize, "{v}");
        }
        assert_eq!(log2_slot(u64::MAX), HIST_SLOTS - 1);
    }

    #[test]
    fn agg_value_add_and_merge() {
        let mut a = AggValue::default();
        a.add(10);
        a.add(1000);
        let mut b = AggValue::default();
        b.add(5000);
        a.merge(&b);
        assert_eq!(a.count, 3);
        assert_eq!(a.total_ns, 6010);
        assert_eq!(a.max_ns, 5000);
        assert_eq!(a.hist[log2_slot(10)], 1);
        assert_eq!(a.hist[log2_slot(5000)], 1);
        assert_eq!(a.hist.iter().sum::<u64>(), 3);
    }

    #[test]
    fn mode_totals_add_and_merge() {
        let mut a = ModeTotals::default();
        a.add_wait(100);
        a.add_wait(300);
        a.add_hold(50);
        let mut b = ModeTotals {
            acquisitions: 2,
            ..ModeTotals::default()
        };
        b.add_wait(200);
        b.add_hold(900);
        a.merge(&b);
        assert_eq!((a.waits, a.wait_ns, a.max_wait_ns), (3, 600, 300));
        assert_eq!((a.holds, a.hold_ns, a.max_hold_ns), (2, 950, 900));
        assert_eq!(a.acquisitions, 2);
    }

    #[test]
    fn totals_index_is_dense() {
        let all = [
            totals_index(false, MODE_READ),
            totals_index(false, MODE_WRITE),
            totals_index(true, MODE_READ),
            totals_index(true, MODE_WRITE),
        ];
        assert_eq!(all, [0, 1, 2, 3]);
        assert!(all.iter().all(|&i| i < TOTALS_SLOTS));
    }

    #[test]
    fn counter_names_are_unique_and_indexed_in_order() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(
                Counter::ALL.iter().filter(|o| o.name() == c.name()).count(),
                1
            );
        }
    }
}
