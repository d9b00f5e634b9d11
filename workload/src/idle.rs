//! Mode `idle`: a process with a few threads that only sleep, so the tracer has a live target
//! with no mmap_lock traffic (useful for error paths and for an empty report).

use std::io::Write;
use std::thread;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

use crate::cli::IdleArgs;
use crate::emit;

pub fn run(args: &IdleArgs, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let deadline = started + args.seconds;
    thread::scope(|scope| {
        let sleepers = (0..args.threads)
            .map(|index| {
                thread::Builder::new()
                    .name(format!("idle-{index}"))
                    .spawn_scoped(scope, move || idle_sleeper(deadline))
                    .with_context(|| format!("spawning thread idle-{index}"))
            })
            .collect::<Result<Vec<_>>>()?;
        idle_sleeper(deadline);
        for sleeper in sleepers {
            sleeper
                .join()
                .map_err(|_| anyhow!("an idle thread panicked"))?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    emit(
        out,
        format_args!(
            "threads={} elapsed_ns={}",
            args.threads,
            started.elapsed().as_nanos()
        ),
    )
}

/// Sleeps until `deadline`.
#[inline(never)]
fn idle_sleeper(deadline: Instant) {
    thread::sleep(deadline.saturating_duration_since(Instant::now()));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::{field, lines};

    #[test]
    fn idle_sleeps_for_the_given_time() {
        let args = IdleArgs {
            seconds: Duration::from_millis(100),
            threads: 2,
        };
        let mut output = Vec::new();
        run(&args, &mut output).expect("idle runs");
        let lines = lines(&output);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(field(&lines[0], "threads"), 2);
        let elapsed = field(&lines[0], "elapsed_ns");
        assert!((100_000_000..2_000_000_000).contains(&elapsed), "{elapsed}");
    }
}
