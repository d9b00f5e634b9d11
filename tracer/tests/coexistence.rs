//! The tracer never blinds other tools on the same events: perf still counts every mmap_lock
//! event while mmapsem-trace is attached, with BTF tracepoints and with the classic fallback
//! (whose programs must return non-zero, or the kernel drops the event for perf).

mod common;

use common::{bpf_available, perf_counted_start_locking, serial, Tracer, TracerResult, Workload};

/// Runs PERF_CHURN under `perf stat` while mmapsem-trace with `tracer_args` is attached to an
/// idle target, then stops the tracer with SIGTERM: what perf counted, and how the tracer ended.
fn perf_beside_the_tracer(tracer_args: &[&str]) -> (u64, TracerResult) {
    // Held at its start gate: alive, and never locking anything itself.
    let target = Workload::spawn(&["idle", "--seconds", "0"]);
    let mut args = vec!["-p".to_string(), target.pid.to_string()];
    args.extend(tracer_args.iter().map(|a| a.to_string()));
    let mut tracer = Tracer::spawn(&args);
    tracer.wait_attached();
    let counted = perf_counted_start_locking();
    tracer.signal(libc::SIGTERM);
    let result = tracer.finish();
    target.start();
    target.finish();
    assert!(
        result.status.success(),
        "{}\n{}",
        result.status,
        result.stderr
    );
    // Each churn iteration maps and unmaps: two write locks, each a start_locking.
    assert!(
        counted >= 200,
        "perf saw {counted} start_locking events beside mmapsem-trace {tracer_args:?}"
    );
    (counted, result)
}

fn perf_counts_beside_the_tracer(tracer_args: &[&str]) {
    let mut args = vec!["--format", "json", "-d", "60"];
    args.extend_from_slice(tracer_args);
    perf_beside_the_tracer(&args);
}

#[test]
fn perf_counts_mmap_lock_events_beside_btf_tracepoints() {
    if !bpf_available("perf_counts_mmap_lock_events_beside_btf_tracepoints") {
        return;
    }
    let _serial = serial();
    perf_counts_beside_the_tracer(&[]);
}

#[test]
fn perf_counts_mmap_lock_events_beside_classic_tracepoints() {
    if !bpf_available("perf_counts_mmap_lock_events_beside_classic_tracepoints") {
        return;
    }
    let _serial = serial();
    perf_counts_beside_the_tracer(&["--classic-tracepoints"]);
}

/// The bench's classic floor too: empty programs that must not blind perf either, and that
/// stop on SIGTERM with no report.
#[test]
fn perf_counts_mmap_lock_events_beside_the_classic_floor() {
    if !bpf_available("perf_counts_mmap_lock_events_beside_the_classic_floor") {
        return;
    }
    let _serial = serial();
    let (_, result) = perf_beside_the_tracer(&["--bench-floor", "classic"]);
    assert_eq!(result.stdout, "", "no report");
}
