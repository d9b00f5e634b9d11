//! The process-level protocol the tracer's tests rely on: `ready pid=<pid>` first, the start
//! gates (SIGUSR1, start delay), `started`, the summary and the exit status.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_mmapsem-workload");
const PATIENCE: Duration = Duration::from_secs(20);

/// A running workload whose stdout lines arrive on a channel as they are printed.
struct Workload {
    child: Child,
    lines: Receiver<String>,
}

impl Workload {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(WORKLOAD)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mmapsem-workload");
        let stdout = child.stdout.take().expect("piped stdout");
        Self {
            child,
            lines: forward_lines(stdout),
        }
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .expect("a line from the workload")
    }

    fn expect_silence_for(&self, quiet: Duration) {
        match self.lines.recv_timeout(quiet) {
            Err(RecvTimeoutError::Timeout) => {}
            other => panic!("expected no output for {quiet:?}, got {other:?}"),
        }
    }

    fn expect_ready(&self) {
        assert_eq!(self.next_line(), format!("ready pid={}", self.child.id()));
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill has no memory-safety preconditions; the child is ours and not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid})");
    }

    /// Waits for exit and returns the rest of stdout.
    fn finish(mut self) -> Vec<String> {
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "workload exited with {status}");
        // Until the forwarding thread has seen end-of-file: at exit the last lines may still be
        // in the pipe or in that thread.
        self.lines.iter().collect()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // Best effort for failing tests; after a successful wait() this is a no-op error.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward_lines(stdout: ChildStdout) -> Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

fn field(line: &str, key: &str) -> u64 {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no `{key}=` in `{line}`"))
        .parse()
        .expect("a number")
}

#[test]
fn ready_comes_first_then_started_then_the_summary() {
    let workload = Workload::start(&["idle", "--seconds", "0.05", "--threads", "1"]);
    workload.expect_ready();
    assert_eq!(workload.next_line(), "started");
    let rest = workload.finish();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(field(&rest[0], "threads"), 1);
}

#[test]
fn wait_signal_holds_the_work_until_sigusr1() {
    let workload = Workload::start(&[
        "--wait-signal",
        "churn",
        "--iterations",
        "1",
        "--threads",
        "2",
        "--map-size",
        "64K",
    ]);
    workload.expect_ready();
    workload.expect_silence_for(Duration::from_millis(300));
    workload.signal(libc::SIGUSR1);
    assert_eq!(workload.next_line(), "started");
    let rest = workload.finish();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(field(&rest[0], "iterations"), 2);
}

#[test]
fn a_signal_sent_right_after_ready_is_not_lost() {
    let workload = Workload::start(&["--wait-signal", "idle", "--seconds", "0"]);
    workload.expect_ready();
    workload.signal(libc::SIGUSR1);
    assert_eq!(workload.next_line(), "started");
    workload.finish();
}

#[test]
fn start_delay_runs_after_the_signal() {
    let workload = Workload::start(&[
        "--wait-signal",
        "--start-delay",
        "0.3",
        "idle",
        "--seconds",
        "0",
    ]);
    workload.expect_ready();
    workload.expect_silence_for(Duration::from_millis(200));
    let signalled = Instant::now();
    workload.signal(libc::SIGUSR1);
    assert_eq!(workload.next_line(), "started");
    let waited = signalled.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    workload.finish();
}

#[test]
fn a_failing_syscall_exits_nonzero_naming_the_call() {
    // 2^62 bytes: more address space than user space has, so mmap() fails with ENOMEM.
    let output = Command::new(WORKLOAD)
        .args(["churn", "--iterations", "1", "--threads", "1"])
        .args(["--map-size", "4294967296G"])
        .output()
        .expect("run mmapsem-workload");
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("ready pid="), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mmap("), "{stderr}");
    assert!(stderr.contains("os error 12"), "{stderr}");
}

/// The names (comm) of the process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_owned())
        .collect()
}

/// Waits until the workload has threads with all of `names` at once.
fn expect_threads(workload: &Workload, names: &[&str]) {
    let give_up = Instant::now() + PATIENCE;
    loop {
        let seen = thread_names(workload.child.id());
        if names
            .iter()
            .all(|name| seen.iter().any(|comm| comm == name))
        {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "threads {names:?} never seen, last {seen:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// The text after `key=` up to the next space.
fn text_field<'line>(line: &'line str, key: &str) -> &'line str {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no `{key}=` in `{line}`"))
}

#[test]
fn churn_hogs_run_as_named_threads_and_are_reported() {
    let workload = Workload::start(&[
        "churn",
        "--seconds",
        "1",
        "--threads",
        "1",
        "--map-size",
        "64K",
        "--hogs",
        "2",
    ]);
    workload.expect_ready();
    assert_eq!(workload.next_line(), "started");
    expect_threads(&workload, &["churn-0", "hog-0", "hog-1"]);
    let rest = workload.finish();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(rest[0].starts_with("iterations="), "{rest:?}");
    assert!(rest[0].ends_with(" hogs=2"), "{rest:?}");
    field(&rest[0], "elapsed_ns");
}

#[test]
fn hold_readers_count_their_calls_before_the_longest_hold() {
    let workload = Workload::start(&[
        "hold",
        "--size-mib",
        "8",
        "--repeat",
        "2",
        "--gap-ms",
        "300",
        "--readers",
        "2",
    ]);
    workload.expect_ready();
    assert_eq!(workload.next_line(), "started");
    expect_threads(&workload, &["reader-0", "reader-1"]);
    let rest = workload.finish();
    assert_eq!(rest.len(), 5, "{rest:?}");
    assert!(rest[0].starts_with("populated "), "{rest:?}");
    assert!(rest[1].starts_with("mprotect_ns="), "{rest:?}");
    assert!(rest[2].starts_with("mprotect_ns="), "{rest:?}");
    assert!(rest[3].starts_with("reader_calls="), "{rest:?}");
    assert!(field(&rest[3], "reader_calls") > 0, "{rest:?}");
    assert!(rest[4].starts_with("max_mprotect_ns="), "{rest:?}");
}

#[test]
fn files_reads_with_both_methods_and_cleans_up() {
    for method in ["pread", "mmap"] {
        let dir = std::env::temp_dir().join(format!(
            "mmapsem-process-test-{}-{method}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).expect("test directory");
        let output = Command::new(WORKLOAD)
            .args([
                "files",
                "--method",
                method,
                "--threads",
                "2",
                "--files",
                "3",
            ])
            .args(["--file-size", "256K", "--seconds", "0.2", "--dir"])
            .arg(&dir)
            .output()
            .expect("run mmapsem-workload");
        let left = std::fs::read_dir(&dir).expect("list").count();
        std::fs::remove_dir(&dir).expect("test directory is empty again");
        assert!(output.status.success(), "{output:?}");
        assert_eq!(left, 0);

        let stdout = String::from_utf8(output.stdout).expect("UTF-8");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[1], "started");
        let files_read = field(lines[2], "files_read");
        assert!(files_read > 0, "{lines:?}");
        assert_eq!(field(lines[2], "bytes"), files_read * 256 * 1024);
        field(lines[2], "elapsed_ns");
        assert_eq!(text_field(lines[2], "method"), method);
    }
}

/// How many files the one subdirectory of `dir` holds (0 before it exists).
fn files_in_subdirectory(dir: &std::path::Path) -> usize {
    let Some(Ok(subdirectory)) = std::fs::read_dir(dir).expect("list").next() else {
        return 0;
    };
    std::fs::read_dir(subdirectory.path()).map_or(0, Iterator::count)
}

#[test]
fn files_of_a_size_range_are_made_before_started_and_read_at_their_sizes() {
    let dir =
        std::env::temp_dir().join(format!("mmapsem-process-test-{}-range", std::process::id()));
    std::fs::create_dir(&dir).expect("test directory");
    let dir_arg = dir.display().to_string();
    let workload = Workload::start(&[
        "--wait-signal",
        "files",
        "--method",
        "mmap",
        "--threads",
        "4",
        "--files",
        "2000",
        "--file-size",
        "1K-16K",
        "--seconds",
        "0.3",
        "--dir",
        &dir_arg,
    ]);
    workload.expect_ready();
    // The files are made while the workload waits for its signal, not after `started`.
    let give_up = Instant::now() + PATIENCE;
    while files_in_subdirectory(&dir) < 2000 {
        assert!(Instant::now() < give_up, "the 2000 files never appeared");
        thread::sleep(Duration::from_millis(10));
    }
    workload.expect_silence_for(Duration::from_millis(100));
    workload.signal(libc::SIGUSR1);
    assert_eq!(workload.next_line(), "started");
    let rest = workload.finish();
    let left = std::fs::read_dir(&dir).expect("list").count();
    std::fs::remove_dir(&dir).expect("test directory is empty again");
    assert_eq!(left, 0);
    assert_eq!(rest.len(), 1, "{rest:?}");
    let files_read = field(&rest[0], "files_read");
    let bytes = field(&rest[0], "bytes");
    assert!(files_read > 0, "{rest:?}");
    assert!(
        (files_read * 1024..=files_read * 16 * 1024).contains(&bytes),
        "{rest:?}"
    );
    assert_eq!(text_field(&rest[0], "method"), "mmap");
}

#[test]
fn proc_mem_read_reads_a_live_filemap_target() {
    let target = Workload::start(&[
        "--wait-signal",
        "filemap",
        "--file-size",
        "1M",
        "--threads",
        "2",
        "--seconds",
        "0.5",
        "--map-size",
        "64K",
    ]);
    target.expect_ready();
    // Printed before the start gate, so the reader can be aimed while the target waits.
    let mapped = target.next_line();
    assert!(mapped.starts_with("mapped addr=0x"), "{mapped}");
    assert_eq!(field(&mapped, "len"), 1 << 20);
    let file = mapped
        .split_once(" file=")
        .expect("file field")
        .1
        .to_owned();
    assert!(std::path::Path::new(&file).exists(), "{file}");

    let pid = target.child.id().to_string();
    let output = Command::new(WORKLOAD)
        .args([
            "proc-mem-read",
            "--pid",
            &pid,
            "--len",
            "1M",
            "--file",
            &file,
        ])
        .args(["--addr", text_field(&mapped, "addr")])
        .args(["--rounds", "2", "--chunk", "256K"])
        .output()
        .expect("run proc-mem-read");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert!(lines[0].starts_with("ready pid="), "{lines:?}");
    assert_eq!(lines[1], "started");
    for round in &lines[2..4] {
        assert!(field(round, "round_ns") > 0, "{lines:?}");
    }
    assert_eq!(field(lines[4], "rounds"), 2);
    assert_eq!(field(lines[4], "bytes"), 2 << 20);

    target.signal(libc::SIGUSR1);
    assert_eq!(target.next_line(), "started");
    expect_threads(&target, &["mapper-0", "mapper-1"]);
    let rest = target.finish();
    assert_eq!(rest.len(), 1, "{rest:?}");
    field(&rest[0], "iterations");
    field(&rest[0], "elapsed_ns");
    assert!(
        !std::path::Path::new(&file).exists(),
        "{file} is left behind"
    );
}

#[test]
fn proc_mem_read_of_a_missing_process_fails_naming_the_call() {
    let output = Command::new(WORKLOAD)
        .args(["proc-mem-read", "--pid", "2147483647", "--addr", "0x1000"])
        .args(["--len", "4K", "--file", "/dev/null"])
        .output()
        .expect("run mmapsem-workload");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("pidfd_open(2147483647)"), "{stderr}");
    assert!(stderr.contains("os error 3"), "{stderr}");
}
