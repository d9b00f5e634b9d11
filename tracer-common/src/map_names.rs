//! The names user space opens the programs' maps and globals by: each is the name of a
//! `#[map]` (or global) static in tracer-ebpf. One spelling for both sides; the tracer's
//! `probes::object_names` test checks the list against the compiled object, both ways.

pub const AGG: &str = "AGG";
pub const ARMED: &str = "ARMED";
pub const BLOCKED: &str = "BLOCKED";
pub const COPY_BUDGET: &str = "COPY_BUDGET";
pub const COUNTERS: &str = "COUNTERS";
pub const DISCOVER: &str = "DISCOVER";
pub const EXEC_COMMS: &str = "EXEC_COMMS";
pub const FAULT_COUNTS: &str = "FAULT_COUNTS";
pub const HOLDERS: &str = "HOLDERS";
pub const HOLDERS_BY_SLOT: &str = "HOLDERS_BY_SLOT";
pub const HOLDER_INFO: &str = "HOLDER_INFO";
pub const KEY_COUNTS: &str = "KEY_COUNTS";
pub const LEAN_AGG: &str = "LEAN_AGG";
pub const LEAN_THREADS: &str = "LEAN_THREADS";
pub const LOCKER_COMMS: &str = "LOCKER_COMMS";
pub const LOCK_STATE: &str = "LOCK_STATE";
pub const MAP_FULL: &str = "MAP_FULL";
pub const SAMPLE_TICK: &str = "SAMPLE_TICK";
pub const SLEEPS: &str = "SLEEPS";
pub const STACKS: &str = "STACKS";
pub const SYSCALLS_ACTIVE: &str = "SYSCALLS_ACTIVE";
pub const SYSCALL_TOTALS: &str = "SYSCALL_TOTALS";
pub const TARGET_MMS: &str = "TARGET_MMS";
pub const TARGET_SLOTS: &str = "TARGET_SLOTS";
pub const TARGET_TGIDS: &str = "TARGET_TGIDS";
pub const THREAD_EXITS: &str = "THREAD_EXITS";
pub const TID_HOLDING: &str = "TID_HOLDING";
pub const TIMELINE: &str = "TIMELINE";
pub const TOTALS: &str = "TOTALS";
pub const TRACE_START: &str = "TRACE_START";
pub const USER_STACKS: &str = "USER_STACKS";

/// Every map above.
pub const MAPS: [&str; 31] = [
    AGG,
    ARMED,
    BLOCKED,
    COPY_BUDGET,
    COUNTERS,
    DISCOVER,
    EXEC_COMMS,
    FAULT_COUNTS,
    HOLDERS,
    HOLDERS_BY_SLOT,
    HOLDER_INFO,
    KEY_COUNTS,
    LEAN_AGG,
    LEAN_THREADS,
    LOCKER_COMMS,
    LOCK_STATE,
    MAP_FULL,
    SAMPLE_TICK,
    SLEEPS,
    STACKS,
    SYSCALLS_ACTIVE,
    SYSCALL_TOTALS,
    TARGET_MMS,
    TARGET_SLOTS,
    TARGET_TGIDS,
    THREAD_EXITS,
    TID_HOLDING,
    TIMELINE,
    TOTALS,
    TRACE_START,
    USER_STACKS,
];

/// The load-time `Config` global (`EbpfLoader::override_global`).
pub const CONFIG: &str = "CONFIG";
