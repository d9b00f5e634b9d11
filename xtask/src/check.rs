//! `cargo xtask test`: the project's whole check, as CI runs it (`.ci/run`).

use anyhow::{bail, Result};

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
    // The integration tests run the binaries, so they must exist before `cargo test`.
    workspace::build(Profile::Debug)?;

    // fmt and clippy run even when tests fail, so one run reports every kind of problem.
    let failures: Vec<String> = [
        cargo_test(test_args),
        Cmd::cargo(&["fmt", "--all", "--", "--check"]),
        Cmd::cargo(&["clippy", "--all-targets", "--", "-D", "warnings"]),
    ]
    .iter()
    .filter_map(|cmd| cmd.run().err().map(|err| err.to_string()))
    .collect();

    if failures.is_empty() {
        eprintln!("xtask test: all passed");
        Ok(())
    } else {
        bail!("{}", failures.join("\n"))
    }
}

/// `cargo test` with the binaries the tests drive. Extra arguments go to the test harness
/// (`cargo xtask test -- --nocapture`), unless they contain their own `--`, in which case
/// they are cargo's (`cargo xtask test -- -p tracer -- --nocapture`).
fn cargo_test(test_args: &[String]) -> Cmd {
    let mut cmd = Cmd::cargo(&["test"])
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
    fn test_args_go_to_the_harness() {
        let cmd = cargo_test(&strings(&["--nocapture"]));
        assert_eq!(cmd.arguments(), ["test", "--", "--nocapture"]);
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
            ["test", "-p", "tracer", "--", "--nocapture"]
        );
        assert_eq!(cargo_test(&[]).arguments(), ["test"]);
    }
}
