//! Helpers for the integration tests: the real tracer binary against the real workload, on the
//! real kernel.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub mod http;
pub mod pprof;
pub mod prometheus;
pub mod screen;

/// The tracer binary: $MMAPSEM_TRACER (`cargo xtask test` sets it to the release build inside
/// the emulated Debian kernels, where a debug build loads three times slower) or the one cargo
/// built beside these tests.
pub fn tracer() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        std::env::var("MMAPSEM_TRACER")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mmapsem-trace").to_string())
    })
}

/// How many times slower than a native run this machine is: $MMAPSEM_SLOWDOWN, which
/// `cargo xtask vm` sets in an emulated guest (default 1). Tests scale the durations of their
/// workloads by it where the tracer must still find them running after it has loaded.
pub fn slowdown() -> u64 {
    std::env::var("MMAPSEM_SLOWDOWN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// Compiles the C file `source` with the machine's gcc and `flags` into `output`.
#[allow(dead_code)] // Not every test file builds C.
pub fn compile_c(source: &std::path::Path, flags: &[&str], output: &std::path::Path) {
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(output)
        .arg(source)
        .status()
        .expect("running gcc");
    assert!(status.success(), "gcc failed on {}", source.display());
}

/// Compiles tests/nofp/NAME.c the way distributions build (optimized, no frame pointers) into
/// the test target's temporary directory; returns the program.
#[allow(dead_code)]
pub fn build_nofp(name: &str) -> PathBuf {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/nofp/{name}.c"));
    let binary = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nofp-{name}"));
    let flags = [
        "-O2",
        "-g",
        "-fomit-frame-pointer",
        "-fno-optimize-sibling-calls",
        "-pthread",
    ];
    compile_c(&source, &flags, &binary);
    binary
}

/// One trace at a time within a test binary: they share two CPUs, and some assertions want the
/// workload undisturbed by the others' programs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{text}"))
}

/// A JSON number that must be a u64.
pub fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

pub fn entries(report: &serde_json::Value) -> &Vec<serde_json::Value> {
    report["entries"].as_array().expect("entries array")
}

/// True when BPF tests can run here. Without it, with MMAPSEM_REQUIRE_BPF=1 (CI) the test
/// fails; otherwise it is skipped with the reason printed.
pub fn bpf_available(test: &str) -> bool {
    let reason = if unsafe { libc::geteuid() } != 0 {
        Some("not root".to_string())
    } else if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("no /sys/kernel/btf/vmlinux".to_string())
    } else {
        None
    };
    match reason {
        None => true,
        Some(why) if std::env::var("MMAPSEM_REQUIRE_BPF").as_deref() == Ok("1") => {
            panic!("{test}: BPF required (MMAPSEM_REQUIRE_BPF=1) but unavailable: {why}")
        }
        Some(why) => {
            eprintln!("skipped {test}: {why}");
            false
        }
    }
}

/// The workload binary: $MMAPSEM_WORKLOAD (set by `cargo xtask test`) or the one next to the
/// tracer in the same target directory.
pub fn workload_path() -> PathBuf {
    if let Some(path) = std::env::var_os("MMAPSEM_WORKLOAD") {
        return path.into();
    }
    let sibling = PathBuf::from(tracer()).with_file_name("mmapsem-workload");
    assert!(
        sibling.exists(),
        "{} missing: build it first (cargo build -p workload) or set MMAPSEM_WORKLOAD",
        sibling.display()
    );
    sibling
}

/// A workload process started idle (--wait-signal).
pub struct Workload {
    pub child: Child,
    pub pid: u32,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_from(&workload_path(), args)
    }

    /// Like `spawn`, but the map/unmap loops end early at `stop` (--until-stdin-closes): give
    /// --seconds for the slowest machine, and the test waits only as long as it needs.
    #[allow(dead_code)] // Not every test file stops its workload early.
    pub fn spawn_stoppable(args: &[&str]) -> Self {
        let mut command = Command::new(workload_path());
        command
            .args(["--wait-signal", "--until-stdin-closes"])
            .args(args)
            .stdin(Stdio::piped());
        Self::spawn_command(command)
    }

    /// Ends a `spawn_stoppable` workload's loops at their next iteration.
    #[allow(dead_code)]
    pub fn stop(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Runs the workload from a copy of its binary at `binary` (one the test then deletes, say).
    pub fn spawn_from(binary: &std::path::Path, args: &[&str]) -> Self {
        let mut command = Command::new(binary);
        command.arg("--wait-signal").args(args);
        Self::spawn_command(command)
    }

    /// Runs `command`, a program that keeps the workload's start protocol (`ready pid=N`, then
    /// the work at SIGUSR1): the bundled workload, or one of the tests' C programs
    /// (tests/nofp/gate.h).
    pub fn spawn_command(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("spawning {command:?}: {err}"));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .unwrap_or_else(|| panic!("unexpected first workload line {line:?}"))
            .parse()
            .unwrap();
        Self { child, pid, stdout }
    }

    /// The next line of its stdout (lines a mode prints before `started`).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    pub fn start(&self) {
        unsafe { libc::kill(self.pid as i32, libc::SIGUSR1) };
    }

    /// Waits for exit and returns the rest of stdout.
    pub fn finish(mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "workload failed: {status}\n{rest}");
        rest
    }
}

/// Reads `key=<u64>` from workload output.
pub fn value_of(output: &str, key: &str) -> u64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in workload output:\n{output}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `program` run as user nobody with exactly the capabilities `caps` (setpriv's syntax:
/// `+bpf,+perfmon`), as ambient capabilities (as `setcap` on the binary, or a systemd unit's
/// AmbientCapabilities, would give them), and no others even in its bounding set.
pub fn as_nobody(program: &std::path::Path, caps: &str) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps=-all,{caps}"),
            &format!("--ambient-caps={caps}"),
            &format!("--bounding-set=-all,{caps}"),
            "--",
        ])
        .arg(program);
    command
}

/// A running tracer whose stderr is watched for the "attached" line.
pub struct Tracer {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

pub struct TracerResult {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Tracer {
    pub fn spawn(args: &[String]) -> Self {
        let mut command = Command::new(tracer());
        command.args(args);
        Self::spawn_command(command)
    }

    /// Runs the tracer through another command line (setpriv ... -- mmapsem-trace ...).
    pub fn spawn_command(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tracer");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stderr_lines: rx,
            stderr_seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the tracer (SIGINT or SIGTERM end a trace with its report written).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
        // still ours.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    /// Blocks until the tracer says it is attached; panics with its stderr if it never does.
    pub fn wait_attached(&mut self) {
        self.wait_line("attached");
    }

    /// Blocks until the tracer prints a line containing `text` on stderr and returns it;
    /// panics with its stderr if it never does.
    pub fn wait_line(&mut self, text: &str) -> String {
        loop {
            // Not a speed bound: loading takes minutes under emulation (the Debian kernels
            // in CI run under TCG), and a tracer that never attaches still fails here.
            match self.stderr_lines.recv_timeout(Duration::from_secs(600)) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.stderr_seen.push(line.clone());
                    if found {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "tracer never said {text:?}; stderr:\n{}",
                        self.stderr_seen.join("\n")
                    );
                }
            }
        }
    }

    pub fn finish(mut self) -> TracerResult {
        let mut stdout = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        let status = self.child.wait().unwrap();
        // Every line up to the end of stderr: the reader thread may not have passed on the
        // last ones (the error a test looks for) when the child is reaped. The end comes once
        // every holder of the pipe has exited (a launched command may outlive the tracer a
        // moment), else after the wait.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => self.stderr_seen.push(line),
                Err(_) => break,
            }
        }
        TracerResult {
            status,
            stdout,
            stderr: self.stderr_seen.join("\n"),
        }
    }
}

/// A tracer still running when its test ends (a failed assertion before `finish`) is killed:
/// a daemon left behind would go on tracing the whole machine under every later test.
impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Traces a workload run from its first instruction of work to its exit; returns the tracer's
/// result (its report on stdout) and the workload's output.
pub fn trace_workload(workload_args: &[&str], tracer_args: &[&str]) -> (TracerResult, String) {
    let workload = Workload::spawn(workload_args);
    let mut args = vec!["-p".to_string(), workload.pid.to_string()];
    args.extend(tracer_args.iter().map(|s| s.to_string()));
    let mut tracer = Tracer::spawn(&args);
    tracer.wait_attached();
    workload.start();
    let workload_output = workload.finish();
    let result = tracer.finish();
    assert!(
        result.status.success(),
        "tracer failed: {}\nstderr:\n{}",
        result.status,
        result.stderr
    );
    (result, workload_output)
}

/// A churn run of a known size: 2 threads x 50 iterations, each mapping and unmapping.
pub const PERF_CHURN: [&str; 7] = [
    "churn",
    "--threads",
    "2",
    "--iterations",
    "50",
    "--map-size",
    "64K",
];

/// How many times `perf stat` saw mmap_lock_start_locking while PERF_CHURN ran under it
/// (`cargo xtask test` installs perf; a missing perf fails the test).
pub fn perf_counted_start_locking() -> u64 {
    let output = Command::new("perf")
        .args([
            "stat",
            "-x,",
            "-e",
            "mmap_lock:mmap_lock_start_locking",
            "--",
        ])
        .arg(workload_path())
        .args(PERF_CHURN)
        .stdout(Stdio::null())
        .output()
        .expect("running perf (Debian's linux-perf)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "perf stat failed: {stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("mmap_lock:mmap_lock_start_locking"))
        .unwrap_or_else(|| panic!("no count in perf's output: {stderr}"));
    let count = line.split(',').next().unwrap_or_default();
    count
        .parse()
        .unwrap_or_else(|_| panic!("perf counted nothing: {line}"))
}
