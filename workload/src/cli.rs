//! Command line: global start gating plus one subcommand per workload mode.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Reproduces mmap_lock contention on demand (the 2008 clamd problem: many threads mapping,
/// faulting and unmapping, where adding threads makes the whole process slower).
///
/// Prints `ready pid=<pid>` first, `started` when the work begins and a summary at the end.
#[derive(Debug, Parser)]
#[command(name = "mmapsem-workload", version)]
pub struct Cli {
    /// Seconds to sleep before the work starts (after SIGUSR1 when --wait-signal is also given).
    #[arg(
        long,
        global = true,
        display_order = 100,
        value_name = "SECS",
        default_value = "0",
        value_parser = parse_seconds
    )]
    pub start_delay: Duration,

    /// Stay idle until SIGUSR1 arrives, so a tracer can attach to the pid first.
    #[arg(long, global = true, display_order = 101)]
    pub wait_signal: bool,

    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, Subcommand)]
pub enum Mode {
    /// Worker threads that map, fault in and unmap regions in a loop.
    Churn(ChurnArgs),
    /// Hold mmap_lock for write for a known time with mprotect() over a large region.
    Hold(HoldArgs),
    /// Threads that only sleep, then exit.
    Idle(IdleArgs),
}

#[derive(Debug, Args)]
pub struct ChurnArgs {
    /// Number of worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: u32,

    /// Wall time to run for (ignored when --iterations is given).
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Iterations per worker thread; when given it wins over --seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,

    /// Size of each mapping, in bytes or with a binary suffix (64K, 4M, 1G).
    #[arg(long, value_name = "BYTES", default_value = "4M", value_parser = parse_size)]
    pub map_size: usize,

    /// What backs the mappings.
    #[arg(long, value_enum, default_value_t = Source::Anon)]
    pub source: Source,

    /// Add one thread that maps with MAP_POPULATE and unmaps large regions in a loop.
    #[arg(long)]
    pub writer: bool,

    /// Size of the writer thread's mappings (binary suffixes allowed).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse_size, requires = "writer")]
    pub writer_size: usize,
}

/// What backs the churn workers' mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// Private anonymous memory, written page by page.
    Anon,
    /// A private read-only mapping of a temporary file, read page by page.
    File,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Size of the region, in MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    pub size_mib: u64,

    /// Number of timed mprotect() calls.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,

    /// Sleep before each mprotect() call, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub gap_ms: u64,
}

#[derive(Debug, Args)]
pub struct IdleArgs {
    /// Wall time before exiting.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    pub seconds: Duration,

    /// Number of sleeping threads besides the main one.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
}

/// Parses a non-negative, finite number of seconds such as `5`, `0.25` or `1e-3`.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("`{text}` is not a finite, non-negative number of seconds"))
}

/// Parses a byte count: plain digits, or digits with a binary suffix K/M/G (1024-based; `KiB`,
/// `KB`, `k` all mean the same). Zero is refused: mmap() cannot map nothing.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number of bytes"));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(format!(
                "`{text}` has an unknown suffix `{suffix}` (use K, M or G)"
            ))
        }
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(1u64 << shift))
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err("the size must be at least one byte".to_owned());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mmapsem-workload").chain(args.iter().copied()))
    }

    #[test]
    fn sizes_accept_plain_bytes_and_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("4M"), Ok(4 * MIB));
        assert_eq!(parse_size("4MiB"), Ok(4 * MIB));
        assert_eq!(parse_size("4mb"), Ok(4 * MIB));
        assert_eq!(parse_size("1G"), Ok(1024 * MIB));
        assert_eq!(parse_size(" 2M "), Ok(2 * MIB));
    }

    #[test]
    fn sizes_refuse_zero_garbage_and_overflow() {
        assert!(parse_size("0").is_err());
        assert!(parse_size("0M").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("-4M").is_err());
        assert!(parse_size("4T").is_err());
        assert!(parse_size("4 M").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err());
    }

    #[test]
    fn seconds_accept_fractions_and_refuse_negative_or_infinite() {
        assert_eq!(parse_seconds("0"), Ok(Duration::ZERO));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn churn_defaults() {
        let cli = parse(&["churn"]).expect("churn parses");
        assert_eq!(cli.start_delay, Duration::ZERO);
        assert!(!cli.wait_signal);
        let Mode::Churn(args) = cli.mode else {
            panic!("expected churn, got {:?}", cli.mode);
        };
        assert_eq!(args.threads, 4);
        assert_eq!(args.seconds, Duration::from_secs(5));
        assert_eq!(args.iterations, None);
        assert_eq!(args.map_size, 4 * MIB);
        assert_eq!(args.source, Source::Anon);
        assert!(!args.writer);
        assert_eq!(args.writer_size, 64 * MIB);
    }

    #[test]
    fn churn_with_every_option() {
        let cli = parse(&[
            "--start-delay",
            "1.5",
            "--wait-signal",
            "churn",
            "--threads",
            "8",
            "--seconds",
            "2",
            "--iterations",
            "100",
            "--map-size",
            "64K",
            "--source",
            "file",
            "--writer",
            "--writer-size",
            "16M",
        ])
        .expect("all options parse");
        assert_eq!(cli.start_delay, Duration::from_millis(1500));
        assert!(cli.wait_signal);
        let Mode::Churn(args) = cli.mode else {
            panic!("expected churn, got {:?}", cli.mode);
        };
        assert_eq!(args.threads, 8);
        assert_eq!(args.seconds, Duration::from_secs(2));
        assert_eq!(args.iterations, Some(100));
        assert_eq!(args.map_size, 64 * 1024);
        assert_eq!(args.source, Source::File);
        assert!(args.writer);
        assert_eq!(args.writer_size, 16 * MIB);
    }

    #[test]
    fn global_options_may_follow_the_mode() {
        let cli = parse(&["idle", "--wait-signal", "--start-delay", "0.5"]).expect("parses");
        assert!(cli.wait_signal);
        assert_eq!(cli.start_delay, Duration::from_millis(500));
    }

    #[test]
    fn churn_refuses_bad_values() {
        assert!(parse(&["churn", "--threads", "0"]).is_err());
        assert!(parse(&["churn", "--iterations", "0"]).is_err());
        assert!(parse(&["churn", "--map-size", "0"]).is_err());
        assert!(parse(&["churn", "--map-size", "4X"]).is_err());
        assert!(parse(&["churn", "--source", "stdin"]).is_err());
        assert!(parse(&["churn", "--seconds", "-1"]).is_err());
        // A writer size without a writer is a mistake, not a silent no-op.
        assert!(parse(&["churn", "--writer-size", "1M"]).is_err());
        assert!(parse(&["--start-delay", "-0.1", "churn"]).is_err());
    }

    #[test]
    fn hold_defaults_and_options() {
        let Mode::Hold(args) = parse(&["hold"]).expect("parses").mode else {
            panic!("expected hold");
        };
        assert_eq!((args.size_mib, args.repeat, args.gap_ms), (512, 3, 50));

        let cli = parse(&["hold", "--size-mib", "8", "--repeat", "2", "--gap-ms", "0"]);
        let Mode::Hold(args) = cli.expect("parses").mode else {
            panic!("expected hold");
        };
        assert_eq!((args.size_mib, args.repeat, args.gap_ms), (8, 2, 0));

        assert!(parse(&["hold", "--size-mib", "0"]).is_err());
        assert!(parse(&["hold", "--repeat", "0"]).is_err());
    }

    #[test]
    fn idle_defaults_and_options() {
        let Mode::Idle(args) = parse(&["idle"]).expect("parses").mode else {
            panic!("expected idle");
        };
        assert_eq!((args.seconds, args.threads), (Duration::from_secs(10), 2));

        let cli = parse(&["idle", "--seconds", "0.1", "--threads", "0"]);
        let Mode::Idle(args) = cli.expect("parses").mode else {
            panic!("expected idle");
        };
        assert_eq!(
            (args.seconds, args.threads),
            (Duration::from_millis(100), 0)
        );
    }

    #[test]
    fn a_mode_is_required() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--wait-signal"]).is_err());
        assert!(parse(&["spin"]).is_err());
    }
}
