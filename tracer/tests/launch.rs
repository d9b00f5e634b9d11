//! `mmapsem-trace -- CMD ARGS`: the command is traced from its first instruction and its exit
//! status becomes the tracer's.

mod common;

use std::process::{Command, Output};

use common::{bpf_available, workload_path, TRACER};
use serde_json::Value;

/// Runs the tracer on `command`; the report goes to a file, since the command shares the
/// tracer's stdout.
fn trace_command(command: &[&str]) -> (Output, Value) {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let out = Command::new(TRACER)
        .args(["--format", "json", "-o"])
        .arg(&report_path)
        .arg("--")
        .args(command)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&report_path).unwrap_or_default();
    let report = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}):\n{text}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

fn write_acquisitions(report: &Value) -> u64 {
    report["totals"]["write"]["acquisitions"].as_u64().unwrap()
}

/// /bin/true lives about a millisecond: only a trace that starts before its execve sees the
/// dynamic loader map the C library.
#[test]
fn a_short_command_is_traced_from_its_first_instruction() {
    if !bpf_available("a_short_command_is_traced_from_its_first_instruction") {
        return;
    }
    let (out, report) = trace_command(&["true"]);
    assert!(out.status.success(), "{out:?}");
    assert!(write_acquisitions(&report) > 0, "{}", report["totals"]);
}

#[test]
fn the_commands_exit_status_becomes_the_tracers() {
    if !bpf_available("the_commands_exit_status_becomes_the_tracers") {
        return;
    }
    let (out, _) = trace_command(&["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let (out, _) = trace_command(&["sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM));
}

#[test]
fn a_launched_workload_is_traced_whole() {
    if !bpf_available("a_launched_workload_is_traced_whole") {
        return;
    }
    let workload = workload_path();
    let (out, report) = trace_command(&[
        workload.to_str().unwrap(),
        "churn",
        "--threads",
        "2",
        "--iterations",
        "100",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(report["target"]["comm"], "mmapsem-workloa");
    // Two threads, 100 iterations, each mapping and unmapping once.
    assert!(write_acquisitions(&report) >= 400, "{}", report["totals"]);
}
