//! Percentiles from the kernel's log2 histograms.

use tracer_common::HIST_SLOTS;

/// Inclusive lower and exclusive upper bound of a slot: slot 0 holds 0, slot i >= 1 holds
/// [2^(i-1), 2^i).
pub(crate) fn slot_bounds(slot: usize) -> (u64, u64) {
    match slot {
        0 => (0, 1),
        s if s >= 64 => (1 << 63, u64::MAX),
        s => (
            1u64 << (s - 1),
            1u64.checked_shl(s as u32).unwrap_or(u64::MAX),
        ),
    }
}

/// The q-quantile (0 < q <= 1), interpolated linearly inside its slot and clamped to the
/// observed maximum, so that a single sample reports its own value and not a slot edge.
pub fn percentile(hist: &[u64; HIST_SLOTS], q: f64, max_ns: u64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0u64;
    for (slot, &n) in hist.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if seen + n >= rank {
            let (lo, hi) = slot_bounds(slot);
            let within = (rank - seen) as f64 / n as f64;
            // hi is exclusive: the largest value a slot holds is hi - 1.
            let value = lo as f64 + within * (hi - 1 - lo) as f64;
            return (value as u64).min(max_ns);
        }
        seen += n;
    }
    max_ns
}

/// Adds `other` into `into`.
pub fn merge(into: &mut [u64; HIST_SLOTS], other: &[u64; HIST_SLOTS]) {
    for (a, b) in into.iter_mut().zip(other) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{log2_slot, AggValue};

    fn hist_of(values: &[u64]) -> AggValue {
        let mut v = AggValue::default();
        for &x in values {
            v.add(x);
        }
        v
    }

    #[test]
    fn empty_histogram_is_zero() {
        assert_eq!(percentile(&[0; HIST_SLOTS], 0.99, 0), 0);
    }

    #[test]
    fn single_sample_reports_its_value() {
        let v = hist_of(&[1500]);
        assert_eq!(percentile(&v.hist, 0.5, v.max_ns), 1500);
        assert_eq!(percentile(&v.hist, 0.99, v.max_ns), 1500);
    }

    #[test]
    fn percentile_lands_in_the_right_slot() {
        // 98 fast samples around 1 us, 2 slow ones around 1 ms.
        let mut values = vec![1000u64; 98];
        values.extend([1_000_000, 1_100_000]);
        let v = hist_of(&values);
        let p50 = percentile(&v.hist, 0.5, v.max_ns);
        let p99 = percentile(&v.hist, 0.99, v.max_ns);
        assert_eq!(log2_slot(p50), log2_slot(1000), "p50={p50}");
        assert_eq!(log2_slot(p99), log2_slot(1_000_000), "p99={p99}");
        assert!(p99 <= v.max_ns);
    }

    #[test]
    fn slot_bounds_cover_log2_slots() {
        for v in [0u64, 1, 2, 3, 1000, 1 << 40] {
            let (lo, hi) = slot_bounds(log2_slot(v));
            assert!(lo <= v && v < hi, "{v} not in [{lo}, {hi})");
        }
    }

    #[test]
    fn merge_adds_slotwise() {
        let mut a = hist_of(&[10, 1000]).hist;
        merge(&mut a, &hist_of(&[10]).hist);
        assert_eq!(a[log2_slot(10)], 2);
        assert_eq!(a[log2_slot(1000)], 1);
    }
}
