//! `--bench-floor`: the empty programs `cargo xtask bench` measures the tracer against, as
//! classic tracepoints or as BTF tracepoints. Loads and attaches only the three of one kind,
//! then waits for the targets to exit (or SIGINT, SIGTERM, SIGHUP); reads no map and writes no
//! report.

use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use aya::{Ebpf, EbpfLoader};
use tokio::signal::unix::{signal, SignalKind};

use super::mmap_lock;
use crate::system::procfs;

/// The empty programs of `--bench-floor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchFloor {
    /// Classic tracepoints, as the tracer's own mmap_lock programs.
    Classic,
    /// BTF tracepoints (tp_btf).
    Btf,
}

/// How often the targets' liveness is checked, as the trace's collect loop does.
const TICK: Duration = Duration::from_millis(100);

/// The empty programs on the three mmap_lock events, in their order.
const FLOOR_BTF: [&str; 3] = [
    "floor_btf_start_locking",
    "floor_btf_acquire_returned",
    "floor_btf_released",
];
const FLOOR_CLASSIC: [&str; 3] = [
    "floor_classic_start_locking",
    "floor_classic_acquire_returned",
    "floor_classic_released",
];
/// Every floor program (the object-names test checks them against the object).
#[cfg(test)]
pub(super) const PROGRAMS: [&str; 6] = [
    FLOOR_BTF[0],
    FLOOR_BTF[1],
    FLOOR_BTF[2],
    FLOOR_CLASSIC[0],
    FLOOR_CLASSIC[1],
    FLOOR_CLASSIC[2],
];

/// Attaches the floor programs of `kind` and keeps them until every one of `pids` has exited
/// or a signal asks to stop. Returns the exit status: 0.
pub fn run(kind: BenchFloor, pids: &[u32]) -> Result<i32> {
    for &pid in pids {
        procfs::require_process(pid)?;
    }
    let _attached = attach(kind)?;
    let listed: Vec<String> = pids.iter().map(u32::to_string).collect();
    eprintln!(
        "mmapsem-trace: attached empty {} programs to the mmap_lock tracepoints (bench floor); \
         waiting for pid {} to exit",
        kind_name(kind),
        listed.join(",")
    );
    wait_for_targets(pids)?;
    Ok(0)
}

fn kind_name(kind: BenchFloor) -> &'static str {
    match kind {
        BenchFloor::Classic => "classic",
        BenchFloor::Btf => "btf",
    }
}

/// Loads the object (its maps are created, but no other program is loaded) and attaches the
/// three programs of `kind`, all verified before any is attached, as the tracer attaches its
/// own.
fn attach(kind: BenchFloor) -> Result<Ebpf> {
    super::raise_memlock_limit();
    let mut ebpf = EbpfLoader::new()
        .load(super::EBPF_OBJECT)
        .map_err(|e| super::explain_permission(anyhow!(e), "loading the eBPF object"))?;
    match kind {
        BenchFloor::Classic => {
            mmap_lock::attach_classic(&mut ebpf, &FLOOR_CLASSIC)?;
        }
        BenchFloor::Btf => {
            mmap_lock::load_btf(&mut ebpf, &FLOOR_BTF)?;
            mmap_lock::attach_btf(&mut ebpf, &FLOOR_BTF)?;
        }
    }
    Ok(ebpf)
}

/// Returns once no target is alive, or on SIGINT, SIGTERM or SIGHUP.
fn wait_for_targets(pids: &[u32]) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .context("starting the event loop")?;
    runtime.block_on(async {
        let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
        let mut tick = tokio::time::interval(TICK);
        while pids.iter().any(|&pid| !procfs::process_has_ended(pid)) {
            tokio::select! {
                _ = tick.tick() => {}
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
                _ = hangup.recv() => break,
            }
        }
        Ok(())
    })
}
