//! The load-time configuration of the programs: one read-only global, `CONFIG` in tracer-ebpf,
//! filled by user space from the running kernel's BTF and tracefs and from the command line.

use crate::contention::ContentionConfig;
use crate::mmap_lock::MmapLockConfig;
use crate::syscalls::SyscallsConfig;
use crate::user_stacks::{UserRegs, UserStackCopyConfig};

/// Load-time configuration of the eBPF programs (a read-only global: the verifier prunes the
/// branches it disables). A family's own settings are a struct of its module; the rest are the
/// kernel's struct offsets and the settings every family reads. Fields are laid out without
/// implicit padding (see the test): the kernel and user space read the same bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Where the classic mmap_lock tracepoints keep their fields.
    pub mmap_lock: MmapLockConfig,
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
    pub contention: ContentionConfig,
    pub syscalls: SyscallsConfig,
    /// Waits and holds at least this long get kernel and user stacks.
    pub stack_threshold_ns: u64,
    // tracer_tgid, per_thread, attribution and target_slots are read by every lock event's
    // program, before anything else: side by side, they are one cache line to miss, not three.
    /// The tracer's own tgid: its events are ignored except to discover a target's mm.
    pub tracer_tgid: u32,
    /// Non-zero: key aggregation by thread id.
    /// 0, PER_THREAD_ALWAYS or PER_THREAD_WHILE_ROOM.
    pub per_thread: u32,
    /// Non-zero: attribute waits and holds (fault and syscall causes, the holders waited
    /// behind, the holding thread for the off-CPU split). 0 is the timing-only mode (`--lean`):
    /// the verifier prunes all of it from the lock programs.
    pub attribution: u32,
    /// Non-zero: at most FAST_TARGETS listed targets (no `-a`), found through the TARGET_SLOTS
    /// array instead of a hash lookup; with `--lean` and no per-thread rows, aggregated in the
    /// LEAN_AGG array per target, kind and mode. With `inherit`, the processes a listed target
    /// starts are found by hash.
    pub target_slots: u32,
    /// Non-zero: take user stacks too.
    pub user_stacks: u32,
    /// Non-zero: trace every user process's mm (`-a`), learning each mm's owner as it locks
    /// its own mm, instead of the targets' only.
    pub system_wide: u32,
    /// Waits and holds at least this long are also sent to the timeline ring buffer; 0 turns
    /// the timeline off (the default, so the hot path pays nothing for it).
    pub timeline_threshold_ns: u64,
    pub user_stack_copies: UserStackCopyConfig,
    pub user_regs: UserRegs,
    /// User stack copies each CPU may make per USER_STACK_BUDGET_WINDOW_NS: a share of the ring
    /// buffer that user space drains in that time, so that a busy target is sampled rather than
    /// filling the ring. (Beside the other copy settings it would move every field after it.)
    pub user_stack_budget: u32,
    /// Non-zero with `--cgroup`: system-wide, only processes whose cgroup (v2) is in
    /// CGROUP_FILTER (the given cgroups and their descendants, kept current by user space)
    /// register their mm.
    pub cgroup_filter: u32,
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

impl Config {
    /// The all-zero value the eBPF object is compiled with; user space overrides it at load time.
    // SAFETY: every field is an integer or an array or struct of integers, for which all-zero
    // bytes are a valid value.
    pub const ZERO: Config = unsafe { core::mem::zeroed() };
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for Config {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_no_implicit_padding() {
        // 3 x TracepointFields (16) + 8 x u32 + 24 x i32 + u64 + 4 x u32 + 2 x u64 + 14 x u32
        // + u64 + 8 x u32: every field is explicit, so the kernel and user space read the same
        // bytes.
        assert_eq!(
            core::mem::size_of::<Config>(),
            48 + 32 + 96 + 8 + 16 + 16 + 56 + 8 + 32
        );
        assert_eq!(core::mem::align_of::<Config>(), 8);
        assert_eq!(core::mem::offset_of!(Config, stack_threshold_ns), 176);
        // The fields every lock event reads first, in one cache line.
        assert_eq!(core::mem::offset_of!(Config, tracer_tgid), 184);
        assert_eq!(core::mem::offset_of!(Config, target_slots), 196);
        assert_eq!(core::mem::offset_of!(Config, system_wide), 204);
        assert_eq!(core::mem::offset_of!(Config, timeline_threshold_ns), 208);
    }
}
