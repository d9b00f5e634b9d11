//! `--bench-floor`, the empty programs `cargo xtask bench` compares the tracer with: they
//! attach, end with their target or a signal without a report, and leave the events to the
//! kernel's other consumers.

mod common;

use std::process::{Command, Stdio};

use common::{bpf_available, serial, trace_workload, value_of, workload_path, Tracer, Workload};

const CHURN: [&str; 7] = [
    "churn",
    "--threads",
    "2",
    "--iterations",
    "50",
    "--map-size",
    "64K",
];

#[test]
fn each_floor_attaches_and_ends_with_its_target_without_a_report() {
    if !bpf_available("each_floor_attaches_and_ends_with_its_target_without_a_report") {
        return;
    }
    let _serial = serial();
    for kind in ["btf", "classic"] {
        let (result, output) = trace_workload(&CHURN, &["--bench-floor", kind]);
        assert_eq!(result.stdout, "", "{kind}: no report");
        assert!(
            result
                .stderr
                .contains(&format!("attached empty {kind} programs")),
            "{kind}: {}",
            result.stderr
        );
        assert_eq!(value_of(&output, "iterations"), 100, "{kind}");
    }
}

/// How many times `perf stat` saw mmap_lock_start_locking while a churn workload ran under
/// it; None when perf is not installed.
fn perf_counted_start_locking() -> Option<u64> {
    let output = Command::new("perf")
        .args([
            "stat",
            "-x,",
            "-e",
            "mmap_lock:mmap_lock_start_locking",
            "--",
        ])
        .arg(workload_path())
        .args(CHURN)
        .stdout(Stdio::null())
        .output()
        .ok()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "perf stat failed: {stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("mmap_lock:mmap_lock_start_locking"))
        .unwrap_or_else(|| panic!("no count in perf's output: {stderr}"));
    let count = line.split(',').next().unwrap_or_default();
    Some(
        count
            .parse()
            .unwrap_or_else(|_| panic!("perf counted nothing: {line}")),
    )
}

#[test]
fn the_classic_floor_leaves_the_events_to_perf_and_stops_on_sigterm() {
    if !bpf_available("the_classic_floor_leaves_the_events_to_perf_and_stops_on_sigterm") {
        return;
    }
    let _serial = serial();
    // Held at its start gate: alive, and never locking anything itself.
    let target = Workload::spawn(&["idle", "--seconds", "0"]);
    let mut floor = Tracer::spawn(&[
        "-p".to_string(),
        target.pid.to_string(),
        "--bench-floor".to_string(),
        "classic".to_string(),
    ]);
    floor.wait_attached();
    // A classic tracepoint program returning 0 would drop every event for perf.
    let counted = perf_counted_start_locking();
    unsafe { libc::kill(floor.pid() as i32, libc::SIGTERM) };
    let result = floor.finish();
    target.start();
    target.finish();
    assert!(
        result.status.success(),
        "{}\n{}",
        result.status,
        result.stderr
    );
    assert_eq!(result.stdout, "");
    match counted {
        // Each churn iteration maps and unmaps: two write locks, each a start_locking.
        Some(count) => assert!(count >= 200, "perf saw {count} start_locking events"),
        None => eprintln!("perf not installed: only the SIGTERM half was checked"),
    }
}
