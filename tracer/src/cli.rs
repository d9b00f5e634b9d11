//! Command-line interface.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
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
        required = true,
        value_name = "PID[,PID...]"
    )]
    pub pid: Vec<u32>,

    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM or the target exits).
    #[arg(short, long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Report format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Write the report to this file instead of stdout (replaced atomically).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Call-stack blocks shown in the text report.
    #[arg(short = 'n', long, default_value_t = 10, value_name = "N")]
    pub top: usize,

    /// Take stacks for waits and holds at least this long (e.g. 0, 500ns, 10us, 1ms). Shorter
    /// ones are counted and timed but grouped without a stack; 0 stacks everything.
    #[arg(long, default_value = "10us", value_parser = parse_duration_ns, value_name = "DURATION")]
    pub stack_threshold: u64,

    /// Aggregate per thread as well as per stack.
    #[arg(long)]
    pub per_thread: bool,

    /// Kernel stacks only.
    #[arg(long)]
    pub no_user_stacks: bool,

    /// Capacity of the in-kernel aggregation map (entries beyond it are counted as lost).
    #[arg(long, default_value_t = 10240, value_name = "N")]
    pub max_entries: u32,

    /// Capacity of the in-kernel stack map.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub max_stacks: u32,

    /// More logging on stderr (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
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
    fn parses_pid_lists() {
        let cli =
            Cli::try_parse_from(["mmapsem-trace", "-p", "1,2", "-d", "3", "--format", "json"])
                .unwrap();
        assert_eq!(cli.pid, vec![1, 2]);
        assert_eq!(cli.duration, Some(3.0));
        assert_eq!(cli.format, Format::Json);
        assert!(
            Cli::try_parse_from(["mmapsem-trace"]).is_err(),
            "-p is required"
        );
        assert!(Cli::try_parse_from(["mmapsem-trace", "-p", "x"]).is_err());
    }
}
