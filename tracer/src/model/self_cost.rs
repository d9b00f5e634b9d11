//! What tracing costs: the kernel's run-time statistics of the tracer's own programs
//! (BPF_STATS_RUN_TIME), read with every harvest, turned into rates and an estimate of the time
//! the programs added to the threads that hit their events.

use serde::Serialize;

/// One loaded program's runs and run time, cumulative since the tracer turned the statistics on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramRuns {
    /// As the eBPF object names it.
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

/// The programs' run statistics as read with a harvest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunStats {
    /// Per loaded program.
    Counted(Vec<ProgramRuns>),
    /// The kernel does not count them for us, and why (one line for the report).
    Unavailable(String),
}

/// Nothing counted yet: the baseline a trace's first window subtracts.
impl Default for RunStats {
    fn default() -> Self {
        RunStats::Counted(Vec::new())
    }
}

/// What the programs ran after `before` and up to `now` (cumulative readings of one trace). A
/// program missing from `before` ran all of its counts in the window.
pub fn since(now: &RunStats, before: &RunStats) -> RunStats {
    let (RunStats::Counted(now), RunStats::Counted(before)) = (now, before) else {
        return now.clone();
    };
    let window = now
        .iter()
        .map(|p| {
            let old = before.iter().find(|o| o.name == p.name);
            ProgramRuns {
                name: p.name.clone(),
                runs: p.runs.saturating_sub(old.map_or(0, |o| o.runs)),
                run_time_ns: p
                    .run_time_ns
                    .saturating_sub(old.map_or(0, |o| o.run_time_ns)),
            }
        })
        .collect();
    RunStats::Counted(window)
}

/// The report's self-cost section. Field names are the JSON schema (README, "JSON output").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelfCost {
    pub available: bool,
    /// Why not, when not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Most run time first.
    pub programs: Vec<ProgramCost>,
    /// Program runs per second over the window; null when not available (not measured is not
    /// free).
    pub events_per_second: Option<f64>,
    /// Run time of every program over the window: time added to the threads that hit the events.
    pub added_ns: Option<u64>,
    /// `added_ns` / the traced threads' time; null when either is unknown.
    pub added_share: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramCost {
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
    pub ns_per_run: u64,
}

impl SelfCost {
    /// Runs of every program.
    pub fn runs(&self) -> u64 {
        self.programs.iter().map(|p| p.runs).sum()
    }

    /// Average run time over every program's runs, when available.
    pub fn ns_per_event(&self) -> Option<u64> {
        self.added_ns.map(|ns| per_run(ns, self.runs()))
    }
}

/// The self-cost of a window `duration_ns` long in which the traced threads lived
/// `thread_time_ns` (0: not known).
pub fn self_cost(stats: &RunStats, duration_ns: u64, thread_time_ns: u64) -> SelfCost {
    let programs = match stats {
        RunStats::Unavailable(why) => {
            return SelfCost {
                available: false,
                reason: Some(why.clone()),
                programs: Vec::new(),
                events_per_second: None,
                added_ns: None,
                added_share: None,
            }
        }
        RunStats::Counted(programs) => programs,
    };
    let mut programs: Vec<ProgramCost> = programs
        .iter()
        .map(|p| ProgramCost {
            name: p.name.clone(),
            runs: p.runs,
            run_time_ns: p.run_time_ns,
            ns_per_run: per_run(p.run_time_ns, p.runs),
        })
        .collect();
    programs.sort_by(|a, b| b.run_time_ns.cmp(&a.run_time_ns).then(a.name.cmp(&b.name)));
    let runs: u64 = programs.iter().map(|p| p.runs).sum();
    let added_ns: u64 = programs.iter().map(|p| p.run_time_ns).sum();
    SelfCost {
        available: true,
        reason: None,
        programs,
        events_per_second: Some(if duration_ns == 0 {
            0.0
        } else {
            runs as f64 * 1e9 / duration_ns as f64
        }),
        added_ns: Some(added_ns),
        added_share: (thread_time_ns > 0).then(|| added_ns as f64 / thread_time_ns as f64),
    }
}

/// Rounded to the nearest ns; 0 for a program that never ran.
fn per_run(run_time_ns: u64, runs: u64) -> u64 {
    (run_time_ns + runs / 2).checked_div(runs).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn runs(name: &str, runs: u64, run_time_ns: u64) -> ProgramRuns {
        ProgramRuns {
            name: name.into(),
            runs,
            run_time_ns,
        }
    }

    #[test]
    fn windows_subtract_each_programs_counters() {
        let before = RunStats::Counted(vec![runs("released", 10, 7_000), runs("sched", 4, 800)]);
        let now = RunStats::Counted(vec![
            runs("released", 25, 17_500),
            runs("sched", 4, 800),
            runs("new", 3, 300),
        ]);
        assert_eq!(
            since(&now, &before),
            RunStats::Counted(vec![
                runs("released", 15, 10_500),
                runs("sched", 0, 0),
                runs("new", 3, 300),
            ])
        );
        assert_eq!(
            since(&now, &RunStats::default()),
            now,
            "the first window is whole"
        );
        let off = RunStats::Unavailable("no".into());
        assert_eq!(since(&off, &RunStats::default()), off);
    }

    #[test]
    fn rates_per_run_and_the_added_time() {
        let stats = RunStats::Counted(vec![
            runs("cheap", 3_000, 300_000),
            runs("dear", 1_000, 700_000),
            runs("idle", 0, 0),
        ]);
        let cost = self_cost(&stats, 2_000_000_000, 4_000_000_000);
        assert!(cost.available && cost.reason.is_none());
        let names: Vec<_> = cost.programs.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["dear", "cheap", "idle"], "most run time first");
        let per_run: Vec<_> = cost.programs.iter().map(|p| p.ns_per_run).collect();
        assert_eq!(per_run, [700, 100, 0]);
        assert_eq!(cost.events_per_second, Some(2_000.0));
        assert_eq!(cost.added_ns, Some(1_000_000));
        assert_eq!(cost.added_share, Some(0.00025));
        assert_eq!((cost.runs(), cost.ns_per_event()), (4_000, Some(250)));
    }

    #[test]
    fn per_run_rounds_to_the_nearest_ns() {
        assert_eq!(per_run(2_000, 3), 667);
        assert_eq!(per_run(1, 3), 0);
    }

    #[test]
    fn unknown_thread_time_leaves_no_share() {
        let stats = RunStats::Counted(vec![runs("p", 1, 500)]);
        let cost = self_cost(&stats, 0, 0);
        assert_eq!(cost.events_per_second, Some(0.0));
        assert_eq!(cost.added_share, None);
    }

    #[test]
    fn unavailable_says_why_and_measures_nothing() {
        let cost = self_cost(&RunStats::Unavailable("EPERM".into()), 1, 1);
        assert!(!cost.available);
        assert_eq!(cost.reason.as_deref(), Some("EPERM"));
        assert!(cost.programs.is_empty());
        assert_eq!(
            (cost.events_per_second, cost.added_ns, cost.added_share),
            (None, None, None)
        );
        assert_eq!(cost.ns_per_event(), None);
    }
}
