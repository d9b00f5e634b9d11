//! Why threads waited: the scenarios of the 2008-2018 LKML threads on mmap_sem, each traced by
//! the real tracer on the real kernel, asserting the attribution (who waited behind whom, what
//! the holder was doing), not just that numbers exist.

mod common;

use std::sync::Mutex;

use common::{bpf_available, trace_workload, value_of};
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{text}"))
}

fn entries(report: &Value) -> &Vec<Value> {
    report["entries"].as_array().expect("entries array")
}

fn symbols_of(frames: &Value) -> Vec<&str> {
    frames
        .as_array()
        .map(|f| f.iter().filter_map(|f| f["symbol"].as_str()).collect())
        .unwrap_or_default()
}

fn has_symbol(frames: &Value, needle: &str) -> bool {
    symbols_of(frames).iter().any(|s| s.contains(needle))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Ying Han's case: writers looping mmap/munmap (one with MAP_POPULATE) beside faulting
/// threads. The faults' waits must be charged to the mmap/munmap writers, and the populate
/// path, which holds the lock for read while it faults 64 MiB in, must show whom it blocked.
#[test]
fn waits_are_charged_to_the_populating_writer() {
    if !bpf_available("waits_are_charged_to_the_populating_writer") {
        return;
    }
    let _serial = serial();
    let (result, workload_out) = trace_workload(
        &["churn", "--threads", "3", "--writer", "--seconds", "3"],
        &["--format", "json"],
    );
    let report = json(&result.stdout);
    let features = &report["features"];
    for f in ["contention", "faults", "syscalls", "offcpu"] {
        assert_eq!(features[f], true, "feature {f} not attached: {features}");
    }

    // Faults that fall back to mmap_lock (readers) wait behind mmap/munmap (writers): held, or
    // queued ahead of them.
    let (to_writers, charged) = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "wait" && e["cause"] == "page_fault")
        .flat_map(|e| e["blocked_by"].as_array().unwrap())
        .fold((0, 0), |(w, all), b| {
            let writer = ["mmap", "munmap"].contains(&b["cause"].as_str().unwrap());
            (
                w + if writer { u(&b["wait_ns"]) } else { 0 },
                all + u(&b["wait_ns"]),
            )
        });
    assert!(charged > 0, "no fault wait was charged to anyone");
    assert!(
        to_writers * 2 > charged,
        "only {to_writers} of {charged} ns of fault waits charged to mmap/munmap"
    );

    let writer_hold = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "hold" && has_symbol(&e["frames"], "__mm_populate"))
        .max_by_key(|e| u(&e["total_ns"]))
        .expect("the writer's populate hold");
    assert_eq!(writer_hold["cause"], "mmap");
    assert!(
        u(&writer_hold["blocked_others"]["wait_ns"]) > 0,
        "the writer's hold blocked nobody: {}",
        writer_hold["blocked_others"]
    );
    assert!(
        has_symbol(&writer_hold["frames"], "populate_writer")
            || has_symbol(&writer_hold["frames"], "map_populated")
    );

    // Most of a munmap's wait behind a 20 ms populate is spent asleep in the slow path.
    let (contended, waited) = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "wait" && e["cause"] == "munmap")
        .fold((0, 0), |(c, w), e| {
            (c + u(&e["contended_ns"]), w + u(&e["total_ns"]))
        });
    assert!(
        contended > 0 && contended <= waited,
        "contended {contended} of {waited}"
    );

    let iterations = value_of(&workload_out, "iterations");
    let munmap = &report["syscalls"]["munmap"];
    assert!(
        u(&munmap["count"]) >= iterations,
        "{munmap} vs {iterations} iterations"
    );
    assert!(u(&munmap["lock_wait_ns"]) > 0 && u(&munmap["lock_wait_ns"]) <= u(&munmap["total_ns"]));
    let faults = &report["faults"];
    assert!(
        u(&faults["took_mmap_lock"]) > 0,
        "anonymous first faults fall back: {faults}"
    );
    assert!(u(&faults["took_mmap_lock"]) <= u(&faults["total"]));
}
