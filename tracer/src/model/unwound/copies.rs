//! Pairing the kernel's user stack copies with the events that use them: a copy arrives when
//! its operation begins, its events as each wait or hold ends, on other CPUs' rings.

use std::collections::HashMap;

use tracer_common::{UserStackCopyHeader, UserStackEvent};

use super::UnwoundStack;

/// A copied user stack as the kernel sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackCopy {
    pub header: UserStackCopyHeader,
    /// Stack memory from `header.stack_start`.
    pub bytes: Vec<u8>,
}

/// What the user stack ring buffer carries, in order: a copy always comes before the events
/// that use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StackRecord {
    Copy(StackCopy),
    Event(UserStackEvent),
}

/// Copies not yet unwound kept at most (about 20 KiB each with the default window); beyond
/// it, the oldest go, and an event arriving for one of them keeps its frame-pointer stack.
const MAX_PENDING: usize = 512;

/// How the copies were used, for the closing log and the lost counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub copies: u64,
    /// Copies made at the end of an event, inside the critical section (not expected).
    pub late_copies: u64,
    pub events: u64,
    /// Events whose copy was no longer kept (evicted, or its record was dropped).
    pub events_without_copy: u64,
}

enum Pending {
    Raw(StackCopy),
    Unwound(UnwoundStack),
}

/// The latest copy of each thread, until the events that use it arrive. A thread runs one lock
/// operation at a time, so its next copy replaces the previous one.
#[derive(Default)]
pub struct PendingCopies {
    by_tid: HashMap<u32, (u64, Pending)>,
    pub stats: CopyStats,
}

impl PendingCopies {
    /// Copies not unwound yet, and their bytes (for -v).
    pub fn raw_held(&self) -> (usize, usize) {
        self.by_tid
            .values()
            .filter_map(|(_, pending)| match pending {
                Pending::Raw(copy) => Some(copy.bytes.len()),
                Pending::Unwound(_) => None,
            })
            .fold((0, 0), |(n, bytes), len| (n + 1, bytes + len))
    }

    pub fn add_copy(&mut self, copy: StackCopy) {
        self.stats.copies += 1;
        if self.by_tid.len() >= MAX_PENDING && !self.by_tid.contains_key(&copy.header.tid) {
            self.evict_oldest();
        }
        let (tid, id) = (copy.header.tid, copy.header.copy_id);
        self.by_tid.insert(tid, (id, Pending::Raw(copy)));
    }

    /// The unwound stack of `event`'s copy, unwinding it with `unwind` the first time.
    pub fn resolve(
        &mut self,
        event: &UserStackEvent,
        unwind: impl FnOnce(&StackCopy) -> UnwoundStack,
    ) -> Option<UnwoundStack> {
        self.stats.events += 1;
        self.stats.late_copies += event.late_copy as u64;
        let stack = match self.by_tid.get_mut(&event.tid) {
            Some((id, pending)) if *id == event.copy_id => {
                if let Pending::Raw(copy) = pending {
                    *pending = Pending::Unwound(unwind(copy));
                }
                match pending {
                    Pending::Unwound(stack) => Some(stack.clone()),
                    Pending::Raw(_) => unreachable!("unwound above"),
                }
            }
            _ => None,
        };
        if stack.is_none() {
            self.stats.events_without_copy += 1;
        } else if event.last_use != 0 {
            self.by_tid.remove(&event.tid);
        }
        stack
    }

    fn evict_oldest(&mut self) {
        let oldest = self.by_tid.iter().min_by_key(|(_, (id, _))| *id);
        if let Some(&tid) = oldest.map(|(tid, _)| tid) {
            self.by_tid.remove(&tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(addrs: &[u64], truncated: bool) -> UnwoundStack {
        UnwoundStack {
            addrs: addrs.to_vec(),
            truncated,
        }
    }

    fn copy(tid: u32, copy_id: u64) -> StackCopy {
        StackCopy {
            header: UserStackCopyHeader {
                tid,
                copy_id,
                ..UserStackCopyHeader::default()
            },
            bytes: vec![0; 8],
        }
    }

    fn use_of(tid: u32, copy_id: u64, last_use: bool) -> UserStackEvent {
        UserStackEvent {
            tid,
            copy_id,
            last_use: last_use as u8,
            duration_ns: 10,
            ..UserStackEvent::default()
        }
    }

    #[test]
    fn a_copy_is_unwound_once_for_all_its_events_and_freed_after_the_last() {
        let mut pending = PendingCopies::default();
        pending.add_copy(copy(1, 100));
        let mut unwinds = 0;
        let mut unwind = |_: &StackCopy| {
            unwinds += 1;
            stack(&[0xa, 0xb], false)
        };
        let wait = pending.resolve(&use_of(1, 100, false), &mut unwind);
        let hold = pending.resolve(&use_of(1, 100, true), &mut unwind);
        assert_eq!(wait, Some(stack(&[0xa, 0xb], false)));
        assert_eq!(hold, wait);
        assert_eq!(unwinds, 1);
        assert!(pending.by_tid.is_empty());
        assert_eq!(pending.stats.events, 2);
        assert_eq!(pending.stats.events_without_copy, 0);
    }

    #[test]
    fn events_for_a_replaced_or_unknown_copy_are_counted_not_guessed() {
        let mut pending = PendingCopies::default();
        pending.add_copy(copy(1, 100));
        pending.add_copy(copy(1, 200));
        let unwind = |_: &StackCopy| stack(&[1], false);
        assert_eq!(pending.resolve(&use_of(1, 100, true), unwind), None);
        assert_eq!(pending.resolve(&use_of(2, 100, true), unwind), None);
        assert!(pending.resolve(&use_of(1, 200, true), unwind).is_some());
        assert_eq!(pending.stats.copies, 2);
        assert_eq!(pending.stats.events_without_copy, 2);
    }

    #[test]
    fn the_oldest_copies_go_first_when_too_many_are_pending() {
        let mut pending = PendingCopies::default();
        for tid in 0..MAX_PENDING as u32 + 1 {
            pending.add_copy(copy(tid, 1000 + tid as u64));
        }
        assert_eq!(pending.by_tid.len(), MAX_PENDING);
        let unwind = |_: &StackCopy| stack(&[1], false);
        assert_eq!(pending.resolve(&use_of(0, 1000, true), unwind), None);
        assert!(pending.resolve(&use_of(1, 1001, true), unwind).is_some());
    }
}
