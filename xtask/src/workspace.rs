//! Building the workspace's default members (tracer, tracer-common, workload, xtask); the
//! eBPF crate is built by tracer's build.rs.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;

use anyhow::{bail, Context as _, Result};

use crate::cmd::Cmd;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Debug,
    Release,
}

/// Builds, relaying cargo's stderr, and fails if the nested eBPF build (tracer's build.rs
/// through aya-build) relayed its inner cargo's progress as warnings: a fresh build used to
/// show dozens of fake `warning: tracer@0.1.0: Compiling ...` lines, and build.rs keeps the
/// inner cargo quiet so that only real compiler warnings come through.
pub fn build(profile: Profile) -> Result<()> {
    let cmd = match profile {
        Profile::Debug => Cmd::cargo(&["build"]),
        Profile::Release => Cmd::cargo(&["build", "--release"]),
    };
    let mut child = cmd.spawn(Stdio::inherit(), Stdio::piped())?;
    let stderr = child.stderr.take().context("cargo's stderr")?;
    let mut relayed = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading cargo's stderr")?;
        eprintln!("{line}");
        if is_relayed_progress(&line) {
            relayed.push(line);
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("`{cmd}` failed: {status}");
    }
    if let Some(first) = relayed.first() {
        bail!(
            "the nested eBPF build relayed {} lines of its cargo's progress as warnings \
             (tracer/build.rs should keep it quiet), the first: {first}",
            relayed.len()
        );
    }
    Ok(())
}

/// A build script's `cargo:warning` that is only an inner cargo's progress line.
fn is_relayed_progress(line: &str) -> bool {
    const PROGRESS: [&str; 9] = [
        "Compiling",
        "Finished",
        "Running",
        "Fresh",
        "Downloading",
        "Downloaded",
        "Updating",
        "Locking",
        "Blocking",
    ];
    let Some(rest) = line.strip_prefix("warning: ") else {
        return false;
    };
    // `warning: <package>@<version>: <what the build script said>`
    let Some((package, said)) = rest.split_once(": ") else {
        return false;
    };
    package.contains('@')
        && said
            .split_whitespace()
            .next()
            .is_some_and(|word| PROGRESS.contains(&word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_progress_lines_are_told_from_real_warnings() {
        for progress in [
            "warning: tracer@0.1.0: Compiling core v0.0.0 (/root/.rustup/toolchains/x/lib)",
            "warning: tracer@0.1.0:    Compiling tracer-ebpf v0.1.0 (/work/main/tracer-ebpf)",
            "warning: tracer@0.1.0: Finished `release` profile [optimized] target(s) in 41.2s",
        ] {
            assert!(is_relayed_progress(progress), "{progress}");
        }
        for real in [
            "warning: tracer@0.1.0: warning: unused variable: `x`",
            "warning: unused import: `std::fs`",
            "warning: `tracer` (lib) generated 1 warning",
            "   Compiling tracer v0.1.0 (/work/main/tracer)",
        ] {
            assert!(!is_relayed_progress(real), "{real}");
        }
    }
}
