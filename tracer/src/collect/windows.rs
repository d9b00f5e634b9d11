//! Windows over the trace: differences of cumulative snapshots (`model::delta::since`). The
//! last interval, everything since the start or the last reset, the windows views open and
//! close (a daemon's profiles), and the whole trace at its end all become reports through one
//! function, `report_between`. New stacks are symbolized as snapshots bring them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::model::delta::{Folding, GoneByName};
use crate::model::{
    build_report, delta, Harvest, LiveSnapshot, Report, StackRef, Symbols, TraceMeta,
};
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
    let mut locker_groups = window.folded.clone();
    if !split.per_pid {
        let outside;
        (window, outside) = delta::outside_lockers_by_name(window);
        locker_groups.extend(outside);
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

/// What a session does with the processes that are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forgetting {
    /// Nothing: a trace of listed processes keeps everything it saw.
    Never,
    /// They leave the kernel maps once read, so that a busy machine's short-lived processes do
    /// not fill them (a system-wide trace); every window keeps what they did, folded by name
    /// unless `--per-pid`, and the report of the whole trace has all of it.
    KeepingWhatTheyDid,
    /// They leave the maps and the trace: only the windows open when they went keep what they
    /// did (a daemon, whose memory must follow the processes alive; its series hold the rest).
    Entirely,
}

/// A window over the trace: the snapshot it starts at, and what the processes forgotten while
/// it was open did in it (their entries left the snapshots and the start, not the window: a
/// daemon forgets gone processes every second or so, and a profile of 30 s would lose every
/// process that ended in it).
#[derive(Clone, Default)]
struct Window {
    from: Mark,
    forgotten: Harvest,
}

impl Window {
    fn at(from: Mark) -> Self {
        Self {
            from,
            forgotten: Harvest::default(),
        }
    }

    /// The processes `gone` leave the window's start; `taken`, all they did since the trace
    /// began (folded by `folding`), less what they had done at the start, stays in the window.
    fn forget(&mut self, gone: &HashSet<u32>, taken: &Harvest, folding: &Folding) {
        let before = folding.apply(&self.from.harvest.take_processes(gone));
        self.forgotten.add_processes(&delta::since(taken, &before));
    }

    /// The window's report up to `now`.
    fn report(&self, now: &Mark, symbols: &Symbols, meta: &TraceMeta, split: Split) -> Report {
        if self.forgotten.entries.is_empty() && self.forgotten.blocked.is_empty() {
            return report_between(now, &self.from, symbols, meta, split);
        }
        let mut now = now.clone();
        now.harvest.add_processes(&self.forgotten);
        report_between(&now, &self.from, symbols, meta, split)
    }
}

/// What every window keeps of the processes let go of while it was open (fields apart, so
/// that the symbolizer beside them can be borrowed mutably meanwhile).
fn keeping<'a>(
    interval: &'a Window,
    cumulative: &'a Window,
    whole: &'a Window,
    open: &'a HashMap<WindowId, Window>,
) -> impl Iterator<Item = &'a Harvest> {
    [interval, cumulative, whole]
        .into_iter()
        .chain(open.values())
        .map(|window| &window.forgotten)
}

/// The running windows of one trace, and the symbolizer that names their stacks.
pub struct Windows {
    /// Keep each outside locker's process apart in every report, and gone processes unfolded.
    per_pid: bool,
    forgetting: Forgetting,
    symbolizer: StackSymbolizer,
    /// The last snapshot read, shown or not: what the gone are taken from.
    previous: Mark,
    /// Since the last snapshot shown.
    interval: Window,
    /// Since the start or the last reset.
    cumulative: Window,
    /// The whole trace (from nothing): only what the forgotten did.
    whole: Window,
    was_reset: bool,
    open: HashMap<WindowId, Window>,
    next_id: u64,
    gone_by_name: GoneByName,
    /// Processes let go of whose named user stacks the symbolizer may still hold (a daemon
    /// drops them once no window keeps what those processes did).
    forgotten_named: HashSet<u32>,
}

impl Windows {
    /// `debug_dirs`: where to look for debug files before /usr/lib/debug (`--debug-dir`).
    pub fn new(per_pid: bool, forgetting: Forgetting, debug_dirs: &[PathBuf]) -> Self {
        Self {
            per_pid,
            forgetting,
            symbolizer: StackSymbolizer::new(debug_dirs),
            previous: Mark::default(),
            interval: Window::default(),
            cumulative: Window::default(),
            whole: Window::default(),
            was_reset: false,
            open: HashMap::new(),
            next_id: 0,
            gone_by_name: GoneByName::default(),
            forgotten_named: HashSet::new(),
        }
    }

    /// From now on, the cumulative window starts at the last snapshot taken.
    pub fn reset(&mut self) {
        self.cumulative = Window::at(self.previous.clone());
        self.was_reset = true;
    }

    /// Symbolizes what `harvest` brought that is new, and what the windows keep of processes
    /// let go of since (with the frames they took along), with the mappings seen so far.
    pub fn symbolize(&mut self, harvest: &Harvest, mappings: &HashMap<u32, MappingHistory>) {
        self.symbolizer.forget_unresolved();
        self.symbolizer.add(harvest, mappings);
        let keeping = keeping(&self.interval, &self.cumulative, &self.whole, &self.open);
        for forgotten in keeping {
            self.symbolizer.add(forgotten, mappings);
        }
    }

    /// Names the user stacks of what the windows keep of processes let go of, while their
    /// mappings are at hand (kernel stacks wait for a report).
    pub fn symbolize_forgotten_user_stacks(&mut self, mappings: &HashMap<u32, MappingHistory>) {
        let keeping = keeping(&self.interval, &self.cumulative, &self.whole, &self.open);
        for forgotten in keeping {
            self.symbolizer.add_user_stacks(forgotten, mappings);
        }
    }

    /// The processes whose user stacks the windows keep of processes let go of and have not
    /// named yet: their mappings are still needed.
    pub fn kept_stack_owners(&self) -> HashSet<u32> {
        self.forgotten_parts()
            .flat_map(Harvest::stack_refs)
            .filter(|stack| !self.symbolizer.has(stack))
            .filter_map(|stack| match stack {
                StackRef::User { pid, id } if id != tracer_common::NO_STACK => Some(pid),
                _ => None,
            })
            .collect()
    }

    fn forgotten_parts(&self) -> impl Iterator<Item = &Harvest> {
        keeping(&self.interval, &self.cumulative, &self.whole, &self.open)
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
        let interval = self.interval.report(&now, symbols, meta, split);
        let cumulative = self.cumulative.report(&now, symbols, meta, split);
        let elapsed_ns = now.elapsed.as_nanos() as u64;
        self.interval = Window::at(now.clone());
        self.previous = now;
        if self.forgetting == Forgetting::Entirely {
            self.drop_unkept_user_symbols();
        }
        LiveSnapshot {
            interval,
            cumulative,
            elapsed_ns,
            threads_now,
            per_thread,
            was_reset: self.was_reset,
        }
    }

    /// Takes `now` as the last snapshot without showing it (read only to let go of the gone).
    pub fn note(&mut self, now: Mark) {
        self.previous = now;
    }

    /// Opens a window at the last snapshot taken.
    pub fn open(&mut self) -> WindowId {
        let id = WindowId(self.next_id);
        self.next_id += 1;
        self.open.insert(id, Window::at(self.previous.clone()));
        id
    }

    /// Closes a window: what happened from its opening to the last snapshot taken, with what
    /// the processes forgotten meanwhile did. None for a window not open.
    pub fn close(&mut self, id: WindowId, meta: &TraceMeta) -> Option<Report> {
        let window = self.open.remove(&id)?;
        let symbols = self.symbolizer.symbols();
        let report = window.report(&self.previous, symbols, meta, self.split(false));
        if self.forgetting == Forgetting::Entirely {
            self.drop_unkept_user_symbols();
        }
        Some(report)
    }

    /// Forgets the processes that are gone in the last snapshot and every window's start, as
    /// the kernel maps forget them: a later snapshot without them (or with a new process of a
    /// reused pid) then subtracts nothing of theirs. What they did (all of it: they were gone
    /// when the snapshot was read, and `pending`, what the kernel never flushed for them)
    /// stays in the windows that keep it (see `Forgetting`).
    ///
    /// Those of `short_lived` are folded by name, unless `--per-pid`.
    pub fn forget_processes(
        &mut self,
        gone: &HashSet<u32>,
        short_lived: &HashSet<u32>,
        pending: &Harvest,
    ) {
        let mut taken = self.previous.harvest.take_processes(gone);
        taken.add_processes(pending);
        let folding = if self.per_pid {
            Folding::default()
        } else {
            self.gone_by_name
                .assign(gone, short_lived, &taken.locker_comms)
        };
        let taken = folding.apply(&taken);
        for window in self.open.values_mut() {
            window.forget(gone, &taken, &folding);
        }
        self.interval.forget(gone, &taken, &folding);
        if self.forgetting == Forgetting::Entirely {
            self.cumulative.from.harvest.forget_processes(gone);
            self.forgotten_named.extend(gone);
            self.drop_unkept_user_symbols();
            return;
        }
        self.cumulative.forget(gone, &taken, &folding);
        self.whole.forgotten.add_processes(&taken);
    }

    /// Drops the named user stacks of processes let go of that no window keeps anything of
    /// (`Forgetting::Entirely`: the whole trace's window keeps everything otherwise).
    fn drop_unkept_user_symbols(&mut self) {
        if self.forgotten_named.is_empty() {
            return;
        }
        let kept: HashSet<u32> = self
            .forgotten_parts()
            .flat_map(Harvest::stack_refs)
            .filter_map(|stack| match stack {
                StackRef::User { pid, .. } => Some(pid),
                StackRef::Kernel(_) => None,
            })
            .collect();
        let unkept: Vec<u32> = self
            .forgotten_named
            .iter()
            .copied()
            .filter(|pid| !kept.contains(pid))
            .collect();
        for pid in unkept {
            self.symbolizer.forget_process(pid);
            self.forgotten_named.remove(&pid);
        }
    }

    /// The processes the last snapshot holds entries of (as mm owners or outside lockers).
    pub fn processes_seen(&self) -> HashSet<u32> {
        self.previous.harvest.processes().collect()
    }

    /// The report of the whole trace at its end, `last` its final read, named by everything the
    /// windows symbolized and what `last` adds; with the symbols, for the timeline. `gone`:
    /// processes already gone, let go of (and the `short_lived` folded) as those before them.
    pub fn finish(
        mut self,
        last: Mark,
        (gone, short_lived): (&HashSet<u32>, &HashSet<u32>),
        mappings: &HashMap<u32, MappingHistory>,
        meta: &TraceMeta,
        per_thread: bool,
    ) -> (Report, Symbols) {
        self.symbolize(&last.harvest, mappings);
        self.previous = last;
        if self.forgetting == Forgetting::KeepingWhatTheyDid && !gone.is_empty() {
            self.forget_processes(gone, short_lived, &Harvest::default());
        }
        let split = self.split(per_thread);
        let symbols = self.symbolizer.into_symbols();
        let report = self.whole.report(&self.previous, &symbols, meta, split);
        (report, symbols)
    }

    fn split(&self, per_thread: bool) -> Split {
        Split {
            per_thread,
            per_pid: self.per_pid,
        }
    }
}
