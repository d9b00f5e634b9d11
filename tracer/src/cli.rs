//! Command-line interface.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
    /// One row per call stack, raw nanoseconds, with a header row.
    Csv,
}

/// How user stacks are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UserStackArg {
    /// Frame pointers walked by the kernel, plus copies of the stack of long (and a sample of
    /// short) waits and holds unwound with each object's CFI (.eh_frame, .debug_frame).
    Dwarf,
    /// Frame pointers only: stops early in code built without them (Debian's libc).
    Fp,
    /// Kernel stacks only.
    None,
}

/// What flamegraph widths (--folded, --svg) measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightArg {
    /// Time waiting for the lock (µs).
    Wait,
    /// Time holding the lock (µs).
    Hold,
    /// Number of acquisitions.
    Count,
}

use crate::probes::floor::BenchFloor;

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

/// How the trace is shown while it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum View {
    /// The top-style terminal view, refreshed every interval.
    Live { interval: Duration },
    /// A text report on stdout every interval (for pipes and logs).
    Intervals { interval: Duration },
    /// One report at the end.
    Final,
    /// `serve`: nothing on the terminal; windows folded into series for the HTTP endpoint.
    Serve,
}

/// Who waits on a process's mmap_lock, for how long, and doing what: wait and hold time per call
/// stack, from the kernel's mmap_lock tracepoints.
#[derive(Debug, Parser)]
#[command(name = "mmapsem-trace", version)]
#[command(group = clap::ArgGroup::new("target").args(["pid", "all", "command"]).required(true))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Cli {
    #[command(subcommand)]
    pub action: Option<Action>,

    /// Process id(s) to trace, comma-separated.
    #[arg(
        short,
        long,
        value_delimiter = ',',
        // `-p -1` reaches parse_pid, which says what is wrong, instead of clap suggesting
        // `-- -1` (which would run a command named -1).
        allow_negative_numbers = true,
        value_parser = parse_pid,
        conflicts_with = "command",
        value_name = "PID[,PID...]"
    )]
    pub pid: Vec<u32>,

    /// Instead of -p: trace every user process's mmap_lock, with a per-process split (until
    /// -d, Ctrl-C, SIGTERM or SIGHUP).
    #[arg(short = 'a', long = "all", conflicts_with_all = ["pid", "command"])]
    pub all: bool,

    /// Instead of -p: run this command, traced from its first instruction with every process it
    /// starts (forked and exec'd children, theirs too), and exit with its status
    /// (`mmapsem-trace -- make -j8`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,

    /// With `-- CMD`: trace the command's own process only, not the processes it starts.
    #[arg(long, requires = "command")]
    pub no_inherit: bool,

    /// With `-- CMD` as root: run the command as this user (name or uid), with its groups,
    /// HOME, USER and LOGNAME, as `sudo -u USER CMD` would (sudo's own fork is not followed).
    #[arg(long, requires = "command", value_name = "USER")]
    pub user: Option<String>,

    /// Stop after this many seconds, more than 0 and at most 10 years (default: until Ctrl-C,
    /// SIGTERM or the targets exit).
    #[arg(
        short,
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = parse_duration_secs
    )]
    pub duration: Option<f64>,

    /// Report format (default text). Giving one turns the live view off unless --live.
    #[arg(long, value_enum)]
    pub format: Option<Format>,

    /// Write the report to this file instead of stdout (`-` is stdout). A regular file is
    /// replaced atomically, keeping its mode; a device or FIFO is written to.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Show the live view (the default when stdout is a terminal and neither --format nor -o
    /// is given).
    #[arg(long, conflicts_with = "no_live")]
    pub live: bool,

    /// Never show the live view.
    #[arg(long)]
    pub no_live: bool,

    /// Refresh the live view every SECS (default 1), or without it print a report every SECS
    /// (from 0.05 s to 10 years).
    #[arg(
        short,
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = parse_interval
    )]
    pub interval: Option<Duration>,

    /// With -i and no live view: each report covers its own interval (default: cumulative).
    #[arg(long)]
    pub reset: bool,

    /// Also write folded stacks (flamegraph.pl / inferno input) to FILE.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,

    /// Also write an SVG flamegraph to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Also write a pprof profile (gzipped protobuf: go tool pprof, Pyroscope, Parca) to FILE:
    /// sample types contentions/count and delay/nanoseconds as in Go's mutex profile, with
    /// holds/count and hold/nanoseconds (-sample_index=hold); labels kind, mode, cause,
    /// process, pid.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,

    /// What flamegraph widths measure.
    #[arg(long, value_enum, default_value_t = WeightArg::Wait)]
    pub weight: WeightArg,

    /// Also write every wait and hold over --threshold as Chrome trace-event JSON (Perfetto,
    /// chrome://tracing) to FILE.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,

    /// Shortest wait or hold put on the --timeline; with --user-stack dwarf, also the shortest
    /// whose user stack is copied even when its wait never slept (e.g. 500us, 1ms).
    #[arg(long, default_value = "1ms", value_parser = parse_duration_ns, value_name = "DURATION")]
    pub threshold: u64,

    /// Call-stack blocks shown in the text report.
    #[arg(short = 'n', long, default_value_t = 10, value_name = "N")]
    pub top: usize,

    /// Take stacks for waits and holds at least this long (e.g. 0, 500ns, 10us, 1ms). Shorter
    /// ones are counted and timed but grouped without a stack; 0 stacks everything. Stacks are
    /// walked before the lock is taken, for operations expected to last this long (behind a
    /// long hold, or long the last time); one that turns out long unexpectedly gets its stacks
    /// only from 1 ms (or this threshold, if larger), since walking them inside the critical
    /// section costs every waiter.
    #[arg(long, default_value = "10us", value_parser = parse_duration_ns, value_name = "DURATION")]
    pub stack_threshold: u64,

    /// Aggregate per thread as well as per stack.
    #[arg(long)]
    pub per_thread: bool,

    /// How user stacks are taken: `dwarf` unwinds with CFI copies of the stacks of lock
    /// operations expected to wait or hold past --stack-threshold (and of one in
    /// --user-stack-sample of the others); `fp` walks frame pointers only; `none` takes kernel
    /// stacks only.
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

    /// Attach classic tracepoints even where BTF tracepoints would do (tests use it to cover
    /// the fallback that kernels without BTF for the events get).
    #[arg(long, hide = true)]
    pub classic_tracepoints: bool,

    /// For `cargo xtask bench`: attach only empty programs of this kind to the mmap_lock
    /// tracepoints and wait for the targets to exit, with no report.
    #[arg(long, hide = true, value_enum, requires = "pid", value_name = "KIND")]
    pub bench_floor: Option<BenchFloor>,

    /// More logging on stderr, the BPF maps' memory among it (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Trace continuously (every process, unless -p or --comm narrows it) and serve it over
    /// HTTP: /metrics (OpenMetrics or Prometheus text) and /debug/pprof/mmap_lock?seconds=N
    /// (a pprof profile of the next N seconds). Timing only unless --stacks. Runs until
    /// SIGTERM, SIGINT or SIGHUP (with -p: until those processes have exited).
    Serve(ServeArgs),
    /// Print the man page or a shell's completions on stdout (`cargo xtask package` uses it).
    #[command(hide = true)]
    Generate {
        #[arg(value_enum)]
        what: Generated,
    },
}

/// What `generate` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    Man,
    /// The page of `serve` (mmapsem-trace-serve(1)).
    ManServe,
    Bash,
    Zsh,
    Fish,
}

/// The man page (roff) or completions of the whole command line, serve included.
pub fn generate(what: Generated, out: &mut dyn std::io::Write) -> Result<()> {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    let name = command.get_name().to_string();
    let shell = match what {
        Generated::Man => {
            clap_mangen::Man::new(command).render(out)?;
            return Ok(());
        }
        Generated::ManServe => {
            command.build();
            let serve = command
                .find_subcommand("serve")
                .context("no serve subcommand")?
                .clone()
                .name("mmapsem-trace-serve")
                .version(env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(serve).render(out)?;
            return Ok(());
        }
        Generated::Bash => clap_complete::Shell::Bash,
        Generated::Zsh => clap_complete::Shell::Zsh,
        Generated::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, name, out);
    Ok(())
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on. Loopback unless another address is given here: whoever
    /// reaches the endpoint reads process names and call stacks.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR:PORT")]
    pub listen: std::net::SocketAddr,

    /// Trace only these processes (comma-separated).
    #[arg(
        short,
        long,
        value_delimiter = ',',
        allow_negative_numbers = true,
        value_parser = parse_pid,
        value_name = "PID[,PID...]"
    )]
    pub pid: Vec<u32>,

    /// Export only the processes of this name (repeat for more names). Every process's lock
    /// is still timed in the kernel; the names choose what /metrics and the profiles show.
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,

    /// Also walk kernel and frame-pointer user stacks, of waits and holds past 10 us and of
    /// one in 64 others: causes for the series, stacks for the profiles. Costs more per lock
    /// event than timing alone.
    #[arg(long)]
    pub stacks: bool,

    /// Label the series with the pid as well as the process name (pids are many over a
    /// daemon's life: --max-series bounds them).
    #[arg(long)]
    pub label_pid: bool,

    /// The most series exported; the operations of series beyond it are counted in
    /// mmapsem_trace_lost_events_total{counter="series_cap"}.
    #[arg(
        long,
        default_value_t = 2000,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub max_series: u32,

    /// More logging on stderr (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Where `serve` listens unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9723";

/// `-o -`: the report goes to standard output.
pub const STDOUT_NAME: &str = "-";

/// Default refresh of the live view.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// The longest -d or -i: far beyond any trace, and far from where Instant + Duration
/// arithmetic could overflow.
pub const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// The largest --max-entries and --max-stacks: beyond it the kernel maps would take
/// gigabytes (or the kernel refuses them with a bare E2BIG).
const MAX_MAP_ENTRIES: i64 = 1 << 20;

/// `pids` without repetitions, in the order first given (`-p W,W` traces W once, and counts its
/// threads' time once).
pub fn unique_pids(pids: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    pids.iter().copied().filter(|p| seen.insert(*p)).collect()
}

impl Cli {
    /// `serve`'s arguments, when that is what was asked for.
    pub fn serve(&self) -> Option<&ServeArgs> {
        match &self.action {
            Some(Action::Serve(args)) => Some(args),
            _ => None,
        }
    }

    /// `serve` as a trace: system-wide unless -p, timing only unless --stacks (then frame
    /// pointers: no stack copies), nothing on the terminal.
    pub fn with_serve_settings(mut self) -> Self {
        let Some(serve) = self.serve().cloned() else {
            return self;
        };
        self.all = serve.pid.is_empty();
        self.pid = serve.pid;
        self.lean = !serve.stacks;
        self.user_stack = UserStackArg::Fp;
        self.no_live = true;
        self.verbose = serve.verbose;
        self
    }

    /// The file of `-o`, unless it is `-` (standard output).
    pub fn output_file(&self) -> Option<&Path> {
        self.output
            .as_deref()
            .filter(|path| *path != Path::new(STDOUT_NAME))
    }

    /// `--stack-threshold`, or never with --lean.
    pub fn stack_threshold(&self) -> u64 {
        if self.lean {
            u64::MAX
        } else {
            self.stack_threshold
        }
    }

    /// `--user-stack`, with the older `--no-user-stacks` meaning `none`.
    pub fn user_stack(&self) -> UserStackArg {
        if self.no_user_stacks || self.lean {
            UserStackArg::None
        } else {
            self.user_stack
        }
    }

    /// Picks the view. The live view needs a terminal to draw on and read keys from
    /// (`terminal`, see `run::live_terminal`); it is the default there unless the user asked
    /// for a report format or file.
    pub fn view(&self, terminal: bool) -> Result<View> {
        if self.serve().is_some() {
            return Ok(View::Serve);
        }
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL);
        if self.live {
            if !terminal {
                bail!(
                    "--live needs a terminal on stdout, and on stdin or /dev/tty for its keys \
                     (use -i SECS for reports in a pipe)"
                );
            }
            return Ok(View::Live { interval });
        }
        let asked_for_report = self.format.is_some() || self.output.is_some();
        if terminal && !self.no_live && !asked_for_report {
            return Ok(View::Live { interval });
        }
        match self.interval {
            Some(interval) => {
                if self.output_file().is_none() && self.format.is_some_and(|f| f != Format::Text) {
                    bail!("-i prints text reports on stdout; write json or csv with -o FILE");
                }
                Ok(View::Intervals { interval })
            }
            None => Ok(View::Final),
        }
    }

    /// Whether a report of the whole trace is written at the end: always for a plain run;
    /// after interval reports only to -o (stdout already has them); after the live view only
    /// when --format or -o asked for one.
    pub fn final_report_wanted(&self, view: &View) -> bool {
        match view {
            View::Final => true,
            View::Intervals { .. } => self.output_file().is_some(),
            View::Live { .. } => self.format.is_some() || self.output.is_some(),
            View::Serve => false,
        }
    }
}

/// A clap usage error on one line: its message and tips without the usage block, then a
/// pointer to --help (once: clap's own "For more information, try '--help'." is dropped).
pub fn one_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let message = text.split("\nUsage:").next().unwrap_or(&text);
    let parts: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("For more information, try"))
        .collect();
    let joined = parts.join(" ");
    let joined = joined.strip_prefix("error: ").unwrap_or(&joined);
    format!("{joined} (see --help)")
}

/// A process id: a positive number.
fn parse_pid(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err("not a process id (want a number from 1)".to_owned()),
    }
}

/// A number of seconds from `min` to MAX_SECONDS.
fn parse_seconds(text: &str, min: f64, min_inclusive: bool) -> Result<f64, String> {
    let range = || {
        let low = if min_inclusive {
            "at least"
        } else {
            "more than"
        };
        format!("{low} {min} and at most {MAX_SECONDS} seconds, 10 years")
    };
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("not a number of seconds (want {})", range()))?;
    let above_min = if min_inclusive {
        seconds >= min
    } else {
        seconds > min
    };
    // NaN fails both comparisons.
    if !(above_min && seconds <= MAX_SECONDS) {
        return Err(format!("out of range (want {})", range()));
    }
    Ok(seconds)
}

fn parse_duration_secs(text: &str) -> Result<f64, String> {
    parse_seconds(text, 0.0, false)
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_seconds(text, 0.05, true).map(Duration::from_secs_f64)
}

/// A ring buffer size the kernel accepts: a power of two, a page at least.
fn parse_ring_bytes(text: &str) -> Result<u32, String> {
    let bytes: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if bytes < 4096 || !bytes.is_power_of_two() {
        return Err("must be a power of two of at least 4096".to_owned());
    }
    Ok(bytes)
}

/// Parses `0`, `750ns`, `10us`, `10µs`, `2ms`, `1s` (a bare number means microseconds).
pub fn parse_duration_ns(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = match number.parse() {
        Ok(v) => v,
        Err(_) => bail!("not a duration: {text:?} (examples: 0, 500ns, 10us, 2ms)"),
    };
    let scale = match unit.trim() {
        "ns" => 1.0,
        "" | "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => bail!("unknown unit {other:?} in {text:?} (use ns, us, ms or s)"),
    };
    Ok((value * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("0").unwrap(), 0);
        assert_eq!(parse_duration_ns("750ns").unwrap(), 750);
        assert_eq!(parse_duration_ns("10us").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("10µs").unwrap(), 10_000);
        assert_eq!(parse_duration_ns("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration_ns("2s").unwrap(), 2_000_000_000);
        assert!(parse_duration_ns("fast").is_err());
        assert!(parse_duration_ns("3 weeks").is_err());
    }

    fn usage_error(args: &[&str]) -> String {
        let err = Cli::try_parse_from(["mmapsem-trace"].iter().chain(args)).unwrap_err();
        one_line(&err)
    }

    #[test]
    fn map_sizes_and_stack_bytes_are_range_checked() {
        for (flag, bad) in [
            ("--max-entries", "0"),
            ("--max-entries", "4294967295"),
            ("--max-stacks", "0"),
            ("--max-stacks", "2000000"),
            ("--user-stack-bytes", "0"),
            ("--user-stack-bytes", "1000000"),
        ] {
            let line = usage_error(&["-p", "1", flag, bad]);
            assert!(line.contains(flag), "names the flag: {line}");
            assert!(line.contains(" is not in 1..="), "gives the range: {line}");
        }
        assert_eq!(cli(&["--max-entries", "1048576"]).max_entries, 1 << 20);
        assert_eq!(
            cli(&["--user-stack-bytes", "65536"]).user_stack_bytes,
            65536
        );
    }

    #[test]
    fn absurd_durations_and_intervals_are_usage_errors() {
        for bad in ["NaN", "-1", "0", "inf", "1e20", "soon"] {
            let line = usage_error(&["-p", "1", "-d", bad]);
            assert!(line.contains("'--duration <SECS>'"), "{line}");
            assert!(line.contains("10 years"), "gives the range: {line}");
        }
        let line = usage_error(&["-p", "1", "-d=-1"]);
        assert!(line.contains("--duration"), "{line}");
        for bad in ["1e30", "inf", "NaN", "0.01"] {
            let line = usage_error(&["-p", "1", "-i", bad]);
            assert!(line.contains("'--interval <SECS>'"), "{line}");
        }
        assert_eq!(cli(&["-d", "0.5"]).duration, Some(0.5));
        assert_eq!(cli(&["-d", "315360000"]).duration, Some(MAX_SECONDS));
        assert_eq!(
            cli(&["-i", "315360000"]).interval,
            Some(Duration::from_secs(315_360_000))
        );
    }

    #[test]
    fn negative_or_zero_pids_are_named_not_taken_for_commands() {
        for bad in ["-1", "0", "1,-5"] {
            let line = usage_error(&["-p", bad]);
            assert!(line.contains("invalid value '"), "{line}");
            assert!(line.contains("for '--pid "), "{line}");
            assert!(line.contains("not a process id"), "{line}");
            assert!(!line.contains("'-- "), "no tip to run a command: {line}");
        }
    }

    #[test]
    fn usage_errors_point_to_help_once() {
        let line = usage_error(&["-p", "x"]);
        assert_eq!(line.matches("--help").count(), 1, "{line}");
        assert!(line.ends_with("(see --help)"), "{line}");
    }

    #[test]
    fn missing_target_names_every_kind() {
        let line = usage_error(&[]);
        for kind in ["--pid", "--all", "CMD"] {
            assert!(line.contains(kind), "{kind} missing from: {line}");
        }
    }

    #[test]
    fn dash_output_is_stdout() {
        assert_eq!(cli(&["-o", "-"]).output_file(), None);
        assert_eq!(
            cli(&["-o", "r.txt"]).output_file(),
            Some(Path::new("r.txt"))
        );
        // Interval reports already go to stdout: no second, whole-trace report there.
        let intervals = View::Intervals {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&["-i", "1", "-o", "-"]).final_report_wanted(&intervals));
        assert!(cli(&["-i", "1", "--format", "json", "-o", "-"])
            .view(false)
            .is_err());
    }

    #[test]
    fn repeated_pids_count_once() {
        assert_eq!(unique_pids(&[5, 3, 5, 3, 9]), vec![5, 3, 9]);
        assert!(unique_pids(&[]).is_empty());
    }

    #[test]
    fn parses_pid_lists() {
        let cli =
            Cli::try_parse_from(["mmapsem-trace", "-p", "1,2", "-d", "3", "--format", "json"])
                .unwrap();
        assert_eq!(cli.pid, vec![1, 2]);
        assert_eq!(cli.duration, Some(3.0));
        assert_eq!(cli.format, Some(Format::Json));
        assert!(
            Cli::try_parse_from(["mmapsem-trace"]).is_err(),
            "-p is required"
        );
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "x"]).is_err());
    }

    #[test]
    fn all_replaces_pids_and_commands() {
        let cli = Cli::try_parse_from(["mmapsem-trace", "-a", "-d", "3"]).unwrap();
        assert!(cli.all && cli.pid.is_empty() && cli.command.is_empty());
        assert!(Cli::try_parse_from(["mmapsem-trace", "--all"]).unwrap().all);
        assert!(Cli::try_parse_from(["mmapsem-trace", "-a", "-p", "1"]).is_err());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-a", "--", "true"]).is_err());
    }

    #[test]
    fn usage_errors_fit_on_one_line() {
        let err = Cli::try_parse_from(["mmapsem-trace", "-a", "-p", "1"]).unwrap_err();
        let line = one_line(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("'--all' cannot be used with"), "{line}");
        let err = Cli::try_parse_from(["mmapsem-trace"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--pid"), "names the missing argument: {line}");
        assert!(!line.contains("Usage"), "{line}");
    }

    #[test]
    fn a_command_after_double_dash_replaces_pids() {
        let cli =
            Cli::try_parse_from(["mmapsem-trace", "-d", "1", "--", "make", "-j", "8"]).unwrap();
        assert_eq!(cli.command, ["make", "-j", "8"]);
        assert!(cli.pid.is_empty());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "--", "true"]).is_err());
    }

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(["mmapsem-trace", "-p", "1"].iter().chain(args)).unwrap()
    }

    #[test]
    fn live_is_the_default_on_a_terminal_only() {
        let second = Duration::from_secs(1);
        assert_eq!(
            cli(&[]).view(true).unwrap(),
            View::Live { interval: second }
        );
        assert_eq!(cli(&[]).view(false).unwrap(), View::Final);
        assert_eq!(cli(&["--format", "json"]).view(true).unwrap(), View::Final);
        assert_eq!(cli(&["-o", "r.txt"]).view(true).unwrap(), View::Final);
        assert_eq!(cli(&["--no-live"]).view(true).unwrap(), View::Final);
        assert_eq!(
            cli(&["--live", "--format", "csv", "-i", "2"])
                .view(true)
                .unwrap(),
            View::Live {
                interval: Duration::from_secs(2)
            }
        );
        assert!(cli(&["--live"]).view(false).is_err(), "no terminal");
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "--live", "--no-live"]).is_err());
        // Exports alone keep the live view.
        assert!(matches!(
            cli(&["--svg", "x.svg"]).view(true).unwrap(),
            View::Live { .. }
        ));
    }

    #[test]
    fn intervals_without_a_terminal() {
        let view = cli(&["-i", "0.5"]).view(false).unwrap();
        assert_eq!(
            view,
            View::Intervals {
                interval: Duration::from_millis(500)
            }
        );
        assert_eq!(
            cli(&["-i", "2", "--no-live"]).view(true).unwrap(),
            View::Intervals {
                interval: Duration::from_secs(2)
            }
        );
        assert!(cli(&["-i", "1", "--format", "json"]).view(false).is_err());
        assert!(cli(&["-i", "1", "--format", "json", "-o", "r.json"])
            .view(false)
            .is_ok());
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "1", "-i", "0"]).is_err());
    }

    #[test]
    fn final_report_after_live_only_when_asked() {
        let live = View::Live {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&[]).final_report_wanted(&live));
        assert!(cli(&["-o", "r.txt", "--live"]).final_report_wanted(&live));
        assert!(cli(&[]).final_report_wanted(&View::Final));
        let intervals = View::Intervals {
            interval: DEFAULT_INTERVAL,
        };
        assert!(!cli(&["-i", "1"]).final_report_wanted(&intervals));
        assert!(cli(&["-i", "1", "-o", "r.txt"]).final_report_wanted(&intervals));
    }

    #[test]
    fn export_flags() {
        let c = cli(&[
            "--folded",
            "f.txt",
            "--svg",
            "f.svg",
            "--weight",
            "hold",
            "--timeline",
            "t.json",
            "--threshold",
            "500us",
        ]);
        assert_eq!(c.weight, WeightArg::Hold);
        assert_eq!(c.threshold, 500_000);
        assert_eq!(c.timeline.as_deref(), Some(std::path::Path::new("t.json")));
        assert_eq!(cli(&[]).threshold, 1_000_000);
        assert_eq!(cli(&[]).user_stack, UserStackArg::Dwarf);
        assert_eq!(cli(&["--user-stack", "fp"]).user_stack, UserStackArg::Fp);
        assert_eq!(cli(&["--no-user-stacks"]).user_stack(), UserStackArg::None);
    }
}
