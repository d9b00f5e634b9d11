//! `mmapsem-trace -- CMD ARGS`: the command is traced from its first instruction and its exit
//! status becomes the tracer's.

mod common;

use std::process::{Command, Output};

use common::{bpf_available, tracer, workload_path};
use serde_json::Value;

/// Runs the tracer on `command`; the report goes to a file, since the command shares the
/// tracer's stdout.
fn trace_command(command: &[&str]) -> (Output, Value) {
    trace_command_with(&[], command)
}

fn trace_command_with(tracer_args: &[&str], command: &[&str]) -> (Output, Value) {
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let out = Command::new(tracer())
        .args(["--format", "json", "-o"])
        .arg(&report_path)
        .args(tracer_args)
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

/// The waits of every thread over the time all threads lived: never above 100%, however short
/// the process (it reported 324845% of thread time for this one) or its threads.
fn assert_share_is_of_real_thread_time(report: &Value) {
    let thread_ns = report["thread_time_ns"].as_u64().unwrap();
    let waited = ["read", "write"]
        .iter()
        .map(|m| report["totals"][m]["wait_ns"].as_u64().unwrap())
        .sum::<u64>();
    let share = report["wait_share"].as_f64().unwrap();
    assert!(
        waited <= thread_ns && share <= 1.0,
        "waited {waited} ns in {thread_ns} ns of thread time: share {share}"
    );
}

#[test]
fn a_process_killed_at_once_has_a_wait_share_of_its_real_life() {
    if !bpf_available("a_process_killed_at_once_has_a_wait_share_of_its_real_life") {
        return;
    }
    let _serial = common::serial();
    let (out, report) = trace_command(&["sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(137), "{out:?}");
    assert!(write_acquisitions(&report) > 0, "exec maps: {report}");
    assert_share_is_of_real_thread_time(&report);
}

/// 200 threads that each map a few pages and end, 20 at a time: the thread time is the sum of
/// their lives (as Python measured them) and the main thread's, not a count taken now and then.
#[test]
fn threads_that_come_and_go_count_for_the_time_they_lived() {
    if !bpf_available("threads_that_come_and_go_count_for_the_time_they_lived") {
        return;
    }
    let _serial = common::serial();
    // `lived`: each worker's own view of its life, from its first line to its last; `spans`:
    // each batch's time from before its threads were started to after they were joined, once
    // per thread (a thread lives inside its batch's span, however long it waited to run).
    let script = r#"
import mmap, threading, time
lived = []
spans = 0.0
def work():
    t = time.monotonic()
    for _ in range(50):
        mmap.mmap(-1, 1 << 16).close()
    time.sleep(0.01)
    lived.append(time.monotonic() - t)
for _ in range(10):
    batch = [threading.Thread(target=work) for _ in range(20)]
    t0 = time.monotonic()
    for b in batch: b.start()
    for b in batch: b.join()
    spans += (time.monotonic() - t0) * len(batch)
print(f"lived_ns={int(sum(lived) * 1e9)}")
print(f"spans_ns={int(spans * 1e9)}")
print(f"threads={len(lived)}")
"#;
    let (out, report) = trace_command(&["python3", "-c", script]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lived: u64 = common::value_of(&stdout, "lived_ns");
    let spans: u64 = common::value_of(&stdout, "spans_ns");
    assert_eq!(common::value_of(&stdout, "threads"), 200);
    assert_share_is_of_real_thread_time(&report);
    let thread_ns = report["thread_time_ns"].as_u64().unwrap();
    let duration = report["duration_ns"].as_u64().unwrap();
    // At least the workers' lives; at most their batches' spans and the main thread's life
    // (the traced time bounds it), with a millisecond a thread for the end of an exit that a
    // join does not wait for (where sched_process_exit, at which a life is counted, comes
    // after exit_mm, as on 6.1, the thread id that join waits on is cleared before it; 6.18
    // has it before exit_mm). Counting each worker twice would
    // break it: the workers run side by side, so their lives nearly fill the spans.
    assert!(
        lived <= thread_ns && thread_ns <= spans + duration + 200 * 1_000_000,
        "thread time {thread_ns} ns; workers lived {lived} ns in spans of {spans} ns; traced \
         {duration} ns"
    );
}

/// The processes of `report` named `comm`, with the holds each made.
fn processes_named<'a>(report: &'a Value, comm: &str) -> Vec<&'a Value> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == comm)
        .collect()
}

/// `-- make -j8` traces make and what it starts: here a shell that runs two workloads, one
/// after the other and one in the background, each a process of its own with its row.
#[test]
fn a_command_is_traced_with_the_processes_it_starts() {
    if !bpf_available("a_command_is_traced_with_the_processes_it_starts") {
        return;
    }
    let _serial = common::serial();
    let workload = workload_path().display().to_string();
    let script = format!(
        "{w} churn --threads 2 --iterations 100 >/dev/null; \
         {w} churn --threads 2 --iterations 100 >/dev/null & wait",
        w = workload
    );
    let (out, report) = trace_command(&["sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
    let children = processes_named(&report, "mmapsem-workloa");
    assert_eq!(children.len(), 2, "{:#}", report["processes"]);
    for child in children {
        // Each iteration maps and unmaps: two write holds, 100 iterations on 2 threads.
        assert!(child["holds"].as_u64().unwrap() >= 400, "{child}");
    }

    let (out, report) = trace_command_with(&["--no-inherit"], &["sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        processes_named(&report, "mmapsem-workloa").is_empty(),
        "--no-inherit traced the children: {:#}",
        report["processes"]
    );
}

/// The faults and threads of a traced tree are the whole tree's: most of its processes live
/// between two of the tracer's looks, so they are counted at the root, with the children it
/// reaped, and checked against perf's count of the same command.
#[test]
fn a_commands_tree_counts_every_processs_faults_and_threads() {
    if !bpf_available("a_commands_tree_counts_every_processs_faults_and_threads") {
        return;
    }
    let _serial = common::serial();
    const PROCESSES: usize = 30;
    let script = format!("for i in $(seq {PROCESSES}); do /bin/true & done; wait");
    let (out, report) = trace_command(&["sh", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
    let threads = report["target"]["threads"].as_u64().unwrap();
    assert!(
        threads > PROCESSES as u64,
        "{threads} threads for a shell and its {PROCESSES} children"
    );
    let traced = report["faults"]["total"].as_u64().unwrap();
    let counted = perf_counted_faults(&["sh", "-c", &script]);
    let off = traced.abs_diff(counted) as f64 / counted as f64;
    assert!(
        off < 0.15,
        "the tracer saw {traced} page faults of the tree, perf {counted}"
    );
}

/// Minor and major faults of `command` and its children, as `perf stat` counts them.
fn perf_counted_faults(command: &[&str]) -> u64 {
    let output = Command::new("perf")
        .args(["stat", "-x,", "-e", "minor-faults,major-faults", "--"])
        .args(command)
        .output()
        .expect("running perf (Debian's linux-perf)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "perf stat failed: {stderr}");
    stderr
        .lines()
        .filter(|l| l.contains("-faults"))
        .map(|l| {
            l.split(',')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("perf counted nothing: {l}"))
        })
        .sum()
}

/// `--user` runs the command as that user, as `sudo -u` would (whose own fork the tracer would
/// not follow into the command).
#[test]
fn user_runs_the_command_as_that_user() {
    if !bpf_available("user_runs_the_command_as_that_user") {
        return;
    }
    let _serial = common::serial();
    let (out, report) = trace_command_with(
        &["--user", "nobody"],
        &["sh", "-c", "id -u; id -g; echo $USER $HOME"],
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["65534", "65534", "nobody /nonexistent"], "{stdout}");
    assert!(write_acquisitions(&report) > 0, "{report}");
}

/// The trace ends (here `-d 1`) while the command still runs: the command is stopped
/// (SIGTERM, then SIGKILL after a grace period) rather than waited for, and the tracer exits 0
/// (the trace did what was asked), saying it stopped the command.
#[test]
fn a_command_outliving_the_trace_is_stopped() {
    if !bpf_available("a_command_outliving_the_trace_is_stopped") {
        return;
    }
    let _serial = common::serial();
    let started = std::time::Instant::now();
    let (out, report) = trace_command_with(&["-d", "1"], &["sleep", "120"]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "waited {:?} for the command",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stopped the command") && stderr.contains("(duration reached)"),
        "{stderr}"
    );
    assert!(report["duration_ns"].as_u64().unwrap() >= 1_000_000_000);
}
