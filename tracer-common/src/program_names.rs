//! The names user space loads the programs by: each is the name of a program function in
//! tracer-ebpf (`#[btf_tracepoint]` or `classic_tracepoint!`). One spelling for both sides; the
//! tracer's `probes::object_names` test checks the list against the compiled object, both
//! ways, as it does the map names.

// The mmap_lock family, each set in the order of the three events (start_locking,
// acquire_returned, released).
/// BTF tracepoints for the `(mm, write[, success])` prototypes (6.13 on).
pub const MMAP_LOCK_BTF: [&str; 3] = ["btf_start_locking", "btf_acquire_returned", "btf_released"];
/// BTF tracepoints for the `(mm, memcg_path, write[, success])` prototypes (before 6.13).
pub const MMAP_LOCK_BTF_MEMCG: [&str; 3] = [
    "btf_memcg_start_locking",
    "btf_memcg_acquire_returned",
    "btf_memcg_released",
];
/// The classic tracepoints' fallback (named as the events are).
pub const MMAP_LOCK_CLASSIC: [&str; 3] = [
    "mmap_lock_start_locking",
    "mmap_lock_acquire_returned",
    "mmap_lock_released",
];
/// The bench floors: empty programs on the same three events.
pub const FLOOR_BTF: [&str; 3] = [
    "floor_btf_start_locking",
    "floor_btf_acquire_returned",
    "floor_btf_released",
];
pub const FLOOR_CLASSIC: [&str; 3] = [
    "floor_classic_start_locking",
    "floor_classic_acquire_returned",
    "floor_classic_released",
];

// The target lifecycle and off-CPU time (sched).
pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
pub const SCHED_PROCESS_FORK: &str = "sched_process_fork";
pub const SCHED_PROCESS_EXEC: &str = "sched_process_exec";
pub const SCHED_SWITCH: &str = "sched_switch";

// Lock contention: BTF tracepoints, classic ones as the fallback.
pub const BTF_CONTENTION_BEGIN: &str = "btf_contention_begin";
pub const BTF_CONTENTION_END: &str = "btf_contention_end";
pub const CONTENTION_BEGIN: &str = "contention_begin";
pub const CONTENTION_END: &str = "contention_end";

// Faults and mm syscalls (classic tracepoints).
pub const MM_FILEMAP_FAULT: &str = "mm_filemap_fault";
pub const MM_SYSCALL_ENTER: &str = "mm_syscall_enter";
pub const MM_SYSCALL_EXIT: &str = "mm_syscall_exit";

/// Every program above.
pub const PROGRAMS: [&str; 26] = [
    MMAP_LOCK_BTF[0],
    MMAP_LOCK_BTF[1],
    MMAP_LOCK_BTF[2],
    MMAP_LOCK_BTF_MEMCG[0],
    MMAP_LOCK_BTF_MEMCG[1],
    MMAP_LOCK_BTF_MEMCG[2],
    MMAP_LOCK_CLASSIC[0],
    MMAP_LOCK_CLASSIC[1],
    MMAP_LOCK_CLASSIC[2],
    FLOOR_BTF[0],
    FLOOR_BTF[1],
    FLOOR_BTF[2],
    FLOOR_CLASSIC[0],
    FLOOR_CLASSIC[1],
    FLOOR_CLASSIC[2],
    SCHED_PROCESS_EXIT,
    SCHED_PROCESS_FORK,
    SCHED_PROCESS_EXEC,
    SCHED_SWITCH,
    BTF_CONTENTION_BEGIN,
    BTF_CONTENTION_END,
    CONTENTION_BEGIN,
    CONTENTION_END,
    MM_FILEMAP_FAULT,
    MM_SYSCALL_ENTER,
    MM_SYSCALL_EXIT,
];
