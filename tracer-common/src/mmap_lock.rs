//! The mmap_lock family's own types: where the classic tracepoints keep their fields, the key of
//! the per-(thread, mm) lock state, and the settings of the aggregation maps' keys. (The state
//! machine is `lock_state`; the aggregation key and value, which every family's records carry,
//! are in the crate root.)

/// The classic mmap_lock tracepoints' field offsets (layouts differ by kernel), one per event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmapLockConfig {
    pub start_locking: TracepointFields,
    pub acquire_returned: TracepointFields,
    pub released: TracepointFields,
}

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

/// Key of the per-(thread, mm) lock state map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub tid: u32,
    pub _pad: u32,
    pub mm: u64,
}

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

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for StateKey {}
