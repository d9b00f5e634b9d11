//! Interval reports for pipes and logs (like klockstat -i): every interval, a timestamped text
//! report of that interval (--reset) or of the trace so far.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::collect::{Flow, Sink, Watch, Windows};
use crate::present;
use crate::probes::Probes;

pub struct IntervalPrinter {
    windows: Windows,
    every: Duration,
    next: Instant,
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
            next: Instant::now() + every,
            per_interval,
            per_thread,
            top,
            printed: 0,
        }
    }

    /// Prints the last, partial interval (so that nothing traced goes unreported) and hands
    /// back the windows' symbolizer.
    /// Prints the last interval (when `print_last`) and hands the windows back, with the
    /// print's outcome beside them: a failed print must not lose what the windows symbolized.
    pub fn finish(
        mut self,
        probes: &Probes,
        watch: &Watch,
        print_last: bool,
    ) -> (Windows, Result<()>) {
        let printed = if print_last {
            self.print(probes, watch)
        } else {
            Ok(())
        };
        (self.windows, printed)
    }

    fn print(&mut self, probes: &Probes, watch: &Watch) -> Result<()> {
        let snapshot = self.windows.advance(probes, watch, self.per_thread)?;
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
    fn on_tick(&mut self, probes: &Probes, watch: &mut Watch) -> Result<Flow> {
        if Instant::now() >= self.next {
            self.next += self.every;
            self.print(probes, watch)?;
        }
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
    #[test]
    fn timestamp_shape() {
        let ts = super::local_timestamp();
        assert_eq!(ts.len(), 19, "{ts}");
        assert_eq!(&ts[4..5], "-");
        assert_eq!(&ts[13..14], ":");
    }
}
