//! Maps shared by the programs, the load-time configuration, and small accessors.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, StackTrace},
};
use tracer_common::{
    AggKey, AggValue, Config, Counter, LockState, ModeTotals, StateKey, COUNTER_SLOTS, TOTALS_SLOTS,
};

/// Overridden by user space at load time (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static CONFIG: Config = Config::ZERO;

#[inline(always)]
pub fn config() -> Config {
    // Volatile: otherwise the compiler folds the compile-time zeroes into the code.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

/// Target tgids given on the command line (value unused).
#[map]
pub static TARGET_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(64, 0);

/// mm_struct address -> the target tgid that owns it. Filled by the programs themselves.
#[map]
pub static TARGET_MMS: HashMap<u64, u32> = HashMap::with_max_entries(256, 0);

/// Slot 0: the target tgid whose mm the tracer is discovering right now (0 when none).
#[map]
pub static DISCOVER: Array<u32> = Array::with_max_entries(1, 0);

/// Comm of outside lockers (tgid -> comm), so the report can name a reader that already exited.
#[map]
pub static LOCKER_COMMS: HashMap<u32, [u8; 16]> = HashMap::with_max_entries(1024, 0);

/// Per-(thread, mm) lock state while a lock operation is in progress (deleted when idle). LRU so
/// that threads dying mid-lock cannot fill it.
#[map]
pub static LOCK_STATE: LruHashMap<StateKey, LockState> = LruHashMap::with_max_entries(16384, 0);

/// Aggregated waits and holds per stack (max_entries set by user space).
#[map]
pub static AGG: PerCpuHashMap<AggKey, AggValue> = PerCpuHashMap::with_max_entries(10240, 0);

#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

#[map]
pub static TOTALS: PerCpuArray<ModeTotals> = PerCpuArray::with_max_entries(TOTALS_SLOTS, 0);

#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Slot 0 non-zero once AGG refused an insert: from then on only existing keys are updated, so
/// a full map costs a lookup and nothing more (perf lock contention once slowed targets 4x by
/// retrying inserts into a full map).
#[map]
pub static AGG_FULL: Array<u32> = Array::with_max_entries(1, 0);

/// Slot 0 non-zero while tracing: set once every program is attached and cleared before any is
/// detached, so that attaching and detaching one program at a time cannot leave half-seen lock
/// operations (thousands a second on a busy target).
#[map]
pub static ARMED: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn armed() -> bool {
    ARMED.get(0).is_some_and(|on| *on != 0)
}

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        unsafe { *slot += 1 };
    }
}
