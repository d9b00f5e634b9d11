//! The latencytop-style text report: header, table by cause, then one block per call stack in
//! the format of the 2008 ptrace latency tracer, then every loss counter that is not zero.

use std::fmt::Write as _;

use tracer_common::ModeTotals;

use crate::model::place::NO_STACK_PLACE;
use crate::model::processes::UNKNOWN_COMM;
use crate::model::self_cost::SelfCost;
use crate::model::unwound::UserStackKind;

use crate::model::{
    report::{Entry, Kind, Mode, Report},
    schema::HolderGroup,
    Cause, Frame,
};

use super::{human_ns, unnamed_frame};
use crate::text::escaped;

pub fn render(report: &Report, top: usize) -> String {
    let mut out = String::new();
    header(&mut out, report);
    answer(&mut out, report);
    processes(&mut out, report, top);
    crate::model::sections::text(&mut out, report);
    causes(&mut out, report);
    blocks(&mut out, report, top);
    footer(&mut out, report);
    self_cost(&mut out, &report.self_cost);
    out
}

/// What was traced, as the header names it: `pid 42 (app)`, or `all processes`.
pub fn traced(r: &Report) -> String {
    if r.target.system_wide {
        return escaped(&r.target.comm).into_owned();
    }
    let pids: Vec<String> = r.target.pids.iter().map(u32::to_string).collect();
    format!("pid {} ({})", pids.join(","), escaped(&r.target.comm))
}

/// Whether the report splits by process: system-wide, several targets, or a traced command
/// whose own processes (its children) locked their own mms.
pub fn splits_by_process(r: &Report) -> bool {
    let mut owners = r
        .entries
        .iter()
        .filter(|e| e.locker.is_none())
        .map(|e| e.pid);
    let first = owners.next();
    r.target.system_wide || r.target.pids.len() > 1 || owners.any(|pid| Some(pid) != first)
}

fn header(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "mmapsem-trace: {}, {} thread{}, traced {}{}",
        traced(r),
        r.target.threads,
        if r.target.threads == 1 { "" } else { "s" },
        human_ns(r.duration_ns),
        if r.target.exited {
            " (target exited)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "waiting for mmap_lock: {:.1}% of thread time ({} of {})",
        r.wait_share * 100.0,
        human_ns(r.totals.read.wait_ns + r.totals.write.wait_ns - outside_wait(r)),
        human_ns(r.thread_time_ns)
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<6} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10}",
        "mode", "acquired", "failed-try", "interrupted", "wait", "max wait", "hold", "max hold"
    );
    for (name, m) in [("read", &r.totals.read), ("write", &r.totals.write)] {
        mode_row(out, name, m);
    }
    let outside = &r.outside_totals;
    if outside.read.acquisitions + outside.write.acquisitions > 0 {
        let _ = writeln!(
            out,
            "  of which by outside lockers (other processes locking the target's mm):"
        );
        for (name, m) in [("read", &outside.read), ("write", &outside.write)] {
            mode_row(out, name, m);
        }
    }
    downgrades(out, r.totals.write.downgrades);
}

/// Who waited and behind whom, summed, ahead of the details: what to fix, in a few lines.
fn answer(out: &mut String, r: &Report) {
    let a = &r.answer;
    if a.who_waited.is_empty() {
        return;
    }
    let waited: u64 = r
        .entries
        .iter()
        .filter(|e| e.kind == Kind::Wait)
        .map(|e| e.total_ns)
        .sum();
    let _ = writeln!(out, "\nWho waited ({} in all):", human_ns(waited));
    for g in &a.who_waited {
        let _ = writeln!(
            out,
            "{}  ({} wait{}, max {})",
            answer_head(g.share, g.wait_ns, g.mode, g.cause, &g.place),
            g.waits,
            if g.waits == 1 { "" } else { "s" },
            human_ns(g.max_wait_ns)
        );
    }
    if a.behind_whom.is_empty() {
        // Holders are tracked with the off-CPU split (the attribution `--lean` leaves out).
        let why = if r.features.offcpu {
            "no wait found the lock held by a thread the trace saw take it"
        } else {
            "--lean, and serve without --stacks, time the lock without naming holders"
        };
        let _ = writeln!(out, "Behind whom: no wait was charged to a holder ({why})");
        return;
    }
    let _ = writeln!(
        out,
        "Behind whom ({} charged to holders{}):",
        human_ns(waited.saturating_sub(a.wait_unattributed_ns)),
        if a.wait_unattributed_ns > 0 {
            format!(", {} to none", human_ns(a.wait_unattributed_ns))
        } else {
            String::new()
        }
    );
    for g in &a.behind_whom {
        let who = match &g.outside_locker {
            Some(name) => format!(" by {}", escaped(name)),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "{}{who}  ({} behind {}{})",
            answer_head(g.share, g.wait_caused_ns, g.mode, g.cause, &g.place),
            waits_caused(g.waits_caused, g.wait_caused_ns),
            holds_line(g),
            threads_note(&g.threads)
        );
    }
}

/// `3 waits`; `part of a wait` where the waits behind a holder, split over the waiter's
/// unwound stacks in proportion (`--user-stack dwarf`), came to less than a whole one here.
fn waits_caused(count: u64, ns: u64) -> String {
    match count {
        0 if ns > 0 => "part of a wait".to_string(),
        1 => "1 wait".to_string(),
        n => format!("{n} waits"),
    }
}

/// `    75%   750.0 µs  write munmap     munmap`: an answer line's share, time, mode, cause and
/// the frame that names it.
fn answer_head(share: f64, ns: u64, mode: Mode, cause: Cause, place: &str) -> String {
    // `no stack (short)` already says there is no stack to name a place by.
    let place = if cause == Cause::NoStack && place == NO_STACK_PLACE {
        "".into()
    } else {
        escaped(place)
    };
    format!(
        "  {:>4.0}% {:>10}  {:<5} {:<10} {place}",
        share * 100.0,
        human_ns(ns),
        mode.label(),
        cause.label(),
    )
}

/// `3 holds, max 40.00 ms, 30% asleep, 5% runnable`: the holds behind a holder group, and
/// where their time went off CPU.
fn holds_line(g: &HolderGroup) -> String {
    if g.holds == 0 {
        return "holds not kept (full map)".into();
    }
    let mut line = format!(
        "{} hold{}, max {}",
        g.holds,
        if g.holds == 1 { "" } else { "s" },
        human_ns(g.max_hold_ns)
    );
    let pct = |ns: u64| (ns as f64 * 100.0 / g.hold_ns.max(1) as f64).round() as u64;
    if pct(g.offcpu.sleeping_ns) > 0 {
        let _ = write!(line, ", {}% asleep", pct(g.offcpu.sleeping_ns));
    }
    if pct(g.offcpu.runnable_ns) > 0 {
        let _ = write!(line, ", {}% runnable", pct(g.offcpu.runnable_ns));
    }
    line
}

/// `, threads 77 78 (+3)`: the holder threads seen.
fn threads_note(tids: &[u32]) -> String {
    const SHOWN: usize = 3;
    if tids.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = tids.iter().take(SHOWN).map(u32::to_string).collect();
    let more = tids.len().saturating_sub(SHOWN);
    let thread = if tids.len() == 1 { "thread" } else { "threads" };
    if more > 0 {
        format!("; {thread} {} (+{more})", shown.join(" "))
    } else {
        format!("; {thread} {}", shown.join(" "))
    }
}

fn processes(out: &mut String, r: &Report, top: usize) {
    if !splits_by_process(r) {
        return;
    }
    let _ = writeln!(
        out,
        "\nTop {} of {} processes by wait:",
        r.processes.len().min(top),
        r.processes.len()
    );
    let shown = &r.processes[..r.processes.len().min(top)];
    let names: Vec<String> = shown.iter().map(process_name).collect();
    // As wide as the longest name shown (`true (3180 processes)`), within reason.
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(16, 40);
    // Only where processes are in cgroups of their own: beside v1 controllers, every process
    // may sit in the unified hierarchy's root.
    let cgroups = shown
        .iter()
        .any(|p| p.cgroup.as_deref().is_some_and(|c| c != "/"));
    let _ = writeln!(
        out,
        "{:>8} {:<width$} {:>9} {:>10} {:>10} {:>6} {:>9} {:>10} {:>10}{}",
        "pid",
        "comm",
        "waits",
        "wait",
        "max wait",
        "share",
        "holds",
        "hold",
        "max hold",
        if cgroups { "  cgroup" } else { "" }
    );
    for (p, name) in shown.iter().zip(names) {
        let cgroup = match (cgroups, &p.cgroup) {
            (true, Some(path)) => format!("  {}", escaped(path)),
            (true, None) => "  ?".to_string(),
            (false, _) => String::new(),
        };
        let _ = writeln!(
            out,
            "{:>8} {:<width$} {:>9} {:>10} {:>10} {:>5.1}% {:>9} {:>10} {:>10}{cgroup}",
            p.pid,
            name,
            p.waits,
            human_ns(p.wait_ns),
            human_ns(p.max_wait_ns),
            p.wait_share * 100.0,
            p.holds,
            human_ns(p.hold_ns),
            human_ns(p.max_hold_ns)
        );
    }
}

fn outside_wait(r: &Report) -> u64 {
    r.outside_totals.read.wait_ns + r.outside_totals.write.wait_ns
}

fn mode_row(out: &mut String, name: &str, m: &ModeTotals) {
    let _ = writeln!(
        out,
        "{:<6} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10}",
        name,
        m.acquisitions,
        m.failed_trylocks,
        m.interrupted,
        human_ns(m.wait_ns),
        human_ns(m.max_wait_ns),
        human_ns(m.hold_ns),
        human_ns(m.max_hold_ns)
    );
}

/// A write hold downgraded to read (munmap does it to free the pages outside the write lock)
/// goes on as a read hold that no read acquisition began: without this line the read row's
/// holds outnumber its acquisitions with nothing to say why.
fn downgrades(out: &mut String, downgrades: u64) {
    if downgrades > 0 {
        let _ = writeln!(
            out,
            "{downgrades} write holds were downgraded to read (munmap; brk and mremap when they \
             shrink):\n  they went on as read holds, so the read holds outnumber the read \
             acquisitions by as many"
        );
    }
}

fn causes(out: &mut String, r: &Report) {
    let _ = writeln!(out, "\nBy cause:");
    let _ = writeln!(
        out,
        "{:<17} {:<5} {:<6} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "cause", "kind", "mode", "count", "total", "avg", "p99", "max"
    );
    for c in &r.causes {
        let _ = writeln!(
            out,
            "{:<17} {:<5} {:<6} {:>9} {:>10} {:>10} {:>10} {:>10}",
            c.cause.label(),
            c.kind.label(),
            c.mode.label(),
            c.count,
            human_ns(c.total_ns),
            human_ns(c.avg_ns),
            human_ns(c.p99_ns),
            bounded_ns(c.max_ns, c.max_is_upper_bound)
        );
    }
    if r.causes.iter().any(|c| c.cause == Cause::PageFault) {
        let _ = writeln!(
            out,
            "(page fault: any fault that took mmap_lock, user-mode or in the kernel; see Page \
             faults above)"
        );
    }
}

fn blocks(out: &mut String, r: &Report, top: usize) {
    if r.entries.is_empty() {
        let _ = writeln!(
            out,
            "\nNo waits or holds of mmap_lock were seen: the traced threads did not take it \
             during the trace."
        );
        return;
    }
    let shown = r.entries.len().min(top);
    let (order, how) = block_order(r);
    let _ = writeln!(
        out,
        "\nTop {shown} of {} call stacks by total time{how}:",
        r.entries.len()
    );
    let name_process = splits_by_process(r);
    for e in order.into_iter().take(top) {
        block(out, e, r.stack_threshold_ns, name_process);
    }
}

/// The entries in the order their blocks are shown: by total time, except that when holders
/// were named, holds that made nobody wait come after the waits and the holds that did.
fn block_order(r: &Report) -> (Vec<&Entry>, &'static str) {
    let blocked_nobody =
        |e: &Entry| e.kind == Kind::Hold && e.blocked_others.as_ref().is_none_or(|b| b.count == 0);
    let attributed = r.entries.iter().any(|e| !e.blocked_by.is_empty());
    if !attributed {
        return (r.entries.iter().collect(), "");
    }
    let (first, after): (Vec<&Entry>, Vec<&Entry>) =
        r.entries.iter().partition(|e| !blocked_nobody(e));
    (
        first.into_iter().chain(after).collect(),
        " (the holds that made nobody wait after the rest)",
    )
}

/// `cat pid 9`, or `cat, 3187 processes` for an outside locker whose processes of one name were
/// folded into one.
fn locker_name(l: &crate::model::report::Locker) -> String {
    let comm = escaped(l.comm.as_deref().unwrap_or("?"));
    if l.processes > 1 {
        format!("{comm}, {} processes", l.processes)
    } else {
        format!("{comm} pid {}", l.pid)
    }
}

/// A process row's name: its comm, with how many processes it stands for when several.
fn process_name(p: &crate::model::schema::ProcessRow) -> String {
    if p.processes > 1 {
        format!("{} ({} processes)", escaped(&p.comm), p.processes)
    } else {
        escaped(&p.comm).into_owned()
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn block(out: &mut String, e: &Entry, threshold_ns: u64, name_process: bool) {
    // `≤`: the maximum is an upper bound (see `max_bound`).
    let _ = writeln!(
        out,
        "\n=====> Total: {:.3} ms, average: {:.3} ms, max: {}{:.3} ms, p99: {:.3} ms, times: {}  [{}]",
        ms(e.total_ns),
        ms(e.avg_ns),
        max_bound(e),
        ms(e.max_ns),
        ms(e.p99_ns),
        e.count,
        tags(e, name_process)
    );
    if !e.stack_collected && threshold_ns == u64::MAX {
        let _ = writeln!(out, "=== (no stack: --lean takes none)");
    } else if !e.stack_collected {
        // Stacks are walked inside the critical section only for operations past the late
        // threshold: shorter ones get them only when their wait slept, or sampled.
        let late_ns = threshold_ns.max(tracer_common::LATE_STACK_FLOOR_NS);
        let _ = writeln!(
            out,
            "=== (no stack: under the {} stack threshold, or its wait never slept and it \
             lasted under {}; see --stack-threshold)",
            human_ns(threshold_ns),
            human_ns(late_ns)
        );
    }
    for f in &e.frames {
        let _ = writeln!(out, "=== {}", frame_line(f));
    }
    if let Some(contended) = e.contended_ns.filter(|&ns| ns > 0) {
        let _ = writeln!(
            out,
            "--> asleep in the rwsem slow path: {} ({:.0}% of the wait)",
            human_ns(contended),
            percent(contended, e.total_ns)
        );
    }
    waited_behind(out, e);
    asleep_while_holding(out, e);
    if let Some(caused) = e.blocked_others.as_ref().filter(|b| b.count > 0) {
        let _ = writeln!(
            out,
            "--> blocked others: {} of waiting, {} waits",
            human_ns(caused.wait_ns),
            caused.count
        );
    }
}

/// A duration, `≤` first when it is only an upper bound.
fn bounded_ns(ns: u64, upper_bound: bool) -> String {
    if upper_bound {
        format!("≤{}", human_ns(ns))
    } else {
        human_ns(ns)
    }
}

/// `≤` before a maximum that is only an upper bound: part of an entry whose uncopied events
/// were spread over its unwound stacks (the part may not hold the longest one), or a
/// frame-pointer entry whose longest event moved to an unwound one.
fn max_bound(e: &Entry) -> &'static str {
    if e.max_is_upper_bound {
        "≤"
    } else {
        ""
    }
}

/// Blockers shown per wait block, and frames shown per blocker.
const BLOCKERS_SHOWN: usize = 3;
const BLOCKER_FRAMES_SHOWN: usize = 12;

fn waited_behind(out: &mut String, e: &Entry) {
    for b in e.blocked_by.iter().take(BLOCKERS_SHOWN) {
        let who = match &b.locker {
            Some(l) => format!("outside locker {}", locker_name(l)),
            None if b.tids.is_empty() => "threads not recorded".to_string(),
            None => format!("tid {}", join(&b.tids)),
        };
        let _ = writeln!(
            out,
            "--> waited behind: {:.0}% ({}) a {} hold [{}], {who}",
            b.share * 100.0,
            human_ns(b.wait_ns),
            b.mode.label(),
            b.cause.label()
        );
        if b.frames.is_empty() {
            let _ = writeln!(
                out,
                "      (holder stack not known: still holding, or below the threshold)"
            );
        }
        for f in b.frames.iter().take(BLOCKER_FRAMES_SHOWN) {
            let _ = writeln!(out, "      === {}", frame_line(f));
        }
    }
    if e.blocked_by.len() > BLOCKERS_SHOWN {
        let _ = writeln!(
            out,
            "--> waited behind {} more holder stacks",
            e.blocked_by.len() - BLOCKERS_SHOWN
        );
    }
}

fn asleep_while_holding(out: &mut String, e: &Entry) {
    let Some(off) = e.offcpu.as_ref() else {
        return;
    };
    if off.runnable_ns + off.sleeping_ns == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "--> off CPU while holding: runnable {:.0}% ({}), asleep {:.0}% ({}, {} in D state)",
        percent(off.runnable_ns, e.total_ns),
        human_ns(off.runnable_ns),
        percent(off.sleeping_ns, e.total_ns),
        human_ns(off.sleeping_ns),
        human_ns(off.uninterruptible_ns)
    );
    if !e.sleep_frames.is_empty() {
        let _ = writeln!(out, "--> asleep while holding, mostly in:");
        for f in e.sleep_frames.iter().take(BLOCKER_FRAMES_SHOWN) {
            let _ = writeln!(out, "      === {}", frame_line(f));
        }
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn join(tids: &[u32]) -> String {
    tids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `[kind, mode, cause, ...]`; with `name_process`, the process whose mm it is comes first.
fn tags(e: &Entry, name_process: bool) -> String {
    let mut tags = Vec::new();
    if name_process {
        tags.push(format!(
            "pid {} ({})",
            e.pid,
            escaped(e.comm.as_deref().unwrap_or(UNKNOWN_COMM))
        ));
    }
    tags.extend([
        e.kind.label().to_string(),
        e.mode.label().to_string(),
        e.cause.label().to_string(),
    ]);
    if e.user_stack != UserStackKind::None {
        let estimated = if e.user_stack_estimated {
            " (sampled)"
        } else {
            ""
        };
        tags.push(format!("user stack: {}{estimated}", e.user_stack.name()));
    }
    if let Some(locker) = &e.locker {
        tags.push(format!("outside locker: {}", locker_name(locker)));
    } else if let Some(tid) = e.tid {
        tags.push(format!("tid {tid}"));
    }
    tags.join(", ")
}

/// `module (symbol) file:line`, or symbol+offset without debug info, or module+0xFILE_OFFSET
/// without a symbol (the runtime address only where the file offset is not known).
pub fn frame_line(f: &Frame) -> String {
    let module = escaped(&f.module);
    let symbol = f.symbol.as_deref().map(escaped);
    match (symbol, &f.file, f.line) {
        (Some(sym), Some(file), Some(line)) => {
            format!("{module} ({sym}) {}:{line}{}", escaped(file), inl(f))
        }
        (Some(sym), _, _) => match f.offset {
            Some(off) => format!("{module} ({sym}+{off:#x}){}", inl(f)),
            None => format!("{module} ({sym}){}", inl(f)),
        },
        (None, _, _) => unnamed_frame(&module, f),
    }
}

fn inl(f: &Frame) -> &'static str {
    if f.inlined {
        " [inlined]"
    } else {
        ""
    }
}

/// Operations already in progress when tracing started: counted beside the losses, not one.
const BEGAN_BEFORE_ATTACH: &str = "began_before_attach";

/// `name=count` of every lost or unpaired-event counter that is not zero.
pub fn nonzero_lost(r: &Report) -> Vec<String> {
    r.lost
        .iter()
        .filter(|(&name, &n)| n > 0 && name != BEGAN_BEFORE_ATTACH)
        .map(|(name, n)| format!("{name}={n}"))
        .collect()
}

/// What the user can do about a counter that is not zero, when there is something.
fn remedy(counter: &str) -> Option<&'static str> {
    Some(match counter {
        "aggregation_map_full" | "blocked_map_full" | "sleep_map_full" => {
            "raise --max-entries (entries of the per-stack maps)"
        }
        "kernel_stack_collision" | "user_stack_collision" | "kernel_stack_failed"
        | "user_stack_failed" => "raise --max-stacks",
        "user_stack_copy_dropped" => {
            "copies over the per-CPU budget or ring: those events keep frame-pointer stacks; \
             --user-stack-sample N copies fewer"
        }
        "holder_stack_missing" => {
            "those waits are charged to their holder's thread without its stacks (the holder \
             was still queued or holding, or its record aged out)"
        }
        "reader_overflow" => "waits behind more concurrent readers than tracked are charged to those tracked",
        "name_map_full" => {
            "more locking processes than the names map holds (16384): those beyond it are \
             shown as ?"
        }
        "state_map_full" | "thread_map_full" | "target_map_full" => {
            "a fixed-size map of the tracer filled up: please report it with the target's thread count"
        }
        "timeline_dropped" => "the timeline ring filled: raise --threshold to keep fewer events",
        "waker_map_full" => "more kinds of holder sleeps and wakers than the wakers map holds (4096)",
        "cgroup_map_full" => {
            "more locking processes than the cgroups map holds (16384): those beyond it are \
             shown without their cgroup"
        }
        _ => return None,
    })
}

fn footer(out: &mut String, r: &Report) {
    let nonzero = nonzero_lost(r);
    let _ = writeln!(out);
    if nonzero.is_empty() {
        let _ = writeln!(out, "Lost or unpaired events: none");
    } else {
        let _ = writeln!(out, "Lost or unpaired events: {}", nonzero.join(", "));
    }
    for (name, _) in r.lost.iter().filter(|(_, &n)| n > 0) {
        if let Some(what) = remedy(name) {
            let _ = writeln!(out, "  {name}: {what}");
        }
    }
    if let Some(&n) = r.lost.get(BEGAN_BEFORE_ATTACH).filter(|&&n| n > 0) {
        let _ = writeln!(
            out,
            "Already in progress when tracing started (not timed): {n} lock operations"
        );
    }
    if r.in_flight.waits + r.in_flight.holds > 0 {
        let _ = writeln!(
            out,
            "Still in progress when tracing stopped (not timed): {} waits, {} holds",
            r.in_flight.waits, r.in_flight.holds
        );
    }
}

/// What the tracer's programs cost: a headline, then one row per program, then what the
/// estimate does and does not count.
fn self_cost(out: &mut String, cost: &SelfCost) {
    let _ = writeln!(out);
    let (Some(rate), Some(added_ns)) = (cost.events_per_second, cost.added_ns) else {
        let why = cost.reason.as_deref().unwrap_or_default();
        let _ = writeln!(out, "Self-cost: unavailable ({why})");
        tracer_cpu(out, cost);
        return;
    };
    let share = cost.added_share.map_or(String::new(), |share| {
        format!(", {:.2}% of the traced threads' time", share * 100.0)
    });
    let counted = match cost.counted_share {
        Some(share) if cost.sampled() => {
            format!(", counted in the {:.0}% of the time sampled", share * 100.0)
        }
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "Self-cost: {rate:.0} events/s ({} program runs{counted}), about {} added to the \
         threads that hit them{share}",
        cost.runs(),
        human_ns(added_ns)
    );
    let _ = writeln!(
        out,
        "{:<32} {:>12} {:>8} {:>10}",
        "program", "runs", "ns/run", "time"
    );
    for p in &cost.programs {
        let _ = writeln!(
            out,
            "{:<32} {:>12} {:>8} {:>10}",
            p.name,
            p.runs,
            p.ns_per_run,
            human_ns(p.run_time_ns)
        );
    }
    let _ = writeln!(
        out,
        "(an estimate from the kernel's BPF run-time statistics: each program runs in the context \
         of the thread that hit its event;\n so it counts the events of other processes that the \
         programs filter out, and not the tracepoints' own dispatch)"
    );
    tracer_cpu(out, cost);
}

/// The tracer process's own CPU, beside what its programs added to the traced threads, and
/// everything it took.
fn tracer_cpu(out: &mut String, cost: &SelfCost) {
    let Some(share) = cost.tracer_cpu_share else {
        return;
    };
    let _ = writeln!(
        out,
        "The tracer process used {} of CPU ({:.2}% of one CPU) while tracing: reading maps and \
         /proc, unwinding",
        human_ns(cost.tracer_cpu_ns),
        share * 100.0
    );
    if let (Some(own_ns), Some(own_share), Some(lengthened_ns)) =
        (cost.own_cost_ns, cost.own_cost_share, cost.lengthened_ns)
    {
        let _ = writeln!(
            out,
            "All told the tracer took {} ({:.2}% of what the traced threads could run): its \
             programs, {} more waiting behind the holds they lengthened, and its process",
            human_ns(own_ns),
            own_share * 100.0,
            human_ns(lengthened_ns)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        build_report,
        report::tests::{attributed, sample},
        self_cost::{RunStats, TracerCpu},
    };

    fn rendered() -> String {
        let (harvest, symbols, meta) = sample();
        render(&build_report(&harvest, &symbols, &meta), 10)
    }

    #[test]
    fn the_answer_leads_who_waited_then_behind_whom() {
        let (harvest, symbols, meta) = crate::model::report::tests::attributed();
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        let who = text.find("Who waited (9.00 ms in all):").expect(&text);
        let behind = text.find("Behind whom (1.00 ms charged to holders, 8.00 ms to none):");
        let behind = behind.expect(&text);
        let details = text.find("call stacks by total time").expect(&text);
        assert!(who < behind && behind < details, "{text}");
        let holder = text[behind..].lines().nth(1).unwrap();
        assert_eq!(
            holder,
            "    75%   750.0 µs  write munmap     munmap  (2 waits behind 1 hold, max 40.00 ms, \
             50% asleep, 13% runnable; thread 7)"
        );
    }

    #[test]
    fn holds_that_made_nobody_wait_come_after_the_rest_when_holders_are_named() {
        let (harvest, symbols, meta) = crate::model::report::tests::attributed();
        let mut report = build_report(&harvest, &symbols, &meta);
        // The /proc reader's hold, which nobody waited behind, made the largest.
        let reader = report
            .entries
            .iter()
            .position(|e| e.cause == Cause::ProcReader)
            .unwrap();
        let reader = report.entries.remove(reader);
        report.entries.insert(0, reader);
        let text = render(&report, 10);
        assert!(
            text.contains("call stacks by total time (the holds that made nobody wait after"),
            "{text}"
        );
        let at = |tag: &str| text.find(tag).unwrap_or_else(|| panic!("{tag}: {text}"));
        assert!(at("[wait, read, page fault") < at("[hold, read, /proc reader"));
        assert!(
            at("[hold, write, munmap") < at("[wait, read, page fault"),
            "it blocked one"
        );
        // Without holders named (timing only), the order is by total time alone.
        let plain = render(&build_report(&harvest, &symbols, &meta), 10);
        assert!(
            plain.contains("call stacks by total time (the holds"),
            "{plain}"
        );
        let (sample, symbols, meta) = sample();
        let unattributed = render(&build_report(&sample, &symbols, &meta), 10);
        assert!(
            unattributed.contains("call stacks by total time:"),
            "{unattributed}"
        );
    }

    #[test]
    fn a_trace_without_locks_says_so_rather_than_listing_none() {
        let (_, symbols, meta) = sample();
        let empty = crate::model::Harvest::default();
        let text = render(&build_report(&empty, &symbols, &meta), 10);
        assert!(!text.contains("Top 0 of 0"), "{text}");
        assert!(
            text.contains("No waits or holds of mmap_lock were seen"),
            "{text}"
        );
    }

    #[test]
    fn header_totals_and_causes() {
        let text = rendered();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "mmapsem-trace: pid 42 (app), 4 threads, traced 1.00 s"
        );
        assert!(
            lines[1].starts_with("waiting for mmap_lock: 0.2% of thread time (9.00 ms of 4.00 s)"),
            "{}",
            lines[1]
        );
        assert!(text.contains("\nwrite           3"), "{text}");
        assert!(text.contains("of which by outside lockers"), "{text}");
        assert!(
            text.contains("munmap            hold  write          1   40.00 ms"),
            "{text}"
        );
    }

    #[test]
    fn downgrades_are_said_only_when_there_were_some() {
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        assert!(!render(&report, 10).contains("downgraded"));
        report.totals.write.downgrades = 7;
        let text = render(&report, 10);
        assert!(
            text.contains("\n7 write holds were downgraded to read (munmap; brk and mremap when they shrink):\n  they went on as read holds"),
            "{text}"
        );
    }

    #[test]
    fn blocks_in_the_2008_format() {
        let text = rendered();
        let block = "=====> Total: 40.000 ms, average: 40.000 ms, max: 40.000 ms, p99: 40.000 ms, times: 1  [hold, write, munmap, user stack: fp]\n\
                     === /usr/bin/app (munmap)\n=== /usr/bin/app (scan_file)\n=== kernel (__vm_munmap)\n=== kernel (do_syscall_64)\n";
        assert!(text.contains(block), "{text}");
        assert!(
            text.contains("[hold, read, /proc reader, outside locker: cat pid 9]"),
            "{text}"
        );
        assert!(
            text.contains(
                "=== (no stack: under the 10.0 µs stack threshold, or its wait never slept and \
                 it lasted under 1.00 ms; see --stack-threshold)"
            ),
            "{text}"
        );
    }

    #[test]
    fn attribution_lines() {
        let (harvest, symbols, meta) = attributed();
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        for line in [
            "Page faults: 1000 by the target (minor + major, in user mode and in the kernel, from /proc)\n  \
             user-mode faults that fell back from the per-VMA lock: took mmap_lock 3 times (each retry counts), held it 2 times\n  \
             kernel-mode faults (inside a syscall, e.g. copy_to_user in read(); no per-VMA lock): held mmap_lock 1 times, counting holds with a kernel stack only (the others are in `in read()`, `in write()` and `in a syscall`)\n  \
             filemap faults: 10, 1 of them under mmap_lock\n",
            "(page fault: any fault that took mmap_lock, user-mode or in the kernel; see Page faults above)",
            "munmap            2   50.00 ms   25.00 ms      8.00 ms     40.00 ms",
            "--> waited behind: 75% (750.0 µs) a write hold [munmap], tid 7",
            "      === /usr/bin/app (munmap)",
            "--> waited behind: 25% (250.0 µs) a write hold [no stack (short)], tid 8",
            "      (holder stack not known: still holding, or below the threshold)",
            "--> off CPU while holding: runnable 12% (5.00 ms), asleep 50% (20.00 ms, 15.00 ms in D state)",
            "--> asleep while holding, mostly in:\n      === kernel (io_schedule)",
            "--> blocked others: 750.0 µs of waiting, 2 waits",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn a_maximum_known_only_as_a_bound_is_marked() {
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.entries[0].max_is_upper_bound = true;
        let text = render(&report, 10);
        assert!(
            text.contains("=====> Total: 40.000 ms, average: 40.000 ms, max: ≤40.000 ms, p99:"),
            "{text}"
        );
        assert!(
            text.contains("=====> Total: 8.000 ms, average: 4.000 ms, max: 5.000 ms,"),
            "an exact maximum has no mark: {text}"
        );
        report.causes = crate::model::report::cause_rows(&report.entries);
        let text = render(&report, 10);
        assert!(
            text.contains("munmap            hold  write          1   40.00 ms   40.00 ms   40.00 ms  ≤40.00 ms"),
            "{text}"
        );
    }

    #[test]
    fn footer_lists_nonzero_losses_only() {
        let text = rendered();
        assert!(
            text.contains("\nLost or unpaired events: unpaired_release=2\n"),
            "{text}"
        );
    }

    #[test]
    fn footer_says_what_to_raise_and_keeps_the_attach_edge_apart() {
        let (harvest, symbols, meta) = attributed();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.lost.insert("aggregation_map_full", 3);
        report.lost.insert("began_before_attach", 5);
        let text = render(&report, 10);
        for line in [
            "\nLost or unpaired events: aggregation_map_full=3, unpaired_release=2\n",
            "\n  aggregation_map_full: raise --max-entries (entries of the per-stack maps)\n",
            "\nAlready in progress when tracing started (not timed): 5 lock operations\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn self_cost_closes_the_report() {
        let (mut harvest, symbols, meta) = sample();
        harvest.tracer_cpu = TracerCpu {
            cpu_ns: meta.duration_ns / 50,
            wall_ns: meta.duration_ns,
        };
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        let section = &text[text.find("\nSelf-cost:").expect(&text)..];
        let lines: Vec<&str> = section.trim().lines().collect();
        assert_eq!(
            lines[..4],
            [
                "Self-cost: 8000 events/s (8000 program runs), about 4.40 ms added to the threads \
                 that hit them, 0.11% of the traced threads' time",
                "program                                  runs   ns/run       time",
                "mmap_lock_released                       4000      700    2.80 ms",
                "mmap_lock_start_locking                  4000      400    1.60 ms",
            ]
        );
        assert!(lines[4].starts_with("(an estimate"), "{section}");
        assert!(lines[5].starts_with(" so it counts"), "{section}");
        assert!(
            lines[6].starts_with("The tracer process used ")
                && lines[6].contains(" of CPU (2.00% of one CPU) while tracing"),
            "{section}"
        );
        assert!(
            lines[7].starts_with("All told the tracer took ")
                && lines[7].contains("% of what the traced threads could run)"),
            "{section}"
        );
        assert_eq!(lines.len(), 8, "the report ends there: {section}");
    }

    #[test]
    fn sampled_self_cost_says_what_share_it_counted() {
        let (mut harvest, symbols, meta) = sample();
        let RunStats::Counted(programs) = harvest.run_stats.clone() else {
            panic!("the sample counts every run")
        };
        harvest.run_stats = RunStats::Sampled {
            programs,
            counted_ns: meta.duration_ns / 10,
        };
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        assert!(
            text.contains(
                "\nSelf-cost: 80000 events/s (8000 program runs, counted in the 10% of the time \
                 sampled), about 44.00 ms added to the threads that hit them, "
            ),
            "{text}"
        );
    }

    #[test]
    fn self_cost_unavailable_is_one_line() {
        let (mut harvest, symbols, mut meta) = sample();
        harvest.run_stats = RunStats::Unavailable("BPF_ENABLE_STATS needs CAP_SYS_ADMIN".into());
        meta.thread_time_ns = 0;
        harvest.tracer_cpu = TracerCpu {
            cpu_ns: meta.duration_ns / 100,
            wall_ns: meta.duration_ns,
        };
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        let unavailable = "\n\nSelf-cost: unavailable (BPF_ENABLE_STATS needs CAP_SYS_ADMIN)\n";
        let at = text.find(unavailable).expect(&text);
        let rest = &text[at + unavailable.len()..];
        assert!(
            rest.starts_with("The tracer process used ")
                && rest.ends_with(
                    "(1.00% of one CPU) while tracing: reading maps and /proc, unwinding\n"
                )
                && rest.lines().count() == 1,
            "{text}"
        );
    }

    #[test]
    fn self_cost_without_thread_time_has_no_share() {
        let (harvest, symbols, mut meta) = sample();
        meta.thread_time_ns = 0;
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        assert!(
            text.contains("about 4.40 ms added to the threads that hit them\n"),
            "{text}"
        );
    }

    #[test]
    fn a_folded_process_name_widens_the_process_table_evenly() {
        let (harvest, symbols, mut meta) = sample();
        meta.system_wide = true;
        meta.pids.clear();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.processes[0].comm = "true".into();
        report.processes[0].processes = 3180;
        for row in &mut report.processes {
            row.cgroup = None;
        }
        let text = render(&report, 10);
        let table = process_table(&text);
        assert!(table[1].contains(" true (3180 processes) "), "{text}");
        let widths: Vec<usize> = table.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{table:#?}");
    }

    /// The header and the two rows of `sample()`'s process table.
    fn process_table(text: &str) -> Vec<&str> {
        text.lines()
            .skip_while(|l| !l.starts_with("Top 2 of 2 processes"))
            .skip(1)
            .take(3)
            .collect()
    }

    #[test]
    fn processes_in_cgroups_of_their_own_show_them_escaped() {
        let (harvest, symbols, mut meta) = sample();
        meta.system_wide = true;
        meta.pids.clear();
        let mut report = build_report(&harvest, &symbols, &meta);
        let text = render(&report, 10);
        let table = process_table(&text);
        assert!(table[0].ends_with("max hold  cgroup"), "{text}");
        assert!(table[1].ends_with("  /system.slice/app.service"), "{text}");
        assert!(
            table[2].ends_with("  /user.slice/user-1000.slice/session-2.scope"),
            "{text}"
        );
        report.processes[1].cgroup = Some("/evil\n[fake row]".into());
        report.processes[0].cgroup = Some("/".into());
        let text = render(&report, 10);
        assert!(!text.contains("\n[fake row]"), "{text}");
        for row in &mut report.processes {
            row.cgroup = Some("/".into());
        }
        let text = render(&report, 10);
        assert!(
            !text.contains("cgroup"),
            "all in the root: no column\n{text}"
        );
    }

    #[test]
    fn no_holder_to_charge_is_explained_by_the_mode_traced() {
        let (harvest, symbols, meta) = sample();
        let mut report = build_report(&harvest, &symbols, &meta);
        report.answer.behind_whom.clear();
        let lean = render(&report, 10);
        assert!(
            lean.contains("time the lock without naming holders"),
            "{lean}"
        );
        report.features.offcpu = true;
        let attributed = render(&report, 10);
        assert!(
            attributed.contains("(no wait found the lock held by a thread the trace saw take it)"),
            "{attributed}"
        );
    }

    #[test]
    fn a_share_of_a_wait_split_over_unwound_stacks_is_not_zero_waits() {
        assert_eq!(waits_caused(0, 1_500), "part of a wait");
        assert_eq!(waits_caused(1, 1_500), "1 wait");
        assert_eq!(waits_caused(3, 1_500), "3 waits");
        assert_eq!(waits_caused(0, 0), "0 waits");
    }

    #[test]
    fn waits_without_a_stack_or_a_cause_are_not_said_twice_to_have_no_stack() {
        let line = answer_head(0.5, 1_000, Mode::Read, Cause::NoStack, NO_STACK_PLACE);
        assert_eq!(
            line.trim_end(),
            "    50%     1.0 µs  read  no stack (short)"
        );
        let line = answer_head(0.5, 1_000, Mode::Write, Cause::Mmap, NO_STACK_PLACE);
        assert!(
            line.ends_with("mmap       (no stack: under the stack threshold)"),
            "{line}"
        );
    }

    #[test]
    fn system_wide_reports_lead_with_processes_and_name_them_in_blocks() {
        let (harvest, symbols, mut meta) = sample();
        meta.system_wide = true;
        meta.pids.clear();
        meta.comm = "all processes".into();
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("mmapsem-trace: all processes, 4 threads"),
            "{text}"
        );
        let table = text.find("Top 2 of 2 processes by wait:").expect(&text);
        assert!(
            table < text.find("By cause:").unwrap(),
            "the table comes first"
        );
        for row in [
            "      42 app                      3    9.00 ms    5.00 ms 100.0%         3   40.00 ms   40.00 ms",
            "       9 cat                      0       0 ns       0 ns   0.0%         1    20.0 µs    20.0 µs",
        ] {
            assert!(text.contains(row), "missing {row:?} in:\n{text}");
        }
        assert!(
            text.contains("times: 1  [pid 42 (app), hold, write, munmap, user stack: fp]"),
            "{text}"
        );
        let (harvest, symbols, mut meta) = attributed();
        meta.system_wide = true;
        let text = render(&build_report(&harvest, &symbols, &meta), 10);
        assert!(
            text.contains("Page faults: 1000 by the traced processes (minor + major"),
            "{text}"
        );
    }

    #[test]
    fn single_target_reports_have_no_process_table() {
        let text = rendered();
        assert!(!text.contains("processes by wait"), "{text}");
        assert!(!text.contains("[pid 42"), "{text}");
    }

    #[test]
    fn top_limits_blocks() {
        let (harvest, symbols, meta) = sample();
        let text = render(&build_report(&harvest, &symbols, &meta), 2);
        assert_eq!(text.matches("=====>").count(), 2);
        assert!(text.contains("Top 2 of 5 call stacks"));
    }

    #[test]
    fn frame_lines() {
        let mut f = Frame {
            kernel: false,
            module: "/lib/libc.so.6".into(),
            symbol: Some("mmap".into()),
            offset: Some(0x1a),
            addr: 0x7f00,
            ..Frame::default()
        };
        assert_eq!(frame_line(&f), "/lib/libc.so.6 (mmap+0x1a)");
        f.file = Some("scanners.c".into());
        f.line = Some(470);
        assert_eq!(frame_line(&f), "/lib/libc.so.6 (mmap) scanners.c:470");
        f.symbol = None;
        assert_eq!(frame_line(&f), "/lib/libc.so.6 (0x7f00)");
        f.file_offset = Some(0x2a978);
        assert_eq!(
            frame_line(&f),
            "/lib/libc.so.6+0x2a978",
            "the offset addr2line takes"
        );
        f.module = "/tmp/a\nb.so".into();
        assert_eq!(frame_line(&f), "/tmp/a\\nb.so+0x2a978");
    }
}
