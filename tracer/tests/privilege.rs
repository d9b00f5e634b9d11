//! Tracing without root (issue 6, item 6): a user with CAP_BPF, CAP_PERFMON and
//! CAP_DAC_READ_SEARCH (tracefs is mode 0700) traces; without the last one it is told which
//! capability is missing. Capabilities are given with setpriv as ambient capabilities, as
//! `setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep` on the binary would.

mod common;

use std::process::Command;

use common::{bpf_available, tracer, Tracer, Workload};
use serde_json::Value;

/// The tracer run as user nobody with exactly `caps` (setpriv syntax: `+bpf,+perfmon`).
fn as_nobody(caps: &str, args: &[&str]) -> Command {
    let mut command = common::as_nobody(std::path::Path::new(tracer()), caps);
    command.args(args);
    command
}

#[test]
fn non_root_with_bpf_perfmon_and_dac_read_search_traces() {
    if !bpf_available("non_root_with_bpf_perfmon_and_dac_read_search_traces") {
        return;
    }
    let workload = Workload::spawn(&["churn", "--threads", "2", "--iterations", "100"]);
    let pid = workload.pid.to_string();
    let mut tracer = Tracer::spawn_command(as_nobody(
        "+bpf,+perfmon,+dac_read_search",
        &["-p", &pid, "--format", "json"],
    ));
    tracer.wait_attached();
    workload.start();
    workload.finish();
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report: Value = serde_json::from_str(&result.stdout).unwrap();
    // Two threads, 100 iterations, each mapping and unmapping once.
    assert!(
        report["totals"]["write"]["acquisitions"].as_u64().unwrap() >= 400,
        "{}",
        report["totals"]
    );
}

#[test]
fn non_root_without_dac_read_search_is_told_which_capability_is_missing() {
    let me = std::process::id().to_string();
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: setpriv needs root to switch users");
        return;
    }
    let out = as_nobody("+bpf,+perfmon", &["-p", &me]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("not enough privilege") && stderr.contains("CAP_DAC_READ_SEARCH"),
        "{stderr}"
    );
}
