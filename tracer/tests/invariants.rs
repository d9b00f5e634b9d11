//! Real traces never show an impossible figure: every entry of the JSON report keeps max <=
//! total, avg <= max, p99 <= max, a histogram holding its count, parts that fit their whole,
//! and no more operations than the kernel's totals counted (`tracer::model::invariants`). The
//! traces use sampled user stacks (`--user-stack dwarf` with every operation asking for a copy,
//! so that the copy budget is spent and uncopied operations are spread over unwound stacks),
//! where those figures used to break.

mod common;

use std::process::Command;

use common::{bpf_available, entries, json, serial, trace_workload, u, Tracer, Workload};
use serde_json::Value;
use tracer::model::invariants::check_json;

/// Every operation expected long, so copied while the budget lasts and spread beyond it.
const SAMPLED_STACKS: [&str; 6] = [
    "--format",
    "json",
    "--user-stack",
    "dwarf",
    "--stack-threshold",
    "0",
];

/// The report's broken invariants, and the debug binary's own warnings about them.
fn broken(report: &Value, stderr: &str) -> Vec<String> {
    let mut broken = check_json(report);
    broken.extend(
        stderr
            .lines()
            .filter(|l| l.contains("invariant broken"))
            .map(str::to_string),
    );
    broken
}

fn assert_possible(what: &str, report: &Value, stderr: &str) {
    let broken = broken(report, stderr);
    assert!(
        broken.is_empty(),
        "{what}: {} impossible figures:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        entries(report).iter().any(|e| e["user_stack"] == "dwarf"),
        "{what}: no unwound stack, nothing was split:\n{report:#}"
    );
}

#[test]
fn the_bundled_workload_with_sampled_user_stacks_shows_no_impossible_figure() {
    if !bpf_available("the_bundled_workload_with_sampled_user_stacks_shows_no_impossible_figure") {
        return;
    }
    let _serial = serial();
    let files = [
        "files",
        "--method",
        "mmap",
        "--threads",
        "8",
        "--file-size",
        "64K",
        "--seconds",
        "2",
    ];
    let churn = [
        "churn",
        "--threads",
        "4",
        "--writer",
        "--map-size",
        "256K",
        "--seconds",
        "2",
    ];
    for (name, workload) in [("files", &files[..]), ("churn", &churn[..])] {
        for per_thread in [false, true] {
            let mut args = SAMPLED_STACKS.to_vec();
            if per_thread {
                args.push("--per-thread");
            }
            let (result, _) = trace_workload(workload, &args);
            let report = json(&result.stdout);
            let what = format!("{name}{}", if per_thread { " per thread" } else { "" });
            assert_possible(&what, &report, &result.stderr);
        }
    }
}

/// Whether an entry's user frames pass through `function`.
fn through(entry: &Value, function: &str) -> bool {
    entry["frames"].as_array().is_some_and(|frames| {
        frames
            .iter()
            .any(|f| f["kernel"] == false && f["symbol"].as_str() == Some(function))
    })
}

#[test]
fn a_thread_is_never_given_more_calls_than_it_made() {
    if !bpf_available("a_thread_is_never_given_more_calls_than_it_made") {
        return;
    }
    let _serial = serial();
    let binary = common::build_nofp("holder");
    let workload = Workload::spawn_command(Command::new(&binary));
    let pid = workload.pid;
    let mut args = vec!["-p".to_string(), pid.to_string()];
    args.extend(SAMPLED_STACKS.iter().map(|s| s.to_string()));
    let mut tracer = Tracer::spawn(&args);
    tracer.wait_attached();
    workload.start();
    let rest = workload.finish();
    let result = tracer.finish();
    assert!(
        result.status.success(),
        "tracer failed ({}):\n{}",
        result.status,
        result.stderr
    );
    let holder_calls = common::value_of(&rest, "holder_calls");
    let report = json(&result.stdout);

    // Every munmap takes mmap_lock for write once: the holder's write holds under munmap are
    // its calls, whatever stacks they were unwound to or spread over.
    let munmap_holds =
        |e: &&Value| e["kind"] == "hold" && e["mode"] == "write" && e["cause"] == "munmap";
    let holds: Vec<&Value> = entries(&report).iter().filter(munmap_holds).collect();
    let holders: u64 = holds
        .iter()
        .filter(|e| through(e, "holder_main"))
        .map(|e| u(&e["count"]))
        .sum();
    let workers: u64 = holds
        .iter()
        .filter(|e| through(e, "worker_main"))
        .map(|e| u(&e["count"]))
        .sum();
    assert!(
        holders > 0,
        "the holder's stack was never unwound:\n{report:#}"
    );
    assert!(
        entries(&report)
            .iter()
            .any(|e| e["user_stack_estimated"] == true && through(e, "worker_main")),
        "the copy budget was never spent (nothing to spread):\n{report:#}"
    );
    assert_possible("holder and workers", &report, &result.stderr);
    assert!(
        holders <= holder_calls,
        "the holder's stack holds {holders} munmap calls, the holder made {holder_calls} \
         (the workers' stack {workers})"
    );
}
