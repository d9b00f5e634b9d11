//! CSV for spreadsheets: a header row, then one row per entry (call stack), durations in raw
//! nanoseconds. Quoting follows RFC 4180.

use std::fmt::Write as _;

use crate::model::report::{Entry, Report};

pub const HEADER: [&str; 26] = [
    "kind",
    "mode",
    "cause",
    "count",
    "total_ns",
    "avg_ns",
    "p50_ns",
    "p99_ns",
    "max_ns",
    "pid",
    "tid",
    "thread",
    "outside_locker",
    "locker_pid",
    "locker_comm",
    "stack_collected",
    "user_stack",
    "stack",
    // Why it waited (empty where it does not apply: waits have no off-CPU split, holds no
    // blockers).
    "contended_ns",
    "top_blocker",
    "top_blocker_share",
    "running_ns",
    "runnable_ns",
    "sleeping_ns",
    "uninterruptible_ns",
    "blocked_others_wait_ns",
];

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    push_row(&mut out, HEADER.iter().map(|h| h.to_string()));
    for e in &report.entries {
        push_row(&mut out, row(e));
    }
    out
}

fn row(e: &Entry) -> impl Iterator<Item = String> {
    let optional = |v: Option<u32>| v.map(|n| n.to_string()).unwrap_or_default();
    [
        e.kind.label().to_string(),
        e.mode.label().to_string(),
        e.cause.label().to_string(),
        e.count.to_string(),
        e.total_ns.to_string(),
        e.avg_ns.to_string(),
        e.p50_ns.to_string(),
        e.p99_ns.to_string(),
        e.max_ns.to_string(),
        e.pid.to_string(),
        optional(e.tid),
        e.thread_name.clone().unwrap_or_default(),
        e.outside_locker.to_string(),
        optional(e.locker.as_ref().map(|l| l.pid)),
        e.locker
            .as_ref()
            .and_then(|l| l.comm.clone())
            .unwrap_or_default(),
        e.stack_collected.to_string(),
        e.user_stack.name().to_string(),
        stack(e),
        optional_ns(e.contended_ns),
        e.blocked_by
            .first()
            .map(|b| {
                format!(
                    "{} {} hold [{}]",
                    b.mode.label(),
                    b.cause.label(),
                    top_frame(&b.frames)
                )
            })
            .unwrap_or_default(),
        e.blocked_by
            .first()
            .map(|b| format!("{:.3}", b.share))
            .unwrap_or_default(),
        optional_ns(e.offcpu.as_ref().map(|o| o.running_ns)),
        optional_ns(e.offcpu.as_ref().map(|o| o.runnable_ns)),
        optional_ns(e.offcpu.as_ref().map(|o| o.sleeping_ns)),
        optional_ns(e.offcpu.as_ref().map(|o| o.uninterruptible_ns)),
        optional_ns(e.blocked_others.as_ref().map(|b| b.wait_ns)),
    ]
    .into_iter()
}

fn optional_ns(v: Option<u64>) -> String {
    v.map(|n| n.to_string()).unwrap_or_default()
}

/// The innermost kernel frame of a holder (what it was doing), else its innermost frame.
fn top_frame(frames: &[crate::model::Frame]) -> String {
    frames
        .iter()
        .find(|f| f.kernel)
        .or(frames.first())
        .and_then(|f| f.symbol.clone())
        .unwrap_or_else(|| "?".into())
}

/// Frames innermost first (user then kernel, as in the text report), ` <- ` between them.
fn stack(e: &Entry) -> String {
    e.frames
        .iter()
        .map(|f| match &f.symbol {
            Some(symbol) => symbol.clone(),
            None => format!("{}+{:#x}", f.module, f.addr),
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

fn push_row(out: &mut String, fields: impl Iterator<Item = String>) {
    let fields: Vec<String> = fields.map(|f| quote(&f)).collect();
    let _ = writeln!(out, "{}", fields.join(","));
}

fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample};

    #[test]
    fn header_and_one_row_per_entry_in_nanoseconds() {
        let (harvest, symbols, meta) = sample();
        let report = build_report(&harvest, &symbols, &meta);
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], HEADER.join(","));
        assert_eq!(lines.len(), 1 + report.entries.len());
        assert_eq!(
            lines[1],
            "hold,write,munmap,1,40000000,40000000,40000000,40000000,40000000,42,,,false,,,true,fp,\
             munmap <- scan_file <- __vm_munmap <- do_syscall_64,,,,40000000,0,0,0,0"
        );
        assert!(
            lines.iter().any(|l| l.contains(",true,9,cat,true,")),
            "{text}"
        );
        assert!(lines.iter().all(|l| l.split(',').count() == HEADER.len()));
    }

    #[test]
    fn attribution_columns() {
        let (harvest, symbols, meta) = crate::model::report::tests::attributed();
        let report = build_report(&harvest, &symbols, &meta);
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        // The munmap hold: off CPU 15 ms running, 5 runnable, 20 asleep (15 in D); caused 750 µs.
        assert!(
            lines[1].ends_with(",,,,15000000,5000000,20000000,15000000,750000"),
            "{}",
            lines[1]
        );
        let fault = lines
            .iter()
            .find(|l| l.starts_with("wait,read,page fault"))
            .unwrap();
        assert!(
            fault.contains(",0,write munmap hold [__vm_munmap],0.750,,,,,"),
            "{fault}"
        );
    }

    #[test]
    fn quotes_what_needs_quoting() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
