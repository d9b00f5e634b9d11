//! Self-cost (issue 10, item 5): the report says what the tracer's own programs cost, from the
//! kernel's BPF run-time statistics, and -v lists the maps' memory. Needs root (BPF_ENABLE_STATS
//! wants CAP_SYS_ADMIN; see common::bpf_available).

mod common;

use common::{bpf_available, json, serial, trace_workload, u};
use serde_json::Value;

/// Each churn iteration maps and unmaps once: two write acquisitions at least, 800 in all.
const CHURN: [&str; 5] = ["churn", "--threads", "2", "--iterations", "200"];
const CHURN_WRITE_ACQUISITIONS: u64 = 2 * 2 * 200;

fn programs(report: &Value) -> &Vec<Value> {
    report["self_cost"]["programs"]
        .as_array()
        .expect("self_cost.programs array")
}

#[test]
fn every_program_reports_its_runs_and_the_lock_programs_ran_for_every_acquisition() {
    if !bpf_available(
        "every_program_reports_its_runs_and_the_lock_programs_ran_for_every_acquisition",
    ) {
        return;
    }
    let _serial = serial();
    let (result, _) = trace_workload(&CHURN, &["--format", "json", "-v", "--self-cost", "full"]);
    let report = json(&result.stdout);
    let cost = &report["self_cost"];
    assert_eq!(cost["available"], true, "{cost}");
    assert!(cost.get("reason").is_none(), "{cost}");
    assert_eq!(cost["counted_share"], 1.0, "{cost}");

    let mut runs = 0;
    let mut run_time_ns = 0;
    for p in programs(&report) {
        // A program whose event never fired (filemap faults, say: churn's memory is
        // anonymous) has no runs and no time; every other one took time.
        assert_eq!(u(&p["runs"]) > 0, u(&p["ns_per_run"]) > 0, "{p}");
        assert_eq!(u(&p["runs"]) > 0, u(&p["run_time_ns"]) > 0, "{p}");
        runs += u(&p["runs"]);
        run_time_ns += u(&p["run_time_ns"]);
    }
    assert_eq!(u(&cost["added_ns"]), run_time_ns, "{cost}");
    let rate = runs as f64 * 1e9 / u(&report["duration_ns"]) as f64;
    let reported = cost["events_per_second"].as_f64().unwrap();
    assert!(
        (reported - rate).abs() <= rate * 1e-9,
        "{reported} vs {rate}"
    );
    let share = cost["added_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{share}");
    // Everything it took: the programs, what the waiters paid for the part inside the lock
    // (churn's threads do wait), and its own process; a share at least the programs'.
    let lengthened = u(&cost["lengthened_ns"]);
    assert!(lengthened > 0, "{cost}");
    assert_eq!(
        u(&cost["own_cost_ns"]),
        run_time_ns + lengthened + u(&cost["tracer_cpu_ns"]),
        "{cost}"
    );
    let own_share = cost["own_cost_share"].as_f64().unwrap();
    assert!(own_share >= share && own_share < 1.0, "{cost}");

    // start_locking, acquire_returned and released each run at least once per acquisition
    // (and for every other process's lock operations, which they filter out).
    let totals = &report["totals"];
    let acquisitions = u(&totals["read"]["acquisitions"]) + u(&totals["write"]["acquisitions"]);
    assert!(
        u(&totals["write"]["acquisitions"]) >= CHURN_WRITE_ACQUISITIONS,
        "{totals}"
    );
    let lock_programs: Vec<&Value> = programs(&report)
        .iter()
        .filter(|p| {
            let name = p["name"].as_str().unwrap();
            ["start_locking", "acquire_returned", "released"]
                .iter()
                .any(|event| name.ends_with(event))
        })
        .collect();
    assert_eq!(
        lock_programs.len(),
        3,
        "one program per mmap_lock tracepoint: {:?}",
        programs(&report)
    );
    for p in lock_programs {
        assert!(
            u(&p["runs"]) >= acquisitions,
            "{p} ran fewer times than the {acquisitions} acquisitions counted"
        );
    }

    let maps = result
        .stderr
        .lines()
        .skip_while(|l| !l.contains("BPF maps: "))
        .collect::<Vec<_>>();
    assert!(
        !maps.is_empty(),
        "-v lists no map memory:\n{}",
        result.stderr
    );
    assert!(
        maps.iter().any(|l| l.contains("max_entries")),
        "{}",
        result.stderr
    );
}

/// Two seconds of lock operations, a tenth of them counted.
const FILES: [&str; 11] = [
    "files",
    "--method",
    "mmap",
    "--threads",
    "2",
    "--files",
    "400",
    "--file-size",
    "4K-16K",
    "--seconds",
    "2",
];

#[test]
fn sampled_self_cost_counts_a_share_of_the_trace_and_extrapolates_from_it() {
    if !bpf_available("sampled_self_cost_counts_a_share_of_the_trace_and_extrapolates_from_it") {
        return;
    }
    let _serial = serial();
    let (result, _) = trace_workload(&FILES, &["--format", "json", "-v"]);
    let report = json(&result.stdout);
    let cost = &report["self_cost"];
    assert_eq!(cost["available"], true, "{cost}");
    let share = cost["counted_share"].as_f64().unwrap();
    if result
        .stderr
        .contains("counting throughout instead of sampling")
    {
        // Where flipping the statistics is dear (QEMU's TCG: milliseconds of text patching
        // each time), they stay on, and the tracer says so.
        assert!(share > 0.9, "counted share {share}: {cost}");
    } else {
        // 50 ms of every 500 ms; the first window opens at load, before arming.
        assert!(share > 0.04 && share < 0.3, "counted share {share}: {cost}");
    }

    let duration_ns = u(&report["duration_ns"]) as f64;
    let counted_ns = share * duration_ns;
    let runs: u64 = programs(&report).iter().map(|p| u(&p["runs"])).sum();
    let run_time_ns: u64 = programs(&report).iter().map(|p| u(&p["run_time_ns"])).sum();
    let rate = cost["events_per_second"].as_f64().unwrap();
    let counted_rate = runs as f64 * 1e9 / counted_ns;
    assert!(
        (rate - counted_rate).abs() <= counted_rate * 1e-6,
        "{rate} vs {counted_rate}"
    );
    let added = u(&cost["added_ns"]) as f64;
    let extrapolated = run_time_ns as f64 / share;
    assert!(
        (added - extrapolated).abs() <= extrapolated * 1e-6 + 1.0,
        "{added} vs {extrapolated}"
    );

    // start_locking runs once per lock operation that is not a trylock: extrapolated from the
    // counted share, at least a third of the operations the trace counted (a share that did
    // not match the time counted would be off by ten). Under emulation, where the workload
    // makes a few hundred operations and the counted windows see a tenth of them, a fifth.
    // No upper bound: the program also runs for every other process's lock operations, which
    // it filters out, and a QEMU guest beside the test made ten times the target's.
    let factor = if common::slowdown() > 1 { 5.0 } else { 3.0 };
    let totals = &report["totals"];
    let operations = u(&totals["write"]["acquisitions"]) as f64;
    let start_locking = programs(&report)
        .iter()
        .find(|p| p["name"].as_str().unwrap().ends_with("start_locking"))
        .map(|p| u(&p["runs"]) as f64 / share)
        .expect("a start_locking program");
    assert!(
        start_locking > operations / factor,
        "start_locking ran about {start_locking:.0} times for {operations} write acquisitions"
    );
}
