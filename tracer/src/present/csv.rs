//! CSV for spreadsheets: a header row, then one row per entry (call stack), durations in raw
//! nanoseconds, then one row per non-zero lost-event counter. Quoting follows RFC 4180.
//!
//! The lost rows keep the file one table: `kind` is `lost`, `cause` names the counter and
//! `count` holds its value; every other column is empty. Filter on `kind` to separate them
//! (`df[df.kind != "lost"]`).

use std::fmt::Write as _;

use crate::model::report::{Entry, Report};

pub const HEADER: [&str; 31] = [
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
    // Added after the others, so that readers by position keep working: the name of `pid`.
    "comm",
    // `max_ns` is an upper bound, not the exact maximum; and the entry holds a proportional
    // share of events whose user stacks were not copied.
    "max_is_upper_bound",
    "user_stack_estimated",
    // The cgroup (v2) paths of `pid` and of the outside locker, where known.
    "cgroup",
    "locker_cgroup",
];

/// `kind` of the rows that carry a lost-event counter.
pub const LOST_KIND: &str = "lost";

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    push_row(&mut out, HEADER.iter().map(|h| h.to_string()));
    for e in &report.entries {
        push_row(&mut out, row(e));
    }
    for (name, &n) in report.lost.iter().filter(|(_, &n)| n > 0) {
        push_row(&mut out, lost_row(name, n));
    }
    out
}

/// `lost,,<counter>,<n>,,,...`: the counter in `cause`, its value in `count`.
fn lost_row(name: &str, n: u64) -> impl Iterator<Item = String> {
    let mut fields = vec![String::new(); HEADER.len()];
    fields[0] = LOST_KIND.to_string();
    fields[2] = name.to_string();
    fields[3] = n.to_string();
    fields.into_iter()
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
        e.comm.clone().unwrap_or_default(),
        e.max_is_upper_bound.to_string(),
        e.user_stack_estimated.to_string(),
        e.cgroup.clone().unwrap_or_default(),
        e.locker
            .as_ref()
            .and_then(|l| l.cgroup.clone())
            .unwrap_or_default(),
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
            None => super::unnamed_frame(&f.module, f),
        })
        .collect::<Vec<_>>()
        .join(" <- ")
}

fn push_row(out: &mut String, fields: impl Iterator<Item = String>) {
    // Names the target controls are in several fields: a control character in any would
    // reach whoever reads the file in a terminal.
    let fields: Vec<String> = fields.map(|f| quote(&crate::text::escaped(&f))).collect();
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
        assert_eq!(
            lines.len(),
            1 + report.entries.len() + 1,
            "one lost counter"
        );
        assert_eq!(
            lines[1],
            "hold,write,munmap,1,40000000,40000000,40000000,40000000,40000000,42,,,false,,,true,fp,\
             munmap <- scan_file <- __vm_munmap <- do_syscall_64,,,,40000000,0,0,0,0,app,false,false,\
             /system.slice/app.service,"
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
            lines[1].ends_with(
                ",,,,15000000,5000000,20000000,15000000,750000,app,false,false,\
                 /system.slice/app.service,"
            ),
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
    fn nonzero_lost_counters_are_rows_of_kind_lost() {
        let (mut harvest, symbols, meta) = sample();
        harvest.counters[tracer_common::Counter::AggMapFull as usize].1 = 7;
        let report = build_report(&harvest, &symbols, &meta);
        let text = render(&report);
        let lost: Vec<&str> = text.lines().filter(|l| l.starts_with("lost,")).collect();
        let empty_rest = ",".repeat(HEADER.len() - 4);
        assert_eq!(
            lost,
            [
                format!("lost,,aggregation_map_full,7{empty_rest}"),
                format!("lost,,unpaired_release,2{empty_rest}"),
            ],
            "{text}"
        );
        assert!(text.lines().all(|l| l.split(',').count() == HEADER.len()));
        let no_losses = Report {
            lost: report.lost.keys().map(|&name| (name, 0)).collect(),
            ..report
        };
        assert!(
            !render(&no_losses).contains("\nlost,"),
            "zero counters stay out"
        );
    }

    #[test]
    fn a_split_entry_says_its_maximum_is_a_bound_and_its_share_an_estimate() {
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.entries[0].max_is_upper_bound = true;
        report.entries[0].user_stack_estimated = true;
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].ends_with(",app,true,true,/system.slice/app.service,"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains(",false,false,/"), "{}", lines[2]);
    }

    #[test]
    fn quotes_what_needs_quoting() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn names_with_control_characters_are_escaped() {
        let mut out = String::new();
        push_row(
            &mut out,
            ["\x1b[31mred".to_string(), "a\nb".to_string()].into_iter(),
        );
        assert_eq!(out, "\\x1b[31mred,a\\nb\n");
    }
}
