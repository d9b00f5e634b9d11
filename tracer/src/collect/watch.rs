//! What user space learns of the traced processes while the programs run: their threads and
//! thread time, names, mappings (read on the looker's thread), fault counts, and the user
//! stacks unwound from the kernel's copies.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::model::retention::GoneTwice;
use crate::model::thread_time::thread_time_ns;
use crate::model::unwound::{splice, PendingCopies, StackRecord, Unwound};
use crate::model::{Harvest, TraceMeta};
use crate::probes::source::Source;
use crate::system::cgroups::CgroupNames;
use crate::system::proc_looker::{ProcLooker, ProcessLook};
use crate::system::procfs::{self, MappingHistory};
use crate::unwind::StackUnwinder;

use super::Targets;

/// How long unwinding waits for a process's maps when a copied stack lies outside the known
/// mappings (a library loaded since the last look); past it, it unwinds with what it has.
const UNWIND_LOOK_WAIT: Duration = Duration::from_millis(50);
/// How long the end of the trace waits for the maps of the processes whose stacks it shows.
const FINAL_LOOK_WAIT: Duration = Duration::from_secs(2);

/// What was learned about the targets while the programs ran.
#[derive(Default)]
pub struct Watch {
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
    /// The paths of the cgroups the locking processes were in, learnt at the looks (a
    /// container's cgroup may be gone by the end of the trace).
    cgroup_names: CgroupNames,
}

impl Watch {
    /// A watch of a trace; `fault_baseline`: a launched command's fault count before it was
    /// let go, so that the faults of its start count (the first look comes a tick later).
    pub fn new(fault_baseline: Option<(u32, u64)>) -> Self {
        Self {
            faults: fault_baseline
                .map(|(pid, faults)| (pid, (faults, faults)))
                .into_iter()
                .collect(),
            ..Self::default()
        }
    }

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
            locker_groups: HashMap::new(),
            cgroup_paths: self.cgroup_names.known().clone(),
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
    pub(super) fn take_looks(&mut self) {
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
                let history = mappings.entry(look.pid).or_default();
                history.add_all(found);
                history.owner_uid = look.uid.or(history.owner_uid);
            }
            look
        })
        .collect()
}

impl Watch {
    /// Re-reads what /proc says of the traced processes. Given targets are re-read every time
    /// (their mappings change); system-wide, only processes seen for the first time are, since
    /// reading /proc/PID/maps takes each process's mmap_lock (copies outside known mappings
    /// and the end of the trace re-read them).
    pub(super) fn look_at_processes(&mut self, targets: &Targets, source: &dyn Source) {
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
        self.take_cgroups(source);
    }

    /// Learns the paths of the cgroups the programs recorded for the locking processes.
    pub(super) fn take_cgroups(&mut self, source: &dyn Source) {
        match source.process_cgroups() {
            Ok(ids) => self.cgroup_names.learn_ids(ids.into_values()),
            Err(err) => log::debug!("reading the processes' cgroups: {err:#}"),
        }
    }

    /// Renames the processes an exec renamed: a name read from /proc may be the parent's, read
    /// while the child was still in its exec, and a process is read only once system-wide.
    /// Only those already named: a name also marks a process as read, and the others are
    /// named by the kernel's record.
    pub(super) fn take_exec_names(&mut self, source: &dyn Source) {
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
    /// `kept`: processes whose user stacks are kept beyond the kernel's maps (by windows).
    pub(super) fn forget_dead_processes(&mut self, source: &dyn Source, kept: &HashSet<u32>) {
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
        let needed = |pid: &u32| owners.contains(pid) || kept.contains(pid);
        for pid in long_dead.into_iter().filter(|pid| !needed(pid)) {
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
    use super::*;

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
}
