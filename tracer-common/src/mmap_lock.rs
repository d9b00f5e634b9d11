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

/// Entries of the THREAD_STATES array (a power of two), as many as LOCK_STATE holds.
pub const THREAD_STATE_SLOTS: u32 = 16384;
/// Entries searched for a thread's state, from its index on: a thread holds one per mm it
/// locks (its own, a target's it reads as an outside locker), and threads whose tids are
/// THREAD_STATE_SLOTS apart share an index.
pub const THREAD_STATE_PROBES: u32 = 4;

/// The `probe`th entry searched for `tid`'s state: from a hash of the tid, since tids come
/// in runs (a pool's threads, created together), and a run of taken entries would leave a
/// thread whose tid is a multiple of THREAD_STATE_SLOTS away no room within its probes.
#[inline(always)]
pub fn thread_state_index(tid: u32, probe: u32) -> u32 {
    // Fibonacci hashing: the top bits of the product spread consecutive tids apart.
    const BITS: u32 = THREAD_STATE_SLOTS.trailing_zeros();
    let start = tid.wrapping_mul(0x9E37_79B9) >> (32 - BITS);
    start.wrapping_add(probe) & (THREAD_STATE_SLOTS - 1)
}

/// A THREAD_STATES entry: the lock state of the (thread, mm) that took it, found by index
/// instead of by hash (LOCK_STATE) on every lock event, with target slots. A thread keeps its
/// entries until it exits (and, when the trace is disarmed by then, until user space has
/// folded what they hold).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadState {
    /// tid 0: free.
    pub key: StateKey,
    /// Atomic adds of the threads that found the entry free and tried to take it: the one
    /// whose add made it 1 took it (reset to 0 when the entry is freed).
    pub claims: u64,
    pub state: crate::LockState,
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding (LockState's own).
unsafe impl aya::Pod for ThreadState {}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Places each tid in the first free entry of its probes, as tracer-ebpf's thread_states
    /// does; returns how many found none.
    fn place(taken: &mut [bool], tids: impl Iterator<Item = u32>) -> usize {
        let mut homeless = 0;
        for tid in tids {
            let free = (0..THREAD_STATE_PROBES)
                .map(|probe| thread_state_index(tid, probe) as usize)
                .find(|&index| !taken[index]);
            match free {
                Some(index) => taken[index] = true,
                None => homeless += 1,
            }
        }
        homeless
    }

    #[test]
    fn a_pool_of_threads_and_one_a_wrap_of_the_array_later_all_find_entries() {
        let mut taken = [false; THREAD_STATE_SLOTS as usize];
        // A pool created together, still alive when the tids have gone once round the array.
        assert_eq!(place(&mut taken, 5_000..5_500), 0);
        let later = 5_000 + THREAD_STATE_SLOTS;
        assert_eq!(place(&mut taken, later..later + 500), 0);
    }

    #[test]
    fn thread_state_indices_stay_within_the_array() {
        for tid in [0, 1, 4_095, 16_383, 16_384, 4_194_303, u32::MAX] {
            for probe in 0..THREAD_STATE_PROBES {
                assert!(thread_state_index(tid, probe) < THREAD_STATE_SLOTS);
            }
        }
    }
}
