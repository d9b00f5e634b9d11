//! Windows over the trace: differences of cumulative snapshots (`model::delta::since`). The
//! last interval, everything since the start or the last reset, the windows views open and
//! close (a daemon's profiles), and the whole trace at its end all become reports through one
//! function, `report_between`. New stacks are symbolized as snapshots bring them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::model::{build_report, delta, Harvest, LiveSnapshot, Report, Symbols, TraceMeta};
use crate::symbolize::StackSymbolizer;
use crate::system::procfs::MappingHistory;

/// A cumulative snapshot and the figures of the trace that go with it.
#[derive(Clone, Default)]
pub struct Mark {
    pub harvest: Harvest,
    pub thread_time_ns: u64,
    pub elapsed: Duration,
}

/// How a report splits what it shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Keep the targets' threads apart.
    pub per_thread: bool,
    /// Keep each outside locker's process apart (else those of one name are one).
    pub per_pid: bool,
}

/// The report of what happened from `from` to `now`, with the trace's facts `meta` narrowed to
/// that window, split as `split` says. Every report a trace gives, in a view or at its end, is
/// built here.
pub fn report_between(
    now: &Mark,
    from: &Mark,
    symbols: &Symbols,
    meta: &TraceMeta,
    split: Split,
) -> Report {
    let mut window = delta::since(&now.harvest, &from.harvest);
    if !split.per_thread {
        window = delta::without_threads(&window);
    }
    let mut locker_groups = HashMap::new();
    if !split.per_pid {
        (window, locker_groups) = delta::outside_lockers_by_name(window);
    }
    let meta = TraceMeta {
        duration_ns: now.elapsed.saturating_sub(from.elapsed).as_nanos() as u64,
        thread_time_ns: now.thread_time_ns.saturating_sub(from.thread_time_ns),
        locker_groups,
        ..meta.clone()
    };
    build_report(&window, symbols, &meta)
}

/// A window a view opened (`Ask::open`), until it closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowId(u64);

struct OpenWindow {
    from: Mark,
    /// What processes forgotten while the window was open did: their entries left the
    /// snapshots, not the window (a daemon forgets gone processes every fold, 10 s, and a
    /// profile of 30 s lost every process that ended in it).
    forgotten: Harvest,
}

/// The running windows of one trace, and the symbolizer that names their stacks.
pub struct Windows {
    /// Keep each outside locker's process apart in every report.
    per_pid: bool,
    symbolizer: StackSymbolizer,
    since: Mark,
    previous: Mark,
    was_reset: bool,
    open: HashMap<WindowId, OpenWindow>,
    next_id: u64,
}

impl Windows {
    /// `debug_dirs`: where to look for debug files before /usr/lib/debug (`--debug-dir`).
    pub fn new(per_pid: bool, debug_dirs: &[PathBuf]) -> Self {
        Self {
            per_pid,
            symbolizer: StackSymbolizer::new(debug_dirs),
            since: Mark::default(),
            previous: Mark::default(),
            was_reset: false,
            open: HashMap::new(),
            next_id: 0,
        }
    }

    /// From now on, the cumulative window starts at the last snapshot taken.
    pub fn reset(&mut self) {
        self.since = self.previous.clone();
        self.was_reset = true;
    }

    /// Symbolizes what `harvest` brought that is new, with the mappings seen so far.
    pub fn symbolize(&mut self, harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) {
        self.symbolizer.forget_unresolved();
        self.symbolizer.add(harvest, mappings);
    }

    /// Closes the interval at `now` (a cumulative snapshot) and returns both windows as
    /// reports.
    pub fn advance(
        &mut self,
        now: Mark,
        meta: &TraceMeta,
        threads_now: usize,
        per_thread: bool,
    ) -> LiveSnapshot {
        let symbols = self.symbolizer.symbols();
        let split = self.split(per_thread);
        let interval = report_between(&now, &self.previous, symbols, meta, split);
        let cumulative = report_between(&now, &self.since, symbols, meta, split);
        let elapsed_ns = now.elapsed.as_nanos() as u64;
        self.previous = now;
        LiveSnapshot {
            interval,
            cumulative,
            elapsed_ns,
            threads_now,
            per_thread,
            was_reset: self.was_reset,
        }
    }

    /// Opens a window at the last snapshot taken.
    pub fn open(&mut self) -> WindowId {
        let id = WindowId(self.next_id);
        self.next_id += 1;
        let window = OpenWindow {
            from: self.previous.clone(),
            forgotten: Harvest::default(),
        };
        self.open.insert(id, window);
        id
    }

    /// Closes a window: what happened from its opening to the last snapshot taken, with what
    /// the processes forgotten meanwhile did. None for a window not open.
    pub fn close(&mut self, id: WindowId, meta: &TraceMeta) -> Option<Report> {
        let window = self.open.remove(&id)?;
        let mut now = self.previous.clone();
        now.harvest.add_processes(&window.forgotten);
        let symbols = self.symbolizer.symbols();
        let split = self.split(false);
        Some(report_between(&now, &window.from, symbols, meta, split))
    }

    fn split(&self, per_thread: bool) -> Split {
        Split {
            per_thread,
            per_pid: self.per_pid,
        }
    }

    /// Forgets the processes that are gone in every window's start, as the kernel maps forget
    /// them: a later snapshot without them (or with a new process of a reused pid) then
    /// subtracts nothing of theirs. Their part of the last snapshot (all they did, as they were
    /// gone when it was read) goes to the open windows, which must still show it.
    pub fn forget_processes(&mut self, gone: &HashSet<u32>) {
        self.since.harvest.forget_processes(gone);
        let forgotten = self.previous.harvest.take_processes(gone);
        for window in self.open.values_mut() {
            window.forgotten.add_processes(&forgotten);
        }
    }

    /// The processes the last snapshot holds entries of (as mm owners or outside lockers).
    pub fn processes_seen(&self) -> HashSet<u32> {
        self.previous
            .harvest
            .entries
            .iter()
            .flat_map(|e| [e.key.pid, e.key.locker_pid])
            .filter(|&pid| pid != 0)
            .collect()
    }

    /// The report of the whole trace at its end, `last` its final read, named by everything the
    /// windows symbolized and what `last` adds; with the symbols, for the timeline.
    pub fn finish(
        mut self,
        last: Mark,
        mappings: &HashMap<u32, MappingHistory>,
        meta: &TraceMeta,
        per_thread: bool,
    ) -> (Report, Symbols) {
        self.symbolize(&last.harvest, mappings);
        let split = self.split(per_thread);
        let symbols = self.symbolizer.into_symbols();
        let report = report_between(&last, &Mark::default(), &symbols, meta, split);
        (report, symbols)
    }
}
