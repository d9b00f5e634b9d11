//! The stack pane's text: a stack's frames, and why its waits or holds lasted (the holders
//! waited behind, the off-CPU time, where a hold slept, the waiting it caused).

use crate::model::report::Entry;
use crate::present::short_frame;
use crate::text::escaped;

/// Holders waited behind (shown per wait).
pub(super) const BLOCKERS_IN_PANE: usize = 4;

/// The attribution column of the stack pane: for a wait, its sleeping part and the holders it
/// waited behind; for a hold, its off-CPU time, where it slept, and the waiting it caused.
pub(super) fn why_lines(e: &Entry) -> Vec<String> {
    let mut lines = Vec::new();
    let pct = |part: u64| part as f64 * 100.0 / e.total_ns.max(1) as f64;
    if let Some(contended) = e.contended_ns.filter(|&ns| ns > 0) {
        lines.push(format!("asleep in slow path: {:.0}%", pct(contended)));
    }
    if !e.blocked_by.is_empty() {
        lines.push("waited behind:".into());
    }
    for b in e.blocked_by.iter().take(BLOCKERS_IN_PANE) {
        let who = match &b.locker {
            Some(l) => format!("{} {}", escaped(l.comm.as_deref().unwrap_or("?")), l.pid),
            None => match b.tids.first() {
                Some(tid) => format!("tid {tid}"),
                None => "threads not recorded".to_string(),
            },
        };
        lines.push(format!(
            "{:>3.0}% {} hold [{}] {who}",
            b.share * 100.0,
            b.mode.label(),
            b.cause.label()
        ));
        if let Some(top) = b.frames.iter().find(|f| f.kernel).or(b.frames.first()) {
            lines.push(format!("     {}", short_frame(top)));
        }
    }
    if let Some(off) = e
        .offcpu
        .as_ref()
        .filter(|o| o.runnable_ns + o.sleeping_ns > 0)
    {
        lines.push(format!(
            "off CPU: runnable {:.0}%, asleep {:.0}% (D {:.0}%)",
            pct(off.runnable_ns),
            pct(off.sleeping_ns),
            pct(off.uninterruptible_ns)
        ));
    }
    if !e.sleep_frames.is_empty() {
        lines.push("slept in:".into());
        lines.extend(
            e.sleep_frames
                .iter()
                .take(6)
                .map(|f| format!("  {}", short_frame(f))),
        );
    }
    if let Some(caused) = e.blocked_others.as_ref().filter(|b| b.count > 0) {
        lines.push(format!(
            "blocked others: {} over {} waits",
            crate::present::human_ns(caused.wait_ns),
            caused.count
        ));
    }
    if !lines.is_empty() {
        lines.insert(0, "why:".into());
    }
    lines
}

/// User frames, then kernel frames, innermost first, as in the text report; each part under a
/// title line.
pub(super) fn stack_parts(e: &Entry) -> [Vec<String>; 2] {
    if !e.stack_collected {
        let none = "(no stack: each one was under the --stack-threshold)".to_string();
        return [vec![none], Vec::new()];
    }
    let part = |kernel: bool, title: &str| {
        let mut lines = vec![title.to_string()];
        lines.extend(
            e.frames
                .iter()
                .filter(|f| f.kernel == kernel)
                .map(short_frame),
        );
        lines
    };
    let user_title = format!("user frames ({}):", e.user_stack.name());
    [part(false, &user_title), part(true, "kernel frames:")]
}

/// One column: user frames, then kernel frames.
pub(super) fn stack_lines(e: &Entry) -> Vec<String> {
    stack_parts(e).into_iter().flatten().collect()
}
