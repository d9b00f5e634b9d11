//! Mode `spawn`: short-lived processes one after another (a shell loop, a build's compilers),
//! for system-wide tracing: each locks its new mm at exec and at exit, and is gone a moment
//! later.

use std::io::Write;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cli::SpawnArgs;
use crate::emit;

pub fn run(args: &SpawnArgs, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let pace = (args.per_second > 0).then(|| Duration::from_secs(1) / args.per_second);
    for index in 0..args.count {
        if let Some(pace) = pace {
            thread::sleep((started + pace * index).saturating_duration_since(Instant::now()));
        }
        let status = Command::new(&args.program)
            .status()
            .with_context(|| format!("running {}", args.program.display()))?;
        if !status.success() {
            bail!("{} exited with {status}", args.program.display());
        }
    }
    emit(
        out,
        format_args!(
            "processes={} elapsed_ns={}",
            args.count,
            started.elapsed().as_nanos()
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::protocol::{field, lines};

    #[test]
    fn spawn_runs_the_program_count_times_at_the_pace_asked() {
        let args = SpawnArgs {
            count: 5,
            per_second: 50,
            program: PathBuf::from("/bin/true"),
        };
        let mut output = Vec::new();
        run(&args, &mut output).expect("spawn runs");
        let lines = lines(&output);
        assert_eq!(field(&lines[0], "processes"), 5);
        // Four gaps of 20 ms at least.
        assert!(field(&lines[0], "elapsed_ns") >= 80_000_000, "{lines:?}");
    }

    #[test]
    fn spawn_fails_when_the_program_fails() {
        let args = SpawnArgs {
            count: 2,
            per_second: 0,
            program: PathBuf::from("/bin/false"),
        };
        let error = run(&args, &mut Vec::new()).expect_err("false fails");
        assert!(error.to_string().contains("/bin/false exited"), "{error}");
    }
}
