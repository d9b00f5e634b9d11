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
    let perf_waits = perf.finish();

    let report = json(&fs::read_to_string(&report).unwrap());
    let totals = &report["totals"];
    let (acquired, waited) = ["read", "write"].iter().fold((0, 0), |(n, ns), mode| {
        (
            n + u(&totals[mode]["acquisitions"]),
            ns + u(&totals[mode]["wait_ns"]),
        )
    });
    let perf_total: u64 = perf_waits.iter().sum();
    let perf_count = perf_waits.len() as u64;
    // Both saw the whole run (the workload starts after both are attached and exits before
    // either stops): the same operations, give or take the exit's own.
    assert!(
        acquired.abs_diff(perf_count) <= perf_count / 100,
        "tracer acquisitions {acquired}, perf {perf_count}"
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

    /// Waits for perf to end (it stops when the process exits) and returns the waits it saw:
    /// start_locking to a successful acquire_returned, per thread.
    fn finish(mut self) -> Vec<u64> {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "perf record failed: {status}");
        let script = Command::new("perf")
            .args(["script", "-F", "tid,time,event,trace", "--ns", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(script.status.success(), "perf script failed");
        waits_in(&String::from_utf8_lossy(&script.stdout))
    }
}

/// `perf script` lines (`TID SECS.NANOS: EVENT: FIELDS`) to wait durations in ns.
fn waits_in(script: &str) -> Vec<u64> {
    let mut started = std::collections::HashMap::new();
    let mut waits = Vec::new();
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
            if let Some(start) = started.remove(tid) {
                waits.push(ns - start);
            }
        }
    }
    waits
}

fn nanoseconds(time: &str) -> Option<u64> {
    let (secs, nanos) = time.split_once('.')?;
    Some(secs.parse::<u64>().ok()? * 1_000_000_000 + nanos.parse::<u64>().ok()?)
}

#[test]
fn perf_script_lines_pair_into_waits() {
    let script = "\
 11 10.000000100: mmap_lock:mmap_lock_start_locking: mm=0x1 write=false
 12 10.000000150: mmap_lock:mmap_lock_start_locking: mm=0x1 write=true
 11 10.000000400: mmap_lock:mmap_lock_acquire_returned: mm=0x1 write=false success=true
 12 10.000000900: mmap_lock:mmap_lock_acquire_returned: mm=0x1 write=true success=false
";
    assert_eq!(waits_in(script), [300]);
}
