//! Presenters: render a `Report` for people (text) or programs (JSON, CSV), as flamegraphs
//! (folded stacks, SVG), and the timeline as trace-event JSON. They only read the model.

pub mod csv;
pub mod folded;
pub mod json;
pub mod svg;
pub mod text;
pub mod trace_event;

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
    use super::human_ns;

    #[test]
    fn human_units() {
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(12_345), "12.3 µs");
        assert_eq!(human_ns(4_560_000), "4.56 ms");
        assert_eq!(human_ns(2_500_000_000), "2.50 s");
    }
}
