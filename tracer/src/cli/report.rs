//! The report and the views: its format, where it goes, what is shown while the trace runs,
//! the files written beside it; and the policy that picks the view.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::parse::{parse_directory, parse_duration_ns, parse_interval};
use super::{Cli, DEFAULT_INTERVAL};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
    /// One row per call stack, raw nanoseconds, with a header row.
    Csv,
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

/// The report: its format, where it goes, and the views shown while the trace runs.
#[derive(Debug, Args)]
#[command(next_help_heading = "Report")]
pub struct ReportArgs {
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

    /// Keep each outside locker's process apart (by default the processes of one name that
    /// lock the targets' mm, a /proc reader loop's thousands of `cat`s, are one row with their
    /// count), and with -a the short-lived processes that are gone (by default folded by name).
    #[arg(long)]
    pub per_pid: bool,

    /// Also look for the debug files of stripped objects in DIR, before /usr/lib/debug
    /// (repeatable): by build id (`DIR/.build-id/xx/rest.debug`), else by the object's debug
    /// link name (`DIR/NAME`, `DIR/<object's directory>/NAME`). Frames still unnamed stay
    /// `object+0xOFFSET`.
    #[arg(long, value_name = "DIR", value_parser = parse_directory)]
    pub debug_dir: Vec<PathBuf>,

    /// Call-stack blocks shown in the text report.
    #[arg(short = 'n', long, default_value_t = 10, value_name = "N")]
    pub top: usize,
}

/// Files written beside the report: flamegraph stacks, pprof, the timeline.
#[derive(Debug, Args)]
#[command(next_help_heading = "Exports")]
pub struct ExportArgs {
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
}

impl Cli {
    /// Picks the view. The live view needs a terminal to draw on and read keys from
    /// (`terminal`, see `run::live_terminal`); it is the default there unless the user asked
    /// for a report format or file.
    pub fn view(&self, terminal: bool) -> Result<View> {
        if self.serve().is_some() {
            return Ok(View::Serve);
        }
        let interval = self.report.interval.unwrap_or(DEFAULT_INTERVAL);
        if self.report.live {
            if !terminal {
                bail!(
                    "--live needs a terminal on stdout, and on stdin or /dev/tty for its keys \
                     (use -i SECS for reports in a pipe)"
                );
            }
            return Ok(View::Live { interval });
        }
        let asked_for_report = self.report.format.is_some() || self.report.output.is_some();
        if terminal && !self.report.no_live && !asked_for_report {
            return Ok(View::Live { interval });
        }
        match self.report.interval {
            Some(interval) => {
                if self.output_file().is_none()
                    && self.report.format.is_some_and(|f| f != Format::Text)
                {
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
            View::Live { .. } => self.report.format.is_some() || self.report.output.is_some(),
            View::Serve => false,
        }
    }
}
