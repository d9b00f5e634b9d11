//! Command-line interface.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};

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

/// The empty programs of `--bench-floor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchFloor {
    /// Classic tracepoints, as the tracer's own mmap_lock programs.
    Classic,
    /// BTF tracepoints (tp_btf).
    Btf,
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
}

/// Who waits on a process's mmap_lock, for how long, and doing what: wait and hold time per call
/// stack, from the kernel's mmap_lock tracepoints.
#[derive(Debug, Parser)]
#[command(name = "mmapsem-trace", version, about)]
pub struct Cli {
    /// Process id(s) to trace, comma-separated.
    #[arg(
        short,
        long,
        value_delimiter = ',',
        required_unless_present_any = ["command", "all"],
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

    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or the targets exit).
    #[arg(short, long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Report format (default text). Giving one turns the live view off unless --live.
    #[arg(long, value_enum)]
    pub format: Option<Format>,

    /// Write the report to this file instead of stdout (replaced atomically).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Show the live view (the default when stdout is a terminal and neither --format nor -o
    /// is given).
    #[arg(long, conflicts_with = "no_live")]
    pub live: bool,

    /// Never show the live view.
    #[arg(long)]
    pub no_live: bool,

    /// Refresh the live view every SECS (default 1), or without it print a report every SECS.
    #[arg(short, long, value_name = "SECS", value_parser = parse_interval)]
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

    /// What flamegraph widths measure.
    #[arg(long, value_enum, default_value_t = WeightArg::Wait)]
    pub weight: WeightArg,

    /// Also write every wait and hold over --threshold as Chrome trace-event JSON (Perfetto,
    /// chrome://tracing) to FILE.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,

    /// Shortest wait or hold put on the --timeline; with --user-stack dwarf, also the shortest
    /// whose user stack is copied even when it was not expected to be long (e.g. 500us, 1ms).
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

    /// Bytes of user stack copied above the stack pointer for `--user-stack dwarf` (at most
    /// 64 KiB; deeper stacks are unwound as far as the window goes and marked truncated).
    #[arg(long, default_value = "16384", value_name = "BYTES")]
    pub user_stack_bytes: u32,

    /// One in N lock operations not expected to be long get stacks and a user stack copy too,
    /// so that the common short paths are named and unwound; 0: none.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub user_stack_sample: u32,

    /// Timing only, the cheapest mode: waits and holds per mode, with no stacks, causes, holder
    /// attribution, off-CPU split or fault and syscall programs (only the three mmap_lock
    /// tracepoints are attached).
    #[arg(long, conflicts_with_all = ["user_stack", "stack_threshold", "per_thread"])]
    pub lean: bool,

    /// Same as --user-stack none (kept for older scripts).
    #[arg(long, hide = true)]
    pub no_user_stacks: bool,

    /// Capacity of the in-kernel aggregation map (entries beyond it are counted as lost).
    #[arg(long, default_value_t = 10240, value_name = "N")]
    pub max_entries: u32,

    /// Capacity of the in-kernel stack map.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub max_stacks: u32,

    /// Size of the timeline and user-stack ring buffers (a power of two, at least 4096; tests
    /// use it to fill them).
    #[arg(long, hide = true, value_parser = parse_ring_bytes, value_name = "BYTES")]
    pub ring_bytes: Option<u32>,

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

/// Default refresh of the live view.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// `pids` without repetitions, in the order first given (`-p W,W` traces W once, and counts its
/// threads' time once).
pub fn unique_pids(pids: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    pids.iter().copied().filter(|p| seen.insert(*p)).collect()
}

impl Cli {
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

    /// Picks the view. The live view needs a terminal on stdout; it is the default there unless
    /// the user asked for a report format or file.
    pub fn view(&self, stdout_is_terminal: bool) -> Result<View> {
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL);
        if self.live {
            if !stdout_is_terminal {
                bail!("--live needs a terminal on stdout (use -i SECS for reports in a pipe)");
            }
            return Ok(View::Live { interval });
        }
        let asked_for_report = self.format.is_some() || self.output.is_some();
        if stdout_is_terminal && !self.no_live && !asked_for_report {
            return Ok(View::Live { interval });
        }
        match self.interval {
            Some(interval) => {
                if self.output.is_none() && self.format.is_some_and(|f| f != Format::Text) {
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
            View::Intervals { .. } => self.output.is_some(),
            View::Live { .. } => self.format.is_some() || self.output.is_some(),
        }
    }
}

/// A clap usage error on one line: its message and tips without the usage block, then a
/// pointer to --help.
pub fn one_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let message = text.split("\nUsage:").next().unwrap_or(&text);
    let parts: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let joined = parts.join(" ");
    let joined = joined.strip_prefix("error: ").unwrap_or(&joined);
    format!("{joined} (see --help)")
}

fn parse_interval(text: &str) -> Result<Duration> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("not a number of seconds: {text:?}"))?;
    if !(seconds >= 0.05 && seconds.is_finite()) {
        bail!("the interval must be at least 0.05 s, got {text:?}");
    }
    Ok(Duration::from_secs_f64(seconds))
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
