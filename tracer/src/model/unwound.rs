//! User stacks unwound in user space from copies the kernel made (`--user-stack dwarf`), and
//! how they join the kernel's aggregation.
//!
//! The kernel adds every wait and hold to its entry, keyed by the frame-pointer user stack. It
//! copies the user stack of a lock operation when the operation begins and is expected to be
//! long (or is sampled), and later sends an event record for each wait or hold of that
//! operation worth unwinding, naming the copy (`PendingCopies` pairs them). Each event carries
//! the key it was added under and its exact share of the entry (duration, slow-path and off-CPU
//! time), so an unwound event is *moved*: subtracted from its entry and added to an entry keyed
//! by the unwound stack. Events that were not copied (the copy budget was spent) are shared
//! among the entry's unwound stacks in the copied ones' proportions. Unwound stacks get synthetic ids (`UNWOUND_BASE` and up) that never
//! collide with stack-map ids, and ride in `Harvest::stacks` like any other stack.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use tracer_common::{
    AggKey, AggValue, BlockKey, BlockValue, Counter, SleepKey, UserStackCopyHeader, UserStackEvent,
    KIND_HOLD, NO_STACK,
};

use super::report::HolderSig;
use super::{Harvest, RawEntry};

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
        let mut unwound: HashMap<AggKey, AggValue> = HashMap::new();
        // Original key -> (key of its largest part, that part's total).
        let mut split_into: HashMap<AggKey, Parts> = HashMap::new();
        let mut estimated = HashSet::new();
        for entry in &mut harvest.entries {
            let Some(moves) = by_key.get(&entry.key) else {
                continue;
            };
            let original = entry.key;
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
            if entry.value.count > 0 {
                // Operations not copied because the copy budget was spent are a time sample's
                // complement: they take the unwound stacks in the copied ones' proportions.
                spread(&std::mem::take(&mut entry.value), &mut parts);
                estimated.extend(parts.iter().map(|(key, _)| *key));
            }
            for (key, moved) in &parts {
                unwound.entry(*key).or_default().merge(moved);
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
        harvest
            .entries
            .extend(unwound.into_iter().map(|(key, value)| RawEntry {
                key,
                value,
                // The spread events' maximum is not known per stack: the entry's is a bound.
                max_is_upper_bound: estimated.contains(&key),
            }));
        harvest.estimated_user_stacks.extend(estimated);
    }
}

/// Shares `rest` among `parts` in proportion to their event counts (largest remainders get the
/// rounding), field by field and histogram slot by slot, so that the sums stay exact.
fn spread(rest: &AggValue, parts: &mut [(AggKey, AggValue)]) {
    let weights: Vec<u64> = parts.iter().map(|(_, v)| v.count.max(1)).collect();
    let mut share = |total: u64, field: fn(&mut AggValue) -> &mut u64| {
        for (part, n) in parts.iter_mut().zip(split(total, &weights)) {
            *field(&mut part.1) += n;
        }
    };
    share(rest.count, |v| &mut v.count);
    share(rest.total_ns, |v| &mut v.total_ns);
    share(rest.contended_ns, |v| &mut v.contended_ns);
    share(rest.runnable_ns, |v| &mut v.runnable_ns);
    share(rest.sleeping_ns, |v| &mut v.sleeping_ns);
    share(rest.uninterruptible_ns, |v| &mut v.uninterruptible_ns);
    for slot in 0..rest.hist.len() {
        for (part, n) in parts.iter_mut().zip(split(rest.hist[slot], &weights)) {
            part.1.hist[slot] += n;
        }
    }
    for (_, part) in parts.iter_mut() {
        part.max_ns = part.max_ns.max(rest.max_ns);
    }
}

/// `total` split in proportion to `weights`, summing to `total` exactly (all to the first when
/// every weight is zero).
fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum == 0 {
        let mut shares = vec![0; weights.len()];
        if let Some(first) = shares.first_mut() {
            *first = total;
        }
        return shares;
    }
    let exact: Vec<u128> = weights.iter().map(|&w| total as u128 * w as u128).collect();
    let mut shares: Vec<u64> = exact.iter().map(|e| (e / sum) as u64).collect();
    let mut left = total - shares.iter().sum::<u64>();
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    by_remainder.sort_by_key(|&i| std::cmp::Reverse(exact[i] % sum));
    for i in by_remainder {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
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
    let mut holder_parts: HashMap<HolderSig, HashMap<i32, u64>> = HashMap::new();
    for (from, parts) in split_into.iter().filter(|(from, _)| from.kind == KIND_HOLD) {
        let stacks = holder_parts.entry(HolderSig::of_hold(from)).or_default();
        for (key, ns) in parts {
            *stacks.entry(key.user_stack).or_default() += ns;
        }
    }
    let mut blocked: HashMap<BlockKey, BlockValue> = HashMap::new();
    for (key, value) in &harvest.blocked {
        let holders: Vec<(i32, u64)> = holder_parts
            .get(&HolderSig::of_holder(&key.holder))
            .map(|stacks| stacks.iter().map(|(&id, &ns)| (id, ns)).collect())
            .unwrap_or_else(|| vec![(key.holder.user_stack, 1)]);
        for (waiter, part) in split_value(value, &parts_of(&key.waiter)) {
            for (user_stack, piece) in split_value(&part, &holders) {
                let mut into_key = *key;
                into_key.waiter = waiter;
                into_key.holder.user_stack = user_stack;
                let into = blocked.entry(into_key).or_default();
                into.count += piece.count;
                into.wait_ns += piece.wait_ns;
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
    let moved = AggValue {
        count,
        total_ns: value.total_ns.min(from.total_ns),
        max_ns: value.max_ns,
        contended_ns: value.contended_ns.min(from.contended_ns),
        runnable_ns: value.runnable_ns.min(from.runnable_ns),
        sleeping_ns: value.sleeping_ns.min(from.sleeping_ns),
        uninterruptible_ns: value.uninterruptible_ns.min(from.uninterruptible_ns),
        hist: moved_hist,
    };
    for (slot, n) in moved.hist.iter().enumerate() {
        from.hist[slot] -= n;
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
            ..event(key(5), 10)
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
