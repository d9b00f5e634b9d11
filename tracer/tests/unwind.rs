//! `--user-stack dwarf` against a program built without frame pointers (like distribution
//! binaries): the unwound stack names its own chain of functions down to libc, while the
//! frame-pointer stack of the same events (the timeline keeps the kernel's) does not.

mod common;

use std::process::Command;

use common::{bpf_available, Tracer, Workload};
use serde_json::Value;

/// The workload's functions, innermost first, between libc's wrapper and the thread's start.
const MUNMAP_CHAIN: [&str; 3] = ["chain_inner", "chain_middle", "chain_outer"];
const MMAP_CHAIN: [&str; 4] = [
    "chain_map_and_touch",
    "chain_inner",
    "chain_middle",
    "chain_outer",
];

/// True when `names` contains `chain` as consecutive elements right after a libc frame whose
/// symbol contains `libc_call`.
fn has_chain_after(frames: &[(String, String)], libc_call: &str, chain: &[&str]) -> bool {
    frames.windows(chain.len() + 1).any(|w| {
        let (module, symbol) = &w[0];
        module.contains("libc.so")
            && symbol.contains(libc_call)
            && w[1..]
                .iter()
                .map(|(_, s)| s.as_str())
                .eq(chain.iter().copied())
    })
}

/// (module, symbol) of an entry's user frames, innermost first.
fn user_frames(entry: &Value) -> Vec<(String, String)> {
    entry["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kernel"] == false)
        .map(|f| {
            (
                f["module"].as_str().unwrap_or("").to_string(),
                f["symbol"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

struct Run {
    report: Value,
    timeline: Value,
}

fn trace_chain_workload() -> Run {
    let binary = common::build_nofp("chain");
    // Each round touches 256 pages: where every fault takes mmap_lock (6.1, no per-VMA locks)
    // 400 rounds are 400 000 events, each stack copied and unwound; under emulation that is
    // tens of minutes, so fewer rounds there (the chains are the same in each).
    let rounds = if common::slowdown() > 1 { 10 } else { 400 };
    let mut chain = Command::new(&binary);
    chain.arg(rounds.to_string());
    let workload = Workload::spawn_command(chain);
    let pid = workload.pid;
    let dir = tempfile::tempdir().unwrap();
    let timeline = dir.path().join("timeline.json");
    let args: Vec<String> = [
        "-p",
        &pid.to_string(),
        "--format",
        "json",
        "--user-stack",
        "dwarf",
        // Every event copied and on the timeline: both stacks of the same events.
        "--threshold",
        "0",
        "--stack-threshold",
        "0",
        "--timeline",
        timeline.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tracer = Tracer::spawn(&args);
    tracer.wait_attached();
    workload.start();
    workload.finish();
    let result = tracer.finish();
    assert!(
        result.status.success(),
        "tracer failed ({}):\n{}",
        result.status,
        result.stderr
    );
    Run {
        report: serde_json::from_str(&result.stdout).expect("JSON report"),
        timeline: serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap())
            .expect("timeline JSON"),
    }
}

#[test]
fn dwarf_unwinding_names_the_chain_that_frame_pointers_miss() {
    if !bpf_available("dwarf_unwinding_names_the_chain_that_frame_pointers_miss") {
        return;
    }
    let run = trace_chain_workload();
    let entries = run.report["entries"].as_array().unwrap();
    let unwound: Vec<Vec<(String, String)>> = entries
        .iter()
        .filter(|e| e["user_stack"] == "dwarf")
        .map(user_frames)
        .collect();
    assert!(!unwound.is_empty(), "no unwound entry:\n{:#}", run.report);
    assert!(
        unwound
            .iter()
            .any(|f| has_chain_after(f, "munmap", &MUNMAP_CHAIN)),
        "no unwound munmap stack through {MUNMAP_CHAIN:?}: {unwound:#?}"
    );
    assert!(
        unwound
            .iter()
            .any(|f| has_chain_after(f, "mmap", &MMAP_CHAIN)),
        "no unwound mmap stack through {MMAP_CHAIN:?}: {unwound:#?}"
    );

    // The timeline carries the kernel's frame-pointer stacks of the same events.
    let slices: Vec<&Value> = run.timeline["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    let fp_stacks: Vec<Vec<String>> = slices
        .iter()
        .filter_map(|s| s["args"]["stack"].as_array())
        .map(|frames| {
            frames
                .iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .collect();
    assert!(
        fp_stacks
            .iter()
            .any(|f| f.iter().any(|s| s.contains("munmap"))),
        "no munmap event on the timeline"
    );
    assert!(
        !fp_stacks
            .iter()
            .any(|f| f.iter().any(|s| s.contains("chain_middle"))),
        "frame pointers walked through code built without them?"
    );
}

/// Unwinding reads each mapped object's CFI. Opening it through /proc/PID/map_files takes the
/// target's mmap_lock (a lookup per object, each queued behind the target's writers), so the
/// objects are opened by path, checked to be the file mapped (on an overlay root too, as in
/// the CI guests): the tracer's own locks of the target's mm stay at about one maps read per
/// second, whatever the number of objects.
#[test]
fn unwinding_opens_objects_without_taking_the_targets_lock() {
    if !bpf_available("unwinding_opens_objects_without_taking_the_targets_lock") {
        return;
    }
    let _serial = common::serial();
    let workload = common::Workload::spawn(&["churn", "--threads", "4", "--seconds", "6"]);
    let traced_s = 3;
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "-d".into(),
        traced_s.to_string(),
        "--user-stack".into(),
        "dwarf".into(),
        "--format".into(),
        "json".into(),
    ]);
    tracer.wait_attached();
    // Started once traced: where loading takes longer than the workload's run (seconds
    // under emulation), a workload started first would be over before the trace began.
    workload.start();
    let tracer_pid = u64::from(tracer.pid());
    let result = tracer.finish();
    workload.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = common::json(&result.stdout);
    let unwound = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["user_stack"] == "dwarf")
        .count();
    assert!(unwound > 0, "nothing was unwound: {}", result.stderr);
    let tracer_holds: Vec<&Value> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "hold" && e["locker"]["pid"] == tracer_pid)
        .collect();
    let by_tracer: u64 = tracer_holds.iter().map(|e| common::u(&e["count"])).sum();
    // Where it locked, for the failure message: each hold's count, cause and kernel stack.
    let where_: Vec<String> = tracer_holds
        .iter()
        .map(|e| {
            let frames: Vec<&str> = e["frames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f["kernel"] == true)
                .filter_map(|f| f["symbol"].as_str())
                .take(10)
                .collect();
            format!("{} x {}: {}", e["count"], e["cause"], frames.join(" < "))
        })
        .collect();
    // Before 6.17 each read of /proc/PID/maps takes the lock (from 6.17 none does): one look
    // a second, the first and the last, one when unwinding meets the process, the discovery
    // read of /proc/PID/cmdline, and a look of slack at the periods' edges. 6.12 under
    // emulation: 6 maps reads and 2 without a stack. Objects opened through map_files would
    // add two or three each. Under emulation on a loaded host, 6.1 once took 11 (9 without a
    // stack): the loop's looks fall due late and bunch up; objects through map_files would still
    // be tens more.
    let looks_allowed = traced_s + if common::slowdown() > 1 { 10 } else { 6 };
    assert!(
        by_tracer <= looks_allowed,
        "the tracer locked its target's mm {by_tracer} times in {traced_s} s:\n{}",
        where_.join("\n")
    );
}

/// Code in anonymous executable memory (a JIT's) is named from the process's perf map, and the
/// frame-pointer walk goes on through it to the code that called it.
#[test]
fn jit_code_is_named_from_the_perf_map() {
    if !bpf_available("jit_code_is_named_from_the_perf_map") {
        return;
    }
    let _serial = common::serial();
    // Frame pointers kept: the walk passes the copied stub by its frame.
    let source = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/nofp/jit.c");
    let binary = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fp-jit");
    common::compile_c(&source, &["-O1", "-fno-omit-frame-pointer"], &binary);
    let mut jit = Command::new(&binary);
    jit.arg("2000");
    let workload = Workload::spawn_command(jit);
    let pid = workload.pid;
    let args: Vec<String> = [
        "-p",
        &pid.to_string(),
        "--format",
        "json",
        "--user-stack",
        "fp",
        "--stack-threshold",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tracer = Tracer::spawn(&args);
    tracer.wait_attached();
    workload.start();
    let out = workload.finish();
    assert!(out.contains("rounds=2000"), "{out}");
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let map = format!("/tmp/perf-{pid}.map");
    let _ = std::fs::remove_file(&map);
    let report: Value = serde_json::from_str(&result.stdout).expect("JSON report");
    let through_jit: Vec<&Value> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["module"] == map.as_str() && f["symbol"] == "jit_stub_for_test")
        })
        .collect();
    assert!(
        !through_jit.is_empty(),
        "no stack through the JIT stub named from {map}: {:#}",
        report["entries"]
    );
    // Past the stub, its caller: the walk did not stop at code outside every mapped file.
    let frames = through_jit[0]["frames"].as_array().unwrap();
    let at = frames
        .iter()
        .position(|f| f["symbol"] == "jit_stub_for_test")
        .unwrap();
    assert!(
        frames[at + 1..]
            .iter()
            .any(|f| f["symbol"] == "main" && !f["kernel"].as_bool().unwrap()),
        "{frames:#?}"
    );
}
