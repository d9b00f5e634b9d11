//! `cargo xtask test`: the project's whole check, as CI runs it (`.ci/run`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;

use anyhow::{bail, Context as _, Result};

use crate::cmd::Cmd;
use crate::paths;
use crate::setup::{self, Tracefs};
use crate::workspace::{self, Profile};

pub fn run(test_args: &[String]) -> Result<()> {
    setup::run(setup::Options {
        dry_run: false,
        // Unit tests run without root; tests that need eBPF decide themselves (and fail
        // under MMAPSEM_REQUIRE_BPF=1) when they cannot attach.
        tracefs: Tracefs::WarnIfNotRoot,
    })?;
    setup::for_tests()?;
    // The integration tests run the binaries, so they must exist before `cargo test`.
    workspace::build(Profile::Debug)?;

    // fmt and clippy run even when tests fail, so one run reports every kind of problem.
    let mut tally = Tally::default();
    let mut failures: Vec<String> = Vec::new();
    if let Err(err) = run_tallied(&cargo_test(test_args), &mut tally) {
        failures.push(err.to_string());
    }
    for cmd in [
        Cmd::cargo(&["fmt", "--all", "--", "--check"]),
        Cmd::cargo(&["clippy", "--all-targets", "--", "-D", "warnings"]),
    ] {
        if let Err(err) = cmd.run() {
            failures.push(err.to_string());
        }
    }

    // One closing line over every test binary, so that a reader (or CI) need not add up the
    // per-binary `test result:` lines, the last of which is often an empty doc-test run.
    println!("tests: {} passed, {} failed", tally.passed, tally.failed);
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("{}", failures.join("\n"))
    }
}

/// Sums of cargo test's `test result:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    passed: u64,
    failed: u64,
}

impl Tally {
    /// Adds `test result: ok. 34 passed; 0 failed; 0 ignored; ...`; other lines are ignored.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                _ => {}
            }
        }
    }
}

/// Runs `cmd` passing its stdout through while counting its test results.
fn run_tallied(cmd: &Cmd, tally: &mut Tally) -> Result<()> {
    let mut child = cmd.spawn(Stdio::piped(), Stdio::inherit())?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        tally.add_line(&line);
        writeln!(out, "{line}")?;
    }
    drop(out);
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{cmd}`"))?;
    if !status.success() {
        bail!("`{cmd}` failed: {status}");
    }
    Ok(())
}

/// `cargo test` with the binaries the tests drive. Extra arguments go to the test harness
/// (`cargo xtask test -- --nocapture`), unless they contain their own `--`, in which case
/// they are cargo's (`cargo xtask test -- -p tracer -- --nocapture`).
fn cargo_test(test_args: &[String]) -> Cmd {
    // --no-fail-fast: a failing test binary must not hide the results of the others.
    let mut cmd = Cmd::cargo(&["test", "--no-fail-fast"])
        .env("MMAPSEM_WORKLOAD", binary("mmapsem-workload"))
        .env("MMAPSEM_TRACER", binary("mmapsem-trace"));
    if !test_args.is_empty() && !test_args.iter().any(|arg| arg == "--") {
        cmd = cmd.arg("--");
    }
    cmd.args(test_args)
}

fn binary(name: &str) -> String {
    paths::binary("debug", name).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn tally_sums_test_result_lines() {
        let mut tally = Tally::default();
        tally.add_line("test result: ok. 34 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.11s");
        tally.add_line(
            "test result: FAILED. 3 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out",
        );
        tally.add_line("test foo ... ok");
        tally.add_line("running 5 tests");
        assert_eq!(
            tally,
            Tally {
                passed: 37,
                failed: 2
            }
        );
    }

    #[test]
    fn test_args_go_to_the_harness() {
        let cmd = cargo_test(&strings(&["--nocapture"]));
        assert_eq!(
            cmd.arguments(),
            ["test", "--no-fail-fast", "--", "--nocapture"]
        );
        assert!(cmd
            .env_value("MMAPSEM_TRACER")
            .is_some_and(|path| path.ends_with("/debug/mmapsem-trace")));
        assert!(cmd
            .env_value("MMAPSEM_WORKLOAD")
            .is_some_and(|path| path.ends_with("/debug/mmapsem-workload")));
    }

    #[test]
    fn test_args_with_separator_go_to_cargo() {
        let cmd = cargo_test(&strings(&["-p", "tracer", "--", "--nocapture"]));
        assert_eq!(
            cmd.arguments(),
            [
                "test",
                "--no-fail-fast",
                "-p",
                "tracer",
                "--",
                "--nocapture"
            ]
        );
        assert_eq!(cargo_test(&[]).arguments(), ["test", "--no-fail-fast"]);
    }
}
