//! However a trace ends, what it collected is written: a signal before the programs are even
//! attached, a reader that closes the tracer's stdout mid-trace.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use common::{bpf_available, json, serial, tracer, Tracer, Workload};

#[test]
fn a_sigterm_while_the_programs_load_still_gives_a_report() {
    if !bpf_available("a_sigterm_while_the_programs_load_still_gives_a_report") {
        return;
    }
    let _serial = serial();
    let target = Workload::spawn(&["idle", "--seconds", "0"]);
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let tracer = Command::new(tracer())
        .args(["-p", &target.pid.to_string(), "--format", "json", "-o"])
        .arg(&report)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As soon as it catches SIGTERM, long before "attached": loading and verifying the
    // programs takes a second or more (a fixed 50 ms came before the handler under emulation).
    wait_until_it_catches_sigterm(tracer.id());
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    let output = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    target.start();
    target.finish();
    assert!(
        output.status.success(),
        "{:?}: killed instead of ending the trace: {stderr}",
        output.status
    );
    let report = json(&std::fs::read_to_string(&report).expect("no report written"));
    assert!(report["duration_ns"].is_u64(), "{report}");
}

/// A process whose main thread called pthread_exit goes on in its other threads: the trace of it
/// ends when its last thread does, not when its leader turns zombie, and has every call the
/// worker made after that.
#[test]
fn a_process_whose_leader_exits_first_is_traced_to_its_last_thread() {
    let test = "a_process_whose_leader_exits_first_is_traced_to_its_last_thread";
    if !bpf_available(test) {
        return;
    }
    let _serial = serial();
    let binary = common::build_nofp("leader_exits");
    let mut target = Workload::spawn_command(Command::new(&binary));
    let pid = target.pid;
    let mut tracer = Tracer::spawn(&[
        "-p".into(),
        pid.to_string(),
        "--lean".into(),
        "--format".into(),
        "json".into(),
    ]);
    tracer.wait_attached();
    target.start();
    assert_eq!(target.read_line(), "started");
    let rest = target.finish();
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let calls = common::value_of(&rest, "worker_calls");
    let report = json(&result.stdout);
    let write_holds: u64 = common::entries(&report)
        .iter()
        .filter(|e| e["pid"] == pid && e["kind"] == "hold" && e["mode"] == "write")
        .map(|e| common::u(&e["count"]))
        .sum();
    // Each call's mmap and munmap take the lock for write once each.
    assert!(
        write_holds >= 2 * calls,
        "{write_holds} write holds for the worker's {calls} mmap+munmap calls: the trace \
         ended with the leader\n{report:#}"
    );
}

/// Waits until process `pid` has a SIGTERM handler (SigCgt in /proc/PID/status).
fn wait_until_it_catches_sigterm(pid: u32) {
    let started = std::time::Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (libc::SIGTERM - 1)) != 0 {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the tracer never caught SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_closed_stdout_ends_interval_reports_and_the_files_are_still_written() {
    if !bpf_available("a_closed_stdout_ends_interval_reports_and_the_files_are_still_written") {
        return;
    }
    let _serial = serial();
    // Killed once the tracer is done: it only has to outlive the tracer's attaching, which
    // took most of 30 s under emulation on 6.1 (the target exited before the pipe closed).
    let lifetime = (30 * common::slowdown()).to_string();
    let target = Workload::spawn(&["churn", "--threads", "2", "--seconds", &lifetime]);
    target.start();
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("stacks.folded");
    let mut tracer = Command::new(tracer())
        .args([
            "-p",
            &target.pid.to_string(),
            "-i",
            "0.2",
            "--no-live",
            "--folded",
        ])
        .arg(&folded)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: read the first line of the first interval report, then hang up.
    let mut first = String::new();
    BufReader::new(tracer.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("--- "), "{first:?}");
    let output = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    unsafe { libc::kill(target.pid as i32, libc::SIGTERM) };
    let _ = target.child.wait_with_output();
    assert!(
        stderr.contains("Broken pipe"),
        "the closed pipe is said: {stderr}"
    );
    let stacks = std::fs::read_to_string(&folded).expect("the folded file was not written");
    assert!(
        stacks.lines().any(|l| l.contains("mmapsem-workloa")),
        "folded stacks of the trace so far: {stacks}"
    );
}

/// Ctrl-C (here SIGTERM) ends the trace and the outputs are written; a second one while they
/// are being written ends the tracer at once. The report goes to a FIFO nobody reads, so the
/// tracer is held writing it for as long as the test likes.
#[test]
fn a_second_signal_while_the_outputs_are_written_exits_at_once() {
    if !bpf_available("a_second_signal_while_the_outputs_are_written_exits_at_once") {
        return;
    }
    let _serial = serial();
    let target = Workload::spawn(&["idle", "--seconds", "0"]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("report.fifo");
    let path = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let mut tracer = common::Tracer::spawn(&[
        "-p".into(),
        target.pid.to_string(),
        "--format".into(),
        "json".into(),
        "-o".into(),
        fifo.display().to_string(),
    ]);
    tracer.wait_attached();
    let pid = tracer.pid() as i32;
    unsafe { libc::kill(pid, libc::SIGTERM) };
    // The trace ended; the tracer now waits for a reader of its report.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(
        !state.contains(") Z"),
        "the first signal ended the tracer instead of the trace: {state}"
    );
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let exited = loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state.is_empty() || state.contains(") Z") {
            break true;
        }
        if std::time::Instant::now() > deadline {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let result = tracer.finish();
    assert!(
        exited,
        "a second signal left the tracer writing: {}",
        result.stderr
    );
    target.start();
    target.finish();
    assert_eq!(
        result.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        result.stderr
    );
    assert!(
        result.stderr.contains("SIGTERM again: exiting"),
        "{}",
        result.stderr
    );
}
