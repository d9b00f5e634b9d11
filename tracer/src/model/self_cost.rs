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
    /// Per loaded program, every run counted.
    Counted(Vec<ProgramRuns>),
    /// Per loaded program, counted only while the statistics were on (`--self-cost sampled`):
    /// `counted_ns` of the trace. Counting costs every run two clock reads, a few percent of a
    /// lock-bound target's throughput; a tenth of the time costs a tenth of that.
    Sampled {
        programs: Vec<ProgramRuns>,
        counted_ns: u64,
    },
    /// The kernel does not count them for us, and why (one line for the report).
    Unavailable(String),
}

/// Nothing counted yet: the baseline a trace's first window subtracts.
impl Default for RunStats {
    fn default() -> Self {
        RunStats::Counted(Vec::new())
    }
}

/// The tracer process's own CPU time, and the wall time it was measured over (both since the
/// trace started, cumulative like the maps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracerCpu {
    /// User and system time of all its threads.
    pub cpu_ns: u64,
    pub wall_ns: u64,
}

impl TracerCpu {
    /// What was used after `before`.
    pub fn since(&self, before: &TracerCpu) -> TracerCpu {
        TracerCpu {
            cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns),
            wall_ns: self.wall_ns.saturating_sub(before.wall_ns),
        }
    }
}

/// What the programs ran after `before` and up to `now` (cumulative readings of one trace). A
/// program missing from `before` ran all of its counts in the window.
pub fn since(now: &RunStats, before: &RunStats) -> RunStats {
    match (now, before) {
        (RunStats::Counted(now), RunStats::Counted(before)) => {
            RunStats::Counted(programs_since(now, before))
        }
        (
            RunStats::Sampled {
                programs: now,
                counted_ns,
            },
            RunStats::Sampled {
                programs: before,
                counted_ns: before_ns,
            },
        ) => RunStats::Sampled {
            programs: programs_since(now, before),
            counted_ns: counted_ns.saturating_sub(*before_ns),
        },
        _ => now.clone(),
    }
}

fn programs_since(now: &[ProgramRuns], before: &[ProgramRuns]) -> Vec<ProgramRuns> {
    now.iter()
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
        .collect()
}

/// The report's self-cost section. Field names are the JSON schema (docs/report.md, "JSON output").
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
    /// Run time of every program over the window: time added to the threads that hit the events
    /// (estimated from the counted part when sampled).
    pub added_ns: Option<u64>,
    /// The part of the window the statistics counted: 1 when every run was counted; else the
    /// programs' `runs` and `run_time_ns` are of that part, and the rates and `added_ns`
    /// extrapolate from it.
    pub counted_share: Option<f64>,
    /// `added_ns` / the traced threads' time; null when either is unknown.
    pub added_share: Option<f64>,
    /// The tracer process's own CPU time over the window (user and system, all its threads):
    /// reading maps and /proc, unwinding, and symbolizing for the views (the final report's
    /// symbols come after the trace). Not in `added_ns`: it runs beside the traced threads rather
    /// than inside them, but it is taken from the same machine.
    pub tracer_cpu_ns: u64,
    /// `tracer_cpu_ns` over the wall time it was measured in (from the window's start to its
    /// harvest, which for a final report is a little after the trace's end): the share of one
    /// CPU the tracer process used; null for an empty window.
    pub tracer_cpu_share: Option<f64>,
    /// What the waiters paid for the programs that run inside the critical section
    /// (acquire_returned and released): their run time times the threads queued on average
    /// (the traced threads' lock wait over the window); null when not available.
    pub lengthened_ns: Option<u64>,
    /// Everything the tracer took: `added_ns`, `lengthened_ns` and `tracer_cpu_ns`.
    pub own_cost_ns: Option<u64>,
    /// `own_cost_ns` over what the traced threads could have run in the window: their thread
    /// time, or the machine's CPUs over the window when those are fewer (a lock-bound target
    /// with more threads than CPUs pays for every CPU cycle taken from it). To be set beside
    /// a measured slowdown.
    pub own_cost_share: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramCost {
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
    pub ns_per_run: u64,
}

/// The trace's window as the own cost needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub duration_ns: u64,
    pub thread_time_ns: u64,
    /// The traced threads' lock wait in the window.
    pub wait_ns: u64,
    /// CPUs the machine has (0: unknown).
    pub cpus: u32,
}

impl SelfCost {
    /// Adds the own cost over `window`: the programs' time, the waiters' share of the part of
    /// it inside the critical section, and the tracer process's CPU.
    pub fn with_own_cost(mut self, window: &Window) -> Self {
        let Some(added_ns) = self.added_ns else {
            return self;
        };
        let scale = if self.counted_share.is_some_and(|share| share > 0.0) {
            1.0 / self.counted_share.unwrap_or(1.0)
        } else {
            1.0
        };
        let inside_ns: u64 = self
            .programs
            .iter()
            .filter(|p| runs_inside_the_lock(&p.name))
            .map(|p| p.run_time_ns)
            .sum();
        let queued = if window.duration_ns == 0 {
            0.0
        } else {
            window.wait_ns as f64 / window.duration_ns as f64
        };
        let lengthened_ns = (inside_ns as f64 * scale * queued).round() as u64;
        let own_cost_ns = added_ns + lengthened_ns + self.tracer_cpu_ns;
        let machine_ns = window.cpus as u64 * window.duration_ns;
        let capacity_ns = match (window.thread_time_ns, machine_ns) {
            (0, m) => m,
            (t, 0) => t,
            (t, m) => t.min(m),
        };
        self.lengthened_ns = Some(lengthened_ns);
        self.own_cost_ns = Some(own_cost_ns);
        self.own_cost_share = (capacity_ns > 0).then(|| own_cost_ns as f64 / capacity_ns as f64);
        self
    }

    /// Runs of every program.
    pub fn runs(&self) -> u64 {
        self.programs.iter().map(|p| p.runs).sum()
    }

    /// Average run time over every program's runs, when available.
    pub fn ns_per_event(&self) -> Option<u64> {
        let counted_ns: u64 = self.programs.iter().map(|p| p.run_time_ns).sum();
        self.available.then(|| per_run(counted_ns, self.runs()))
    }

    /// Whether only part of the window was counted.
    pub fn sampled(&self) -> bool {
        self.counted_share.is_some_and(|share| share < 1.0)
    }
}

/// The self-cost of a window `duration_ns` long in which the traced threads lived
/// `thread_time_ns` (0: not known), beside which the tracer process used `tracer`.
pub fn self_cost(
    stats: &RunStats,
    duration_ns: u64,
    thread_time_ns: u64,
    tracer: TracerCpu,
) -> SelfCost {
    SelfCost {
        tracer_cpu_ns: tracer.cpu_ns,
        tracer_cpu_share: (tracer.wall_ns > 0)
            .then(|| tracer.cpu_ns as f64 / tracer.wall_ns as f64),
        ..programs_cost(stats, duration_ns, thread_time_ns)
    }
}

/// What the programs cost, as the kernel counted their runs.
fn programs_cost(stats: &RunStats, duration_ns: u64, thread_time_ns: u64) -> SelfCost {
    let (programs, counted_ns) = match stats {
        RunStats::Unavailable(why) => return unavailable(why.clone()),
        RunStats::Counted(programs) => (programs, duration_ns),
        RunStats::Sampled {
            programs,
            counted_ns,
        } => (programs, (*counted_ns).min(duration_ns)),
    };
    if counted_ns == 0 && duration_ns > 0 {
        return unavailable("no run counted yet: the statistics are sampled".into());
    }
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
    let counted_run_ns: u64 = programs.iter().map(|p| p.run_time_ns).sum();
    // The counted part stands for the whole window.
    let scale = if counted_ns == 0 {
        1.0
    } else {
        duration_ns as f64 / counted_ns as f64
    };
    let added_ns = (counted_run_ns as f64 * scale).round() as u64;
    SelfCost {
        available: true,
        reason: None,
        programs,
        events_per_second: Some(if counted_ns == 0 {
            0.0
        } else {
            runs as f64 * 1e9 / counted_ns as f64
        }),
        added_ns: Some(added_ns),
        added_share: (thread_time_ns > 0).then(|| added_ns as f64 / thread_time_ns as f64),
        counted_share: Some(if duration_ns == 0 {
            1.0
        } else {
            counted_ns as f64 / duration_ns as f64
        }),
        tracer_cpu_ns: 0,
        tracer_cpu_share: None,
        lengthened_ns: None,
        own_cost_ns: None,
        own_cost_share: None,
    }
}

fn unavailable(why: String) -> SelfCost {
    SelfCost {
        available: false,
        reason: Some(why),
        programs: Vec::new(),
        events_per_second: None,
        added_ns: None,
        added_share: None,
        counted_share: None,
        tracer_cpu_ns: 0,
        tracer_cpu_share: None,
        lengthened_ns: None,
        own_cost_ns: None,
        own_cost_share: None,
    }
}

/// The lock programs that run while the lock is held, whatever their kind of tracepoint.
fn runs_inside_the_lock(program: &str) -> bool {
    program.ends_with("acquire_returned") || program.ends_with("released")
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
    fn the_own_cost_adds_what_waiters_paid_inside_the_lock_and_the_tracers_cpu() {
        let stats = RunStats::Counted(vec![
            runs("btf_start_locking", 1000, 400_000),
            runs("btf_acquire_returned", 1000, 300_000),
            runs("mmap_lock_released", 1000, 200_000),
        ]);
        let tracer = TracerCpu {
            cpu_ns: 100_000,
            wall_ns: 1_000_000_000,
        };
        // 8 threads over 1 s, 4 of them waiting on average, on 2 CPUs.
        let window = Window {
            duration_ns: 1_000_000_000,
            thread_time_ns: 8_000_000_000,
            wait_ns: 4_000_000_000,
            cpus: 2,
        };
        let cost = self_cost(&stats, window.duration_ns, window.thread_time_ns, tracer)
            .with_own_cost(&window);
        assert_eq!(
            cost.lengthened_ns,
            Some(4 * 500_000),
            "inside the lock, times 4 queued"
        );
        assert_eq!(cost.own_cost_ns, Some(900_000 + 2_000_000 + 100_000));
        assert_eq!(
            cost.own_cost_share,
            Some(3_000_000.0 / 2e9),
            "over the two CPUs, fewer than the threads"
        );
        let one_thread = Window {
            thread_time_ns: 1_000_000_000,
            ..window
        };
        let cost =
            self_cost(&stats, 1_000_000_000, 1_000_000_000, tracer).with_own_cost(&one_thread);
        assert_eq!(cost.own_cost_share, Some(3_000_000.0 / 1e9));
        let unavailable = self_cost(&RunStats::Unavailable("no".into()), 1, 1, tracer);
        assert_eq!(unavailable.with_own_cost(&window).own_cost_ns, None);
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
        let cost = self_cost(
            &stats,
            2_000_000_000,
            4_000_000_000,
            TracerCpu {
                cpu_ns: 50_000_000,
                wall_ns: 2_000_000_000,
            },
        );
        assert!(cost.available && cost.reason.is_none());
        assert_eq!(cost.tracer_cpu_ns, 50_000_000);
        assert_eq!(
            cost.tracer_cpu_share,
            Some(0.025),
            "of one CPU over the window"
        );
        let names: Vec<_> = cost.programs.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["dear", "cheap", "idle"], "most run time first");
        let per_run: Vec<_> = cost.programs.iter().map(|p| p.ns_per_run).collect();
        assert_eq!(per_run, [700, 100, 0]);
        assert_eq!(cost.events_per_second, Some(2_000.0));
        assert_eq!(cost.added_ns, Some(1_000_000));
        assert_eq!(cost.added_share, Some(0.00025));
        assert_eq!((cost.runs(), cost.ns_per_event()), (4_000, Some(250)));
        assert_eq!(cost.counted_share, Some(1.0));
        assert!(!cost.sampled());
    }

    #[test]
    fn sampled_counts_stand_for_the_whole_window() {
        // Counted 0.2 s of a 2 s window: 400 runs there are 2 000 a second, and their 100 us
        // of run time about 1 ms over the window.
        let stats = RunStats::Sampled {
            programs: vec![runs("cheap", 300, 30_000), runs("dear", 100, 70_000)],
            counted_ns: 200_000_000,
        };
        let cost = self_cost(&stats, 2_000_000_000, 4_000_000_000, TracerCpu::default());
        assert!(cost.available && cost.sampled());
        assert_eq!(cost.counted_share, Some(0.1));
        assert_eq!(cost.events_per_second, Some(2_000.0));
        assert_eq!(cost.added_ns, Some(1_000_000));
        assert_eq!(cost.added_share, Some(0.00025));
        assert_eq!((cost.runs(), cost.ns_per_event()), (400, Some(250)));
        let per_run: Vec<_> = cost.programs.iter().map(|p| p.ns_per_run).collect();
        assert_eq!(per_run, [700, 100], "the counted runs, as they are");
    }

    #[test]
    fn a_window_with_nothing_counted_yet_is_unavailable() {
        let stats = RunStats::Sampled {
            programs: vec![runs("p", 0, 0)],
            counted_ns: 0,
        };
        let cost = self_cost(&stats, 1_000_000_000, 1, TracerCpu::default());
        assert!(!cost.available);
        assert!(cost.reason.unwrap().contains("sampled"));
    }

    #[test]
    fn sampled_windows_subtract_the_counted_time_too() {
        let before = RunStats::Sampled {
            programs: vec![runs("released", 10, 7_000)],
            counted_ns: 50,
        };
        let now = RunStats::Sampled {
            programs: vec![runs("released", 25, 17_500)],
            counted_ns: 120,
        };
        assert_eq!(
            since(&now, &before),
            RunStats::Sampled {
                programs: vec![runs("released", 15, 10_500)],
                counted_ns: 70,
            }
        );
    }

    #[test]
    fn per_run_rounds_to_the_nearest_ns() {
        assert_eq!(per_run(2_000, 3), 667);
        assert_eq!(per_run(1, 3), 0);
    }

    #[test]
    fn unknown_thread_time_leaves_no_share() {
        let stats = RunStats::Counted(vec![runs("p", 1, 500)]);
        let cost = self_cost(&stats, 0, 0, TracerCpu::default());
        assert_eq!(cost.events_per_second, Some(0.0));
        assert_eq!(cost.added_share, None);
    }

    #[test]
    fn unavailable_says_why_and_measures_nothing() {
        let cost = self_cost(
            &RunStats::Unavailable("EPERM".into()),
            1_000,
            1,
            TracerCpu {
                cpu_ns: 10,
                wall_ns: 1_000,
            },
        );
        assert_eq!(
            cost.tracer_cpu_share,
            Some(0.01),
            "known without the programs' counts"
        );
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
