//! mmapsem-trace: measures how long each thread of a process waited for and held its mmap_lock,
//! per call stack, with eBPF programs on the mmap_lock tracepoints.
//!
//! Data flows one way: `probes` (the only aya user) loads the programs and harvests their maps;
//! `symbolize` resolves stacks; `model` turns both into a `Report`; `present` renders it, and
//! `live` (the only ratatui user) shows running snapshots that `collect` hands it.

pub mod cli;
pub mod collect;
pub mod exports;
pub mod intervals;
pub mod launch;
#[cfg(test)]
mod layering;
pub mod live;
pub mod model;
pub mod output;
pub mod present;
pub mod probes;
pub mod run;
pub mod serve;
pub mod symbolize;
pub mod system;
pub mod text;
pub mod units;
pub mod unwind;
