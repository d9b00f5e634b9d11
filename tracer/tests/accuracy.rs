//! The tracer's lock waits against an independent measurement of the same run: perf recording
//! the same two tracepoints. perf's probes are registered after the tracer's, so perf takes its
//! start_locking timestamp after the tracer's program has done its work: a wait the tracer
//! timed from before its own stack walks and user-stack copy comes out longer than perf's by
//! those microseconds, on every operation that walks its stacks.

mod common;

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{bpf_available, json, serial, u, Tracer, Workload};

/// Operations of one uncontended thread: each waits well under a microsecond for the lock, so
/// the tracer's own work (microseconds per walk) would dominate its waits if it were counted.
/// Under emulation, where each walk takes ten times as long, a fifth of them (2 000 locks) still
/// gives the averages compared below.
fn churn_iterations() -> &'static str {
    if common::slowdown() > 1 {
        "1000"
    } else {
        "5000"
    }
}

#[test]
fn waits_match_perf_on_the_same_run_when_every_operation_walks_its_stacks() {
    if !bpf_available("waits_match_perf_on_the_same_run_when_every_operation_walks_its_stacks") {
        return;
    }
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();
    let workload = Workload::spawn(&[
        "churn",
        "--threads",
        "1",
        "--iterations",
        churn_iterations(),
        "--map-size",
        "64K",
    ]);
    let report = dir.path().join("report.json");
    // A zero stack threshold: every operation is expected long, so each one walks its kernel
    // and user stacks and copies its user stack at start_locking.
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "--stack-threshold".into(),
        "0".into(),
        "--format".into(),
        "json".into(),
        "-o".into(),
        report.display().to_string(),
    ]);
    tracer.wait_attached();
    let perf = PerfRecord::start(dir.path(), workload.pid);
    workload.start();
    workload.finish();
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let perf_run = perf.finish();
    let perf_waits = &perf_run.waits;

    let report = json(&fs::read_to_string(&report).unwrap());
    let totals = &report["totals"];
    let sum = |field: &str| {
        ["read", "write"]
            .iter()
            .map(|mode| u(&totals[mode][field]))
            .sum::<u64>()
    };
    let (waits, waited) = (sum("waits"), sum("wait_ns"));
    let acquired = sum("acquisitions") + sum("downgrades");
    let perf_total: u64 = perf_waits.iter().sum();
    let perf_count = perf_waits.len() as u64;
    // Both saw the whole run (the workload starts after both are attached and exits before
    // either stops): the same operations, give or take the exit's own (the tracer leaves an
    // exiting task's locks alone). Trylocks (a fault falling back from its per-VMA lock tries
    // mmap_lock first) and downgrades have no start_locking to pair with, so acquisitions are
    // compared with perf's successful acquire_returned events, and waits with its pairs.
    // Records perf lost widen the margin by as many.
    let seen = format!(
        "tracer: {acquired} acquisitions and downgrades, {waits} waits; perf: {} and \
         {perf_count}, {} records lost",
        perf_run.acquisitions, perf_run.lost
    );
    eprintln!("{seen}");
    assert!(
        acquired.abs_diff(perf_run.acquisitions) <= perf_run.acquisitions / 100 + perf_run.lost,
        "{seen}"
    );
    assert!(
        waits.abs_diff(perf_count) <= perf_count / 100 + perf_run.lost,
        "{seen}"
    );
    // Measured: the tracer's total 0.85x perf's when it times from after its work, 3.8x when
    // it timed from before.
    assert!(
        waited <= perf_total + perf_total / 2,
        "tracer's waits total {waited} ns over {acquired} acquisitions, perf's {perf_total} ns \
         over {perf_count}: the tracer counted its own work as waiting"
    );
    assert!(
        waited > 0 && perf_total > 0,
        "no waits: tracer {waited}, perf {perf_total}"
    );
}

/// `perf record` of start_locking and acquire_returned for one process, opened after the
/// tracer attached and enabled through its control fifo before the workload starts.
struct PerfRecord {
    child: std::process::Child,
    data: std::path::PathBuf,
}

impl PerfRecord {
    fn start(dir: &Path, pid: u32) -> Self {
        let (ctl, ack) = (dir.join("perf.ctl"), dir.join("perf.ack"));
        for fifo in [&ctl, &ack] {
            let path = std::ffi::CString::new(fifo.display().to_string()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        }
        let data = dir.join("perf.data");
        let child = Command::new("perf")
            .args(["record", "-q", "-D", "-1", "--control"])
            .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
            .args([
                "-e",
                "mmap_lock:mmap_lock_start_locking",
                "-e",
                "mmap_lock:mmap_lock_acquire_returned",
                "-p",
                &pid.to_string(),
                "-o",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .spawn()
            .expect("running perf record (Debian's linux-perf)");
        // The events are open (and their probes registered) once perf answers on its fifo.
        fs::OpenOptions::new()
            .write(true)
            .open(&ctl)
            .unwrap()
            .write_all(b"enable\n")
            .unwrap();
        let mut answer = String::new();
        BufReader::new(fs::File::open(&ack).unwrap())
            .read_line(&mut answer)
            .unwrap();
        assert_eq!(answer.trim_end_matches(['\n', '\0']), "ack");
        Self { child, data }
    }

    /// Waits for perf to end (it stops when the process exits) and returns what it saw.
    fn finish(mut self) -> PerfRun {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "perf record failed: {status}");
        let script = Command::new("perf")
            .args(["script", "-F", "tid,time,event,trace", "--ns", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(script.status.success(), "perf script failed");
        let stats = Command::new("perf")
            .args(["report", "--stats", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        PerfRun {
            lost: lost_records(&String::from_utf8_lossy(&stats.stdout)),
            ..perf_run(&String::from_utf8_lossy(&script.stdout))
        }
    }
}

/// What perf saw: every successful acquire_returned, and the waits (start_locking to a
/// successful acquire_returned, per thread) in ns.
#[derive(Debug, PartialEq)]
struct PerfRun {
    acquisitions: u64,
    waits: Vec<u64>,
    /// Records perf says it lost (its ring buffer full while it was not reading).
    lost: u64,
}

/// The sum of `perf report --stats`'s `LOST events:` and `LOST_SAMPLES events:` counts.
fn lost_records(stats: &str) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.trim().strip_prefix("LOST"))
        .filter_map(|rest| rest.split("events:").nth(1))
        .filter_map(|count| count.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `perf script` lines (`TID SECS.NANOS: EVENT: FIELDS`) to acquisitions and waits.
fn perf_run(script: &str) -> PerfRun {
    let mut started = std::collections::HashMap::new();
    let mut waits = Vec::new();
    let mut acquisitions = 0;
    for line in script.lines() {
        let mut words = line.split_whitespace();
        let (Some(tid), Some(time), Some(event)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Some(ns) = time.strip_suffix(':').and_then(nanoseconds) else {
            continue;
        };
        if event.contains("start_locking") {
            started.insert(tid.to_string(), ns);
        } else if event.contains("acquire_returned") && line.contains("success=true") {
            acquisitions += 1;
            if let Some(start) = started.remove(tid) {
                waits.push(ns - start);
            }
        }
    }
    PerfRun {
        acquisitions,
        waits,
        lost: 0,
    }
}

fn nanoseconds(time: &str) -> Option<u64> {
    let (secs, nanos) = time.split_once('.')?;
    Some(secs.parse::<u64>().ok()? * 1_000_000_000 + nanos.parse::<u64>().ok()?)
}

#[test]
fn perf_script_lines_pair_into_waits_and_count_trylocks_as_acquisitions() {
    let script = "\
 11 10.000000100: mmap_lock:mmap_lock_start_locking: mm=0x1 write=false
 12 10.000000150: mmap_lock:mmap_lock_start_locking: mm=0x1 write=true
 11 10.000000400: mmap_lock:mmap_lock_acquire_returned: mm=0x1 write=false success=true
 12 10.000000900: mmap_lock:mmap_lock_acquire_returned: mm=0x1 write=true success=false
 13 10.000001000: mmap_lock:mmap_lock_acquire_returned: mm=0x1 write=false success=true
";
    assert_eq!(
        perf_run(script),
        PerfRun {
            acquisitions: 2,
            waits: vec![300],
            lost: 0,
        }
    );
    let stats =
        "           TOTAL events:        935\n            LOST events:          3  (0.3%)\n   \
                 LOST_SAMPLES events:         12\n          SAMPLE events:        917  (98.1%)\n";
    assert_eq!(lost_records(stats), 15);
}
