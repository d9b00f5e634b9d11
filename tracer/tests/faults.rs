//! Overload and faults (issue 6, item 3): full maps, signals, a target that execs. In every case
//! the tracer exits cleanly, writes what it collected, and counts what it lost.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::{bpf_available, json, serial, trace_workload, u, workload_path, Tracer, Workload};
use serde_json::Value;

/// Each churn iteration maps and unmaps once: two write acquisitions at least.
const CHURN_THREADS: u64 = 2;

/// Two churn threads. Their iterations fill the tiny maps and rings many times over; under
/// emulation, where every operation walks its stacks ten times slower, a quarter do that too.
fn churn() -> [&'static str; 5] {
    let iterations = if common::slowdown() > 1 { "50" } else { "200" };
    ["churn", "--threads", "2", "--iterations", iterations]
}

fn churn_iterations() -> u64 {
    churn()[4].parse().unwrap()
}

fn assert_write_acquisitions_complete(report: &Value) {
    assert_write_acquisitions_at_least(report, 2 * CHURN_THREADS * churn_iterations());
}

fn assert_write_acquisitions_at_least(report: &Value, expected: u64) {
    let acquired = u(&report["totals"]["write"]["acquisitions"]);
    assert!(
        acquired >= expected,
        "totals lost acquisitions: {acquired} write acquisitions, totals {}",
        report["totals"]
    );
}

#[test]
fn full_aggregation_map_is_counted_in_json_and_text_and_totals_stay_exact() {
    if !bpf_available("full_aggregation_map_is_counted_in_json_and_text_and_totals_stay_exact") {
        return;
    }
    let _serial = serial();
    // Per thread and with every stack: far more than 4 keys. Frame-pointer user stacks: a
    // key unwound from copies to two user stacks is two report entries, which the map's size
    // does not bound.
    let tiny_map = [
        "--max-entries",
        "4",
        "--stack-threshold",
        "0",
        "--per-thread",
        "--user-stack",
        "fp",
    ];
    let as_json: Vec<&str> = tiny_map
        .iter()
        .copied()
        .chain(["--format", "json"])
        .collect();
    let (result, _) = trace_workload(&churn(), &as_json);
    let report = json(&result.stdout);
    assert!(
        u(&report["lost"]["aggregation_map_full"]) > 0,
        "{}",
        report["lost"]
    );
    assert!(report["entries"].as_array().unwrap().len() <= 4);
    assert_write_acquisitions_complete(&report);

    let (result, _) = trace_workload(&churn(), &tiny_map);
    let footer = result
        .stdout
        .lines()
        .find(|line| line.starts_with("Lost or unpaired events:"))
        .unwrap_or_else(|| panic!("no footer:\n{}", result.stdout));
    assert!(footer.contains("aggregation_map_full="), "{footer}");
}

#[test]
fn full_stack_map_is_counted_and_totals_stay_exact() {
    if !bpf_available("full_stack_map_is_counted_and_totals_stay_exact") {
        return;
    }
    let _serial = serial();
    let (result, _) = trace_workload(
        &churn(),
        &[
            "--max-stacks",
            "4",
            "--stack-threshold",
            "0",
            "--format",
            "json",
        ],
    );
    let report = json(&result.stdout);
    let lost = &report["lost"];
    let stack_losses: u64 = [
        "kernel_stack_collision",
        "user_stack_collision",
        "kernel_stack_failed",
        "user_stack_failed",
    ]
    .iter()
    .map(|name| u(&lost[name]))
    .sum();
    assert!(stack_losses > 0, "{lost}");
    assert_write_acquisitions_complete(&report);
}

/// Both ring buffers at one page: no user stack copy fits (20 KiB records) and the timeline
/// overflows before it is drained: the tracer is stopped (SIGSTOP) while the workload runs, a
/// reader fallen behind whatever the machine's speed. Each loss is counted, the timeline file
/// says so too, and the aggregation is untouched (the events keep their frame-pointer stacks).
#[test]
fn full_ring_buffers_are_counted_and_the_aggregation_stays_exact() {
    if !bpf_available("full_ring_buffers_are_counted_and_the_aggregation_stays_exact") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let timeline_path = dir.path().join("timeline.json");
    // A 4 KiB ring fills within a few dozen events: under emulation, where every operation
    // walks its stacks ten times slower, fewer iterations fill it as surely.
    let iterations: u64 = if common::slowdown() > 1 { 200 } else { 1000 };
    let workload = Workload::spawn(&[
        "churn",
        "--threads",
        "2",
        "--iterations",
        &iterations.to_string(),
    ]);
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "--ring-bytes".into(),
        "4096".into(),
        "--threshold".into(),
        "1ns".into(),
        "--timeline".into(),
        timeline_path.display().to_string(),
        "--format".into(),
        "json".into(),
    ]);
    tracer.wait_attached();
    let tracer_pid = tracer.pid() as i32;
    // SAFETY: signals to the tracer this test spawned.
    unsafe { libc::kill(tracer_pid, libc::SIGSTOP) };
    workload.start();
    workload.finish();
    unsafe { libc::kill(tracer_pid, libc::SIGCONT) };
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = json(&result.stdout);
    let lost = &report["lost"];
    assert!(u(&lost["user_stack_copy_dropped"]) > 0, "{lost}");
    let timeline_dropped = u(&lost["timeline_dropped"]);
    assert!(timeline_dropped > 0, "{lost}");
    assert_write_acquisitions_at_least(&report, 2 * CHURN_THREADS * iterations);
    let in_entries: u64 = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "hold" && e["mode"] == "write" && e["outside_locker"] == false)
        .map(|e| u(&e["count"]))
        .sum();
    assert!(
        in_entries >= 2 * CHURN_THREADS * iterations,
        "write holds in entries: {in_entries}"
    );

    let timeline: Value =
        serde_json::from_str(&std::fs::read_to_string(&timeline_path).unwrap()).unwrap();
    assert_eq!(
        u(&timeline["otherData"]["lost"]["timeline_dropped"]),
        timeline_dropped,
        "{}",
        timeline["otherData"]
    );
    let slices = timeline["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert!(slices > 0, "what fitted is still in the timeline");
}

/// SIGINT and SIGHUP end the trace like SIGTERM (tested with the exports): report written,
/// exit status 0.
#[test]
fn sigint_and_sighup_write_the_report_collected_so_far() {
    if !bpf_available("sigint_and_sighup_write_the_report_collected_so_far") {
        return;
    }
    let _serial = serial();
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        let dir = tempfile::tempdir().unwrap();
        let report_path = dir.path().join("report.json");
        let mut workload = Workload::spawn(&["churn", "--threads", "2", "--seconds", "30"]);
        let mut tracer = Tracer::spawn(&[
            "-p".into(),
            workload.pid.to_string(),
            "--format".into(),
            "json".into(),
            "-o".into(),
            report_path.display().to_string(),
        ]);
        tracer.wait_attached();
        workload.start();
        // Let some work happen, so that an empty report would be a loss.
        let _ = workload.read_line();
        std::thread::sleep(std::time::Duration::from_millis(300));
        tracer.signal(signal);
        let result = tracer.finish();
        unsafe { libc::kill(workload.pid as i32, libc::SIGKILL) };
        let _ = workload.child.wait();
        assert!(result.status.success(), "{name}: {}", result.stderr);
        let report = json(&std::fs::read_to_string(&report_path).unwrap());
        assert!(
            u(&report["totals"]["write"]["acquisitions"]) > 0,
            "{name}: nothing collected: {}",
            report["totals"]
        );
    }
}

/// A target that execs gets a new mm: the tracer follows it by tgid and times the new image's
/// locks too.
#[test]
fn target_that_execs_is_still_traced() {
    if !bpf_available("target_that_execs_is_still_traced") {
        return;
    }
    let _serial = serial();
    let script = format!(
        "read go; exec '{}' {}",
        workload_path().display(),
        churn().join(" ")
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        shell.id().to_string(),
        "--format".into(),
        "json".into(),
    ]);
    tracer.wait_attached();
    let mut stdin = shell.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    assert!(shell.wait().unwrap().success());
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = json(&result.stdout);
    assert_write_acquisitions_complete(&report);
}

/// A tmpfs of a few pages mounted for one test, unmounted when dropped.
struct TinyTmpfs {
    dir: tempfile::TempDir,
}

impl TinyTmpfs {
    fn mount() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs: {status}");
        Self { dir }
    }

    /// Writes a file until the filesystem refuses more.
    fn fill(&self) {
        let mut file = std::fs::File::create(self.dir.path().join("filler")).unwrap();
        let block = [0u8; 4096];
        loop {
            if let Err(err) = file.write_all(&block) {
                assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
                return;
            }
        }
    }
}

impl Drop for TinyTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The disk fills up while tracing: the report cannot be written to its file, so it goes to
/// stdout, the error names the file and the cause, and the exit status says it failed.
#[test]
fn full_disk_sends_the_report_to_stdout_with_a_clear_error() {
    if !bpf_available("full_disk_sends_the_report_to_stdout_with_a_clear_error") {
        return;
    }
    let _serial = serial();
    let disk = TinyTmpfs::mount();
    let report_path = disk.dir.path().join("report.json");
    let workload = Workload::spawn(&churn());
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "--format".into(),
        "json".into(),
        "-o".into(),
        report_path.display().to_string(),
    ]);
    tracer.wait_attached();
    disk.fill();
    workload.start();
    workload.finish();
    let result = tracer.finish();
    assert!(!result.status.success(), "a lost report must fail the run");
    assert!(
        result.stderr.contains(&report_path.display().to_string())
            && result.stderr.contains("No space left on device")
            && result.stderr.contains("written to stdout instead"),
        "{}",
        result.stderr
    );
    assert_write_acquisitions_complete(&json(&result.stdout));
}

/// 20 000 short-lived threads, more than the per-thread maps hold (16 384 entries): the
/// entries of exited threads must make room for new ones, never turn new threads' locks into
/// unpaired events or losses.
#[test]
fn twenty_thousand_short_lived_threads_stay_paired() {
    if !bpf_available("twenty_thousand_short_lived_threads_stay_paired") {
        return;
    }
    let _serial = serial();
    // More threads than the per-thread maps hold (16 384 entries): exited threads must leave
    // them, or the LRU maps evict live threads' entries. Under emulation a thread takes about
    // 35-120 ms to come and go (11 minutes for 20 000), so there the maps are made smaller
    // instead, the threads exceeding them in the same proportion.
    let (threads, map_args): (u64, &[&str]) = if common::slowdown() > 1 {
        (1_250, &["--thread-entries", "1024"])
    } else {
        (20_000, &[])
    };
    let mut tracer_args = vec!["--format", "json"];
    tracer_args.extend_from_slice(map_args);
    let (result, _) = trace_workload(
        &[
            "churn",
            "--threads",
            &threads.to_string(),
            "--iterations",
            "1",
            "--map-size",
            "64K",
        ],
        &tracer_args,
    );
    let report = json(&result.stdout);
    let lost = &report["lost"];
    for name in [
        // What an evicted live thread's next operation is counted as: its state is gone.
        "began_before_attach",
        "unpaired_acquire",
        "unpaired_release",
        "start_while_waiting",
        "start_while_holding",
        "mode_mismatch",
        "state_map_full",
        "thread_map_full",
    ] {
        assert_eq!(u(&lost[name]), 0, "{name}: {lost}");
    }
    // Each thread maps and unmaps once (its stack's mapping comes on top).
    assert!(
        u(&report["totals"]["write"]["acquisitions"]) >= 2 * threads,
        "{}",
        report["totals"]
    );
}
