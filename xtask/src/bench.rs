//! `cargo xtask bench`: what tracing costs the traced process. Runs each workload untraced,
//! under two floors (empty programs on the three mmap_lock tracepoints, as classic and as BTF
//! tracepoints), traced by mmapsem-trace and traced by an equivalent bpftrace script
//! (bench/mmapsem.bt), alternating so that drifts of the machine (other builds, thermal) hit
//! them all alike, then prints medians as ratios to untraced and to the tp_btf floor,
//! per-program ns/event from the kernel's bpf_stats, the tracer's own CPU and memory, and its
//! lost-event counters, and records them in BENCHMARKS.md.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cmd::Cmd;
use crate::demo::{lines, spawn_held_workload, Guarded};
use crate::parse::{self, ProcStat};
use crate::paths;
use crate::setup;

/// Loading and attaching takes a few seconds (BTF parsing, verifier); a minute means stuck.
mod clamd;

const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// bpftrace symbolizes every user stack when it prints its maps.
const EXIT_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the tracer's CPU time and peak RSS are read from /proc.
const PROC_POLL: Duration = Duration::from_millis(200);
/// bpf_stats are read this long before the workload ends, while the programs are still
/// loaded (the tracer unloads them as soon as its target exits).
const STATS_MARGIN: Duration = Duration::from_millis(500);
/// bpf_stats are on for one window of each run, this long after the workload starts and this
/// long at most: counting adds two clock reads to every program run, 3-5% of small-files'
/// throughput, which the rest of the run is spared (the tracer samples its own self-cost).
const STATS_DELAY: Duration = Duration::from_secs(1);
const STATS_WINDOW: Duration = Duration::from_secs(1);
/// Where the daemon listens while it is measured (loopback; nothing scrapes it).
const SERVE_ADDRESS: &str = "127.0.0.1:19723";
const BEGIN_MARK: &str = "<!-- bench results: begin (written by cargo xtask bench) -->";
const END_MARK: &str = "<!-- bench results: end -->";

pub struct Options {
    pub reps: u32,
    pub seconds: u32,
    pub build: bool,
    pub record: bool,
    /// Run only the workloads whose name contains this.
    pub only: Option<String>,
    /// Run only the tools whose name contains one of these (comma-separated), beside the
    /// untraced run and the tp_btf floor.
    pub tools: Option<String>,
}

/// In the order of the rotation and of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    Untraced,
    /// Empty programs as BTF tracepoints: the least any tracer of these events can cost, and
    /// the reference every tracer is also given against.
    FloorBtf,
    /// Empty programs as classic tracepoints, the kind the tracer's programs are: the kernel
    /// formats a perf record on every hit before the program runs.
    FloorClassic,
    /// Defaults: user stacks unwound from copies (`--user-stack dwarf`).
    Mmapsem,
    /// Frame-pointer user stacks only: the difference to `Mmapsem` is what the copies cost.
    MmapsemFp,
    /// Timing only: the floor of the lock programs' cost.
    MmapsemLean,
    /// System-wide, timing only: every process's lock, as a fleet would run it.
    SystemLean,
    /// The daemon, system-wide, timing only.
    Serve,
    /// The daemon with causes and stacks.
    ServeStacks,
    /// The kernel's own tool on the same process (lock:contention_begin/end), the peer a
    /// user compares with; skipped where perf is not installed.
    PerfLock,
    Bpftrace,
}

impl Tool {
    const ALL: [Self; 11] = [
        Self::Untraced,
        Self::FloorBtf,
        Self::FloorClassic,
        Self::Mmapsem,
        Self::MmapsemFp,
        Self::MmapsemLean,
        Self::SystemLean,
        Self::Serve,
        Self::ServeStacks,
        Self::PerfLock,
        Self::Bpftrace,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Untraced => "untraced",
            Self::FloorBtf => "floor (tp_btf)",
            Self::FloorClassic => "floor (classic tracepoints)",
            Self::Mmapsem => "mmapsem-trace",
            Self::MmapsemFp => "mmapsem-trace --user-stack fp",
            Self::MmapsemLean => "mmapsem-trace --lean",
            Self::SystemLean => "mmapsem-trace -a --lean",
            Self::Serve => "mmapsem-trace serve",
            Self::ServeStacks => "mmapsem-trace serve --stacks",
            Self::PerfLock => "perf lock record -p",
            Self::Bpftrace => "bpftrace",
        }
    }

    /// Runs the mmapsem-trace binary, which must then exit successfully.
    fn runs_mmapsem_trace(self) -> bool {
        self.writes_report()
            || matches!(
                self,
                Self::FloorBtf | Self::FloorClassic | Self::Serve | Self::ServeStacks
            )
    }

    /// Writes a JSON report with lost-event counters and its own cost (the floors and the
    /// daemon write none).
    fn writes_report(self) -> bool {
        matches!(
            self,
            Self::Mmapsem | Self::MmapsemFp | Self::MmapsemLean | Self::SystemLean
        )
    }

    /// Runs until told to stop, rather than exiting with its target.
    fn stops_by_signal(self) -> bool {
        matches!(
            self,
            Self::SystemLean | Self::Serve | Self::ServeStacks | Self::PerfLock | Self::Bpftrace
        )
    }

    /// Whether this machine has what the tool needs.
    fn available(self) -> bool {
        self != Self::PerfLock || Cmd::new("perf").arg("--version").probe_ok().is_ok()
    }
}

/// A workload run and the summary line key that counts its work.
#[derive(Debug)]
struct Scenario {
    name: &'static str,
    args: Vec<String>,
    work_key: &'static str,
}

/// Every workload, the headline first: tens of thousands of small files mapped and unmapped
/// by 8 threads, the most lock events per second a realistic target makes.
fn scenarios(seconds: u32) -> Vec<Scenario> {
    let seconds = seconds.to_string();
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    vec![
        Scenario {
            name: "small-files",
            args: args(&[
                "files",
                "--method",
                "mmap",
                "--threads",
                "8",
                "--files",
                "20000",
                "--file-size",
                "1K-16K",
                "--seconds",
                &seconds,
            ]),
            work_key: "files_read",
        },
        Scenario {
            name: "files --method mmap --threads 8",
            args: args(&[
                "files",
                "--method",
                "mmap",
                "--threads",
                "8",
                "--seconds",
                &seconds,
            ]),
            work_key: "files_read",
        },
        Scenario {
            name: "churn --threads 8",
            args: args(&["churn", "--threads", "8", "--seconds", &seconds]),
            work_key: "iterations",
        },
    ]
}

/// The tools this machine has, of those whose name contains one of `only` (comma-separated;
/// all without it). The untraced run and the tp_btf floor are always in: the ratios are to
/// them.
fn select_tools(only: Option<&str>) -> Result<Vec<Tool>> {
    let wanted = |tool: Tool| {
        matches!(tool, Tool::Untraced | Tool::FloorBtf)
            || only.is_none_or(|list| list.split(',').any(|part| tool.name().contains(part)))
    };
    let tools: Vec<Tool> = Tool::ALL
        .into_iter()
        .filter(|&tool| wanted(tool))
        .filter(|&tool| {
            let here = tool.available();
            if !here {
                eprintln!("bench: {} skipped: not installed", tool.name());
            }
            here
        })
        .collect();
    if tools.len() == 2 && only.is_some() {
        bail!(
            "no tool matches --tools {}; the tools: {}",
            only.unwrap_or_default(),
            Tool::ALL.map(Tool::name).join(", ")
        );
    }
    Ok(tools)
}

/// The scenarios whose name contains `only` (all without it), and whether the clamd scan's
/// does; an error naming them all when none does.
fn select_scenarios(all: Vec<Scenario>, only: Option<&str>) -> Result<(Vec<Scenario>, bool)> {
    let Some(only) = only else {
        return Ok((all, true));
    };
    let names: Vec<&str> = all.iter().map(|s| s.name).chain([clamd::NAME]).collect();
    let names = names.join(", ");
    let chosen: Vec<Scenario> = all.into_iter().filter(|s| s.name.contains(only)).collect();
    let clamd = clamd::NAME.contains(only);
    if chosen.is_empty() && !clamd {
        bail!("no workload matches --only {only:?} (workloads: {names})");
    }
    Ok((chosen, clamd))
}

/// One eBPF program's counters over a run's window, named by bpftool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: String,
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

/// What each program did between two readings of the cumulative counters, named by `names`
/// (program id -> name). A program missing from `before` was loaded in between: it counts
/// whole.
fn counters_since(
    after: &[parse::ProgFdinfo],
    before: &[parse::ProgFdinfo],
    names: &BTreeMap<u32, String>,
) -> Vec<ProgramStats> {
    after
        .iter()
        .map(|program| {
            let earlier = before.iter().find(|p| p.id == program.id);
            ProgramStats {
                name: names
                    .get(&program.id)
                    .cloned()
                    .unwrap_or_else(|| format!("id {}", program.id)),
                run_time_ns: program
                    .run_time_ns
                    .saturating_sub(earlier.map_or(0, |p| p.run_time_ns)),
                run_cnt: program
                    .run_cnt
                    .saturating_sub(earlier.map_or(0, |p| p.run_cnt)),
            }
        })
        .collect()
}

/// What one run measured.
#[derive(Debug, Default)]
struct Sample {
    /// Units of work per second (files read, churn iterations).
    throughput: f64,
    programs: Vec<ProgramStats>,
    /// Seconds over which `programs` counted: from soon after the workload's `started` to
    /// shortly before its end.
    stats_window_s: f64,
    /// The tracer's CPU time over the workload's run, as a share of one core.
    daemon_cpu_share: Option<f64>,
    daemon_peak_rss_kib: Option<u64>,
    /// mmapsem-trace's non-zero `lost` counters (JSON), by name.
    lost: BTreeMap<String, u64>,
    /// What mmapsem-trace's report says it cost (the JSON `self_cost.own_cost_share`): the
    /// programs' time, what waiters paid for the part inside the lock, and the tracer
    /// process's CPU, over what the traced threads could have run.
    reported_cost: Option<f64>,
    /// mmapsem-trace's start to its `attached` line (load, verify, attach), in milliseconds.
    attach_ms: Option<f64>,
    /// The most instructions the verifier processed for one of its programs (`-v`).
    verified_insns: Option<u64>,
}

/// What starting a tool took: until it said it was attached, and its programs' verification.
#[derive(Debug, Default)]
struct Attach {
    ms: Option<f64>,
    verified_insns: Option<u64>,
}

pub fn run(options: &Options) -> Result<()> {
    if options.reps == 0 || options.seconds < 2 {
        bail!("--reps must be at least 1 and --seconds at least 2");
    }
    if (options.only.is_some() || options.tools.is_some()) && options.record {
        bail!(
            "--only and --tools run part of the bench; add --no-record (BENCHMARKS.md holds \
             every workload and tool)"
        );
    }
    let (scenarios, scans_clamd) =
        select_scenarios(scenarios(options.seconds), options.only.as_deref())?;
    setup::for_tracing("bench", options.build)?;
    setup::ensure_bench_packages()?;
    let machine = Machine::describe()?;
    let tools = select_tools(options.tools.as_deref())?;
    let clamd_tools: Vec<Tool> = clamd::TOOLS
        .into_iter()
        .filter(|tool| tools.contains(tool))
        .collect();
    let clamd_setup = scans_clamd.then(clamd::Setup::new).transpose()?;
    let mut samples = Samples::new();
    let mut scans: BTreeMap<Tool, Vec<clamd::Scan>> = BTreeMap::new();
    for rep in 1..=options.reps {
        for (index, scenario) in scenarios.iter().enumerate() {
            for &tool in &tools {
                eprintln!(
                    "bench: rep {rep}/{}: {} {}",
                    options.reps,
                    scenario.name,
                    tool.name()
                );
                let sample = run_once(scenario, tool, options.seconds)
                    .with_context(|| format!("{} under {}", scenario.name, tool.name()))?;
                samples.entry((index, tool)).or_default().push(sample);
            }
        }
        for (setup, &tool) in clamd_setup
            .iter()
            .flat_map(|s| clamd_tools.iter().map(move |t| (s, t)))
        {
            eprintln!(
                "bench: rep {rep}/{}: {} {}",
                options.reps,
                clamd::NAME,
                tool.name()
            );
            let scan = setup
                .scan_once(tool)
                .with_context(|| format!("{} under {}", clamd::NAME, tool.name()))?;
            scans.entry(tool).or_default().push(scan);
        }
    }
    let mut results = render_results(&machine, options, &scenarios, &samples);
    if scans_clamd {
        results.push_str(&clamd::render(&scans, options.reps));
    }
    println!("{results}");
    if options.record {
        let file = paths::workspace_root().join("BENCHMARKS.md");
        record_between(&file, BEGIN_MARK, END_MARK, &results)?;
        eprintln!("bench: results written to {}", file.display());
    }
    Ok(())
}

fn binary(name: &str) -> String {
    paths::binary("release", name).display().to_string()
}

fn run_once(scenario: &Scenario, tool: Tool, seconds: u32) -> Result<Sample> {
    let args: Vec<&str> = scenario.args.iter().map(String::as_str).collect();
    let (mut workload, stdout, pid) = spawn_held_workload(&args)?;
    let report = std::env::temp_dir().join(format!("mmapsem-bench-{pid}.json"));
    let (mut tracer, attach) = start_tool(tool, pid, &report)?;
    let tracer_pid = tracer.as_ref().map(|t| t.child.id());
    let poller = tracer_pid.map(ProcPoller::start);

    Cmd::new("kill").args(&["-USR1", &pid.to_string()]).run()?;
    let mut output = lines(stdout);
    // The measured window opens at `started`, not at the signal: the files modes make their
    // files first (seconds' worth for small-files' 20 000).
    if !output.by_ref().any(|line| line == "started") {
        bail!("the workload exited before printing `started`");
    }
    let armed_at = Instant::now();
    let cpu_before = tracer_pid.and_then(read_proc_stat);
    let stats_reader = tracer_pid.map(|tracer_pid| {
        let end = armed_at + Duration::from_secs(seconds.into()).saturating_sub(STATS_MARGIN);
        let from = (armed_at + STATS_DELAY).min(end);
        let until = (from + STATS_WINDOW).min(end);
        thread::spawn(move || window_stats(tracer_pid, from, until))
    });
    let output: Vec<String> = output.collect();
    workload.wait()?;
    let run_s = armed_at.elapsed().as_secs_f64();
    let cpu_after = tracer_pid.and_then(read_proc_stat);

    let mut sample = Sample {
        throughput: parse::work_rate(&output, scenario.work_key).with_context(|| {
            format!(
                "no `{}=... elapsed_ns=...` line in the workload's output: {output:?}",
                scenario.work_key
            )
        })?,
        attach_ms: attach.ms,
        verified_insns: attach.verified_insns,
        ..Sample::default()
    };
    if let Some(reader) = stats_reader {
        let (programs, window) = reader
            .join()
            .map_err(|_| anyhow::anyhow!("bpf_stats reader panicked"))??;
        sample.programs = programs;
        sample.stats_window_s = window.as_secs_f64();
    }
    if let Some(tracer) = tracer.as_mut() {
        if tool.stops_by_signal() {
            // bpftrace prints its maps, perf writes its file, `-a` its report and the daemon
            // stops on SIGINT; `-p` exits with its target.
            Cmd::new("kill")
                .args(&["-INT", &tracer.child.id().to_string()])
                .run()?;
        }
        let status = tracer.wait_for(EXIT_TIMEOUT)?;
        if !status.success() && tool.runs_mmapsem_trace() {
            bail!("mmapsem-trace failed ({status})");
        }
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        sample.daemon_cpu_share = Some(after.cpu_seconds_since(&before) / run_s);
    }
    if let Some(poller) = poller {
        sample.daemon_peak_rss_kib = poller.finish();
    }
    if tool.writes_report() {
        (sample.lost, sample.reported_cost) = read_report(&report)?;
        let _ = std::fs::remove_file(&report);
    }
    if tool == Tool::PerfLock {
        let _ = std::fs::remove_file(&report);
    }
    Ok(sample)
}

/// Starts `tool` on `pid` and waits until it is attached; None for the untraced run. With
/// mmapsem-trace, what attaching took.
fn start_tool(tool: Tool, pid: u32, report: &Path) -> Result<(Option<Guarded>, Attach)> {
    let pid = pid.to_string();
    let report = report.display().to_string();
    let mmapsem = |extra: &[&str]| {
        let report_args = ["--no-live", "--format", "json", "-o", &report];
        start_mmapsem(&[&["-p", &pid], &report_args[..], extra].concat())
    };
    let tracer = match tool {
        Tool::Untraced => return Ok((None, Attach::default())),
        Tool::FloorBtf => start_mmapsem(&["-p", &pid, "--bench-floor", "btf"])?,
        Tool::FloorClassic => start_mmapsem(&["-p", &pid, "--bench-floor", "classic"])?,
        Tool::Mmapsem => mmapsem(&[])?,
        Tool::MmapsemFp => mmapsem(&["--user-stack", "fp"])?,
        Tool::MmapsemLean => mmapsem(&["--lean"])?,
        Tool::SystemLean => start_mmapsem(&[
            "-a",
            "--lean",
            "--no-live",
            "--format",
            "json",
            "-o",
            &report,
        ])?,
        Tool::Serve => start_mmapsem(&["serve", "--listen", SERVE_ADDRESS])?,
        Tool::ServeStacks => start_mmapsem(&["serve", "--listen", SERVE_ADDRESS, "--stacks"])?,
        Tool::PerfLock => (start_perf_lock(&pid, &report)?, Attach::default()),
        Tool::Bpftrace => (start_bpftrace(&pid)?, Attach::default()),
    };
    Ok((Some(tracer.0), tracer.1))
}

/// Starts mmapsem-trace with `-v` (its verifier counts) and waits for `attached`.
fn start_mmapsem(args: &[&str]) -> Result<(Guarded, Attach)> {
    let cmd = Cmd::new(&binary("mmapsem-trace")).args(args).arg("-v");
    let started = Instant::now();
    let mut tracer = Guarded::new("mmapsem-trace", cmd.spawn(Stdio::null(), Stdio::piped())?);
    let stderr = tracer.child.stderr.take().context("tracer stderr")?;
    let before = wait_for_line_keeping(stderr, "attached", &mut tracer)?;
    let attach = Attach {
        ms: Some(started.elapsed().as_secs_f64() * 1e3),
        verified_insns: before
            .iter()
            .filter_map(|line| parse::verified_instructions(line))
            .max(),
    };
    Ok((tracer, attach))
}

/// perf prints nothing once it records: its events are opened when its file has its header.
fn start_perf_lock(pid: &str, report: &str) -> Result<Guarded> {
    let _ = std::fs::remove_file(report);
    let cmd = Cmd::new("perf").args(&["lock", "record", "-p", pid, "-o", report]);
    let mut perf = Guarded::new("perf", cmd.spawn(Stdio::null(), Stdio::null())?);
    let deadline = Instant::now() + ATTACH_TIMEOUT;
    while std::fs::metadata(report).map_or(true, |m| m.len() == 0) {
        if Instant::now() > deadline {
            let status = perf.wait_for(Duration::from_secs(1));
            bail!("perf lock record wrote no file ({status:?})");
        }
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(200));
    Ok(perf)
}

fn start_bpftrace(pid: &str) -> Result<Guarded> {
    let script = paths::workspace_root().join("bench/mmapsem.bt");
    let cmd = Cmd::new("bpftrace").args(&[&script.display().to_string(), pid]);
    // stderr: bpftrace warns that it cannot raise RLIMIT_MEMLOCK (harmless on this kernel).
    let mut tracer = Guarded::new("bpftrace", cmd.spawn(Stdio::piped(), Stdio::null())?);
    let stdout = tracer.child.stdout.take().context("bpftrace stdout")?;
    wait_for_line(stdout, "Attaching", &mut tracer)?;
    Ok(tracer)
}

/// Waits until the child prints a line containing `needle`, then keeps draining its output in
/// the background (a full pipe would stall it).
pub fn wait_for_line(
    output: impl std::io::Read + Send + 'static,
    needle: &'static str,
    child: &mut Guarded,
) -> Result<()> {
    wait_for_line_keeping(output, needle, child).map(|_| ())
}

/// `wait_for_line`, returning the lines printed before the one with `needle`.
fn wait_for_line_keeping(
    output: impl std::io::Read + Send + 'static,
    needle: &'static str,
    child: &mut Guarded,
) -> Result<Vec<String>> {
    let (seen, wait) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut before = Some(Vec::new());
        for line in lines(BufReader::new(output)) {
            match before.as_mut() {
                Some(kept) if line.contains(needle) => {
                    let _ = seen.send(std::mem::take(kept));
                    before = None;
                }
                Some(kept) => kept.push(line),
                None => {}
            }
        }
    });
    match wait.recv_timeout(ATTACH_TIMEOUT) {
        Ok(before) => Ok(before),
        Err(_) => {
            let status = child.wait_for(Duration::from_secs(1));
            bail!("{} did not print `{needle}` ({status:?})", child.name)
        }
    }
}

/// The programs' counters over a window from `from` until `until`, with the window's length,
/// counted with `kernel.bpf_stats_enabled` on for the window alone. The cumulative counters are
/// read at both ends and subtracted, so that the load, the attaching, the workload's set-up and
/// the tracer's own samples stay out; bpftool names them after the second reading.
fn window_stats(
    tracer_pid: u32,
    from: Instant,
    until: Instant,
) -> Result<(Vec<ProgramStats>, Duration)> {
    thread::sleep(from.saturating_duration_since(Instant::now()));
    let stats = BpfStats::enable()?;
    let before = program_counters(tracer_pid)?;
    let from = Instant::now();
    thread::sleep(until.saturating_duration_since(from));
    let after = program_counters(tracer_pid)?;
    let window = from.elapsed();
    drop(stats);
    let names = parse::bpftool_program_names(
        &Cmd::new("bpftool")
            .args(&["-j", "prog", "show"])
            .probe_ok()?,
    )?;
    Ok((counters_since(&after, &before, &names), window))
}

/// The programs process `pid` holds open, with their bpf_stats counters from the fds'
/// fdinfo (Debian's bpftool cannot say which process holds a program).
fn program_counters(pid: u32) -> Result<Vec<parse::ProgFdinfo>> {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut programs: Vec<parse::ProgFdinfo> = Vec::new();
    for entry in std::fs::read_dir(&fd_dir).with_context(|| format!("listing {fd_dir}"))? {
        let fd = entry?.file_name();
        let link = std::fs::read_link(format!("{fd_dir}/{}", fd.to_string_lossy()));
        if !link.is_ok_and(|target| target == Path::new("anon_inode:bpf-prog")) {
            continue;
        }
        let fdinfo =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy()))
                .unwrap_or_default();
        let Some(prog) = parse::bpf_prog_fdinfo(&fdinfo) else {
            continue;
        };
        if programs.iter().all(|known| known.id != prog.id) {
            programs.push(prog);
        }
    }
    Ok(programs)
}

/// The report's non-zero lost counters, and the share of what the traced threads could run
/// that it says it took (programs, lengthened holds, its own process).
fn read_report(report: &Path) -> Result<(BTreeMap<String, u64>, Option<f64>)> {
    let text = std::fs::read_to_string(report)
        .with_context(|| format!("reading mmapsem-trace's report {}", report.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let lost = json["lost"]
        .as_object()
        .context("no `lost` object in mmapsem-trace's JSON report")?;
    let lost = lost
        .iter()
        .filter_map(|(name, n)| Some((name.clone(), n.as_u64()?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    Ok((lost, json["self_cost"]["own_cost_share"].as_f64()))
}

fn read_proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse::proc_stat(&stat)
}

/// Follows a process's peak RSS (VmHWM) until it exits: the last reading before exit is the
/// peak, give or take the final PROC_POLL.
struct ProcPoller {
    stop: Arc<AtomicBool>,
    peak_kib: Arc<Mutex<Option<u64>>>,
    thread: thread::JoinHandle<()>,
}

impl ProcPoller {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak_kib = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, peak_kib) = (Arc::clone(&stop), Arc::clone(&peak_kib));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                        break;
                    };
                    if let Some(hwm) = parse::vm_hwm_kib(&status) {
                        *peak_kib.lock().unwrap_or_else(|e| e.into_inner()) = Some(hwm);
                    }
                    thread::sleep(PROC_POLL);
                }
            })
        };
        Self {
            stop,
            peak_kib,
            thread,
        }
    }

    fn finish(self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        *self.peak_kib.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `kernel.bpf_stats_enabled` on for a stats window, restored when it ends.
struct BpfStats {
    previous: String,
}

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Result<Self> {
        let previous = std::fs::read_to_string(Self::PATH)
            .with_context(|| format!("reading {}", Self::PATH))?;
        std::fs::write(Self::PATH, "1").with_context(|| format!("writing 1 to {}", Self::PATH))?;
        Ok(Self {
            previous: previous.trim().to_owned(),
        })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.previous);
    }
}

/// Where the numbers were taken.
struct Machine {
    date: String,
    kernel: String,
    cpus: usize,
    cpu_model: String,
    load: String,
}

impl Machine {
    fn describe() -> Result<Self> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Ok(Self {
            date: Cmd::new("date")
                .args(&["-u", "+%Y-%m-%d %H:%M UTC"])
                .probe_ok()?
                .trim()
                .to_owned(),
            kernel: Cmd::new("uname").arg("-r").probe_ok()?.trim().to_owned(),
            cpus: thread::available_parallelism().map_or(1, usize::from),
            cpu_model: parse::cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".to_owned()),
            load: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        })
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Per-program totals over every repetition, keyed by the name bpftool gives (kernel program
/// names are cut at 15 characters).
fn program_totals(samples: &[Sample]) -> BTreeMap<String, (u64, u64)> {
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for sample in samples {
        for program in &sample.programs {
            let entry = totals.entry(program.name.clone()).or_default();
            entry.0 += program.run_time_ns;
            entry.1 += program.run_cnt;
        }
    }
    totals
}

fn events_per_second(sample: &Sample) -> f64 {
    let events: u64 = sample.programs.iter().map(|p| p.run_cnt).sum();
    events as f64 / sample.stats_window_s.max(f64::MIN_POSITIVE)
}

/// Every run's sample, by (workload index, tool).
type Samples = BTreeMap<(usize, Tool), Vec<Sample>>;

fn median_throughput(samples: &Samples, index: usize, tool: Tool) -> Option<f64> {
    median_of(samples.get(&(index, tool))?, |s| Some(s.throughput))
}

/// `tool`'s median throughput on workload `index` over `reference`'s; None when either did
/// not run.
fn throughput_ratio(samples: &Samples, index: usize, tool: Tool, reference: Tool) -> Option<f64> {
    Some(median_throughput(samples, index, tool)? / median_throughput(samples, index, reference)?)
}

/// The lock events per second of the untraced run, which no program counts: the tp_btf
/// floor's events per unit of work (its empty programs see every event and do nothing else)
/// times the untraced throughput.
fn untraced_events_estimate(samples: &Samples, index: usize) -> Option<f64> {
    let floor = samples.get(&(index, Tool::FloorBtf))?;
    let per_unit = median_of(floor, |s| {
        (s.throughput > 0.0).then(|| events_per_second(s) / s.throughput)
    })?;
    Some(per_unit * median_throughput(samples, index, Tool::Untraced)?)
}

fn render_results(
    machine: &Machine,
    options: &Options,
    scenarios: &[Scenario],
    samples: &Samples,
) -> String {
    let tools: Vec<&str> = Tool::ALL
        .iter()
        .filter(|&&tool| samples.keys().any(|&(_, ran)| ran == tool))
        .map(|tool| tool.name())
        .collect();
    let workloads: Vec<String> = scenarios
        .iter()
        .map(|s| format!("{}: `mmapsem-workload {}`", s.name, s.args.join(" ")))
        .collect();
    let mut out = format!(
        "Run of {} (kernel {}, {} CPUs, {}; load average {} at the start), {} repetitions of \
         {} s each, alternating {}. Workloads: {}. The floors are empty programs on the three \
         mmap_lock tracepoints (`mmapsem-trace --bench-floor btf|classic`). events/s is runs \
         per second of the tool's programs, which see every process's events (the floors': \
         the machine's mmap_lock events); untraced's `~` is the tp_btf floor's events per \
         unit of work times untraced throughput; `reported cost` is what the tracer's JSON \
         report says it took (`self_cost.own_cost_share`, median), to set beside the \
         measured slowdown (1 - vs untraced); `attach` is mmapsem-trace's start to its \
         `attached` line (median), `verified` the most instructions the verifier processed \
         for one of its programs (`-v`).\n\n",
        machine.date,
        machine.kernel,
        machine.cpus,
        machine.cpu_model,
        machine.load,
        options.reps,
        options.seconds,
        tools.join(" / "),
        workloads.join("; ")
    );
    out.push_str(
        "| workload | tracer | median throughput (/s) | vs untraced | vs floor (tp_btf) | \
         reported cost | events/s | tracer CPU (% of a core) | tracer peak RSS (MiB) | \
         attach (ms) | verified | lost |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (index, scenario) in scenarios.iter().enumerate() {
        for tool in Tool::ALL {
            out.extend(tool_row(scenario.name, index, tool, samples));
        }
    }
    out.push_str(
        "\nPer program, over all repetitions (kernel bpf_stats: run_time_ns / run_cnt):\n\n\
         | workload | tracer | program | events | ns/event |\n|---|---|---|---:|---:|\n",
    );
    for (index, scenario) in scenarios.iter().enumerate() {
        for tool in Tool::ALL {
            let Some(runs) = samples.get(&(index, tool)) else {
                continue;
            };
            for (name, (ns, count)) in program_totals(runs) {
                if count == 0 {
                    continue;
                }
                out.push_str(&format!(
                    "| {} | {} | {name} | {count} | {:.0} |\n",
                    scenario.name,
                    tool.name(),
                    ns as f64 / count as f64
                ));
            }
        }
    }
    out
}

/// One line of the main table: `tool`'s medians on workload `index`; None when it did not
/// run there.
fn tool_row(workload: &str, index: usize, tool: Tool, samples: &Samples) -> Option<String> {
    let runs = samples.get(&(index, tool))?;
    let cell = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
    let ratio = |reference| {
        cell(throughput_ratio(samples, index, tool, reference).map(|r| format!("{r:.2}x")))
    };
    let events = match tool {
        Tool::Untraced => untraced_events_estimate(samples, index).map(|e| format!("~{e:.0}")),
        _ => median_of(runs, |s| Some(events_per_second(s))).map(|e| format!("{e:.0}")),
    };
    let lost = match tool {
        _ if tool.writes_report() => Some(lost_summary(runs)),
        Tool::Bpftrace => Some("not counted".to_owned()),
        _ => None,
    };
    Some(format!(
        "| {workload} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        tool.name(),
        median_throughput(samples, index, tool).unwrap_or(f64::NAN),
        ratio(Tool::Untraced),
        ratio(Tool::FloorBtf),
        cell(median_of(runs, |s| s.reported_cost).map(|c| format!("{:.1}%", c * 100.0))),
        cell(events),
        cell(median_of(runs, |s| s.daemon_cpu_share).map(|c| format!("{:.1}", c * 100.0))),
        cell(
            runs.iter()
                .filter_map(|s| s.daemon_peak_rss_kib)
                .max()
                .map(|k| format!("{:.1}", k as f64 / 1024.0))
        ),
        cell(median_of(runs, |s| s.attach_ms).map(|ms| format!("{ms:.0}"))),
        cell(
            runs.iter()
                .filter_map(|s| s.verified_insns)
                .max()
                .map(|n| n.to_string())
        ),
        cell(lost),
    ))
}

/// The lost or unpaired counters of every repetition, summed by name; `0` when none.
fn lost_summary(runs: &[Sample]) -> String {
    let mut total: BTreeMap<&str, u64> = BTreeMap::new();
    for run in runs {
        for (name, n) in &run.lost {
            *total.entry(name).or_default() += n;
        }
    }
    if total.is_empty() {
        return "0".to_owned();
    }
    let names: Vec<String> = total
        .iter()
        .map(|(name, n)| format!("{name}={n}"))
        .collect();
    names.join(", ")
}

fn median_of(runs: &[Sample], value: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let mut values: Vec<f64> = runs.iter().filter_map(value).collect();
    (!values.is_empty()).then(|| median(&mut values))
}

/// Replaces the results between the markers in `file`, keeping the hand-written discussion
/// around them; appends them (with the markers) when the file has none.
pub fn record_between(file: &Path, begin: &str, end: &str, results: &str) -> Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    std::fs::write(file, splice_results(&old, begin, end, results))
        .with_context(|| format!("writing {}", file.display()))
}

fn splice_results(old: &str, begin_mark: &str, end_mark: &str, results: &str) -> String {
    let block = format!("{begin_mark}\n{results}{end_mark}\n");
    match (old.find(begin_mark), old.find(end_mark)) {
        (Some(begin), Some(end)) if begin < end => {
            let after = &old[end + end_mark.len()..];
            format!(
                "{}{block}{}",
                &old[..begin],
                after.strip_prefix('\n').unwrap_or(after)
            )
        }
        _ if old.is_empty() => format!("# Benchmarks\n\n{block}"),
        _ => format!("{old}\n{block}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn results_replace_the_marked_block_and_keep_the_rest() {
        let old = format!("# B\n\nintro\n{BEGIN_MARK}\nold table\n{END_MARK}\n\n## Misses\nwhy\n");
        let new = splice_results(&old, BEGIN_MARK, END_MARK, "new table\n");
        assert_eq!(
            new,
            format!("# B\n\nintro\n{BEGIN_MARK}\nnew table\n{END_MARK}\n\n## Misses\nwhy\n")
        );
        let fresh = splice_results("", BEGIN_MARK, END_MARK, "t\n");
        assert!(fresh.starts_with("# Benchmarks\n") && fresh.contains("t\n<!--"));
    }

    #[test]
    fn program_totals_add_up_repetitions() {
        let program = |ns, cnt| ProgramStats {
            name: "mmap_lock_relea".to_owned(),
            run_time_ns: ns,
            run_cnt: cnt,
        };
        let runs = [
            Sample {
                programs: vec![program(1000, 10)],
                ..Sample::default()
            },
            Sample {
                programs: vec![program(3000, 10)],
                ..Sample::default()
            },
        ];
        assert_eq!(program_totals(&runs)["mmap_lock_relea"], (4000, 20));
    }

    /// A run of `throughput` per second whose programs ran `events` times (one program) in a
    /// window of one second.
    fn run(throughput: f64, events: u64) -> Sample {
        Sample {
            throughput,
            programs: vec![ProgramStats {
                name: "floor_btf_start_locking".to_owned(),
                run_time_ns: events * 50,
                run_cnt: events,
            }],
            stats_window_s: 1.0,
            ..Sample::default()
        }
    }

    /// Untraced at 100/s (median of three), the tp_btf floor at 95/s seeing 6 events per unit,
    /// mmapsem-trace at 80/s.
    fn samples() -> Samples {
        let untraced = Sample {
            throughput: 100.0,
            ..Sample::default()
        };
        let mut samples = Samples::new();
        samples.insert(
            (0, Tool::Untraced),
            vec![
                Sample {
                    throughput: 110.0,
                    ..Sample::default()
                },
                untraced,
                Sample {
                    throughput: 90.0,
                    ..Sample::default()
                },
            ],
        );
        samples.insert((0, Tool::FloorBtf), vec![run(95.0, 570)]);
        let traced = Sample {
            reported_cost: Some(0.125),
            attach_ms: Some(412.4),
            verified_insns: Some(33650),
            ..run(80.0, 480)
        };
        samples.insert((0, Tool::Mmapsem), vec![traced]);
        samples
    }

    #[test]
    fn throughput_is_compared_with_untraced_and_the_floor() {
        let samples = samples();
        let ratio = |tool, reference| throughput_ratio(&samples, 0, tool, reference);
        assert_eq!(ratio(Tool::Mmapsem, Tool::Untraced), Some(0.8));
        assert_eq!(ratio(Tool::Mmapsem, Tool::FloorBtf), Some(80.0 / 95.0));
        assert_eq!(ratio(Tool::Untraced, Tool::FloorBtf), Some(100.0 / 95.0));
        // Not run: no ratio rather than a made-up one.
        assert_eq!(ratio(Tool::Bpftrace, Tool::Untraced), None);
        assert_eq!(
            throughput_ratio(&samples, 1, Tool::Mmapsem, Tool::Untraced),
            None
        );
    }

    #[test]
    fn untraced_lock_events_are_estimated_from_the_floor() {
        let samples = samples();
        // 570 events/s at 95 units/s: 6 per unit, times untraced's 100 units/s.
        assert_eq!(untraced_events_estimate(&samples, 0), Some(600.0));
        let mut without_floor = samples;
        without_floor.remove(&(0, Tool::FloorBtf));
        assert_eq!(untraced_events_estimate(&without_floor, 0), None);
    }

    fn machine() -> Machine {
        Machine {
            date: "2026-12-01 10:00 UTC".to_owned(),
            kernel: "6.18".to_owned(),
            cpus: 2,
            cpu_model: "AMD EPYC".to_owned(),
            load: "0.10 0.20 0.30".to_owned(),
        }
    }

    fn small_files() -> Vec<Scenario> {
        select_scenarios(scenarios(5), Some("small"))
            .expect("small-files")
            .0
    }

    #[test]
    fn the_table_gives_both_ratios_and_every_tools_programs() {
        let options = Options {
            reps: 3,
            seconds: 5,
            build: false,
            record: false,
            only: None,
            tools: None,
        };
        let table = render_results(&machine(), &options, &small_files(), &samples());
        let rows: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("| small-files"))
            .collect();
        assert_eq!(
            rows,
            [
                "| small-files | untraced | 100 | 1.00x | 1.05x | - | ~600 | - | - | - | - | - |",
                "| small-files | floor (tp_btf) | 95 | 0.95x | 1.00x | - | 570 | - | - | - | - | - |",
                "| small-files | mmapsem-trace | 80 | 0.80x | 0.84x | 12.5% | 480 | - | - | 412 | 33650 | 0 |",
                "| small-files | floor (tp_btf) | floor_btf_start_locking | 570 | 50 |",
                "| small-files | mmapsem-trace | floor_btf_start_locking | 480 | 50 |",
            ]
        );
        assert!(
            table.contains("alternating untraced / floor (tp_btf) / mmapsem-trace. "),
            "only the tools that ran: {table}"
        );
        assert!(table.contains(
            "small-files: `mmapsem-workload files --method mmap --threads 8 \
             --files 20000 --file-size 1K-16K --seconds 5`"
        ));
    }

    #[test]
    fn tools_are_picked_by_part_of_their_name_beside_the_references() {
        let tools = select_tools(Some("serve,-a")).expect("some match");
        assert_eq!(
            tools,
            [
                Tool::Untraced,
                Tool::FloorBtf,
                Tool::SystemLean,
                Tool::Serve,
                Tool::ServeStacks
            ]
        );
        let err = select_tools(Some("strace")).unwrap_err().to_string();
        assert!(err.contains("perf lock record -p"), "{err}");
    }

    #[test]
    fn only_picks_workloads_by_part_of_their_name() {
        let names = |only| -> (Vec<&str>, bool) {
            let (chosen, clamd) = select_scenarios(scenarios(5), only).expect("some match");
            (chosen.iter().map(|s| s.name).collect(), clamd)
        };
        assert_eq!(names(Some("small")), (vec!["small-files"], false));
        assert_eq!(names(Some("churn")), (vec!["churn --threads 8"], false));
        assert_eq!(names(Some("clamd")), (vec![], true));
        assert_eq!(names(None).0.len(), 3);
        assert!(names(None).1, "the clamd scan runs in a whole bench");
        assert_eq!(names(None).0[0], "small-files", "the headline comes first");
        let error = select_scenarios(scenarios(5), Some("large")).expect_err("no match");
        let message = error.to_string();
        assert!(message.contains("\"large\""), "{message}");
        assert!(
            message.contains("small-files, files --method mmap"),
            "{message}"
        );
        assert!(message.contains("clamd scan"), "{message}");
    }

    #[test]
    fn program_counters_count_only_the_window() {
        let counters = |id, run_time_ns, run_cnt| parse::ProgFdinfo {
            id,
            run_time_ns,
            run_cnt,
        };
        let before = [counters(7, 1000, 10)];
        let after = [counters(7, 4000, 40), counters(9, 500, 5)];
        let names = BTreeMap::from([(7, "floor_btf_released".to_owned())]);
        let window = counters_since(&after, &before, &names);
        assert_eq!(
            window,
            [
                ProgramStats {
                    name: "floor_btf_released".to_owned(),
                    run_time_ns: 3000,
                    run_cnt: 30,
                },
                // Loaded after the first reading, and not named by bpftool.
                ProgramStats {
                    name: "id 9".to_owned(),
                    run_time_ns: 500,
                    run_cnt: 5,
                },
            ]
        );
    }
}
