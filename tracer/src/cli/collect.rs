//! What the programs collect for each wait and hold, and the sizes of the kernel maps.

use clap::{Args, ValueEnum};

use super::parse::{parse_duration_ns, parse_ring_bytes};
use crate::probes::floor::BenchFloor;

/// How user stacks are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UserStackArg {
    /// Frame pointers walked by the kernel, plus copies of the stacks of waits that slept (and
    /// of a sample of the other operations) unwound with each object's CFI (.eh_frame,
    /// .debug_frame).
    Dwarf,
    /// Frame pointers only: stops early in code built without them (Debian's libc).
    Fp,
    /// Kernel stacks only.
    None,
}

/// How the report's self-cost is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SelfCostArg {
    /// The kernel's BPF run-time statistics on a tenth of the time (50 ms of every 500 ms),
    /// extrapolated to the whole trace.
    Sampled,
    /// The statistics on for the whole trace: every run counted, at two clock reads per run
    /// (3-5% of a lock-bound target's throughput).
    Full,
    /// Not measured.
    Off,
}

/// The largest --max-entries and --max-stacks: beyond it the kernel maps would take
/// gigabytes (or the kernel refuses them with a bare E2BIG).
const MAX_MAP_ENTRIES: i64 = 1 << 20;

/// What the programs collect for each wait and hold, and what it costs.
#[derive(Debug, Args)]
#[command(next_help_heading = "Collection")]
pub struct CollectArgs {
    /// Take stacks for waits and holds at least this long (e.g. 0, 500ns, 10us, 1ms). Shorter
    /// ones are counted and timed but grouped without a stack, by cause; 0 stacks everything.
    /// A wait's stacks are walked when it goes to sleep for the lock (the hold that follows
    /// shares them), and one lock operation in --user-stack-sample is walked whatever its
    /// length; one that turns out long without having slept gets its stacks only from 1 ms (or
    /// this threshold, if larger), since walking them inside the critical section costs every
    /// waiter.
    #[arg(long, default_value = "10us", value_parser = parse_duration_ns, value_name = "DURATION")]
    pub stack_threshold: u64,

    /// Aggregate per thread as well as per stack.
    #[arg(long)]
    pub per_thread: bool,

    /// How user stacks are taken: `dwarf` also copies the user stack of each wait that sleeps
    /// for the lock (and of one in --user-stack-sample of the other operations) and unwinds it
    /// with the objects' CFI; `fp` walks frame pointers only; `none` takes kernel stacks only.
    #[arg(long, value_enum, default_value_t = UserStackArg::Dwarf, value_name = "HOW")]
    pub user_stack: UserStackArg,

    /// Bytes of user stack copied above the stack pointer for `--user-stack dwarf` (1 to 65536;
    /// deeper stacks are unwound as far as the window goes and marked truncated). The default
    /// is the most: 16 KiB cut 23-61% of clamd's stack time short later in a scan, 64 KiB
    /// none, and the tracer cost the heaviest workload the same with either (the copies
    /// per CPU and second are budgeted by the ring buffer, so fewer larger copies are made).
    #[arg(
        long,
        default_value = "65536",
        value_name = "BYTES",
        value_parser = clap::value_parser!(u32).range(1..=tracer_common::USER_STACK_MAX as i64)
    )]
    pub user_stack_bytes: u32,

    /// One in N lock operations get stacks and a user stack copy whatever their length,
    /// so that the common short paths are named and unwound; 0: none.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub user_stack_sample: u32,

    /// Timing only, the cheapest mode: waits and holds per mode, with no stacks, causes, holder
    /// attribution, off-CPU split or fault and syscall programs (only the three mmap_lock
    /// tracepoints are attached).
    #[arg(long, conflicts_with_all = ["user_stack", "stack_threshold", "per_thread"])]
    pub lean: bool,

    /// Also time the mm syscalls (count, total and average of each of mmap, munmap, mprotect,
    /// mremap, madvise and brk, with the lock wait and hold inside it), on the syscall
    /// tracepoints. Off by default: attaching any syscall tracepoint sends every syscall of every
    /// process on the machine through the kernel's slow path, which cost a lock-bound target as
    /// much as the rest of the tracer (the lock operations are named after their syscall
    /// either way).
    #[arg(long, conflicts_with = "lean")]
    pub syscall_times: bool,

    /// How the report's self-cost (the tracer's programs' events/s, ns per run and the time
    /// they add to the traced threads) is measured.
    #[arg(long, value_enum, default_value_t = SelfCostArg::Sampled, value_name = "HOW")]
    pub self_cost: SelfCostArg,

    /// Same as --user-stack none (kept for older scripts).
    #[arg(long, hide = true)]
    pub no_user_stacks: bool,
}

/// Sizes of the kernel maps.
#[derive(Debug, Args)]
#[command(next_help_heading = "Map sizes")]
pub struct MapArgs {
    /// Capacity of the in-kernel aggregation map, 1 to 1048576 (entries beyond it are counted
    /// as lost; each takes about 300 bytes of kernel memory).
    #[arg(
        long,
        default_value_t = 10240,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_MAP_ENTRIES)
    )]
    pub max_entries: u32,

    /// Capacity of the in-kernel stack map, 1 to 1048576 (each stack takes about 1 KiB of
    /// kernel memory, allocated at load).
    #[arg(
        long,
        default_value_t = 16384,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_MAP_ENTRIES)
    )]
    pub max_stacks: u32,

    /// Size of the timeline and user-stack ring buffers (a power of two, at least 4096; tests
    /// use it to fill them).
    #[arg(long, hide = true, value_parser = parse_ring_bytes, value_name = "BYTES")]
    pub ring_bytes: Option<u32>,

    /// Capacity of the per-thread maps (lock states, holding threads, open mm syscalls), 1 to
    /// 1048576, instead of 16384: a test fills them with fewer threads than that, where each
    /// thread takes long to start (under emulation).
    #[arg(
        long,
        hide = true,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_MAP_ENTRIES)
    )]
    pub thread_entries: Option<u32>,
}

/// Settings for the tests and the benchmark, hidden from --help.
#[derive(Debug, Args)]
pub struct TestingArgs {
    /// Attach classic tracepoints even where BTF tracepoints would do (tests use it to cover
    /// the fallback that kernels without BTF for the events get).
    #[arg(long, hide = true)]
    pub classic_tracepoints: bool,

    /// For `cargo xtask bench`: attach only empty programs of this kind to the mmap_lock
    /// tracepoints and wait for the targets to exit, with no report.
    #[arg(long, hide = true, value_enum, requires = "pid", value_name = "KIND")]
    pub bench_floor: Option<BenchFloor>,
}
