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

    /// Waits for exit and returns the rest of stdout: every line up to end of file (the
    /// forwarding thread may still hold the last ones when the process has already exited).
    fn finish(mut self) -> Vec<String> {
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "workload exited with {status}");
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
