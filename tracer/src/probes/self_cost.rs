//! What the loaded programs and maps cost, as the kernel accounts it: each program's run count
//! and run time (kept only while BPF_ENABLE_STATS is held, or kernel.bpf_stats_enabled is on),
//! and each map's locked memory, both read from /proc/self/fdinfo of their fds.

use std::fmt::Write as _;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use aya::{maps::Map, maps::MapData, sys::Stats, Ebpf};

use super::Probes;
use crate::model::self_cost::{since, ProgramRuns, RunStats, TracerCpu};

/// How the programs' runs are counted (`--self-cost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfCostMode {
    /// Every run, for the whole trace.
    Full,
    /// Only `SAMPLE_ON` of every `SAMPLE_PERIOD`.
    Sampled,
    Off,
}

/// The sampled statistics are on this long of every period: a tenth of the two clock reads
/// that counting adds to every run (measured on the small-files workload: counting throughout
/// cost 3.5 points of untraced throughput under the defaults, 5 under `--lean`), and every
/// window of the live view (a second) still sees two samples.
const SAMPLE_ON: Duration = Duration::from_millis(50);
const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// Turning the statistics on or off patches the kernel's text at every site of their static
/// key, with rounds of IPIs to every CPU: 0.15-0.3 ms on this machine (a KVM guest), 4-11 ms
/// under QEMU's TCG, where flipping four times a second stalled a target enough to change which
/// of its holds was the longest. Where one flip takes longer than this, the statistics stay on
/// instead: counting costs the target less than flipping does.
const FLIP_LIMIT: Duration = Duration::from_millis(1);

/// Whether the kernel is counting the programs' runs for this trace.
pub(super) enum RunTimeStats {
    Counting {
        /// While sampling: turns the statistics on and off, and times how long they were on.
        /// None when they stay on: the fd is held for the trace's lifetime (`_fd`), or
        /// kernel.bpf_stats_enabled was on already (it may be turned off under us; then the
        /// counts stop growing).
        sampler: Option<Sampler>,
        _fd: Option<OwnedFd>,
        /// The counts when the trace started: the programs also run, disarmed, between
        /// loading and arming, and under a sysctl they counted before this trace.
        start: RunStats,
        /// The sampler's counted time when the trace started.
        start_counted: Duration,
    },
    Unavailable(String),
}

impl RunTimeStats {
    /// Turns the statistics on; never fails the trace, but says why when they stay off. The
    /// sampler watches `ebpf`'s programs' counts while the statistics are off, to find out
    /// whether someone else keeps them on.
    pub(super) fn enable(mode: SelfCostMode, ebpf: &Ebpf) -> Self {
        if mode == SelfCostMode::Off {
            return RunTimeStats::Unavailable("turned off by --self-cost off".into());
        }
        let counting = |sampler, fd| RunTimeStats::Counting {
            sampler,
            _fd: fd,
            start: RunStats::default(),
            start_counted: Duration::ZERO,
        };
        // Under the sysctl every run is counted whatever this trace does.
        if sysctl_on() {
            return counting(None, None);
        }
        let flip = Instant::now();
        let err = match aya::sys::enable_stats(Stats::RunTime) {
            Ok(fd) if mode == SelfCostMode::Sampled && flips_cheaply(flip.elapsed()) => {
                return match Sampler::start(fd, program_fds(ebpf)) {
                    Ok(sampler) => counting(Some(sampler), None),
                    Err((fd, err)) => {
                        log::info!("self-cost: no sampler thread ({err}): counting throughout");
                        counting(None, Some(fd))
                    }
                };
            }
            Ok(fd) => return counting(None, Some(fd)),
            Err(err) => err.io_error,
        };
        let why = match err.raw_os_error() {
            Some(libc::EPERM) => "BPF_ENABLE_STATS needs CAP_SYS_ADMIN; or run `sysctl \
                                  kernel.bpf_stats_enabled=1` first"
                .to_string(),
            Some(libc::EINVAL) => "this kernel has no BPF_ENABLE_STATS (Linux 5.8)".to_string(),
            _ => format!("BPF_ENABLE_STATS failed: {err}"),
        };
        log::info!("self-cost unavailable: {why}");
        RunTimeStats::Unavailable(why)
    }
}

/// Whether a flip of the statistics that took `flip` is cheap enough to sample with; logs the
/// choice when it is not.
fn flips_cheaply(flip: Duration) -> bool {
    let cheap = flip <= FLIP_LIMIT;
    if !cheap {
        log::info!(
            "self-cost: turning bpf_stats on or off took {:.1} ms here (the kernel patches its \
             text): counting throughout instead of sampling",
            flip.as_secs_f64() * 1e3
        );
    }
    cheap
}

fn sysctl_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
}

/// A thread that holds the BPF_ENABLE_STATS fd `SAMPLE_ON` of every `SAMPLE_PERIOD`, and the
/// time it held it. Another holder (a second tracer, a profiler's bpf_stats window, the sysctl
/// turned on later) makes the kernel count outside these windows too: the sampler sees the
/// programs' counts grow while its own window is closed, and counts that time as well (eight
/// forgotten daemons beside a clamd scan had made a sampled estimate of 24% for a 6%
/// slowdown). It goes on flipping, so that the trace costs the same with or without them.
pub(super) struct Sampler {
    clock: Arc<Mutex<SampleClock>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// The time the statistics were on: closed windows, and the open one if any.
#[derive(Default)]
struct SampleClock {
    closed: Duration,
    open_since: Option<Instant>,
}

impl SampleClock {
    fn counted(&self) -> Duration {
        self.closed
            + self
                .open_since
                .map_or(Duration::ZERO, |since| since.elapsed())
    }
}

impl Sampler {
    /// Starts with the statistics on (`fd`), so that a short trace is counted from its start.
    /// Hands `fd` back when there is no thread to sample with: then the statistics stay on,
    /// rather than be closed with the clock still counting.
    fn start(fd: OwnedFd, watched: Vec<OwnedFd>) -> Result<Self, (OwnedFd, std::io::Error)> {
        let clock = Arc::new(Mutex::new(SampleClock {
            closed: Duration::ZERO,
            open_since: Some(Instant::now()),
        }));
        let (stop, stopped) = mpsc::channel();
        let (hand_over, handed) = mpsc::channel::<OwnedFd>();
        let spawned = {
            let clock = Arc::clone(&clock);
            thread::Builder::new()
                .name("self-cost".into())
                .spawn(move || {
                    if let Ok(fd) = handed.recv() {
                        sample(fd, &watched, &clock, &stopped);
                    }
                })
        };
        let thread = match spawned {
            Ok(thread) => thread,
            Err(err) => return Err((fd, err)),
        };
        // The thread waits for the fd, so the channel is open.
        if let Err(mpsc::SendError(fd)) = hand_over.send(fd) {
            return Err((
                fd,
                std::io::Error::other("the sampler thread ended at once"),
            ));
        }
        Ok(Self {
            clock,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// How long the statistics have been on.
    fn counted(&self) -> Duration {
        lock(&self.clock).counted()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(clock: &Mutex<SampleClock>) -> std::sync::MutexGuard<'_, SampleClock> {
    clock
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The sampler's loop: on for SAMPLE_ON, off for the rest of the period, until told to stop
/// (the sender dropped), or on for good once a flip proves dear. The fd is closed, and the window timed, under the clock's lock, so that a reading never sees
/// counts of a window whose time it does not have.
fn sample(
    first: OwnedFd,
    watched: &[OwnedFd],
    clock: &Mutex<SampleClock>,
    stopped: &mpsc::Receiver<()>,
) {
    let mut fd = first;
    let running = |wait| stopped.recv_timeout(wait) == Err(mpsc::RecvTimeoutError::Timeout);
    let mut told = false;
    loop {
        if !running(SAMPLE_ON) {
            return;
        }
        let flip = Instant::now();
        let (off_at, runs_at_off) = {
            let mut clock = lock(clock);
            drop(fd);
            if let Some(since) = clock.open_since.take() {
                clock.closed += since.elapsed();
            }
            (Instant::now(), total_runs(watched))
        };
        let cheap = flips_cheaply(flip.elapsed());
        if cheap && !running(SAMPLE_PERIOD - SAMPLE_ON) {
            return;
        }
        let flip = Instant::now();
        let mut clock = lock(clock);
        if counted_while_off(runs_at_off, total_runs(watched)) {
            // The kernel counted the runs of the window just closed all the same.
            clock.closed += off_at.elapsed();
            if !told {
                told = true;
                log::info!(
                    "self-cost: the programs were counted while this trace had the statistics \
                     off (another tracer or profiler holds them on): that time is counted too"
                );
            }
        }
        match aya::sys::enable_stats(Stats::RunTime) {
            Ok(on) => {
                fd = on;
                clock.open_since = Some(Instant::now());
            }
            Err(err) => {
                log::warn!("self-cost: turning the statistics on again failed: {err}");
                return;
            }
        }
        drop(clock);
        if !(cheap && flips_cheaply(flip.elapsed())) {
            // On for the rest of the trace, the window open: `fd` is held until told to stop.
            while running(SAMPLE_PERIOD) {}
            return;
        }
    }
}

/// Whether the programs ran, counted, while this trace had the statistics off: more runs than
/// those under way when they were turned off (a run started while they were on is counted when
/// it ends), at most a few per CPU.
fn counted_while_off(at_off: u64, now: u64) -> bool {
    let in_flight = 2 * thread::available_parallelism().map_or(64, |n| n.get() as u64) + 16;
    now.saturating_sub(at_off) > in_flight
}

/// The programs' fds for the sampler to watch (duplicates: the sampler's thread outlives no
/// borrow of the object).
fn program_fds(ebpf: &Ebpf) -> Vec<OwnedFd> {
    ebpf.programs()
        .filter_map(|(_, program)| program.fd().ok()?.as_fd().try_clone_to_owned().ok())
        .collect()
}

/// The run counts of `programs` together.
fn total_runs(programs: &[OwnedFd]) -> u64 {
    programs
        .iter()
        .filter_map(|fd| field(&read_fdinfo(fd.as_fd()).ok()?, "run_cnt"))
        .sum()
}

/// The programs' counters since the trace started.
pub(super) fn read_runs(ebpf: &Ebpf, stats: &RunTimeStats) -> RunStats {
    let (sampler, start, start_counted) = match stats {
        RunTimeStats::Unavailable(why) => return RunStats::Unavailable(why.clone()),
        RunTimeStats::Counting {
            sampler,
            start,
            start_counted,
            ..
        } => (sampler, start, *start_counted),
    };
    let Some(sampler) = sampler else {
        return since(&current_runs(ebpf), start);
    };
    // The clock first: counts read after it can only include a little more of an open window.
    let counted = sampler.counted().saturating_sub(start_counted);
    match since(&current_runs(ebpf), start) {
        RunStats::Counted(programs) => RunStats::Sampled {
            programs,
            counted_ns: counted.as_nanos() as u64,
        },
        other => other,
    }
}

/// Every loaded program's counters, named as the eBPF object names it (programs the kernel
/// lacked a tracepoint for were never loaded and are left out).
fn current_runs(ebpf: &Ebpf) -> RunStats {
    let mut programs = Vec::new();
    for (name, program) in ebpf.programs() {
        let Ok(fd) = program.fd() else {
            continue;
        };
        let fdinfo = match read_fdinfo(fd.as_fd()) {
            Ok(text) => text,
            Err(err) => return RunStats::Unavailable(format!("reading {name}'s fdinfo: {err}")),
        };
        programs.push(ProgramRuns {
            name: name.to_string(),
            runs: field(&fdinfo, "run_cnt").unwrap_or(0),
            run_time_ns: field(&fdinfo, "run_time_ns").unwrap_or(0),
        });
    }
    RunStats::Counted(programs)
}

/// The CPU time (user and system, every thread) this process has used: the tracer's own cost
/// beside its programs' (reading maps, unwinding, symbolizing, /proc).
pub fn process_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the kernel to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } != 0 {
        return 0;
    }
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// This process's CPU time and the wall time since `start` (its CPU time then, and when).
pub fn tracer_cpu_since(start: (u64, Instant)) -> TracerCpu {
    TracerCpu {
        cpu_ns: process_cpu_ns().saturating_sub(start.0),
        wall_ns: u64::try_from(start.1.elapsed().as_nanos()).unwrap_or(u64::MAX),
    }
}

impl Probes {
    /// Counts the programs' runs from now on: call it when the trace starts (at arming), so
    /// that runs per second are over the trace's duration.
    pub fn start_self_cost(&mut self) {
        self.cpu_at_start = (process_cpu_ns(), Instant::now());
        if let RunTimeStats::Counting {
            start,
            start_counted,
            sampler,
            ..
        } = &mut self.run_stats
        {
            *start_counted = sampler.as_ref().map_or(Duration::ZERO, Sampler::counted);
            *start = current_runs(&self.ebpf);
        }
    }

    /// Logs (at -v) each map's locked memory and capacity, and their total.
    pub fn log_map_memory(&self) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        let mut maps: Vec<MapMemory> = self
            .ebpf
            .maps()
            .filter_map(|(name, map)| {
                let fdinfo = read_fdinfo(map_data(map).fd().as_fd()).ok()?;
                Some(MapMemory {
                    name: name.to_string(),
                    max_entries: field(&fdinfo, "max_entries")?,
                    memlock: field(&fdinfo, "memlock")?,
                })
            })
            .collect();
        maps.sort_by(|a, b| b.memlock.cmp(&a.memlock).then(a.name.cmp(&b.name)));
        log::info!("{}", map_memory_table(&maps));
    }
}

/// One map's line of the -v table.
struct MapMemory {
    name: String,
    max_entries: u64,
    memlock: u64,
}

fn map_memory_table(maps: &[MapMemory]) -> String {
    let total: u64 = maps.iter().map(|m| m.memlock).sum();
    let mut out = format!(
        "BPF maps: {} in {} maps (memlock, from /proc/self/fdinfo)",
        human_bytes(total),
        maps.len()
    );
    for m in maps {
        let _ = write!(
            out,
            "\n  {:<16} {:>10}  max_entries {}",
            m.name,
            human_bytes(m.memlock),
            m.max_entries
        );
    }
    out
}

fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    if bytes < KIB {
        format!("{bytes} B")
    } else if bytes < MIB {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// aya 0.14 has no accessor for the data behind a `Map`; every variant holds one.
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

fn read_fdinfo(fd: BorrowedFd<'_>) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
}

/// The decimal value of `key:` in fdinfo text (`run_cnt:\t42`).
fn field(fdinfo: &str, key: &str) -> Option<u64> {
    fdinfo.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROG_FDINFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2071\n\
        prog_type:\t5\nprog_jited:\t1\nprog_tag:\t2d4c6f8fd0a4b1e3\nmemlock:\t4096\n\
        prog_id:\t77\nrun_time_ns:\t123456\nrun_cnt:\t321\nrecursion_misses:\t0\n\
        verified_insns:\t905\n";

    #[test]
    fn fdinfo_fields_by_exact_key() {
        assert_eq!(field(PROG_FDINFO, "run_cnt"), Some(321));
        assert_eq!(field(PROG_FDINFO, "run_time_ns"), Some(123_456));
        assert_eq!(field(PROG_FDINFO, "memlock"), Some(4096));
        assert_eq!(field(PROG_FDINFO, "run"), None, "no prefix matches");
        assert_eq!(field(PROG_FDINFO, "prog_tag"), None, "not decimal");
    }

    #[test]
    fn map_table_totals_and_lists_each_map() {
        let maps = [
            MapMemory {
                name: "AGG".into(),
                max_entries: 10240,
                memlock: 3 << 20,
            },
            MapMemory {
                name: "ARMED".into(),
                max_entries: 1,
                memlock: 512,
            },
        ];
        assert_eq!(
            map_memory_table(&maps),
            "BPF maps: 3.0 MiB in 2 maps (memlock, from /proc/self/fdinfo)\n\
             \x20 AGG                 3.0 MiB  max_entries 10240\n\
             \x20 ARMED                 512 B  max_entries 1"
        );
    }

    #[test]
    fn runs_finishing_after_the_statistics_went_off_are_not_another_holder() {
        assert!(!counted_while_off(1_000, 1_000));
        assert!(
            !counted_while_off(1_000, 1_004),
            "runs under way at the flip"
        );
        assert!(
            counted_while_off(1_000, 50_000),
            "half a second of another's counting"
        );
    }

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(8 << 20), "8.0 MiB");
    }
}
