//! Types shared across the kernel line, and the per-(thread, mm) lock state machine.
//!
//! Everything here is `no_std` and `#[repr(C)]`: the eBPF programs and user space read the same
//! bytes. The state machine lives here (not in the eBPF crate) so that the exact code the kernel
//! runs is unit-tested on the host.
#![no_std]

pub mod holders;
pub mod lock_state;
pub mod map_names;
pub mod program_names;

pub use holders::{Blockers, HolderRef, Holders, LAST_HOLD, MAX_BLOCKERS, MAX_READERS, QUEUED};
pub use lock_state::{
    Effects, LockEvent, LockState, OffCpu, PendingAgg, MISS_CONTINUATION_NS, OFF_RUNNABLE,
    OFF_SLEEPING, OFF_UNINTERRUPTIBLE,
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
}

impl Counter {
    pub const ALL: [Counter; 21] = [
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
        }
    }
}

pub const COUNTER_SLOTS: u32 = Counter::ALL.len() as u32;

/// Where a tracepoint keeps its fields, read from tracefs at startup (layouts differ by kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracepointFields {
    pub mm: u32,
    pub write: u32,
    /// Only meaningful for mmap_lock_acquire_returned.
    pub success: u32,
    pub _pad: u32,
}

/// Load-time configuration of the eBPF programs (a read-only global: the verifier prunes the
/// branches it disables).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub start_locking: TracepointFields,
    pub acquire_returned: TracepointFields,
    pub released: TracepointFields,
    /// offsetof(struct task_struct, mm), from the running kernel's BTF.
    pub task_mm_offset: u32,
    /// offsetof(struct task_struct, pending) + offsetof(struct sigpending, signal).
    pub task_pending_signal_offset: u32,
    /// offsetof(struct task_struct, pid), for sched_switch's task pointers.
    pub task_pid_offset: u32,
    /// offsetof(struct task_struct, flags), to tell kernel threads (PF_KTHREAD) apart.
    pub task_flags_offset: u32,
    /// offsetof(struct mm_struct, mmap_lock): lock:contention_* name the lock, not the mm.
    pub mm_mmap_lock_offset: u32,
    /// lock_addr in lock:contention_begin / contention_end.
    pub contention_begin_lock: u32,
    pub contention_end_lock: u32,
    /// __syscall_nr in the syscalls:sys_{enter,exit}_* events.
    pub syscall_nr_offset: u32,
    /// This architecture's numbers of MM_SYSCALLS, in that order.
    pub syscall_nrs: [i32; MM_SYSCALLS.len()],
    /// Waits and holds at least this long get kernel and user stacks.
    pub stack_threshold_ns: u64,
    /// The tracer's own tgid: its events are ignored except to discover a target's mm.
    pub tracer_tgid: u32,
    /// Non-zero: key aggregation by thread id.
    /// 0, PER_THREAD_ALWAYS or PER_THREAD_WHILE_ROOM.
    pub per_thread: u32,
    /// Non-zero: take user stacks too.
    pub user_stacks: u32,
    /// Non-zero: trace every user process's mm (`-a`), learning each mm's owner as it locks
    /// its own mm, instead of the targets' only.
    pub system_wide: u32,
    /// Waits and holds at least this long are also sent to the timeline ring buffer; 0 turns
    /// the timeline off (the default, so the hot path pays nothing for it).
    pub timeline_threshold_ns: u64,
    /// Waits and holds at least this long get their user stack copied for unwinding; shorter
    /// ones with a kernel stack are copied one in `user_stack_sample`.
    pub user_stack_threshold_ns: u64,
    /// Bytes of user stack to copy from the saved user sp (at most USER_STACK_MAX); 0: no
    /// copies (`--user-stack fp|none`).
    pub user_stack_bytes: u32,
    /// 1 in this many waits and holds under `user_stack_threshold_ns` (with a kernel stack)
    /// are copied too, so that common short paths are unwound; 0: none.
    pub user_stack_sample: u32,
    /// Where the task's saved user registers are (from BTF): `task_struct.stack`, the kernel
    /// stack size, `sizeof(struct pt_regs)` and its ip, sp and bp members.
    pub task_stack_offset: u32,
    pub thread_size: u32,
    pub pt_regs_size: u32,
    pub pt_regs_ip: u32,
    pub pt_regs_sp: u32,
    pub pt_regs_bp: u32,
    pub pt_regs_orig_ax: u32,
    /// Non-zero when the offsets above are known: lock operations serving a user page fault
    /// are then told apart by the saved orig_ax (-1 on exception entry).
    pub user_regs_known: u32,
    /// User stack copies each CPU may make per USER_STACK_BUDGET_WINDOW_NS: a share of the ring
    /// buffer that user space drains in that time, so that a busy target is sampled rather than
    /// filling the ring.
    pub user_stack_budget: u32,
    /// Non-zero: attribute waits and holds (fault and syscall causes, the holders waited
    /// behind, the holding thread for the off-CPU split). 0 is the timing-only mode (`--lean`):
    /// the verifier prunes all of it from the lock programs.
    pub attribution: u32,
    /// Non-zero: at most FAST_TARGETS listed targets (no `-a`), found through the TARGET_SLOTS
    /// array instead of a hash lookup; with `--lean` and no per-thread rows, aggregated in the
    /// LEAN_AGG array per target, kind and mode.
    pub target_slots: u32,
    pub _pad: u32,
    /// Waits and holds at least this long get their stacks walked when they end, inside the
    /// critical section (every waiter pays for that walk) if they were not walked at
    /// start_locking, where a lock operation expected to be long, or sampled, gets them.
    pub late_stack_threshold_ns: u64,
    /// offsetof(struct task_struct, active_mm), offsetof(struct task_struct, signal) and
    /// offsetof(struct signal_struct, live): at sched_process_exit, whether the whole process
    /// is gone and which mm it left (exit_mm has cleared `mm` by then, not `active_mm`).
    pub task_active_mm_offset: u32,
    pub task_signal_offset: u32,
    pub signal_live_offset: u32,
    /// Once AGG or BLOCKED holds this many keys, new keys drop their thread ids (unless
    /// per-thread rows were asked for, PER_THREAD_ALWAYS): keys that grow with the target's
    /// thread count would fill them on a target of thousands of threads, losing the durations
    /// and charges themselves.
    pub fold_threads_at: u32,
    /// offsetof(struct task_struct, start_time) (CLOCK_MONOTONIC ns): at sched_process_exit,
    /// how long an exiting target thread lived inside the trace.
    pub task_start_time_offset: u32,
    /// offsetof(struct task_struct, tgid), for sched_process_fork's child.
    pub task_tgid_offset: u32,
    /// Non-zero with `-- CMD`: the processes a target forks are targets too (until they exit).
    pub inherit: u32,
    /// HOLDER_INFO's size minus one (a power of two): see `holder_slot`.
    pub holder_slots_mask: u32,
}

/// THREAD_EXITS slots: summed lifetimes inside the trace (ns) of the target threads that exited
/// while it ran, and their number.
pub const EXITED_LIFETIME_NS: u32 = 0;
pub const EXITED_THREADS: u32 = 1;

/// `Config::per_thread`: entries keyed by thread always (the user asked for per-thread rows),
/// or while the maps have room (collected per thread for the live view and for splitting copied
/// stacks, merged afterwards: a key without its thread loses nothing once merged).
pub const PER_THREAD_ALWAYS: u32 = 1;
pub const PER_THREAD_WHILE_ROOM: u32 = 2;

/// Slots of the KEY_COUNTS array: keys inserted into AGG and into BLOCKED.
pub const KEYS_AGG: u32 = 0;
pub const KEYS_BLOCKED: u32 = 1;

/// The floor of `Config::late_stack_threshold_ns` (unless stacks are asked for everything):
/// an operation this long costs its waiters far more than the walk does.
pub const LATE_STACK_FLOOR_NS: u64 = 1_000_000;

/// Listed targets recognised without a hash lookup.
pub const FAST_TARGETS: usize = 8;

/// The listed targets: slot i is the target `pids[i]` (0: free), whose mm is `mms[i]` once
/// one of its threads locked it (learnt by the programs; a new mm after an exec replaces it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastTargets {
    pub pids: [u32; FAST_TARGETS],
    pub mms: [u64; FAST_TARGETS],
}

/// Entries of the LEAN_AGG per-CPU array: one per (target slot, kind, mode).
pub const LEAN_AGG_SLOTS: u32 = (FAST_TARGETS * 4) as u32;

#[inline(always)]
pub fn lean_agg_index(slot: usize, kind: u8, mode: u8) -> u32 {
    (slot as u32 % FAST_TARGETS as u32) * 4 + (kind as u32 & 1) * 2 + (mode as u32 & 1)
}

impl Config {
    /// The all-zero value the eBPF object is compiled with; user space overrides it at load time.
    pub const ZERO: Config = Config {
        start_locking: TracepointFields::ZERO,
        acquire_returned: TracepointFields::ZERO,
        released: TracepointFields::ZERO,
        task_mm_offset: 0,
        task_pending_signal_offset: 0,
        task_pid_offset: 0,
        task_flags_offset: 0,
        mm_mmap_lock_offset: 0,
        contention_begin_lock: 0,
        contention_end_lock: 0,
        syscall_nr_offset: 0,
        syscall_nrs: [0; MM_SYSCALLS.len()],
        stack_threshold_ns: 0,
        tracer_tgid: 0,
        per_thread: 0,
        user_stacks: 0,
        system_wide: 0,
        timeline_threshold_ns: 0,
        user_stack_threshold_ns: 0,
        user_stack_bytes: 0,
        user_stack_sample: 0,
        task_stack_offset: 0,
        thread_size: 0,
        pt_regs_size: 0,
        pt_regs_ip: 0,
        pt_regs_sp: 0,
        pt_regs_bp: 0,
        pt_regs_orig_ax: 0,
        user_regs_known: 0,
        user_stack_budget: 0,
        attribution: 0,
        target_slots: 0,
        _pad: 0,
        late_stack_threshold_ns: 0,
        task_active_mm_offset: 0,
        task_signal_offset: 0,
        signal_live_offset: 0,
        fold_threads_at: 0,
        task_start_time_offset: 0,
        task_tgid_offset: 0,
        inherit: 0,
        holder_slots_mask: 0,
    };
}

impl TracepointFields {
    pub const ZERO: TracepointFields = TracepointFields {
        mm: 0,
        write: 0,
        success: 0,
        _pad: 0,
    };
}

/// The syscalls that take mmap_lock for a reason of their own, traced for per-syscall totals.
pub const MM_SYSCALLS: [&str; 6] = ["mmap", "munmap", "mprotect", "mremap", "madvise", "brk"];

/// An mm syscall in progress on one thread (its lock wait and hold are kept in the thread's
/// LockState meanwhile, so that no lock event looks this up inside the critical section).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallState {
    /// Index into MM_SYSCALLS.
    pub index: u32,
    pub _pad: u32,
    pub enter_ns: u64,
}

/// Per-syscall totals (a per-CPU array indexed like MM_SYSCALLS).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct SyscallTotals {
    pub count: u64,
    pub total_ns: u64,
    pub lock_wait_ns: u64,
    pub lock_hold_ns: u64,
}

impl SyscallTotals {
    pub fn merge(&mut self, o: &SyscallTotals) {
        self.count += o.count;
        self.total_ns += o.total_ns;
        self.lock_wait_ns += o.lock_wait_ns;
        self.lock_hold_ns += o.lock_hold_ns;
    }

    /// What these running totals gained since `before`.
    pub fn since(&self, before: &SyscallTotals) -> SyscallTotals {
        SyscallTotals {
            count: self.count.saturating_sub(before.count),
            total_ns: self.total_ns.saturating_sub(before.total_ns),
            lock_wait_ns: self.lock_wait_ns.saturating_sub(before.lock_wait_ns),
            lock_hold_ns: self.lock_hold_ns.saturating_sub(before.lock_hold_ns),
        }
    }
}

/// Slots of the per-CPU fault counter array.
/// User faults of the targets: filled in by user space from /proc/PID/stat (counting them in
/// the kernel cost a program run on every fault).
pub const FAULTS_USER: u32 = 0;
/// Lock operations taken by user page faults (fell back from the per-VMA lock).
pub const FAULTS_TOOK_MMAP_LOCK: u32 = 1;
pub const FAULTS_FILEMAP: u32 = 2;
/// filemap faults while the faulting thread held the target's mmap_lock.
pub const FAULTS_FILEMAP_UNDER_LOCK: u32 = 3;
pub const FAULT_SLOTS: u32 = 4;

/// Identifies one hold: the holder thread and when it began.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HoldId {
    pub tid: u32,
    pub _pad: u32,
    pub hold_start_ns: u64,
}

/// A blocking hold's record in HOLDER_INFO, an array: slot `holder_slot(id)`. Writing a slot
/// is a store, where inserting into a hash map allocated, inside the critical section. A later
/// hold hashed to the same slot overwrites it; a waiter then finds another id there and charges
/// the holder by thread only (counted as holder_stack_missing).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderRecord {
    pub id: HoldId,
    pub holder: HolderKey,
}

/// The HOLDER_INFO slot of the hold `id`, for a map of `mask + 1` slots.
#[inline(always)]
pub fn holder_slot(id: &HoldId, mask: u32) -> u32 {
    let h = id.hold_start_ns ^ (id.tid as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h ^ (h >> 29) ^ (h >> 47)) as u32) & mask
}

/// What a waiter needs to know of a holder that blocked it, kept from its release.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderKey {
    pub kernel_stack: i32,
    pub user_stack: i32,
    pub tid: u32,
    /// Tgid of an outside locker, else 0.
    pub outside_pid: u32,
    pub mode: u8,
    pub syscall: u8,
    pub fault: u8,
    pub _pad: u8,
}

impl HolderKey {
    /// A holder whose record is missing (still holding, or lost): charged by thread only.
    pub fn unknown(tid: u32, mode: u8) -> Self {
        HolderKey {
            kernel_stack: NO_STACK,
            user_stack: NO_STACK,
            tid,
            outside_pid: 0,
            mode,
            syscall: 0,
            fault: 0,
            _pad: 0,
        }
    }
}

/// A wait (its aggregation key) charged to one holder.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub waiter: AggKey,
    pub holder: HolderKey,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockValue {
    pub count: u64,
    /// The waits' time, split equally between the holders each wait found.
    pub wait_ns: u64,
}

impl BlockValue {
    /// The value a new BLOCKED entry starts from, read from the object's constants: one made
    /// on the stack compiled to a memset call, a frame more on the programs' call chains.
    pub const ZERO: BlockValue = BlockValue {
        count: 0,
        wait_ns: 0,
    };

    /// Adds another CPU's (or thread's) value of the same holder.
    pub fn merge(&mut self, o: &BlockValue) {
        self.count += o.count;
        self.wait_ns += o.wait_ns;
    }

    /// What this running value gained since `before`.
    pub fn since(&self, before: &BlockValue) -> BlockValue {
        BlockValue {
            count: self.count.saturating_sub(before.count),
            wait_ns: self.wait_ns.saturating_sub(before.wait_ns),
        }
    }
}

/// A hold (its aggregation key) and a kernel stack its thread slept in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SleepKey {
    pub hold: AggKey,
    pub stack: i32,
    pub _pad: u32,
}

/// One wait or hold over the timeline threshold, as sent through the timeline ring buffer.
/// Stacks travel as ids into the stack map and are symbolized once, at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) when the wait or hold began.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The locking thread (always set, whatever the aggregation key holds).
    pub tid: u32,
    pub _pad: u32,
    /// The entry the wait or hold was aggregated under (its stacks, kind, mode, cause).
    pub key: AggKey,
}

/// Largest user stack window one record carries: whole pages, copied from the page holding the
/// saved user sp (so up to a page less than this lies above sp).
pub const USER_STACK_MAX: usize = 64 * 1024;
pub const USER_STACK_PAGE: usize = 4096;
/// Pages of the two record sizes: the small one fits the default 16 KiB window plus the partial
/// page below it, so that a ring record does not reserve 64 KiB for a 20 KiB copy.
pub const USER_STACK_SMALL_PAGES: usize = 5;
pub const USER_STACK_MAX_PAGES: usize = USER_STACK_MAX / USER_STACK_PAGE;

/// The window of `Config::user_stack_budget`: user space drains the ring this often.
pub const USER_STACK_BUDGET_WINDOW_NS: u64 = 100_000_000;

/// Per-CPU state of the copy budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyBudget {
    pub window_start_ns: u64,
    pub used: u32,
    pub _pad: u32,
}

/// What a user-stack ring record is (its first field).
pub const USER_STACK_RECORD_COPY: u32 = 1;
pub const USER_STACK_RECORD_EVENT: u32 = 2;

/// The fixed part of a `UserStackCopy`: whose stack, its saved registers, and how much of it
/// follows. Copies are taken when a lock operation begins (before the lock is taken, so that no
/// waiter pays for the copy) and used by the `UserStackEvent`s that name them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStackCopyHeader {
    /// USER_STACK_RECORD_COPY.
    pub record: u32,
    pub tid: u32,
    /// bpf_ktime_get_ns when the copy was made: with `tid`, names the copy.
    pub copy_id: u64,
    /// The process whose stack this is (its objects unwind it).
    pub pid: u32,
    /// Bytes of the copy's pages that hold stack memory (from `stack_start`).
    pub stack_len: u32,
    /// User registers saved when the thread entered the kernel (syscall or fault).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// User address of the first copied byte: sp rounded down to its page.
    pub stack_start: u64,
}

/// A user stack copy as the ring buffer carries it, in one of two sizes (`PAGES`).
#[repr(C)]
pub struct UserStackCopy<const PAGES: usize> {
    pub header: UserStackCopyHeader,
    pub pages: [[u8; USER_STACK_PAGE]; PAGES],
}

/// One wait or hold whose user stack was copied: the copy it uses, the aggregation key the
/// kernel added it under and its exact share of that entry, so that user space can move the
/// event from that entry to one keyed by the unwound stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStackEvent {
    /// USER_STACK_RECORD_EVENT.
    pub record: u32,
    /// The locking thread (with `copy_id`, names the copy).
    pub tid: u32,
    pub copy_id: u64,
    pub key: AggKey,
    pub duration_ns: u64,
    /// The event's share of the AggValue fields, so that moving it is exact.
    pub contended_ns: u64,
    pub runnable_ns: u64,
    pub sleeping_ns: u64,
    pub uninterruptible_ns: u64,
    /// 1 when this event ends its lock operation: no later event uses the copy.
    pub last_use: u8,
    /// 1 when the copy was made at the end of the event, inside the critical section (the
    /// event was long without having been expected to be).
    pub late_copy: u8,
    pub _pad: [u8; 6],
}

/// Key of the per-(thread, mm) lock state map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub tid: u32,
    pub _pad: u32,
    pub mm: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these types are #[repr(C)], Copy, made of integers only, with explicit padding.
    unsafe impl aya::Pod for super::AggKey {}
    unsafe impl aya::Pod for super::AggValue {}
    unsafe impl aya::Pod for super::ModeTotals {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::StateKey {}
    unsafe impl aya::Pod for super::LockState {}
    unsafe impl aya::Pod for super::SyscallState {}
    unsafe impl aya::Pod for super::SyscallTotals {}
    unsafe impl aya::Pod for super::HoldId {}
    unsafe impl aya::Pod for super::HolderKey {}
    unsafe impl aya::Pod for super::HolderRecord {}
    unsafe impl aya::Pod for super::BlockKey {}
    unsafe impl aya::Pod for super::BlockValue {}
    unsafe impl aya::Pod for super::SleepKey {}
    unsafe impl aya::Pod for super::Holders {}
    unsafe impl aya::Pod for super::Blockers {}
    unsafe impl aya::Pod for super::TimelineEvent {}
    unsafe impl aya::Pod for super::UserStackEvent {}
    unsafe impl aya::Pod for super::UserStackCopyHeader {}
    unsafe impl aya::Pod for super::FastTargets {}
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
    fn timeline_event_has_no_implicit_padding() {
        // 2 x u64 + 5 x 32-bit + 2 x u8 + 2 pad bytes: the kernel and user space agree on it.
        assert_eq!(core::mem::size_of::<TimelineEvent>(), 48);
        assert_eq!(core::mem::align_of::<TimelineEvent>(), 8);
    }

    #[test]
    fn config_has_no_implicit_padding() {
        // 3 x TracepointFields (16) + 8 x u32 + 6 x i32 + u64 + 4 x u32 + 2 x u64 + 14 x u32
        // + u64 + 8 x u32: every field is explicit, so the kernel and user space read the same
        // bytes.
        assert_eq!(
            core::mem::size_of::<Config>(),
            48 + 32 + 24 + 8 + 16 + 16 + 56 + 8 + 32
        );
        assert_eq!(core::mem::align_of::<Config>(), 8);
        assert_eq!(core::mem::offset_of!(Config, stack_threshold_ns), 104);
        assert_eq!(core::mem::offset_of!(Config, system_wide), 124);
        assert_eq!(core::mem::offset_of!(Config, timeline_threshold_ns), 128);
    }

    #[test]
    fn user_stack_records_have_no_implicit_padding() {
        // 2 x u32 + u64 + 2 x u32 + 4 x u64.
        assert_eq!(core::mem::size_of::<UserStackCopyHeader>(), 56);
        // 2 x u32 + u64 + AggKey (24) + 5 x u64 + 8 flag and pad bytes.
        assert_eq!(core::mem::size_of::<UserStackEvent>(), 88);
        assert_eq!(core::mem::align_of::<UserStackEvent>(), 8);
        assert_eq!(
            core::mem::size_of::<UserStackCopy<USER_STACK_SMALL_PAGES>>(),
            56 + USER_STACK_SMALL_PAGES * USER_STACK_PAGE
        );
        assert_eq!(USER_STACK_MAX_PAGES * USER_STACK_PAGE, USER_STACK_MAX);
    }

    #[test]
    fn lean_agg_indices_are_dense_and_distinct() {
        let mut seen = [false; LEAN_AGG_SLOTS as usize];
        for slot in 0..FAST_TARGETS {
            for kind in [KIND_WAIT, KIND_HOLD] {
                for mode in [MODE_READ, MODE_WRITE] {
                    let i = lean_agg_index(slot, kind, mode) as usize;
                    assert!(!seen[i], "{slot} {kind} {mode}");
                    seen[i] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
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
