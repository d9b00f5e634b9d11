//! Folded stacks (Brendan Gregg's format, read by flamegraph.pl, inferno, speedscope):
//! one `frame;frame;...;frame value` line per stack, root first.
//!
//! Each line is `process or thread;[cause];[mode];user frames;--;kernel frames_[k] value`: the
//! cause and mode frames right under the root split the graph into one tower per cause, and
//! the `--` frame marks where the user stack enters the kernel (kernel frames carry the `_[k]`
//! suffix that flamegraph palettes colour as kernel).
//!
//! The file holds stack lines and nothing else: strict readers (inferno-diff-folded, most
//! parsers) reject any other line, so the lost-event counters go to the SVG subtitle, the
//! other formats and stderr instead.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::model::{
    processes::UNKNOWN_COMM,
    report::{Entry, Kind, Report},
    Frame,
};

/// What a flamegraph's widths measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// Time spent waiting for the lock, in microseconds.
    Wait,
    /// Time spent holding the lock, in microseconds.
    Hold,
    /// Number of acquisitions (one wait is timed per acquisition, however short).
    Count,
}

impl Weight {
    /// The unit of the values, as a flamegraph names it.
    pub fn unit(self) -> &'static str {
        match self {
            Weight::Wait | Weight::Hold => "µs",
            Weight::Count => "acquisitions",
        }
    }

    /// What the graph shows, as a title word.
    pub fn title(self) -> &'static str {
        match self {
            Weight::Wait => "waits",
            Weight::Hold => "holds",
            Weight::Count => "acquisitions",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Weight::Wait => "time waiting for mmap_lock",
            Weight::Hold => "time holding mmap_lock",
            Weight::Count => "mmap_lock acquisitions",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Weight::Hold => Kind::Hold,
            Weight::Wait | Weight::Count => Kind::Wait,
        }
    }

    fn value(self, e: &Entry) -> u64 {
        match self {
            // Rounded to the nearest microsecond: a flamegraph of nanoseconds has unreadable
            // counts, and sub-microsecond stacks are invisible at any width anyway.
            Weight::Wait | Weight::Hold => (e.total_ns + 500) / 1_000,
            Weight::Count => e.count,
        }
    }
}

/// Separator frame between the user part and the kernel part of a stack.
pub const KERNEL_SEPARATOR: &str = "--";

/// The folded lines of `report`, sorted, identical stacks summed, zero values left out.
pub fn render(report: &Report, weight: Weight) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for e in report.entries.iter().filter(|e| e.kind == weight.kind()) {
        let value = weight.value(e);
        if value > 0 {
            *lines.entry(stack_path(report, e)).or_default() += value;
        }
    }
    let mut out = String::new();
    for (path, value) in lines {
        let _ = writeln!(out, "{path} {value}");
    }
    out
}

fn stack_path(report: &Report, e: &Entry) -> String {
    let mut path = vec![
        root_frame(report, e),
        format!("[{}]", e.cause.label()),
        format!("[{}]", e.mode.label()),
    ];
    let (user, kernel): (Vec<&Frame>, Vec<&Frame>) = e.frames.iter().partition(|f| !f.kernel);
    path.extend(user.iter().rev().map(|f| frame_name(f)));
    if !kernel.is_empty() {
        path.push(KERNEL_SEPARATOR.to_string());
        path.extend(kernel.iter().rev().map(|f| frame_name(f)));
    }
    path.join(";")
}

/// The process (or, per thread, the thread; or the outside locker) the stack belongs to.
fn root_frame(report: &Report, e: &Entry) -> String {
    let name = if let Some(locker) = &e.locker {
        let comm = locker.comm.as_deref().unwrap_or("?");
        if locker.processes > 1 {
            format!("{comm} (outside locker, {} processes)", locker.processes)
        } else {
            format!("{comm} (outside locker, pid {})", locker.pid)
        }
    } else if let Some(tid) = e.tid {
        match &e.thread_name {
            Some(thread) => format!("{thread} (tid {tid})"),
            None => format!("tid {tid}"),
        }
    } else if report.target.system_wide || report.target.pids.len() > 1 {
        let comm = e.comm.as_deref().unwrap_or(UNKNOWN_COMM);
        format!("{comm} (pid {})", e.pid)
    } else {
        report.target.comm.clone()
    };
    sanitize(&name)
}

/// A frame's name: its symbol, else `object+0xFILE_OFFSET` (the runtime address where no file
/// offset is known: kernel, unknown module); kernel frames end in `_[k]`.
fn frame_name(f: &Frame) -> String {
    let name = match &f.symbol {
        Some(symbol) => symbol.clone(),
        None => {
            let object = f.module.rsplit('/').next().unwrap_or(&f.module);
            format!("{object}+{:#x}", f.file_offset.unwrap_or(f.addr))
        }
    };
    let name = sanitize(&name);
    if f.kernel {
        format!("{name}_[k]")
    } else {
        name
    }
}

/// `;` separates frames and a line ends the record: neither may appear inside a name, nor may
/// any other control character the target put in a name.
fn sanitize(name: &str) -> String {
    crate::text::escaped(name).replace(';', ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample};

    fn sample_report() -> Report {
        let (harvest, symbols, meta) = sample();
        build_report(&harvest, &symbols, &meta)
    }

    /// flamegraph.pl's parse: the value is after the last space, frames split on `;`.
    fn parse(line: &str) -> (Vec<&str>, u64) {
        let (stack, value) = line.rsplit_once(' ').expect("a space before the value");
        (
            stack.split(';').collect(),
            value.parse().expect("an integer value"),
        )
    }

    #[test]
    fn wait_lines_are_root_first_with_cause_mode_and_separator() {
        let text = render(&sample_report(), Weight::Wait);
        let lines: Vec<(Vec<&str>, u64)> = text.lines().map(parse).collect();
        assert_eq!(lines.len(), 2, "{text}");
        let munmap = lines.iter().find(|(f, _)| f[1] == "[munmap]").unwrap();
        assert_eq!(
            munmap.0,
            [
                "app",
                "[munmap]",
                "[write]",
                "scan_file",
                "munmap",
                "--",
                "do_syscall_64_[k]",
                "__vm_munmap_[k]"
            ]
        );
        assert_eq!(munmap.1, 8_000, "3 ms + 5 ms in µs");
        let fault = lines.iter().find(|(f, _)| f[1] == "[page fault]").unwrap();
        assert_eq!(
            fault.0[3], "--",
            "no user stack: the kernel part follows directly"
        );
    }

    #[test]
    fn hold_and_count_weights() {
        let report = sample_report();
        let hold = render(&report, Weight::Hold);
        assert!(
            hold.contains("cat (outside locker, pid 9);[/proc reader];[read];--;"),
            "{hold}"
        );
        assert!(hold.contains("app;[no stack (short)];[read] 2\n"), "{hold}");
        let count = render(&report, Weight::Count);
        let total: u64 = count.lines().map(|l| parse(l).1).sum();
        assert_eq!(total, 3, "one per timed wait: {count}");
    }

    #[test]
    fn lost_counters_stay_out_of_the_stack_lines() {
        let (mut harvest, symbols, meta) = sample();
        harvest.counters[tracer_common::Counter::AggMapFull as usize].1 = 12;
        let text = render(&build_report(&harvest, &symbols, &meta), Weight::Wait);
        assert!(!text.is_empty());
        // What strict folded readers accept: `frames value` on every line.
        for line in text.lines() {
            let (stack, value) = line.rsplit_once(' ').expect("a space before the value");
            assert!(
                !stack.is_empty() && value.parse::<u64>().is_ok(),
                "{line:?}"
            );
        }
        assert!(!text.contains("lost"), "{text}");
    }

    #[test]
    fn system_wide_roots_name_each_process() {
        let (harvest, symbols, mut meta) = sample();
        meta.system_wide = true;
        meta.pids.clear();
        let text = render(&build_report(&harvest, &symbols, &meta), Weight::Wait);
        assert!(
            text.lines().all(|l| l.starts_with("app (pid 42);")),
            "{text}"
        );
    }

    #[test]
    fn names_cannot_break_the_format() {
        let f = Frame {
            symbol: Some("a;b\nc".into()),
            ..Frame::default()
        };
        assert_eq!(frame_name(&f), "a:b\\nc");
        let unknown = Frame {
            kernel: true,
            module: "/usr/lib/libx.so".into(),
            addr: 0x10,
            ..Frame::default()
        };
        assert_eq!(frame_name(&unknown), "libx.so+0x10_[k]");
        let escape = Frame {
            symbol: Some("\x1b[2Jx".into()),
            ..Frame::default()
        };
        assert_eq!(frame_name(&escape), "\\x1b[2Jx");
    }

    #[test]
    fn unnamed_user_frames_show_their_file_offset() {
        let f = Frame {
            module: "/usr/lib/libclamav.so.12.0.3".into(),
            addr: 0x7f0c_3692_b978,
            file_offset: Some(0x12_b978),
            ..Frame::default()
        };
        assert_eq!(frame_name(&f), "libclamav.so.12.0.3+0x12b978");
    }
}
