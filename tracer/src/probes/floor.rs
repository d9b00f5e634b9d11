//! `--bench-floor`: the empty programs `cargo xtask bench` measures the tracer against, as
//! classic tracepoints or as BTF tracepoints. Loads and attaches only the three of one kind,
//! then waits for the targets to exit (or SIGINT, SIGTERM, SIGHUP); reads no map and writes no
//! report.

use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use aya::{
    programs::{BtfTracePoint, TracePoint},
    Btf, Ebpf, EbpfLoader,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::BenchFloor;
use crate::system::procfs;
use crate::system::tracefs::{Needed, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START};

const EVENTS: [Needed; 3] = [MMAP_LOCK_START, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED];

/// How often the targets' liveness is checked, as the trace's collect loop does.
const TICK: Duration = Duration::from_millis(100);

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

/// The floor program of `kind` for `event`: `floor_btf_start_locking` for
/// `mmap_lock_start_locking`.
fn program_name(kind: BenchFloor, event: &Needed) -> String {
    let short = event.name.strip_prefix("mmap_lock_").unwrap_or(event.name);
    format!("floor_{}_{short}", kind_name(kind))
}

/// Loads the object (its maps are created, but no other program is loaded) and attaches the
/// three programs of `kind`, all verified before any is attached.
fn attach(kind: BenchFloor) -> Result<Ebpf> {
    super::raise_memlock_limit();
    let mut ebpf = EbpfLoader::new()
        .load(super::EBPF_OBJECT)
        .map_err(|e| super::explain_permission(anyhow!(e), "loading the eBPF object"))?;
    match kind {
        BenchFloor::Classic => attach_classic(&mut ebpf)?,
        BenchFloor::Btf => attach_btf(&mut ebpf)?,
    }
    Ok(ebpf)
}

fn attach_classic(ebpf: &mut Ebpf) -> Result<()> {
    for event in &EVENTS {
        classic_program(ebpf, event)?.load().map_err(|e| {
            super::explain_permission(anyhow!(e), &format!("loading {}", event.name))
        })?;
    }
    for event in &EVENTS {
        classic_program(ebpf, event)?
            .attach(event.category, event.name)
            .map_err(|e| {
                super::explain_permission(anyhow!(e), &format!("attaching {}", event.name))
            })?;
    }
    Ok(())
}

fn attach_btf(ebpf: &mut Ebpf) -> Result<()> {
    let btf = Btf::from_sys_fs().context("reading the kernel's BTF")?;
    for event in &EVENTS {
        btf_program(ebpf, event)?
            .load(event.name, &btf)
            .map_err(|e| {
                super::explain_permission(anyhow!(e), &format!("loading tp_btf/{}", event.name))
            })?;
    }
    for event in &EVENTS {
        btf_program(ebpf, event)?.attach().map_err(|e| {
            super::explain_permission(anyhow!(e), &format!("attaching tp_btf/{}", event.name))
        })?;
    }
    Ok(())
}

fn classic_program<'a>(ebpf: &'a mut Ebpf, event: &Needed) -> Result<&'a mut TracePoint> {
    let name = program_name(BenchFloor::Classic, event);
    Ok(ebpf
        .program_mut(&name)
        .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?
        .try_into()?)
}

fn btf_program<'a>(ebpf: &'a mut Ebpf, event: &Needed) -> Result<&'a mut BtfTracePoint> {
    let name = program_name(BenchFloor::Btf, event);
    Ok(ebpf
        .program_mut(&name)
        .ok_or_else(|| anyhow!("eBPF object has no program {name}"))?
        .try_into()?)
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
        while pids.iter().any(|&pid| procfs::is_alive(pid)) {
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
