//! Interval reports for pipes and logs (like klockstat -i): every interval, a timestamped text
//! report of that interval (--reset) or of the trace so far.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::collect::{Flow, Sink, Snapshot, Want, Watch, Windows};
use crate::model::Harvest;
use crate::present;

pub struct IntervalPrinter {
    windows: Windows,
    every: Duration,
    /// When the next report is due (set at the first tick).
    next: Option<Instant>,
    per_interval: bool,
    per_thread: bool,
    top: usize,
    printed: u64,
}

impl IntervalPrinter {
    pub fn new(
        windows: Windows,
        every: Duration,
        per_interval: bool,
        per_thread: bool,
        top: usize,
    ) -> Self {
        Self {
            windows,
            every,
            next: None,
            per_interval,
            per_thread,
            top,
            printed: 0,
        }
    }

    /// Prints the last, partial interval at `last` (so that nothing traced goes unreported;
    /// none after a failed print) and hands the windows back, with the print's outcome beside
    /// them: a failed print must not lose what the windows symbolized.
    pub fn finish(mut self, last: Option<Result<Harvest>>, watch: &Watch) -> (Windows, Result<()>) {
        let printed = match last {
            Some(harvest) => harvest.and_then(|harvest| self.print(harvest, watch)),
            None => Ok(()),
        };
        (self.windows, printed)
    }

    fn print(&mut self, harvest: Harvest, watch: &Watch) -> Result<()> {
        let snapshot = self.windows.advance(harvest, watch, self.per_thread);
        let report = if self.per_interval {
            &snapshot.interval
        } else {
            &snapshot.cumulative
        };
        self.printed += 1;
        let what = if self.per_interval {
            "this interval"
        } else {
            "since start"
        };
        let mut text = format!(
            "--- {}  report {} ({what}, {}) ---\n",
            local_timestamp(),
            self.printed,
            present::human_ns(report.duration_ns)
        );
        text.push_str(&present::text::render(report, self.top));
        text.push('\n');
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .context("writing interval report")
    }
}

impl Sink for IntervalPrinter {
    fn poll(&mut self, now: Instant) -> Want {
        let next = *self.next.get_or_insert(now + self.every);
        if now < next {
            return Want::Nothing;
        }
        self.next = Some(next + self.every);
        Want::Snapshot
    }

    fn show(&mut self, snapshot: Snapshot<'_>) -> Result<Flow> {
        self.print(snapshot.harvest, snapshot.watch)?;
        Ok(Flow::Continue)
    }
}

/// `YYYY-MM-DD HH:MM:SS` in local time.
fn local_timestamp() -> String {
    // SAFETY: time(NULL) and localtime_r with valid pointers to locals.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return format!("@{now}");
        }
        format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::Targets;

    #[test]
    fn reports_are_due_every_interval_by_the_loops_clock() {
        let windows = Windows::new(&Targets::Pids(vec![1]), "target", 0);
        let mut printer = IntervalPrinter::new(windows, Duration::from_secs(2), false, false, 5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(printer.poll(at(0)), Want::Nothing);
        assert_eq!(printer.poll(at(1_999)), Want::Nothing);
        // A tick late by half a second takes the report, without shifting the next one.
        assert_eq!(printer.poll(at(2_500)), Want::Snapshot);
        assert_eq!(printer.poll(at(2_600)), Want::Nothing);
        assert_eq!(printer.poll(at(3_999)), Want::Nothing);
        assert_eq!(printer.poll(at(4_000)), Want::Snapshot);
    }

    #[test]
    fn timestamp_shape() {
        let ts = super::local_timestamp();
        assert_eq!(ts.len(), 19, "{ts}");
        assert_eq!(&ts[4..5], "-");
        assert_eq!(&ts[13..14], ":");
    }
}
