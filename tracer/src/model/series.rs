//! The daemon's series: what each window of a continuous trace added, folded into counts and
//! log2 histograms per (process name, cause, mode, kind) that only grow, as Prometheus counters
//! must, whatever became of the processes and of the kernel entries behind them.
//!
//! The series are bounded: a pid label only when asked for, and at most `max_series` of them;
//! the operations of a series past the cap are counted (`over_cap`), not exported.

use std::collections::BTreeMap;

use tracer_common::{log2_slot, HIST_SLOTS};

use super::processes::UNKNOWN_COMM;
use super::schema::{Entry, Kind, Mode, Report};

/// What names one series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeriesKey {
    /// The name of the process that waited or held (its own mmap_lock, or another's).
    pub comm: String,
    /// With `--label-pid` only: pids are unbounded over a daemon's life.
    pub pid: Option<u32>,
    /// With `--label-cgroup` only: the locking process's cgroup (v2) path, "" when unknown.
    pub cgroup: Option<String>,
    pub cause: &'static str,
    pub mode: Mode,
    pub kind: Kind,
}

/// Operations, their total time, and their log2 histogram (slot i holds [2^(i-1), 2^i) ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesValue {
    pub count: u64,
    pub sum_ns: u64,
    pub slots: [u64; HIST_SLOTS],
}

impl Default for SeriesValue {
    fn default() -> Self {
        Self {
            count: 0,
            sum_ns: 0,
            slots: [0; HIST_SLOTS],
        }
    }
}

/// How series are named and bounded.
#[derive(Clone, Debug)]
pub struct SeriesSettings {
    pub label_pid: bool,
    pub label_cgroup: bool,
    pub max_series: usize,
    /// Only processes of these names (`--comm`); every process when empty.
    pub comms: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Series {
    pub series: BTreeMap<SeriesKey, SeriesValue>,
    /// Operations left out because their series would have passed the cap.
    pub over_cap: u64,
}

impl Series {
    /// Adds one window (a report of what happened since the previous one).
    pub fn fold(&mut self, window: &Report, settings: &SeriesSettings) {
        for entry in &window.entries {
            let (pid, comm, cgroup) = locking_process(entry);
            if !settings.comms.is_empty() && !settings.comms.contains(&comm) {
                continue;
            }
            let key = SeriesKey {
                comm,
                pid: settings.label_pid.then_some(pid),
                cgroup: settings
                    .label_cgroup
                    .then(|| cgroup.unwrap_or_default().to_string()),
                cause: entry.cause.id(),
                mode: entry.mode,
                kind: entry.kind,
            };
            let at_cap = self.series.len() >= settings.max_series;
            let value = match self.series.get_mut(&key) {
                Some(value) => value,
                None if at_cap => {
                    self.over_cap += entry.count;
                    continue;
                }
                None => self.series.entry(key).or_default(),
            };
            value.count += entry.count;
            value.sum_ns += entry.total_ns;
            for &[lower_ns, n] in &entry.histogram {
                value.slots[log2_slot(lower_ns)] += n;
            }
        }
    }
}

/// The process that waited or held: an outside locker (a /proc reader, a debugger) is named
/// for itself, not for the process whose lock it took, as the report's process table does.
fn locking_process(entry: &Entry) -> (u32, String, Option<&str>) {
    let unnamed = || UNKNOWN_COMM.to_string();
    match &entry.locker {
        Some(locker) if entry.outside_locker => (
            locker.pid,
            locker.comm.clone().unwrap_or_else(unnamed),
            locker.cgroup.as_deref(),
        ),
        _ => (
            entry.pid,
            entry.comm.clone().unwrap_or_else(unnamed),
            entry.cgroup.as_deref(),
        ),
    }
}

/// The `le` bounds exported, in ns: 2^8 (256 ns) to 2^34 (about 17 s), every power of two (the
/// kernel's slots), then +Inf. Shorter operations count in the first bucket, as `le` means.
pub const FIRST_BUCKET_SLOT: usize = 8;
pub const LAST_BUCKET_SLOT: usize = 34;

impl SeriesValue {
    /// Per-bucket counts (not cumulative) with their upper bounds in seconds, +Inf last.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut buckets = Vec::with_capacity(LAST_BUCKET_SLOT - FIRST_BUCKET_SLOT + 2);
        // Slot i holds values below 2^i: all of them are <= le = 2^i ns.
        let mut below = 0;
        for (slot, &n) in self.slots.iter().enumerate() {
            below += n;
            if slot < FIRST_BUCKET_SLOT {
                continue;
            }
            if slot > LAST_BUCKET_SLOT {
                break;
            }
            buckets.push(((1u64 << slot) as f64 / 1e9, below));
            below = 0;
        }
        let rest: u64 = self.slots.iter().skip(LAST_BUCKET_SLOT + 1).sum::<u64>() + below;
        buckets.push((f64::INFINITY, rest));
        buckets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::schema::{Kind, Mode};
    use crate::model::{build_report, Harvest, RawEntry, TraceMeta};
    use tracer_common::{AggKey, AggValue, KIND_HOLD, KIND_WAIT, MODE_READ, MODE_WRITE};

    fn report(entries: &[(u32, u8, u8, &[u64])], names: &[(u32, &str)]) -> Report {
        let harvest = Harvest {
            entries: entries
                .iter()
                .map(|&(pid, kind, mode, durations)| {
                    let mut value = AggValue::default();
                    for &ns in durations {
                        value.add(ns);
                    }
                    let key = AggKey {
                        pid,
                        kind,
                        mode,
                        kernel_stack: -1,
                        user_stack: -1,
                        ..AggKey::default()
                    };
                    RawEntry::exact(key, value)
                })
                .collect(),
            ..Harvest::default()
        };
        let meta = TraceMeta {
            system_wide: true,
            process_names: names.iter().map(|&(p, n)| (p, n.to_string())).collect(),
            ..TraceMeta::default()
        };
        build_report(&harvest, &Default::default(), &meta)
    }

    fn settings(label_pid: bool, max_series: usize) -> SeriesSettings {
        SeriesSettings {
            label_pid,
            label_cgroup: false,
            max_series,
            comms: Vec::new(),
        }
    }

    #[test]
    fn windows_add_up_per_process_name_and_the_processes_behind_one_name_merge() {
        let mut series = Series::default();
        let s = settings(false, 100);
        series.fold(
            &report(
                &[
                    (10, KIND_HOLD, MODE_WRITE, &[1_000, 3_000]),
                    (11, KIND_HOLD, MODE_WRITE, &[500]),
                ],
                &[(10, "cc1"), (11, "cc1")],
            ),
            &s,
        );
        // Process 10 is gone; its name's series keeps what it had and grows with others.
        series.fold(
            &report(&[(12, KIND_HOLD, MODE_WRITE, &[2_000_000])], &[(12, "cc1")]),
            &s,
        );
        assert_eq!(series.series.len(), 1);
        let (key, value) = series.series.iter().next().unwrap();
        assert_eq!(
            (key.comm.as_str(), key.pid, key.kind, key.mode),
            ("cc1", None, Kind::Hold, Mode::Write)
        );
        assert_eq!((value.count, value.sum_ns), (4, 2_004_500));
        let buckets = value.buckets();
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), value.count);
        // 500 ns is below 2^9 = 512 ns, 1 us below 2^10, 3 us below 2^12, 2 ms below 2^21.
        let at = |slot: u32| {
            buckets
                .iter()
                .find(|b| b.0 == (1u64 << slot) as f64 / 1e9)
                .unwrap()
                .1
        };
        assert_eq!((at(9), at(10), at(12), at(21)), (1, 1, 1, 1));
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 0));
    }

    #[test]
    fn pids_are_labels_only_when_asked_for() {
        let window = report(
            &[
                (10, KIND_WAIT, MODE_READ, &[100]),
                (11, KIND_WAIT, MODE_READ, &[100]),
            ],
            &[(10, "sh"), (11, "sh")],
        );
        let mut merged = Series::default();
        merged.fold(&window, &settings(false, 100));
        let mut apart = Series::default();
        apart.fold(&window, &settings(true, 100));
        assert_eq!((merged.series.len(), apart.series.len()), (1, 2));
        assert!(apart.series.keys().any(|k| k.pid == Some(11)));
    }

    #[test]
    fn the_cap_counts_what_it_leaves_out_and_known_series_still_grow() {
        let mut series = Series::default();
        let s = settings(false, 1);
        series.fold(
            &report(&[(1, KIND_HOLD, MODE_READ, &[10])], &[(1, "a")]),
            &s,
        );
        series.fold(
            &report(
                &[
                    (2, KIND_HOLD, MODE_READ, &[10, 20]),
                    (1, KIND_HOLD, MODE_READ, &[10]),
                ],
                &[(1, "a"), (2, "b")],
            ),
            &s,
        );
        assert_eq!(series.series.len(), 1);
        assert_eq!(series.series.values().next().unwrap().count, 2);
        assert_eq!(series.over_cap, 2);
    }

    #[test]
    fn an_outside_locker_is_named_for_itself() {
        let mut harvest_report = report(
            &[(10, KIND_HOLD, MODE_READ, &[10])],
            &[(10, "clamd"), (20, "ps")],
        );
        // The same hold, taken by ps reading /proc/10/maps.
        let entry = &mut harvest_report.entries[0];
        entry.outside_locker = true;
        entry.locker = Some(crate::model::report::Locker {
            pid: 20,
            comm: Some("ps".into()),
            cgroup: Some("/user.slice".into()),
            processes: 1,
        });
        let mut series = Series::default();
        series.fold(&harvest_report, &settings(true, 100));
        let key = series.series.keys().next().unwrap();
        assert_eq!((key.comm.as_str(), key.pid), ("ps", Some(20)));
        assert_eq!(key.cgroup, None, "no cgroup label unless asked for");
        let mut by_cgroup = Series::default();
        let labelled = SeriesSettings {
            label_cgroup: true,
            ..settings(false, 100)
        };
        by_cgroup.fold(&harvest_report, &labelled);
        let key = by_cgroup.series.keys().next().unwrap();
        assert_eq!(
            key.cgroup.as_deref(),
            Some("/user.slice"),
            "the locker's own"
        );
    }

    #[test]
    fn a_comm_filter_keeps_only_its_processes() {
        let mut series = Series::default();
        let s = SeriesSettings {
            comms: vec!["clamd".into()],
            ..settings(false, 100)
        };
        series.fold(
            &report(
                &[
                    (1, KIND_HOLD, MODE_READ, &[10]),
                    (2, KIND_HOLD, MODE_READ, &[10]),
                ],
                &[(1, "clamd"), (2, "bash")],
            ),
            &s,
        );
        assert_eq!(
            series
                .series
                .keys()
                .map(|k| k.comm.as_str())
                .collect::<Vec<_>>(),
            ["clamd"]
        );
    }

    #[test]
    fn long_operations_fall_in_inf_and_short_ones_in_the_first_bucket() {
        let mut value = SeriesValue::default();
        value.slots[log2_slot(0)] += 1;
        value.slots[log2_slot(100)] += 1;
        value.slots[log2_slot(1 << 40)] += 1;
        let buckets = value.buckets();
        assert_eq!(buckets[0], ((1u64 << FIRST_BUCKET_SLOT) as f64 / 1e9, 2));
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 1));
        assert_eq!(buckets.len(), LAST_BUCKET_SLOT - FIRST_BUCKET_SLOT + 2);
    }
}
