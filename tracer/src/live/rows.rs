//! The rows of the table: one per stack, or per cause, with the figures each column shows.

use std::collections::BTreeMap;

use crate::model::answer::holder_groups;
use crate::model::processes::UNKNOWN_COMM;
use crate::model::report::{cause_rows, Entry, Kind, Mode, Report};
use crate::model::Cause;
use crate::present::text::splits_by_process;
use crate::text::escaped;

use super::labels::place;
use super::pane::{stack_lines, stack_parts, why_lines};

/// One table row: a call stack or a cause, with what the stack pane shows for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Stable across refreshes, so the selection follows the row when the order changes.
    pub id: String,
    pub kind: Kind,
    pub mode: Mode,
    pub cause: Cause,
    pub count: u64,
    pub total_ns: u64,
    pub avg_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub max_is_upper_bound: bool,
    /// total / thread time of the window.
    pub share: f64,
    pub thread: Option<String>,
    /// The frame that best names the stack (or, for a cause, its number of stacks).
    pub place: String,
    /// The stack pane, in columns side by side: a stack's user frames and kernel frames (so
    /// that deep user stacks do not push the kernel part out of sight), or a cause's stacks.
    pub detail: Vec<Vec<String>>,
}

pub(super) fn share(total_ns: u64, report: &Report) -> f64 {
    if report.thread_time_ns == 0 {
        0.0
    } else {
        total_ns as f64 / report.thread_time_ns as f64
    }
}

pub(super) fn thread_label(e: &Entry) -> Option<String> {
    if let Some(locker) = &e.locker {
        let comm = locker.comm.as_deref().unwrap_or("?");
        return Some(format!("{comm} {} (outside)", locker.pid));
    }
    let tid = e.tid?;
    Some(match &e.thread_name {
        Some(name) => format!("{name} {tid}"),
        None => tid.to_string(),
    })
}

/// `comm pid` of the process whose mm it is, when the trace covers several processes.
pub(super) fn process_label(e: &Entry, report: &Report) -> Option<String> {
    splits_by_process(report).then(|| {
        let comm = e.comm.as_deref().unwrap_or(UNKNOWN_COMM);
        format!("{comm} {}", e.pid)
    })
}

pub(super) fn stack_row(e: &Entry, label: String, report: &Report) -> Row {
    let addrs: Vec<String> = e.frames.iter().map(|f| format!("{:x}", f.addr)).collect();
    let id = format!(
        "{:?}/{:?}/{:?}/{}/{:?}/{:?}/{}",
        e.kind,
        e.mode,
        e.cause,
        e.pid,
        e.tid,
        e.locker.as_ref().map(|l| l.pid),
        addrs.join(",")
    );
    Row {
        id,
        kind: e.kind,
        mode: e.mode,
        cause: e.cause,
        count: e.count,
        total_ns: e.total_ns,
        avg_ns: e.avg_ns,
        p99_ns: e.p99_ns,
        max_ns: e.max_ns,
        max_is_upper_bound: e.max_is_upper_bound,
        share: share(e.total_ns, report),
        // Names the target controls, as the terminal must not see them.
        thread: thread_label(e).map(|t| escaped(&t).into_owned()),
        place: escaped(&match process_label(e, report) {
            Some(process) => format!("{process}: {label}"),
            None => label,
        })
        .into_owned(),
        detail: stack_parts(e)
            .into_iter()
            .chain([why_lines(e)])
            .filter(|part| !part.is_empty())
            .collect(),
    }
}

/// One row per (cause, kind, mode), per thread when the entries carry threads. The pane lists
/// the cause's stacks, largest first.
pub(super) fn cause_group_rows(entries: &[&Entry], report: &Report) -> Vec<Row> {
    let mut by_thread: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    for e in entries {
        by_thread
            .entry(thread_label(e))
            .or_default()
            .push((*e).clone());
    }
    let mut rows = Vec::new();
    for (thread, group) in by_thread {
        for c in cause_rows(&group) {
            let mut stacks: Vec<&Entry> = group
                .iter()
                .filter(|e| (e.cause, e.kind, e.mode) == (c.cause, c.kind, c.mode))
                .collect();
            stacks.sort_by_key(|e| std::cmp::Reverse(e.total_ns));
            let mut detail = Vec::new();
            for e in &stacks {
                detail.push(format!(
                    "{} in {} ({})",
                    crate::present::human_ns(e.total_ns),
                    e.count,
                    place(e)
                ));
                detail.extend(stack_lines(e).into_iter().map(|l| format!("    {l}")));
            }
            rows.push(Row {
                id: format!("{:?}/{:?}/{:?}/{:?}", c.cause, c.kind, c.mode, thread),
                kind: c.kind,
                mode: c.mode,
                cause: c.cause,
                count: c.count,
                total_ns: c.total_ns,
                avg_ns: c.avg_ns,
                p99_ns: c.p99_ns,
                max_ns: c.max_ns,
                max_is_upper_bound: c.max_is_upper_bound,
                share: share(c.total_ns, report),
                thread: thread.clone(),
                place: match stacks.len() {
                    1 => "1 stack".to_string(),
                    n => format!("{n} stacks"),
                },
                detail: vec![detail],
            });
        }
    }
    rows
}

/// One row per holder group ("behind whom"): the waits charged to it as its count and total,
/// its longest hold as its maximum; the pane says what its holds were and who held.
pub(super) fn holder_rows(report: &Report) -> Vec<Row> {
    holder_groups(&report.entries)
        .into_iter()
        .map(|g| {
            let human = crate::present::human_ns;
            let mut detail = vec![
                format!(
                    "caused {} wait{}, {} of waiting",
                    g.waits_caused,
                    if g.waits_caused == 1 { "" } else { "s" },
                    human(g.wait_caused_ns)
                ),
                format!(
                    "its holds: {}, {} in all, longest {}",
                    g.holds,
                    human(g.hold_ns),
                    human(g.max_hold_ns)
                ),
                format!(
                    "  off CPU while holding: {} runnable (preempted), {} asleep ({} of it \
                     uninterruptible)",
                    human(g.offcpu.runnable_ns),
                    human(g.offcpu.sleeping_ns),
                    human(g.offcpu.uninterruptible_ns)
                ),
            ];
            if let Some(outside) = &g.outside_locker {
                detail.push(format!("held from outside by {}", escaped(outside)));
            }
            if !g.threads.is_empty() {
                let tids: Vec<String> = g.threads.iter().map(u32::to_string).collect();
                detail.push(format!("holder threads: {}", tids.join(" ")));
            }
            Row {
                id: format!(
                    "holder/{:?}/{:?}/{}/{:?}",
                    g.mode, g.cause, g.place, g.outside_locker
                ),
                kind: Kind::Hold,
                mode: g.mode,
                cause: g.cause,
                count: g.waits_caused,
                total_ns: g.wait_caused_ns,
                avg_ns: g.wait_caused_ns / g.waits_caused.max(1),
                p99_ns: 0,
                max_ns: g.max_hold_ns,
                max_is_upper_bound: false,
                share: share(g.wait_caused_ns, report),
                thread: None,
                place: match &g.outside_locker {
                    Some(outside) => format!("{} (by {})", g.place, escaped(outside)),
                    None => g.place.clone(),
                },
                detail: vec![detail],
            }
        })
        .collect()
}
