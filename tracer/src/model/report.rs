//! Building the report (`schema`) from a harvest, its symbols and the trace's own facts.

use std::collections::{BTreeMap, HashMap};

use tracer_common::{
    AggKey, BlockKey, BlockValue, ModeTotals, HIST_SLOTS, KIND_WAIT, MODE_WRITE, NO_STACK,
};

use super::processes::process_rows;
use super::processes::UNKNOWN_COMM;
pub use super::schema::*;
use super::sections::{Inputs, Sections};
use super::self_cost::{self_cost, Window};
use super::unwound::UserStackKind;
use super::{
    cause::{cause_of, Cause},
    histogram::{merge, percentile},
    holder_stack_owner, user_stack_owner, Frame, Harvest, HolderSig, RawEntry, StackRef, Symbols,
};

/// Distinct holder threads listed per blocker.
const MAX_TIDS: usize = 8;

pub fn build_report(harvest: &Harvest, symbols: &Symbols, meta: &TraceMeta) -> Report {
    let index = Index::new(harvest, symbols, meta);
    let entries = sorted_entries(harvest, &index);
    let processes = process_rows(
        &entries,
        |pid| process_name(harvest, meta, pid),
        &meta.locker_groups,
    );
    let totals = totals_of(harvest, &[0, 1, 2, 3]);
    let own_wait_ns: u64 = harvest.totals[..2].iter().map(|t| t.wait_ns).sum();
    Report {
        version: SCHEMA_VERSION,
        target: Target {
            pids: meta.pids.clone(),
            system_wide: meta.system_wide,
            comm: meta.comm.clone(),
            threads: meta.threads,
            exited: meta.exited,
        },
        duration_ns: meta.duration_ns,
        thread_time_ns: meta.thread_time_ns,
        wait_share: ratio(own_wait_ns, meta.thread_time_ns),
        stack_threshold_ns: meta.stack_threshold_ns,
        answer: super::answer::answer(&entries),
        totals,
        outside_totals: totals_of(harvest, &[2, 3]),
        processes,
        causes: cause_rows(&entries),
        entries,
        lost: harvest
            .counters
            .iter()
            .map(|(c, n)| (c.name(), *n))
            .collect(),
        in_flight: harvest.in_flight,
        sections: Sections::build(
            &harvest.sections,
            &Inputs {
                entries: &harvest.entries,
                cause: &|k| cause_of(k.syscall, k.fault, index.kernel(k.kernel_stack)),
                kernel_frames: &|stack| {
                    index
                        .kernel(stack)
                        .map(<[Frame]>::to_vec)
                        .unwrap_or_default()
                },
                frames: &|kernel, user, owner| index.frames(kernel, user, owner),
                name: &|pid| {
                    process_name(harvest, meta, pid).unwrap_or_else(|| UNKNOWN_COMM.to_string())
                },
            },
        ),
        features: harvest.features,
        self_cost: self_cost(
            &harvest.run_stats,
            meta.duration_ns,
            meta.thread_time_ns,
            harvest.tracer_cpu,
        )
        .with_own_cost(&Window {
            duration_ns: meta.duration_ns,
            thread_time_ns: meta.thread_time_ns,
            wait_ns: own_wait_ns,
            cpus: meta.cpus,
        }),
    }
}

/// A process's name from /proc (at harvest time), else as the kernel recorded it.
fn process_name(harvest: &Harvest, meta: &TraceMeta, pid: u32) -> Option<String> {
    meta.process_names
        .get(&pid)
        .or_else(|| harvest.locker_comms.get(&pid))
        .cloned()
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Sums totals slots (0, 1: the targets' read/write; 2, 3: outside lockers').
fn totals_of(harvest: &Harvest, slots: &[usize]) -> Totals {
    let mut read = ModeTotals::default();
    let mut write = ModeTotals::default();
    for &slot in slots {
        let into = if slot % 2 == MODE_WRITE as usize {
            &mut write
        } else {
            &mut read
        };
        into.merge(&harvest.totals[slot]);
    }
    Totals { read, write }
}

fn sorted_entries(harvest: &Harvest, index: &Index) -> Vec<Entry> {
    let mut entries: Vec<Entry> = harvest
        .entries
        .iter()
        .filter(|raw| raw.value.count > 0)
        .map(|raw| index.entry_of(raw))
        .collect();
    entries.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));
    entries
}

/// What a holder's stacks identify: holds and blocked-by records match on it.
/// The harvest's side tables, indexed by the entry keys they belong to.
struct Index<'a> {
    harvest: &'a Harvest,
    symbols: &'a Symbols,
    meta: &'a TraceMeta,
    blocked_by_waiter: HashMap<AggKey, Vec<&'a (BlockKey, BlockValue)>>,
    /// By holder stacks and thread (0: every thread, for entries not kept per thread).
    blocked_by_holder: HashMap<(HolderSig, u32), BlockedOthers>,
    sleeps_by_hold: HashMap<AggKey, Vec<(i32, u64)>>,
}

impl<'a> Index<'a> {
    fn new(harvest: &'a Harvest, symbols: &'a Symbols, meta: &'a TraceMeta) -> Self {
        let mut blocked_by_waiter: HashMap<AggKey, Vec<_>> = HashMap::new();
        let mut blocked_by_holder: HashMap<(HolderSig, u32), BlockedOthers> = HashMap::new();
        for record in &harvest.blocked {
            let (key, value) = record;
            blocked_by_waiter
                .entry(key.waiter)
                .or_default()
                .push(record);
            let sig = HolderSig::of_holder(&key.holder);
            let threads = if key.holder.tid == 0 {
                &[0][..]
            } else {
                &[0, key.holder.tid][..]
            };
            for &tid in threads {
                let caused = blocked_by_holder.entry((sig, tid)).or_default();
                caused.count += value.count;
                caused.wait_ns += value.wait_ns;
            }
        }
        let mut sleeps_by_hold: HashMap<AggKey, Vec<(i32, u64)>> = HashMap::new();
        for (key, ns) in &harvest.sleeps {
            sleeps_by_hold
                .entry(key.hold)
                .or_default()
                .push((key.stack, *ns));
        }
        Self {
            harvest,
            symbols,
            meta,
            blocked_by_waiter,
            blocked_by_holder,
            sleeps_by_hold,
        }
    }

    fn kernel(&self, id: i32) -> Option<&'a [Frame]> {
        (id != NO_STACK)
            .then(|| self.symbols.get(&StackRef::Kernel(id)))
            .flatten()
            .map(|f| without_tracing_frames(f))
    }

    /// User frames (of `pid`'s address space) then kernel frames.
    fn frames(&self, kernel_stack: i32, user_stack: i32, pid: u32) -> Vec<Frame> {
        stack_frames(self.symbols, kernel_stack, user_stack, pid).1
    }

    fn cgroup(&self, pid: u32) -> Option<String> {
        let id = self.harvest.process_cgroups.get(&pid)?;
        self.meta.cgroup_paths.get(id).cloned()
    }

    fn locker(&self, pid: u32) -> Option<Locker> {
        (pid != 0).then(|| Locker {
            pid,
            comm: self.harvest.locker_comms.get(&pid).cloned(),
            cgroup: self.cgroup(pid),
            processes: self.meta.locker_groups.get(&pid).map_or(1, Vec::len),
        })
    }

    fn entry_of(&self, raw: &RawEntry) -> Entry {
        let (k, v) = (&raw.key, &raw.value);
        let kernel = self.kernel(k.kernel_stack);
        let is_wait = k.kind == KIND_WAIT;
        Entry {
            kind: Kind::from_raw(k.kind),
            mode: Mode::from_raw(k.mode),
            cause: cause_of(k.syscall, k.fault, kernel),
            count: v.count,
            total_ns: v.total_ns,
            avg_ns: v.total_ns / v.count.max(1),
            max_ns: v.max_ns,
            p50_ns: percentile(&v.hist, 0.50, v.max_ns),
            p99_ns: percentile(&v.hist, 0.99, v.max_ns),
            pid: k.pid,
            comm: process_name(self.harvest, self.meta, k.pid),
            cgroup: self.cgroup(k.pid),
            tid: (k.tid != 0).then_some(k.tid),
            outside_locker: k.locker_pid != 0,
            locker: self.locker(k.locker_pid),
            stack_collected: kernel.is_some(),
            user_stack: UserStackKind::of(k.user_stack),
            frames: self.frames(k.kernel_stack, k.user_stack, user_stack_owner(k)),
            histogram: histogram_rows(&v.hist),
            contended_ns: is_wait.then_some(v.contended_ns),
            blocked_by: if is_wait {
                self.blockers_of(k, v.total_ns)
            } else {
                Vec::new()
            },
            offcpu: (!is_wait).then(|| OffCpuSplit {
                running_ns: v.total_ns.saturating_sub(v.runnable_ns + v.sleeping_ns),
                runnable_ns: v.runnable_ns,
                sleeping_ns: v.sleeping_ns,
                uninterruptible_ns: v.uninterruptible_ns,
            }),
            sleep_frames: if is_wait {
                Vec::new()
            } else {
                self.sleep_frames(k)
            },
            max_is_upper_bound: raw.max_is_upper_bound,
            user_stack_estimated: self.harvest.estimated_user_stacks.contains(k),
            thread_name: (k.tid != 0)
                .then(|| self.meta.thread_names.get(&k.tid).cloned())
                .flatten(),
            blocked_others: (!is_wait).then(|| {
                // A thread's hold entry caused only the waits charged to that thread.
                self.blocked_by_holder
                    .get(&(HolderSig::of_hold(k), k.tid))
                    .cloned()
                    .unwrap_or_default()
            }),
        }
    }

    /// The holders an entry's waits were charged to, merged by holder stack, largest first.
    fn blockers_of(&self, waiter: &AggKey, total_wait_ns: u64) -> Vec<Blocker> {
        let mut merged: BTreeMap<HolderSig, Blocker> = BTreeMap::new();
        for (key, value) in self.blocked_by_waiter.get(waiter).into_iter().flatten() {
            let h = &key.holder;
            let blocker = merged
                .entry(HolderSig::of_holder(h))
                .or_insert_with(|| Blocker {
                    mode: Mode::from_raw(h.mode),
                    cause: cause_of(h.syscall, h.fault, self.kernel(h.kernel_stack)),
                    outside_locker: h.outside_pid != 0,
                    locker: self.locker(h.outside_pid),
                    tids: Vec::new(),
                    frames: self.frames(h.kernel_stack, h.user_stack, holder_stack_owner(key)),
                    wait_ns: 0,
                    count: 0,
                    share: 0.0,
                });
            blocker.wait_ns += value.wait_ns;
            blocker.count += value.count;
            // Tid 0: charged by stack alone (the kernel folded thread ids on a crowded map).
            if h.tid != 0 && blocker.tids.len() < MAX_TIDS && !blocker.tids.contains(&h.tid) {
                blocker.tids.push(h.tid);
            }
        }
        let mut blockers: Vec<Blocker> = merged.into_values().collect();
        for b in &mut blockers {
            b.share = ratio(b.wait_ns, total_wait_ns);
        }
        blockers.sort_by_key(|b| std::cmp::Reverse(b.wait_ns));
        blockers
    }

    /// The kernel stack a hold entry spent most of its sleeping time in.
    fn sleep_frames(&self, hold: &AggKey) -> Vec<Frame> {
        let Some(sleeps) = self.sleeps_by_hold.get(hold) else {
            return Vec::new();
        };
        let Some(&(stack, _)) = sleeps.iter().max_by_key(|(_, ns)| *ns) else {
            return Vec::new();
        };
        self.kernel(stack)
            .map(<[Frame]>::to_vec)
            .unwrap_or_default()
    }
}

/// The kernel stack's frames (for classification) and the frames to show: user frames then
/// kernel frames, innermost first, without the tracepoint machinery. `owner` is the process
/// whose address space the user stack belongs to.
pub fn stack_frames(
    symbols: &Symbols,
    kernel_stack: i32,
    user_stack: i32,
    owner: u32,
) -> (Option<&[Frame]>, Vec<Frame>) {
    let kernel = (kernel_stack != NO_STACK)
        .then(|| symbols.get(&StackRef::Kernel(kernel_stack)))
        .flatten();
    let user = (user_stack != NO_STACK)
        .then(|| {
            symbols.get(&StackRef::User {
                pid: owner,
                id: user_stack,
            })
        })
        .flatten();
    let mut frames: Vec<Frame> = user.cloned().unwrap_or_default();
    frames.extend(
        kernel
            .map_or(&[][..], |k| without_tracing_frames(k))
            .iter()
            .cloned(),
    );
    (kernel.map(Vec::as_slice), frames)
}

/// The innermost kernel frames are the tracing machinery (the stack is taken inside a
/// tracepoint's BPF program): they say nothing about who locked, so they are left out. The
/// JITed program itself may come first, resolved to whatever symbol precedes it. So is the
/// lock's own slow path right below it (`rwsem_down_write_slowpath`, `down_write_killable`):
/// the stacks of a wait that slept are walked at lock:contention_begin, inside it, and serve
/// the hold that follows too, which the slow path would misname; the caller (vm_mmap_pgoff,
/// lock_mm_and_find_vma) is what names the operation, as in the stacks walked at
/// start_locking.
pub fn without_tracing_frames(frames: &[Frame]) -> &[Frame] {
    const SLOW_PATH: [&str; 4] = ["rwsem_down_", "down_read", "down_write", "__down_"];
    const MACHINERY: [&str; 6] = [
        "__mmap_lock_do_trace_",
        "__traceiter_",
        "trace_mmap_lock",
        "perf_trace_",
        "bpf_",
        "__bpf_",
    ];
    let is_machinery = |f: &Frame| {
        f.symbol
            .as_deref()
            .is_some_and(|s| MACHINERY.iter().any(|m| s.starts_with(m)))
    };
    let Some(first) = frames.iter().take(2).position(is_machinery) else {
        return frames;
    };
    let run = frames[first..]
        .iter()
        .take_while(|f| is_machinery(f))
        .count();
    let rest = &frames[first + run..];
    let slow_path = rest
        .iter()
        .take_while(|f| {
            f.symbol
                .as_deref()
                .is_some_and(|s| SLOW_PATH.iter().any(|p| s.starts_with(p)))
        })
        .count();
    &rest[slow_path..]
}

fn histogram_rows(hist: &[u64; HIST_SLOTS]) -> Vec<[u64; 2]> {
    hist.iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(slot, &n)| [if slot == 0 { 0 } else { 1u64 << (slot - 1) }, n])
        .collect()
}

/// Running sums of one (cause, kind, mode) group.
struct CauseGroup {
    count: u64,
    total_ns: u64,
    max_ns: u64,
    /// Whether `max_ns` is an exact maximum of one of the entries.
    max_is_exact: bool,
    hist: [u64; HIST_SLOTS],
}

/// Groups entries by (cause, kind, mode), merging histograms for the p99.
pub fn cause_rows(entries: &[Entry]) -> Vec<CauseRow> {
    let mut groups: HashMap<(Cause, Kind, Mode), CauseGroup> = HashMap::new();
    for e in entries {
        let g = groups
            .entry((e.cause, e.kind, e.mode))
            .or_insert(CauseGroup {
                count: 0,
                total_ns: 0,
                max_ns: 0,
                max_is_exact: false,
                hist: [0; HIST_SLOTS],
            });
        g.count += e.count;
        g.total_ns += e.total_ns;
        let exact = !e.max_is_upper_bound;
        if e.max_ns > g.max_ns || (e.max_ns == g.max_ns && exact) {
            g.max_is_exact = exact || (e.max_ns == g.max_ns && g.max_is_exact);
            g.max_ns = e.max_ns;
        }
        merge(&mut g.hist, &hist_from_rows(&e.histogram));
    }
    let mut rows: Vec<CauseRow> = groups
        .into_iter()
        .map(|((cause, kind, mode), g)| CauseRow {
            cause,
            kind,
            mode,
            count: g.count,
            total_ns: g.total_ns,
            avg_ns: g.total_ns / g.count.max(1),
            p99_ns: percentile(&g.hist, 0.99, g.max_ns),
            max_ns: g.max_ns,
            max_is_upper_bound: !g.max_is_exact,
        })
        .collect();
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.cause.cmp(&b.cause)));
    rows
}

fn hist_from_rows(rows: &[[u64; 2]]) -> [u64; HIST_SLOTS] {
    let mut hist = [0; HIST_SLOTS];
    for &[lower, n] in rows {
        hist[tracer_common::log2_slot(lower)] += n;
    }
    hist
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::sections::faults::Faults;
    use crate::model::self_cost::{tests::runs, RunStats};
    use crate::model::Features;
    use tracer_common::{
        AggKey, AggValue, Counter, HolderKey, SleepKey, SyscallTotals, KIND_HOLD, MM_SYSCALLS,
        MODE_READ,
    };

    fn frame(kernel: bool, symbol: &str) -> Frame {
        Frame {
            kernel,
            module: if kernel {
                "kernel".into()
            } else {
                "/usr/bin/app".into()
            },
            symbol: Some(symbol.into()),
            addr: 0x1000,
            ..Frame::default()
        }
    }

    fn raw(
        kind: u8,
        mode: u8,
        kernel_stack: i32,
        user_stack: i32,
        locker_pid: u32,
        samples: &[u64],
    ) -> RawEntry {
        let mut value = AggValue::default();
        for &ns in samples {
            value.add(ns);
        }
        RawEntry {
            max_is_upper_bound: false,
            key: AggKey {
                pid: 42,
                tid: if locker_pid != 0 { 77 } else { 0 },
                locker_pid,
                kernel_stack,
                user_stack,
                kind,
                mode,
                syscall: 0,
                fault: 0,
            },
            value,
        }
    }

    /// A small but complete trace: a munmap writer, faulting readers, a /proc reader, and
    /// short events without stacks.
    pub(crate) fn sample() -> (Harvest, Symbols, TraceMeta) {
        let mut harvest = Harvest {
            entries: vec![
                raw(KIND_WAIT, MODE_WRITE, 1, 2, 0, &[3_000_000, 5_000_000]),
                raw(KIND_HOLD, MODE_WRITE, 1, 2, 0, &[40_000_000]),
                raw(KIND_WAIT, MODE_READ, 3, NO_STACK, 0, &[1_000_000]),
                raw(KIND_HOLD, MODE_READ, 4, NO_STACK, 9, &[20_000]),
                raw(KIND_HOLD, MODE_READ, NO_STACK, NO_STACK, 0, &[900, 1_100]),
            ],
            ..Harvest::default()
        };
        // The totals the kernel would have counted for these entries.
        let totals = |waits, wait_ns, max_wait_ns, holds, hold_ns, max_hold_ns| ModeTotals {
            waits,
            wait_ns,
            max_wait_ns,
            holds,
            hold_ns,
            max_hold_ns,
            ..ModeTotals::default()
        };
        harvest.totals[0] = totals(1, 1_000_000, 1_000_000, 2, 2_000, 1_100);
        harvest.totals[1] = totals(2, 8_000_000, 5_000_000, 1, 40_000_000, 40_000_000);
        harvest.totals[2] = totals(0, 0, 0, 1, 20_000, 20_000);
        harvest.totals[1].acquisitions = 3;
        harvest.totals[2].acquisitions = 1;
        harvest.counters = Counter::ALL.iter().map(|&c| (c, 0)).collect();
        harvest.counters[Counter::UnpairedRelease as usize].1 = 2;
        harvest.locker_comms.insert(9, "cat".into());
        harvest.process_cgroups = HashMap::from([(42, 5001), (9, 5002)]);
        harvest.run_stats = RunStats::Counted(vec![
            runs("mmap_lock_released", 4_000, 2_800_000),
            runs("mmap_lock_start_locking", 4_000, 1_600_000),
        ]);
        let mut symbols = Symbols::new();
        symbols.insert(
            StackRef::Kernel(1),
            vec![
                frame(true, "__mmap_lock_do_trace_released"),
                frame(true, "__vm_munmap"),
                frame(true, "do_syscall_64"),
            ],
        );
        symbols.insert(
            StackRef::User { pid: 42, id: 2 },
            vec![frame(false, "munmap"), frame(false, "scan_file")],
        );
        symbols.insert(
            StackRef::Kernel(3),
            vec![
                frame(true, "lock_mm_and_find_vma"),
                frame(true, "exc_page_fault"),
            ],
        );
        symbols.insert(
            StackRef::Kernel(4),
            vec![frame(true, "show_smaps_rollup"), frame(true, "seq_read")],
        );
        let meta = TraceMeta {
            pids: vec![42],
            comm: "app".into(),
            threads: 4,
            duration_ns: 1_000_000_000,
            thread_time_ns: 4_000_000_000,
            exited: false,
            stack_threshold_ns: 10_000,
            thread_names: HashMap::new(),
            process_names: HashMap::from([(42, "app".to_string())]),
            system_wide: false,
            cpus: 2,
            locker_groups: HashMap::new(),
            cgroup_paths: HashMap::from([
                (5001, "/system.slice/app.service".to_string()),
                (
                    5002,
                    "/user.slice/user-1000.slice/session-2.scope".to_string(),
                ),
            ]),
        };
        (harvest, symbols, meta)
    }

    /// `sample()` plus attribution: the fault wait (kernel stack 3) waited behind the munmap
    /// write hold (stacks 1/2, tid 7) and behind a holder whose stacks were lost (tid 8); the
    /// munmap hold was off CPU part of the time and slept in stack 5.
    pub(crate) fn attributed() -> (Harvest, Symbols, TraceMeta) {
        let (mut harvest, mut symbols, meta) = sample();
        let fault_wait = harvest.entries[2].key;
        let munmap_hold = harvest.entries[1].key;
        let holder = |kernel_stack, user_stack, tid| HolderKey {
            kernel_stack,
            user_stack,
            tid,
            outside_pid: 0,
            mode: MODE_WRITE,
            syscall: 0,
            fault: 0,
            _pad: 0,
        };
        harvest.blocked = vec![
            (
                BlockKey {
                    waiter: fault_wait,
                    holder: holder(1, 2, 7),
                },
                BlockValue {
                    count: 2,
                    wait_ns: 750_000,
                },
            ),
            (
                BlockKey {
                    waiter: fault_wait,
                    holder: holder(NO_STACK, NO_STACK, 8),
                },
                BlockValue {
                    count: 1,
                    wait_ns: 250_000,
                },
            ),
        ];
        let value = &mut harvest.entries[1].value;
        value.runnable_ns = 5_000_000;
        value.sleeping_ns = 20_000_000;
        value.uninterruptible_ns = 15_000_000;
        harvest.sleeps = vec![
            (
                SleepKey {
                    hold: munmap_hold,
                    stack: 5,
                    _pad: 0,
                },
                18_000_000,
            ),
            (
                SleepKey {
                    hold: munmap_hold,
                    stack: 6,
                    _pad: 0,
                },
                2_000_000,
            ),
        ];
        symbols.insert(
            StackRef::Kernel(5),
            vec![
                frame(true, "io_schedule"),
                frame(true, "folio_wait_bit_common"),
            ],
        );
        symbols.insert(StackRef::Kernel(6), vec![frame(true, "schedule")]);
        harvest.sections.syscalls.0[1] = SyscallTotals {
            count: 2,
            total_ns: 50_000_000,
            lock_wait_ns: 8_000_000,
            lock_hold_ns: 40_000_000,
        };
        harvest.sections.faults.0 = [1000, 3, 10, 1];
        // Read holds by page faults (kernel stack 3): two from user mode (the exception entry
        // seen), one taken in the kernel inside a syscall.
        let mut user_mode = raw(KIND_HOLD, MODE_READ, 3, NO_STACK, 0, &[10_000, 12_000]);
        user_mode.key.fault = 1;
        let kernel_mode = raw(KIND_HOLD, MODE_READ, 3, NO_STACK, 0, &[30_000]);
        harvest.entries.extend([user_mode, kernel_mode]);
        let read = &mut harvest.totals[0];
        read.holds += 3;
        read.hold_ns += 52_000;
        read.max_hold_ns = 30_000;
        harvest.features = Features {
            contention: true,
            faults: true,
            syscalls: true,
            offcpu: true,
            filemap: true,
            per_vma_locks: true,
            ..Features::default()
        };
        (harvest, symbols, meta)
    }

    #[test]
    fn waits_name_the_holders_they_waited_behind() {
        let (harvest, symbols, meta) = attributed();
        let r = build_report(&harvest, &symbols, &meta);
        let fault = r
            .entries
            .iter()
            .find(|e| e.cause == Cause::PageFault)
            .unwrap();
        assert_eq!(fault.blocked_by.len(), 2);
        let first = &fault.blocked_by[0];
        assert_eq!(
            (first.mode, first.cause, first.tids.clone()),
            (Mode::Write, Cause::Munmap, vec![7])
        );
        assert_eq!((first.wait_ns, first.count), (750_000, 2));
        assert!((first.share - 0.75).abs() < 1e-9, "{}", first.share);
        let names: Vec<_> = first
            .frames
            .iter()
            .filter_map(|f| f.symbol.as_deref())
            .collect();
        assert_eq!(
            names,
            ["munmap", "scan_file", "__vm_munmap", "do_syscall_64"]
        );
        let lost = &fault.blocked_by[1];
        assert!(lost.frames.is_empty());
        assert_eq!((lost.tids.clone(), lost.cause), (vec![8], Cause::NoStack));
        assert!(fault.offcpu.is_none() && fault.blocked_others.is_none());
    }

    #[test]
    fn holds_carry_off_cpu_time_sleep_stack_and_the_waiting_they_caused() {
        let (harvest, symbols, meta) = attributed();
        let r = build_report(&harvest, &symbols, &meta);
        let hold = &r.entries[0];
        assert_eq!((hold.kind, hold.cause), (Kind::Hold, Cause::Munmap));
        let off = hold.offcpu.as_ref().unwrap();
        assert_eq!(
            (
                off.running_ns,
                off.runnable_ns,
                off.sleeping_ns,
                off.uninterruptible_ns
            ),
            (15_000_000, 5_000_000, 20_000_000, 15_000_000)
        );
        let sleep: Vec<_> = hold
            .sleep_frames
            .iter()
            .filter_map(|f| f.symbol.as_deref())
            .collect();
        assert_eq!(
            sleep,
            ["io_schedule", "folio_wait_bit_common"],
            "the stack it slept in most"
        );
        assert_eq!(
            hold.blocked_others,
            Some(BlockedOthers {
                count: 2,
                wait_ns: 750_000
            })
        );
        assert!(hold.contended_ns.is_none() && hold.blocked_by.is_empty());
    }

    #[test]
    fn per_thread_holds_caused_only_their_own_threads_waits() {
        let (mut harvest, symbols, meta) = attributed();
        // The munmap hold, kept per thread: tid 7 (charged with the fault's waits) and tid 9
        // (the same stacks, charged with nothing).
        let mut mine = harvest.entries[1].clone();
        mine.key.tid = 7;
        let mut other = mine.clone();
        other.key.tid = 9;
        harvest.entries.splice(1..2, [mine, other]);
        let r = build_report(&harvest, &symbols, &meta);
        let caused = |tid| {
            r.entries
                .iter()
                .find(|e| e.kind == Kind::Hold && e.tid == Some(tid))
                .and_then(|e| e.blocked_others.clone())
                .unwrap()
        };
        assert_eq!(caused(7).count, 2);
        assert_eq!(caused(9), BlockedOthers::default());
    }

    #[test]
    fn faults_syscalls_and_features_reach_the_report() {
        let (harvest, symbols, meta) = attributed();
        let r = build_report(&harvest, &symbols, &meta);
        assert_eq!(
            r.sections.faults,
            Faults {
                total: 1000,
                took_mmap_lock: 3,
                filemap: 10,
                filemap_under_mmap_lock: 1,
                user_mode_holds: 2,
                kernel_mode_holds: 1,
            }
        );
        assert_eq!(r.sections.syscalls.len(), MM_SYSCALLS.len());
        assert_eq!(r.sections.syscalls["munmap"].count, 2);
        assert_eq!(r.sections.syscalls["mmap"].count, 0);
        assert!(r.features.offcpu);
    }

    #[test]
    fn entries_are_sorted_classified_and_symbolized() {
        let (harvest, symbols, meta) = sample();
        let r = build_report(&harvest, &symbols, &meta);
        assert_eq!(r.entries.len(), 5);
        let top = &r.entries[0];
        assert_eq!(
            (top.kind, top.mode, top.cause),
            (Kind::Hold, Mode::Write, Cause::Munmap)
        );
        assert_eq!(top.total_ns, 40_000_000);
        let names: Vec<&str> = top
            .frames
            .iter()
            .filter_map(|f| f.symbol.as_deref())
            .collect();
        assert_eq!(
            names,
            ["munmap", "scan_file", "__vm_munmap", "do_syscall_64"],
            "user first, no tracing frames"
        );
        let wait = &r.entries[1];
        assert_eq!(
            (wait.kind, wait.count, wait.max_ns),
            (Kind::Wait, 2, 5_000_000)
        );
        assert!(wait.p50_ns <= wait.p99_ns && wait.p99_ns <= wait.max_ns);
        let fault = r
            .entries
            .iter()
            .find(|e| e.cause == Cause::PageFault)
            .unwrap();
        assert!(fault.stack_collected && !fault.outside_locker);
        let reader = r.entries.iter().find(|e| e.outside_locker).unwrap();
        assert_eq!(reader.cause, Cause::ProcReader);
        assert_eq!(
            reader.locker,
            Some(Locker {
                pid: 9,
                comm: Some("cat".into()),
                cgroup: Some("/user.slice/user-1000.slice/session-2.scope".into()),
                processes: 1,
            })
        );
        let short = r.entries.last().unwrap();
        assert_eq!(
            (short.cause, short.stack_collected),
            (Cause::NoStack, false)
        );
    }

    #[test]
    fn totals_wait_share_and_lost_counters() {
        let (harvest, symbols, meta) = sample();
        let r = build_report(&harvest, &symbols, &meta);
        assert_eq!(r.totals.write.acquisitions, 3);
        assert_eq!(
            r.totals.read.acquisitions, 1,
            "outside lockers count in the lock's totals"
        );
        assert_eq!(r.outside_totals.read.acquisitions, 1);
        assert!(
            (r.wait_share - 9_000_000.0 / 4e9).abs() < 1e-12,
            "{}",
            r.wait_share
        );
        assert_eq!(r.lost.len(), Counter::ALL.len(), "zero counters are kept");
        assert_eq!(r.lost["unpaired_release"], 2);
    }

    #[test]
    fn self_cost_over_the_trace_and_the_thread_time() {
        let (harvest, symbols, meta) = sample();
        let cost = build_report(&harvest, &symbols, &meta).self_cost;
        assert_eq!(cost.events_per_second, Some(8_000.0), "8000 runs in 1 s");
        assert_eq!(cost.added_ns, Some(4_400_000));
        assert_eq!(cost.added_share, Some(4_400_000.0 / 4e9));
        assert_eq!(cost.programs[0].name, "mmap_lock_released");
    }

    #[test]
    fn cause_rows_merge_entries() {
        let (mut harvest, symbols, meta) = sample();
        // A second munmap write-wait stack with another user stack.
        harvest
            .entries
            .push(raw(KIND_WAIT, MODE_WRITE, 1, NO_STACK, 0, &[7_000_000]));
        let r = build_report(&harvest, &symbols, &meta);
        let row = r
            .causes
            .iter()
            .find(|c| c.cause == Cause::Munmap && c.kind == Kind::Wait)
            .unwrap();
        assert_eq!(
            (row.count, row.total_ns, row.max_ns),
            (3, 15_000_000, 7_000_000)
        );
        assert_eq!(r.causes[0].total_ns, 40_000_000, "largest first");
    }

    #[test]
    fn a_cause_maximum_is_a_bound_only_when_no_exact_entry_reaches_it() {
        let (harvest, symbols, meta) = sample();
        let mut entries = build_report(&harvest, &symbols, &meta).entries;
        let wait = |entries: &[Entry]| {
            cause_rows(entries)
                .into_iter()
                .find(|c| c.cause == Cause::Munmap && c.kind == Kind::Wait)
                .unwrap()
        };
        assert!(!wait(&entries).max_is_upper_bound);
        let mut bounded = entries[1].clone();
        assert_eq!((bounded.kind, bounded.max_ns), (Kind::Wait, 5_000_000));
        bounded.max_ns = 6_000_000;
        bounded.max_is_upper_bound = true;
        entries.push(bounded.clone());
        let row = wait(&entries);
        assert_eq!((row.max_ns, row.max_is_upper_bound), (6_000_000, true));
        // An exact maximum as large makes it exact.
        bounded.max_is_upper_bound = false;
        entries.push(bounded);
        assert!(!wait(&entries).max_is_upper_bound);
    }

    #[test]
    fn machinery_behind_a_jitted_program_frame_is_trimmed_too() {
        let frames = vec![
            frame(true, "__stop_runtime_ptr_USER_PTR_MAX"),
            frame(true, "bpf_trace_run4"),
            frame(true, "__traceiter_sched_switch"),
            frame(true, "__schedule"),
            frame(true, "io_schedule"),
        ];
        let kept: Vec<_> = without_tracing_frames(&frames)
            .iter()
            .filter_map(|f| f.symbol.clone())
            .collect();
        assert_eq!(kept, ["__schedule", "io_schedule"]);
    }

    #[test]
    fn the_locks_slow_path_below_the_machinery_is_trimmed_too() {
        let frames = vec![
            frame(true, "bpf_trace_run2"),
            frame(true, "rwsem_down_write_slowpath"),
            frame(true, "down_write_killable"),
            frame(true, "vm_mmap_pgoff"),
            frame(true, "down_read_trylock_but_a_caller"),
        ];
        let kept: Vec<_> = without_tracing_frames(&frames)
            .iter()
            .filter_map(|f| f.symbol.clone())
            .collect();
        assert_eq!(kept, ["vm_mmap_pgoff", "down_read_trylock_but_a_caller"]);
    }

    #[test]
    fn tracing_machinery_frames_are_trimmed_only_at_the_top() {
        let frames = vec![
            frame(true, "__traceiter_mmap_lock_released"),
            frame(true, "__mmap_lock_do_trace_released"),
            frame(true, "__vm_munmap"),
            frame(true, "bpf_inner_looking_but_real"),
        ];
        let kept: Vec<_> = without_tracing_frames(&frames)
            .iter()
            .filter_map(|f| f.symbol.clone())
            .collect();
        assert_eq!(kept, ["__vm_munmap", "bpf_inner_looking_but_real"]);
    }
}
