//! Bad input: one clear line on stderr and a non-zero exit.

mod common;

use std::process::{Command, Output};

use common::{bpf_available, tracer};

fn run(args: &[&str]) -> Output {
    Command::new(tracer())
        .args(args)
        .output()
        .expect("running tracer")
}

fn assert_one_line_error(out: &Output, expected: &str) {
    assert!(!out.status.success(), "exit status {}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got:\n{stderr}");
    assert!(lines[0].starts_with("mmapsem-trace: "), "{stderr}");
    assert!(lines[0].contains(expected), "want {expected:?} in {stderr}");
}

#[test]
fn no_such_pid() {
    let out = run(&["-p", "3999999"]);
    assert_one_line_error(&out, "no such process: 3999999");
}

/// kthreadd, pid 2 on every Linux system, a kernel thread: no mm of its own.
#[test]
fn kernel_thread_is_refused() {
    let out = run(&["-p", "2"]);
    assert_one_line_error(&out, "2 is a kernel thread");
}

#[test]
fn all_with_pids_is_refused() {
    let out = run(&["-a", "-p", "1"]);
    assert_one_line_error(&out, "the argument '--all' cannot be used with '--pid");
}

#[test]
fn lean_with_user_stacks_is_refused() {
    let out = run(&["--lean", "--user-stack", "dwarf", "-p", "1"]);
    assert_one_line_error(
        &out,
        "the argument '--lean' cannot be used with '--user-stack",
    );
}

#[test]
fn unwritable_output_is_refused_before_tracing() {
    let me = std::process::id().to_string();
    let out = run(&["-p", &me, "-o", "/nonexistent-mmapsem-dir/report.json"]);
    assert_one_line_error(&out, "cannot write /nonexistent-mmapsem-dir/report.json");
}

#[test]
fn not_enough_privilege_names_the_capabilities() {
    let me = std::process::id().to_string();
    let out = if unsafe { libc::geteuid() } == 0 {
        // Drop to nobody with no capabilities at all.
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .arg(tracer())
            .args(["-p", &me])
            .output()
            .expect("setpriv (util-linux) is needed to drop privileges")
    } else {
        run(&["-p", &me])
    };
    assert_one_line_error(
        &out,
        "not enough privilege: tracing needs CAP_BPF and CAP_PERFMON (or run as root)",
    );
}

#[test]
fn missing_tracepoint_is_named_with_its_kernel() {
    if !bpf_available("missing_tracepoint_is_named_with_its_kernel") {
        return;
    }
    let fake = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(fake.path().join("events/sched")).unwrap();
    let me = std::process::id().to_string();
    let out = Command::new(tracer())
        .env("MMAPSEM_TRACEFS", fake.path())
        .args(["-p", &me])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        "kernel lacks tracepoint mmap_lock:mmap_lock_start_locking (added in Linux 5.10",
    );
}

#[test]
fn out_of_range_map_sizes_are_usage_errors_naming_the_range() {
    for (flag, value) in [
        ("--max-entries", "0"),
        ("--max-entries", "4294967295"),
        ("--max-stacks", "0"),
        ("--user-stack-bytes", "1000000"),
    ] {
        let out = run(&["-p", "1", flag, value]);
        assert_one_line_error(&out, &format!("invalid value '{value}' for '{flag} <"));
        assert_one_line_error(&out, "is not in 1..=");
        assert_eq!(out.status.code(), Some(2), "a usage error");
    }
}

#[test]
fn absurd_durations_are_usage_errors() {
    for args in [
        ["-d", "NaN"],
        ["-d", "-1"],
        ["-d", "inf"],
        ["-d", "1e20"],
        ["-i", "1e30"],
    ] {
        let out = run(&["-p", "1", args[0], args[1]]);
        assert_one_line_error(&out, "10 years");
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
    }
    assert_one_line_error(&run(&["-p", "1", "-d=-1"]), "for '--duration <SECS>'");
}

#[test]
fn a_negative_pid_is_named_without_a_tip_to_run_it() {
    let out = run(&["-p", "-1"]);
    assert_one_line_error(&out, "invalid value '-1' for '--pid");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("'-- -1'"), "{stderr}");
}

#[test]
fn missing_target_names_every_way_to_give_one() {
    let out = run(&[]);
    assert_one_line_error(&out, "--pid");
    assert_one_line_error(&out, "--all");
    assert_one_line_error(&out, "CMD");
}

#[test]
fn usage_errors_point_to_help_once() {
    let out = run(&["-p", "x"]);
    assert_one_line_error(&out, "(see --help)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("--help").count(), 1, "{stderr}");
}

/// The command is forked before the programs load: its execve failing must end the run with
/// the shell's status and one line, not a report on the tracer's own forked copy.
#[test]
fn a_command_that_cannot_run_is_one_line_and_no_report() {
    if !bpf_available("a_command_that_cannot_run_is_one_line_and_no_report") {
        return;
    }
    let out = run(&["--no-live", "--", "/nonexistent-mmapsem-cmd"]);
    assert_one_line_error(
        &out,
        "cannot run /nonexistent-mmapsem-cmd: No such file or directory",
    );
    assert_eq!(out.status.code(), Some(127));
    assert!(out.stdout.is_empty(), "a report was printed");

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    let out = run(&["--no-live", "--", script.to_str().unwrap()]);
    assert_one_line_error(&out, "not-executable: Permission denied");
    assert_eq!(out.status.code(), Some(126));
    assert!(out.stdout.is_empty(), "a report was printed");
}
