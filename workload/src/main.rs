//! mmapsem-workload: reproduces mmap_lock contention on demand for mmapsem-trace.
//!
//! Output protocol on stdout, one line each, flushed at once:
//! `ready pid=<pid>` first thing, `started` when the work begins, then the mode's lines.

mod churn;
mod cli;
mod hold;
mod idle;
mod memory;
mod start;

use std::fmt;
use std::io::{self, Write};
use std::process;

use anyhow::{Context, Result};
use clap::Parser;

use cli::{Cli, Mode};
use start::Sigusr1Gate;

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Before anything else, and above all before any thread exists (see Sigusr1Gate).
    let gate = cli.wait_signal.then(Sigusr1Gate::install).transpose()?;

    let mut out = io::stdout().lock();
    emit(&mut out, format_args!("ready pid={}", process::id()))?;
    if let Some(gate) = gate {
        gate.wait()?;
    }
    start::delay(cli.start_delay);
    emit(&mut out, format_args!("started"))?;

    match &cli.mode {
        Mode::Churn(args) => churn::run(args, &mut out),
        Mode::Hold(args) => hold::run(args, &mut out),
        Mode::Idle(args) => idle::run(args, &mut out),
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
