//! Loading the eBPF object, attaching its programs and reading its maps. The only module that
//! touches aya; it hands plain data (`model::Harvest`) to the rest.

mod batch;
mod blockers;
mod cgroups;
mod closing;
mod contention;
mod errors;
mod faults;
pub mod floor;
mod lean;
mod mmap_lock;
#[cfg(test)]
mod object_names;
mod pending;
mod readers;
mod reading;
mod sched;
mod self_cost;
pub mod source;
pub use self_cost::SelfCostMode;
#[cfg(test)]
mod stack_chains;
mod syscalls;
mod timeline;
mod user_stacks;
mod wakers;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap},
    programs::{BtfTracePoint, TracePoint},
    Ebpf, EbpfLoader, Pod,
};
use tracer_common::{
    holder_slot, AggKey, AggValue, BlockKey, BlockValue, Config, Counter, FastTargets,
    HolderRecord, LockState, SleepKey, StateKey, WakeKey, WakeValue, COUNTER_SLOTS,
    EXITED_LIFETIME_NS, EXITED_PROCESSES, EXITED_THREADS, FAST_TARGETS, PER_THREAD_ALWAYS,
    PER_THREAD_WHILE_ROOM,
};

use self::timeline::TimelineReader;
use self::user_stacks::UserStackReader;
use crate::model::unwound::StackRecord;
use crate::model::{holder_stack_owner, user_stack_owner, Features, Harvest, StackRef};
use crate::system::{
    btf::KernelOffsets,
    tracefs::{Needed, Tracefs},
};
use closing::ClassicLinks;
pub use errors::VERIFIER_BUDGET;
use errors::{explain_permission, is_refused, load_failed, log_verified, perf_paranoia_hint};
use readers::{
    delete_from, delete_where, fold_pending, fold_states, map, map_named, map_ref, read_array,
    read_comms, read_maps, read_shared, read_shared_array, read_stacks, read_target_mms,
};
use source::{Forget, Source};

/// The probe families, one module each: what each configures, attaches and reads, in this
/// order (the saved registers before the stack copies that need them; the mmap_lock family's
/// entries before the lean path adds to them). A new family is a module and an entry here.
const FAMILIES: [Family; 9] = [
    mmap_lock::FAMILY,
    lean::FAMILY,
    blockers::FAMILY,
    user_stacks::FAMILY,
    contention::FAMILY,
    faults::FAMILY,
    syscalls::FAMILY,
    sched::FAMILY,
    wakers::FAMILY,
];

/// What a family is given to set itself up: the settings and the running kernel's layouts.
struct Setup<'a> {
    settings: &'a ProbeSettings,
    tracefs: &'a Tracefs,
    offsets: &'a KernelOffsets,
}

/// What a family attaches with, once the object is loaded.
struct Attach<'a> {
    ebpf: &'a mut Ebpf,
    setup: &'a Setup<'a>,
    config: &'a Config,
    links: &'a mut ClassicLinks,
}

/// One probe family's part in loading the programs and reading their maps.
struct Family {
    /// Fills the family's part of the programs' configuration, before the object loads.
    configure: fn(&Setup, &mut Config) -> Result<()>,
    /// Loads and attaches the family's programs, and says in `Features` what it attached.
    attach: fn(&mut Attach, &mut Features) -> Result<()>,
    /// Reads the family's maps into a harvest.
    read: fn(&Probes, &mut Harvest) -> Result<()>,
    /// The names of the maps the family's eBPF module defines, and of its programs: each is
    /// the name of a `#[map]` static or a program function in tracer-ebpf, which the
    /// object-names test checks against the compiled object, both ways (the names the
    /// family's code opens are these constants, so the test covers them).
    #[cfg_attr(not(test), allow(dead_code))]
    maps: &'static [&'static str],
    #[cfg_attr(not(test), allow(dead_code))]
    programs: &'static [&'static str],
}

impl Family {
    /// A family with nothing to do at any step; each family names the steps it has.
    const NOTHING: Family = Family {
        configure: |_, _| Ok(()),
        attach: |_, _| Ok(()),
        read: |_, _| Ok(()),
        maps: &[],
        programs: &[],
    };
}

// The maps of the core that every family's programs share (tracer-ebpf's `maps.rs` and
// `filter.rs`), and the load-time `Config` global (`EbpfLoader::override_global`).
const CONFIG: &str = "CONFIG";
const AGG: &str = "AGG";
const ARMED: &str = "ARMED";
const COUNTERS: &str = "COUNTERS";
/// Written and read by the programs alone; named for the object-names test.
#[cfg(test)]
const KEY_COUNTS: &str = "KEY_COUNTS";
const LOCK_STATE: &str = "LOCK_STATE";
/// Cleared when entries are deleted (`Forget::forget_processes`).
const MAP_FULL: &str = "MAP_FULL";
const STACKS: &str = "STACKS";
const TID_HOLDING: &str = "TID_HOLDING";
const TOTALS: &str = "TOTALS";
const TRACE_START: &str = "TRACE_START";
const DISCOVER: &str = "DISCOVER";
const EXEC_COMMS: &str = "EXEC_COMMS";
const LOCKER_COMMS: &str = "LOCKER_COMMS";
const TARGET_MMS: &str = "TARGET_MMS";
const TARGET_SLOTS: &str = "TARGET_SLOTS";
const TARGET_TGIDS: &str = "TARGET_TGIDS";
const THREAD_EXITS: &str = "THREAD_EXITS";
const EXITED_PIDS: &str = "EXITED_PIDS";
const MM_OF_TARGET: &str = "MM_OF_TARGET";
/// Every core map, with the timeline's ring buffer.
#[cfg(test)]
const CORE_MAPS: [&str; 22] = [
    AGG,
    ARMED,
    COUNTERS,
    KEY_COUNTS,
    LOCK_STATE,
    MAP_FULL,
    STACKS,
    TID_HOLDING,
    TOTALS,
    TRACE_START,
    DISCOVER,
    EXEC_COMMS,
    LOCKER_COMMS,
    TARGET_MMS,
    TARGET_SLOTS,
    TARGET_TGIDS,
    THREAD_EXITS,
    EXITED_PIDS,
    MM_OF_TARGET,
    cgroups::PROCESS_CGROUPS,
    cgroups::CGROUP_FILTER,
    timeline::TIMELINE,
];

/// The compiled programs, built by build.rs from the tracer-ebpf crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

/// Choices that shape what the programs collect.
#[derive(Clone, Debug)]
pub struct ProbeSettings {
    pub stack_threshold_ns: u64,
    /// Fault, syscall, holder and off-CPU attribution (all but `--lean`).
    pub attribution: bool,
    /// The mm syscall tracepoints, for per-syscall count and time (`--syscall-times`).
    pub syscall_times: bool,
    /// Entries collected per thread while the maps have room (merged afterwards unless
    /// `per_thread_required`: the user asked for per-thread rows, kept whatever the cost).
    pub per_thread: bool,
    pub per_thread_required: bool,
    pub user_stacks: bool,
    pub max_entries: u32,
    pub max_stacks: u32,
    /// Size of the ring buffers in use, instead of their defaults (`--ring-bytes`).
    pub ring_bytes: Option<u32>,
    /// Capacity of the per-thread maps, instead of their defaults (`--thread-entries`).
    pub thread_entries: Option<u32>,
    /// Stream waits and holds at least this long to the timeline; 0: no timeline.
    pub timeline_threshold_ns: u64,
    /// Copy user stacks for unwinding in user space (`--user-stack dwarf`).
    pub stack_copies: Option<StackCopySettings>,
    /// Trace every user process (`-a`) instead of the added targets.
    pub system_wide: bool,
    /// Classic tracepoints even where BTF tracepoints would do (a hidden flag, so that tests
    /// cover the fallback).
    pub classic_tracepoints: bool,
    /// At most FAST_TARGETS targets, all added (`add_target`) before arming, and no `-a`: the
    /// programs find them in an array instead of a hash map (and `--lean` without per-thread
    /// rows aggregates them in an array too). With `inherit`, the processes the command starts
    /// are found by hash, as without slots.
    pub target_slots: bool,
    /// Threads of the targets when the trace starts (system-wide: of the whole machine), which
    /// sizes the per-hold holder records.
    pub target_threads: usize,
    /// `-- CMD`: the processes the targets fork are traced too.
    pub inherit: bool,
    /// How the programs' runs are counted for the self-cost.
    pub self_cost: SelfCostMode,
    /// `--cgroup`: system-wide, only the processes of these cgroups (v2 directories) and of
    /// the cgroups below them.
    pub cgroups: Vec<std::path::PathBuf>,
}

/// Processes of a traced command's tree alive at once that can be traced (inherit).
const INHERITED_PROCESSES: u32 = 4096;

/// How long a target's own threads get to register its mm before the tracer locks it itself,
/// and how long the tracer's own lock (reading /proc/PID/cmdline) may take.
const SELF_REGISTRATION_WAIT: Duration = Duration::from_millis(20);
const DISCOVERY_WAIT: Duration = Duration::from_millis(200);

/// Capacity of the maps keyed by mm or process (TARGET_MMS, HOLDERS, LOCKER_COMMS) in
/// system-wide mode: one entry per process that locks its mm, for a busy machine. Beyond it,
/// new processes are counted as target_map_full.
pub const SYSTEM_WIDE_PROCESSES: u32 = 16384;

/// Which waits and holds get their user stack copied, and how much of it.
#[derive(Clone, Debug)]
pub struct StackCopySettings {
    /// Bytes above the saved user sp (at most USER_STACK_MAX).
    pub bytes: u32,
    /// Waits and holds at least this long are all copied...
    pub threshold_ns: u64,
    /// ...and one in `sample` of the shorter ones that got a kernel stack.
    pub sample: u32,
}

/// x86_64's kernel stack size (THREAD_SIZE, without KASAN): the saved user registers sit at
/// its top. Not in BTF; a wrong value shows as registers outside user space, which the
/// programs refuse (counted as user_stack_copy_dropped).
const THREAD_SIZE: u32 = 16384;

/// Loaded and attached programs with their maps.
pub struct Probes {
    ebpf: Ebpf,
    /// Present when a timeline was asked for.
    timeline: Option<TimelineReader>,
    /// Present when stack copies were asked for.
    user_stacks: Option<UserStackReader>,
    features: Features,
    /// With target slots: the targets in TARGET_SLOTS order.
    slots: Option<Vec<u32>>,
    /// Whether LEAN_AGG holds all of the targets' own operations (`--lean`): they stand for
    /// their totals, and LEAN_THREADS holds their operations in flight. Otherwise (with slots)
    /// it holds the short operations of the defaults.
    lean_array: bool,
    /// Whether processes' own locks take the lean path (timing only, without per-thread rows),
    /// whose threads time their operations in LEAN_THREADS.
    lean_threads: bool,
    /// Keeps the kernel counting the programs' runs.
    run_stats: self_cost::RunTimeStats,
    /// This process's CPU time, and when, at the trace's start (`start_self_cost`).
    cpu_at_start: (u64, Instant),
    /// When the trace started (monotonic ns; 0 until set_trace_start).
    trace_start_ns: u64,
    classic_links: ClassicLinks,
    /// AGG's max_entries (BLOCKED's too), which the final fold of pending operations keeps to.
    agg_capacity: usize,
    /// Whether the programs follow the listed targets' forks (a traced command's tree).
    follows_forks: bool,
    /// `--cgroup`'s cgroups, whose subtrees the programs' filter is kept current with.
    cgroup_filter: cgroups::CgroupFilter,
}

/// The running kernel's BTF, parsed once while the programs load: each BTF tracepoint family
/// needs it, and each parse of its 5-6 MB took time and memory at startup. Dropped once they
/// are loaded (`forget_kernel_btf`): kept, it held 16 MB for the whole trace.
static KERNEL_BTF: std::sync::Mutex<Option<std::sync::Arc<aya::Btf>>> = std::sync::Mutex::new(None);

fn kernel_btf() -> Result<std::sync::Arc<aya::Btf>> {
    let mut cached = KERNEL_BTF.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(btf) = cached.as_ref() {
        return Ok(btf.clone());
    }
    let btf = std::sync::Arc::new(
        aya::Btf::from_sys_fs().map_err(|e| anyhow!("reading the kernel's BTF: {e}"))?,
    );
    *cached = Some(btf.clone());
    Ok(btf)
}

/// Loads and attaches `program` as the BTF tracepoint `event`, if the kernel has its BTF and
/// takes it; else says what is `lost` without it and goes on (Ok(false)).
fn attach_optional_btf(ebpf: &mut Ebpf, program: &str, event: &str, lost: &str) -> Result<bool> {
    let btf = match kernel_btf() {
        Ok(btf) => btf,
        Err(err) => {
            log::warn!("no kernel BTF for {event} ({err:#}): {lost}");
            return Ok(false);
        }
    };
    let started = std::time::Instant::now();
    let loaded = self::program::<BtfTracePoint>(ebpf, program)?;
    if let Err(err) = loaded.load(event, &btf) {
        let err = load_failed(err, &format!("loading the {event} BTF tracepoint"));
        log::warn!("{}: {lost}", crate::text::error_line(&err));
        return Ok(false);
    }
    log_verified(program, loaded.info(), started.elapsed());
    loaded
        .attach()
        .map_err(|e| explain_permission(anyhow!(e), &format!("attaching tp_btf/{event}")))?;
    Ok(true)
}

fn forget_kernel_btf() {
    KERNEL_BTF.lock().unwrap_or_else(|e| e.into_inner()).take();
    // The parses (aya's loader makes its own) leave tens of MB of freed heap that glibc keeps
    // for the process; hand it back, since the trace will not need it.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The program `name` of the object, as the kind `P` it must be.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?;
    Ok(program.try_into()?)
}

/// Loads `name` (once) and attaches it to each tracepoint in `tps`, all or nothing: a family
/// whose tracepoints are missing is left out with a warning naming them.
fn attach_tracepoints(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    name: &str,
    tps: &[Needed],
    links: &mut ClassicLinks,
) -> Result<bool> {
    if let Some(missing) = tps.iter().find(|tp| !tracefs.has(tp)) {
        log::warn!(
            "kernel lacks tracepoint {}:{} (Linux {}): {name} is left out",
            missing.category,
            missing.name,
            missing.since
        );
        return Ok(false);
    }
    let started = std::time::Instant::now();
    let program = program::<TracePoint>(ebpf, name)?;
    program
        .load()
        .map_err(|e| load_failed(e, &format!("loading {name}")))?;
    log_verified(name, program.info(), started.elapsed());
    let mut attached = Vec::new();
    for tp in tps {
        match program.attach(tp.category, tp.name) {
            Ok(id) => attached.push(program.take_link(id)?),
            Err(err) if is_refused(&err) => {
                // These families are optional: the trace goes on without this one (the links
                // attached so far are dropped, which detaches them).
                log::warn!(
                    "cannot attach tracepoint {}:{} ({err}): {name} is left out{}",
                    tp.category,
                    tp.name,
                    perf_paranoia_hint()
                );
                return Ok(false);
            }
            Err(err) => {
                return Err(explain_permission(
                    anyhow!(err),
                    &format!("attaching {}:{}", tp.category, tp.name),
                ))
            }
        }
    }
    links.0.extend(attached);
    Ok(true)
}

impl Probes {
    pub fn load(
        settings: &ProbeSettings,
        tracefs: &Tracefs,
        offsets: &KernelOffsets,
    ) -> Result<Self> {
        let mut config = Config {
            task_mm_offset: offsets.task_mm,
            task_pending_signal_offset: offsets.task_pending_signal,
            task_pid_offset: offsets.task_pid,
            task_flags_offset: offsets.task_flags,
            task_active_mm_offset: offsets.task_active_mm,
            task_start_time_offset: offsets.task_start_time,
            task_signal_offset: offsets.task_signal,
            signal_live_offset: offsets.signal_live,
            mm_mmap_lock_offset: offsets.mm_mmap_lock,
            stack_threshold_ns: settings.stack_threshold_ns,
            late_stack_threshold_ns: late_stack_threshold(settings.stack_threshold_ns),
            fold_threads_at: fold_threads_at(settings.max_entries),
            attribution: settings.attribution as u32,
            tracer_tgid: std::process::id(),
            inherit: settings.inherit as u32,
            holder_slots_mask: holder_records(settings.target_threads) - 1,
            task_tgid_offset: offsets.task_tgid,
            per_thread: match (settings.per_thread_required, settings.per_thread) {
                (true, _) => PER_THREAD_ALWAYS,
                (false, true) => PER_THREAD_WHILE_ROOM,
                (false, false) => 0,
            },
            user_stacks: settings.user_stacks as u32,
            timeline_threshold_ns: settings.timeline_threshold_ns,
            system_wide: settings.system_wide as u32,
            target_slots: settings.target_slots as u32,
            cgroup_filter: !settings.cgroups.is_empty() as u32,
            ..Config::ZERO
        };
        let setup = Setup {
            settings,
            tracefs,
            offsets,
        };
        for family in &FAMILIES {
            (family.configure)(&setup, &mut config)?;
        }
        let copies_on = config.user_stack_copies.bytes != 0;
        let timeline_on = settings.timeline_threshold_ns > 0;
        raise_memlock_limit();
        let mut loader = EbpfLoader::new();
        // The outside lockers' names too: a /proc reader loop beside a `-p` target starts
        // hundreds of them a second, each named (1 MiB of kernel memory).
        loader.map_max_entries(LOCKER_COMMS, SYSTEM_WIDE_PROCESSES);
        loader.map_max_entries(cgroups::PROCESS_CGROUPS, SYSTEM_WIDE_PROCESSES);
        loader.map_max_entries(cgroups::CGROUP_FILTER, cgroups::FILTER_CGROUPS);
        if settings.system_wide || settings.inherit {
            for name in [
                TARGET_MMS,
                MM_OF_TARGET,
                blockers::HOLDERS,
                EXEC_COMMS,
                EXITED_PIDS,
            ] {
                loader.map_max_entries(name, SYSTEM_WIDE_PROCESSES);
            }
        }
        if let Some(entries) = settings.thread_entries {
            for name in [LOCK_STATE, TID_HOLDING, syscalls::SYSCALLS_ACTIVE] {
                loader.map_max_entries(name, entries);
            }
        }
        if settings.inherit {
            // The command's processes alive at once (a make -j's compilers and their children).
            loader.map_max_entries(TARGET_TGIDS, INHERITED_PROCESSES);
        }
        let mut ebpf = loader
            .override_global(CONFIG, &config, true)
            .map_max_entries(AGG, settings.max_entries)
            .map_max_entries(blockers::BLOCKED, settings.max_entries)
            .map_max_entries(blockers::HOLDER_INFO, config.holder_slots_mask + 1)
            .map_max_entries(STACKS, settings.max_stacks)
            .map_max_entries(
                timeline::TIMELINE,
                if timeline_on {
                    settings.ring_bytes.unwrap_or(timeline::RING_BYTES)
                } else {
                    timeline::RING_BYTES_OFF
                },
            )
            .map_max_entries(
                user_stacks::USER_STACKS,
                if copies_on {
                    settings.ring_bytes.unwrap_or(user_stacks::RING_BYTES)
                } else {
                    user_stacks::RING_BYTES_OFF
                },
            )
            .load(EBPF_OBJECT)
            .map_err(|e| explain_permission(anyhow!(e), "loading the eBPF programs"))?;
        let timeline = if timeline_on {
            Some(TimelineReader::open(&mut ebpf)?)
        } else {
            None
        };
        let user_stacks = if copies_on {
            Some(UserStackReader::open(&mut ebpf)?)
        } else {
            None
        };
        let mut classic_links = ClassicLinks::default();
        let mut features = Features {
            per_vma_locks: offsets.per_vma_locks,
            ..Features::default()
        };
        let mut attach = Attach {
            ebpf: &mut ebpf,
            setup: &setup,
            config: &config,
            links: &mut classic_links,
        };
        for family in &FAMILIES {
            (family.attach)(&mut attach, &mut features)?;
        }
        forget_kernel_btf();
        let run_stats = self_cost::RunTimeStats::enable(settings.self_cost, &ebpf);
        let cgroup_filter = cgroups::CgroupFilter::new(settings.cgroups.clone());
        cgroup_filter.refresh(&mut ebpf)?;
        Ok(Self {
            ebpf,
            timeline,
            user_stacks,
            features,
            slots: settings.target_slots.then(Vec::new),
            lean_array: settings.target_slots && !settings.attribution && !settings.per_thread,
            lean_threads: !settings.attribution && !settings.per_thread,
            run_stats,
            cpu_at_start: (self_cost::process_cpu_ns(), Instant::now()),
            trace_start_ns: 0,
            classic_links,
            agg_capacity: settings.max_entries as usize,
            follows_forks: settings.inherit,
            cgroup_filter,
        })
    }

    /// Where the trace starts, for the lifetimes of threads that exit during it: call it just
    /// before arming, with the same clock as bpf_ktime_get_ns.
    pub fn set_trace_start(&mut self, monotonic_ns: u64) -> Result<()> {
        let mut start: Array<_, u64> = map(&mut self.ebpf, TRACE_START)?;
        start
            .set(0, monotonic_ns, 0)
            .context("setting TRACE_START")?;
        self.trace_start_ns = monotonic_ns;
        Ok(())
    }

    /// Starts (true) or stops (false) event processing in every program at once.
    pub fn set_armed(&mut self, on: bool) -> Result<()> {
        let mut armed: Array<_, u32> = map(&mut self.ebpf, ARMED)?;
        armed.set(0, on as u32, 0).context("setting ARMED")
    }

    /// Adds a target process: its threads' locks on its own mm are traced from now on.
    pub fn add_target(&mut self, pid: u32) -> Result<()> {
        let mut tgids: BpfHashMap<_, u32, u32> = map(&mut self.ebpf, TARGET_TGIDS)?;
        tgids.insert(pid, 0, 0).context("registering target pid")?;
        if let Some(slots) = &mut self.slots {
            if slots.len() >= FAST_TARGETS {
                bail!("target slots hold at most {FAST_TARGETS} targets");
            }
            let mut array: Array<_, FastTargets> = map(&mut self.ebpf, TARGET_SLOTS)?;
            // Keeps the mms the programs learnt for the targets added before.
            let mut targets = array.get(&0, 0).context("reading TARGET_SLOTS")?;
            targets.pids[slots.len()] = pid;
            array.set(0, targets, 0).context("registering target pid")?;
            slots.push(pid);
        }
        Ok(())
    }

    /// Learns `pid`'s mm before its threads lock it themselves (an idle target can still be
    /// locked by others). A busy target's threads register it within moments of `add_target`;
    /// for one that does not lock, reading /proc/PID/cmdline locks that mm from our thread,
    /// and the programs record it while DISCOVER names the pid. That read waits for the lock
    /// like any reader, behind thousands of contending threads for tens of seconds: it runs on
    /// its own thread, given DISCOVERY_WAIT, after which the target's own first lock will
    /// register it instead.
    pub fn discover_mm(&mut self, pid: u32) -> Result<bool> {
        if self.wait_registered(pid, SELF_REGISTRATION_WAIT)? {
            return Ok(true);
        }
        let set = |ebpf: &mut Ebpf, value: u32| -> Result<()> {
            let mut discover: Array<_, u32> = map(ebpf, DISCOVER)?;
            discover.set(0, value, 0).context("setting DISCOVER")
        };
        set(&mut self.ebpf, pid)?;
        let (done, read) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // One byte: one read, one lock (reading it whole takes it once a read call).
            if let Ok(mut cmdline) = std::fs::File::open(format!("/proc/{pid}/cmdline")) {
                let _ = std::io::Read::read(&mut cmdline, &mut [0u8; 1]);
            }
            let _ = done.send(());
        });
        let _ = read.recv_timeout(DISCOVERY_WAIT);
        set(&mut self.ebpf, 0)?;
        self.is_registered(pid)
    }

    /// Polls until `pid`'s mm is registered or `wait` has passed.
    fn wait_registered(&self, pid: u32, wait: Duration) -> Result<bool> {
        let deadline = Instant::now() + wait;
        loop {
            if self.is_registered(pid)? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn is_registered(&self, pid: u32) -> Result<bool> {
        Ok(read_target_mms(&self.ebpf)?
            .values()
            .any(|&owner| owner == pid))
    }
}

/// HOLDER_INFO keeps each blocking hold's stacks until the waits queued behind it are charged;
/// on a lock that thousands of threads queue for, a wait outlasts about as many holds as there
/// are threads, each with its record. Slots are picked by hashing the hold's id, so the array is
/// kept several times larger than the records alive at once (a power of two: the slot is a mask
/// of the hash).
fn holder_records(threads: usize) -> u32 {
    (threads.saturating_mul(16))
        .clamp(8192, 131_072)
        .next_power_of_two() as u32
}

/// AGG and BLOCKED (as large) fold thread ids away once three quarters full, keeping room for
/// the folded keys.
fn fold_threads_at(capacity: u32) -> u32 {
    capacity - capacity / 4
}

/// Operations whose wait never slept and that were not sampled get their stacks walked inside
/// the critical section only past this (every stack with --stack-threshold 0, which asks for them all).
fn late_stack_threshold(stack_threshold_ns: u64) -> u64 {
    if stack_threshold_ns == 0 {
        0
    } else {
        stack_threshold_ns.max(tracer_common::LATE_STACK_FLOOR_NS)
    }
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones use memcg, and raising
/// the limit may be refused (no CAP_SYS_RESOURCE), which is harmless there.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        log::debug!(
            "setrlimit(RLIMIT_MEMLOCK) failed: {} (harmless on kernels >= 5.11)",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_walks_only_for_long_operations_unless_every_stack_is_asked_for() {
        assert_eq!(late_stack_threshold(0), 0);
        assert_eq!(late_stack_threshold(10_000), 1_000_000);
        assert_eq!(late_stack_threshold(5_000_000), 5_000_000);
    }
}
