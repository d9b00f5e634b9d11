//! Presenters: render a `Report` for people (text) or programs (JSON, CSV), as flamegraphs
//! (folded stacks, SVG), and the timeline as trace-event JSON. They only read the model.

pub mod csv;
pub mod folded;
pub mod json;
pub mod openmetrics;
pub mod pprof;
pub mod svg;
pub mod text;
pub mod trace_event;

use crate::model::Frame;
use crate::text::escaped;

/// `module+0xFILE_OFFSET` for a frame without a symbol (`addr2line -e module 0xOFFSET` takes
/// it), with the runtime address only where no file offset is known (kernel, unknown module).
/// `module` is printed as given (escaped by the caller).
pub fn unnamed_frame(module: &str, f: &Frame) -> String {
    match f.file_offset {
        Some(off) => format!("{module}+{off:#x}"),
        None => format!("{module} ({:#x})", f.addr),
    }
}

pub use crate::units::human_ns;

/// A frame in a few words, for narrow places (the live view's stack pane, timeline args):
/// `symbol (file:line)` with the file's base name, `symbol+0xoff`, or `object+0xaddr`.
pub fn short_frame(f: &Frame) -> String {
    let base = |path: &str| escaped(path.rsplit('/').next().unwrap_or(path)).into_owned();
    let inlined = if f.inlined { " [inlined]" } else { "" };
    let symbol = f.symbol.as_deref().map(escaped);
    match (symbol, &f.file, f.line) {
        (Some(sym), Some(file), Some(line)) => format!("{sym} ({}:{line}){inlined}", base(file)),
        (Some(sym), _, _) => match f.offset {
            Some(off) => format!("{sym}+{off:#x}{inlined}"),
            None => format!("{sym}{inlined}"),
        },
        (None, _, _) => unnamed_frame(&base(&f.module), f),
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
        assert_eq!(
            short_frame(&f),
            "libc.so.6 (0x7f00)",
            "no file offset known"
        );
        f.file_offset = Some(0x1234);
        assert_eq!(short_frame(&f), "libc.so.6+0x1234");
        f.module = "/tmp/\x1b[2Jevil\n.so".into();
        assert_eq!(short_frame(&f), "\\x1b[2Jevil\\n.so+0x1234");
    }
}
