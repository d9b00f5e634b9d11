//! The report: what every presenter shows, built from a harvest, its symbols and the trace's
//! own facts. Field names here are the JSON schema (README, "JSON output").

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tracer_common::{ModeTotals, HIST_SLOTS, KIND_WAIT, MODE_WRITE, NO_STACK};

use super::{
    cause::{classify, Cause},
    histogram::{merge, percentile},
    Frame, Harvest, InFlight, RawEntry, StackRef, Symbols,
};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Wait,
    Hold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Read,
    Write,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Wait => "wait",
            Kind::Hold => "hold",
        }
    }
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// Facts about the trace that the kernel maps do not hold.
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    pub pids: Vec<u32>,
    pub comm: String,
    pub max_threads: usize,
    pub duration_ns: u64,
    /// Sum over time of the number of target threads alive: the denominator of wait_share.
    pub thread_time_ns: u64,
    pub exited: bool,
    pub stack_threshold_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub version: u32,
    pub target: Target,
    pub duration_ns: u64,
    pub thread_time_ns: u64,
    /// Share of the target threads' time spent waiting for the lock (0..1).
    pub wait_share: f64,
    pub stack_threshold_ns: u64,
    /// Every locker of the targets' mm: their threads and outside lockers.
    pub totals: Totals,
    /// The outside lockers' part of `totals`.
    pub outside_totals: Totals,
    pub causes: Vec<CauseRow>,
    pub entries: Vec<Entry>,
    /// Every drop and unpaired-event counter, zero or not.
    pub lost: BTreeMap<&'static str, u64>,
    pub in_flight: InFlight,
}

#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub pids: Vec<u32>,
    pub comm: String,
    pub threads: usize,
    pub exited: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub read: ModeSummary,
    pub write: ModeSummary,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModeSummary {
    pub acquisitions: u64,
    pub failed_trylocks: u64,
    pub interrupted: u64,
    pub downgrades: u64,
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    pub holds: u64,
    pub hold_ns: u64,
    pub max_hold_ns: u64,
}

impl From<&ModeTotals> for ModeSummary {
    fn from(t: &ModeTotals) -> Self {
        Self {
            acquisitions: t.acquisitions,
            failed_trylocks: t.failed_trylocks,
            interrupted: t.interrupted,
            downgrades: t.downgrades,
            waits: t.waits,
            wait_ns: t.wait_ns,
            max_wait_ns: t.max_wait_ns,
            holds: t.holds,
            hold_ns: t.hold_ns,
            max_hold_ns: t.max_hold_ns,
        }
    }
}

/// One row of the by-cause table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CauseRow {
    pub cause: Cause,
    pub kind: Kind,
    pub mode: Mode,
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// One call stack's waits or holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    pub kind: Kind,
    pub mode: Mode,
    pub cause: Cause,
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub max_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// The target whose mm was locked.
    pub pid: u32,
    /// Set with per-thread aggregation, and always for outside lockers.
    pub tid: Option<u32>,
    pub outside_locker: bool,
    pub locker: Option<Locker>,
    /// False when the duration was below the stack threshold (or the stack was lost).
    pub stack_collected: bool,
    /// User frames (innermost first), then kernel frames (innermost first).
    pub frames: Vec<Frame>,
    /// Non-empty log2 slots as [lower bound ns, count].
    pub histogram: Vec<[u64; 2]>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Locker {
    pub pid: u32,
    pub comm: Option<String>,
}

pub fn build_report(harvest: &Harvest, symbols: &Symbols, meta: &TraceMeta) -> Report {
    let entries = sorted_entries(harvest, symbols);
    let totals = totals_of(harvest, &[0, 1, 2, 3]);
    let own_wait_ns: u64 = harvest.totals[..2].iter().map(|t| t.wait_ns).sum();
    Report {
        version: SCHEMA_VERSION,
        target: Target {
            pids: meta.pids.clone(),
            comm: meta.comm.clone(),
            threads: meta.max_threads,
            exited: meta.exited,
        },
        duration_ns: meta.duration_ns,
        thread_time_ns: meta.thread_time_ns,
        wait_share: ratio(own_wait_ns, meta.thread_time_ns),
        stack_threshold_ns: meta.stack_threshold_ns,
        totals,
        outside_totals: totals_of(harvest, &[2, 3]),
        causes: cause_rows(&entries),
        entries,
        lost: harvest
            .counters
            .iter()
            .map(|(c, n)| (c.name(), *n))
            .collect(),
        in_flight: harvest.in_flight,
    }
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
    Totals {
        read: (&read).into(),
        write: (&write).into(),
    }
}

fn sorted_entries(harvest: &Harvest, symbols: &Symbols) -> Vec<Entry> {
    let mut entries: Vec<Entry> = harvest
        .entries
        .iter()
        .filter(|raw| raw.value.count > 0)
        .map(|raw| entry_of(raw, harvest, symbols))
        .collect();
    entries.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(b.count.cmp(&a.count)));
    entries
}

fn entry_of(raw: &RawEntry, harvest: &Harvest, symbols: &Symbols) -> Entry {
    let (k, v) = (&raw.key, &raw.value);
    let kernel = (k.kernel_stack != NO_STACK)
        .then(|| symbols.get(&StackRef::Kernel(k.kernel_stack)))
        .flatten();
    let user = (k.user_stack != NO_STACK)
        .then(|| {
            symbols.get(&StackRef::User {
                pid: user_stack_owner(raw),
                id: k.user_stack,
            })
        })
        .flatten();
    let mut frames: Vec<Frame> = user.cloned().unwrap_or_default();
    frames.extend(kernel.cloned().unwrap_or_default());
    let outside = k.locker_pid != 0;
    Entry {
        kind: if k.kind == KIND_WAIT {
            Kind::Wait
        } else {
            Kind::Hold
        },
        mode: if k.mode == MODE_WRITE {
            Mode::Write
        } else {
            Mode::Read
        },
        cause: classify(kernel.map(Vec::as_slice)),
        count: v.count,
        total_ns: v.total_ns,
        avg_ns: v.total_ns / v.count.max(1),
        max_ns: v.max_ns,
        p50_ns: percentile(&v.hist, 0.50, v.max_ns),
        p99_ns: percentile(&v.hist, 0.99, v.max_ns),
        pid: k.pid,
        tid: (k.tid != 0).then_some(k.tid),
        outside_locker: outside,
        locker: outside.then(|| Locker {
            pid: k.locker_pid,
            comm: harvest.locker_comms.get(&k.locker_pid).cloned(),
        }),
        stack_collected: kernel.is_some(),
        frames,
        histogram: histogram_rows(&v.hist),
    }
}

/// User stacks of outside lockers belong to the locker's address space, not the target's.
fn user_stack_owner(raw: &RawEntry) -> u32 {
    if raw.key.locker_pid != 0 {
        raw.key.locker_pid
    } else {
        raw.key.pid
    }
}

fn histogram_rows(hist: &[u64; HIST_SLOTS]) -> Vec<[u64; 2]> {
    hist.iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(slot, &n)| [if slot == 0 { 0 } else { 1u64 << (slot - 1) }, n])
        .collect()
}

/// Groups entries by (cause, kind, mode), merging histograms for the p99.
fn cause_rows(entries: &[Entry]) -> Vec<CauseRow> {
    let mut groups: HashMap<(Cause, Kind, Mode), (u64, u64, u64, [u64; HIST_SLOTS])> =
        HashMap::new();
    for e in entries {
        let g = groups
            .entry((e.cause, e.kind, e.mode))
            .or_insert((0, 0, 0, [0; HIST_SLOTS]));
        g.0 += e.count;
        g.1 += e.total_ns;
        g.2 = g.2.max(e.max_ns);
        merge(&mut g.3, &hist_from_rows(&e.histogram));
    }
    let mut rows: Vec<CauseRow> = groups
        .into_iter()
        .map(
            |((cause, kind, mode), (count, total_ns, max_ns, hist))| CauseRow {
                cause,
                kind,
                mode,
                count,
                total_ns,
                avg_ns: total_ns / count.max(1),
                p99_ns: percentile(&hist, 0.99, max_ns),
                max_ns,
            },
        )
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
