//! One trace from start to report: checks, load, wait for the end, harvest, report.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::{Cli, Format};
use crate::model::{build_report, TraceMeta};
use crate::output::Destination;
use crate::present;
use crate::probes::{ProbeSettings, Probes};
use crate::symbolize::symbolize;
use crate::system::{
    btf::KernelOffsets,
    privilege::check_tracing_privilege,
    procfs::{self, MappingHistory},
    tracefs::{Tracefs, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START},
};

/// How often liveness and thread counts are sampled.
const TICK: Duration = Duration::from_millis(100);
/// How often executable mappings are re-read (reading /proc/PID/maps takes the target's lock).
const MAPPINGS_EVERY: Duration = Duration::from_secs(1);

pub fn run(cli: Cli) -> Result<()> {
    init_logging(cli.verbose);
    for &pid in &cli.pid {
        procfs::require_process(pid)?;
    }
    let destination = match &cli.output {
        Some(path) => Destination::File(path.clone()),
        None => Destination::Stdout,
    };
    destination.check_writable()?;
    check_tracing_privilege()?;
    let tracefs = Tracefs::locate()?;
    for tp in [MMAP_LOCK_START, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED] {
        tracefs.require(&tp)?;
    }
    let offsets = KernelOffsets::from_running_kernel()?;
    let settings = ProbeSettings {
        stack_threshold_ns: cli.stack_threshold,
        per_thread: cli.per_thread,
        user_stacks: !cli.no_user_stacks,
        max_entries: cli.max_entries,
        max_stacks: cli.max_stacks,
    };
    let mut probes = Probes::load(&settings, &tracefs, &offsets)?;
    for &pid in &cli.pid {
        probes.add_target(pid)?;
        if !probes.discover_mm(pid)? {
            log::debug!("mm of pid {pid} not discovered yet; its first lock will register it");
        }
    }
    probes.set_armed(true)?;

    let comm = cli
        .pid
        .iter()
        .filter_map(|&pid| procfs::comm(pid))
        .collect::<Vec<_>>()
        .join(",");
    eprintln!(
        "mmapsem-trace: attached to mmap_lock tracepoints; tracing pid {} ({comm}); Ctrl-C to stop",
        cli.pid
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .context("starting the event loop")?;
    let watch = runtime.block_on(watch_until_done(&cli.pid, cli.duration))?;

    let phase = Instant::now();
    let harvest = probes.harvest()?;
    log::info!(
        "harvested {} entries in {:?}",
        harvest.entries.len(),
        phase.elapsed()
    );
    let phase = Instant::now();
    let symbols = symbolize(&harvest, &watch.mappings);
    log::info!(
        "symbolized {} stacks in {:?}",
        symbols.len(),
        phase.elapsed()
    );
    let meta = TraceMeta {
        pids: cli.pid.clone(),
        comm,
        max_threads: watch.max_threads,
        duration_ns: watch.elapsed.as_nanos() as u64,
        thread_time_ns: watch.thread_time_ns,
        exited: watch.exited,
        stack_threshold_ns: cli.stack_threshold,
    };
    let report = build_report(&harvest, &symbols, &meta);
    let rendered = match cli.format {
        Format::Text => present::text::render(&report, cli.top),
        Format::Json => present::json::render(&report)?,
    };
    destination.write(&rendered)?;
    if watch.exited {
        eprintln!("mmapsem-trace: target exited; the report covers the trace until then");
    }
    if let Destination::File(path) = &destination {
        eprintln!("mmapsem-trace: report written to {}", path.display());
    }
    Ok(())
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .parse_default_env()
        .try_init();
}

/// What was learned about the targets while the programs ran.
struct Watch {
    elapsed: Duration,
    exited: bool,
    max_threads: usize,
    thread_time_ns: u64,
    mappings: HashMap<u32, MappingHistory>,
}

/// Waits for the end of the trace (duration, Ctrl-C, SIGTERM, SIGHUP, or every target gone)
/// while sampling thread counts and executable mappings.
async fn watch_until_done(pids: &[u32], duration: Option<f64>) -> Result<Watch> {
    let start = Instant::now();
    let deadline = duration.map(|secs| start + Duration::from_secs_f64(secs.max(0.0)));
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut tick = tokio::time::interval(TICK);
    let mut watch = Watch {
        elapsed: Duration::ZERO,
        exited: false,
        max_threads: 0,
        thread_time_ns: 0,
        mappings: HashMap::new(),
    };
    let mut last_sample = Instant::now();
    let mut last_mappings: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let threads: usize = pids.iter().map(|&p| procfs::thread_count(p)).sum();
        watch.max_threads = watch.max_threads.max(threads);
        watch.thread_time_ns += threads as u64 * now.duration_since(last_sample).as_nanos() as u64;
        last_sample = now;
        if last_mappings.is_none_or(|t| now.duration_since(t) >= MAPPINGS_EVERY) {
            for &pid in pids {
                watch.mappings.entry(pid).or_default().refresh(pid);
            }
            last_mappings = Some(now);
        }
        if !pids.iter().any(|&p| procfs::is_alive(p)) {
            watch.exited = true;
            break;
        }
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => break,
        }
    }
    watch.elapsed = start.elapsed();
    Ok(watch)
}
