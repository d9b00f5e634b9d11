//! One trace session: the loop that runs while the programs trace, what it learns of the traced
//! processes (`Watch`), the windows its views are shown (`Windows`), what a daemon lets go of
//! once it is gone, and the report the trace ends with, built by the same function as every
//! window's.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use anyhow::Result;
use tracer_common::{Counter, StateKey};

use crate::model::retention::GoneTwice;
use crate::model::unwound::CopyStats;
use tracer_common::TimelineEvent;

use crate::model::{Harvest, Report, StackRef, Symbols, TraceMeta};
use crate::probes::source::{Forget, Source};
use crate::system::procfs;

use super::watch::Watch;
use super::windows::{Forgetting, Mark, Windows};
use super::{
    deadline_after, Ask, Flow, Shown, Sink, Stops, Targets, Want, FORGET_DEAD_EVERY,
    FORGET_GONE_EVERY, MAPPINGS_EVERY, TICK,
};

/// What a session is told at its start.
pub struct SessionSettings {
    pub targets: Targets,
    /// What the report calls the target.
    pub comm: String,
    pub stack_threshold_ns: u64,
    /// A launched command's fault count before it was let go, so that the faults of its start
    /// count (the first look comes a tick later).
    pub fault_baseline: Option<(u32, u64)>,
    /// Whether the programs keep the targets' threads apart (the live view, copied stacks).
    pub collected_per_thread: bool,
    /// Whether the final report does (--per-thread).
    pub report_per_thread: bool,
    /// Keep each outside locker's process apart in every report (--per-pid).
    pub per_pid: bool,
    /// Where to look for debug files before /usr/lib/debug (--debug-dir).
    pub debug_dirs: Vec<std::path::PathBuf>,
    /// What becomes of processes and threads once they are gone (see `Forgetting`).
    pub forgetting: Forgetting,
}

/// How the trace ended.
pub struct Ending {
    /// Why, for the closing message: "duration reached", "target exited", "quit", "error",
    /// or the signal's name.
    pub by: &'static str,
    /// Every target exited.
    pub exited: bool,
    /// A view or a snapshot that failed: the trace ended early, its outputs still written.
    pub failure: Option<anyhow::Error>,
}

/// What the trace ends with: its report, and what its timeline export needs beside it.
pub struct FinalTrace {
    pub report: Report,
    pub symbols: Symbols,
    /// Waits and holds over the timeline threshold, oldest first.
    pub timeline: Vec<TimelineEvent>,
    /// Every process named, by its pid.
    pub processes: HashMap<u32, String>,
    pub threads: HashMap<u32, String>,
    /// Timeline events the ring buffer had no room for.
    pub timeline_dropped: u64,
}

/// Processes whose last thread lived less than this are folded by name once gone (unless
/// `--per-pid`): a shell loop's, a build's, which a busy machine starts by the hundred.
const SHORT_LIVED_NS: u64 = 1_000_000_000;

/// The processes of `exited` (pid -> how long its last thread lived) that were short-lived.
fn short_lived(exited: &HashMap<u32, u64>) -> HashSet<u32> {
    exited
        .iter()
        .filter(|&(_, &lived)| lived < SHORT_LIVED_NS)
        .map(|(&pid, _)| pid)
        .collect()
}

pub struct Session {
    settings: SessionSettings,
    watch: Watch,
    windows: Windows,
    /// Processes with entries that were gone at the last snapshot (see `Forgetting`).
    gone_processes: GoneTwice<u32>,
    /// Threads with a lock state that were gone at the last snapshot (see `Forgetting`).
    gone_threads: GoneTwice<u32>,
    /// When the maps were last read, and how many traced processes had exited then.
    last_read: Option<Instant>,
    exits_at_last_read: u64,
    /// The processes the kernel saw exit before the last read of the maps.
    exited_before_read: HashMap<u32, u64>,
}

impl Session {
    pub fn new(settings: SessionSettings) -> Self {
        Self {
            windows: Windows::new(settings.per_pid, settings.forgetting, &settings.debug_dirs),
            settings,
            watch: Watch::default(),
            gone_processes: GoneTwice::default(),
            gone_threads: GoneTwice::default(),
            last_read: None,
            exits_at_last_read: 0,
            exited_before_read: HashMap::new(),
        }
    }

    /// Runs until the end of the trace (duration, Ctrl-C, SIGTERM, SIGHUP, every target gone,
    /// or the sink says stop), sampling thread counts, mappings and thread names, draining the
    /// timeline and the stack copies, and showing the sink the snapshots it asks for. A sink
    /// that fails (stdout closed under `-i 1 | head`, a failed refresh) ends the trace like a
    /// stop, with the error beside what was collected: the final outputs are still written.
    /// A sink that wants a last snapshot (`Sink::at_end`) is shown one after the loop, unless
    /// something failed.
    pub async fn run(
        &mut self,
        duration: Option<f64>,
        source: &mut dyn Source,
        sink: &mut dyn Sink,
        stops: &mut Stops,
    ) -> Ending {
        let start = Instant::now();
        self.watch = Watch::new(self.settings.fault_baseline);
        let mut failure = self
            .watch_until_done(start, duration, source, sink, stops)
            .await;
        self.watch.elapsed = start.elapsed();
        if failure.is_none() {
            if let Some(ask) = sink.at_end() {
                failure = self
                    .snapshot(&*source, Instant::now(), ask)
                    .and_then(|shown| sink.show(shown))
                    .err();
            }
        }
        Ending {
            by: self.watch.ended_by,
            exited: self.watch.exited,
            failure,
        }
    }

    async fn watch_until_done(
        &mut self,
        start: Instant,
        duration: Option<f64>,
        source: &mut dyn Source,
        sink: &mut dyn Sink,
        stops: &mut Stops,
    ) -> Option<anyhow::Error> {
        let deadline = duration.and_then(|secs| deadline_after(start, secs));
        let mut tick = tokio::time::interval(TICK);
        let wakeup = sink.wakeup().unwrap_or_default();
        let mut last_mappings: Option<Instant> = None;
        let mut last_forget = start;
        let targets = self.settings.targets.clone();
        loop {
            let now = Instant::now();
            let refresh = last_mappings.is_none_or(|t| now.duration_since(t) >= MAPPINGS_EVERY);
            if refresh {
                if let Err(err) = source.refresh_cgroup_filter() {
                    log::debug!("refreshing the --cgroup filter: {err:#}");
                }
                self.watch.look_at_processes(&targets, source);
                last_mappings = Some(now);
            }
            if now.duration_since(last_forget) >= FORGET_DEAD_EVERY {
                let kept = self.windows.kept_stack_owners();
                self.watch.forget_dead_processes(source, &kept);
                last_forget = now;
            }
            // System-wide, counting threads means a directory read per process: once a refresh.
            if refresh || !targets.is_system_wide() {
                self.watch.count_threads(source);
                self.watch.sample_faults(source.follows_forks());
            }
            self.watch.take_looks();
            self.watch.elapsed = start.elapsed();
            source.drain_timeline();
            let copies = source.drain_user_stacks();
            self.watch.unwind(copies, |id| source.stack(id));
            if let Targets::Pids(pids) = &targets {
                if pids.iter().all(|&p| procfs::process_has_ended(p)) {
                    self.watch.exited = true;
                    self.watch.ended_by = "target exited";
                    return None;
                }
            }
            if deadline.is_some_and(|d| now >= d) {
                self.watch.ended_by = "duration reached";
                return None;
            }
            match self
                .tick(sink, source)
                .and_then(|flow| self.forget_if_due(source).map(|()| flow))
            {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => {
                    self.watch.ended_by = "quit";
                    return None;
                }
                Err(err) => {
                    self.watch.ended_by = "error";
                    return Some(err);
                }
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = wakeup.notified() => {}
                signal = stops.next() => { self.watch.ended_by = signal; return None }
            }
        }
    }

    /// Asks the sink what it wants of this tick and, when it is a snapshot, takes and shows it.
    fn tick(&mut self, sink: &mut dyn Sink, source: &dyn Source) -> Result<Flow> {
        let now = Instant::now();
        match sink.poll(now) {
            Want::Nothing => Ok(Flow::Continue),
            Want::Stop => Ok(Flow::Stop),
            Want::Snapshot(ask) => {
                let shown = self.snapshot(source, now, ask)?;
                sink.show(shown)
            }
        }
    }

    /// Reads the cumulative maps, completed with what the watch knows (unwound stacks,
    /// faults), and makes of them what `ask` asks for: the windows advanced (and reset), the
    /// windows it closes reported and those it opens opened. A session that forgets the gone
    /// does so once the snapshot is in the windows, before the closing.
    fn snapshot(&mut self, source: &dyn Source, at: Instant, ask: Ask) -> Result<Shown> {
        let now = self.read(source, at, true)?;
        let meta = self.window_meta();
        let live = self
            .windows
            .advance(now, &meta, self.watch.threads_now, ask.per_thread);
        if ask.reset {
            self.windows.reset();
        }
        self.forget_the_gone(source);
        let meta = self.window_meta();
        let closed = ask
            .close
            .iter()
            .filter_map(|&id| Some((id, self.windows.close(id, &meta)?)))
            .collect();
        let opened = (0..ask.open).map(|_| self.windows.open()).collect();
        Ok(Shown {
            at,
            live,
            opened,
            closed,
        })
    }

    /// Reads the cumulative maps, completed with what the watch knows (unwound stacks,
    /// faults). `shown`: for a view, whose new stacks are named now. A read only to let go of
    /// the gone names none here (the first names the kernel's symbols, which takes long enough
    /// for a busy machine to fill the maps meanwhile): `forget_if_due` names the user stacks of
    /// the processes let go of once their keys are deleted.
    fn read(&mut self, source: &dyn Source, at: Instant, shown: bool) -> Result<Mark> {
        self.watch.take_exec_names(source);
        let exits = source.exited_processes().unwrap_or(self.exits_at_last_read);
        if self.settings.forgetting != Forgetting::Never {
            self.exited_before_read = source.exited_pids().unwrap_or_default();
        }
        let mut harvest = source.snapshot()?;
        (self.last_read, self.exits_at_last_read) = (Some(at), exits);
        self.watch.complete(&mut harvest);
        if shown {
            self.windows.symbolize(&harvest, &self.watch.mappings);
        }
        Ok(Mark {
            harvest,
            thread_time_ns: self.watch.thread_time_ns,
            elapsed: self.watch.elapsed,
        })
    }

    /// Between the snapshots views ask for, a session that forgets the gone reads the maps
    /// itself once processes have exited since the last read (or some gone at the last look
    /// wait for their second), at most every FORGET_GONE_EVERY: a machine that starts hundreds
    /// of processes a second fills the maps in seconds otherwise.
    fn forget_if_due(&mut self, source: &dyn Source) -> Result<()> {
        if self.settings.forgetting == Forgetting::Never {
            return Ok(());
        }
        let now = Instant::now();
        if self
            .last_read
            .is_some_and(|at| now.duration_since(at) < FORGET_GONE_EVERY)
        {
            return Ok(());
        }
        let exited = source.exited_processes().unwrap_or(0) != self.exits_at_last_read;
        if !exited && !self.gone_processes.is_waiting() {
            return Ok(());
        }
        let mark = self.read(source, now, false)?;
        self.windows.note(mark);
        self.forget_the_gone(source);
        // Once their keys are gone from the maps: the first symbolization takes long.
        self.windows
            .symbolize_forgotten_user_stacks(&self.watch.mappings);
        log::debug!("read the maps to let go of the gone in {:?}", now.elapsed());
        Ok(())
    }

    fn forget_the_gone(&mut self, kernel: &dyn Forget) {
        if self.settings.forgetting != Forgetting::Never {
            self.forget_gone_processes(kernel);
            self.forget_gone_threads(kernel);
        }
    }

    /// The trace's facts as a window's report states them (narrowed to the window by
    /// `report_between`).
    fn window_meta(&self) -> TraceMeta {
        let s = &self.settings;
        self.watch
            .trace_meta(&s.targets, &s.comm, s.stack_threshold_ns)
    }

    /// Once shown, the entries of processes that are gone only take room: they leave the
    /// kernel maps, the windows and the names. A failure only costs room: logged.
    ///
    /// Only processes already gone at the previous snapshot are forgotten: the one just taken
    /// was read after their end, so it holds all they did (one that ended while it was read
    /// could still have had operations after it).
    ///
    /// Those the kernel saw exit before the snapshot was read (`exited_before_read`) go at once.
    fn forget_gone_processes(&mut self, kernel: &dyn Forget) {
        let exited = std::mem::take(&mut self.exited_before_read);
        let others = self
            .windows
            .processes_seen()
            .into_iter()
            .filter(|pid| !exited.contains_key(pid));
        // A pid alive again in between was reused: the new process's entries stay.
        let mut gone: HashSet<u32> = self
            .gone_processes
            .look(others, procfs::process_has_ended)
            .into_iter()
            .collect();
        gone.extend(exited.keys());
        if gone.is_empty() {
            return;
        }
        let short_lived = short_lived(&exited);
        for &pid in &gone {
            self.gone_processes.let_go(pid);
        }
        let pending = kernel.take_pending(&gone).unwrap_or_else(|err| {
            log::warn!("reading what processes that are gone left pending: {err:#}");
            Harvest::default()
        });
        match kernel.forget_processes(&gone) {
            Ok(deleted) => log::debug!(
                "forgot {} processes that are gone: {deleted} kernel entries",
                gone.len()
            ),
            Err(err) => log::warn!("forgetting processes that are gone: {err:#}"),
        }
        self.windows.forget_processes(&gone, &short_lived, &pending);
        self.watch.forget_names(&gone);
    }

    /// The lock states of threads gone since the last snapshot, unless they still hold an
    /// aggregation left pending (an exec leaves one on the old mm).
    fn forget_gone_threads(&mut self, kernel: &dyn Forget) {
        let states = match kernel.thread_states() {
            Ok(states) => states,
            Err(err) => {
                log::warn!("reading the threads' lock states: {err:#}");
                return;
            }
        };
        // A thread id alive again in between was reused: the new thread's state stays.
        let gone_twice: HashSet<u32> = self
            .gone_threads
            .look(states.iter().map(|(key, _)| key.tid), |tid| {
                !procfs::is_alive(tid)
            })
            .into_iter()
            .collect();
        let keys: Vec<StateKey> = states
            .into_iter()
            .filter(|(key, pending)| !pending && gone_twice.contains(&key.tid))
            .map(|(key, _)| key)
            .collect();
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            self.gone_threads.let_go(key.tid);
        }
        match kernel.forget_threads(&keys) {
            Ok(deleted) => log::debug!(
                "forgot {} threads that are gone: {deleted} kernel entries",
                keys.len()
            ),
            Err(err) => log::warn!("forgetting threads that are gone: {err:#}"),
        }
    }

    /// Disarms the programs, reads everything they collected, and builds the report of the
    /// whole trace (reusing what the windows already symbolized).
    pub fn finish(mut self, source: &mut dyn Source) -> Result<FinalTrace> {
        let phase = Instant::now();
        // Disarmed first, so that no copy arrives after the last drain.
        source.disarm()?;
        self.watch.count_threads(source);
        // A launched command that exited is still a zombie here, its counts whole.
        self.watch.sample_faults(source.follows_forks());
        let records = source.drain_user_stacks();
        self.watch.unwind(records, |id| source.stack(id));
        self.log_unwinding();
        log::info!("{}", self.watch.memory_line());
        let mut harvest = source.final_harvest()?;
        self.watch.complete(&mut harvest);
        log::info!(
            "harvested {} entries, {} timeline events in {:?}",
            harvest.entries.len(),
            harvest.timeline.len(),
            phase.elapsed()
        );
        let timeline = std::mem::take(&mut harvest.timeline);
        let phase = Instant::now();
        // Catch the libraries loaded since the last look (system-wide, processes are read once
        // when first seen), and the looks still under way.
        self.watch.refresh_mappings(&stack_owners(&harvest));
        self.watch.take_cgroups(source);
        let process_names = self.names_now(&harvest);
        let meta = TraceMeta {
            process_names: process_names.clone(),
            // Every thread that ran during the trace: a tree of short-lived processes is rarely
            // alive at one of the looks.
            threads: self.watch.max_threads.max(self.watch.threads_seen),
            ..self.window_meta()
        };
        let mut processes = harvest.locker_comms.clone();
        processes.extend(process_names);
        let timeline_dropped = harvest
            .counters
            .iter()
            .find(|(c, _)| *c == Counter::TimelineDropped)
            .map_or(0, |(_, n)| *n);
        let last = Mark {
            harvest,
            thread_time_ns: self.watch.thread_time_ns,
            elapsed: self.watch.elapsed,
        };
        // Threads kept apart only for the tracer's own needs are merged, as a window merges
        // them when they are not asked for.
        let per_thread = self.settings.report_per_thread || !self.settings.collected_per_thread;
        // Those gone by now go as those forgotten before them did (their entries are whole:
        // the programs are disarmed).
        let (gone, short_lived) = match self.settings.forgetting {
            Forgetting::KeepingWhatTheyDid => (
                last.harvest
                    .processes()
                    .filter(|&pid| procfs::process_has_ended(pid))
                    .collect(),
                short_lived(&source.exited_pids().unwrap_or_default()),
            ),
            _ => (HashSet::new(), HashSet::new()),
        };
        let (report, symbols) = self.windows.finish(
            last,
            (&gone, &short_lived),
            &self.watch.mappings,
            &meta,
            per_thread,
        );
        log::info!(
            "symbolized {} stacks in {:?}",
            symbols.len(),
            phase.elapsed()
        );
        Ok(FinalTrace {
            report,
            symbols,
            timeline,
            processes,
            threads: std::mem::take(&mut self.watch.thread_names),
            timeline_dropped,
        })
    }

    /// Says (-v) how the user stack copies were used and how their walks ended.
    fn log_unwinding(&self) {
        log_copy_use(
            &self.watch.pending_copies.stats,
            self.watch.unwound.events(),
        );
        let walks = self.watch.walk_stats();
        if walks.walks > 0 {
            log::info!(
                "user stack walks: {}, {} needed stack past the copied window \
                 (--user-stack-bytes), {} cut short otherwise (a frame without unwind info, or \
                 too deep)",
                walks.walks,
                walks.past_window,
                walks.cut_otherwise
            );
        }
    }

    /// Every process the harvest names (mm owners and outside lockers), named as /proc says
    /// now, else as it said when first seen; the given targets fall back to the name they had
    /// at the start. Processes missing here are named by the kernel's record in the model.
    fn names_now(&self, harvest: &Harvest) -> HashMap<u32, String> {
        let targets = &self.settings.targets;
        let mut names = HashMap::new();
        let pids = harvest
            .entries
            .iter()
            .flat_map(|e| [e.key.pid, e.key.locker_pid])
            .chain(targets.listed().iter().copied())
            .filter(|&pid| pid != 0);
        for pid in pids {
            if names.contains_key(&pid) {
                continue;
            }
            // Alive: as /proc says now. Gone: as the kernel last recorded it (a child of a
            // traced command renamed by its exec after the tracer first saw it), else as first
            // seen.
            let known = procfs::comm(pid)
                .or_else(|| harvest.locker_comms.get(&pid).cloned())
                .or_else(|| self.watch.process_names.get(&pid).cloned());
            if let Some(name) = known {
                names.insert(pid, name);
            }
        }
        for &pid in targets.listed() {
            names
                .entry(pid)
                .or_insert_with(|| self.settings.comm.clone());
        }
        names
    }
}

/// Every process whose user stacks the harvest holds (those that exited keep the mappings
/// seen while they ran).
fn stack_owners(harvest: &Harvest) -> Vec<u32> {
    let owners: HashSet<u32> = harvest
        .stack_refs()
        .into_iter()
        .filter_map(|r| match r {
            StackRef::User { pid, .. } => Some(pid),
            StackRef::Kernel(_) => None,
        })
        .collect();
    owners.into_iter().collect()
}

fn log_copy_use(stats: &CopyStats, unwound_events: u64) {
    if stats.copies > 0 {
        log::info!(
            "user stacks: {} copies ({} made late, inside the critical section), {} events \
             unwound, {} events whose copy was gone",
            stats.copies,
            stats.late_copies,
            unwound_events,
            stats.events_without_copy
        );
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::time::Duration;

    use tracer_common::{AggKey, AggValue, KIND_HOLD, MODE_READ, NO_STACK};

    use super::*;
    use crate::collect::WindowId;
    use crate::model::unwound::StackRecord;
    use crate::model::RawEntry;
    use crate::model::Report;

    /// The kernel side as the loop sees it, without BPF: snapshot n has n acquisitions, and
    /// one hold of 1 µs by `holder` per snapshot when set.
    #[derive(Default)]
    struct FakeSource {
        snapshots_taken: Cell<u64>,
        drains: usize,
        exited_threads: u64,
        exited_processes: u64,
        snapshot_fails: bool,
        holder: Option<u32>,
        disarmed: bool,
        /// The processes the session asked to forget.
        forgotten: RefCell<Vec<u32>>,
    }

    impl FakeSource {
        fn harvest(&self) -> Harvest {
            let n = self.snapshots_taken.get();
            let mut harvest = Harvest::default();
            harvest.totals[0].acquisitions = n;
            if let Some(pid) = self
                .holder
                .filter(|pid| !self.forgotten.borrow().contains(pid))
            {
                let mut value = AggValue::default();
                for _ in 0..n {
                    value.add(1_000);
                }
                let key = AggKey {
                    pid,
                    tid: 0,
                    locker_pid: 0,
                    kernel_stack: NO_STACK,
                    user_stack: NO_STACK,
                    kind: KIND_HOLD,
                    mode: MODE_READ,
                    syscall: 0,
                    fault: 0,
                };
                harvest.entries.push(RawEntry::exact(key, value));
            }
            harvest
        }
    }

    impl Forget for FakeSource {
        fn thread_states(&self) -> Result<Vec<(StateKey, bool)>> {
            Ok(Vec::new())
        }
        fn take_pending(&self, _: &HashSet<u32>) -> Result<Harvest> {
            Ok(Harvest::default())
        }
        fn forget_processes(&self, gone: &HashSet<u32>) -> Result<usize> {
            self.forgotten.borrow_mut().extend(gone);
            Ok(gone.len())
        }
        fn forget_threads(&self, _: &[StateKey]) -> Result<usize> {
            Ok(0)
        }
    }

    impl Source for FakeSource {
        fn follows_forks(&self) -> bool {
            false
        }
        fn inherited_pids(&self) -> Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn registered_pids(&self) -> Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn exec_names(&self) -> Result<HashMap<u32, String>> {
            Ok(HashMap::new())
        }
        fn process_cgroups(&self) -> Result<HashMap<u32, u64>> {
            Ok(HashMap::new())
        }
        fn refresh_cgroup_filter(&mut self) -> Result<()> {
            Ok(())
        }
        fn user_stack_owners(&self) -> Result<HashSet<u32>> {
            Ok(HashSet::new())
        }
        fn exited_threads(&self) -> Result<(u64, u64)> {
            Ok((1_000, self.exited_threads))
        }
        fn exited_processes(&self) -> Result<u64> {
            Ok(self.exited_processes)
        }
        fn exited_pids(&self) -> Result<HashMap<u32, u64>> {
            Ok(HashMap::new())
        }
        fn trace_start_ns(&self) -> u64 {
            procfs::monotonic_ns()
        }
        fn drain_timeline(&mut self) {
            self.drains += 1;
        }
        fn drain_user_stacks(&mut self) -> Vec<StackRecord> {
            Vec::new()
        }
        fn stack(&self, _: i32) -> Option<Vec<u64>> {
            None
        }
        fn snapshot(&self) -> Result<Harvest> {
            if self.snapshot_fails {
                anyhow::bail!("the maps could not be read");
            }
            self.snapshots_taken.set(self.snapshots_taken.get() + 1);
            Ok(self.harvest())
        }
        fn disarm(&mut self) -> Result<()> {
            self.disarmed = true;
            Ok(())
        }
        fn final_harvest(&mut self) -> Result<Harvest> {
            assert!(self.disarmed, "read before the programs were disarmed");
            self.snapshots_taken.set(self.snapshots_taken.get() + 1);
            Ok(self.harvest())
        }
    }

    /// What a sink was shown of one snapshot.
    #[derive(Debug)]
    struct Seen {
        cumulative: u64,
        interval: u64,
        threads_now: usize,
        opened: Vec<WindowId>,
        closed: Vec<(WindowId, Report)>,
    }

    /// Wants what its script says, one tick each (then nothing), and notes what it was shown.
    #[derive(Default)]
    struct ScriptedSink {
        wants: VecDeque<Want>,
        shown: Vec<Seen>,
        polls: usize,
        show_fails: bool,
        at_end: Option<Ask>,
    }

    impl Sink for ScriptedSink {
        fn poll(&mut self, _: Instant) -> Want {
            self.polls += 1;
            self.wants.pop_front().unwrap_or(Want::Nothing)
        }

        fn show(&mut self, shown: Shown) -> Result<Flow> {
            if self.show_fails {
                anyhow::bail!("stdout closed");
            }
            self.shown.push(Seen {
                cumulative: shown.live.cumulative.totals.read.acquisitions,
                interval: shown.live.interval.totals.read.acquisitions,
                threads_now: shown.live.threads_now,
                opened: shown.opened,
                closed: shown.closed,
            });
            Ok(Flow::Continue)
        }

        fn at_end(&self) -> Option<Ask> {
            self.at_end.clone()
        }
    }

    fn session(targets: Targets, forgetting: Forgetting) -> Session {
        Session::new(SessionSettings {
            targets,
            comm: "target".into(),
            stack_threshold_ns: 0,
            fault_baseline: None,
            collected_per_thread: false,
            report_per_thread: false,
            per_pid: false,
            debug_dirs: Vec::new(),
            forgetting,
        })
    }

    fn run_loop(
        session: &mut Session,
        duration: Option<f64>,
        source: &mut FakeSource,
        sink: &mut dyn Sink,
    ) -> Ending {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let mut stops = Stops::install().unwrap();
        runtime.block_on(session.run(duration, source, sink, &mut stops))
    }

    fn this_process() -> Targets {
        Targets::Pids(vec![std::process::id()])
    }

    fn snapshot() -> Want {
        Want::Snapshot(Ask::default())
    }

    /// A pid that is gone: a child that ran and was reaped.
    fn gone_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn the_loop_takes_a_snapshot_when_the_sink_asks_and_ends_on_its_quit() {
        let mut source = FakeSource {
            exited_threads: 3,
            ..FakeSource::default()
        };
        let mut sink = ScriptedSink {
            wants: [
                Want::Nothing,
                snapshot(),
                Want::Nothing,
                Want::Nothing,
                snapshot(),
                Want::Stop,
            ]
            .into(),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(&mut session, None, &mut source, &mut sink);
        assert!(ending.failure.is_none(), "{:?}", ending.failure);
        assert_eq!(ending.by, "quit");
        // One snapshot per ask, in order, each after the threads were counted; each shown as
        // the trace so far and as the interval since the one before.
        assert_eq!(source.snapshots_taken.get(), 2);
        let seen: Vec<(u64, u64)> = sink
            .shown
            .iter()
            .map(|s| (s.cumulative, s.interval))
            .collect();
        assert_eq!(seen, [(1, 1), (2, 1)]);
        assert!(
            sink.shown.iter().all(|s| s.threads_now >= 1),
            "{:?}",
            sink.shown
        );
        // Every tick drains the kernel's buffers before the sink is asked.
        assert_eq!(sink.polls, 6);
        assert_eq!(source.drains, 6);
        // The exited threads the source counted are among those that ran.
        assert!(
            session.watch.threads_seen > 3,
            "{}",
            session.watch.threads_seen
        );
        assert!(!ending.exited);
    }

    #[test]
    fn the_final_report_covers_the_whole_trace_read_after_disarming() {
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink {
            wants: [snapshot(), snapshot(), Want::Stop].into(),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(&mut session, None, &mut source, &mut sink);
        assert!(ending.failure.is_none());
        let elapsed = session.watch.elapsed;
        let trace = session.finish(&mut source).unwrap();
        assert!(source.disarmed);
        // The final read is the third: all of it, not the interval since the last window.
        assert_eq!(trace.report.totals.read.acquisitions, 3);
        assert_eq!(trace.report.duration_ns, elapsed.as_nanos() as u64);
        assert_eq!(trace.report.target.comm, "target");
        assert_eq!(trace.report.target.pids, [std::process::id()]);
    }

    #[test]
    fn a_window_opened_at_one_snapshot_reports_what_came_until_the_one_that_closes_it() {
        let mut source = FakeSource::default();
        let open = Want::Snapshot(Ask {
            open: 1,
            ..Ask::default()
        });
        let mut sink = ScriptedSink {
            wants: [open, snapshot(), Want::Stop].into(),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        run_loop(&mut session, None, &mut source, &mut sink);
        let window = sink.shown[0].opened[0];
        assert!(sink.shown[1].closed.is_empty());
        // Closed two snapshots later: acquisitions 1 -> 4, with a reset on the way that does
        // not touch it.
        let close = Want::Snapshot(Ask {
            close: vec![window],
            reset: true,
            ..Ask::default()
        });
        let mut sink = ScriptedSink {
            wants: [snapshot(), close, snapshot(), Want::Stop].into(),
            ..ScriptedSink::default()
        };
        run_loop(&mut session, None, &mut source, &mut sink);
        let (id, report) = &sink.shown[1].closed[0];
        assert_eq!(*id, window);
        assert_eq!(report.totals.read.acquisitions, 3);
        // The reset starts the cumulative window at the snapshot that asked for it.
        let cumulative: Vec<u64> = sink.shown.iter().map(|s| s.cumulative).collect();
        assert_eq!(cumulative, [3, 4, 1]);
    }

    #[test]
    fn a_session_that_forgets_the_gone_does_so_at_their_second_look_and_keeps_their_part_in_open_windows(
    ) {
        let pid = gone_pid();
        let mut source = FakeSource {
            holder: Some(pid),
            ..FakeSource::default()
        };
        let open = Want::Snapshot(Ask {
            open: 1,
            ..Ask::default()
        });
        let mut sink = ScriptedSink {
            wants: [open, snapshot(), snapshot(), Want::Stop].into(),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Entirely);
        run_loop(&mut session, None, &mut source, &mut sink);
        // Gone at the first and second snapshots: forgotten at the second.
        assert_eq!(*source.forgotten.borrow(), [pid]);
        let window = sink.shown[0].opened[0];
        let close = Want::Snapshot(Ask {
            close: vec![window],
            ..Ask::default()
        });
        let mut sink = ScriptedSink {
            wants: [close, Want::Stop].into(),
            ..ScriptedSink::default()
        };
        run_loop(&mut session, None, &mut source, &mut sink);
        let (_, report) = &sink.shown[0].closed[0];
        // Its hold of the second snapshot (one at the window's opening, two at the last read
        // before it was forgotten), still in the window although the kernel side forgot it.
        let holds: u64 = report
            .entries
            .iter()
            .filter(|e| e.pid == pid)
            .map(|e| e.count)
            .sum();
        assert_eq!(holds, 1, "{:?}", report.entries);
    }

    #[test]
    fn a_system_wide_session_reads_the_maps_itself_to_let_go_of_the_gone_and_reports_what_they_did()
    {
        let pid = gone_pid();
        // The kernel saw a process exit: the session reads the maps without a view asking.
        let mut source = FakeSource {
            holder: Some(pid),
            exited_processes: 1,
            ..FakeSource::default()
        };
        let mut sink = ScriptedSink::default();
        let mut session = session(this_process(), Forgetting::KeepingWhatTheyDid);
        run_loop(&mut session, Some(1.5), &mut source, &mut sink);
        assert!(sink.shown.is_empty());
        // Gone at the first and second reads (FORGET_GONE_EVERY apart): forgotten at the
        // second, and no read after it (nothing else exited).
        assert_eq!(*source.forgotten.borrow(), [pid]);
        assert_eq!(source.snapshots_taken.get(), 2);
        let trace = session.finish(&mut source).unwrap();
        // Its two holds (one per read) are in the report of the whole trace, although the
        // final read no longer has them.
        let holds: u64 = trace
            .report
            .entries
            .iter()
            .filter(|e| e.pid == pid)
            .map(|e| e.count)
            .sum();
        assert_eq!(holds, 2, "{:?}", trace.report.entries);
    }

    #[test]
    fn a_sink_that_wants_a_last_snapshot_is_shown_one_after_the_end() {
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink {
            at_end: Some(Ask::default()),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(&mut session, Some(0.0), &mut source, &mut sink);
        assert_eq!(ending.by, "duration reached");
        assert_eq!(sink.polls, 0);
        assert_eq!(sink.shown.len(), 1);
    }

    #[test]
    fn a_sink_that_fails_ends_the_trace_with_its_error() {
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink {
            wants: [snapshot(), snapshot()].into(),
            show_fails: true,
            at_end: Some(Ask::default()),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(&mut session, Some(30.0), &mut source, &mut sink);
        assert_eq!(ending.by, "error");
        assert_eq!(
            ending.failure.map(|e| e.to_string()).as_deref(),
            Some("stdout closed")
        );
        // No last snapshot after a failure.
        assert_eq!(sink.polls, 1);
        assert_eq!(source.snapshots_taken.get(), 1);
    }

    #[test]
    fn a_snapshot_that_cannot_be_read_ends_the_trace_without_showing_it() {
        let mut source = FakeSource {
            snapshot_fails: true,
            ..FakeSource::default()
        };
        let mut sink = ScriptedSink {
            wants: [snapshot()].into(),
            ..ScriptedSink::default()
        };
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(&mut session, Some(30.0), &mut source, &mut sink);
        assert_eq!(ending.by, "error");
        assert!(ending.failure.is_some());
        assert!(sink.shown.is_empty());
    }

    #[test]
    fn the_duration_ends_the_trace_on_the_loops_clock() {
        let mut source = FakeSource::default();
        let started = Instant::now();
        let mut session = session(this_process(), Forgetting::Never);
        let ending = run_loop(
            &mut session,
            Some(0.35),
            &mut source,
            &mut super::super::NoSink,
        );
        assert!(ending.failure.is_none());
        assert_eq!(ending.by, "duration reached");
        let elapsed = session.watch.elapsed;
        assert!(elapsed >= Duration::from_millis(350), "{elapsed:?}");
        assert!(elapsed <= started.elapsed());
        // A tick every 100 ms: the fourth or a later one sees the deadline.
        assert!(source.drains >= 4, "{}", source.drains);
    }

    #[test]
    fn a_target_that_exits_ends_the_trace() {
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink::default();
        let mut session = session(Targets::Pids(vec![gone_pid()]), Forgetting::Never);
        let ending = run_loop(&mut session, Some(30.0), &mut source, &mut sink);
        assert!(ending.failure.is_none());
        assert_eq!(ending.by, "target exited");
        assert!(ending.exited);
        // It ends before the sink is asked anything: the final report covers the rest.
        assert_eq!(sink.polls, 0);
    }
}
