//! Interval reports for pipes and logs (like klockstat -i): every interval, a timestamped text
//! report of that interval (--reset) or of the trace so far.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::collect::{Ask, Flow, Shown, Sink, Want};
use crate::model::LiveSnapshot;
use crate::present;

pub struct IntervalPrinter {
    every: Duration,
    /// When the next report is due (set at the first tick).
    next: Option<Instant>,
    per_interval: bool,
    per_thread: bool,
    top: usize,
    printed: u64,
}

impl IntervalPrinter {
    pub fn new(every: Duration, per_interval: bool, per_thread: bool, top: usize) -> Self {
        Self {
            every,
            next: None,
            per_interval,
            per_thread,
            top,
            printed: 0,
        }
    }

    fn print(&mut self, snapshot: &LiveSnapshot) -> Result<()> {
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
        Want::Snapshot(self.ask())
    }

    fn show(&mut self, shown: Shown) -> Result<Flow> {
        self.print(&shown.live)?;
        Ok(Flow::Continue)
    }

    /// The last, partial interval, so that nothing traced goes unreported.
    fn at_end(&self) -> Option<Ask> {
        Some(self.ask())
    }
}

impl IntervalPrinter {
    fn ask(&self) -> Ask {
        Ask {
            per_thread: self.per_thread,
            ..Ask::default()
        }
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
    #[test]
    fn reports_are_due_every_interval_by_the_loops_clock() {
        let mut printer = IntervalPrinter::new(Duration::from_secs(2), false, false, 5);
        let snapshot = Want::Snapshot(Ask::default());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(printer.poll(at(0)), Want::Nothing);
        assert_eq!(printer.poll(at(1_999)), Want::Nothing);
        // A tick late by half a second takes the report, without shifting the next one.
        assert_eq!(printer.poll(at(2_500)), snapshot);
        assert_eq!(printer.poll(at(2_600)), Want::Nothing);
        assert_eq!(printer.poll(at(3_999)), Want::Nothing);
        assert_eq!(printer.poll(at(4_000)), snapshot);
    }

    #[test]
    fn timestamp_shape() {
        let ts = super::local_timestamp();
        assert_eq!(ts.len(), 19, "{ts}");
        assert_eq!(&ts[4..5], "-");
        assert_eq!(&ts[13..14], ":");
    }
}
