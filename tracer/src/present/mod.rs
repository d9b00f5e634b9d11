//! Presenters: render a `Report` for people (text) or programs (JSON, CSV), as flamegraphs
//! (folded stacks, SVG), and the timeline as trace-event JSON. They only read the model.

pub mod csv;
pub mod folded;
pub mod json;
pub mod svg;
pub mod text;
pub mod trace_event;

use crate::model::Frame;

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

/// A frame in a few words, for narrow places (the live view's stack pane, timeline args):
/// `symbol (file:line)` with the file's base name, `symbol+0xoff`, or `object+0xaddr`.
pub fn short_frame(f: &Frame) -> String {
    let base = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
    let inlined = if f.inlined { " [inlined]" } else { "" };
    match (&f.symbol, &f.file, f.line) {
        (Some(sym), Some(file), Some(line)) => format!("{sym} ({}:{line}){inlined}", base(file)),
        (Some(sym), _, _) => match f.offset {
            Some(off) => format!("{sym}+{off:#x}{inlined}"),
            None => format!("{sym}{inlined}"),
        },
        (None, _, _) => format!("{}+{:#x}", base(&f.module), f.addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_frames() {
        let mut f = Frame {
            module: "/usr/lib/libc.so.6".into(),
            symbol: Some("__GI_munmap".into()),
            file: Some("./misc/syscall-template.S".into()),
            line: Some(117),
            addr: 0x7f00,
            ..Frame::default()
        };
        assert_eq!(short_frame(&f), "__GI_munmap (syscall-template.S:117)");
        f.file = None;
        f.offset = Some(0x1b);
        assert_eq!(short_frame(&f), "__GI_munmap+0x1b");
        f.symbol = None;
        assert_eq!(short_frame(&f), "libc.so.6+0x7f00");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(12_345), "12.3 µs");
        assert_eq!(human_ns(4_560_000), "4.56 ms");
        assert_eq!(human_ns(2_500_000_000), "2.50 s");
    }
}
