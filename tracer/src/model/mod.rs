//! The pure model: raw data harvested from the kernel, plus symbols, become a `Report`.
//! No I/O here; presenters (text, JSON) only read the `Report`.

pub mod answer;
pub mod cause;
pub mod delta;
pub mod histogram;
pub mod invariants;
pub(crate) mod json_figures;
pub mod place;
pub mod processes;
pub mod report;
pub mod retention;
pub mod schema;
pub mod sections;
pub mod self_cost;
pub mod series;
pub mod thread_time;
pub mod timeline;
pub mod unwound;

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use tracer_common::{
    AggKey, AggValue, BlockKey, BlockValue, Counter, HolderKey, LockTiming, ModeTotals, SleepKey,
    TimelineEvent, TOTALS_SLOTS,
};

pub use cause::Cause;
pub use report::build_report;
pub use schema::{Report, TraceMeta};

/// One aggregation-map entry, per-CPU values merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawEntry {
    pub key: AggKey,
    pub value: AggValue,
    /// Set on per-interval entries whose `max_ns` is an upper bound, not the exact maximum
    /// (see `delta::since`).
    pub max_is_upper_bound: bool,
}

impl RawEntry {
    /// An entry as the kernel aggregated it: its maximum is exact.
    pub fn exact(key: AggKey, value: AggValue) -> Self {
        Self {
            key,
            value,
            max_is_upper_bound: false,
        }
    }

    /// Adds `other` (same key): the merged maximum is the larger one, a bound when that one is
    /// (an exact maximum as large keeps it exact).
    pub fn merge(&mut self, other: &RawEntry) {
        self.max_is_upper_bound = match other.value.max_ns.cmp(&self.value.max_ns) {
            std::cmp::Ordering::Greater => other.max_is_upper_bound,
            std::cmp::Ordering::Equal => self.max_is_upper_bound && other.max_is_upper_bound,
            std::cmp::Ordering::Less => self.max_is_upper_bound,
        };
        self.value.merge(&other.value);
    }
}

/// Waits and holds still open when tracing stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InFlight {
    pub waits: u64,
    pub holds: u64,
}

impl InFlight {
    /// Counts the operation a thread's timing has open.
    pub fn add(&mut self, timing: &LockTiming) {
        self.waits += (timing.wait_start_ns != 0) as u64;
        self.holds += (timing.hold_start_ns != 0) as u64;
    }
}

/// Everything read from the kernel maps: at the end of a trace, or as a running snapshot.
#[derive(Clone, Debug, Default)]
pub struct Harvest {
    pub entries: Vec<RawEntry>,
    /// Stack id -> instruction pointers, innermost first.
    pub stacks: HashMap<i32, Vec<u64>>,
    pub totals: [ModeTotals; TOTALS_SLOTS as usize],
    pub counters: Vec<(Counter, u64)>,
    pub locker_comms: HashMap<u32, String>,
    /// Each locking process's cgroup (v2) id, as the kernel recorded it (`meta.cgroup_paths`
    /// names them).
    pub process_cgroups: HashMap<u32, u64>,
    pub in_flight: InFlight,
    /// Waits charged to the holders they waited behind.
    pub blocked: Vec<(BlockKey, BlockValue)>,
    /// Holds' sleeping time by the kernel stack they slept in.
    pub sleeps: Vec<(SleepKey, u64)>,
    /// The counters of the families that add a section of their own to the report.
    pub sections: sections::RawSections,
    pub features: Features,
    /// Waits and holds over the timeline threshold, oldest first (empty in snapshots and when
    /// no timeline was asked for).
    pub timeline: Vec<TimelineEvent>,
    /// Entries whose unwound user stacks carry, besides the copied events, a proportional
    /// share of those that could not be copied (the copy budget was spent).
    pub estimated_user_stacks: HashSet<AggKey>,
    /// The tracer's own programs' runs and run time, cumulative like the maps.
    pub run_stats: self_cost::RunStats,
    /// The tracer process's own CPU time since the trace started.
    pub tracer_cpu: self_cost::TracerCpu,
    /// Processes gone and folded by name (`delta::fold_gone`): the pid their keys carry -> every
    /// pid it stands for.
    pub folded: delta::ProcessGroups,
}

impl Harvest {
    /// Drops what belongs to processes that are gone (the mm owner's or an outside locker's),
    /// as the kernel maps do once a daemon has folded them (`Probes::forget_processes`).
    pub fn forget_processes(&mut self, gone: &HashSet<u32>) {
        self.take_processes(gone);
    }

    /// Removes what belongs to the processes `gone` (as `forget_processes`) and returns it: a
    /// harvest of only their entries, waits charged, holds' sleeps and names, which
    /// `add_processes` puts back into another snapshot.
    pub fn take_processes(&mut self, gone: &HashSet<u32>) -> Harvest {
        let of_gone = |k: &AggKey| gone.contains(&k.pid) || gone.contains(&k.locker_pid);
        let (entries, kept) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|e| of_gone(&e.key));
        self.entries = kept;
        let (blocked, kept) = std::mem::take(&mut self.blocked)
            .into_iter()
            .partition(|(k, _)| involves_gone(k, gone));
        self.blocked = kept;
        let (sleeps, kept) = std::mem::take(&mut self.sleeps)
            .into_iter()
            .partition(|(k, _)| of_gone(&k.hold));
        self.sleeps = kept;
        let (locker_comms, kept) = std::mem::take(&mut self.locker_comms)
            .into_iter()
            .partition(|(pid, _)| gone.contains(pid));
        self.locker_comms = kept;
        let (process_cgroups, kept) = std::mem::take(&mut self.process_cgroups)
            .into_iter()
            .partition(|(pid, _)| gone.contains(pid));
        self.process_cgroups = kept;
        let (estimated_user_stacks, kept) = std::mem::take(&mut self.estimated_user_stacks)
            .into_iter()
            .partition(of_gone);
        self.estimated_user_stacks = kept;
        let (folded, kept) = std::mem::take(&mut self.folded)
            .into_iter()
            .partition(|(pid, _)| gone.contains(pid));
        self.folded = kept;
        let mut taken = Harvest {
            entries,
            blocked,
            sleeps,
            locker_comms,
            process_cgroups,
            estimated_user_stacks,
            folded,
            ..Harvest::default()
        };
        // The frames of their stacks go with them: later snapshots read only the stacks their
        // own entries refer to.
        taken.stacks = taken
            .stack_refs()
            .into_iter()
            .filter_map(|stack| {
                let id = stack.id();
                Some((id, self.stacks.get(&id)?.clone()))
            })
            .collect();
        taken
    }

    /// The processes the harvest has keys of: mm owners, outside lockers, and the outside
    /// holders waits were charged to.
    pub fn processes(&self) -> impl Iterator<Item = u32> + '_ {
        let entries = self
            .entries
            .iter()
            .flat_map(|e| [e.key.pid, e.key.locker_pid]);
        let holders = self.blocked.iter().map(|(k, _)| k.holder.outside_pid);
        entries.chain(holders).filter(|&pid| pid != 0)
    }

    /// Adds `part` (processes' shares from `take_processes`) to this snapshot; a key both
    /// hold (a reused pid's) is merged.
    pub fn add_processes(&mut self, part: &Harvest) {
        merge_into(
            &mut self.entries,
            part.entries.iter().map(|e| (e.key, e.clone())),
            |e| e.key,
            |into, e| into.merge(e),
        );
        merge_into(
            &mut self.blocked,
            part.blocked.iter().map(|&(k, v)| (k, (k, v))),
            |(k, _)| *k,
            |(_, into), (_, v)| into.merge(v),
        );
        merge_into(
            &mut self.sleeps,
            part.sleeps.iter().map(|&(k, ns)| (k, (k, ns))),
            |(k, _)| *k,
            |(_, into), (_, ns)| *into += ns,
        );
        for (pid, comm) in &part.locker_comms {
            self.locker_comms
                .entry(*pid)
                .or_insert_with(|| comm.clone());
        }
        for (&pid, &cgroup) in &part.process_cgroups {
            self.process_cgroups.entry(pid).or_insert(cgroup);
        }
        for (id, frames) in &part.stacks {
            self.stacks.entry(*id).or_insert_with(|| frames.clone());
        }
        self.estimated_user_stacks
            .extend(part.estimated_user_stacks.iter().copied());
        for (pid, pids) in &part.folded {
            let group = self.folded.entry(*pid).or_default();
            group.extend(pids);
            group.sort_unstable();
            group.dedup();
        }
    }

    /// Every stack the report will show: entries' and timeline events' own, the holders their
    /// waits were charged to, and the stacks holders slept in. User stacks belong to the
    /// process that took them.
    pub fn stack_refs(&self) -> HashSet<StackRef> {
        let mut refs = HashSet::new();
        let mut add_key = |k: &AggKey| {
            refs.insert(StackRef::Kernel(k.kernel_stack));
            refs.insert(StackRef::User {
                pid: user_stack_owner(k),
                id: k.user_stack,
            });
        };
        self.entries.iter().for_each(|e| add_key(&e.key));
        self.timeline.iter().for_each(|e| add_key(&e.key));
        for (key, _) in &self.blocked {
            refs.insert(StackRef::Kernel(key.holder.kernel_stack));
            refs.insert(StackRef::User {
                pid: holder_stack_owner(key),
                id: key.holder.user_stack,
            });
        }
        for (key, _) in &self.sleeps {
            refs.insert(StackRef::Kernel(key.stack));
        }
        for (key, _) in &self.sections.wakers.0 {
            refs.insert(StackRef::Kernel(key.sleep_stack));
            refs.insert(StackRef::Kernel(key.waker_kernel_stack));
            refs.insert(StackRef::User {
                pid: key.waker_pid,
                id: key.waker_user_stack,
            });
        }
        refs.retain(|r| match r {
            StackRef::Kernel(id) | StackRef::User { id, .. } => *id >= 0,
        });
        refs
    }
}

/// User stacks of outside lockers belong to the locker's address space, not the target's.
pub fn stack_owner(pid: u32, locker_pid: u32) -> u32 {
    if locker_pid != 0 {
        locker_pid
    } else {
        pid
    }
}

pub fn user_stack_owner(key: &AggKey) -> u32 {
    stack_owner(key.pid, key.locker_pid)
}

/// A holder's user stack belongs to the outside locker, or else to the target the waiter is in.
pub fn holder_stack_owner(key: &BlockKey) -> u32 {
    stack_owner(key.waiter.pid, key.holder.outside_pid)
}

/// Which kind of tracepoint carries the mmap_lock (and lock contention) programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum LockTracepoints {
    /// BTF tracepoints (`tp_btf`): the arguments straight from the trace call.
    #[default]
    #[serde(rename = "tp_btf")]
    Btf,
    /// Classic tracepoints, the fallback: a perf record is formatted on every hit.
    #[serde(rename = "classic")]
    Classic,
}

/// Which optional tracepoint families were attached (the kernel may lack some).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    pub lock_tracepoints: LockTracepoints,
    /// lock:contention_begin/end: the sleeping part of waits.
    pub contention: bool,
    /// Fault causes (lock operations begun from a user page fault, told by the saved user
    /// registers) and filemap faults under the lock.
    pub faults: bool,
    /// syscalls:sys_{enter,exit}_*: per-syscall totals (`--syscall-times`).
    pub syscalls: bool,
    /// tp_btf/sched_switch: holders' off-CPU time.
    pub offcpu: bool,
    /// filemap:mm_filemap_fault (Linux 6.4): file faults, and those taken under the lock.
    pub filemap: bool,
    /// The kernel tries a per-VMA lock first on a page fault (Linux 6.4); without, every
    /// user page fault takes mmap_lock.
    pub per_vma_locks: bool,
    /// tp_btf/sched_waking: who woke the holders that slept.
    pub wakers: bool,
}

/// What the live view shows at one refresh: the last interval, and everything since the start
/// of the trace or the last reset.
#[derive(Clone, Debug)]
pub struct LiveSnapshot {
    pub interval: Report,
    pub cumulative: Report,
    /// Since the trace started (resets do not restart it).
    pub elapsed_ns: u64,
    pub threads_now: usize,
    /// Entries are per thread (the reports' entries carry tids).
    pub per_thread: bool,
    /// The cumulative window starts at a reset, not at the start of the trace.
    pub was_reset: bool,
}

/// One symbolized stack frame.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub kernel: bool,
    /// Kernel module ("kernel" for vmlinux) or the path of the user object.
    pub module: String,
    pub symbol: Option<String>,
    /// Offset of `addr` from the start of `symbol`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub addr: u64,
    /// Offset in the user object's file of the address looked up (the call instruction of a
    /// return address): what `addr2line -e OBJECT` takes, unlike the runtime `addr`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_offset: Option<u64>,
    /// True for a frame that was inlined into the next one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

/// Which stack a frame list belongs to: kernel stacks are shared by all processes, user stacks
/// are resolved against one process's mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackRef {
    Kernel(i32),
    User { pid: u32, id: i32 },
}

/// Whether a BLOCKED key is of a gone process: its waiter's, or an outside holder's (the
/// holder's own process's keys are its waiter's). `gone` never holds 0, the pid of nobody.
pub fn involves_gone(key: &BlockKey, gone: &HashSet<u32>) -> bool {
    gone.contains(&key.waiter.pid)
        || gone.contains(&key.waiter.locker_pid)
        || gone.contains(&key.holder.outside_pid)
}

/// Adds `items` to `into`, merging each into the item of the same key if there is one: one
/// pass with an index (a system-wide trace adds the processes it lets go of, thousands of
/// entries at a time, to all they did before).
fn merge_into<K: Copy + Eq + std::hash::Hash, T>(
    into: &mut Vec<T>,
    items: impl Iterator<Item = (K, T)>,
    key_of: impl Fn(&T) -> K,
    merge: impl Fn(&mut T, &T),
) {
    let mut index: HashMap<K, usize> = into
        .iter()
        .enumerate()
        .map(|(i, item)| (key_of(item), i))
        .collect();
    for (key, item) in items {
        match index.get(&key) {
            Some(&i) => merge(&mut into[i], &item),
            None => {
                index.insert(key, into.len());
                into.push(item);
            }
        }
    }
}

impl StackRef {
    /// The id of the stack map (or of the unwound stacks) whose frames it names.
    pub fn id(self) -> i32 {
        match self {
            StackRef::Kernel(id) | StackRef::User { id, .. } => id,
        }
    }
}

/// Symbolized stacks, looked up by the ids in `AggKey`.
pub type Symbols = HashMap<StackRef, Vec<Frame>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_processes_drops_theirs_as_owner_or_outside_locker() {
        let entry = |pid, locker_pid| {
            RawEntry::exact(
                AggKey {
                    pid,
                    locker_pid,
                    ..AggKey::default()
                },
                AggValue::default(),
            )
        };
        let mut harvest = Harvest {
            entries: vec![entry(1, 0), entry(2, 0), entry(2, 3)],
            locker_comms: [(3, "ps".to_string()), (4, "top".to_string())].into(),
            ..Harvest::default()
        };
        harvest.forget_processes(&[1, 3].into());
        let left: Vec<(u32, u32)> = harvest
            .entries
            .iter()
            .map(|e| (e.key.pid, e.key.locker_pid))
            .collect();
        assert_eq!(left, [(2, 0)]);
        assert_eq!(harvest.locker_comms.keys().collect::<Vec<_>>(), [&4]);
    }

    #[test]
    fn a_living_waiters_waits_behind_a_gone_outside_locker_go_with_the_locker() {
        let block = |waiter, outside_holder| {
            let mut key = BlockKey::default();
            key.waiter.pid = waiter;
            key.holder.outside_pid = outside_holder;
            (key, BlockValue::ZERO)
        };
        let mut harvest = Harvest {
            blocked: vec![block(10, 0), block(10, 7), block(10, 8)],
            ..Harvest::default()
        };
        let taken = harvest.take_processes(&[7].into());
        let holders = |h: &Harvest| -> Vec<u32> {
            h.blocked
                .iter()
                .map(|(k, _)| k.holder.outside_pid)
                .collect()
        };
        assert_eq!(holders(&taken), [7]);
        assert_eq!(holders(&harvest), [0, 8], "the living holders' stay");
    }

    #[test]
    fn processes_taken_out_are_added_back_merged() {
        let entry = |pid, locker_pid, count| {
            let value = AggValue {
                count,
                total_ns: 10 * count,
                max_ns: 10,
                ..AggValue::default()
            };
            RawEntry::exact(
                AggKey {
                    pid,
                    locker_pid,
                    ..AggKey::default()
                },
                value,
            )
        };
        let block = |pid| {
            let mut key = BlockKey::default();
            key.waiter.pid = pid;
            let mut value = BlockValue::ZERO;
            value.wait_ns = 100;
            (key, value)
        };
        let mut harvest = Harvest {
            entries: vec![entry(1, 0, 5), entry(2, 0, 6), entry(2, 3, 7)],
            blocked: vec![block(1), block(2)],
            locker_comms: [(3, "ps".to_string()), (4, "top".to_string())].into(),
            ..Harvest::default()
        };
        let part = harvest.take_processes(&[1, 3].into());
        let pids = |h: &Harvest| -> Vec<(u32, u32, u64)> {
            let mut p: Vec<_> = h
                .entries
                .iter()
                .map(|e| (e.key.pid, e.key.locker_pid, e.value.count))
                .collect();
            p.sort();
            p
        };
        assert_eq!(pids(&part), [(1, 0, 5), (2, 3, 7)]);
        assert_eq!(pids(&harvest), [(2, 0, 6)]);
        assert_eq!(part.blocked.len(), 1);
        assert_eq!(part.locker_comms.keys().collect::<Vec<_>>(), [&3]);

        // Into a snapshot that holds a reused pid 1 with the same key: merged, not doubled.
        let mut later = Harvest {
            entries: vec![entry(1, 0, 1), entry(2, 0, 9)],
            blocked: vec![block(2)],
            ..Harvest::default()
        };
        later.add_processes(&part);
        assert_eq!(pids(&later), [(1, 0, 6), (2, 0, 9), (2, 3, 7)]);
        assert_eq!(later.blocked.len(), 2);
        assert_eq!(later.locker_comms[&3], "ps");
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
/// What tells holds apart when waits are charged to them: their stacks, mode and cause, and
/// whether an outside locker held.
pub(crate) struct HolderSig {
    kernel_stack: i32,
    user_stack: i32,
    mode: u8,
    syscall: u8,
    fault: u8,
    outside_pid: u32,
}

impl HolderSig {
    pub(crate) fn of_hold(k: &AggKey) -> Self {
        Self {
            kernel_stack: k.kernel_stack,
            user_stack: k.user_stack,
            mode: k.mode,
            syscall: k.syscall,
            fault: k.fault,
            outside_pid: k.locker_pid,
        }
    }

    pub(crate) fn of_holder(h: &HolderKey) -> Self {
        Self {
            kernel_stack: h.kernel_stack,
            user_stack: h.user_stack,
            mode: h.mode,
            syscall: h.syscall,
            fault: h.fault,
            outside_pid: h.outside_pid,
        }
    }
}
