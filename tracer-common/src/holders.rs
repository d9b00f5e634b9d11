//! Who holds a target's mmap_lock right now, so that a wait can be charged to its holders.
//!
//! One `Holders` value per mm lives in a kernel hash map and is updated in place by every
//! acquire and release. Updates from two CPUs at once are not atomic: a lost or doubled slot
//! costs one attribution, never a crash or a wrong duration (durations come from `LockState`).

use crate::{AggKey, NO_STACK};

/// Readers tracked per mm; more concurrent readers are counted as overflow.
pub const MAX_READERS: usize = 8;
/// Holders remembered by one waiter (the writer, or up to this many readers).
pub const MAX_BLOCKERS: usize = 4;

/// One holder of the lock: which thread, since when (the pair identifies the hold).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HolderRef {
    pub tid: u32,
    /// Non-zero when someone waited behind this hold: its stacks are worth taking at release.
    pub blocked: u32,
    pub hold_start_ns: u64,
}

/// `hold_start_ns` of a reference to a writer that was still queued when the waiter began:
/// its hold is found through the writer's last blocking write hold (see `LAST_HOLD`).
pub const QUEUED: u64 = 0;
/// `hold_start_ns` under which a holder's most recent blocking write hold is also kept.
pub const LAST_HOLD: u64 = u64::MAX;

const NO_REF: HolderRef = HolderRef {
    tid: 0,
    blocked: 0,
    hold_start_ns: 0,
};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub writer: HolderRef,
    /// The oldest writer waiting for the lock: readers arriving behind it wait for its hold too
    /// (the rwsem queues them after it), the convoy of readers behind a writer behind readers.
    pub queued_writer: HolderRef,
    pub readers: [HolderRef; MAX_READERS],
    /// Reader holds that found no free slot (their waiters are charged to nobody).
    pub reader_overflow: u64,
}

/// The holders one waiter found when it started waiting.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Blockers {
    /// First, beside the fields of LockState that every operation touches: an operation that
    /// never slept reads the count alone.
    pub count: u32,
    /// Bit i set: refs[i] is a writer (held or queued); else a reader.
    pub write_mask: u32,
    pub refs: [HolderRef; MAX_BLOCKERS],
}

impl Blockers {
    /// The hold the `i`th blocker's share of a wait is charged to (its record in HOLDER_INFO),
    /// and its mode. A writer that was still queued when the wait began is found through its
    /// latest blocking write hold.
    #[inline(always)]
    pub fn charged_hold(&self, i: usize) -> (crate::HoldId, u8) {
        let r = self.refs[i % MAX_BLOCKERS];
        let mode = if self.write_mask & (1 << i) != 0 {
            crate::MODE_WRITE
        } else {
            crate::MODE_READ
        };
        let hold_start_ns = if r.hold_start_ns == QUEUED {
            LAST_HOLD
        } else {
            r.hold_start_ns
        };
        let id = crate::HoldId {
            tid: r.tid,
            _pad: 0,
            hold_start_ns,
        };
        (id, mode)
    }

    pub const ZERO: Blockers = Blockers {
        count: 0,
        write_mask: 0,
        refs: [HolderRef {
            tid: 0,
            blocked: 0,
            hold_start_ns: 0,
        }; MAX_BLOCKERS],
    };
}

impl Holders {
    pub const ZERO: Holders = Holders {
        writer: NO_REF,
        queued_writer: NO_REF,
        readers: [NO_REF; MAX_READERS],
        reader_overflow: 0,
    };

    /// A writer begins to wait; only the oldest queued writer is remembered.
    #[inline(always)]
    pub fn queue_writer(&mut self, tid: u32) {
        if self.queued_writer.tid == 0 {
            self.queued_writer = HolderRef {
                tid,
                blocked: 0,
                hold_start_ns: QUEUED,
            };
        }
    }

    /// A writer stops waiting without the lock (interrupted, or its trylock missed).
    #[inline(always)]
    pub fn unqueue_writer(&mut self, tid: u32) {
        if self.queued_writer.tid == tid {
            self.queued_writer = NO_REF;
        }
    }

    /// Records a new hold. Returns false when every reader slot was taken.
    #[inline(always)]
    pub fn add(&mut self, write: bool, tid: u32, now: u64) -> bool {
        let hold = HolderRef {
            tid,
            blocked: 0,
            hold_start_ns: now,
        };
        if write {
            // A queued writer that readers waited behind keeps that mark into its hold.
            let blocked = if self.queued_writer.tid == tid {
                let blocked = self.queued_writer.blocked;
                self.queued_writer = NO_REF;
                blocked
            } else {
                0
            };
            self.writer = HolderRef { blocked, ..hold };
            return true;
        }
        // Start probing at a slot picked by tid, so that two CPUs adding readers at once
        // rarely pick the same slot.
        let first = tid as usize;
        for i in 0..MAX_READERS {
            let slot = &mut self.readers[(first + i) % MAX_READERS];
            if slot.tid == 0 {
                *slot = hold;
                return true;
            }
        }
        self.reader_overflow += 1;
        false
    }

    /// Ends `tid`'s hold and returns it (with its `blocked` mark), if it was recorded.
    #[inline(always)]
    pub fn remove(&mut self, write: bool, tid: u32) -> Option<HolderRef> {
        if write {
            if self.writer.tid != tid {
                return None;
            }
            return Some(core::mem::take(&mut self.writer));
        }
        let first = tid as usize;
        for i in 0..MAX_READERS {
            let slot = &mut self.readers[(first + i) % MAX_READERS];
            if slot.tid == tid {
                return Some(core::mem::take(slot));
            }
        }
        None
    }

    /// The holders a new waiter waits behind: the writer if there is one; else, for a reader,
    /// the queued writer it will wait for, then the readers (up to MAX_BLOCKERS in all). Each
    /// is marked as having blocked someone. A reader with neither a writer holding nor one
    /// queued waits behind nobody: the rwsem lets it in beside the other readers.
    #[inline(always)]
    pub fn blockers_of(&mut self, waiter_tid: u32, waiter_writes: bool) -> Blockers {
        let mut out = Blockers::default();
        self.fill_blockers(waiter_tid, waiter_writes, &mut out);
        out
    }

    /// `blockers_of` into `out` (its refs past the count are left as they were): the eBPF
    /// programs fill the waiter's state in place rather than copy 72 bytes through their stack.
    #[inline(always)]
    pub fn fill_blockers(&mut self, waiter_tid: u32, waiter_writes: bool, out: &mut Blockers) {
        out.count = 0;
        out.write_mask = 0;
        if self.writer.tid != 0 && self.writer.tid != waiter_tid {
            self.writer.blocked = 1;
            out.refs[0] = self.writer;
            out.count = 1;
            out.write_mask = 1;
            return;
        }
        let queued = self.queued_writer.tid;
        if !waiter_writes && queued != 0 && queued != waiter_tid {
            self.queued_writer.blocked = 1;
            out.refs[0] = self.queued_writer;
            out.count = 1;
            out.write_mask = 1;
        }
        if !waiter_writes && out.count == 0 {
            return;
        }
        for i in 0..MAX_READERS {
            let slot = &mut self.readers[i];
            if slot.tid == 0 || slot.tid == waiter_tid || out.count as usize >= MAX_BLOCKERS {
                continue;
            }
            slot.blocked = 1;
            out.refs[out.count as usize & (MAX_BLOCKERS - 1)] = *slot;
            out.count += 1;
        }
    }
}

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

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for HoldId {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for HolderKey {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for HolderRecord {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for BlockKey {}
#[cfg(feature = "user")]
// SAFETY: #[repr(C)], Copy, integers only, explicit padding.
unsafe impl aya::Pod for BlockValue {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_blocks_waiters_and_is_marked() {
        let mut h = Holders::default();
        assert!(h.add(true, 10, 100));
        let b = h.blockers_of(20, false);
        assert_eq!((b.count, b.write_mask), (1, 1));
        assert_eq!((b.refs[0].tid, b.refs[0].hold_start_ns), (10, 100));
        let gone = h.remove(true, 10).unwrap();
        assert_eq!(gone.blocked, 1, "the release knows it blocked someone");
        assert_eq!(h.writer, HolderRef::default());
        assert_eq!(h.blockers_of(20, true).count, 0);
    }

    #[test]
    fn readers_are_tracked_up_to_the_bound() {
        let mut h = Holders::default();
        for tid in 1..=MAX_READERS as u32 {
            assert!(h.add(false, tid, tid as u64));
        }
        assert!(!h.add(false, 99, 1), "no free slot");
        assert_eq!(h.reader_overflow, 1);
        let b = h.blockers_of(500, true);
        assert_eq!(b.count as usize, MAX_BLOCKERS);
        assert_eq!(b.write_mask, 0);
        assert!(h.remove(false, 99).is_none());
        let r = h.remove(false, 3).unwrap();
        assert_eq!(r.hold_start_ns, 3);
        assert!(h.add(false, 99, 7), "a freed slot is reused");
    }

    #[test]
    fn a_waiter_is_not_blocked_by_itself_and_unmarked_holds_stay_unmarked() {
        let mut h = Holders::default();
        h.add(false, 5, 1);
        h.add(false, 6, 2);
        let b = h.blockers_of(5, true);
        assert_eq!(b.count, 1);
        assert_eq!(b.refs[0].tid, 6);
        assert_eq!(h.remove(false, 5).unwrap().blocked, 0);
        assert_eq!(h.remove(false, 6).unwrap().blocked, 1);
    }

    #[test]
    fn a_reader_among_readers_waits_behind_nobody() {
        let mut h = Holders::default();
        h.add(false, 5, 1);
        h.add(false, 6, 2);
        let b = h.blockers_of(7, false);
        assert_eq!(b.count, 0, "the rwsem lets a reader in beside readers");
        // Nobody was blocked, so neither release needs its stacks kept.
        assert_eq!(h.remove(false, 5).unwrap().blocked, 0);
        assert_eq!(h.remove(false, 6).unwrap().blocked, 0);
    }

    #[test]
    fn readers_behind_a_queued_writer_wait_for_it_too() {
        let mut h = Holders::default();
        h.add(false, 1, 10);
        h.queue_writer(2);
        h.queue_writer(3); // a younger writer: the oldest stays the one readers queue behind
        let b = h.blockers_of(4, false);
        assert_eq!((b.count, b.write_mask), (2, 0b01));
        assert_eq!((b.refs[0].tid, b.refs[0].hold_start_ns), (2, QUEUED));
        assert_eq!(b.refs[1].tid, 1);
        // A writer arriving now waits for the holders only.
        let w = h.blockers_of(5, true);
        assert_eq!((w.count, w.refs[0].tid), (1, 1));
        // The queued writer acquires: its hold carries the mark, the queue slot frees.
        h.remove(false, 1);
        h.add(true, 2, 20);
        assert_eq!((h.writer.tid, h.writer.blocked), (2, 1));
        assert_eq!(h.queued_writer.tid, 0);
    }

    #[test]
    fn an_interrupted_writer_leaves_the_queue() {
        let mut h = Holders::default();
        h.queue_writer(2);
        h.unqueue_writer(3);
        assert_eq!(h.queued_writer.tid, 2);
        h.unqueue_writer(2);
        assert_eq!(h.blockers_of(4, false).count, 0);
    }

    #[test]
    fn removing_someone_else_changes_nothing() {
        let mut h = Holders::default();
        h.add(true, 1, 1);
        assert!(h.remove(true, 2).is_none());
        assert_eq!(h.writer.tid, 1);
    }
}
