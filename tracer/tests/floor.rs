//! `--bench-floor`, the empty programs `cargo xtask bench` compares the tracer with: they
//! attach, end with their target or a signal without a report, and leave the events to the
//! kernel's other consumers.

mod common;

use common::{
    bpf_available, perf_counted_start_locking, serial, trace_workload, value_of, Tracer, Workload,
    PERF_CHURN,
};

#[test]
fn each_floor_attaches_and_ends_with_its_target_without_a_report() {
    if !bpf_available("each_floor_attaches_and_ends_with_its_target_without_a_report") {
        return;
    }
    let _serial = serial();
    for kind in ["btf", "classic"] {
        let (result, output) = trace_workload(&PERF_CHURN, &["--bench-floor", kind]);
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
    // Each churn iteration maps and unmaps: two write locks, each a start_locking.
    assert!(counted >= 200, "perf saw {counted} start_locking events");
}
