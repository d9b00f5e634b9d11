//! What the programs left pending when the trace ended: the last wait and hold of threads that
//! did not step outside the lock again before it ended (their aggregation is done at that step,
//! not inside the critical section; see tracer-ebpf's `pending`). Folded into the harvest here
//! exactly as the programs would have: the durations into their entries, the wait charged in
//! equal shares to the holds it queued behind.

use std::collections::hash_map::{Entry, HashMap};

use tracer_common::{
    log2_slot, AggKey, AggValue, BlockKey, BlockValue, Counter, HoldId, HolderKey, LockState,
    PendingAgg, HIST_SLOTS, MAX_BLOCKERS,
};

use crate::model::{Harvest, RawEntry};

/// Adds the pending parts of `states` (the target mms' lock states) to `harvest`;
/// `holder_record` finds a blocking hold's record as HOLDER_INFO kept it. A new key beyond
/// `capacity` (AGG's, which BLOCKED shares) is lost and counted, as the full map would have.
pub fn fold(
    harvest: &mut Harvest,
    states: &[LockState],
    capacity: usize,
    holder_record: impl Fn(&HoldId) -> Option<HolderKey>,
) {
    let mut entries: HashMap<AggKey, usize> = harvest
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.key, i))
        .collect();
    let mut blocked: HashMap<BlockKey, usize> = harvest
        .blocked
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (*k, i))
        .collect();
    let (mut missing, mut agg_full, mut blocked_full) = (0, 0, 0);
    for st in states {
        for pending in [&st.pending_wait, &st.pending_holds[0], &st.pending_holds[1]] {
            if pending.is_some() && !add_entry(harvest, &mut entries, pending, capacity) {
                agg_full += 1;
            }
        }
        let wait = &st.pending_wait;
        let n = st.blockers.count as usize;
        if !wait.is_some() || n == 0 || n > MAX_BLOCKERS {
            continue;
        }
        for i in 0..n {
            let (hold, mode) = st.blockers.charged_hold(i);
            let holder = holder_record(&hold).unwrap_or_else(|| {
                missing += 1;
                HolderKey::unknown(hold.tid, mode)
            });
            let key = BlockKey {
                waiter: wait.key,
                holder,
            };
            let at = match blocked.entry(key) {
                Entry::Occupied(at) => *at.get(),
                Entry::Vacant(_) if harvest.blocked.len() >= capacity => {
                    blocked_full += 1;
                    continue;
                }
                Entry::Vacant(slot) => {
                    harvest.blocked.push((key, BlockValue::default()));
                    *slot.insert(harvest.blocked.len() - 1)
                }
            };
            let value = &mut harvest.blocked[at].1;
            value.count += 1;
            value.wait_ns += wait.ns / n as u64;
        }
    }
    for (counter, n) in [
        (Counter::HolderStackMissing, missing),
        (Counter::AggMapFull, agg_full),
        (Counter::BlockedMapFull, blocked_full),
    ] {
        if n > 0 {
            add_counter(harvest, counter, n);
        }
    }
}

/// False when `p` needed a new entry and there was no room.
fn add_entry(
    harvest: &mut Harvest,
    entries: &mut HashMap<AggKey, usize>,
    p: &PendingAgg,
    capacity: usize,
) -> bool {
    let at = match entries.entry(p.key) {
        Entry::Occupied(at) => *at.get(),
        Entry::Vacant(_) if harvest.entries.len() >= capacity => {
            return false;
        }
        Entry::Vacant(slot) => {
            harvest
                .entries
                .push(RawEntry::exact(p.key, AggValue::default()));
            *slot.insert(harvest.entries.len() - 1)
        }
    };
    let value = &mut harvest.entries[at].value;
    value.count += p.count;
    value.total_ns += p.ns;
    value.max_ns = value.max_ns.max(p.ns);
    value.hist[log2_slot(p.ns) & (HIST_SLOTS - 1)] += p.count;
    if p.key.kind == tracer_common::KIND_WAIT {
        value.contended_ns += p.parts[0];
    } else {
        value.runnable_ns += p.parts[0];
        value.sleeping_ns += p.parts[1];
        value.uninterruptible_ns += p.parts[2];
    }
    true
}

fn add_counter(harvest: &mut Harvest, counter: Counter, n: u64) {
    match harvest.counters.iter_mut().find(|(c, _)| *c == counter) {
        Some((_, total)) => *total += n,
        None => harvest.counters.push((counter, n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{HolderRef, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE, NO_STACK};

    fn key(kind: u8, tid: u32) -> AggKey {
        AggKey {
            pid: 7,
            tid,
            locker_pid: 0,
            kernel_stack: NO_STACK,
            user_stack: NO_STACK,
            kind,
            mode: MODE_WRITE,
            syscall: 1,
            fault: 0,
        }
    }

    fn pending(kind: u8, tid: u32, ns: u64, parts: [u64; 3]) -> PendingAgg {
        PendingAgg {
            key: key(kind, tid),
            count: 1,
            ns,
            parts,
        }
    }

    #[test]
    fn pending_durations_join_their_entries_or_make_new_ones() {
        let mut harvest = Harvest::default();
        let mut existing = AggValue::default();
        existing.add(100);
        harvest
            .entries
            .push(RawEntry::exact(key(KIND_WAIT, 1), existing));
        let mut st = LockState::ZERO;
        st.pending_wait = pending(KIND_WAIT, 1, 5000, [3000, 0, 0]);
        st.pending_holds[1] = pending(KIND_HOLD, 1, 700, [10, 20, 5]);
        fold(&mut harvest, &[st, LockState::ZERO], 100, |_| None);
        assert_eq!(harvest.entries.len(), 2);
        let wait = &harvest.entries[0].value;
        assert_eq!((wait.count, wait.total_ns, wait.max_ns), (2, 5100, 5000));
        assert_eq!(wait.contended_ns, 3000);
        assert_eq!(wait.hist[log2_slot(5000)], 1);
        let hold = &harvest.entries[1].value;
        assert_eq!((hold.count, hold.total_ns), (1, 700));
        assert_eq!(
            (hold.runnable_ns, hold.sleeping_ns, hold.uninterruptible_ns),
            (10, 20, 5)
        );
        assert!(harvest.blocked.is_empty(), "no blockers, no charge");
    }

    #[test]
    fn a_new_key_past_the_map_capacity_is_counted_not_added() {
        let mut harvest = Harvest::default();
        let mut st = LockState::ZERO;
        st.pending_wait = pending(KIND_WAIT, 1, 5000, [0; 3]);
        st.pending_holds[0] = pending(KIND_HOLD, 1, 700, [0; 3]);
        fold(&mut harvest, &[st], 1, |_| None);
        assert_eq!(harvest.entries.len(), 1);
        assert_eq!(harvest.counters, vec![(Counter::AggMapFull, 1)]);
    }

    #[test]
    fn a_pending_wait_is_charged_to_its_blockers_in_equal_shares() {
        let mut harvest = Harvest::default();
        let mut st = LockState::ZERO;
        st.pending_wait = pending(KIND_WAIT, 1, 900, [0; 3]);
        st.blockers.count = 2;
        st.blockers.write_mask = 0b01;
        st.blockers.refs[0] = HolderRef {
            tid: 2,
            blocked: 1,
            hold_start_ns: 50,
        };
        st.blockers.refs[1] = HolderRef {
            tid: 3,
            blocked: 1,
            hold_start_ns: 60,
        };
        let known = HolderKey {
            kernel_stack: 4,
            ..HolderKey::unknown(2, MODE_WRITE)
        };
        fold(&mut harvest, &[st], 100, |id| {
            (id.tid == 2 && id.hold_start_ns == 50).then_some(known)
        });
        assert_eq!(harvest.blocked.len(), 2);
        assert_eq!(harvest.blocked[0].0.holder, known);
        assert_eq!(
            harvest.blocked[1].0.holder,
            HolderKey::unknown(3, MODE_READ)
        );
        for (_, value) in &harvest.blocked {
            assert_eq!((value.count, value.wait_ns), (1, 450));
        }
        assert_eq!(
            harvest.counters,
            vec![(Counter::HolderStackMissing, 1)],
            "the holder without a record is counted"
        );
    }
}
