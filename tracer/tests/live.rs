//! The live view in a real terminal: the tracer runs in a tmux pane against the bundled
//! workload, keys go in with `send-keys`, and the screen is read back with `capture-pane`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{bpf_available, screen::cut_values, serial, tracer, Workload};

/// A tmux server of the test's own (its own socket), killed with the test.
struct Pane {
    socket: String,
}

impl Pane {
    /// Starts `command` in a detached `width`x`height` pane; the pane stays after the command
    /// ends, with `tracer-exit=STATUS` printed under its last screen.
    fn start(test: &str, width: u16, height: u16, command: &str) -> Self {
        let socket = format!("mmapsem-{test}-{}", std::process::id());
        let pane = Self { socket };
        let shell = format!("{command}; echo tracer-exit=$?; sleep 600");
        pane.tmux(&[
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &shell,
        ]);
        pane
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("running tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p"])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", keys]);
    }

    /// Waits (generously: the programs load slowly on a loaded machine) until the screen
    /// shows `text`; returns that screen.
    fn wait_for(&self, text: &str, within: Duration) -> String {
        // Patience, not a measurement: an emulated machine redraws several times slower.
        let within = within * common::slowdown() as u32;
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                start.elapsed() < within,
                "{text:?} not on the screen after {within:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The tracer: the only child of the pane's shell.
    fn tracer_pid(&self) -> u32 {
        let shell = self.tmux(&["display-message", "-p", "#{pane_pid}"]);
        let shell = shell.trim();
        let children =
            std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
        children
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("no tracer under the pane's shell {shell}"))
            .parse()
            .unwrap()
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

/// True when tmux can run here; without it the tests fail under MMAPSEM_REQUIRE_BPF=1 (CI,
/// where `cargo xtask test` installs it) and are skipped otherwise.
fn tmux_available(test: &str) -> bool {
    if Command::new("tmux").arg("-V").output().is_ok() {
        return true;
    }
    if std::env::var("MMAPSEM_REQUIRE_BPF").as_deref() == Ok("1") {
        panic!("{test}: tmux required (MMAPSEM_REQUIRE_BPF=1) but not installed");
    }
    eprintln!("skipped {test}: tmux not installed");
    false
}

/// The churn workload, killed with the test (also when it fails).
struct Churn(Workload);

impl Drop for Churn {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// Runs long enough for the slowest test on an emulated machine (killed on drop anyway): on
/// 6.1 under TCG a 60 s churn ended before the reset test pressed its keys.
fn churn() -> Churn {
    let seconds = (60 * common::slowdown()).to_string();
    let workload = Workload::spawn(&["churn", "--threads", "4", "--seconds", &seconds]);
    workload.start();
    Churn(workload)
}

fn live_view(pid: u32, extra: &str) -> String {
    format!("{} -p {pid} {extra}", tracer())
}

const ATTACH_WITHIN: Duration = Duration::from_secs(90);

/// `q` ends the trace at once, not at the end of the refresh interval: with a 20 s interval,
/// the tracer is gone within 3 s of the key (before the interval's first numbers).
#[test]
fn q_exits_well_within_the_refresh_interval() {
    let test = "q_exits_well_within_the_refresh_interval";
    if !bpf_available(test) || !tmux_available(test) {
        return;
    }
    let _serial = serial();
    let workload = churn();
    // q pressed just after the start: a tracer that waited for the refresh would take a
    // minute. A quarter of that holds on a slow (emulated) machine, where the exit itself
    // takes seconds, and still tells the two apart.
    let pane = Pane::start("q", 160, 45, &live_view(workload.0.pid, "-i 60"));
    pane.wait_for("the first numbers come after one interval", ATTACH_WITHIN);
    let tracer = pane.tracer_pid();
    let pressed = Instant::now();
    pane.keys("q");
    while std::path::Path::new(&format!("/proc/{tracer}")).exists() {
        assert!(
            pressed.elapsed() < Duration::from_secs(15),
            "tracer still running 15 s after q:\n{}",
            pane.screen()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let exited_after = pressed.elapsed();
    let screen = pane.wait_for("tracer-exit=", Duration::from_secs(10));
    assert!(screen.contains("tracer-exit=0"), "{screen}");
    assert!(
        !screen.contains("refresh"),
        "the view's screen is gone after q:\n{screen}"
    );
    eprintln!("{test}: exited {exited_after:?} after q");
}

/// A terminal on stdout with no terminal to read keys from (a serial console, a service's
/// TTYPath: no controlling terminal, stdin elsewhere) gets the report, not a view that fails
/// once the programs are attached (it failed with ENXIO from /dev/tty).
#[test]
fn a_terminal_without_keys_gets_the_report_instead_of_the_view() {
    let test = "a_terminal_without_keys_gets_the_report_instead_of_the_view";
    if !bpf_available(test) || !tmux_available(test) {
        return;
    }
    let _serial = serial();
    let workload = churn();
    let command = format!(
        "setsid -w {} < /dev/null",
        live_view(workload.0.pid, "-d 2 -n 1")
    );
    let pane = Pane::start("nokeys", 160, 45, &command);
    pane.wait_for("tracer-exit=", ATTACH_WITHIN);
    let history = pane.tmux(&["capture-pane", "-p", "-S", "-"]);
    assert!(history.contains("tracer-exit=0"), "{history}");
    assert!(
        history.contains("waiting for mmap_lock:") && history.contains("acquired"),
        "no text report:\n{history}"
    );
}

/// A `human_ns` value back in nanoseconds.
fn ns(number: &str, unit: &str) -> f64 {
    let v: f64 = number.trim_start_matches('≤').parse().unwrap();
    v * match unit {
        "ns" => 1.0,
        "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => panic!("unit {other:?}"),
    }
}

/// The table's rows (the lines under its header up to the key line) as (count, [total, avg,
/// p99, max]) at a width that shows every column.
fn rows_of(screen: &str) -> Vec<(u64, Vec<f64>, String)> {
    let lines: Vec<&str> = screen.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains("kind") && l.contains("count"))
        .unwrap_or_else(|| panic!("no table header:\n{screen}"));
    let mut rows = Vec::new();
    for line in &lines[header + 1..] {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = tokens.iter().position(|t| t.parse::<u64>().is_ok()) else {
            continue;
        };
        let count = tokens[at].parse().unwrap();
        let times: Vec<f64> = (0..4)
            .map(|i| ns(tokens[at + 1 + 2 * i], tokens[at + 2 + 2 * i]))
            .collect();
        rows.push((count, times, line.to_string()));
    }
    rows
}

/// Reset then per-thread rows on the real workload: at 80x20 no number or unit is cut, and at
/// 160x45 no row's p99 or max exceeds its total (rows of one operation since the reset showed
/// a p99 of their histogram slot's top, above their total).
#[test]
fn after_reset_and_threads_values_stay_whole_and_bounded() {
    let test = "after_reset_and_threads_values_stay_whole_and_bounded";
    if !bpf_available(test) || !tmux_available(test) {
        return;
    }
    let _serial = serial();
    let workload = churn();
    let pane = Pane::start("reset", 80, 20, &live_view(workload.0.pid, "-i 1"));
    pane.wait_for("since start", ATTACH_WITHIN);
    // A few refreshes of data, then reset, per-thread rows, and refreshes after them.
    std::thread::sleep(Duration::from_secs(3));
    pane.keys("r");
    pane.keys("t");
    pane.wait_for("per thread, since reset", Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(3));
    let narrow = pane.screen();
    // The table's lines: the header lines above it are text cut at the edge, like top's.
    let table = narrow
        .lines()
        .skip_while(|l| !(l.contains("kind") && l.contains("total")));
    for line in table {
        assert!(
            cut_values(line).is_empty(),
            "cut at 80x20: {:?}\n{narrow}",
            cut_values(line)
        );
    }
    pane.tmux(&["resize-window", "-x", "160", "-y", "45"]);
    std::thread::sleep(Duration::from_secs(2));
    let wide = pane.wait_for("per thread, since reset", Duration::from_secs(10));
    let rows = rows_of(&wide);
    assert!(!rows.is_empty(), "no rows:\n{wide}");
    for (count, times, line) in &rows {
        let [total, _avg, p99, max] = times[..] else {
            unreachable!()
        };
        assert!(
            p99 <= max && max <= total,
            "p99 {p99} max {max} total {total} (count {count}): {line}\n{wide}"
        );
        if *count == 1 {
            assert!(!line.contains('≤'), "one operation, an exact max: {line}");
        }
    }
    pane.keys("q");
    pane.wait_for("tracer-exit=0", Duration::from_secs(30));
}

/// `-- CMD` with the live view: the command's output stays out of the view's screen (it reads
/// /dev/null and writes to a pipe) and is printed once the view has closed.
#[test]
fn a_commands_output_waits_until_the_live_view_closes() {
    let test = "a_commands_output_waits_until_the_live_view_closes";
    if !bpf_available(test) || !tmux_available(test) {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");
    let command = format!(
        "{} -i 0.2 -- sh -c 'echo marker-$((40 + 2)); sleep 4; echo marker-end' 2>{}",
        tracer(),
        stderr.display()
    );
    let pane = Pane::start(test, 100, 30, &command);
    let screen = pane.wait_for("refresh", ATTACH_WITHIN);
    std::thread::sleep(Duration::from_millis(1500));
    let during = pane.screen();
    assert!(
        !during.contains("marker-42") && !screen.contains("marker-42"),
        "the command wrote into the live view:\n{during}"
    );
    let after = pane.wait_for("tracer-exit=0", Duration::from_secs(60));
    assert!(!after.contains("marker-42"), "{after}");
    let written = std::fs::read_to_string(&stderr).unwrap();
    let output = written
        .split_once("the command's output while the live view ran:\n")
        .unwrap_or_else(|| panic!("no command output after the view: {written}"))
        .1;
    assert!(output.starts_with("marker-42\nmarker-end\n"), "{written}");
}

/// `q` ends the trace of a command that would run for minutes: the command is stopped
/// (SIGTERM), not waited for, and the tracer exits 0 (the user ended the trace on purpose).
#[test]
fn q_stops_a_command_that_outlives_the_trace() {
    let test = "q_stops_a_command_that_outlives_the_trace";
    if !bpf_available(test) || !tmux_available(test) {
        return;
    }
    let _serial = serial();
    let pane = Pane::start(test, 100, 30, &format!("{} -- sleep 600", tracer()));
    pane.wait_for("refresh", ATTACH_WITHIN);
    pane.keys("q");
    let screen = pane.wait_for("tracer-exit=", Duration::from_secs(30));
    assert!(screen.contains("tracer-exit=0"), "{screen}");
}
