//! Loading the eBPF object, attaching its programs and reading its maps. The only module that
//! touches aya; it hands plain data (`model::Harvest`) to the rest.

mod batch;
mod blockers;
mod contention;
mod faults;
pub mod floor;
mod lean;
mod mmap_lock;
#[cfg(test)]
mod object_names;
mod pending;
mod sched;
mod self_cost;
pub mod source;
pub use self_cost::SelfCostMode;
#[cfg(test)]
mod stack_chains;
mod syscalls;
mod timeline;
mod user_stacks;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap},
    programs::{trace_point::TracePointLink, ProgramError, ProgramInfo, TracePoint},
    Ebpf, EbpfLoader, Pod,
};
use tracer_common::{
    holder_slot, AggKey, AggValue, BlockKey, BlockValue, Config, Counter, FastTargets,
    HolderRecord, LockState, SleepKey, StateKey, COUNTER_SLOTS, EXITED_LIFETIME_NS, EXITED_THREADS,
    FAST_TARGETS, PER_THREAD_ALWAYS, PER_THREAD_WHILE_ROOM,
};

use self::timeline::TimelineReader;
use self::user_stacks::UserStackReader;
use crate::model::unwound::StackRecord;
use crate::model::{holder_stack_owner, user_stack_owner, Features, Harvest, StackRef};
use crate::system::{
    btf::KernelOffsets,
    tracefs::{Needed, Tracefs},
};
use source::{Forget, Source};

/// The probe families, one module each: what each configures, attaches and reads, in this
/// order (the saved registers before the stack copies that need them; the mmap_lock family's
/// entries before the lean path adds to them). A new family is a module and an entry here.
const FAMILIES: [Family; 8] = [
    mmap_lock::FAMILY,
    lean::FAMILY,
    blockers::FAMILY,
    user_stacks::FAMILY,
    contention::FAMILY,
    faults::FAMILY,
    syscalls::FAMILY,
    sched::FAMILY,
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
#[cfg(test)]
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
/// Every core map, with the timeline's ring buffer.
#[cfg(test)]
const CORE_MAPS: [&str; 18] = [
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
}

/// The classic tracepoints' links, held apart from their programs so that they are closed
/// off the user's path. Closing one waits for the kernel's RCU grace periods
/// (perf_trace_event_unreg -> tracepoint_synchronize_unregister, 20-100 ms, under a mutex all
/// such closes share): the syscall and fault tracepoints' fourteen took 0.1-0.6 s, threads or
/// not, and the kernel does them before the tracer's exit is reported to its parent. So a child
/// process holds the links' last references: the tracer's own closes only drop a count, and
/// the child lets them go once the tracer has exited (its end of a pipe sees EOF). The
/// programs are disarmed before; the report is written meanwhile.
#[derive(Default)]
pub struct ClassicLinks(Vec<TracePointLink>);

impl ClassicLinks {
    fn close_after_exit(&mut self) {
        let links = std::mem::take(&mut self.0);
        if links.is_empty() {
            return;
        }
        if let Err(err) = hold_in_child_until_exit() {
            log::debug!("closing the tracepoint links before exiting: {err}");
        }
        drop(links);
    }
}

/// Forks a child that keeps every file of the tracer open until the tracer has exited.
fn hold_in_child_until_exit() -> std::io::Result<()> {
    let mut ends = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `ends`.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let [read_end, write_end] = ends;
    // SAFETY: the child of this multi-threaded process calls only async-signal-safe functions
    // (close, read, _exit) and touches no memory but a local byte.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => unsafe {
            // Not the terminal or the pipes of whoever waits for the tracer's output.
            for fd in [write_end, 0, 1, 2] {
                libc::close(fd);
            }
            let mut byte = 0u8;
            while libc::read(read_end, (&mut byte as *mut u8).cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            libc::_exit(0)
        },
        _ => {
            // The write end stays open until the tracer exits.
            // SAFETY: closes the descriptor this process no longer needs.
            unsafe { libc::close(read_end) };
            Ok(())
        }
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.classic_links.close_after_exit();
    }
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
    let program = program::<TracePoint>(ebpf, name)?;
    program
        .load()
        .map_err(|e| load_failed(e, &format!("loading {name}")))?;
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

/// A classic tracepoint's perf_event_open refused for want of privilege: EACCES (Debian's
/// kernel.perf_event_paranoid 3 without CAP_SYS_ADMIN) or EPERM, found in the error's source
/// chain (aya's message names the syscall only: "`perf_event_open_trace_point` failed").
fn is_refused(err: &aya::programs::ProgramError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        let errno = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error);
        if matches!(errno, Some(libc::EACCES | libc::EPERM)) {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Why perf_event_open refuses a process with CAP_PERFMON: Debian's kernels read
/// kernel.perf_event_paranoid 3 (their default) as perf events for CAP_SYS_ADMIN only.
fn perf_paranoia_hint() -> String {
    let level = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    match level.trim().parse::<i32>() {
        Ok(level) if level >= 3 => format!(
            "; kernel.perf_event_paranoid is {level}, which leaves classic tracepoints to \
             CAP_SYS_ADMIN on Debian's kernels (sysctl kernel.perf_event_paranoid=2, or root, \
             lets them attach)"
        ),
        _ => String::new(),
    }
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
        if settings.system_wide || settings.inherit {
            for name in [TARGET_MMS, blockers::HOLDERS, LOCKER_COMMS, EXEC_COMMS] {
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
        Ok(Self {
            ebpf,
            timeline,
            user_stacks,
            features,
            slots: settings.target_slots.then(Vec::new),
            lean_array: settings.target_slots && !settings.attribution && !settings.per_thread,
            lean_threads: !settings.attribution && !settings.per_thread,
            run_stats: self_cost::RunTimeStats::enable(settings.self_cost),
            cpu_at_start: (self_cost::process_cpu_ns(), Instant::now()),
            trace_start_ns: 0,
            classic_links,
            agg_capacity: settings.max_entries as usize,
            follows_forks: settings.inherit,
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
            let _ = std::fs::read(format!("/proc/{pid}/cmdline"));
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

impl Forget for Probes {
    fn thread_states(&self) -> Result<Vec<(StateKey, bool)>> {
        Ok(read_shared::<StateKey, LockState>(&self.ebpf, LOCK_STATE)?
            .into_iter()
            .map(|(key, st)| {
                let pending =
                    st.pending_wait.is_some() || st.pending_holds.iter().any(|h| h.is_some());
                (key, pending)
            })
            .collect())
    }

    /// Deletes the kernel entries of processes that are gone, as the mm owner or as an outside
    /// locker: nothing adds to them any more, and a daemon that has folded them into its
    /// series must not let the dead fill its maps. Returns the entries deleted.
    fn forget_processes(&self, gone: &HashSet<u32>) -> Result<usize> {
        if gone.is_empty() {
            return Ok(0);
        }
        let of_gone = |k: &AggKey| gone.contains(&k.pid) || gone.contains(&k.locker_pid);
        let mut deleted = delete_where::<AggKey, AggValue>(&self.ebpf, AGG, of_gone)?;
        // Empty without attribution (--lean): one read each.
        deleted += delete_where::<BlockKey, BlockValue>(&self.ebpf, blockers::BLOCKED, |k| {
            of_gone(&k.waiter)
        })?;
        deleted += delete_where::<SleepKey, u64>(&self.ebpf, sched::SLEEPS, |k| of_gone(&k.hold))?;
        let comms: Vec<u32> = gone.iter().copied().collect();
        deleted += delete_from(&self.ebpf, LOCKER_COMMS, &comms)?;
        deleted += delete_from(&self.ebpf, EXEC_COMMS, &comms)?;
        Ok(deleted)
    }

    /// Deletes the per-thread state of threads that are gone: their lock states (`states`),
    /// and by thread id, what attribution keeps of them. The maps are LRUs, so the dead would
    /// only be evicted once full, with the living among them.
    fn forget_threads(&self, states: &[StateKey]) -> Result<usize> {
        let mut deleted = delete_from(&self.ebpf, LOCK_STATE, states)?;
        let mut tids: Vec<u32> = states.iter().map(|k| k.tid).collect();
        tids.dedup();
        for name in [TID_HOLDING, syscalls::SYSCALLS_ACTIVE] {
            deleted += delete_from(&self.ebpf, name, &tids)?;
        }
        Ok(deleted)
    }
}

impl Source for Probes {
    fn follows_forks(&self) -> bool {
        self.follows_forks
    }

    /// The processes the programs follow from the listed targets' forks, alive now (inherit).
    fn inherited_pids(&self) -> Result<Vec<u32>> {
        let tgids: BpfHashMap<_, u32, u32> = map_ref(&self.ebpf, TARGET_TGIDS)?;
        Ok(tgids
            .iter()
            .filter_map(|r| r.ok())
            .filter(|&(_, parent)| parent != 0)
            .map(|(pid, _)| pid)
            .collect())
    }

    /// The processes whose mm the programs have registered so far (system-wide mode: every
    /// process that locked its own mm; some may have exited since).
    fn exec_names(&self) -> Result<HashMap<u32, String>> {
        Ok(read_comms(&map_ref(&self.ebpf, EXEC_COMMS)?))
    }

    fn registered_pids(&self) -> Result<Vec<u32>> {
        let mut pids: Vec<u32> = read_target_mms(&self.ebpf)?.into_values().collect();
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// The processes whose user stacks the collected data refers to (its entries, its blocking
    /// records, the timeline drained so far): the mapping lists to keep for symbolizing them.
    fn user_stack_owners(&self) -> Result<HashSet<u32>> {
        let entries: Vec<(AggKey, AggValue)> = read_shared(&self.ebpf, AGG)?;
        let blocked: Vec<(BlockKey, BlockValue)> = read_shared(&self.ebpf, blockers::BLOCKED)?;
        let timeline = self.timeline.iter().flat_map(TimelineReader::keys);
        let owners = entries
            .iter()
            .map(|(key, _)| key)
            .chain(timeline)
            .filter(|key| key.user_stack >= 0)
            .map(user_stack_owner)
            .chain(
                blocked
                    .iter()
                    .filter(|(key, _)| key.holder.user_stack >= 0)
                    .map(|(key, _)| holder_stack_owner(key)),
            );
        Ok(owners.collect())
    }

    fn exited_threads(&self) -> Result<(u64, u64)> {
        let exits: PerCpuArray<_, u64> = map_ref(&self.ebpf, THREAD_EXITS)?;
        let sum = |slot: u32| -> Result<u64> { Ok(exits.get(&slot, 0)?.iter().sum()) };
        Ok((sum(EXITED_LIFETIME_NS)?, sum(EXITED_THREADS)?))
    }

    fn trace_start_ns(&self) -> u64 {
        self.trace_start_ns
    }

    /// Moves the timeline events the kernel has written so far into memory (call it often:
    /// the ring buffer is bounded, and what does not fit is dropped and counted).
    fn drain_timeline(&mut self) {
        if let Some(timeline) = &mut self.timeline {
            timeline.drain();
        }
    }

    /// The user stack copies and events the kernel has written since the last call (call it
    /// often: the ring buffer is bounded, and what does not fit is dropped and counted).
    fn drain_user_stacks(&mut self) -> Vec<StackRecord> {
        self.user_stacks
            .as_mut()
            .map(UserStackReader::drain)
            .unwrap_or_default()
    }

    /// The frames of one stack of the stack map (a frame-pointer user stack, say), if it is
    /// still there.
    fn stack(&self, id: i32) -> Option<Vec<u64>> {
        let map: StackTraceMap<&MapData> = map_ref(&self.ebpf, STACKS).ok()?;
        let ids = HashSet::from([u32::try_from(id).ok()?]);
        read_stacks(&map, &ids).remove(&id)
    }

    /// Reads the cumulative maps while the programs keep running (the live and interval
    /// views). The timeline is left alone: it is drained by `drain_timeline` and `harvest`.
    fn snapshot(&self) -> Result<Harvest> {
        read_maps(self, Vec::new())
    }

    fn disarm(&mut self) -> Result<()> {
        self.set_armed(false)
    }

    fn final_harvest(&mut self) -> Result<Harvest> {
        self.set_armed(false)?;
        let (events, dropped_here) = match self.timeline.take() {
            Some(timeline) => timeline.finish(),
            None => (Vec::new(), 0),
        };
        // Disarmed above, so the maps no longer move; dropping the probes afterwards detaches
        // the programs.
        let mut harvest = read_maps(self, events)?;
        fold_pending(&self.ebpf, self.agg_capacity, &mut harvest)?;
        if let Some((_, n)) = harvest
            .counters
            .iter_mut()
            .find(|(c, _)| *c == Counter::TimelineDropped)
        {
            *n += dropped_here;
        }
        Ok(harvest)
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

/// Everything the programs collected, read without disturbing them, with `timeline` (drained
/// separately) added: what every family reads, the loss counters and names all share, then
/// the stacks that any of it references.
fn read_maps(probes: &Probes, timeline: Vec<tracer_common::TimelineEvent>) -> Result<Harvest> {
    let ebpf = &probes.ebpf;
    let mut harvest = Harvest {
        counters: read_counters(&map_ref(ebpf, COUNTERS)?)?,
        locker_comms: read_comms(&map_ref(ebpf, LOCKER_COMMS)?),
        features: probes.features,
        timeline,
        run_stats: self_cost::read_runs(ebpf, &probes.run_stats),
        tracer_cpu: self_cost::tracer_cpu_since(probes.cpu_at_start),
        ..Harvest::default()
    };
    for family in &FAMILIES {
        (family.read)(probes, &mut harvest)?;
    }
    let ids: HashSet<u32> = harvest
        .stack_refs()
        .into_iter()
        .map(|r| match r {
            StackRef::Kernel(id) | StackRef::User { id, .. } => id as u32,
        })
        .collect();
    harvest.stacks = read_stacks(&map_ref(ebpf, STACKS)?, &ids);
    Ok(harvest)
}

/// The last operations that threads left pending (see `pending`), folded into the final
/// harvest: the programs are disarmed, so no thread flushes them meanwhile. Every state is a
/// target's (the programs make none for other mms), including those of mms that are gone: an
/// exec leaves the old mm's last operation pending, with no later step on that mm to flush it.
fn fold_pending(ebpf: &Ebpf, capacity: usize, harvest: &mut Harvest) -> Result<()> {
    let states: BpfHashMap<_, StateKey, LockState> = map_ref(ebpf, LOCK_STATE)?;
    let pending: Vec<LockState> = states
        .iter()
        .filter_map(|r| r.ok())
        .map(|(_, st)| st)
        .filter(|st| st.pending_wait.is_some() || st.pending_holds.iter().any(|h| h.is_some()))
        .collect();
    let holders: aya::maps::Array<_, HolderRecord> = map_ref(ebpf, blockers::HOLDER_INFO)?;
    let mask = holders.len() - 1;
    pending::fold(harvest, &pending, capacity, |id| {
        let record = holders.get(&holder_slot(id, mask), 0).ok()?;
        (record.id == *id).then_some(record.holder)
    });
    Ok(())
}

fn read_target_mms(ebpf: &Ebpf) -> Result<HashMap<u64, u32>> {
    let mms: BpfHashMap<_, u64, u32> = map_ref(ebpf, TARGET_MMS)?;
    Ok(mms.iter().filter_map(|r| r.ok()).collect())
}

fn map<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map_mut(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    Ok(T::try_from(m)?)
}

fn map_ref<'a, T>(ebpf: &'a Ebpf, name: &str) -> Result<T>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    Ok(T::try_from(m)?)
}

/// Deletes the keys of the shared hash map `name` that `doomed` picks.
fn delete_where<K: Pod, V: Pod>(
    ebpf: &Ebpf,
    name: &str,
    doomed: impl Fn(&K) -> bool,
) -> Result<usize> {
    let keys: Vec<K> = read_shared::<K, V>(ebpf, name)?
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| doomed(k))
        .collect();
    delete_from(ebpf, name, &keys)
}

fn delete_from<K: Pod>(ebpf: &Ebpf, name: &str, keys: &[K]) -> Result<usize> {
    let map = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    batch::delete_keys(map, keys).with_context(|| format!("deleting from {name}"))
}

/// Every key of the hash map `name` (shared by all CPUs), with its value: in batches where the
/// kernel has them, else one key at a time.
fn read_shared<K: Pod, V: Pod>(ebpf: &Ebpf, name: &str) -> Result<Vec<(K, V)>> {
    let raw = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    if let Some(all) = batch::lookup_all(raw).with_context(|| format!("reading {name}"))? {
        return Ok(all);
    }
    let map: BpfHashMap<&MapData, K, V> = map_ref(ebpf, name)?;
    map.iter()
        .map(|item| item.with_context(|| format!("reading {name}")))
        .collect()
}

/// Every value of the array `name`, shared by all CPUs, in index order.
fn read_shared_array<V: Pod>(ebpf: &Ebpf, name: &str) -> Result<Vec<V>> {
    let raw = ebpf
        .map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    if let Some(all) =
        batch::lookup_all::<u32, V>(raw).with_context(|| format!("reading {name}"))?
    {
        return Ok(all.into_iter().map(|(_, value)| value).collect());
    }
    let map: aya::maps::Array<&MapData, V> = map_ref(ebpf, name)?;
    map.iter()
        .map(|item| item.with_context(|| format!("reading {name}")))
        .collect()
}

/// Every slot of a per-CPU array with its per-CPU values summed by `add`.
fn read_array<V: Pod + Default + Copy, const N: usize>(
    map: &PerCpuArray<&MapData, V>,
    add: impl Fn(&mut V, &V),
) -> Result<[V; N]> {
    let mut out = [V::default(); N];
    for (i, slot) in out.iter_mut().enumerate() {
        for v in map.get(&(i as u32), 0)?.iter() {
            add(slot, v);
        }
    }
    Ok(out)
}

fn read_stacks(map: &StackTraceMap<&MapData>, ids: &HashSet<u32>) -> HashMap<i32, Vec<u64>> {
    ids.iter()
        .filter_map(|&id| {
            let trace = map.get(&id, 0).ok()?;
            Some((id as i32, trace.frames().iter().map(|f| f.ip).collect()))
        })
        .collect()
}

fn read_counters(map: &PerCpuArray<&MapData, u64>) -> Result<Vec<(Counter, u64)>> {
    let mut out = Vec::with_capacity(COUNTER_SLOTS as usize);
    for counter in Counter::ALL {
        let sum = map.get(&(counter as u32), 0)?.iter().sum();
        out.push((counter, sum));
    }
    Ok(out)
}

fn read_comms(map: &BpfHashMap<&MapData, u32, [u8; 16]>) -> HashMap<u32, String> {
    map.iter()
        .filter_map(|r| r.ok())
        .map(|(pid, comm)| {
            let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
            (pid, String::from_utf8_lossy(&comm[..len]).into_owned())
        })
        .collect()
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

/// How close a loaded program came to the verifier's limit of a million instructions (the
/// margin that older kernels' verifiers, which prune less, eat into; the project holds each
/// program to VERIFIER_BUDGET), and how long loading it took: most of the time to attach.
pub(crate) fn log_verified(name: &str, info: Result<ProgramInfo, ProgramError>, took: Duration) {
    if let Some(count) = info.ok().and_then(|info| info.verified_instruction_count()) {
        log::info!(
            "{name}: the verifier processed {count} instructions (budget {VERIFIER_BUDGET}), \
             loaded in {} ms",
            took.as_millis()
        );
    }
}

/// The most instructions the verifier may process for one program, on every kernel the tests
/// run on: a fifth of its limit of a million, so that a stricter or less pruning verifier still
/// takes the programs, and loading stays well under a second.
pub const VERIFIER_BUDGET: u32 = 150_000;

/// A program's load error, with the verifier's log cut to what says why (its whole log, often
/// thousands of lines, would be the "one line" of the error; -vv logs it).
pub(crate) fn load_failed(err: aya::programs::ProgramError, doing: &str) -> anyhow::Error {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &err
    {
        let log = verifier_log.to_string();
        log::debug!("verifier log of {doing}:\n{log}");
        return explain_permission(
            anyhow!(
                "BPF_PROG_LOAD: {io_error}; the verifier said: {}",
                verifier_summary(&log)
            ),
            doing,
        );
    }
    explain_permission(anyhow!(err), doing)
}

/// The verifier's last word (its verdict ends the instruction trace) and its instruction
/// count, from a log that ends with statistics.
fn verifier_summary(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let is_statistic = |l: &&str| {
        l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
    };
    let verdict = lines
        .iter()
        .rev()
        .find(|l| !is_statistic(l))
        .copied()
        .unwrap_or("no log");
    let processed = lines.iter().find(|l| l.starts_with("processed "));
    let mut summary: String = verdict.chars().take(240).collect();
    if let Some(processed) = processed {
        summary.push_str(" (");
        summary.extend(processed.chars().take(120));
        summary.push(')');
    }
    summary
}

/// Turns EPERM from the kernel into the capability the user must add.
fn explain_permission(err: anyhow::Error, doing: &str) -> anyhow::Error {
    let text = crate::text::error_line(&err);
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        anyhow!("not enough privilege for {doing}: needs CAP_BPF and CAP_PERFMON (or root): {text}")
    } else {
        err.context(format!("{doing} failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_log_is_cut_to_its_verdict_and_count() {
        let log = "0: R1=ctx() R10=fp0\n; let x = 1;\n\
                   3207: (2d) if r1 > r2 goto pc-747 BPF program is too large. Processed 1000001 insn\n\
                   verification time 47047524 usec\nstack depth 368+0+120+72\n\
                   processed 1000001 insns (limit 1000000) max_states_per_insn 58\n";
        let summary = verifier_summary(log);
        assert!(summary.starts_with("3207: (2d)"), "{summary}");
        assert!(summary.contains("BPF program is too large"), "{summary}");
        assert!(
            summary.contains("(processed 1000001 insns (limit 1000000)"),
            "{summary}"
        );
        assert!(!summary.contains('\n'));
        assert_eq!(verifier_summary(""), "no log");
    }

    #[test]
    fn a_perf_event_open_refused_for_privilege_is_told_apart_from_other_failures() {
        let failed = |errno| {
            aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
                call: "perf_event_open_trace_point",
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert!(is_refused(&failed(libc::EACCES)));
        assert!(is_refused(&failed(libc::EPERM)));
        assert!(!is_refused(&failed(libc::ENOENT)));
        assert!(!is_refused(&aya::programs::ProgramError::NotLoaded));
    }

    #[test]
    fn late_walks_only_for_long_operations_unless_every_stack_is_asked_for() {
        assert_eq!(late_stack_threshold(0), 0);
        assert_eq!(late_stack_threshold(10_000), 1_000_000);
        assert_eq!(late_stack_threshold(5_000_000), 5_000_000);
    }
}
