//! User stacks unwound in user space from copies the kernel made (`--user-stack dwarf`), and
//! how they join the kernel's aggregation.
//!
//! The kernel adds every wait and hold to its entry, keyed by the frame-pointer user stack. It
//! copies the user stack of a lock operation when its wait goes to sleep for the lock (or when
//! the sampler picks it at its start), and later sends an event record for each wait or hold of that
//! operation worth unwinding, naming the copy (`PendingCopies` pairs them). Each event carries
//! the key it was added under and its exact share of the entry (duration, slow-path and off-CPU
//! time), so an unwound event is *moved*: subtracted from its entry and added to an entry keyed
//! by the unwound stack. Events that were not copied (the copy budget was spent) are shared
//! among the entry's unwound stacks in the copied ones' proportions. Unwound stacks get synthetic ids (`UNWOUND_BASE` and up) that never
//! collide with stack-map ids, and ride in `Harvest::stacks` like any other stack.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use tracer_common::{
    AggKey, AggValue, BlockKey, BlockValue, Counter, SleepKey, UserStackEvent, KIND_HOLD, NO_STACK,
};

mod copies;
mod shares;

use super::{Harvest, HolderSig, RawEntry};
pub use copies::{CopyStats, PendingCopies, StackCopy, StackRecord};
use shares::{apportion, fitted_hist, split, spread};

/// First synthetic id of unwound stacks (stack-map ids are far below it).
pub const UNWOUND_BASE: i32 = 1 << 30;
/// Set in the ids of stacks whose unwinding stopped before the root.
const TRUNCATED_BIT: i32 = 1 << 29;

/// How an entry's user stack was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UserStackKind {
    /// Unwound with CFI (or frame pointers where CFI is missing) up to the thread's root.
    Dwarf,
    /// Frame pointers, walked by the kernel (bpf_get_stackid).
    Fp,
    /// Unwound, but stopped before the root (window too small, no unwind info).
    Truncated,
    /// No user stack.
    None,
}

impl UserStackKind {
    pub fn of(user_stack: i32) -> Self {
        match user_stack {
            NO_STACK => UserStackKind::None,
            id if id >= UNWOUND_BASE && id & TRUNCATED_BIT != 0 => UserStackKind::Truncated,
            id if id >= UNWOUND_BASE => UserStackKind::Dwarf,
            id if id >= 0 => UserStackKind::Fp,
            _ => UserStackKind::None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            UserStackKind::Dwarf => "dwarf",
            UserStackKind::Fp => "fp",
            UserStackKind::Truncated => "truncated",
            UserStackKind::None => "none",
        }
    }
}

/// An unwound stack: instruction pointer, then return addresses, innermost first (the same
/// convention as the kernel's stacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwoundStack {
    pub addrs: Vec<u64>,
    pub truncated: bool,
}

/// Completes a truncated unwound stack with the frame-pointer stack of the same event, when
/// both pass through the same return address after the first frame: CFI unwinding can stop
/// where frame pointers go on (a routine whose CFI the unwinder misreads in a program built
/// with frame pointers). The result is the unwound frames up to the last one they share, then
/// the frame-pointer frames beyond it. None when they share no such frame.
pub fn splice(unwound: &UnwoundStack, fp: &[u64]) -> Option<UnwoundStack> {
    if !unwound.truncated {
        return None;
    }
    let (at_unwound, at_fp) = unwound
        .addrs
        .iter()
        .enumerate()
        .skip(1)
        .rev()
        .find_map(|(i, addr)| Some((i, 1 + fp.get(1..)?.iter().position(|a| a == addr)?)))?;
    let tail = fp.get(at_fp + 1..)?;
    if tail.is_empty() {
        return None;
    }
    let mut addrs = unwound.addrs[..=at_unwound].to_vec();
    addrs.extend_from_slice(tail);
    Some(UnwoundStack {
        addrs,
        truncated: false,
    })
}

/// Every unwound event of the trace so far, summed per (kernel key, unwound stack).
#[derive(Clone, Debug, Default)]
pub struct Unwound {
    ids: HashMap<(Vec<u64>, bool), i32>,
    stacks: HashMap<i32, Vec<u64>>,
    moved: HashMap<(AggKey, i32), AggValue>,
    /// Events that could not be unwound because their copy was gone: counted with the
    /// kernel's `user_stack_copy_dropped`.
    without_copy: u64,
}

impl Unwound {
    /// Records one unwound event.
    pub fn add(&mut self, event: &UserStackEvent, stack: UnwoundStack) {
        if stack.addrs.is_empty() {
            return;
        }
        let id = self.intern(stack);
        let value = self.moved.entry((event.key, id)).or_default();
        value.add(event.duration_ns);
        value.contended_ns += event.contended_ns;
        value.runnable_ns += event.runnable_ns;
        value.sleeping_ns += event.sleeping_ns;
        value.uninterruptible_ns += event.uninterruptible_ns;
    }

    fn intern(&mut self, stack: UnwoundStack) -> i32 {
        let next = UNWOUND_BASE + self.ids.len() as i32;
        let flag = if stack.truncated { TRUNCATED_BIT } else { 0 };
        let key = (stack.addrs, stack.truncated);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = next | flag;
        self.stacks.insert(id, key.0.clone());
        self.ids.insert(key, id);
        id
    }

    pub fn events(&self) -> u64 {
        self.moved.values().map(|v| v.count).sum()
    }

    pub fn note_without_copy(&mut self, events: u64) {
        self.without_copy = events;
    }

    /// Moves the unwound events out of `harvest`'s entries into entries keyed by their unwound
    /// stacks, and adds those stacks. An entry left with no event is removed.
    pub fn apply_to(&self, harvest: &mut Harvest) {
        add_counter(harvest, Counter::UserStackCopyDropped, self.without_copy);
        let mut by_key: HashMap<AggKey, Vec<(i32, &AggValue)>> = HashMap::new();
        for ((key, id), value) in &self.moved {
            by_key.entry(*key).or_default().push((*id, value));
        }
        for moves in by_key.values_mut() {
            keep_largest_parts(moves);
        }
        let mut unwound: HashMap<AggKey, RawEntry> = HashMap::new();
        // Original key -> (key of its largest part, that part's total).
        let mut split_into: HashMap<AggKey, Parts> = HashMap::new();
        let mut estimated = HashSet::new();
        for entry in &mut harvest.entries {
            let Some(moves) = by_key.get(&entry.key) else {
                continue;
            };
            let original = entry.key;
            let original_max = (entry.value.max_ns, entry.max_is_upper_bound);
            let mut parts: Vec<(AggKey, AggValue)> = moves
                .iter()
                .map(|&(id, value)| {
                    let key = AggKey {
                        user_stack: id,
                        ..original
                    };
                    (key, take(entry, value))
                })
                .collect();
            // The spread events' maximum is not known per stack: a part that got some has a
            // bound, unless it got all of the entry's events, whose maximum is known.
            let mut bounded = vec![false; parts.len()];
            if entry.value.count > 0 {
                // Operations not copied because the copy budget was spent are a time sample's
                // complement: they take the unwound stacks in the copied ones' proportions.
                let received = spread(&std::mem::take(&mut entry.value), &mut parts);
                let got_some = parts.iter().zip(&received).filter(|(_, got)| **got);
                estimated.extend(got_some.map(|((key, _), _)| *key));
                bounded = received;
                if let [(_, only)] = &mut parts[..] {
                    (only.max_ns, bounded[0]) = original_max;
                }
            }
            for ((key, moved), &bounded) in parts.iter().zip(&bounded) {
                let part = RawEntry {
                    key: *key,
                    value: *moved,
                    max_is_upper_bound: bounded,
                };
                match unwound.get_mut(key) {
                    Some(into) => into.merge(&part),
                    None => {
                        unwound.insert(*key, part);
                    }
                }
                harvest
                    .stacks
                    .entry(key.user_stack)
                    .or_insert_with(|| self.stacks[&key.user_stack].clone());
            }
            let mut sizes: Parts = parts.iter().map(|(key, v)| (*key, v.total_ns)).collect();
            if entry.value.count > 0 {
                sizes.push((original, entry.value.total_ns));
            }
            split_into.insert(original, sizes);
        }
        split_side_tables(harvest, &split_into);
        harvest.entries.retain(|e| e.value.count > 0);
        harvest.entries.extend(unwound.into_values());
        harvest.estimated_user_stacks.extend(estimated);
    }
}

/// Unwound stacks kept apart per entry; the events of the others stay in the entry and are
/// shared among these as uncopied events are. The side tables pair a waiter's parts with its
/// holders' parts, so without a bound thousands of threads whose copies end at different depths
/// multiply into tens of millions of records (85 million, 8 GiB, seen with 2 001 threads).
const MAX_UNWOUND_PARTS: usize = 16;

/// A holder's unwound stacks a blocked-by record is shared among, the largest first.
const MAX_HOLDER_PARTS: usize = 4;

/// Keeps an entry's `MAX_UNWOUND_PARTS` largest parts by time (ties by stack id, so that the
/// choice does not depend on hashing).
fn keep_largest_parts(moves: &mut Vec<(i32, &AggValue)>) {
    moves.sort_unstable_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
    moves.truncate(MAX_UNWOUND_PARTS);
}

fn add_counter(harvest: &mut Harvest, counter: Counter, n: u64) {
    if n == 0 {
        return;
    }
    match harvest.counters.iter_mut().find(|(c, _)| *c == counter) {
        Some((_, total)) => *total += n,
        None => harvest.counters.push((counter, n)),
    }
}

/// The keys an entry was split into, each with its total time.
type Parts = Vec<(AggKey, u64)>;

/// The side tables keyed by entry (holders waited behind, waits a hold caused, where a hold
/// slept) are not per event, so they are split like their entries, in proportion to the parts'
/// total time: a waiter's record across the waiter's parts, then across its holder's parts.
fn split_side_tables(harvest: &mut Harvest, split_into: &HashMap<AggKey, Parts>) {
    let parts_of = |key: &AggKey| {
        split_into
            .get(key)
            .cloned()
            .unwrap_or_else(|| vec![(*key, 1)])
    };
    // Holds kept per thread (their keys carry the tid) split a holder's record over that
    // thread's own parts only.
    let mut holder_parts: HashMap<(HolderSig, u32), HashMap<i32, u64>> = HashMap::new();
    for (from, parts) in split_into.iter().filter(|(from, _)| from.kind == KIND_HOLD) {
        let stacks = holder_parts
            .entry((HolderSig::of_hold(from), from.tid))
            .or_default();
        for (key, ns) in parts {
            *stacks.entry(key.user_stack).or_default() += ns;
        }
    }
    let mut by_waiter: HashMap<AggKey, Vec<(BlockKey, BlockValue)>> = HashMap::new();
    for &(key, value) in &harvest.blocked {
        by_waiter.entry(key.waiter).or_default().push((key, value));
    }
    let mut blocked: HashMap<BlockKey, BlockValue> = HashMap::new();
    for (waiter, records) in &by_waiter {
        for (key, waiter_part, part) in split_records(records, &parts_of(waiter)) {
            let sig = HolderSig::of_holder(&key.holder);
            let holders: Vec<(i32, u64)> = holder_parts
                .get(&(sig, key.holder.tid))
                .or_else(|| holder_parts.get(&(sig, 0)))
                .map(largest_holder_parts)
                .unwrap_or_else(|| vec![(key.holder.user_stack, 1)]);
            for (user_stack, piece) in split_value(&part, &holders) {
                let mut into_key = key;
                into_key.waiter = waiter_part;
                into_key.holder.user_stack = user_stack;
                blocked.entry(into_key).or_default().merge(&piece);
            }
        }
    }
    harvest.blocked = blocked.into_iter().collect();
    let mut sleeps: HashMap<SleepKey, u64> = HashMap::new();
    for (key, ns) in &harvest.sleeps {
        let parts = parts_of(&key.hold);
        let weights: Vec<u64> = parts.iter().map(|p| p.1).collect();
        for ((hold, _), piece) in parts.iter().zip(split(*ns, &weights)) {
            if piece > 0 {
                *sleeps
                    .entry(SleepKey {
                        hold: *hold,
                        ..*key
                    })
                    .or_default() += piece;
            }
        }
    }
    harvest.sleeps = sleeps.into_iter().collect();
}

/// A holder's `MAX_HOLDER_PARTS` largest unwound stacks with their time (ties by stack id).
fn largest_holder_parts(stacks: &HashMap<i32, u64>) -> Vec<(i32, u64)> {
    let mut parts: Vec<(i32, u64)> = stacks.iter().map(|(&id, &ns)| (id, ns)).collect();
    parts.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    parts.truncate(MAX_HOLDER_PARTS);
    parts
}

/// One waiter's blocked-by records split over the waiter's parts in proportion to their time,
/// all records at once, so that no part is charged more waiting behind holders than it waited
/// (each record rounded on its own could add a nanosecond per record): returns (record key,
/// waiter part, its piece), empty pieces left out.
fn split_records(
    records: &[(BlockKey, BlockValue)],
    parts: &[(AggKey, u64)],
) -> Vec<(BlockKey, AggKey, BlockValue)> {
    let weights: Vec<u64> = parts.iter().map(|p| p.1).collect();
    let shared = |field: fn(&BlockValue) -> u64| {
        let columns: Vec<u64> = records.iter().map(|(_, v)| field(v)).collect();
        apportion(&columns, &split(columns.iter().sum(), &weights), &weights)
    };
    let (waits, counts) = (shared(|v| v.wait_ns), shared(|v| v.count));
    let mut pieces = Vec::new();
    for (i, (part, _)) in parts.iter().enumerate() {
        for (j, (key, _)) in records.iter().enumerate() {
            let piece = BlockValue {
                count: counts[i][j],
                wait_ns: waits[i][j],
            };
            if piece.count > 0 || piece.wait_ns > 0 {
                pieces.push((*key, *part, piece));
            }
        }
    }
    pieces
}

/// A blocked-by value split by weight over `parts`; empty pieces left out.
fn split_value<K: Copy>(value: &BlockValue, parts: &[(K, u64)]) -> Vec<(K, BlockValue)> {
    let weights: Vec<u64> = parts.iter().map(|p| p.1).collect();
    let counts = split(value.count, &weights);
    let waits = split(value.wait_ns, &weights);
    parts
        .iter()
        .zip(counts.into_iter().zip(waits))
        .filter(|(_, (count, wait_ns))| *count > 0 || *wait_ns > 0)
        .map(|((key, _), (count, wait_ns))| (*key, BlockValue { count, wait_ns }))
        .collect()
}

/// Subtracts `value` from `entry` (no more than it has: the kernel may have dropped an update
/// the copy survived) and returns what was taken. The entry's maximum stays exact when the
/// moved events did not reach it, and becomes an upper bound otherwise.
fn take(entry: &mut RawEntry, value: &AggValue) -> AggValue {
    let from = &mut entry.value;
    let count = value.count.min(from.count);
    let moved_hist = std::array::from_fn(|slot| value.hist[slot].min(from.hist[slot]));
    let total_ns = value.total_ns.min(from.total_ns);
    let moved = AggValue {
        count,
        total_ns,
        max_ns: value.max_ns.min(total_ns),
        contended_ns: value.contended_ns.min(from.contended_ns),
        runnable_ns: value.runnable_ns.min(from.runnable_ns),
        sleeping_ns: value.sleeping_ns.min(from.sleeping_ns),
        uninterruptible_ns: value.uninterruptible_ns.min(from.uninterruptible_ns),
        // One slot per moved event, even when clamping took counts and slots apart.
        hist: fitted_hist(&moved_hist, count, value.max_ns),
    };
    for (slot, n) in moved.hist.iter().enumerate() {
        from.hist[slot] = from.hist[slot].saturating_sub(*n);
    }
    from.count -= moved.count;
    from.total_ns -= moved.total_ns;
    from.contended_ns -= moved.contended_ns;
    from.runnable_ns -= moved.runnable_ns;
    from.sleeping_ns -= moved.sleeping_ns;
    from.uninterruptible_ns -= moved.uninterruptible_ns;
    if value.max_ns >= from.max_ns {
        let top = super::delta::highest_slot_top(&from.hist);
        entry.max_is_upper_bound = from.count > 0;
        from.max_ns = if from.count > 0 {
            // A maximum is never above the total it is part of.
            top.min(from.max_ns).min(from.total_ns)
        } else {
            0
        };
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{HolderKey, KIND_WAIT, MODE_WRITE};

    fn key(user_stack: i32) -> AggKey {
        AggKey {
            pid: 7,
            kernel_stack: 3,
            user_stack,
            kind: KIND_WAIT,
            mode: MODE_WRITE,
            ..AggKey::default()
        }
    }

    fn entry(key: AggKey, durations: &[u64]) -> RawEntry {
        let mut value = AggValue::default();
        durations.iter().for_each(|&ns| value.add(ns));
        value.contended_ns = 100;
        RawEntry {
            key,
            value,
            max_is_upper_bound: false,
        }
    }

    fn event(key: AggKey, ns: u64) -> UserStackEvent {
        UserStackEvent {
            key,
            duration_ns: ns,
            contended_ns: 40,
            ..UserStackEvent::default()
        }
    }

    fn stack(addrs: &[u64], truncated: bool) -> UnwoundStack {
        UnwoundStack {
            addrs: addrs.to_vec(),
            truncated,
        }
    }

    #[test]
    fn kinds_follow_the_id_ranges() {
        let mut u = Unwound::default();
        let e = event(key(5), 10);
        u.add(&e, stack(&[1, 2], false));
        u.add(&e, stack(&[1, 9], true));
        let ids: Vec<i32> = u.stacks.keys().copied().collect();
        let kinds: Vec<UserStackKind> = ids.iter().map(|&id| UserStackKind::of(id)).collect();
        assert!(kinds.contains(&UserStackKind::Dwarf), "{kinds:?}");
        assert!(kinds.contains(&UserStackKind::Truncated), "{kinds:?}");
        assert_eq!(UserStackKind::of(5), UserStackKind::Fp);
        assert_eq!(UserStackKind::of(NO_STACK), UserStackKind::None);
    }

    #[test]
    fn unwound_events_move_out_of_their_entry_exactly() {
        let fp = key(5);
        let mut harvest = Harvest {
            entries: vec![entry(fp, &[2000, 50_000])],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(fp, 50_000), stack(&[0x10, 0x20, 0x30], false));
        u.add(&event(fp, 2000), stack(&[0x10, 0x20, 0x30], false));
        u.apply_to(&mut harvest);

        assert_eq!(harvest.entries.len(), 1);
        let moved = &harvest.entries[0];
        assert_eq!((moved.value.count, moved.value.total_ns), (2, 52_000));
        assert_eq!(moved.value.max_ns, 50_000);
        assert!(!moved.max_is_upper_bound);
        assert_eq!(moved.value.contended_ns, 80);
        assert_eq!(
            UserStackKind::of(moved.key.user_stack),
            UserStackKind::Dwarf
        );
        assert_eq!(
            harvest.stacks[&moved.key.user_stack],
            vec![0x10, 0x20, 0x30]
        );
        assert_eq!(moved.key.kernel_stack, fp.kernel_stack);
        assert!(harvest.estimated_user_stacks.is_empty());
    }

    #[test]
    fn events_left_uncopied_are_spread_over_the_unwound_stacks_in_proportion() {
        let fp = key(5);
        // Six events; three copied: two unwound to stack a, one to stack b.
        let mut harvest = Harvest {
            entries: vec![entry(fp, &[1000, 1000, 1000, 4000, 4000, 8000])],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(fp, 4000), stack(&[0xa], false));
        u.add(&event(fp, 4000), stack(&[0xa], false));
        u.add(&event(fp, 8000), stack(&[0xb], false));
        u.apply_to(&mut harvest);

        assert!(harvest.entries.iter().all(|e| e.key != fp), "nothing left");
        let total: u64 = harvest.entries.iter().map(|e| e.value.count).sum();
        let ns: u64 = harvest.entries.iter().map(|e| e.value.total_ns).sum();
        let contended: u64 = harvest.entries.iter().map(|e| e.value.contended_ns).sum();
        assert_eq!((total, ns, contended), (6, 19_000, 100));
        let of = |addr: u64| {
            harvest
                .entries
                .iter()
                .find(|e| harvest.stacks[&e.key.user_stack] == vec![addr])
                .unwrap()
        };
        // The three uncopied events (3000 ns) go 2:1.
        assert_eq!((of(0xa).value.count, of(0xa).value.total_ns), (4, 10_000));
        assert_eq!((of(0xb).value.count, of(0xb).value.total_ns), (2, 9000));
        assert!(of(0xa).value.max_ns >= 4000 && of(0xb).value.max_ns == 8000);
        for e in &harvest.entries {
            assert!(e.max_is_upper_bound);
            assert_eq!(e.value.hist.iter().sum::<u64>(), e.value.count);
            assert!(harvest.estimated_user_stacks.contains(&e.key));
        }
    }

    #[test]
    fn a_stack_given_all_of_an_entry_keeps_its_exact_maximum() {
        let fp = key(5);
        // Three events, one copied: the two others can only go to its stack.
        let mut harvest = Harvest {
            entries: vec![entry(fp, &[1000, 9000, 3000])],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(fp, 1000), stack(&[0xa], false));
        u.apply_to(&mut harvest);
        let only = &harvest.entries[0];
        assert_eq!((only.value.count, only.value.max_ns), (3, 9000));
        assert!(
            !only.max_is_upper_bound,
            "every event of the entry is there"
        );
        assert!(harvest.estimated_user_stacks.contains(&only.key));
    }

    #[test]
    fn split_is_proportional_and_exact() {
        assert_eq!(split(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split(10, &[2, 1]), vec![7, 3]);
        assert_eq!(split(1, &[1, 1, 1]).iter().sum::<u64>(), 1);
        assert_eq!(split(0, &[3, 4]), vec![0, 0]);
        assert_eq!(split(u64::MAX, &[1, 1]).iter().sum::<u64>(), u64::MAX);
    }

    #[test]
    fn fully_unwound_entries_disappear_and_equal_stacks_merge() {
        // Two frame-pointer stacks (garbage past libc) that unwind to the same stack.
        let (a, b) = (key(5), key(6));
        let mut harvest = Harvest {
            entries: vec![entry(a, &[3000]), entry(b, &[4000])],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(a, 3000), stack(&[0x10, 0x20], false));
        u.add(&event(b, 4000), stack(&[0x10, 0x20], false));
        u.apply_to(&mut harvest);
        assert_eq!(harvest.entries.len(), 1, "{:?}", harvest.entries);
        let only = &harvest.entries[0];
        assert_eq!((only.value.count, only.value.total_ns), (2, 7000));
        assert_eq!(only.value.max_ns, 4000);
    }

    #[test]
    fn side_records_are_split_like_their_entries() {
        let hold = AggKey {
            kind: KIND_HOLD,
            ..key(5)
        };
        let wait = key(6);
        let holder = HolderKey {
            kernel_stack: hold.kernel_stack,
            user_stack: hold.user_stack,
            mode: hold.mode,
            ..HolderKey::default()
        };
        let mut harvest = Harvest {
            entries: vec![entry(hold, &[1000, 1000, 2000]), entry(wait, &[500])],
            blocked: vec![(
                BlockKey {
                    waiter: wait,
                    holder,
                },
                BlockValue {
                    count: 4,
                    wait_ns: 400,
                },
            )],
            sleeps: vec![(
                SleepKey {
                    hold,
                    stack: 4,
                    _pad: 0,
                },
                1000,
            )],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(hold, 1000), stack(&[0xa], false));
        u.add(&event(hold, 1000), stack(&[0xa], false));
        u.add(&event(hold, 2000), stack(&[0xb], false));
        u.add(&event(wait, 500), stack(&[0xc], false));
        u.apply_to(&mut harvest);
        let id_of = |addr: u64| {
            *harvest
                .stacks
                .iter()
                .find(|(_, s)| **s == vec![addr])
                .unwrap()
                .0
        };
        let (a, b, c) = (id_of(0xa), id_of(0xb), id_of(0xc));
        let mut records: Vec<(i32, i32, u64, u64)> = harvest
            .blocked
            .iter()
            .map(|(k, v)| (k.waiter.user_stack, k.holder.user_stack, v.count, v.wait_ns))
            .collect();
        records.sort();
        let mut expected = vec![(c, a, 2, 200), (c, b, 2, 200)];
        expected.sort();
        assert_eq!(records, expected);
        let mut sleeps: Vec<(i32, u64)> = harvest
            .sleeps
            .iter()
            .map(|(k, ns)| (k.hold.user_stack, *ns))
            .collect();
        sleeps.sort();
        let mut expected = vec![(a, 500), (b, 500)];
        expected.sort();
        assert_eq!(sleeps, expected);
    }

    /// Waiters and holders that each unwound to many stacks: the blocked-by table stays within
    /// records x waiter parts x holder parts of the bounds, and loses nothing.
    #[test]
    fn many_unwound_stacks_keep_the_side_tables_bounded_and_whole() {
        const STACKS: u64 = 60;
        let hold = AggKey {
            kind: KIND_HOLD,
            ..key(5)
        };
        let wait = key(6);
        let durations: Vec<u64> = (1..=STACKS).map(|i| i * 100).collect();
        let records: Vec<(BlockKey, BlockValue)> = (0..20)
            .map(|tid| {
                let holder = HolderKey {
                    kernel_stack: hold.kernel_stack,
                    user_stack: hold.user_stack,
                    mode: hold.mode,
                    ..HolderKey::default()
                };
                let waiter = AggKey { tid, ..wait };
                (waiter, holder)
            })
            .map(|(waiter, holder)| {
                let value = BlockValue {
                    count: 7,
                    wait_ns: 999_983,
                };
                (BlockKey { waiter, holder }, value)
            })
            .collect();
        let mut harvest = Harvest {
            entries: (0..20)
                .map(|tid| entry(AggKey { tid, ..wait }, &durations))
                .chain([entry(hold, &durations)])
                .collect(),
            blocked: records.clone(),
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        for (i, &ns) in durations.iter().enumerate() {
            let at = 0x1000 + i as u64;
            u.add(&event(hold, ns), stack(&[at], false));
            for tid in 0..20 {
                u.add(&event(AggKey { tid, ..wait }, ns), stack(&[at], false));
            }
        }
        u.apply_to(&mut harvest);

        let waiter_parts = |tid| {
            harvest
                .entries
                .iter()
                .filter(|e| e.key.kind == KIND_WAIT && e.key.tid == tid)
                .count()
        };
        assert_eq!(waiter_parts(3), MAX_UNWOUND_PARTS);
        let bound = records.len() * MAX_UNWOUND_PARTS * MAX_HOLDER_PARTS;
        assert!(harvest.blocked.len() <= bound, "{}", harvest.blocked.len());
        let sum = |table: &[(BlockKey, BlockValue)]| {
            table
                .iter()
                .fold((0, 0), |(c, w), (_, v)| (c + v.count, w + v.wait_ns))
        };
        assert_eq!(sum(&harvest.blocked), sum(&records));
        let events: u64 = harvest.entries.iter().map(|e| e.value.count).sum();
        assert_eq!(events, 21 * STACKS);
    }

    #[test]
    fn a_threads_blocking_goes_to_its_own_unwound_stacks_only() {
        // Holds kept per thread: tids 7 and 8 share a frame-pointer stack and unwind apart.
        let hold = |tid| AggKey {
            kind: KIND_HOLD,
            tid,
            ..key(5)
        };
        let wait = key(6);
        let holder = HolderKey {
            kernel_stack: 3,
            user_stack: 5,
            tid: 7,
            mode: MODE_WRITE,
            ..HolderKey::default()
        };
        let mut harvest = Harvest {
            entries: vec![entry(hold(7), &[1000]), entry(hold(8), &[9000])],
            blocked: vec![(
                BlockKey {
                    waiter: wait,
                    holder,
                },
                BlockValue {
                    count: 3,
                    wait_ns: 300,
                },
            )],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(hold(7), 1000), stack(&[0xa], false));
        u.add(&event(hold(8), 9000), stack(&[0xb], false));
        u.apply_to(&mut harvest);
        let a = *harvest.stacks.iter().find(|(_, s)| **s == [0xa]).unwrap().0;
        let records: Vec<(i32, u32, u64)> = harvest
            .blocked
            .iter()
            .map(|(k, v)| (k.holder.user_stack, k.holder.tid, v.count))
            .collect();
        assert_eq!(records, vec![(a, 7, 3)]);
    }

    #[test]
    fn truncated_stacks_are_completed_from_the_frame_pointer_walk() {
        // CFI: munmap, unmap_region, read_file, worker, begin, then garbage.
        let unwound = stack(&[0x10, 0x20, 0x30, 0x40, 0x50, 0x7ffc_dead], true);
        // Frame pointers: munmap, (unmap_region missed), read_file, worker, begin, shim, start.
        let fp = [0x10, 0x30, 0x40, 0x50, 0x60, 0x70];
        assert_eq!(
            splice(&unwound, &fp),
            Some(stack(&[0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70], false))
        );
        // Nothing shared after the first frame, or nothing beyond the shared one: no splice.
        assert_eq!(splice(&stack(&[0x10, 0x99], true), &fp), None);
        assert_eq!(splice(&stack(&[0x10, 0x70], true), &fp), None);
        // A complete stack is left alone.
        assert_eq!(splice(&stack(&[0x10, 0x20], false), &fp), None);
    }

    #[test]
    fn never_takes_more_than_an_entry_has() {
        let fp = key(5);
        let mut harvest = Harvest {
            entries: vec![entry(fp, &[1000])],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.add(&event(fp, 1000), stack(&[1], false));
        u.add(&event(fp, 1000), stack(&[1], false));
        u.add(&event(key(99), 1000), stack(&[1], false));
        u.apply_to(&mut harvest);
        let total: u64 = harvest.entries.iter().map(|e| e.value.count).sum();
        assert_eq!(total, 1, "{:?}", harvest.entries);
    }

    #[test]
    fn applying_to_snapshots_keeps_deltas_right() {
        let fp = key(5);
        let mut u = Unwound::default();
        let mut before = Harvest {
            entries: vec![entry(fp, &[1000, 9000])],
            ..Harvest::default()
        };
        u.add(&event(fp, 9000), stack(&[1, 2], false));
        u.apply_to(&mut before);
        let mut now = Harvest {
            entries: vec![entry(fp, &[1000, 9000, 500, 7000])],
            ..Harvest::default()
        };
        u.add(&event(fp, 7000), stack(&[1, 2], false));
        u.apply_to(&mut now);
        let window = super::super::delta::since(&now, &before);
        // One stack took everything: the copied 7000 and the uncopied 500 of the interval.
        assert_eq!(window.entries.len(), 1, "{:?}", window.entries);
        let moved = &window.entries[0];
        assert_ne!(moved.key, fp);
        assert_eq!((moved.value.count, moved.value.total_ns), (2, 7500));
    }

    #[test]
    fn events_without_copy_join_the_dropped_counter() {
        let mut harvest = Harvest {
            counters: vec![(Counter::UserStackCopyDropped, 2)],
            ..Harvest::default()
        };
        let mut u = Unwound::default();
        u.note_without_copy(3);
        u.apply_to(&mut harvest);
        assert_eq!(harvest.counters, vec![(Counter::UserStackCopyDropped, 5)]);
    }
}

/// The split over generated traces: threads whose operations share one frame-pointer entry,
/// some copied and unwound to one of a few stacks, the others left to the copy budget.
#[cfg(test)]
mod properties {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use tracer_common::{
        AggKey, AggValue, BlockKey, BlockValue, HolderKey, UserStackEvent, KIND_HOLD, KIND_WAIT,
    };

    use super::{Unwound, UnwoundStack};
    use crate::model::histogram::{percentile, slot_bounds};
    use crate::model::{build_report, invariants, report::TraceMeta, Harvest, RawEntry, Symbols};

    /// One lock operation: its thread, length, the parts of it spent asleep and runnable (in
    /// percent), and the stack its copy unwound to (None: not copied).
    #[derive(Clone, Debug)]
    struct Op {
        thread: u32,
        ns: u64,
        asleep_pct: u64,
        runnable_pct: u64,
        unwound_to: Option<u64>,
    }

    impl Op {
        fn sleeping_ns(&self) -> u64 {
            self.ns * self.asleep_pct / 100
        }
        fn runnable_ns(&self) -> u64 {
            (self.ns - self.sleeping_ns()) * self.runnable_pct / 100
        }
        fn uninterruptible_ns(&self) -> u64 {
            self.sleeping_ns() / 2
        }
        fn contended_ns(&self) -> u64 {
            self.ns / 3
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        let ns = prop_oneof![
            Just(0u64),
            1u64..2_000,
            2_000u64..2_000_000,
            2_000_000u64..200_000_000,
        ];
        (
            1u32..4,
            ns,
            0u64..=100,
            0u64..=100,
            proptest::option::weighted(0.4, 0u64..3),
        )
            .prop_map(|(thread, ns, asleep_pct, runnable_pct, unwound_to)| Op {
                thread,
                ns,
                asleep_pct,
                runnable_pct,
                unwound_to,
            })
    }

    /// The kernel's entry for `thread` (0: not collected per thread).
    fn fp_key(thread: u32, kind: u8) -> AggKey {
        AggKey {
            pid: 7,
            tid: thread,
            kernel_stack: 3,
            user_stack: 5,
            kind,
            ..AggKey::default()
        }
    }

    /// The entries the kernel would hold, and the unwound events user space would have.
    fn traced(ops: &[Op], per_thread: bool) -> (Harvest, Unwound) {
        traced_as(ops, per_thread, KIND_HOLD)
    }

    fn traced_as(ops: &[Op], per_thread: bool, kind: u8) -> (Harvest, Unwound) {
        let thread_of = |op: &Op| if per_thread { op.thread } else { 0 };
        let mut values: HashMap<AggKey, AggValue> = HashMap::new();
        let mut unwound = Unwound::default();
        for op in ops {
            let key = fp_key(thread_of(op), kind);
            let value = values.entry(key).or_default();
            value.add(op.ns);
            value.sleeping_ns += op.sleeping_ns();
            value.runnable_ns += op.runnable_ns();
            value.uninterruptible_ns += op.uninterruptible_ns();
            value.contended_ns += op.contended_ns();
            if let Some(stack) = op.unwound_to {
                let event = UserStackEvent {
                    tid: op.thread,
                    key,
                    duration_ns: op.ns,
                    contended_ns: op.contended_ns(),
                    runnable_ns: op.runnable_ns(),
                    sleeping_ns: op.sleeping_ns(),
                    uninterruptible_ns: op.uninterruptible_ns(),
                    ..UserStackEvent::default()
                };
                let addrs = vec![0x100 + stack, 0x200];
                unwound.add(
                    &event,
                    UnwoundStack {
                        addrs,
                        truncated: false,
                    },
                );
            }
        }
        let entries = values
            .into_iter()
            .map(|(key, value)| RawEntry::exact(key, value))
            .collect();
        let harvest = Harvest {
            entries,
            ..Harvest::default()
        };
        (harvest, unwound)
    }

    /// The figures of one entry that no split may break.
    fn impossible_figures(v: &AggValue) -> Vec<&'static str> {
        let mut broken = Vec::new();
        let mut check = |holds: bool, what| {
            if !holds {
                broken.push(what);
            }
        };
        check(v.hist.iter().sum::<u64>() == v.count, "histogram != count");
        check(v.max_ns <= v.total_ns, "max > total");
        check(v.total_ns / v.count.max(1) <= v.max_ns, "avg > max");
        if let Some(low) = v.hist.iter().position(|&n| n > 0) {
            check(
                v.total_ns / v.count >= slot_bounds(low).0,
                "avg below the lowest slot",
            );
        }
        check(percentile(&v.hist, 0.99, v.max_ns) <= v.max_ns, "p99 > max");
        check(v.contended_ns <= v.total_ns, "slow path > total");
        check(
            v.runnable_ns + v.sleeping_ns <= v.total_ns,
            "off CPU > total",
        );
        check(v.uninterruptible_ns <= v.sleeping_ns, "D state > asleep");
        broken
    }

    /// Everything of an entry but its user stack: what a split keeps.
    fn whole_of(key: &AggKey) -> AggKey {
        AggKey {
            user_stack: 0,
            ..*key
        }
    }

    fn sums(entries: &[RawEntry]) -> HashMap<AggKey, AggValue> {
        let mut sums: HashMap<AggKey, AggValue> = HashMap::new();
        for e in entries {
            let into = sums.entry(whole_of(&e.key)).or_default();
            into.merge(&e.value);
            into.max_ns = 0;
        }
        sums
    }

    proptest! {
        #[test]
        fn split_entries_have_possible_figures_and_keep_their_sums(
            ops in proptest::collection::vec(op(), 1..200),
            per_thread: bool,
        ) {
            let (mut harvest, unwound) = traced(&ops, per_thread);
            let before = sums(&harvest.entries);
            unwound.apply_to(&mut harvest);
            for e in &harvest.entries {
                prop_assert!(
                    impossible_figures(&e.value).is_empty(),
                    "{:?} in {:?}", impossible_figures(&e.value), e
                );
            }
            prop_assert_eq!(sums(&harvest.entries), before);
            let report = build_report(&harvest, &Symbols::new(), &TraceMeta::default());
            // The kernel's totals would count what the entries hold: only the entries'
            // figures are checked here.
            let broken: Vec<String> = invariants::check(&report)
                .into_iter()
                .filter(|line| line.starts_with("entries["))
                .collect();
            prop_assert!(broken.is_empty(), "{:#?}", broken);
        }

        #[test]
        fn a_stack_keeps_its_copied_maximum_and_exact_parts_stay_exact(
            ops in proptest::collection::vec(op(), 1..200),
            per_thread: bool,
        ) {
            let (mut harvest, unwound) = traced(&ops, per_thread);
            unwound.apply_to(&mut harvest);
            for e in &harvest.entries {
                let Some(stack) = harvest.stacks.get(&e.key.user_stack) else {
                    continue;
                };
                let copied = ops
                    .iter()
                    .filter(|op| op.unwound_to.map(|s| 0x100 + s) == Some(stack[0]))
                    .filter(|op| !per_thread || op.thread == e.key.tid);
                let longest = copied.clone().map(|op| op.ns).max().unwrap_or(0);
                prop_assert!(e.value.max_ns >= longest, "{} < {longest}: {:?}", e.value.max_ns, e);
                let estimated = harvest.estimated_user_stacks.contains(&e.key);
                if !e.max_is_upper_bound && estimated {
                    // Exact although spread: it got every operation of its entry.
                    let of_entry = ops.iter().filter(|op| !per_thread || op.thread == e.key.tid);
                    prop_assert_eq!(e.value.max_ns, of_entry.clone().map(|op| op.ns).max().unwrap());
                    prop_assert_eq!(e.value.count, of_entry.count() as u64);
                } else if !e.max_is_upper_bound {
                    prop_assert_eq!(e.value.max_ns, longest);
                    prop_assert_eq!(e.value.count, copied.count() as u64);
                }
            }
        }

        #[test]
        fn no_thread_gets_more_operations_than_it_made(
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let (mut harvest, unwound) = traced(&ops, true);
            unwound.apply_to(&mut harvest);
            for thread in 1..4 {
                let made = ops.iter().filter(|op| op.thread == thread).count() as u64;
                let given: u64 = harvest
                    .entries
                    .iter()
                    .filter(|e| e.key.tid == thread)
                    .map(|e| e.value.count)
                    .sum();
                prop_assert_eq!(given, made, "thread {}", thread);
                // Nor any stack more of a thread's operations than the thread made there.
                for e in harvest.entries.iter().filter(|e| e.key.tid == thread) {
                    prop_assert!(e.value.count <= made);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn no_split_wait_is_charged_more_waiting_behind_holders_than_it_waited(
            ops in proptest::collection::vec(op(), 1..100),
            // Each record's share of the wait, in per mille: together at most all of it.
            shares in proptest::collection::vec(0u64..400, 1..6),
        ) {
            let (mut harvest, unwound) = traced_as(&ops, false, KIND_WAIT);
            let waiter = harvest.entries[0].key;
            let waited = harvest.entries[0].value.total_ns;
            let scale = shares.iter().sum::<u64>().max(1000);
            harvest.blocked = shares
                .iter()
                .enumerate()
                .map(|(holder, share)| {
                    let key = BlockKey {
                        waiter,
                        holder: HolderKey { tid: 100 + holder as u32, ..HolderKey::default() },
                    };
                    let wait_ns = (waited as u128 * *share as u128 / scale as u128) as u64;
                    (key, BlockValue { count: 1 + *share % 3, wait_ns })
                })
                .collect();
            let charged = |blocked: &[(BlockKey, BlockValue)]| {
                blocked.iter().fold((0, 0), |(c, w), (_, v)| (c + v.count, w + v.wait_ns))
            };
            let before = charged(&harvest.blocked);
            unwound.apply_to(&mut harvest);
            prop_assert_eq!(charged(&harvest.blocked), before);
            for e in &harvest.entries {
                let behind: u64 = harvest
                    .blocked
                    .iter()
                    .filter(|(k, _)| k.waiter == e.key)
                    .map(|(_, v)| v.wait_ns)
                    .sum();
                prop_assert!(behind <= e.value.total_ns, "{} > {}: {:?}", behind, e.value.total_ns, e);
            }
        }
    }
}
