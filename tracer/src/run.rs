//! One trace from start to report: checks, load, show it while it runs (live view, interval
//! reports, or nothing), then harvest and write the report and exports, whatever ended it.

use std::io::IsTerminal as _;

use anyhow::{Context as _, Result};

use crate::cli::{Cli, SelfCostArg, UserStackArg, View};
use crate::collect::{
    FinalTrace, Forgetting, NoSink, Session, SessionSettings, Sink, Stops, Targets,
};
use crate::exports::{Outputs, TimelineData};
use crate::intervals::IntervalPrinter;
use crate::launch::{Identity, Launched};
use crate::live;
use crate::model::timeline;
use crate::probes::{ProbeSettings, Probes, SelfCostMode, StackCopySettings};
use crate::system::{
    btf::KernelOffsets,
    priority,
    privilege::check_tracing_privilege,
    procfs,
    tracefs::{Tracefs, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED, MMAP_LOCK_START},
};

/// Whether the live view can run here: it draws on stdout and reads its keys from stdin, or
/// from /dev/tty when stdin is not a terminal (as crossterm does). A serial console or a
/// service's TTYPath gives a terminal stdout with no controlling terminal: /dev/tty then fails
/// (ENXIO), and the view would fail only once the programs are attached.
fn live_terminal() -> bool {
    std::io::stdout().is_terminal()
        && (std::io::stdin().is_terminal()
            || std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/tty")
                .is_ok())
}

/// Runs one trace; returns the exit status: 0, or a launched command's own.
pub fn run(cli: Cli) -> Result<i32> {
    if let Some(crate::cli::Action::Generate { what }) = cli.action {
        crate::cli::generate(what, &mut std::io::stdout().lock())?;
        return Ok(0);
    }
    let mut cli = cli.with_serve_settings();
    init_logging(cli.verbose);
    if let Some(floor) = cli.testing.bench_floor {
        return crate::probes::floor::run(floor, &cli.target.pid);
    }
    let view = cli.view(live_terminal())?;
    // Before anything that may start threads: the child is forked from this process.
    let mut launched = launch_held(&mut cli, &view)?;
    // Signals are caught from here on: one that arrives while the programs load ends the
    // trace at its start, with a report, rather than killing the tracer.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .context("starting the event loop")?;
    let mut stops = {
        let _entered = runtime.enter();
        Stops::install()?
    };
    let targets = checked_targets(&mut cli)?;
    let cgroups = given_cgroups(&cli.target.cgroups)?;
    let outputs = Outputs::from_cli(&cli, &view);
    outputs.check_writable()?;
    let (tracefs, offsets) = check_kernel()?;
    // Before the programs load: a port in use is one line, not a trace with nowhere to go.
    let endpoint = cli
        .serve()
        .map(|serve| crate::serve::Endpoint::bind(serve.listen))
        .transpose()?;
    let inherit = launched.is_some() && !cli.target.no_inherit;
    let settings = probe_settings(&cli, &view, &targets, &outputs, &offsets, inherit, cgroups);
    let (mut probes, origin_ns) = load_and_arm(&settings, &tracefs, &offsets, &cli.target.pid)?;
    let comm = target_comm(launched.as_ref(), &targets, &cli.target.pid);
    // Its faults from here on are the trace's: those of the exec and the command's start.
    let fault_baseline = launched.as_ref().and_then(|l| {
        crate::system::procfs::faults_taken(l.pid, inherit).map(|faults| (l.pid, faults))
    });
    // Released before saying it is traced: a command that cannot run gets one error line.
    if let Some(launched) = launched.as_mut() {
        launched.release()?;
    }
    announce(&view, &targets, &comm, endpoint.as_ref());

    let mut session = Session::new(SessionSettings {
        targets: targets.clone(),
        comm,
        stack_threshold_ns: cli.stack_threshold(),
        fault_baseline,
        collected_per_thread: settings.per_thread,
        report_per_thread: cli.collect.per_thread,
        per_pid: cli.report.per_pid,
        debug_dirs: cli.report.debug_dir.clone(),
        forgetting: match view {
            View::Serve => Forgetting::Entirely,
            _ if targets.is_system_wide() => Forgetting::KeepingWhatTheyDid,
            _ => Forgetting::Never,
        },
    });
    let mut trace_with = |sink: &mut dyn Sink, probes: &mut Probes| {
        runtime.block_on(session.run(cli.target.duration, probes, sink, &mut stops))
    };
    let ending = match view {
        View::Final => trace_with(&mut NoSink, &mut probes),
        View::Intervals { interval } => {
            let mut printer = IntervalPrinter::new(
                interval,
                cli.report.reset,
                cli.collect.per_thread,
                cli.report.top,
            );
            trace_with(&mut printer, &mut probes)
        }
        View::Live { interval } => {
            let mut view = live::LiveView::start(interval, cli.collect.per_thread)?;
            let ending = trace_with(&mut view, &mut probes);
            // The terminal is restored before anything else is printed, even on an error.
            view.finish();
            print_command_output(launched.as_ref());
            ending
        }
        View::Serve => {
            let endpoint = endpoint.context("serve without an endpoint")?;
            let serve = cli.serve().context("serve without its arguments")?;
            let mut server = crate::serve::Server::new(endpoint, serve);
            trace_with(&mut server, &mut probes)
        }
    };
    let ended_by_signal = signal_named(ending.by);
    exit_on_second_signal(runtime, stops, ended_by_signal.is_some());
    if ending.exited {
        eprintln!("mmapsem-trace: target exited; the report covers the trace until then");
    }
    let finished = session
        .finish(&mut probes)
        .and_then(|trace| write_outputs(&cli, &outputs, trace, origin_ns));
    // Detaches the programs.
    drop(probes);
    let status = match launched {
        None => 0,
        Some(launched) => wait_for_command(launched, ending.by)?,
    };
    match ending.failure {
        Some(err) => {
            Err(err
                .context("the trace ended early, its outputs written with what it had collected"))
        }
        None => finished.map(|()| status),
    }
}

/// What tracing needs of the kernel: the privilege, tracefs with the mmap_lock events, and
/// the struct offsets from its BTF; each missing one is a one-line error naming it.
fn check_kernel() -> Result<(Tracefs, KernelOffsets)> {
    check_tracing_privilege()?;
    let tracefs = Tracefs::locate()?;
    for tp in [MMAP_LOCK_START, MMAP_LOCK_ACQUIRED, MMAP_LOCK_RELEASED] {
        tracefs.require(&tp)?;
    }
    Ok((tracefs, KernelOffsets::from_running_kernel()?))
}

/// A launched command is waited for whatever happened to the trace: given the signal that
/// ended it, or, when the trace ended first (q, -d, an error), stopped. Returns the tracer's
/// exit status: the command's own, or 0 when the trace's end stopped it (the trace did what
/// was asked: a script running `mmapsem-trace -d 10 -- CMD` must not see a failure).
fn wait_for_command(launched: Launched, ended_by: &str) -> Result<i32> {
    match signal_named(ended_by) {
        Some(signal) => {
            launched.forward(signal);
            launched.wait()
        }
        None if command_outlived_the_trace(ended_by) => {
            let pid = launched.pid;
            let status = launched.stop(STOP_GRACE)?;
            if status.is_none() {
                eprintln!(
                    "mmapsem-trace: stopped the command (pid {pid}), still running when the \
                     trace ended ({ended_by})"
                );
            }
            Ok(status.unwrap_or(0))
        }
        None => launched.wait(),
    }
}

/// The command of `-- CMD`, forked and held before its execve until the programs are
/// attached; its pid becomes the target.
fn launch_held(cli: &mut Cli, view: &View) -> Result<Option<Launched>> {
    if cli.target.command.is_empty() {
        return Ok(None);
    }
    let identity = cli.target.user.as_deref().map(Identity::of).transpose()?;
    let live = matches!(*view, View::Live { .. });
    let launched = Launched::spawn_held(&cli.target.command, identity.as_ref(), live)?;
    cli.target.pid = vec![launched.pid];
    Ok(Some(launched))
}

/// The targets, each given pid once and checked to be a process.
fn checked_targets(cli: &mut Cli) -> Result<Targets> {
    cli.target.pid = crate::cli::unique_pids(&cli.target.pid);
    for &pid in &cli.target.pid {
        procfs::require_process(pid)?;
    }
    Ok(if cli.target.all {
        Targets::SystemWide
    } else {
        Targets::Pids(cli.target.pid.clone())
    })
}

/// `--cgroup`'s cgroups as directories of the unified hierarchy, each checked to exist.
fn given_cgroups(given: &[String]) -> Result<Vec<std::path::PathBuf>> {
    if given.is_empty() {
        return Ok(Vec::new());
    }
    let mount = crate::system::cgroups::unified_mount().context(
        "--cgroup needs cgroup v2: no cgroup2 filesystem is mounted (see /proc/self/mountinfo)",
    )?;
    given
        .iter()
        .map(|path| crate::system::cgroups::resolve_given(path, &mount))
        .collect()
}

/// What the programs are loaded with, from the command line and the view.
fn probe_settings(
    cli: &Cli,
    view: &View,
    targets: &Targets,
    outputs: &Outputs,
    offsets: &KernelOffsets,
    inherit: bool,
    cgroups: Vec<std::path::PathBuf>,
) -> ProbeSettings {
    // The live view can switch to per-thread rows at any time: collect per thread and merge
    // threads in user space when they are not wanted. So do copied user stacks: threads that
    // share a frame-pointer stack (one frame, in code without frame pointers) unwind apart, and
    // the operations left uncopied must go to their own thread's unwound stacks, not to another
    // thread's (model/unwound.rs).
    let stack_copies = stack_copies(cli, offsets);
    let per_thread =
        cli.collect.per_thread || matches!(*view, View::Live { .. }) || stack_copies.is_some();
    ProbeSettings {
        stack_threshold_ns: cli.stack_threshold(),
        attribution: !cli.collect.lean,
        syscall_times: cli.collect.syscall_times,
        per_thread,
        per_thread_required: cli.collect.per_thread,
        user_stacks: cli.user_stack() != UserStackArg::None,
        max_entries: cli.maps.max_entries,
        max_stacks: cli.maps.max_stacks,
        ring_bytes: cli.maps.ring_bytes,
        thread_entries: cli.maps.thread_entries,
        // Never 0 when asked for: 0 means off.
        timeline_threshold_ns: if outputs.wants_timeline() {
            cli.exports.threshold.max(1)
        } else {
            0
        },
        stack_copies,
        system_wide: targets.is_system_wide(),
        classic_tracepoints: cli.testing.classic_tracepoints,
        target_slots: !targets.is_system_wide()
            && cli.target.pid.len() <= tracer_common::FAST_TARGETS,
        inherit,
        cgroups,
        self_cost: match cli.collect.self_cost {
            SelfCostArg::Sampled => SelfCostMode::Sampled,
            SelfCostArg::Full => SelfCostMode::Full,
            SelfCostArg::Off => SelfCostMode::Off,
        },
        target_threads: if targets.is_system_wide() {
            procfs::machine_threads()
        } else {
            cli.target
                .pid
                .iter()
                .map(|&pid| procfs::thread_count(pid))
                .sum()
        },
    }
}

/// Loads the programs (at real-time priority: the verifier must not starve behind a busy
/// target), registers the targets and arms the programs; returns them with the trace's start
/// on CLOCK_MONOTONIC.
fn load_and_arm(
    settings: &ProbeSettings,
    tracefs: &Tracefs,
    offsets: &KernelOffsets,
    pids: &[u32],
) -> Result<(Probes, u64)> {
    priority::raise_nice();
    let setup = priority::RealTime::enter();
    let mut probes = Probes::load(settings, tracefs, offsets)?;
    drop(setup);
    probes.log_map_memory();
    for &pid in pids {
        probes.add_target(pid)?;
    }
    let origin_ns = procfs::monotonic_ns();
    probes.set_trace_start(origin_ns)?;
    probes.set_armed(true)?;
    probes.start_self_cost();
    // Armed: discovering an idle target's mm locks it from this process, which the report
    // shows like the tracer's later /proc reads (an outside locker's disturbance is the
    // target's, whoever caused it).
    for &pid in pids {
        if !probes.discover_mm(pid)? {
            log::debug!("mm of pid {pid} not discovered yet; its first lock will register it");
        }
    }
    Ok((probes, origin_ns))
}

/// What the report calls the target: the command, the processes' names, or all processes.
fn target_comm(launched: Option<&Launched>, targets: &Targets, pids: &[u32]) -> String {
    match launched {
        // Still the tracer's copy until it execs: name it after the command.
        Some(launched) => launched.comm(),
        None if targets.is_system_wide() => SYSTEM_WIDE_COMM.to_string(),
        None => pids
            .iter()
            .filter_map(|&pid| procfs::comm(pid))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Says on stderr what is traced and how to stop it (and where `serve` answers).
fn announce(view: &View, targets: &Targets, comm: &str, endpoint: Option<&crate::serve::Endpoint>) {
    let what = if targets.is_system_wide() {
        comm.to_string()
    } else {
        // The target names itself: escaped for the terminal; gone if it died while the
        // programs loaded (the report then says it exited).
        let shown = if comm.is_empty() {
            "exited".into()
        } else {
            crate::text::escaped(comm)
        };
        format!(
            "pid {} ({shown})",
            targets
                .listed()
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    eprintln!(
        "mmapsem-trace: attached to mmap_lock tracepoints; tracing {what}; {}",
        if matches!(*view, View::Live { .. }) {
            "q to stop"
        } else {
            "Ctrl-C to stop"
        }
    );
    if let Some(endpoint) = endpoint {
        eprintln!(
            "mmapsem-trace: serving http://{0}/metrics and http://{0}/debug/pprof/mmap_lock?seconds=N",
            endpoint.address
        );
    }
}

/// What a command run beside the live view wrote, kept out of the view's screen until now.
fn print_command_output(launched: Option<&Launched>) {
    let Some(output) = launched.and_then(|l| l.output.as_ref()) else {
        return;
    };
    let text = output.take();
    if text.is_empty() {
        return;
    }
    eprintln!("mmapsem-trace: the command's output while the live view ran:");
    let mut stderr = std::io::stderr().lock();
    let _ = std::io::Write::write_all(&mut stderr, &text);
}

/// How long a command still running when the trace ended gets to exit after SIGTERM.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// True when the trace ended before its launched command did, other than by a signal.
fn command_outlived_the_trace(ended_by: &str) -> bool {
    matches!(ended_by, "quit" | "duration reached" | "error")
}

/// After the trace, a second Ctrl-C (or SIGTERM, SIGHUP) ends the tracer at once, without
/// the outputs not written yet, as users of perf expect. When no signal ended the trace (a
/// duration, the target's exit), the first one only says that the outputs are being written:
/// it may have arrived just as the trace ended for another reason.
fn exit_on_second_signal(runtime: tokio::runtime::Runtime, mut stops: Stops, signalled: bool) {
    std::thread::spawn(move || {
        if !signalled {
            let signal = runtime.block_on(stops.next());
            eprintln!("mmapsem-trace: {signal}: writing the outputs; again to exit at once");
        }
        let signal = runtime.block_on(stops.next());
        eprintln!("mmapsem-trace: {signal} again: exiting without the outputs not written yet");
        std::process::exit(128 + signal_named(signal).unwrap_or(libc::SIGINT));
    });
}

/// The signal behind a `Watch::ended_by`, if a signal ended the trace.
fn signal_named(ended_by: &str) -> Option<i32> {
    match ended_by {
        "SIGINT" => Some(libc::SIGINT),
        "SIGTERM" => Some(libc::SIGTERM),
        "SIGHUP" => Some(libc::SIGHUP),
        _ => None,
    }
}

/// What `--user-stack dwarf` copies; frame pointers only, with a warning, when the kernel's
/// BTF lacks the offsets of the saved user registers.
fn stack_copies(cli: &Cli, offsets: &KernelOffsets) -> Option<StackCopySettings> {
    if cli.user_stack() != UserStackArg::Dwarf {
        return None;
    }
    if offsets.user_regs.is_none() {
        log::warn!(
            "kernel BTF lacks task_struct.stack or pt_regs: user stacks from frame pointers only"
        );
        return None;
    }
    Some(StackCopySettings {
        bytes: cli.collect.user_stack_bytes,
        threshold_ns: cli.exports.threshold,
        sample: cli.collect.user_stack_sample,
    })
}

/// Writes the report and every export of the trace that ended.
fn write_outputs(cli: &Cli, outputs: &Outputs, trace: FinalTrace, origin_ns: u64) -> Result<()> {
    let FinalTrace {
        report,
        symbols,
        timeline,
        processes,
        threads,
        timeline_dropped,
    } = trace;
    let timeline_data = TimelineData {
        slices: timeline::slices(&timeline, &symbols, origin_ns),
        processes,
        threads,
        threshold_ns: cli.exports.threshold,
        dropped: timeline_dropped,
    };
    if cfg!(debug_assertions) {
        // Debug builds (the integration tests' binaries) say when a figure is impossible.
        for broken in crate::model::invariants::check(&report) {
            log::warn!("report invariant broken: {broken}");
        }
    }
    if let Some(note) = crate::exports::lost_note(&report) {
        eprintln!("mmapsem-trace: {note}");
    }
    for path in outputs.write(&report, &timeline_data)? {
        eprintln!("mmapsem-trace: wrote {}", path.display());
    }
    Ok(())
}

/// What the report calls the target of a system-wide trace.
const SYSTEM_WIDE_COMM: &str = "all processes";

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

#[cfg(test)]
mod tests {
    use crate::collect::{report_between, Mark, Split};
    use crate::model::{report::tests::sample, Report};
    use crate::present::{self, folded::Weight};

    /// The outputs of one report as the golden files hold them: JSON, text, folded waits and
    /// holds.
    fn outputs(report: &Report) -> [(&'static str, String); 4] {
        [
            ("sample.json", present::json::render(report).unwrap()),
            ("sample.txt", present::text::render(report, 10)),
            (
                "sample.wait.folded",
                present::folded::render(report, Weight::Wait),
            ),
            (
                "sample.hold.folded",
                present::folded::render(report, Weight::Hold),
            ),
        ]
    }

    /// The report the trace ends with, from one harvest, through the function that builds
    /// every report (the final one is the window from the start to the last read): its JSON,
    /// text and folded outputs as the golden files in tracer/tests/golden/ hold them, written
    /// before the session took over the final report (`MMAPSEM_BLESS=1` rewrites them, for a
    /// change that means to alter the outputs).
    #[test]
    fn the_final_report_of_a_recorded_harvest_matches_the_golden_files() {
        let (harvest, symbols, meta) = sample();
        let last = Mark {
            harvest,
            thread_time_ns: meta.thread_time_ns,
            elapsed: std::time::Duration::from_nanos(meta.duration_ns),
        };
        let split = Split {
            per_thread: true,
            per_pid: false,
        };
        let report = report_between(&last, &Mark::default(), &symbols, &meta, split);
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let bless = std::env::var_os("MMAPSEM_BLESS").is_some();
        for (name, text) in outputs(&report) {
            let path = dir.join(name);
            if bless {
                std::fs::write(&path, &text).unwrap();
                continue;
            }
            let golden = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                text == golden,
                "{name} differs from {}:\n{text}",
                path.display()
            );
        }
    }
}
