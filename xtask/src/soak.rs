//! `cargo xtask soak --minutes N`: traces the churn workload for N minutes and samples, every
//! 10 s, the tracer's resident memory, how full each of its eBPF maps is, and its lost-event
//! counters, to show that memory stays flat over a long trace. Records the curve in
//! BENCHMARKS.md.
//!
//! `--serve`: the daemon instead (`mmapsem-trace serve --stacks`, system-wide), scraped every
//! 10 s as Prometheus would, on a busy machine's load: short-lived workload processes start and
//! exit all along, a shell-like loop execs `/bin/true` as fast as it can, and a monitoring-like
//! loop runs `cat /proc/PID/smaps` of a long-lived workload, each `cat` an outside locker of
//! its mm. Its memory and maps must follow the processes alive, not all those it saw.

use std::io::BufReader;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::{record_between, wait_for_line};
use crate::cmd::Cmd;
use crate::demo::{lines, spawn_held_workload, Guarded};
use crate::parse;
use crate::paths;
use crate::setup;

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const BEGIN_MARK: &str = "<!-- soak results: begin (written by cargo xtask soak) -->";
const END_MARK: &str = "<!-- soak results: end -->";
const SERVE_BEGIN_MARK: &str =
    "<!-- soak --serve results: begin (written by cargo xtask soak --serve) -->";
const SERVE_END_MARK: &str = "<!-- soak --serve results: end -->";
/// The daemon's endpoint during the soak.
const SERVE_LISTEN: &str = "127.0.0.1:19723";
/// Short-lived workload processes kept running side by side, each 1 s of churn.
const CHURNERS: usize = 3;

/// One sample of the tracer's state.
struct Sample {
    at: Duration,
    rss_kib: u64,
    /// (map name, entries, max_entries) of the hash maps, which can grow.
    maps: Vec<(String, u64, u64)>,
    lost: String,
}

pub fn run(minutes: u32, build: bool, record: bool, serve: bool) -> Result<()> {
    if minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    setup::for_tracing("soak", build)?;
    if serve {
        return run_serve(minutes, record);
    }
    let seconds = u64::from(minutes) * 60;
    let (mut workload, stdout, pid) =
        spawn_held_workload(&["churn", "--threads", "8", "--seconds", &seconds.to_string()])?;
    // Cumulative interval reports: their footer carries the lost counters so far.
    let tracer_cmd =
        Cmd::new(&binary("mmapsem-trace")).args(&["-p", &pid.to_string(), "--no-live", "-i", "10"]);
    let mut tracer = Guarded::new(
        "mmapsem-trace",
        tracer_cmd.spawn(Stdio::piped(), Stdio::piped())?,
    );
    let tracer_stdout = tracer.child.stdout.take().context("tracer stdout")?;
    let tracer_stderr = tracer.child.stderr.take().context("tracer stderr")?;
    wait_for_line(tracer_stderr, "attached", &mut tracer)?;
    let last_lost = follow_lost_line(tracer_stdout);
    Cmd::new("kill").args(&["-USR1", &pid.to_string()]).run()?;

    let started = Instant::now();
    let tracer_pid = tracer.child.id();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        thread::sleep(SAMPLE_EVERY);
        let Some(sample) = take_sample(tracer_pid, started.elapsed(), &last_lost) else {
            break;
        };
        eprintln!("soak: {}", row(&sample));
        samples.push(sample);
    }
    for line in lines(stdout) {
        eprintln!("workload: {line}");
    }
    workload.wait()?;
    tracer.wait_for(EXIT_TIMEOUT)?;
    let results = render(minutes, &samples);
    println!("{results}");
    if record {
        let file = paths::workspace_root().join("BENCHMARKS.md");
        record_between(&file, BEGIN_MARK, END_MARK, &results)?;
        eprintln!("soak: results written to {}", file.display());
    }
    Ok(())
}

/// The daemon beside processes that come and go, scraped every SAMPLE_EVERY.
fn run_serve(minutes: u32, record: bool) -> Result<()> {
    let seconds = u64::from(minutes) * 60;
    let tracer_cmd =
        Cmd::new(&binary("mmapsem-trace")).args(&["serve", "--stacks", "--listen", SERVE_LISTEN]);
    let mut tracer = Guarded::new(
        "mmapsem-trace serve",
        tracer_cmd.spawn(Stdio::null(), Stdio::piped())?,
    );
    let tracer_stderr = tracer.child.stderr.take().context("tracer stderr")?;
    wait_for_line(tracer_stderr, "serving", &mut tracer)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let processes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut churners: Vec<_> = (0..CHURNERS)
        .map(|_| {
            let processes = Arc::clone(&processes);
            thread::spawn(move || churn_processes(deadline, &processes))
        })
        .collect();
    let execs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    churners.push({
        let execs = Arc::clone(&execs);
        thread::spawn(move || exec_loop(deadline, &execs))
    });
    // The reader loop's target: a workload that lives the whole soak (its stdout is drained so
    // that it never blocks on a full pipe).
    let (mut read_target, target_stdout, target_pid) =
        spawn_held_workload(&["churn", "--threads", "2", "--seconds", &seconds.to_string()])?;
    thread::spawn(move || lines(target_stdout).for_each(drop));
    Cmd::new("kill")
        .args(&["-USR1", &target_pid.to_string()])
        .run()?;
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    churners.push({
        let reads = Arc::clone(&reads);
        thread::spawn(move || proc_reader_loop(deadline, target_pid, &reads))
    });
    let tracer_pid = tracer.child.id();
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        thread::sleep(SAMPLE_EVERY);
        let lost =
            scrape_lost(SERVE_LISTEN).unwrap_or_else(|err| format!("scrape failed: {err:#}"));
        let Some(sample) = take_sample(tracer_pid, started.elapsed(), &Mutex::new(lost)) else {
            break;
        };
        eprintln!(
            "soak: {} ({} churn processes, {} execs, {} /proc reads so far)",
            row(&sample),
            processes.load(std::sync::atomic::Ordering::Relaxed),
            execs.load(std::sync::atomic::Ordering::Relaxed),
            reads.load(std::sync::atomic::Ordering::Relaxed)
        );
        samples.push(sample);
    }
    for churner in churners {
        churner
            .join()
            .map_err(|_| anyhow::anyhow!("a churner panicked"))??;
    }
    read_target.wait_for(EXIT_TIMEOUT)?;
    Cmd::new("kill")
        .args(&["-TERM", &tracer_pid.to_string()])
        .run()?;
    tracer.wait_for(EXIT_TIMEOUT)?;
    let load = Load {
        churn_processes: processes.load(std::sync::atomic::Ordering::Relaxed),
        execs: execs.load(std::sync::atomic::Ordering::Relaxed),
        proc_reads: reads.load(std::sync::atomic::Ordering::Relaxed),
    };
    let results = render_serve(minutes, &load, &samples);
    println!("{results}");
    if record {
        let file = paths::workspace_root().join("BENCHMARKS.md");
        record_between(&file, SERVE_BEGIN_MARK, SERVE_END_MARK, &results)?;
        eprintln!("soak: results written to {}", file.display());
    }
    Ok(())
}

/// Runs 1 s churn processes one after another until `deadline`, counting them.
fn churn_processes(deadline: Instant, started: &std::sync::atomic::AtomicU64) -> Result<()> {
    while Instant::now() < deadline {
        Cmd::new(&binary("mmapsem-workload"))
            .args(&["churn", "--threads", "2", "--seconds", "1"])
            .probe_ok()?;
        started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// Execs `/bin/true` one after another until `deadline`, as a shell loop does, counting them.
fn exec_loop(deadline: Instant, execs: &std::sync::atomic::AtomicU64) -> Result<()> {
    while Instant::now() < deadline {
        std::process::Command::new("/bin/true")
            .status()
            .context("running /bin/true")?;
        execs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// Reads `/proc/PID/smaps` with `cat` until `deadline`, as monitoring agents do: each `cat`
/// takes the target's mmap_lock for read while it walks the target's mappings.
fn proc_reader_loop(
    deadline: Instant,
    pid: u32,
    reads: &std::sync::atomic::AtomicU64,
) -> Result<()> {
    let smaps = format!("/proc/{pid}/smaps");
    while Instant::now() < deadline {
        std::process::Command::new("cat")
            .arg(&smaps)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running cat")?;
        reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// What ran beside the daemon during a soak.
struct Load {
    churn_processes: u64,
    execs: u64,
    proc_reads: u64,
}

/// The non-zero lost-event counters of a scrape of /metrics, and the number of series.
fn scrape_lost(address: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let mut lost = Vec::new();
    let mut series = "?".to_string();
    for line in response.lines() {
        if let Some(rest) = line.strip_prefix("mmapsem_trace_lost_events_total{counter=\"") {
            let (name, value) = rest.split_once("\"} ").unwrap_or((rest, "0"));
            if value.trim() != "0" {
                lost.push(format!("{name}={}", value.trim()));
            }
        } else if let Some(n) = line.strip_prefix("mmapsem_trace_series ") {
            series = n.trim().to_string();
        }
    }
    let lost = if lost.is_empty() {
        "0".to_string()
    } else {
        lost.join(", ")
    };
    Ok(format!("{lost} ({series} series)"))
}

fn render_serve(minutes: u32, load: &Load, samples: &[Sample]) -> String {
    let mut out = format!(
        "Soak of {minutes} min: `mmapsem-trace serve --stacks` (system-wide) scraped every \
         {} s, while {CHURNERS} loops started short `churn --threads 2 --seconds 1` processes \
         one after another ({} processes in all), a loop exec'd `/bin/true` ({} times) and a \
         loop ran `cat /proc/PID/smaps` of a long-lived churn workload ({} times): the \
         daemon's RSS, its hash maps holding entries (entries/capacity), and the scrape's \
         non-zero lost counters and series.\n\n\
         | s | RSS (MiB) | map occupancy | lost so far (series) |\n|---:|---:|---|---|\n",
        SAMPLE_EVERY.as_secs(),
        load.churn_processes,
        load.execs,
        load.proc_reads
    );
    for sample in samples {
        out.push_str(&row(sample));
        out.push('\n');
    }
    out
}

fn binary(name: &str) -> String {
    paths::binary("release", name).display().to_string()
}

/// Keeps the latest `Lost or unpaired events:` line of the tracer's reports.
fn follow_lost_line(stdout: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let last = Arc::new(Mutex::new(String::from("(no report yet)")));
    let writer = Arc::clone(&last);
    thread::spawn(move || {
        for line in lines(BufReader::new(stdout)) {
            if let Some(lost) = line.strip_prefix("Lost or unpaired events: ") {
                *writer.lock().unwrap_or_else(|e| e.into_inner()) = lost.to_owned();
            }
        }
    });
    last
}

fn take_sample(pid: u32, at: Duration, last_lost: &Mutex<String>) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Sample {
        at,
        rss_kib: parse::vm_rss_kib(&status)?,
        maps: hash_map_occupancy(pid).unwrap_or_default(),
        lost: last_lost.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    })
}

/// Entries and capacity of every hash map the process holds (arrays are always full, stack
/// and ring buffer maps are not dumped).
fn hash_map_occupancy(pid: u32) -> Result<Vec<(String, u64, u64)>> {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut maps = Vec::new();
    for entry in std::fs::read_dir(&fd_dir)? {
        let fd = entry?.file_name();
        let fd = fd.to_string_lossy();
        let link = std::fs::read_link(format!("{fd_dir}/{fd}"));
        if !link.is_ok_and(|target| target == Path::new("anon_inode:bpf-map")) {
            continue;
        }
        let fdinfo = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))?;
        let Some(map) = parse::bpf_map_fdinfo(&fdinfo) else {
            continue;
        };
        if !map.is_hash() {
            continue;
        }
        let show = Cmd::new("bpftool")
            .args(&["-j", "map", "show", "id", &map.id.to_string()])
            .probe_ok()?;
        let name = serde_json::from_str::<serde_json::Value>(&show)?["name"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let dump = Cmd::new("bpftool")
            .args(&["-j", "map", "dump", "id", &map.id.to_string()])
            .probe_ok()?;
        let entries = serde_json::from_str::<serde_json::Value>(&dump)?
            .as_array()
            .map_or(0, Vec::len) as u64;
        maps.push((name, entries, map.max_entries));
    }
    maps.sort();
    Ok(maps)
}

fn row(sample: &Sample) -> String {
    let maps: Vec<String> = sample
        .maps
        .iter()
        .filter(|(_, entries, _)| *entries > 0)
        .map(|(name, entries, max)| format!("{name} {entries}/{max}"))
        .collect();
    format!(
        "| {} | {:.1} | {} | {} |",
        sample.at.as_secs(),
        sample.rss_kib as f64 / 1024.0,
        maps.join(", "),
        sample.lost
    )
}

fn render(minutes: u32, samples: &[Sample]) -> String {
    let mut out = format!(
        "Soak of {minutes} min: `churn --threads 8` traced by mmapsem-trace (`-i 10`), sampled \
         every {} s: the tracer's RSS, the hash maps holding entries (entries/capacity), and \
         the lost or unpaired counters so far.\n\n\
         | s | RSS (MiB) | map occupancy | lost or unpaired so far |\n|---:|---:|---|---|\n",
        SAMPLE_EVERY.as_secs()
    );
    for sample in samples {
        out.push_str(&row(sample));
        out.push('\n');
    }
    out
}
