//! End-to-end exports: folded stacks, SVG, timeline, CSV and interval reports from the real
//! tracer tracing the bundled workload on the real kernel. Needs root (common::bpf_available).

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::pprof::{go_pprof, raw_totals};
use common::{bpf_available, serial, trace_workload, Tracer, Workload};
use serde_json::Value;

/// Files of one churn run with every export asked for at once.
struct ExportRun {
    _dir: tempfile::TempDir,
    folded: String,
    svg: String,
    timeline: String,
    csv: String,
}

/// Traces `churn --writer` once for all the tests below (each reads its own file).
fn export_run() -> &'static ExportRun {
    static RUN: OnceLock<ExportRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name).display().to_string();
        let (result, _) = trace_workload(
            &["churn", "--threads", "4", "--writer", "--seconds", "3"],
            &[
                "--folded",
                &path("stacks.folded"),
                "--svg",
                &path("flame.svg"),
                "--timeline",
                &path("timeline.json"),
                "--format",
                "csv",
                "-o",
                &path("report.csv"),
            ],
        );
        for name in ["stacks.folded", "flame.svg", "timeline.json", "report.csv"] {
            assert!(
                result.stderr.contains(&format!("wrote {}", path(name))),
                "{name} not announced: {}",
                result.stderr
            );
        }
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        ExportRun {
            folded: read("stacks.folded"),
            svg: read("flame.svg"),
            timeline: read("timeline.json"),
            csv: read("report.csv"),
            _dir: dir,
        }
    })
}

/// flamegraph.pl's own line parse: `^(.*)\s+?(\d+(?:\.\d*)?)$`, frames split on `;`.
fn flamegraph_pl_parse(line: &str) -> Option<(Vec<&str>, u64)> {
    let (stack, value) = line.rsplit_once(char::is_whitespace)?;
    let value: u64 = value.parse().ok()?;
    let frames: Vec<&str> = stack.trim_end().split(';').collect();
    (!frames.is_empty() && frames.iter().all(|f| !f.is_empty())).then_some((frames, value))
}

/// Every line is `frames value` (`^.+ \d+$`), as inferno's strict folded reader wants: no
/// comment or header line.
fn assert_pure_folded(folded: &str) {
    assert!(!folded.is_empty(), "empty folded file");
    for line in folded.lines() {
        let (stack, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value on {line:?}"));
        assert!(
            !stack.is_empty() && !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
            "not a folded stack line: {line:?}"
        );
    }
}

#[test]
fn folded_stacks_parse_like_flamegraph_pl_and_show_both_paths() {
    if !bpf_available("folded_stacks_parse_like_flamegraph_pl_and_show_both_paths") {
        return;
    }
    let folded = &export_run().folded;
    assert_pure_folded(folded);
    let lines: Vec<(Vec<&str>, u64)> = folded
        .lines()
        .map(|l| flamegraph_pl_parse(l).unwrap_or_else(|| panic!("unparsable line {l:?}")))
        .collect();
    assert!(lines.len() >= 3, "{folded}");
    for (frames, value) in &lines {
        // The process name; other processes that locked its mm (a `ps` reading /proc on this
        // shared machine) are rooted under their own name.
        assert!(
            frames[0] == "mmapsem-workloa" || frames[0].contains("(outside locker, pid "),
            "root is the process name: {frames:?}"
        );
        assert!(frames[1].starts_with('[') && frames[1].ends_with(']'));
        assert!(["[read]", "[write]"].contains(&frames[2]), "{frames:?}");
        assert!(*value > 0);
    }
    let by_cause = |cause: &str| -> u64 {
        lines
            .iter()
            .filter(|(f, _)| f[1] == cause)
            .map(|(_, v)| v)
            .sum()
    };
    assert!(by_cause("[munmap]") > 0, "no munmap waits:\n{folded}");
    assert!(by_cause("[page fault]") > 0, "no fault waits:\n{folded}");
    let munmap = lines
        .iter()
        .find(|(f, _)| f[1] == "[munmap]" && f.contains(&"--"))
        .expect("a munmap stack with kernel frames");
    let kernel = munmap.0.iter().skip_while(|f| **f != "--").skip(1);
    assert!(
        kernel.clone().all(|f| f.ends_with("_[k]")),
        "{:?}",
        munmap.0
    );
    assert!(
        munmap
            .0
            .iter()
            .any(|f| f.contains("munmap") && f.ends_with("_[k]")),
        "munmap stack without a kernel munmap frame: {:?}",
        munmap.0
    );
}

#[test]
fn inferno_renders_the_folded_file() {
    if !bpf_available("inferno_renders_the_folded_file") {
        return;
    }
    // The library entry point inferno-flamegraph's CLI calls, with its default options.
    let mut options = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, export_run().folded.lines(), &mut svg)
        .expect("inferno accepts the folded file");
    let svg = String::from_utf8(svg).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("[munmap]"),
        "{svg:.300}"
    );
}

#[test]
fn svg_flamegraph_is_titled_and_shows_the_munmap_path() {
    if !bpf_available("svg_flamegraph_is_titled_and_shows_the_munmap_path") {
        return;
    }
    let svg = &export_run().svg;
    assert!(svg.starts_with("<?xml"), "{svg:.200}");
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("mmap_lock waits: mmapsem-workloa (pid"),
        "title: {svg:.2000}"
    );
    assert!(svg.contains("__vm_munmap") || svg.contains("__x64_sys_munmap"));
    assert!(svg.contains("[page fault]"));
}

#[test]
fn timeline_is_trace_event_json_with_per_thread_tracks() {
    if !bpf_available("timeline_is_trace_event_json_with_per_thread_tracks") {
        return;
    }
    let trace: Value = serde_json::from_str(&export_run().timeline).expect("valid JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(!slices.is_empty(), "no slice over 1 ms in a churn run");
    let threshold_us = 1_000.0;
    for s in &slices {
        assert!(s["dur"].as_f64().unwrap() >= threshold_us, "{s}");
        assert!(s["ts"].as_f64().unwrap() >= 0.0);
        assert!(s["tid"].as_u64().unwrap() > 0);
        assert!(s["args"]["stack"].is_array());
    }
    let tids: std::collections::BTreeSet<u64> =
        slices.iter().map(|s| s["tid"].as_u64().unwrap()).collect();
    assert!(tids.len() >= 2, "one track per thread, got {tids:?}");
    let named: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert!(tids.iter().all(|t| named.contains(t)), "unnamed tracks");
    assert!(
        events.iter().any(|e| e["name"] == "thread_name"
            && e["args"]["name"].as_str().unwrap().starts_with("churn-")),
        "workload threads are named after their comm"
    );
    assert!(slices.iter().any(|s| s["name"] == "wait write (munmap)"));
    assert!(slices.iter().any(|s| s["cat"] == "hold"));
}

/// RFC 4180 fields of one record (quoted fields may hold commas and doubled quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[test]
fn csv_has_a_header_and_one_consistent_row_per_entry() {
    if !bpf_available("csv_has_a_header_and_one_consistent_row_per_entry") {
        return;
    }
    let csv = &export_run().csv;
    let mut lines = csv.lines();
    let header = csv_fields(lines.next().unwrap());
    assert_eq!(header[..5], ["kind", "mode", "cause", "count", "total_ns"]);
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    let rows: Vec<Vec<String>> = lines
        .map(csv_fields)
        .filter(|row| row[0] != "lost")
        .collect();
    assert!(rows.len() >= 5, "{csv}");
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        let number = |name: &str| row[column(name)].parse::<u64>().unwrap();
        assert!(number("count") > 0);
        assert_eq!(number("avg_ns"), number("total_ns") / number("count"));
        assert!(number("max_ns") <= number("total_ns"));
    }
    assert!(rows.iter().any(|r| r[column("cause")] == "munmap"));
}

/// A map too small for the run: the aggregation_map_full counter must reach every format.
#[test]
fn a_drop_is_counted_in_csv_folded_svg_and_timeline() {
    if !bpf_available("a_drop_is_counted_in_csv_folded_svg_and_timeline") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    // Four entries overflow within a few operations: under emulation, where every operation
    // walks its stacks ten times slower, 50 iterations overflow them as surely as 200.
    let iterations = if common::slowdown() > 1 { "50" } else { "200" };
    let (result, _) = trace_workload(
        &["churn", "--threads", "2", "--iterations", iterations],
        &[
            "--max-entries",
            "4",
            "--stack-threshold",
            "0",
            "--per-thread",
            "--folded",
            &path("stacks.folded"),
            "--svg",
            &path("flame.svg"),
            "--timeline",
            &path("timeline.json"),
            "--format",
            "csv",
        ],
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let csv = &result.stdout;
    let header = csv_fields(csv.lines().next().unwrap());
    let lost_row = csv
        .lines()
        .map(csv_fields)
        .find(|row| row[0] == "lost" && row[2] == "aggregation_map_full")
        .unwrap_or_else(|| panic!("no lost row in the CSV:\n{csv}"));
    assert_eq!(lost_row.len(), header.len());
    let dropped: u64 = lost_row[3].parse().unwrap();
    assert!(dropped > 0, "{lost_row:?}");
    let counted = format!("aggregation_map_full={dropped}");

    // The folded file stays pure stack lines: strict readers (inferno-diff-folded) reject
    // anything else. The counters are on stderr and in the other formats instead.
    let folded = read("stacks.folded");
    assert_pure_folded(&folded);
    assert!(
        result
            .stderr
            .lines()
            .any(|l| l.starts_with("mmapsem-trace: lost events: ") && l.contains(&counted)),
        "no lost-events line on stderr:\n{}",
        result.stderr
    );
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(
        &mut inferno::flamegraph::Options::default(),
        folded.lines(),
        &mut svg,
    )
    .expect("inferno accepts the folded file");

    let svg = read("flame.svg");
    assert!(
        svg.contains("; lost: ") && svg.contains(&counted),
        "{svg:.3000}"
    );

    let timeline: Value = serde_json::from_str(&read("timeline.json")).unwrap();
    assert_eq!(
        timeline["otherData"]["lost"]["aggregation_map_full"], dropped,
        "{}",
        timeline["otherData"]
    );
}

#[test]
fn interval_mode_prints_timestamped_reports() {
    if !bpf_available("interval_mode_prints_timestamped_reports") {
        return;
    }
    let _serial = serial();
    // Seconds of workload scaled to the machine: under emulation the trace began too late
    // for a 3 s run to span three intervals.
    let seconds = (3 * common::slowdown()).to_string();
    let (result, _) = trace_workload(
        &["churn", "--threads", "2", "--seconds", &seconds],
        &["-i", "0.5", "--reset", "-n", "2"],
    );
    let reports: Vec<&str> = result
        .stdout
        .lines()
        .filter(|l| l.starts_with("--- "))
        .collect();
    // A 3 s run at 0.5 s intervals, plus the last partial one: several, however loaded the
    // machine is.
    assert!(reports.len() >= 3, "{}", result.stdout);
    for header in &reports {
        assert!(header.contains("(this interval,"), "{header}");
        let date = header.split_whitespace().nth(1).unwrap();
        assert_eq!(date.len(), 10, "YYYY-MM-DD in {header}");
    }
    assert_eq!(
        result.stdout.matches("mmapsem-trace: pid").count(),
        reports.len(),
        "one report per timestamp"
    );
}

#[test]
fn sigterm_writes_the_exports_without_following_a_planted_symlink() {
    if !bpf_available("sigterm_writes_the_exports_without_following_a_planted_symlink") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let svg: PathBuf = dir.path().join("flame.svg");
    std::os::unix::fs::symlink(&victim, &svg).unwrap();
    let folded = dir.path().join("stacks.folded");
    let mut workload = Workload::spawn(&["churn", "--threads", "2", "--seconds", "30"]);
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "--svg".into(),
        svg.display().to_string(),
        "--folded".into(),
        folded.display().to_string(),
    ]);
    tracer.wait_attached();
    workload.start();
    std::thread::sleep(std::time::Duration::from_millis(500));
    tracer.signal(libc::SIGTERM);
    let result = tracer.finish();
    unsafe { libc::kill(workload.pid as i32, libc::SIGKILL) };
    let _ = workload.child.wait();
    assert!(result.status.success(), "{}", result.stderr);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        is_regular_file(&svg),
        "the symlink was replaced, not followed"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("</svg>"));
    let folded = std::fs::read_to_string(&folded).unwrap();
    assert_pure_folded(&folded);
    // Beside the tracer's own reads of the target, as an outside locker.
    assert!(
        folded.lines().any(|l| l.starts_with("mmapsem-workloa;")),
        "{folded}"
    );
}

fn is_regular_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// The --pprof profile read by a real consumer, `go tool pprof` (Debian's golang-go, which
/// `cargo xtask test` installs), against the JSON report of the same trace: its samples add
/// up to the report's waits and holds, and its heaviest wait stack is the report's.
#[test]
fn go_tool_pprof_reads_the_profile_with_the_reports_totals_and_top_stack() {
    if !bpf_available("go_tool_pprof_reads_the_profile_with_the_reports_totals_and_top_stack") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("mmap_lock.pb.gz");
    let (result, _) = trace_workload(
        &["churn", "--threads", "4", "--writer", "--seconds", "2"],
        &["--pprof", profile.to_str().unwrap(), "--format", "json"],
    );
    let report = common::json(&result.stdout);
    let entries = common::entries(&report);
    let of_kind = |kind: &'static str| entries.iter().filter(move |e| e["kind"] == kind);
    let sum = |kind: &'static str, field: &str| -> u64 {
        of_kind(kind).map(|e| common::u(&e[field])).sum()
    };
    let want = [
        sum("wait", "count"),
        sum("wait", "total_ns"),
        sum("hold", "count"),
        sum("hold", "total_ns"),
    ];

    let got = raw_totals(&[], &profile);
    assert_eq!(got, want, "pprof's sums of contentions, delay, holds, hold");
    assert!(want[1] > 0 && want[3] > 0, "no waits or holds traced");

    // The heaviest wait stack: its kernel frames, leaf first, as -traces lists them.
    let top = of_kind("wait")
        .max_by_key(|e| common::u(&e["total_ns"]))
        .unwrap();
    let top_kernel: Vec<&str> = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kernel"] == true)
        .map(|f| f["symbol"].as_str().unwrap_or(""))
        .collect();
    assert!(
        !top_kernel.is_empty(),
        "top wait without kernel frames: {top}"
    );
    // -traces lists every sample (in no order of size): the wait with the largest delay.
    let traces = go_pprof(&["-traces", "-unit=ns"], &profile);
    let delay_of = |block: &str| -> u64 {
        block
            .lines()
            .find_map(|l| {
                l.split_whitespace()
                    .next()?
                    .strip_suffix("ns")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    let first = traces
        .split("-----------+")
        .skip(1)
        .filter(|block| block.contains("kind:  wait"))
        .max_by_key(|block| delay_of(block))
        .unwrap_or_else(|| panic!("no wait trace in:\n{traces}"));
    let functions: Vec<&str> = first
        .lines()
        // Not the labels ("cause:  munmap") nor the rest of the separator.
        .filter(|l| !l.contains(": ") && !l.trim().is_empty() && !l.starts_with('-'))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(
        &functions[..top_kernel.len()],
        &top_kernel[..],
        "pprof's top trace:\n{first}"
    );
}
