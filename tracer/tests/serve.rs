//! `mmapsem-trace serve` beside real workloads, read by real consumers: the Prometheus
//! project's Python parsers and its server for /metrics, `go tool pprof` for
//! /debug/pprof/mmap_lock.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;

use common::http::{http_get, serving_address};
use common::pprof::{go_pprof, raw_totals};
use common::prometheus::{labelled, percent_encoded, value, Prometheus};
use common::{bpf_available, serial, Tracer, Workload};
use serde_json::Value;

/// A running daemon and the address it said it serves on.
struct Daemon {
    tracer: Tracer,
    address: SocketAddr,
}

impl Daemon {
    fn start(args: &[&str]) -> Self {
        Self::ready(Self::spawn(args))
    }

    /// Starts `serve ARGS` without waiting for it: daemons started together load together.
    fn spawn(args: &[&str]) -> Tracer {
        let mut all = vec!["serve".to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        Tracer::spawn(&all)
    }

    /// Waits for a spawned daemon to attach and say where it serves.
    fn ready(mut tracer: Tracer) -> Self {
        tracer.wait_attached();
        let line = tracer.wait_line("serving http://");
        let address = serving_address(&line);
        Self { tracer, address }
    }

    fn get(&self, path: &str, accept: Option<&str>) -> (u16, Vec<u8>) {
        http_get(self.address, path, accept).unwrap_or_else(|err| panic!("GET {path}: {err}"))
    }

    /// SIGTERM; the daemon must exit 0 and say nothing is wrong.
    fn stop(self) -> String {
        unsafe { libc::kill(self.tracer.pid() as i32, libc::SIGTERM) };
        let result = self.tracer.finish();
        assert!(result.status.success(), "{}", result.stderr);
        result.stderr
    }
}

/// The samples of an exposition as the Prometheus project's Python client parses them (the
/// OpenMetrics parser checks histograms whole: buckets that only grow, +Inf equal to _count).
fn parsed_samples(text: &str, openmetrics: bool) -> Vec<Value> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families as prometheus
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
parse = openmetrics if sys.argv[1] == "openmetrics" else prometheus
samples = [
    {"family": f.name, "type": f.type, "name": s.name, "labels": s.labels, "value": s.value}
    for f in parse(sys.stdin.read()) for s in f.samples
]
print(json.dumps(samples))
"#;
    // Debian's python, whose python3-prometheus-client `cargo xtask test` installs (a python
    // of pyenv's may come first on PATH).
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            script,
            if openmetrics {
                "openmetrics"
            } else {
                "prometheus"
            },
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    // A parser that fails early closes its stdin: its error is what to show, not the pipe's.
    let _ = child.stdin.take().unwrap().write_all(text.as_bytes());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused the exposition (apt-get install python3-prometheus-client): {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Sum of the samples named `name` whose labels include every pair of `labels`.
fn sum_of(samples: &[Value], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
        .map(|s| s["value"].as_f64().unwrap())
        .sum()
}

/// The operations of the JSON report's entries of `pid`'s own threads, by kind.
fn report_counts(report: &Value, pid: u32, kind: &str) -> u64 {
    common::entries(report)
        .iter()
        .filter(|e| e["pid"] == pid && e["outside_locker"] == false && e["kind"] == kind)
        .map(|e| common::u(&e["count"]))
        .sum()
}

/// A one-shot `-p PID --lean --format json` report of the workload's whole run: attached
/// before it starts, ended by its exit.
fn one_shot_lean_report(workload: Workload) -> Value {
    let mut one_shot = Tracer::spawn(&[
        "-p".into(),
        workload.pid.to_string(),
        "--lean".into(),
        "--format".into(),
        "json".into(),
    ]);
    one_shot.wait_attached();
    workload.start();
    workload.finish();
    let result = one_shot.finish();
    assert!(result.status.success(), "{}", result.stderr);
    common::json(&result.stdout)
}

/// The daemon (system-wide, timing only) and a one-shot `-p PID --format json` trace of the
/// same workload, from its first lock operation to its exit: the histograms' counts for that
/// pid, read by both of Prometheus's parsers, are the report's waits and holds.
#[test]
fn metrics_add_up_to_a_one_shot_report_of_the_same_workload() {
    let test = "metrics_add_up_to_a_one_shot_report_of_the_same_workload";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let workload = Workload::spawn(&["churn", "--threads", "4", "--writer", "--seconds", "2"]);
    let pid = workload.pid;
    let daemon = Daemon::start(&["--listen", "127.0.0.1:0", "--label-pid"]);
    let report = one_shot_lean_report(workload);

    let (status, prometheus) = daemon.get("/metrics", None);
    assert_eq!(status, 200);
    let (status, openmetrics) = daemon.get(
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    );
    assert_eq!(status, 200);
    let openmetrics = String::from_utf8(openmetrics).unwrap();
    assert!(openmetrics.trim_end().ends_with("# EOF"), "{openmetrics}");
    let pid_label = pid.to_string();
    for (samples, format) in [
        (
            parsed_samples(&String::from_utf8(prometheus).unwrap(), false),
            "prometheus",
        ),
        (parsed_samples(&openmetrics, true), "openmetrics"),
    ] {
        for kind in ["wait", "hold"] {
            let labels = [("pid", pid_label.as_str()), ("kind", kind)];
            let counted = sum_of(&samples, "mmap_lock_seconds_count", &labels) as u64;
            let in_buckets = sum_of(
                &samples,
                "mmap_lock_seconds_bucket",
                &[labels[0], labels[1], ("le", "+Inf")],
            ) as u64;
            let want = report_counts(&report, pid, kind);
            // Enough operations for the counts to say something (a 2 s churn under emulation
            // made exactly 100 waits on 6.1).
            assert!(want >= 20, "{kind}: the workload made only {want}");
            assert_eq!(counted, in_buckets, "{format} {kind}: _count and +Inf");
            assert_eq!(
                counted, want,
                "{format} {kind}: the daemon's count for pid {pid} against the one-shot report's"
            );
        }
        // The trace's own figures are there too.
        assert!(
            sum_of(&samples, "mmap_lock_acquisitions_total", &[]) > 0.0,
            "{format}"
        );
        assert!(
            samples
                .iter()
                .any(|s| s["name"] == "mmapsem_trace_lost_events_total"
                    && s["labels"]["counter"] == "series_cap"),
            "{format}"
        );
    }
    daemon.stop();
}

/// The daemon's profile of a window holding the workload's whole run, read by `go tool pprof`:
/// its contentions and holds for the workload's own threads are the daemon's /metrics counts
/// for that pid, and its top functions by delay are the mm paths the workload waits in. The
/// workload ends, and is forgotten by the daemon, before the window does.
#[test]
fn a_profile_from_the_daemon_is_read_by_go_tool_pprof() {
    let test = "a_profile_from_the_daemon_is_read_by_go_tool_pprof";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // Under emulation everything is several times slower: the workload's run and the wait for
    // the window grow with it, the window still holding both.
    let slowdown = common::slowdown();
    let run_s = (2 * slowdown).to_string();
    let workload = Workload::spawn(&["churn", "--threads", "4", "--writer", "--seconds", &run_s]);
    let pid = workload.pid;
    let daemon = Daemon::start(&["--listen", "127.0.0.1:0", "--stacks", "--label-pid"]);
    // Long enough for the daemon to forget the workload inside the window (it forgets a
    // process at the second fold after its end, folds 10 s apart): the profile must keep it.
    let seconds = (6 * slowdown).max(25);
    let address = daemon.address;
    let path = format!("/debug/pprof/mmap_lock?seconds={seconds}");
    let profile_request = std::thread::spawn(move || http_get(address, &path, None).unwrap());
    // The window opens when the loop takes the request (at its next tick, 100 ms on the host,
    // seconds apart under emulation, where a tick's refresh is slow): well before the
    // workload's first operation.
    std::thread::sleep(std::time::Duration::from_secs(slowdown));
    workload.start();
    workload.finish();
    let (status, body) = profile_request.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let profile = dir.path().join("mmap_lock.pb.gz");
    std::fs::write(&profile, body).unwrap();

    // The samples of the workload's own threads (not of /proc readers of its memory).
    let focus = format!("-tagfocus=pid={pid}");
    let got = raw_totals(&[&focus, "-tagignore=outside_locker=."], &profile);
    assert!(
        got[0] > 100 && got[2] > 100,
        "few samples for pid {pid}: {got:?}"
    );
    let (status, metrics) = daemon.get("/metrics", None);
    assert_eq!(status, 200);
    let samples = parsed_samples(&String::from_utf8(metrics).unwrap(), false);
    let pid_label = pid.to_string();
    let count = |kind| {
        sum_of(
            &samples,
            "mmap_lock_seconds_count",
            &[("pid", pid_label.as_str()), ("kind", kind)],
        ) as u64
    };
    assert_eq!(
        [got[0], got[2]],
        [count("wait"), count("hold")],
        "the profile's contentions and holds against /metrics"
    );
    let top = go_pprof(&["-top", "-nodecount=3", &focus], &profile);
    assert!(top.contains("Type: delay"), "{top}");
    assert!(
        top.contains("lock_mm_and_find_vma")
            || top.contains("vm_mmap_pgoff")
            || top.contains("__vm_munmap"),
        "the workload's waits are in the mm paths:\n{top}"
    );
    daemon.stop();
}

/// By default the daemon listens on loopback only: port 9723 answers there and not on the
/// machine's other address. An address given with --listen is taken as said.
#[test]
fn the_default_endpoint_is_loopback_only() {
    let test = "the_default_endpoint_is_loopback_only";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let outward = outward_address().expect("a non-loopback address on this machine");
    let daemon = Daemon::start(&[]);
    assert_eq!(daemon.address, "127.0.0.1:9723".parse().unwrap());
    let (status, _) = daemon.get("/metrics", None);
    assert_eq!(status, 200);
    let beyond = SocketAddr::new(outward, 9723);
    assert!(
        TcpStream::connect(beyond).is_err(),
        "the default endpoint answered on {beyond}"
    );
    daemon.stop();

    let everywhere = Daemon::start(&["--listen", "0.0.0.0:0"]);
    let port = everywhere.address.port();
    assert!(
        TcpStream::connect(SocketAddr::new(outward, port)).is_ok(),
        "--listen 0.0.0.0 did not listen on {outward}"
    );
    let stderr = everywhere.stop();
    assert!(stderr.contains("beyond loopback"), "{stderr}");
}

/// The address this machine would send from: a UDP "connection" picks it without a packet.
fn outward_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A port already taken is one line and a failure before anything loads; bad requests get
/// their HTTP errors and the daemon goes on.
#[test]
fn a_taken_port_and_bad_requests_are_refused_clearly() {
    let test = "a_taken_port_and_bad_requests_are_refused_clearly";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = Command::new(common::tracer())
        .args(["serve", "--listen", &address])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("listening on {address}")) && !stderr.contains("attached"),
        "{stderr}"
    );
    let out = Command::new(common::tracer())
        .args(["serve", "--listen", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");

    let daemon = Daemon::start(&["--listen", "127.0.0.1:0"]);
    assert_eq!(daemon.get("/nothing", None).0, 404);
    assert_eq!(daemon.get("/debug/pprof/mmap_lock?seconds=0", None).0, 400);
    assert_eq!(daemon.get("/debug/pprof/mmap_lock?seconds=x", None).0, 400);
    assert_eq!(daemon.get("/metrics", None).0, 200);
    daemon.stop();
}

/// Processes that come and go: once gone and folded, their kernel entries are deleted (the
/// daemon's maps follow the living), and their series keep every operation they made.
#[test]
fn gone_processes_leave_the_maps_and_stay_in_the_series() {
    let test = "gone_processes_leave_the_maps_and_stay_in_the_series";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let mut daemon = Daemon::start(&[
        "--listen",
        "127.0.0.1:0",
        "-vv",
        "--comm",
        "mmapsem-workloa",
    ]);
    let holds = |daemon: &Daemon| {
        let (status, body) = daemon.get("/metrics", None);
        assert_eq!(status, 200);
        let samples = parsed_samples(&String::from_utf8(body).unwrap(), false);
        let comms: std::collections::HashSet<String> = samples
            .iter()
            .filter_map(|s| s["labels"]["comm"].as_str().map(str::to_string))
            .collect();
        assert!(
            comms.iter().all(|c| c == "mmapsem-workloa"),
            "--comm let others through: {comms:?}"
        );
        sum_of(&samples, "mmap_lock_seconds_count", &[("kind", "hold")]) as u64
    };
    let mut last = 0;
    // Long enough for the daemon to learn the process's name (--comm keeps only those named)
    // before it ends: a look at /proc every second, ten times slower under emulation, where
    // a 1 s run ended unnamed and was left out ("round 0: 0 holds").
    let run_s = common::slowdown().to_string();
    for round in 0..3 {
        let workload = Workload::spawn(&["churn", "--threads", "2", "--seconds", &run_s]);
        workload.start();
        workload.finish();
        // Two folds after the exit: the first sees the process gone, the second forgets it.
        let seen = holds(&daemon);
        let after = holds(&daemon);
        assert!(seen > last, "round {round}: {seen} holds after {last}");
        assert_eq!(after, seen, "round {round}: forgetting lost operations");
        last = after;
    }
    let forgot = daemon.tracer.wait_line("forgot");
    let entries: u64 = forgot
        .split(": ")
        .last()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no entry count in {forgot:?}"));
    assert!(entries > 0, "{forgot}");
    daemon.stop();
}

/// The README's Prometheus block: its scrape config and its queries, each after its comment.
fn readme_prometheus() -> (String, Vec<String>) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let block = readme
        .split_once("A Prometheus scrape job for `serve`")
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("the README's Prometheus block");
    let (config, queries) = block
        .split_once("\n\n")
        .expect("config, a blank line, queries");
    let queries = queries
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(str::to_string)
        .collect();
    (format!("{config}\n"), queries)
}

/// The waits of the report's entries of `pid`'s own threads: count and ns by cause, and the
/// longest.
fn report_waits_by_cause(report: &Value, pid: u32) -> (BTreeMap<String, (u64, u64)>, u64) {
    let mut by_cause = BTreeMap::<String, (u64, u64)>::new();
    let mut max_ns = 0;
    for entry in common::entries(report)
        .iter()
        .filter(|e| e["pid"] == pid && e["outside_locker"] == false && e["kind"] == "wait")
    {
        let cause = by_cause
            .entry(entry["cause"].as_str().unwrap().to_string())
            .or_default();
        cause.0 += common::u(&entry["count"]);
        cause.1 += common::u(&entry["total_ns"]);
        max_ns = max_ns.max(common::u(&entry["max_ns"]));
    }
    (by_cause, max_ns)
}

/// Debian's Prometheus scrapes two daemons every second with the README's job: what it stored
/// for a workload is a one-shot `--lean` report's counts, cause by cause; the README's queries
/// answer for it within what the report allows; and a daemon under process churn keeps its
/// series under `--max-series`, the operations past it counted.
#[test]
fn a_prometheus_server_scraping_the_daemon_answers_the_readme_queries() {
    let test = "a_prometheus_server_scraping_the_daemon_answers_the_readme_queries";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let workload = Workload::spawn(&["churn", "--threads", "4", "--writer", "--seconds", "3"]);
    let pid = workload.pid;
    let daemon = Daemon::spawn(&["--listen", "127.0.0.1:0", "--label-pid"]);
    const MAX_SERIES: usize = 20;
    let churned = Daemon::spawn(&[
        "--listen",
        "127.0.0.1:0",
        "--label-pid",
        "--comm",
        "true",
        "--max-series",
        &MAX_SERIES.to_string(),
    ]);
    let (daemon, churned) = (Daemon::ready(daemon), Daemon::ready(churned));
    let (readme_config, queries) = readme_prometheus();
    assert_eq!(queries.len(), 3, "{queries:?}");
    let config = format!(
        "global:\n  scrape_interval: 1s\n{}  - job_name: churn\n    static_configs: [{{ targets: [\"{}\"] }}]\n",
        readme_config.replace("127.0.0.1:9723", &daemon.address.to_string()),
        churned.address
    );
    let prometheus = Prometheus::start(&config);
    let up = prometheus.settled("up == 1", 30, |up| up.len() == 2);
    assert_eq!(up.len(), 2, "{up:?}\n{}", prometheus.log());

    let report = one_shot_lean_report(workload);
    let (waits, max_wait_ns) = report_waits_by_cause(&report, pid);
    let holds = report_counts(&report, pid, "hold");

    // What the server stored: the report's counts, once a scrape has them all. Each tracer
    // times the operations itself, and the one attached second counts the first one's work
    // inside its waits: a wait near the lean cause threshold (10 us) may have a cause in one
    // and none (`no_stack`) in the other (36 of 323 mmap waits here). Totals agree exactly,
    // and the causes of five waits or more in either are named by both.
    let stored = format!(
        r#"sum by (cause) (mmap_lock_seconds_count{{job="mmapsem",pid="{pid}",kind="wait"}})"#
    );
    let want: BTreeMap<String, u64> = waits.iter().map(|(c, (n, _))| (c.clone(), *n)).collect();
    let by_cause = |answer: &[Value]| -> BTreeMap<String, u64> {
        answer
            .iter()
            .map(|s| {
                (
                    s["metric"]["cause"].as_str().unwrap().to_string(),
                    value(s) as u64,
                )
            })
            .collect()
    };
    let total = |counts: &BTreeMap<String, u64>| counts.values().sum::<u64>();
    let answer = prometheus.settled(&stored, 30, |answer| {
        total(&by_cause(answer)) == total(&want)
    });
    let got = by_cause(&answer);
    assert_eq!(
        total(&got),
        total(&want),
        "{stored}: {got:?}, the report's {want:?}"
    );
    let common_causes = |counts: &BTreeMap<String, u64>| -> Vec<String> {
        counts
            .iter()
            .filter(|(_, n)| **n >= 5)
            .map(|(cause, _)| cause.clone())
            .collect()
    };
    for cause in common_causes(&want).iter().chain(&common_causes(&got)) {
        assert!(
            got.contains_key(cause) && want.contains_key(cause),
            "{cause}: {got:?} stored, {want:?} in the report"
        );
    }
    let held = prometheus.query(&format!(
        r#"sum(mmap_lock_seconds_count{{job="mmapsem",pid="{pid}",kind="hold"}})"#
    ));
    assert_eq!(held.first().map(value), Some(holds as f64), "holds");

    let workload_comm = report["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pid"] == pid))
        .and_then(|p| p["comm"].as_str())
        .expect("the workload's name in the report")
        .to_string();
    let job = |query: &str| query.replacen("{", "{job=\"mmapsem\",", 1);
    // p99 wait per name: the workload's lies within the log2 bucket of its longest wait.
    let p99 = prometheus.query(&job(&queries[0]));
    let p99 = labelled(&p99, "comm", &workload_comm);
    assert_eq!(p99.len(), 1, "{:?}: {p99:?}", queries[0]);
    let p99_s = value(p99[0]);
    eprintln!("{}: {p99:?}", queries[0]);
    assert!(
        p99_s > 0.0 && p99_s <= 2.0 * max_wait_ns as f64 / 1e9,
        "p99 {p99_s} s, the longest wait {max_wait_ns} ns"
    );
    // Share of wall time waiting by cause: only the report's causes, each at most its total
    // over the 5 minutes. rate() extrapolates the increase between a series' first and last
    // samples to the window's edges (up to 1.1 scrape intervals each side): by half again
    // here, and up to three times under emulation, where the scrapes come late and a cause's
    // series spans as little as two of them (6.1 under TCG: 21.9 ms for the report's 10.6).
    let slack = if common::slowdown() > 1 { 3.0 } else { 1.5 };
    let shares = prometheus.query(&job(&queries[1]));
    let shares = labelled(&shares, "comm", &workload_comm);
    assert!(!shares.is_empty(), "{:?}: nothing", queries[1]);
    eprintln!("{}: {shares:?}", queries[1]);
    for share in shares {
        let cause = share["metric"]["cause"].as_str().unwrap();
        let (_, wait_ns) = waits.get(cause).copied().unwrap_or_default();
        let per_second = value(share);
        assert!(
            per_second >= 0.0 && per_second * 300.0 <= slack * wait_ns as f64 / 1e9,
            "{cause}: {per_second} s/s, the report's {wait_ns} ns"
        );
    }
    // The tracer's own cost: some CPU time, less than the machine has.
    let cost = prometheus.query(&queries[2]);
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert_eq!(cost.len(), 1, "{:?}: {cost:?}", queries[2]);
    eprintln!("{}: {cost:?}", queries[2]);
    assert!(
        value(&cost[0]) > 0.0 && value(&cost[0]) < cpus,
        "{}: {:?}",
        queries[2],
        cost[0]
    );

    // Churn: the series of each pid of `true` (a few each) fill the cap; what is past it is
    // counted. Twelve processes are enough, and under emulation each takes a second.
    let count = if common::slowdown() > 1 { "12" } else { "40" };
    let spawner = Workload::spawn(&["spawn", "--count", count, "--per-second", "20"]);
    spawner.start();
    spawner.finish();
    let over = r#"mmapsem_trace_lost_events_total{job="churn",counter="series_cap"} > 0"#;
    let answer = prometheus.settled(over, 30, |over| over.len() == 1);
    assert_eq!(answer.len(), 1, "{over}: {answer:?}");
    let most = prometheus.query(r#"max_over_time(mmapsem_trace_series{job="churn"}[5m])"#);
    let limit = prometheus.query(r#"mmapsem_trace_series_limit{job="churn"}"#);
    let exported = prometheus.query(r#"count(mmap_lock_seconds_count{job="churn"})"#);
    eprintln!("churn: at most {most:?} series of {limit:?}, {exported:?} exported, {answer:?}");
    assert_eq!(limit.first().map(value), Some(MAX_SERIES as f64));
    assert_eq!(most.first().map(value), Some(MAX_SERIES as f64), "{most:?}");
    assert!(
        exported.first().map(value) <= Some(MAX_SERIES as f64),
        "{exported:?}"
    );
    churned.stop();
    daemon.stop();
}

#[test]
fn prometheus_queries_are_percent_encoded() {
    assert_eq!(
        percent_encoded(r#"sum by (le) (x{kind="wait"}[5m])"#),
        "sum%20by%20%28le%29%20%28x%7Bkind%3D%22wait%22%7D%5B5m%5D%29"
    );
}
