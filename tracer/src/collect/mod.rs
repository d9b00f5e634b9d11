//! The collect layer: one trace session (`session`) runs the loop while the programs trace,
//! samples what /proc says about the traced processes (`watch`), drains the timeline and the
//! stack copies, and shows whoever shows the trace while it runs (the live view, the interval
//! printer, the daemon) the windows they ask for (`windows`); it ends on the duration, a
//! signal, the targets' exit, or the view's quit, with the report of the whole trace.
//!
//! The loop owns the clock and reads the kernel side through a `Source` (the probes, or a fake
//! in the session's tests); a `Sink` says at each tick what it wants and is shown pure data,
//! reports of the windows it asked for: it never touches the probes, the watch or the windows.

mod session;
mod watch;
mod windows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::Notify;

use crate::model::{LiveSnapshot, Report};
pub use crate::probes::source::Source;
pub use session::{Ending, FinalTrace, Session, SessionSettings};
pub use windows::{report_between, Forgetting, Mark, Split, WindowId};

/// How often liveness and thread counts are sampled, the timeline drained and the view asked
/// whether to stop.
const TICK: Duration = Duration::from_millis(100);
/// How often executable mappings and thread names are re-read (reading /proc/PID/maps takes
/// the target's lock).
const MAPPINGS_EVERY: Duration = Duration::from_secs(1);
/// How often the mapping lists and unwinders of processes that exited are let go (those whose
/// stacks the collected data refers to are kept, to be symbolized at the end).
const FORGET_DEAD_EVERY: Duration = Duration::from_secs(10);
/// How often, at most, a session that forgets the gone reads the maps to let go of processes
/// that exited (see `Session::forget_if_due`).
const FORGET_GONE_EVERY: Duration = Duration::from_millis(250);

/// Whether the loop goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// What a sink wants of a tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    Nothing,
    /// A snapshot, made into what the ask says and handed to `Sink::show`.
    Snapshot(Ask),
    /// The end of the trace (the view's quit).
    Stop,
}

/// What a sink asks of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// Keep the targets' threads apart in its reports.
    pub per_thread: bool,
    /// Once shown, the cumulative window starts at this snapshot.
    pub reset: bool,
    /// How many windows to open at this snapshot (each closes with `close`).
    pub open: usize,
    /// The windows to close at this snapshot, each shown as the report of what happened in it.
    pub close: Vec<WindowId>,
}

/// What a sink is shown: the reports of the windows it asked for, and when the loop took the
/// snapshot (sinks keep their cadence by the loop's clock, not their own).
pub struct Shown {
    pub at: Instant,
    /// The last interval and the whole trace (or since the last reset).
    pub live: LiveSnapshot,
    /// The windows opened, in the order asked.
    pub opened: Vec<WindowId>,
    /// The windows closed, each with its report.
    pub closed: Vec<(WindowId, Report)>,
}

/// Something that shows the trace while it runs. Every tick the loop asks it what it wants
/// (`poll`: it takes in its own inputs, keys or requests, and keeps its own cadence by the
/// time it is given) and shows it the snapshot it asked for.
pub trait Sink {
    fn poll(&mut self, now: Instant) -> Want;

    /// Shows the snapshot asked for by the last `poll`.
    fn show(&mut self, shown: Shown) -> Result<Flow>;

    /// Notified when the sink wants its next tick now rather than at the next TICK (the live
    /// view's `q`: waiting for the tick added up to 100 ms to the exit).
    fn wakeup(&self) -> Option<Arc<Notify>> {
        None
    }

    /// What it wants of a last snapshot once the trace has ended (the interval printer's last,
    /// partial interval), if anything.
    fn at_end(&self) -> Option<Ask> {
        None
    }
}

/// Shows nothing (a single report at the end).
pub struct NoSink;

impl Sink for NoSink {
    fn poll(&mut self, _: Instant) -> Want {
        Want::Nothing
    }

    fn show(&mut self, _: Shown) -> Result<Flow> {
        Ok(Flow::Continue)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// These processes (-p, or a launched command); the trace ends when all have exited.
    Pids(Vec<u32>),
    /// Every user process (-a), as the programs register them.
    SystemWide,
}

impl Targets {
    /// The pids given on the command line (none system-wide).
    pub fn listed(&self) -> &[u32] {
        match self {
            Targets::Pids(pids) => pids,
            Targets::SystemWide => &[],
        }
    }

    pub fn is_system_wide(&self) -> bool {
        matches!(self, Targets::SystemWide)
    }
}

/// The signals that end a trace. Installed before the programs load, so that one arriving
/// while they load ends the trace as soon as it starts (with its report) instead of killing
/// the tracer; after the trace, a second one ends the tracer at once.
pub struct Stops {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Stops {
    /// Needs the tokio runtime entered (`Runtime::enter`).
    pub fn install() -> Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            hangup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
        })
    }

    /// The next of them to arrive (or that arrived since `install`).
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// The instant `secs` after `start`, or None when it is too far to represent (the command
/// line refuses such durations; this keeps the loop from panicking whatever it is given).
fn deadline_after(start: Instant, secs: f64) -> Option<Instant> {
    if secs <= 0.0 {
        return Some(start);
    }
    start.checked_add(Duration::try_from_secs_f64(secs).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_have_no_deadline_rather_than_a_panic() {
        let start = Instant::now();
        assert_eq!(
            deadline_after(start, 1.5),
            Some(start + Duration::from_millis(1500))
        );
        assert_eq!(deadline_after(start, -1.0), Some(start));
        for secs in [f64::INFINITY, 1e20, f64::NAN] {
            assert_eq!(deadline_after(start, secs), None, "{secs}");
        }
    }
}
