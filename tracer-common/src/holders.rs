//! Who holds a target's mmap_lock right now, so that a wait can be charged to its holders.
//!
//! One `Holders` value per mm lives in a kernel hash map and is updated in place by every
//! acquire and release. Updates from two CPUs at once are not atomic: a lost or doubled slot
//! costs one attribution, never a crash or a wrong duration (durations come from `LockState`).

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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub writer: HolderRef,
    pub readers: [HolderRef; MAX_READERS],
    /// Reader holds that found no free slot (their waiters are charged to nobody).
    pub reader_overflow: u64,
}

/// The holders one waiter found when it started waiting.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Blockers {
    pub refs: [HolderRef; MAX_BLOCKERS],
    pub count: u32,
    /// Non-zero when the one blocker is a writer; else every blocker is a reader.
    pub writer: u32,
}

impl Blockers {
    pub const ZERO: Blockers = Blockers {
        refs: [HolderRef {
            tid: 0,
            blocked: 0,
            hold_start_ns: 0,
        }; MAX_BLOCKERS],
        count: 0,
        writer: 0,
    };
}

impl Holders {
    pub const ZERO: Holders = Holders {
        writer: HolderRef {
            tid: 0,
            blocked: 0,
            hold_start_ns: 0,
        },
        readers: [HolderRef {
            tid: 0,
            blocked: 0,
            hold_start_ns: 0,
        }; MAX_READERS],
        reader_overflow: 0,
    };

    /// Records a new hold. Returns false when every reader slot was taken.
    #[inline(always)]
    pub fn add(&mut self, write: bool, tid: u32, now: u64) -> bool {
        let hold = HolderRef {
            tid,
            blocked: 0,
            hold_start_ns: now,
        };
        if write {
            self.writer = hold;
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

    /// The holders a new waiter waits behind: the writer if there is one, else the readers
    /// (up to MAX_BLOCKERS). Each is marked as having blocked someone.
    #[inline(always)]
    pub fn blockers_of(&mut self, waiter_tid: u32) -> Blockers {
        let mut out = Blockers::default();
        if self.writer.tid != 0 && self.writer.tid != waiter_tid {
            self.writer.blocked = 1;
            out.refs[0] = self.writer;
            out.count = 1;
            out.writer = 1;
            return out;
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_blocks_waiters_and_is_marked() {
        let mut h = Holders::default();
        assert!(h.add(true, 10, 100));
        let b = h.blockers_of(20);
        assert_eq!((b.count, b.writer), (1, 1));
        assert_eq!((b.refs[0].tid, b.refs[0].hold_start_ns), (10, 100));
        let gone = h.remove(true, 10).unwrap();
        assert_eq!(gone.blocked, 1, "the release knows it blocked someone");
        assert_eq!(h.writer, HolderRef::default());
        assert_eq!(h.blockers_of(20).count, 0);
    }

    #[test]
    fn readers_are_tracked_up_to_the_bound() {
        let mut h = Holders::default();
        for tid in 1..=MAX_READERS as u32 {
            assert!(h.add(false, tid, tid as u64));
        }
        assert!(!h.add(false, 99, 1), "no free slot");
        assert_eq!(h.reader_overflow, 1);
        let b = h.blockers_of(500);
        assert_eq!(b.count as usize, MAX_BLOCKERS);
        assert_eq!(b.writer, 0);
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
        let b = h.blockers_of(5);
        assert_eq!(b.count, 1);
        assert_eq!(b.refs[0].tid, 6);
        assert_eq!(h.remove(false, 5).unwrap().blocked, 0);
        assert_eq!(h.remove(false, 6).unwrap().blocked, 1);
    }

    #[test]
    fn removing_someone_else_changes_nothing() {
        let mut h = Holders::default();
        h.add(true, 1, 1);
        assert!(h.remove(true, 2).is_none());
        assert_eq!(h.writer.tid, 1);
    }
}
