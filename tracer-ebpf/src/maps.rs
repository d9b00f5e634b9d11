//! Maps shared by the programs, the load-time configuration, and small accessors.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, StackTrace},
};
use core::{
    intrinsics::{atomic_xadd, AtomicOrdering},
    ptr::addr_of_mut,
};

use tracer_common::{
    log2_slot, AggKey, AggValue, Config, Counter, LockState, ModeTotals, StateKey, COUNTER_SLOTS,
    HIST_SLOTS, PER_THREAD_ALWAYS, PER_THREAD_WHILE_ROOM, TOTALS_SLOTS,
};

/// Overridden by user space at load time (`EbpfLoader::set_global`).
#[unsafe(no_mangle)]
static CONFIG: Config = Config::ZERO;

/// The load-time configuration. Only the address is read volatile, so that the compiler cannot
/// fold the compile-time zeroes into the code, yet loads only the fields a program uses (a
/// volatile read of the whole struct copied its 200-odd bytes to the stack at every call). The
/// verifier still sees each load from the frozen read-only map and prunes what it disables.
#[inline(always)]
pub fn config() -> &'static Config {
    let address: *const Config = &CONFIG;
    unsafe { &*core::ptr::read_volatile(&address) }
}

/// Per-(thread, mm) lock state while a lock operation is in progress (deleted when idle). LRU so
/// that threads dying mid-lock cannot fill it.
#[map]
pub static LOCK_STATE: LruHashMap<StateKey, LockState> = LruHashMap::with_max_entries(16384, 0);

/// Aggregated waits and holds per stack (max_entries set by user space). Shared by all CPUs
/// and updated with atomic adds: a per-CPU hash of 568-byte values took 11.6 MB here and
/// would take 1.5 GB on a machine with 256 possible CPUs.
#[map]
pub static AGG: HashMap<AggKey, AggValue> = HashMap::with_max_entries(10240, 0);

#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

#[map]
pub static TOTALS: PerCpuArray<ModeTotals> = PerCpuArray::with_max_entries(TOTALS_SLOTS, 0);

#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// One slot per growable map (FULL_AGG, FULL_BLOCKED, FULL_SLEEPS, FULL_WAKERS), non-zero once it refused an
/// insert: from then on only existing keys are updated, so a full map costs a lookup and
/// nothing more (perf lock contention once slowed targets 4x by retrying inserts).
#[map]
pub static MAP_FULL: Array<u32> = Array::with_max_entries(4, 0);
pub const FULL_AGG: u32 = 0;
pub const FULL_BLOCKED: u32 = 1;
pub const FULL_SLEEPS: u32 = 2;
pub const FULL_WAKERS: u32 = 3;

/// Threads holding a target's lock (tid -> mm, 0 when not holding), so that sched_switch finds
/// their state. Overwritten in place, so one insert per thread; LRU so that exited threads'
/// entries make room.
#[map]
pub static TID_HOLDING: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// Slot 0 non-zero while tracing: set once every program is attached and cleared before any is
/// detached, so that attaching and detaching one program at a time cannot leave half-seen lock
/// operations (thousands a second on a busy target).
#[map]
pub static ARMED: Array<u32> = Array::with_max_entries(1, 0);

/// Keys inserted into AGG and BLOCKED (KEYS_AGG, KEYS_BLOCKED), counted at insert: a racing
/// insert of the same key counts twice, so the count folds a little early, never late.
#[map]
pub static KEY_COUNTS: Array<u64> = Array::with_max_entries(2, 0);

/// Whether a new key of the map counted in `slot` keeps the locking thread's id.
#[inline(always)]
pub fn keeps_thread(slot: u32) -> bool {
    let cfg = config();
    match cfg.per_thread {
        PER_THREAD_ALWAYS => true,
        PER_THREAD_WHILE_ROOM => KEY_COUNTS
            .get(slot)
            .is_some_and(|keys| *keys < cfg.fold_threads_at as u64),
        _ => false,
    }
}

#[inline(always)]
pub fn count_key(slot: u32) {
    if let Some(keys) = KEY_COUNTS.get_ptr_mut(slot) {
        atomic_add(keys, 1);
    }
}

/// When the trace was armed (bpf_ktime_get_ns clock), set by user space just before ARMED.
#[map]
pub static TRACE_START: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn armed() -> bool {
    ARMED.get(0).is_some_and(|on| *on != 0)
}

#[inline(always)]
pub fn count(counter: Counter) {
    add_to(&COUNTERS, counter as u32, 1);
}

#[inline(always)]
pub fn add_to(array: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(slot) = array.get_ptr_mut(index) {
        unsafe { *slot += n };
    }
}

/// Insert only if absent (bpf_map_update_elem's flags).
pub const BPF_NOEXIST: u64 = 1;
/// An array map flag: its values start on a page boundary instead of after the map's header,
/// which puts a value of 64 bytes in one cache line rather than astride two (the header of a
/// plain array ends 56 bytes into a line on 6.18). The hot path's arrays are created with it;
/// nothing maps them.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
const E2BIG: i32 = 7;
/// The key is already there, or (STACKS) its bucket holds another stack.
pub const EEXIST: i32 = 17;

/// Adds `n` to a counter of a map value shared by all CPUs.
#[inline(always)]
pub fn atomic_add(field: *mut u64, n: u64) {
    // Most off-CPU and contended parts are 0: an atomic add of nothing still takes the cache
    // line from the other CPUs.
    if n == 0 {
        return;
    }
    // SAFETY: `field` points into a map value, 8-byte aligned, which lives as long as the map.
    // The intrinsic rather than AtomicU64: the BPF target does not enable core's atomics, yet
    // its instruction set has the atomic add (BPF_ATOMIC | BPF_ADD) this lowers to.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(field, n) };
}

/// Raises a shared maximum. Not atomic: two CPUs racing can keep the smaller of their two
/// values, never a value that was not seen (BPF has no portable compare-and-swap loop).
#[inline(always)]
pub fn raise_max(field: *mut u64, n: u64) {
    unsafe {
        if n > *field {
            *field = n;
        }
    }
}

/// Adds one duration to a shared aggregation value. Its count is left at 0: user space takes
/// it from the histogram (one more atomic add, on a cache line both CPUs write, per event).
#[inline(always)]
pub fn add_duration(value: *mut AggValue, ns: u64) {
    unsafe {
        atomic_add(addr_of_mut!((*value).total_ns), ns);
        raise_max(addr_of_mut!((*value).max_ns), ns);
        // The mask is a no-op for real slots; it proves the index in bounds to the verifier.
        let slot = log2_slot(ns) & (HIST_SLOTS - 1);
        atomic_add(addr_of_mut!((*value).hist[slot]), 1);
    }
}

/// A copy of `key` on the calling program's stack. 6.1's verifier takes a map key only from the
/// stack or a map value, not from the memory a global function was handed (`R2 type=mem
/// expected=fp, ...`); a volatile read keeps LLVM from passing the original pointer on.
#[inline(always)]
pub fn on_stack<K: Copy>(key: &K) -> K {
    unsafe { core::ptr::read_volatile(key) }
}

/// The value of `key` in a hash map, inserted from `zero` when missing. A map that
/// once refused an insert (full) is only looked up from then on; losses count as `lost`.
#[inline(always)]
pub fn slot_of<K, V>(
    map: &HashMap<K, V>,
    key: &K,
    zero: &V,
    full_flag: u32,
    lost: Counter,
) -> Option<*mut V> {
    if let Some(value) = map.get_ptr_mut(key) {
        return Some(value);
    }
    if MAP_FULL.get(full_flag).is_some_and(|full| *full != 0) {
        count(lost);
        return None;
    }
    if let Err(err) = map.insert(key, zero, BPF_NOEXIST) {
        if -err == E2BIG {
            if let Some(full) = MAP_FULL.get_ptr_mut(full_flag) {
                unsafe { *full = 1 };
            }
        }
        // EEXIST: another CPU inserted the key first; the lookup below finds it.
        if -err != EEXIST {
            count(lost);
            return None;
        }
    }
    map.get_ptr_mut(key)
}
