//! `--bench-floor`, the empty programs `cargo xtask bench` compares the tracer with: they
//! attach and end with their target without a report (that they leave the events to perf and
//! stop on SIGTERM: tests/coexistence.rs).

mod common;

use common::{bpf_available, serial, trace_workload, value_of, PERF_CHURN};

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
