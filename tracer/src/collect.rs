//! The collect loop: runs while the programs trace, samples what /proc says about the targets,
//! drains the timeline, and hands running snapshots to whoever shows them (the live view, the
//! interval printer, the daemon). It ends on the duration, a signal, the targets' exit, or the
//! view's quit.
//!
//! The loop owns the clock and reads the kernel side through a `Source` (the probes, or a fake
//! in the tests below); a `Sink` says at each tick whether it wants a snapshot and is shown the
//! one the loop took, so the views never touch the probes.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::Notify;

use crate::model::retention::GoneTwice;
use crate::model::thread_time::thread_time_ns;
use crate::model::unwound::{splice, PendingCopies, StackRecord, Unwound};
use crate::model::{build_report, delta, Harvest, LiveSnapshot, Report, TraceMeta};
pub use crate::probes::source::{Forget, Source};
use crate::symbolize::StackSymbolizer;
use crate::system::proc_looker::{ProcLooker, ProcessLook};
use crate::system::procfs::{self, MappingHistory};
use crate::unwind::StackUnwinder;

/// How often liveness and thread counts are sampled, the timeline drained and the view asked
/// whether to stop.
const TICK: Duration = Duration::from_millis(100);
/// How often executable mappings and thread names are re-read (reading /proc/PID/maps takes
/// the target's lock).
const MAPPINGS_EVERY: Duration = Duration::from_secs(1);
/// How long unwinding waits for a process's maps when a copied stack lies outside the known
/// mappings (a library loaded since the last look); past it, it unwinds with what it has.
const UNWIND_LOOK_WAIT: Duration = Duration::from_millis(50);
/// How long the end of the trace waits for the maps of the processes whose stacks it shows.
const FINAL_LOOK_WAIT: Duration = Duration::from_secs(2);
/// How often the mapping lists and unwinders of processes that exited are let go (those whose
/// stacks the collected data refers to are kept, to be symbolized at the end).
const FORGET_DEAD_EVERY: Duration = Duration::from_secs(10);

/// What was learned about the targets while the programs ran.
#[derive(Default)]
pub struct Watch {
    pub started: Option<Instant>,
    pub elapsed: Duration,
    pub exited: bool,
    /// Why the loop ended, for the closing message.
    pub ended_by: &'static str,
    pub max_threads: usize,
    pub threads_now: usize,
    /// Sum over the target threads of the time each lived inside the trace.
    pub thread_time_ns: u64,
    /// Start time (monotonic ns) of each target thread alive at the last count.
    thread_starts: HashMap<u32, u64>,
    pub mappings: HashMap<u32, MappingHistory>,
    pub thread_names: HashMap<u32, String>,
    /// The processes watched at the last look: the targets, or system-wide every process
    /// registered so far.
    pub pids: Vec<u32>,
    /// Process names (comm) as /proc gave them when first seen.
    pub process_names: HashMap<u32, String>,
    /// User stacks unwound from the kernel's copies so far (`--user-stack dwarf`).
    pub unwound: Unwound,
    /// Copies waiting for the events that use them.
    pub pending_copies: PendingCopies,
    unwinder: StackUnwinder,
    /// Reads /proc on its own thread, so that a stalled target does not stall the loop.
    looker: ProcLooker,
    /// The targets as listed (-p, the launched command), without the processes they forked.
    listed: Vec<u32>,
    /// Threads that ran during the trace, as of the last count: those alive then and those
    /// that exited.
    pub threads_seen: usize,
    /// Processes with a mapping list that were gone at the last `forget_dead_processes`.
    dead: GoneTwice<u32>,
    /// Mapping lists let go so far, for -v.
    pub mapping_lists_forgotten: usize,
    /// Per target: (faults at the first look, faults at the last look), from /proc.
    faults: HashMap<u32, (u64, u64)>,
}

impl Watch {
    /// The trace's facts as a report states them, for the whole trace so far: a window's
    /// report narrows the duration and thread time, the final one names processes anew.
    pub fn trace_meta(&self, targets: &Targets, comm: &str, stack_threshold_ns: u64) -> TraceMeta {
        TraceMeta {
            pids: targets.listed().to_vec(),
            system_wide: targets.is_system_wide(),
            process_names: self.process_names.clone(),
            comm: comm.to_string(),
            threads: self.threads_now,
            duration_ns: self.elapsed.as_nanos() as u64,
            thread_time_ns: self.thread_time_ns,
            exited: self.exited,
            stack_threshold_ns,
            thread_names: self.thread_names.clone(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
        }
    }

    /// How the walks of copied user stacks ended so far.
    pub fn walk_stats(&self) -> crate::unwind::WalkStats {
        self.unwinder.stats()
    }

    /// What the tracer's memory holds, for -v: its own figures from /proc/self/status, then
    /// the per-process state the collector keeps.
    pub fn memory_line(&self) -> String {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let (objects, unwinders) = self.unwinder.held();
        let (copies, copy_bytes) = self.pending_copies.raw_held();
        memory_summary(
            [
                kib("VmHWM:"),
                kib("VmRSS:"),
                kib("RssAnon:"),
                kib("RssFile:"),
            ],
            objects,
            unwinders,
            (self.mappings.len(), self.mapping_lists_forgotten),
            (copies, copy_bytes),
        )
    }
}

impl Watch {
    /// Notes the targets' page fault counts now (the kernel does not count them: a program on
    /// every fault cost more than all the lock programs together).
    /// A traced command's tree is counted at its root, with the children it reaped: each
    /// child's own count would miss the short-lived ones (a compiler living 30 ms between two
    /// looks) and count the others twice once reaped.
    pub fn sample_faults(&mut self, follows_forks: bool) {
        let pids = if follows_forks {
            &self.listed
        } else {
            &self.pids
        };
        for &pid in pids {
            if let Some(now) = procfs::faults_taken(pid, follows_forks) {
                self.faults.entry(pid).or_insert((now, now)).1 = now;
            }
        }
    }

    /// The targets' page faults since tracing began (as of their last look, for those gone).
    pub fn faults_taken(&self) -> u64 {
        self.faults.values().map(|(first, last)| last - first).sum()
    }

    /// Adds what user space knows to a harvest: unwound stacks and the fault total.
    pub fn complete(&self, harvest: &mut Harvest) {
        self.unwound.apply_to(harvest);
        harvest
            .sections
            .faults
            .set_taken_from_proc(self.faults_taken());
    }

    /// Pairs the kernel's stack copies with the events that use them and unwinds each copy
    /// (once) against the mappings seen, re-reading a process's mappings once when a copy's ip
    /// lies outside them (a library loaded since the last look).
    /// A truncated stack is completed from the frame-pointer stack of the same event
    /// (`fp_stack` reads it by id) where the two meet.
    pub fn unwind(
        &mut self,
        records: Vec<StackRecord>,
        fp_stack: impl Fn(i32) -> Option<Vec<u64>>,
    ) {
        let mut refreshed = HashSet::new();
        let mut looks = Vec::new();
        for record in records {
            let event = match record {
                StackRecord::Copy(copy) => {
                    self.pending_copies.add_copy(copy);
                    continue;
                }
                StackRecord::Event(event) => event,
            };
            let (mappings, unwinder, looker) =
                (&mut self.mappings, &mut self.unwinder, &mut self.looker);
            let stack = self.pending_copies.resolve(&event, |copy| {
                let pid = copy.header.pid;
                let known = mappings.get(&pid).and_then(|h| h.find(copy.header.ip));
                if known.is_none() && refreshed.insert(pid) {
                    looker.ask(&[pid]);
                    let arrived = looker.arrived_by(Instant::now() + UNWIND_LOOK_WAIT);
                    looks.extend(take_mappings(mappings, arrived));
                }
                unwinder.unwind(pid, copy, mappings.entry(pid).or_default())
            });
            if let Some(mut stack) = stack {
                if stack.truncated {
                    let fp = fp_stack(event.key.user_stack).unwrap_or_default();
                    stack = splice(&stack, &fp).unwrap_or(stack);
                }
                self.unwound.add(&event, stack);
            }
        }
        let stats = &self.pending_copies.stats;
        self.unwound.note_without_copy(stats.events_without_copy);
        self.merge_looks(looks);
    }

    /// Takes in the looks at processes that have arrived.
    fn take_looks(&mut self) {
        let looks = self.looker.arrived();
        self.merge_looks(looks);
    }

    fn merge_looks(&mut self, looks: Vec<ProcessLook>) {
        for look in take_mappings(&mut self.mappings, looks) {
            self.thread_names.extend(look.thread_names);
            if let Some(comm) = look.comm {
                self.process_names.insert(look.pid, comm);
            }
        }
    }

    /// Re-reads the mappings of `pids` (the end of the trace: the libraries loaded since the
    /// last look), waiting for them at most `FINAL_LOOK_WAIT`.
    pub fn refresh_mappings(&mut self, pids: &[u32]) {
        self.looker.ask(pids);
        let looks = self.looker.arrived_by(Instant::now() + FINAL_LOOK_WAIT);
        self.merge_looks(looks);
        if self.looker.busy() {
            log::warn!(
                "reading the maps of a traced process took over {} s: its stacks are \
                 symbolized with the mappings seen before",
                FINAL_LOOK_WAIT.as_secs()
            );
        }
    }
}

/// Adds the mappings the looks found to `mappings`; returns the looks without them.
fn take_mappings(
    mappings: &mut HashMap<u32, MappingHistory>,
    looks: Vec<ProcessLook>,
) -> Vec<ProcessLook> {
    looks
        .into_iter()
        .map(|mut look| {
            if let Some(found) = look.mappings.take() {
                mappings.entry(look.pid).or_default().add_all(found);
            }
            look
        })
        .collect()
}

/// Whether the loop goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// A snapshot as the loop hands it to a sink: the cumulative harvest (completed with what
/// user space knows), when the loop took it (sinks keep their cadence by the loop's clock, not
/// their own), the watch, and what of the kernel side the sink may let go of.
pub struct Snapshot<'a> {
    pub harvest: Harvest,
    pub at: Instant,
    pub watch: &'a mut Watch,
    pub kernel: &'a dyn Forget,
}

/// The cumulative maps now, completed with what the watch knows (unwound stacks, faults).
pub fn snapshot_of(source: &dyn Source, watch: &Watch) -> Result<Harvest> {
    let mut harvest = source.snapshot()?;
    watch.complete(&mut harvest);
    Ok(harvest)
}

/// What a sink wants of a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Nothing,
    /// A snapshot, handed to `Sink::show`.
    Snapshot,
    /// The end of the trace (the view's quit).
    Stop,
}

/// Something that shows the trace while it runs. Every tick the loop asks it what it wants
/// (`poll`: it takes in its own inputs, keys or requests, and keeps its own cadence by the
/// time it is given) and shows it the snapshot it asked for.
pub trait Sink {
    fn poll(&mut self, now: Instant) -> Want;

    /// Shows the snapshot asked for by the last `poll`.
    fn show(&mut self, snapshot: Snapshot<'_>) -> Result<Flow>;

    /// Notified when the sink wants its next tick now rather than at the next TICK (the live
    /// view's `q`: waiting for the tick added up to 100 ms to the exit).
    fn wakeup(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// Shows nothing (a single report at the end).
pub struct NoSink;

impl Sink for NoSink {
    fn poll(&mut self, _: Instant) -> Want {
        Want::Nothing
    }

    fn show(&mut self, _: Snapshot<'_>) -> Result<Flow> {
        Ok(Flow::Continue)
    }
}

/// What is traced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// These processes (-p, or a launched command); the trace ends when all have exited.
    Pids(Vec<u32>),
    /// Every user process (-a), as the programs register them.
    SystemWide,
}

impl Targets {
    /// The pids given on the command line (none system-wide).
    pub fn listed(&self) -> &[u32] {
        match self {
            Targets::Pids(pids) => pids,
            Targets::SystemWide => &[],
        }
    }

    pub fn is_system_wide(&self) -> bool {
        matches!(self, Targets::SystemWide)
    }
}

/// The signals that end a trace. Installed before the programs load, so that one arriving
/// while they load ends the trace as soon as it starts (with its report) instead of killing
/// the tracer; after the trace, a second one ends the tracer at once.
pub struct Stops {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Stops {
    /// Needs the tokio runtime entered (`Runtime::enter`).
    pub fn install() -> Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            hangup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
        })
    }

    /// The next of them to arrive (or that arrived since `install`).
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// The instant `secs` after `start`, or None when it is too far to represent (the command
/// line refuses such durations; this keeps the loop from panicking whatever it is given).
fn deadline_after(start: Instant, secs: f64) -> Option<Instant> {
    if secs <= 0.0 {
        return Some(start);
    }
    start.checked_add(Duration::try_from_secs_f64(secs).ok()?)
}

/// Waits for the end of the trace (duration, Ctrl-C, SIGTERM, SIGHUP, every target gone, or
/// the sink says stop) while sampling thread counts, mappings and thread names, and draining
/// the timeline. A sink that fails (stdout closed under `-i 1 | head`, a failed refresh) ends
/// the trace like a stop, with the error beside what was collected: the final outputs are
/// still written.
/// `fault_baseline`: a launched command's fault count before it was let go, so that the
/// faults of its start count (the first look comes a tick later).
pub async fn watch_until_done(
    targets: &Targets,
    fault_baseline: Option<(u32, u64)>,
    duration: Option<f64>,
    source: &mut dyn Source,
    sink: &mut dyn Sink,
    stops: &mut Stops,
) -> (Watch, Option<anyhow::Error>) {
    let start = Instant::now();
    let deadline = duration.and_then(|secs| deadline_after(start, secs));
    let mut failure = None;
    let mut tick = tokio::time::interval(TICK);
    let mut watch = Watch {
        started: Some(start),
        faults: fault_baseline
            .map(|(pid, faults)| (pid, (faults, faults)))
            .into_iter()
            .collect(),
        ..Watch::default()
    };
    let wakeup = sink.wakeup().unwrap_or_default();
    let mut last_mappings: Option<Instant> = None;
    let mut last_forget = start;
    loop {
        let now = Instant::now();
        let refresh = last_mappings.is_none_or(|t| now.duration_since(t) >= MAPPINGS_EVERY);
        if refresh {
            watch.look_at_processes(targets, source);
            last_mappings = Some(now);
        }
        if now.duration_since(last_forget) >= FORGET_DEAD_EVERY {
            watch.forget_dead_processes(source);
            last_forget = now;
        }
        // System-wide, counting threads means a directory read per process: once a refresh.
        if refresh || !targets.is_system_wide() {
            watch.count_threads(source);
            watch.sample_faults(source.follows_forks());
        }
        watch.take_looks();
        watch.elapsed = start.elapsed();
        source.drain_timeline();
        let copies = source.drain_user_stacks();
        watch.unwind(copies, |id| source.stack(id));
        if let Targets::Pids(pids) = targets {
            if pids.iter().all(|&p| procfs::process_has_ended(p)) {
                watch.exited = true;
                watch.ended_by = "target exited";
                break;
            }
        }
        if deadline.is_some_and(|d| now >= d) {
            watch.ended_by = "duration reached";
            break;
        }
        match tick_sink(sink, source, &mut watch) {
            Ok(Flow::Continue) => {}
            Ok(Flow::Stop) => {
                watch.ended_by = "quit";
                break;
            }
            Err(err) => {
                watch.ended_by = "error";
                failure = Some(err);
                break;
            }
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = wakeup.notified() => {}
            signal = stops.next() => { watch.ended_by = signal; break }
        }
    }
    watch.elapsed = start.elapsed();
    (watch, failure)
}

/// Asks the sink what it wants of this tick and, when it is a snapshot, takes and shows it.
fn tick_sink(sink: &mut dyn Sink, source: &dyn Source, watch: &mut Watch) -> Result<Flow> {
    let now = Instant::now();
    match sink.poll(now) {
        Want::Nothing => Ok(Flow::Continue),
        Want::Stop => Ok(Flow::Stop),
        Want::Snapshot => {
            watch.take_exec_names(source);
            let harvest = snapshot_of(source, watch)?;
            sink.show(Snapshot {
                harvest,
                at: now,
                watch,
                kernel: source,
            })
        }
    }
}

impl Watch {
    /// Re-reads what /proc says of the traced processes. Given targets are re-read every time
    /// (their mappings change); system-wide, only processes seen for the first time are, since
    /// reading /proc/PID/maps takes each process's mmap_lock (copies outside known mappings
    /// and the end of the trace re-read them).
    fn look_at_processes(&mut self, targets: &Targets, source: &dyn Source) {
        let (pids, only_new) = match targets {
            Targets::Pids(pids) => {
                self.listed.clone_from(pids);
                let mut pids = pids.clone();
                // A traced command's processes, as the programs follow its forks.
                pids.extend(source.inherited_pids().unwrap_or_default());
                (pids, false)
            }
            Targets::SystemWide => match source.registered_pids() {
                Ok(pids) => (pids, true),
                Err(err) => {
                    log::debug!("reading the registered processes: {err:#}");
                    return;
                }
            },
        };
        let wanted: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| !(only_new && self.process_names.contains_key(pid)))
            .collect();
        self.name_unnamed(&wanted);
        self.looker.ask(&wanted);
        self.pids = pids;
        self.take_exec_names(source);
    }

    /// Renames the processes an exec renamed: a name read from /proc may be the parent's, read
    /// while the child was still in its exec, and a process is read only once system-wide.
    /// Only those already named: a name also marks a process as read, and the others are
    /// named by the kernel's record.
    fn take_exec_names(&mut self, source: &dyn Source) {
        let names = match source.exec_names() {
            Ok(names) => names,
            Err(err) => {
                log::debug!("reading the names execs gave: {err:#}");
                return;
            }
        };
        for (pid, name) in names {
            if let Some(known) = self.process_names.get_mut(&pid) {
                *known = name;
            }
        }
    }

    /// Names the processes not named yet at once, on this thread: /proc/PID/comm does not take
    /// the target's lock, while the look that also names them reads its maps, which may wait
    /// behind its writers (and behind every process listed before it), long enough for a
    /// short-lived process to end unnamed, and be left out by `--comm`.
    fn name_unnamed(&mut self, pids: &[u32]) {
        for &pid in pids {
            if let (Entry::Vacant(slot), Some(comm)) =
                (self.process_names.entry(pid), procfs::comm(pid))
            {
                slot.insert(comm);
            }
        }
    }

    /// Lets go of the mapping lists and unwinders of processes that were already gone at the
    /// last call (a copied stack of theirs has had time to arrive) and that no collected stack
    /// belongs to, so that memory follows what was collected rather than every process that
    /// ever ran (`-a` during a build sees thousands).
    fn forget_dead_processes(&mut self, source: &dyn Source) {
        let long_dead = self
            .dead
            .look(self.mappings.keys().copied(), procfs::process_has_ended);
        if long_dead.is_empty() {
            return;
        }
        let owners = match source.user_stack_owners() {
            Ok(owners) => owners,
            Err(err) => {
                log::debug!("reading whose stacks were collected: {err:#}");
                return;
            }
        };
        for pid in long_dead.into_iter().filter(|pid| !owners.contains(pid)) {
            self.mappings.remove(&pid);
            self.unwinder.forget(pid);
            self.dead.let_go(pid);
            self.mapping_lists_forgotten += 1;
        }
    }

    /// Forgets the names (and fault counts) of processes that are gone, and the names of
    /// threads that are (a daemon's, once their entries are folded and deleted): system-wide,
    /// a name is also the mark of a process already read, so a reused pid is read afresh.
    pub fn forget_names(&mut self, gone: &HashSet<u32>) {
        self.process_names.retain(|pid, _| !gone.contains(pid));
        self.faults.retain(|pid, _| !gone.contains(pid));
        // Thread ids are not tied to their process here: those that are gone, whoever's.
        self.thread_names.retain(|&tid, _| procfs::is_alive(tid));
    }

    /// Lists the targets' threads (reading the start time of the new ones) and recomputes the
    /// thread time from lifetimes: the exited threads' as the kernel summed them, the living
    /// ones' since they or the trace started. Called once more after the programs are
    /// disarmed, so that the end of the trace counts too.
    pub fn count_threads(&mut self, source: &dyn Source) {
        let now = procfs::monotonic_ns();
        let mut living = HashMap::new();
        for &pid in &self.pids {
            // An exited process stays listed, as a zombie leader, until its parent reaps it
            // (the tracer itself, for a launched command): its exit is in the kernel's sum.
            let leader_gone = !procfs::is_alive(pid);
            for tid in procfs::thread_ids(pid) {
                if tid == pid && leader_gone {
                    continue;
                }
                let started = match self.thread_starts.get(&tid) {
                    Some(&started) => Some(started),
                    None => procfs::thread_start_ns(pid, tid),
                };
                if let Some(started) = started {
                    living.insert(tid, started);
                }
            }
        }
        self.threads_now = living.len();
        self.max_threads = self.max_threads.max(living.len());
        self.thread_starts = living;
        let (exited_ns, exited) = source.exited_threads().unwrap_or_else(|err| {
            log::debug!("reading the exited threads' lifetimes: {err:#}");
            (0, 0)
        });
        // Those alive now and those that exited are every thread that ran (counted again at
        // each call, not kept at its maximum: a thread in the middle of its exit is in both).
        self.threads_seen = self.thread_starts.len() + exited as usize;
        self.thread_time_ns = thread_time_ns(
            exited_ns,
            self.thread_starts.values().copied(),
            source.trace_start_ns(),
            now,
        );
    }
}

/// A cumulative snapshot and the watch figures that go with it.
#[derive(Clone)]
pub struct Mark {
    harvest: Harvest,
    thread_time_ns: u64,
    elapsed: Duration,
}

/// Running windows over the trace: the last interval, and everything since the start or the
/// last reset. Also symbolizes new stacks as they appear, keeping what it did.
pub struct Windows {
    targets: Targets,
    comm: String,
    stack_threshold_ns: u64,
    symbolizer: StackSymbolizer,
    since: Mark,
    previous: Mark,
    was_reset: bool,
}

impl Windows {
    pub fn new(targets: &Targets, comm: &str, stack_threshold_ns: u64) -> Self {
        let zero = Mark {
            harvest: Harvest::default(),
            thread_time_ns: 0,
            elapsed: Duration::ZERO,
        };
        Self {
            targets: targets.clone(),
            comm: comm.to_string(),
            stack_threshold_ns,
            symbolizer: StackSymbolizer::new(),
            since: zero.clone(),
            previous: zero,
            was_reset: false,
        }
    }

    /// From now on, the cumulative window starts at the last snapshot taken.
    pub fn reset(&mut self) {
        self.since = self.previous.clone();
        self.was_reset = true;
    }

    /// Closes the interval at `harvest` (a cumulative snapshot) and returns both windows as
    /// reports. `per_thread` keeps the targets' threads apart.
    pub fn advance(&mut self, harvest: Harvest, watch: &Watch, per_thread: bool) -> LiveSnapshot {
        self.symbolizer.forget_unresolved();
        self.symbolizer.add(&harvest, &watch.mappings);
        let now = Mark {
            harvest,
            thread_time_ns: watch.thread_time_ns,
            elapsed: watch.elapsed,
        };
        let interval = self.report_between(&now, &self.previous, watch, per_thread);
        let cumulative = self.report_between(&now, &self.since, watch, per_thread);
        self.previous = now;
        LiveSnapshot {
            interval,
            cumulative,
            elapsed_ns: watch.elapsed.as_nanos() as u64,
            threads_now: watch.threads_now,
            per_thread,
            was_reset: self.was_reset,
        }
    }

    fn report_between(&self, now: &Mark, from: &Mark, watch: &Watch, per_thread: bool) -> Report {
        let mut window = delta::since(&now.harvest, &from.harvest);
        if !per_thread {
            window = delta::without_threads(&window);
        }
        let meta = TraceMeta {
            duration_ns: now.elapsed.saturating_sub(from.elapsed).as_nanos() as u64,
            thread_time_ns: now.thread_time_ns.saturating_sub(from.thread_time_ns),
            ..watch.trace_meta(&self.targets, &self.comm, self.stack_threshold_ns)
        };
        build_report(&window, self.symbolizer.symbols(), &meta)
    }

    /// Forgets the processes that are gone in both windows' starts, as the kernel maps forget
    /// them: a later snapshot without them (or with a new process of a reused pid) then
    /// subtracts nothing of theirs. Returns their part of the last snapshot (all they did, as
    /// they were gone when it was read), for windows still open (`report_since_adding`).
    pub fn forget_processes(&mut self, gone: &HashSet<u32>) -> Harvest {
        self.since.harvest.forget_processes(gone);
        self.previous.harvest.take_processes(gone)
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

    /// Where the last snapshot left the trace: `report_since` it covers what came after.
    pub fn last_mark(&self) -> Mark {
        self.previous.clone()
    }

    /// What happened from `from` to the last snapshot.
    pub fn report_since(&self, from: &Mark, watch: &Watch, per_thread: bool) -> Report {
        self.report_between(&self.previous, from, watch, per_thread)
    }

    /// `report_since`, the last snapshot taken with `forgotten` added back: what processes
    /// forgotten since `from` did (their parts returned by `forget_processes`), which the
    /// snapshot no longer holds but a window open since `from` must.
    pub fn report_since_adding(&self, from: &Mark, forgotten: &Harvest, watch: &Watch) -> Report {
        let mut now = self.previous.clone();
        now.harvest.add_processes(forgotten);
        self.report_between(&now, from, watch, false)
    }

    /// The symbolizer, with every stack seen so far, for the final report.
    pub fn into_symbolizer(self) -> StackSymbolizer {
        self.symbolizer
    }
}

/// `[peak, rss, anon, file]` in KiB.
fn memory_summary(
    kib: [u64; 4],
    objects: usize,
    unwinders: usize,
    (mapping_lists, forgotten): (usize, usize),
    (copies, copy_bytes): (usize, usize),
) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    format!(
        "memory: peak RSS {:.1} MiB, now {:.1} MiB ({:.1} anonymous, {:.1} mapped files: the \
         objects read for unwinding and symbols); held: unwind info of {objects} objects, \
         unwinders of {unwinders} processes, mapping lists of {mapping_lists} processes \
         ({forgotten} more let go: exited, no stack collected), {copies} user stack copies not unwound yet ({:.1} MiB)",
        mib(kib[0]),
        mib(kib[1]),
        mib(kib[2]),
        mib(kib[3]),
        copy_bytes as f64 / (1 << 20) as f64
    )
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::VecDeque;
    use tracer_common::StateKey;

    use super::*;

    /// The kernel side as the loop sees it, without BPF: snapshot n has n acquisitions.
    #[derive(Default)]
    struct FakeSource {
        snapshots_taken: Cell<u64>,
        drains: usize,
        exited_threads: u64,
        snapshot_fails: bool,
    }

    impl Forget for FakeSource {
        fn thread_states(&self) -> Result<Vec<(StateKey, bool)>> {
            Ok(Vec::new())
        }
        fn forget_processes(&self, _: &HashSet<u32>) -> Result<usize> {
            Ok(0)
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
        fn user_stack_owners(&self) -> Result<HashSet<u32>> {
            Ok(HashSet::new())
        }
        fn exited_threads(&self) -> Result<(u64, u64)> {
            Ok((1_000, self.exited_threads))
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
            let mut harvest = Harvest::default();
            harvest.totals[0].acquisitions = self.snapshots_taken.get();
            Ok(harvest)
        }
    }

    /// Wants what its script says, one tick each (then nothing), and notes what it was shown.
    #[derive(Default)]
    struct ScriptedSink {
        wants: VecDeque<Want>,
        /// (acquisitions of the snapshot, threads the watch counted then)
        shown: Vec<(u64, usize)>,
        polls: usize,
        show_fails: bool,
    }

    impl Sink for ScriptedSink {
        fn poll(&mut self, _: Instant) -> Want {
            self.polls += 1;
            self.wants.pop_front().unwrap_or(Want::Nothing)
        }

        fn show(&mut self, snapshot: Snapshot<'_>) -> Result<Flow> {
            if self.show_fails {
                anyhow::bail!("stdout closed");
            }
            let acquisitions = snapshot.harvest.totals[0].acquisitions;
            self.shown.push((acquisitions, snapshot.watch.threads_now));
            Ok(Flow::Continue)
        }
    }

    fn run_loop(
        targets: &Targets,
        duration: Option<f64>,
        source: &mut FakeSource,
        sink: &mut dyn Sink,
    ) -> (Watch, Option<anyhow::Error>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let mut stops = Stops::install().unwrap();
        runtime.block_on(watch_until_done(
            targets, None, duration, source, sink, &mut stops,
        ))
    }

    fn this_process() -> Targets {
        Targets::Pids(vec![std::process::id()])
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
                Want::Snapshot,
                Want::Nothing,
                Want::Nothing,
                Want::Snapshot,
                Want::Stop,
            ]
            .into(),
            ..ScriptedSink::default()
        };
        let (watch, failure) = run_loop(&this_process(), None, &mut source, &mut sink);
        assert!(failure.is_none(), "{failure:?}");
        assert_eq!(watch.ended_by, "quit");
        // One snapshot per ask, in order, each after the threads were counted.
        assert_eq!(source.snapshots_taken.get(), 2);
        let acquisitions: Vec<u64> = sink.shown.iter().map(|(a, _)| *a).collect();
        assert_eq!(acquisitions, [1, 2]);
        assert!(
            sink.shown.iter().all(|&(_, threads)| threads >= 1),
            "{:?}",
            sink.shown
        );
        // Every tick drains the kernel's buffers before the sink is asked.
        assert_eq!(sink.polls, 6);
        assert_eq!(source.drains, 6);
        // The exited threads the source counted are among those that ran.
        assert!(watch.threads_seen > 3, "{}", watch.threads_seen);
        assert!(!watch.exited);
    }

    #[test]
    fn a_sink_that_fails_ends_the_trace_with_its_error() {
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink {
            wants: [Want::Snapshot, Want::Snapshot].into(),
            show_fails: true,
            ..ScriptedSink::default()
        };
        let (watch, failure) = run_loop(&this_process(), Some(30.0), &mut source, &mut sink);
        assert_eq!(watch.ended_by, "error");
        assert_eq!(
            failure.map(|e| e.to_string()).as_deref(),
            Some("stdout closed")
        );
        assert_eq!(sink.polls, 1);
    }

    #[test]
    fn a_snapshot_that_cannot_be_read_ends_the_trace_without_showing_it() {
        let mut source = FakeSource {
            snapshot_fails: true,
            ..FakeSource::default()
        };
        let mut sink = ScriptedSink {
            wants: [Want::Snapshot].into(),
            ..ScriptedSink::default()
        };
        let (watch, failure) = run_loop(&this_process(), Some(30.0), &mut source, &mut sink);
        assert_eq!(watch.ended_by, "error");
        assert!(failure.is_some());
        assert!(sink.shown.is_empty());
    }

    #[test]
    fn the_duration_ends_the_trace_on_the_loops_clock() {
        let mut source = FakeSource::default();
        let started = Instant::now();
        let (watch, failure) = run_loop(&this_process(), Some(0.35), &mut source, &mut NoSink);
        assert!(failure.is_none());
        assert_eq!(watch.ended_by, "duration reached");
        assert!(
            watch.elapsed >= Duration::from_millis(350),
            "{:?}",
            watch.elapsed
        );
        assert!(watch.elapsed <= started.elapsed());
        // A tick every 100 ms: the fourth or a later one sees the deadline.
        assert!(source.drains >= 4, "{}", source.drains);
    }

    #[test]
    fn a_target_that_exits_ends_the_trace() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mut source = FakeSource::default();
        let mut sink = ScriptedSink::default();
        let (watch, failure) = run_loop(
            &Targets::Pids(vec![pid]),
            Some(30.0),
            &mut source,
            &mut sink,
        );
        assert!(failure.is_none());
        assert_eq!(watch.ended_by, "target exited");
        assert!(watch.exited);
        // It ends before the sink is asked anything: the final report covers the rest.
        assert_eq!(sink.polls, 0);
    }

    #[test]
    fn the_memory_line_names_what_holds_it() {
        let line = memory_summary(
            [204_800, 102_400, 81_920, 20_480],
            12,
            30,
            (31, 400),
            (5, 327_680),
        );
        assert!(
            line.starts_with(
                "memory: peak RSS 200.0 MiB, now 100.0 MiB (80.0 anonymous, 20.0 mapped files"
            ),
            "{line}"
        );
        assert!(line.contains("unwind info of 12 objects, unwinders of 30 processes, mapping lists of 31 processes (400 more let go"), "{line}");
        assert!(
            line.ends_with("5 user stack copies not unwound yet (0.3 MiB)"),
            "{line}"
        );
    }

    #[test]
    fn absurd_durations_have_no_deadline_rather_than_a_panic() {
        let start = Instant::now();
        assert_eq!(
            deadline_after(start, 1.5),
            Some(start + Duration::from_millis(1500))
        );
        assert_eq!(deadline_after(start, -1.0), Some(start));
        for secs in [f64::INFINITY, 1e20, f64::NAN] {
            assert_eq!(deadline_after(start, secs), None, "{secs}");
        }
    }
}
