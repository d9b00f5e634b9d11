//! mmapsem-workload: reproduces mmap_lock contention on demand for mmapsem-trace.
//!
//! Output protocol on stdout, one line each, flushed at once:
//! `ready pid=<pid>` first thing, `started` when the work begins, then the mode's lines.
//! (`filemap` alone prints one line in between: the mapping another process is to read.)

mod churn;
mod cli;
mod fileio;
mod files;
mod hold;
mod hostile;
mod idle;
mod memory;
mod remote;
mod spawn;
mod start;
mod stop;
mod threads;
mod vma;

use std::fmt;
use std::io::{self, Write};
use std::process;

use anyhow::{Context, Result};
use clap::Parser;

use cli::{Cli, Mode};
use start::{Sigusr1Gate, Start};

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Before anything else, and above all before any thread exists (see Sigusr1Gate).
    let gate = cli.wait_signal.then(Sigusr1Gate::install).transpose()?;
    if cli.until_stdin_closes {
        stop::watch_stdin()?;
    }

    let mut out = io::stdout().lock();
    emit(&mut out, format_args!("ready pid={}", process::id()))?;
    let start = Start {
        gate,
        delay: cli.start_delay,
    };
    let out = &mut out;
    match &cli.mode {
        Mode::Churn(args) => start.begin(out).and_then(|()| churn::run(args, out)),
        Mode::Hold(args) => start.begin(out).and_then(|()| hold::run(args, out)),
        Mode::Idle(args) => start.begin(out).and_then(|()| idle::run(args, out)),
        Mode::Spawn(args) => start.begin(out).and_then(|()| spawn::run(args, out)),
        Mode::VmaLock(args) => start.begin(out).and_then(|()| vma::run(args, out)),
        // Creates its files before `started`: writing thousands of them is not the work.
        Mode::Files(args) => files::run(args, start, out),
        // Sets its file up before `started`: the caller needs the mapping's address to aim an
        // outside reader at it while the process still waits at the gates.
        Mode::Filemap(args) => remote::run_filemap(args, start, out),
        Mode::ProcMemRead(args) => start
            .begin(out)
            .and_then(|()| remote::run_proc_mem_read(args, out)),
        // Abuses its files before `started`: the tracer meets them already abused.
        Mode::Hostile(args) => hostile::run(args, start, out),
    }
}

/// Writes one protocol line and flushes it: tests read these lines from a pipe while we run.
fn emit(out: &mut dyn Write, line: fmt::Arguments<'_>) -> Result<()> {
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

/// Helpers for tests that read the protocol lines back.
#[cfg(test)]
mod protocol {
    /// The lines a mode wrote into a buffer.
    pub fn lines(output: &[u8]) -> Vec<String> {
        String::from_utf8(output.to_vec())
            .expect("output is UTF-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The value of `key=<u64>` in a line of space-separated `key=value` fields.
    pub fn field(line: &str, key: &str) -> u64 {
        line.split(' ')
            .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no `{key}=` in `{line}`"))
            .parse()
            .unwrap_or_else(|error| panic!("`{key}` in `{line}`: {error}"))
    }
}
