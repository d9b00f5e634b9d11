//! Windows over cumulative snapshots. The kernel maps only ever grow; what happened between two
//! snapshots (one refresh interval, or since the user pressed reset) is their difference.
//!
//! Counts, totals and histogram slots subtract exactly. A maximum does not: when the interval
//! beat the earlier record, the new record is the interval's exact maximum; otherwise the
//! interval's maximum is only known to lie in its highest non-empty histogram slot, so the top
//! of that slot (capped by the earlier record) is reported and flagged `max_is_upper_bound`.

use std::collections::{HashMap, HashSet};

use tracer_common::{
    AggKey, AggValue, BlockKey, BlockValue, HolderKey, ModeTotals, SleepKey, HIST_SLOTS, KIND_WAIT,
    NO_STACK,
};

use super::{Harvest, RawEntry};

/// What happened after `before` and up to `now` (both cumulative snapshots of one trace).
///
/// Every field is named, none taken by `..`: a new field of `Harvest` does not compile until
/// it says here whether it is a running total (its window is a difference) or a state or
/// lookup table (the window shows it as it is now).
pub fn since(now: &Harvest, before: &Harvest) -> Harvest {
    let Harvest {
        entries,
        stacks,
        totals,
        counters,
        locker_comms,
        process_cgroups,
        in_flight,
        blocked,
        sleeps,
        sections,
        features,
        timeline: _,
        estimated_user_stacks,
        run_stats,
        tracer_cpu,
        folded,
    } = now;
    let earlier: HashMap<&AggKey, &AggValue> =
        before.entries.iter().map(|e| (&e.key, &e.value)).collect();
    let entries: Vec<RawEntry> = entries
        .iter()
        .map(|e| entry_since(e, earlier.get(&e.key).copied()))
        .filter(|e| e.value.count > 0)
        .collect();
    let totals = std::array::from_fn(|slot| {
        totals_since(&totals[slot], &before.totals[slot], &entries, slot)
    });
    Harvest {
        entries,
        totals,
        counters: counters
            .iter()
            .map(|&(c, n)| {
                let old = before
                    .counters
                    .iter()
                    .find(|(o, _)| *o == c)
                    .map_or(0, |x| x.1);
                (c, n.saturating_sub(old))
            })
            .collect(),
        blocked: keyed_since(blocked, &before.blocked, BlockValue::since),
        sleeps: keyed_since(sleeps, &before.sleeps, |n, o| n.saturating_sub(*o)),
        sections: sections.since(&before.sections),
        run_stats: super::self_cost::since(run_stats, &before.run_stats),
        tracer_cpu: tracer_cpu.since(&before.tracer_cpu),
        // The window's timeline is read from its ring buffer, not from snapshots.
        timeline: Vec::new(),
        // Lookup tables and states: as they are now.
        stacks: stacks.clone(),
        locker_comms: locker_comms.clone(),
        process_cgroups: process_cgroups.clone(),
        in_flight: *in_flight,
        features: *features,
        estimated_user_stacks: estimated_user_stacks.clone(),
        folded: folded.clone(),
    }
}

/// Per-key differences of a growing keyed table; keys with nothing new are dropped.
fn keyed_since<K: Copy + Eq + std::hash::Hash, V: Copy + Default + PartialEq>(
    now: &[(K, V)],
    before: &[(K, V)],
    sub: impl Fn(&V, &V) -> V,
) -> Vec<(K, V)> {
    let earlier: HashMap<&K, &V> = before.iter().map(|(k, v)| (k, v)).collect();
    now.iter()
        .map(|(k, v)| (*k, earlier.get(k).map_or(*v, |old| sub(v, old))))
        .filter(|(_, v)| *v != V::default())
        .collect()
}

fn entry_since(now: &RawEntry, before: Option<&AggValue>) -> RawEntry {
    let Some(old) = before else {
        return now.clone();
    };
    let mut hist = [0u64; HIST_SLOTS];
    for (slot, n) in hist.iter_mut().enumerate() {
        *n = now.value.hist[slot].saturating_sub(old.hist[slot]);
    }
    let new_record = now.value.max_ns > old.max_ns;
    let count = now.value.count.saturating_sub(old.count);
    let total_ns = now.value.total_ns.saturating_sub(old.total_ns);
    // No operation of the window lasted longer than all of them together; a single one lasted
    // exactly that. Without this cap a slot's top (up to twice the value) showed a maximum, and
    // a p99 clamped to it, above the row's total.
    let (max_ns, max_is_upper_bound) = if count == 1 {
        // Whatever the record says: it may belong to an operation that user space moved out
        // of this entry to its unwound stack (the entry keeps its max, not its share).
        (total_ns, false)
    } else if new_record && now.value.max_ns <= total_ns {
        (now.value.max_ns, false)
    } else if new_record {
        // A record above the window's whole total: the record's operation was moved out of
        // the entry to its unwound stack, or the snapshot caught the kernel between its max
        // and its total updates. Only the total bounds the window's part of it.
        (total_ns, true)
    } else {
        (highest_slot_top(&hist).min(old.max_ns).min(total_ns), true)
    };
    RawEntry {
        key: now.key,
        value: AggValue {
            count,
            total_ns,
            max_ns,
            contended_ns: now.value.contended_ns.saturating_sub(old.contended_ns),
            runnable_ns: now.value.runnable_ns.saturating_sub(old.runnable_ns),
            sleeping_ns: now.value.sleeping_ns.saturating_sub(old.sleeping_ns),
            uninterruptible_ns: now
                .value
                .uninterruptible_ns
                .saturating_sub(old.uninterruptible_ns),
            hist,
        },
        max_is_upper_bound,
    }
}

/// The largest value the highest non-empty slot can hold (slot i holds [2^(i-1), 2^i)).
pub(crate) fn highest_slot_top(hist: &[u64; HIST_SLOTS]) -> u64 {
    match hist.iter().rposition(|&n| n > 0) {
        None | Some(0) => 0,
        Some(slot) => 1u64
            .checked_shl(slot as u32)
            .map_or(u64::MAX, |top| top - 1),
    }
}

/// Per-mode totals over the window. Their maxima come from the window's entries of the same
/// slot (outside or not, read or write), which carry histograms.
fn totals_since(
    now: &ModeTotals,
    before: &ModeTotals,
    window_entries: &[RawEntry],
    slot: usize,
) -> ModeTotals {
    let max_of = |kind: u8| {
        window_entries
            .iter()
            .filter(|e| totals_slot(&e.key) == slot && e.key.kind == kind)
            .map(|e| e.value.max_ns)
            .max()
            .unwrap_or(0)
    };
    ModeTotals {
        max_wait_ns: max_of(KIND_WAIT),
        max_hold_ns: max_of(tracer_common::KIND_HOLD),
        ..now.since(before)
    }
}

fn totals_slot(key: &AggKey) -> usize {
    tracer_common::totals_index(key.locker_pid != 0, key.mode) as usize
}

/// Merges per-thread entries of the targets' own threads into per-process ones (the live view
/// collects per thread so that it can switch views without reloading the programs): entries
/// (and the waits charged and sleeps keyed by them) that differ only by a target's thread are
/// one. Outside lockers keep their thread id, as they do in every report.
pub fn without_threads(harvest: &Harvest) -> Harvest {
    let untid = |mut key: AggKey| {
        if key.locker_pid == 0 {
            key.tid = 0;
        }
        key
    };
    fold_keys(harvest, untid, |block| block.holder)
}

/// Outside lockers of one name folded into one, by the smallest of their pids: that pid ->
/// every pid of the name (only names of more than one process).
pub type ProcessGroups = HashMap<u32, Vec<u32>>;

/// Folds the outside lockers that share a name (the kernel's record of it) into one locker:
/// a /proc reader loop's thousands of short-lived `cat`s become one `cat`, with the processes
/// it stands for. A folded locker's keys lose their thread and user stack (these lie in as many
/// processes as there were pids; the kernel stack says what it did).
pub fn outside_lockers_by_name(harvest: Harvest) -> (Harvest, ProcessGroups) {
    let mut by_name: HashMap<&str, Vec<u32>> = HashMap::new();
    let lockers = harvest
        .entries
        .iter()
        .map(|e| e.key.locker_pid)
        .chain(harvest.blocked.iter().map(|(k, _)| k.holder.outside_pid))
        .filter(|&pid| pid != 0);
    for pid in lockers.collect::<std::collections::BTreeSet<u32>>() {
        if let Some(name) = harvest.locker_comms.get(&pid) {
            by_name.entry(name).or_default().push(pid);
        }
    }
    // A locker that stands for gone processes already folded (`fold_gone`) brings them along.
    let members = |pid: &u32| {
        harvest
            .folded
            .get(pid)
            .cloned()
            .unwrap_or_else(|| vec![*pid])
    };
    let groups: ProcessGroups = by_name
        .into_values()
        .filter(|pids| pids.len() > 1)
        .map(|pids| (pids[0], pids.iter().flat_map(members).collect()))
        .collect();
    if groups.is_empty() {
        // The usual case: the window as it is, not a copy of it.
        return (harvest, groups);
    }
    let folded: HashMap<u32, u32> = groups
        .iter()
        .flat_map(|(&first, pids)| pids.iter().map(move |&pid| (pid, first)))
        .collect();
    let agg = |mut key: AggKey| {
        if let Some(&first) = folded.get(&key.locker_pid) {
            (key.locker_pid, key.tid, key.user_stack) = (first, 0, NO_STACK);
        }
        key
    };
    let holder = |block: &BlockKey| {
        let mut key = block.holder;
        if let Some(&first) = folded.get(&key.outside_pid) {
            (key.outside_pid, key.tid, key.user_stack) = (first, 0, NO_STACK);
        }
        key
    };
    (fold_keys(&harvest, agg, holder), groups)
}

/// The gone processes of a system-wide trace folded by name, across the whole trace: the first
/// gone process of each name carries the keys of every later one. A busy machine's short-lived
/// processes (a shell loop's thousands of `true`s) become one row per name, and what the trace
/// keeps of them grows with their names, not their number.
#[derive(Debug, Default)]
pub struct GoneByName {
    first_of: HashMap<String, u32>,
}

/// How one batch of gone processes folds: pid -> the pid it folds into (itself for the first
/// of its name), and the names of those.
#[derive(Debug, Default)]
pub struct Folding {
    into: HashMap<u32, u32>,
    names: HashMap<u32, String>,
}

impl GoneByName {
    /// How the processes `gone`, named by `names`, fold: the `short_lived`, and any of a name
    /// that already folds (however long it lived: under a loaded machine a shell loop's
    /// `true` may take a second). One without a name stays apart.
    pub fn assign(
        &mut self,
        gone: &HashSet<u32>,
        short_lived: &HashSet<u32>,
        names: &HashMap<u32, String>,
    ) -> Folding {
        let mut pids: Vec<u32> = gone.iter().copied().collect();
        // The smallest pid of a batch is its name's first: the same trace, the same report.
        pids.sort_unstable();
        let mut folding = Folding::default();
        for pid in pids {
            let Some(name) = names.get(&pid) else {
                continue;
            };
            if !short_lived.contains(&pid) && !self.first_of.contains_key(name) {
                continue;
            }
            let first = *self.first_of.entry(name.clone()).or_insert(pid);
            folding.into.insert(pid, first);
            folding.names.insert(first, name.clone());
        }
        folding
    }
}

impl Folding {
    /// `harvest` with the processes folded. A key moved to another pid loses its thread and
    /// its user stack, which lie in the address space of a process that is no more (its kernel
    /// stack and cause say what it did); the first of a name keeps its own. `folded` records
    /// every pid that went into each.
    pub fn apply(&self, harvest: &Harvest) -> Harvest {
        if self.into.is_empty() {
            return harvest.clone();
        }
        let moved = |pid: u32| self.into.get(&pid).copied().filter(|&first| first != pid);
        let agg = |mut key: AggKey| {
            if let Some(first) = moved(key.pid) {
                key.pid = first;
                if key.locker_pid == 0 {
                    (key.tid, key.user_stack) = (0, NO_STACK);
                }
            }
            if let Some(first) = moved(key.locker_pid) {
                (key.locker_pid, key.tid, key.user_stack) = (first, 0, NO_STACK);
            }
            key
        };
        let holder = |block: &BlockKey| {
            let mut key = block.holder;
            let process = match key.outside_pid {
                0 => block.waiter.pid,
                outside => outside,
            };
            if let Some(first) = moved(process) {
                if key.outside_pid != 0 {
                    key.outside_pid = first;
                }
                (key.tid, key.user_stack) = (0, NO_STACK);
            }
            key
        };
        let mut out = fold_keys(harvest, agg, holder);
        let present: HashSet<u32> = harvest.processes().collect();
        for (&pid, &first) in self.into.iter().filter(|(pid, _)| present.contains(pid)) {
            out.folded.entry(first).or_default().push(pid);
        }
        for group in out.folded.values_mut() {
            group.sort_unstable();
            group.dedup();
        }
        out.locker_comms.retain(|&pid, _| moved(pid).is_none());
        // A folded row is in the first's cgroup (a name's processes rarely differ in it).
        out.process_cgroups.retain(|&pid, _| moved(pid).is_none());
        for &first in out.folded.keys() {
            if let Some(name) = self.names.get(&first) {
                out.locker_comms.insert(first, name.clone());
            }
        }
        out
    }
}

/// The harvest with its keys mapped by `agg` (entries, and the waiters, holds and estimated
/// stacks keyed by them) and `holder` (the holders waits were charged to, given the whole
/// record's key); entries and records whose keys become equal are merged.
fn fold_keys(
    harvest: &Harvest,
    agg: impl Fn(AggKey) -> AggKey,
    holder: impl Fn(&BlockKey) -> HolderKey,
) -> Harvest {
    let Harvest {
        entries,
        stacks,
        totals,
        counters,
        locker_comms,
        process_cgroups,
        in_flight,
        blocked,
        sleeps,
        sections,
        features,
        timeline,
        estimated_user_stacks,
        run_stats,
        tracer_cpu,
        folded,
    } = harvest;
    let mut merged: Vec<RawEntry> = Vec::with_capacity(entries.len());
    let mut index: HashMap<AggKey, usize> = HashMap::new();
    for e in entries {
        let key = agg(e.key);
        match index.get(&key) {
            Some(&i) => merged[i].merge(e),
            None => {
                index.insert(key, merged.len());
                merged.push(RawEntry {
                    key,
                    value: e.value,
                    max_is_upper_bound: e.max_is_upper_bound,
                });
            }
        }
    }
    Harvest {
        entries: merged,
        blocked: merge_keyed(
            blocked.iter().map(|(k, v)| {
                let key = BlockKey {
                    waiter: agg(k.waiter),
                    holder: holder(k),
                };
                (key, *v)
            }),
            BlockValue::merge,
        ),
        sleeps: merge_keyed(
            sleeps.iter().map(|(k, v)| {
                let key = SleepKey {
                    hold: agg(k.hold),
                    ..*k
                };
                (key, *v)
            }),
            |into, v| *into += v,
        ),
        estimated_user_stacks: estimated_user_stacks.iter().map(|&k| agg(k)).collect(),
        // Not keyed by lockers: as they are. (Timeline events keep their thread: each is one
        // thread's wait or hold.)
        stacks: stacks.clone(),
        totals: *totals,
        counters: counters.clone(),
        locker_comms: locker_comms.clone(),
        process_cgroups: process_cgroups.clone(),
        in_flight: *in_flight,
        sections: sections.clone(),
        features: *features,
        timeline: timeline.clone(),
        run_stats: run_stats.clone(),
        tracer_cpu: *tracer_cpu,
        folded: folded.clone(),
    }
}

/// Sums the values of equal keys, keeping the first occurrence's order.
fn merge_keyed<K: Copy + Eq + std::hash::Hash, V: Copy>(
    items: impl Iterator<Item = (K, V)>,
    add: impl Fn(&mut V, &V),
) -> Vec<(K, V)> {
    let mut out: Vec<(K, V)> = Vec::new();
    let mut index: HashMap<K, usize> = HashMap::new();
    for (k, v) in items {
        match index.get(&k) {
            Some(&i) => add(&mut out[i].1, &v),
            None => {
                index.insert(k, out.len());
                out.push((k, v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::histogram::percentile;
    use tracer_common::{log2_slot, Counter, KIND_HOLD, MODE_WRITE};

    fn entry(tid: u32, kind: u8, samples: &[u64]) -> RawEntry {
        let mut value = AggValue::default();
        for &ns in samples {
            value.add(ns);
        }
        RawEntry {
            key: AggKey {
                pid: 1,
                tid,
                kernel_stack: 5,
                user_stack: -1,
                kind,
                mode: MODE_WRITE,
                ..AggKey::default()
            },
            value,
            max_is_upper_bound: false,
        }
    }

    /// An outside locker's hold of the target's mm, `ns` long.
    fn outside_hold(locker_pid: u32, tid: u32, user_stack: i32, ns: u64) -> RawEntry {
        let mut e = entry(tid, KIND_HOLD, &[ns]);
        (e.key.locker_pid, e.key.user_stack) = (locker_pid, user_stack);
        e
    }

    #[test]
    fn outside_lockers_of_one_name_fold_into_the_first_with_their_count() {
        let waiter = entry(0, KIND_WAIT, &[300]).key;
        let holder = |outside_pid, tid| HolderKey {
            kernel_stack: 5,
            user_stack: 90 + outside_pid as i32,
            tid,
            outside_pid,
            ..HolderKey::default()
        };
        let harvest = Harvest {
            entries: vec![
                outside_hold(101, 1011, 7, 1_000),
                outside_hold(100, 1001, 8, 2_000),
                outside_hold(102, 1021, 9, 4_000),
            ],
            blocked: vec![
                (
                    BlockKey {
                        waiter,
                        holder: holder(101, 1011),
                    },
                    BlockValue {
                        count: 1,
                        wait_ns: 100,
                    },
                ),
                (
                    BlockKey {
                        waiter,
                        holder: holder(100, 1001),
                    },
                    BlockValue {
                        count: 2,
                        wait_ns: 200,
                    },
                ),
            ],
            locker_comms: HashMap::from([
                (100, "cat".to_string()),
                (101, "cat".to_string()),
                (102, "atop".to_string()),
            ]),
            ..Harvest::default()
        };
        let (folded, groups) = outside_lockers_by_name(harvest.clone());
        assert_eq!(groups, HashMap::from([(100, vec![100, 101])]));
        let cat: Vec<&RawEntry> = folded
            .entries
            .iter()
            .filter(|e| e.key.locker_pid == 100)
            .collect();
        assert_eq!(cat.len(), 1, "{:?}", folded.entries);
        assert_eq!((cat[0].value.count, cat[0].value.total_ns), (2, 3_000));
        assert_eq!((cat[0].key.tid, cat[0].key.user_stack), (0, NO_STACK));
        // A name of one process keeps its pid, thread and stack.
        let atop = folded.entries.iter().find(|e| e.key.locker_pid == 102);
        assert_eq!(atop.map(|e| (e.key.tid, e.key.user_stack)), Some((1021, 9)));
        // The waits charged to either cat are charged to the one.
        assert_eq!(folded.blocked.len(), 1);
        let (key, value) = folded.blocked[0];
        assert_eq!((key.holder.outside_pid, key.holder.tid), (100, 0));
        assert_eq!((value.count, value.wait_ns), (3, 300));
        // Nothing to fold: the harvest as it was.
        let (same, none) = outside_lockers_by_name(Harvest {
            entries: vec![outside_hold(102, 1021, 9, 4_000)],
            blocked: Vec::new(),
            ..harvest.clone()
        });
        assert!(none.is_empty());
        assert_eq!(same.entries.len(), 1);
    }

    /// A process's own hold of its mm, by thread `tid`, with a user stack.
    fn own_hold(pid: u32, tid: u32, ns: u64) -> RawEntry {
        let mut e = entry(tid, KIND_HOLD, &[ns]);
        (e.key.pid, e.key.user_stack) = (pid, 40);
        e
    }

    #[test]
    fn gone_processes_of_one_name_fold_into_the_first_across_batches() {
        let mut gone_by_name = GoneByName::default();
        let names = |pids: &[(u32, &str)]| -> HashMap<u32, String> {
            pids.iter().map(|&(p, n)| (p, n.to_string())).collect()
        };
        let first = Harvest {
            entries: vec![own_hold(20, 20, 1_000), own_hold(21, 21, 2_000)],
            locker_comms: names(&[(20, "true"), (21, "true")]),
            ..Harvest::default()
        };
        let folding = gone_by_name.assign(&[20, 21].into(), &[20, 21].into(), &first.locker_comms);
        let folded = folding.apply(&first);
        // The first keeps its thread and stack; the other's key moves to it without them.
        let mut keys: Vec<(u32, u32, i32)> = folded
            .entries
            .iter()
            .map(|e| (e.key.pid, e.key.tid, e.key.user_stack))
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, [(20, 0, NO_STACK), (20, 20, 40)]);
        assert_eq!(folded.folded, HashMap::from([(20, vec![20, 21])]));
        assert_eq!(folded.locker_comms, names(&[(20, "true")]));

        // A later batch: its `true` folds into the same first, even one that lived long (30), a
        // short-lived new name starts its own, a long-lived one stays apart (32).
        let later = Harvest {
            entries: vec![
                own_hold(30, 30, 4_000),
                own_hold(31, 31, 8_000),
                own_hold(32, 32, 16_000),
            ],
            locker_comms: names(&[(30, "true"), (31, "sh"), (32, "make")]),
            ..Harvest::default()
        };
        let folded_later = gone_by_name
            .assign(&[30, 31, 32].into(), &[31].into(), &later.locker_comms)
            .apply(&later);
        let mut all = folded.clone();
        all.add_processes(&folded_later);
        assert_eq!(all.folded[&20], vec![20, 21, 30]);
        assert_eq!(all.folded[&31], vec![31]);
        assert!(!all.folded.contains_key(&32));
        let make = all.entries.iter().find(|e| e.key.pid == 32).unwrap();
        assert_eq!((make.key.tid, make.key.user_stack), (32, 40));
        let true_ns: u64 = all
            .entries
            .iter()
            .filter(|e| e.key.pid == 20)
            .map(|e| e.value.total_ns)
            .sum();
        assert_eq!(true_ns, 7_000);
        // The first `sh` keeps its own name, thread and stack.
        let sh = all.entries.iter().find(|e| e.key.pid == 31).unwrap();
        assert_eq!((sh.key.tid, sh.key.user_stack), (31, 40));
        assert_eq!(all.locker_comms.get(&31).map(String::as_str), Some("sh"));
    }

    #[test]
    fn a_gone_process_without_a_name_stays_apart_and_holders_follow_their_process() {
        let mut gone_by_name = GoneByName::default();
        let waiter = own_hold(41, 41, 500).key;
        let holder = HolderKey {
            kernel_stack: 5,
            user_stack: 60,
            tid: 41,
            ..HolderKey::default()
        };
        let harvest = Harvest {
            entries: vec![
                own_hold(40, 40, 100),
                own_hold(41, 41, 500),
                own_hold(42, 42, 9),
            ],
            blocked: vec![(
                BlockKey { waiter, holder },
                BlockValue {
                    count: 1,
                    wait_ns: 50,
                },
            )],
            locker_comms: HashMap::from([(40, "make".into()), (41, "make".into())]),
            ..Harvest::default()
        };
        let all: HashSet<u32> = [40, 41, 42].into();
        let folded = gone_by_name
            .assign(&all, &all, &harvest.locker_comms)
            .apply(&harvest);
        assert!(folded
            .entries
            .iter()
            .any(|e| e.key.pid == 42 && e.key.tid == 42));
        assert!(!folded.folded.contains_key(&42));
        // A holder inside a folded process loses the thread and stack of a gone address space.
        let (key, _) = folded.blocked[0];
        assert_eq!(key.waiter.pid, 40);
        assert_eq!((key.holder.tid, key.holder.user_stack), (0, NO_STACK));
        // Nothing to fold: the harvest as it was.
        let none = Folding::default().apply(&harvest);
        assert_eq!(none.entries.len(), 3);
        assert!(none.folded.is_empty());
    }

    fn harvest(entries: Vec<RawEntry>, unpaired: u64) -> Harvest {
        let mut h = Harvest {
            entries,
            counters: Counter::ALL.iter().map(|&c| (c, 0)).collect(),
            ..Harvest::default()
        };
        h.counters[Counter::UnpairedRelease as usize].1 = unpaired;
        for e in h.entries.clone() {
            let t = &mut h.totals[totals_slot(&e.key)];
            for _ in 0..e.value.count {
                t.acquisitions += (e.key.kind == KIND_WAIT) as u64;
            }
            if e.key.kind == KIND_WAIT {
                t.wait_ns += e.value.total_ns;
                t.max_wait_ns = t.max_wait_ns.max(e.value.max_ns);
            }
        }
        h
    }

    #[test]
    fn counts_totals_and_slots_subtract() {
        let before = harvest(vec![entry(0, KIND_WAIT, &[1_000, 3_000_000])], 1);
        let now = harvest(
            vec![
                entry(0, KIND_WAIT, &[1_000, 3_000_000, 2_000, 1_500]),
                entry(0, KIND_HOLD, &[40]),
            ],
            4,
        );
        let d = since(&now, &before);
        assert_eq!(d.entries.len(), 2);
        let wait = &d.entries[0].value;
        assert_eq!((wait.count, wait.total_ns), (2, 3_500));
        assert_eq!(wait.hist.iter().sum::<u64>(), 2);
        assert_eq!(wait.hist[log2_slot(2_000)], 2);
        assert_eq!(d.entries[1].value.count, 1, "a new key counts whole");
        assert!(!d.entries[1].max_is_upper_bound);
        assert_eq!(d.totals[1].acquisitions, 2);
        assert_eq!(d.totals[1].wait_ns, 3_500);
        assert_eq!(d.counters[Counter::UnpairedRelease as usize].1, 3);
    }

    #[test]
    fn a_new_record_is_an_exact_interval_max() {
        let before = harvest(vec![entry(0, KIND_WAIT, &[1_000])], 0);
        let now = harvest(vec![entry(0, KIND_WAIT, &[1_000, 7_000])], 0);
        let d = since(&now, &before);
        assert_eq!(d.entries[0].value.max_ns, 7_000);
        assert!(!d.entries[0].max_is_upper_bound);
        assert_eq!(d.totals[1].max_wait_ns, 7_000);
    }

    #[test]
    fn an_old_record_leaves_an_upper_bound_from_the_histogram() {
        let before = harvest(vec![entry(0, KIND_WAIT, &[3_000_000])], 0);
        let now = harvest(vec![entry(0, KIND_WAIT, &[3_000_000, 1_500, 1_200])], 0);
        let d = since(&now, &before);
        let e = &d.entries[0];
        assert!(e.max_is_upper_bound);
        // 1500 and 1200 lie in [1024, 2048): the bound is 2047, not the 3 ms record.
        assert_eq!(e.value.max_ns, 2_047);
    }

    #[test]
    fn an_interval_maximum_is_never_above_the_interval_total() {
        let before = harvest(vec![entry(0, KIND_WAIT, &[3_000_000])], 0);
        let now = harvest(vec![entry(0, KIND_WAIT, &[3_000_000, 1_500])], 0);
        let e = &since(&now, &before).entries[0];
        // The top of 1500's slot is 2047, but the interval's one wait took 1500 ns in all:
        // exactly its maximum.
        assert_eq!((e.value.total_ns, e.value.max_ns), (1_500, 1_500));
        assert!(!e.max_is_upper_bound);
    }

    #[test]
    fn a_new_record_above_the_window_total_is_cut_to_a_bound() {
        let before = harvest(vec![entry(0, KIND_WAIT, &[10])], 0);
        let mut now = harvest(vec![entry(0, KIND_WAIT, &[10, 40, 60])], 0);
        // The kernel's max already counts an operation the window's total holds only part of
        // (seen under emulation: max 119.93 ms in a row of 112.68 ms since the reset).
        now.entries[0].value.max_ns = 500;
        let e = &since(&now, &before).entries[0];
        assert_eq!((e.value.total_ns, e.value.max_ns), (100, 100));
        assert!(e.max_is_upper_bound);
    }

    #[test]
    fn merged_threads_keep_a_bound_mark_when_the_larger_maximum_is_a_bound() {
        let exact = entry(2, KIND_WAIT, &[10]);
        let mut bound = entry(3, KIND_WAIT, &[30]);
        bound.max_is_upper_bound = true;
        let merged = without_threads(&harvest(vec![exact.clone(), bound.clone()], 0));
        assert_eq!(merged.entries[0].value.max_ns, 30);
        assert!(merged.entries[0].max_is_upper_bound, "30 is only a bound");
        let mut exact_top = entry(2, KIND_WAIT, &[50]);
        exact_top.max_is_upper_bound = false;
        let merged = without_threads(&harvest(vec![bound, exact_top], 0));
        assert_eq!(merged.entries[0].value.max_ns, 50);
        assert!(!merged.entries[0].max_is_upper_bound, "50 is exact");
    }

    #[test]
    fn a_single_operation_in_the_window_is_its_own_exact_max() {
        // After a reset, one more wait of 1.1 µs under a 3 ms record: its slot's top (2047)
        // was shown as the max, and the p99 with it, above the row's 1.1 µs total.
        let before = harvest(vec![entry(0, KIND_WAIT, &[3_000_000])], 0);
        let now = harvest(vec![entry(0, KIND_WAIT, &[3_000_000, 1_100])], 0);
        let d = since(&now, &before);
        let e = &d.entries[0];
        assert_eq!((e.value.count, e.value.total_ns), (1, 1_100));
        assert_eq!(e.value.max_ns, 1_100);
        assert!(!e.max_is_upper_bound);
        assert_eq!(percentile(&e.value.hist, 0.99, e.value.max_ns), 1_100);
    }

    #[test]
    fn a_single_operation_is_exact_under_a_record_it_did_not_set() {
        // The entry's new record (8.83 ms) went, with its share, to another entry (its
        // unwound stack); the one operation left in the window took 1.2 ms, and that is its
        // max, not "at most 1.2 ms" (the live view showed a row of one as ≤).
        let before = harvest(vec![entry(0, KIND_WAIT, &[3_000_000])], 0);
        let mut now = harvest(vec![entry(0, KIND_WAIT, &[3_000_000, 1_200_000])], 0);
        now.entries[0].value.max_ns = 8_830_000;
        let e = &since(&now, &before).entries[0];
        assert_eq!((e.value.count, e.value.total_ns), (1, 1_200_000));
        assert_eq!(e.value.max_ns, 1_200_000);
        assert!(!e.max_is_upper_bound);
    }

    #[test]
    fn an_upper_bound_max_never_exceeds_the_window_total() {
        // 600 and 1100 ns: the highest slot's top is 2047, but together they took 1700.
        let before = harvest(vec![entry(0, KIND_WAIT, &[3_000_000])], 0);
        let now = harvest(vec![entry(0, KIND_WAIT, &[3_000_000, 600, 1_100])], 0);
        let e = &since(&now, &before).entries[0];
        assert!(e.max_is_upper_bound);
        assert_eq!(e.value.max_ns, 1_700);
        let p99 = percentile(&e.value.hist, 0.99, e.value.max_ns);
        assert!(p99 <= e.value.max_ns && p99 >= 1_100, "p99={p99}");
    }

    #[test]
    fn program_run_counters_subtract_too() {
        use crate::model::self_cost::{tests::runs, RunStats};
        let mut before = harvest(vec![], 0);
        before.run_stats = RunStats::Counted(vec![runs("released", 100, 70_000)]);
        let mut now = harvest(vec![], 0);
        now.run_stats = RunStats::Counted(vec![runs("released", 160, 112_000)]);
        assert_eq!(
            since(&now, &before).run_stats,
            RunStats::Counted(vec![runs("released", 60, 42_000)])
        );
    }

    #[test]
    fn unchanged_entries_leave_the_window() {
        let h = harvest(vec![entry(0, KIND_WAIT, &[10])], 0);
        assert!(since(&h, &h).entries.is_empty());
        assert_eq!(since(&h, &h).totals[1], ModeTotals::default());
    }

    #[test]
    fn threads_merge_but_outside_lockers_stay_apart() {
        let mut outside = entry(9, KIND_WAIT, &[5]);
        outside.key.locker_pid = 77;
        let h = harvest(
            vec![
                entry(2, KIND_WAIT, &[10, 20]),
                entry(3, KIND_WAIT, &[30]),
                outside,
            ],
            0,
        );
        let merged = without_threads(&h);
        assert_eq!(merged.entries.len(), 2);
        let own = &merged.entries[0];
        assert_eq!(
            (own.key.tid, own.value.count, own.value.total_ns),
            (0, 3, 60)
        );
        assert_eq!(merged.entries[1].key.tid, 9);
    }
}
