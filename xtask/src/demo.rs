//! `cargo xtask demo`: traces the contention workload end to end. The workload waits for
//! SIGUSR1 so that the tracer is attached before the first lock is taken.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cmd::Cmd;
use crate::parse;
use crate::paths;
use crate::setup;

/// Loading and attaching takes a few seconds (BTF parsing, verifier); a minute means stuck.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// The tracer prints its report and exits as soon as the target exits.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(seconds: u32, build: bool) -> Result<()> {
    setup::for_tracing("demo", build)?;
    let seconds = seconds.to_string();
    let (mut workload, workload_stdout, pid) =
        spawn_held_workload(&["churn", "--threads", "4", "--writer", "--seconds", &seconds])?;

    // --no-live: the demo prints the final report even when its stdout is a terminal (where
    // the tracer would otherwise open its live view).
    let tracer_cmd =
        Cmd::new(&binary("mmapsem-trace")).args(&["-p", &pid.to_string(), "--no-live"]);
    let mut tracer = Guarded::new(
        "mmapsem-trace",
        tracer_cmd.spawn(Stdio::inherit(), Stdio::piped())?,
    );
    let tracer_stderr = tracer
        .child
        .stderr
        .take()
        .context("tracer stderr was not piped")?;
    let (events, attached) = mpsc::channel();
    let forwarder = thread::spawn(move || forward_tracer_stderr(tracer_stderr, &events));

    wait_until_attached(&attached, &mut tracer)?;
    Cmd::new("kill").args(&["-USR1", &pid.to_string()]).run()?;

    for line in lines(workload_stdout) {
        println!("workload: {line}");
    }
    let workload_status = workload.wait()?;
    let tracer_status = tracer.wait_for(REPORT_TIMEOUT)?;
    // The pipe closes when the tracer exits, so this ends promptly.
    let _ = forwarder.join();
    check_exits(workload_status, tracer_status)
}

fn binary(name: &str) -> String {
    paths::binary("release", name).display().to_string()
}

/// The release workload started with `--wait-signal` and `args`: it waits for SIGUSR1 so that
/// a tracer can attach first. Returns it, its stdout after the `ready pid=` line, and its pid.
pub fn spawn_held_workload(args: &[&str]) -> Result<(Guarded, BufReader<ChildStdout>, u32)> {
    let cmd = Cmd::new(&binary("mmapsem-workload"))
        .arg("--wait-signal")
        .args(args);
    let mut workload = Guarded::new(
        "mmapsem-workload",
        cmd.spawn(Stdio::piped(), Stdio::inherit())?,
    );
    let mut stdout = BufReader::new(
        workload
            .child
            .stdout
            .take()
            .context("workload stdout was not piped")?,
    );
    let pid = read_ready_pid(&mut stdout)?;
    Ok((workload, stdout, pid))
}

pub fn read_ready_pid(workload_stdout: &mut impl BufRead) -> Result<u32> {
    let mut line = String::new();
    workload_stdout
        .read_line(&mut line)
        .context("reading the workload's first line")?;
    parse::ready_pid(&line).with_context(|| {
        format!(
            "the workload's first line should be `ready pid=<pid>`, got {:?}",
            line.trim_end()
        )
    })
}

enum TracerEvent {
    Attached,
    Closed,
}

/// Copies the tracer's stderr to ours line by line and says when it reports `attached`.
fn forward_tracer_stderr(stderr: impl Read, events: &Sender<TracerEvent>) {
    let mut told = false;
    for line in lines(BufReader::new(stderr)) {
        eprintln!("{line}");
        if !told && line.contains("attached") {
            told = true;
            let _ = events.send(TracerEvent::Attached);
        }
    }
    let _ = events.send(TracerEvent::Closed);
}

fn wait_until_attached(events: &Receiver<TracerEvent>, tracer: &mut Guarded) -> Result<()> {
    match events.recv_timeout(ATTACH_TIMEOUT) {
        Ok(TracerEvent::Attached) => Ok(()),
        Ok(TracerEvent::Closed) | Err(RecvTimeoutError::Disconnected) => {
            let status = tracer.wait_for(REPORT_TIMEOUT)?;
            bail!("mmapsem-trace ended before it attached ({status})")
        }
        Err(RecvTimeoutError::Timeout) => bail!(
            "mmapsem-trace did not report `attached` within {}s",
            ATTACH_TIMEOUT.as_secs()
        ),
    }
}

/// Lines of a child's output; invalid UTF-8 is replaced rather than ending the stream.
pub fn lines(mut reader: impl BufRead) -> impl Iterator<Item = String> {
    std::iter::from_fn(move || {
        let mut bytes = Vec::new();
        match reader.read_until(b'\n', &mut bytes) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(String::from_utf8_lossy(&bytes).trim_end().to_owned()),
        }
    })
}

fn check_exits(workload: ExitStatus, tracer: ExitStatus) -> Result<()> {
    let mut failures = Vec::new();
    if !workload.success() {
        failures.push(format!("mmapsem-workload failed ({workload})"));
    }
    if !tracer.success() {
        failures.push(format!("mmapsem-trace failed ({tracer})"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("{}", failures.join("; "))
    }
}

/// A child that is killed when the demo fails early, so a workload waiting for its signal is
/// never left behind.
pub struct Guarded {
    pub name: &'static str,
    pub child: Child,
    reaped: bool,
}

impl Guarded {
    pub fn new(name: &'static str, child: Child) -> Self {
        Self {
            name,
            child,
            reaped: false,
        }
    }

    pub fn wait(&mut self) -> Result<ExitStatus> {
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        self.reaped = true;
        Ok(status)
    }

    /// Waits at most `timeout`, then kills the child and fails.
    pub fn wait_for(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .with_context(|| format!("waiting for {}", self.name))?
            {
                self.reaped = true;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not exit within {}s; killed it",
                    self.name,
                    timeout.as_secs()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_gives_pid() {
        let mut out = "ready pid=31337\nstarted\n".as_bytes();
        assert_eq!(read_ready_pid(&mut out).unwrap(), 31337);
    }

    #[test]
    fn missing_ready_line_is_an_error() {
        let mut out = "".as_bytes();
        assert!(read_ready_pid(&mut out).is_err());
        let mut out = "started\n".as_bytes();
        let err = read_ready_pid(&mut out).unwrap_err().to_string();
        assert!(err.contains("\"started\""), "{err}");
    }

    #[test]
    fn forwarder_reports_attached_once_then_closed() {
        let stderr = "loading\nattached to pid 7\nattached again\n".as_bytes();
        let (events, received) = mpsc::channel();
        forward_tracer_stderr(stderr, &events);
        let got: Vec<bool> = received
            .try_iter()
            .map(|event| matches!(event, TracerEvent::Attached))
            .collect();
        assert_eq!(got, [true, false]);
    }

    #[test]
    fn lines_survive_invalid_utf8() {
        let collected: Vec<String> = lines(&b"a\xff\nb"[..]).collect();
        assert_eq!(collected, ["a\u{fffd}", "b"]);
    }

    #[test]
    fn guarded_child_is_killed_on_timeout() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut guarded = Guarded::new("sleep", child);
        let err = guarded.wait_for(Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("did not exit"));
        // Drop kills and reaps it.
    }
}
