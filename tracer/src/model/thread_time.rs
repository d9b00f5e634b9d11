//! Thread time: the sum over the target's threads of the time each lived inside the trace, the
//! base of every "% of thread time" figure. It comes from real lifetimes (the kernel sums the
//! threads that exit, at their exit; the living ones count from their start time in /proc), not
//! from a thread count sampled now and then, which gave shares of 490% for a target whose
//! threads come and go and 324845% for one that was killed between two samples.

/// The thread time at `now`: `exited_ns` for the threads that already exited, plus, for each
/// living thread started at `starts`, the time since it or the trace (`trace_start_ns`) began.
pub fn thread_time_ns(
    exited_ns: u64,
    starts: impl IntoIterator<Item = u64>,
    trace_start_ns: u64,
    now_ns: u64,
) -> u64 {
    starts.into_iter().fold(exited_ns, |sum, started| {
        sum.saturating_add(now_ns.saturating_sub(started.max(trace_start_ns)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn living_threads_count_from_their_start_or_the_traces() {
        // One exited thread's 5 ns; one started before the trace (counts from 100), one after.
        assert_eq!(thread_time_ns(5, [40, 150], 100, 200), 5 + 100 + 50);
        assert_eq!(thread_time_ns(0, [], 100, 200), 0);
    }

    /// A thread of the trace: when it started and exited (None: alive at the end), and the
    /// lock waits it made, each inside its life and the trace.
    #[derive(Debug, Clone)]
    struct Thread {
        start: u64,
        exit: Option<u64>,
        waits: Vec<(u64, u64)>,
    }

    fn thread(trace_start: u64, end: u64) -> impl Strategy<Value = Thread> {
        (
            0..end,
            any::<bool>(),
            0..end,
            prop::collection::vec((0..end, 0..end), 0..6),
        )
            .prop_map(move |(start, exits, exit_at, waits)| {
                let exit = exits.then(|| exit_at.max(start).max(trace_start));
                let from = start.max(trace_start);
                let to = exit.unwrap_or(end);
                // Waits the tracer timed: inside [from, to], not overlapping one another.
                let mut edges: Vec<u64> = waits
                    .into_iter()
                    .flat_map(|(a, b)| [a, b])
                    .map(|t| from + t % (to - from + 1))
                    .collect();
                edges.sort_unstable();
                let waits = edges.chunks_exact(2).map(|w| (w[0], w[1])).collect();
                Thread { start, exit, waits }
            })
    }

    proptest! {
        #[test]
        fn waits_inside_the_threads_lives_are_never_more_than_the_thread_time(
            threads in prop::collection::vec(thread(1_000, 10_000), 1..40)
        ) {
            let (trace_start, end) = (1_000, 10_000);
            let exited: u64 = threads
                .iter()
                .filter_map(|t| t.exit.map(|exit| exit - t.start.max(trace_start)))
                .sum();
            let living = threads.iter().filter(|t| t.exit.is_none()).map(|t| t.start);
            let total = thread_time_ns(exited, living, trace_start, end);
            let waited: u64 = threads
                .iter()
                .flat_map(|t| t.waits.iter().map(|(a, b)| b - a))
                .sum();
            prop_assert!(waited <= total, "waited {waited} of {total}");
            prop_assert!(total <= threads.len() as u64 * (end - trace_start));
        }
    }
}
