//! How figures are written for people. A leaf: the presenters and the report sections' own
//! text lines (`model::sections`) both use it, so neither imports the other.

/// Human duration: ns, µs, ms or s with three significant-ish digits.
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(12_345), "12.3 µs");
        assert_eq!(human_ns(4_560_000), "4.56 ms");
        assert_eq!(human_ns(2_500_000_000), "2.50 s");
    }
}
