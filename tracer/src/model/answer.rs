//! The report's answer, ahead of its details: who waited (waits summed by mode, cause and the
//! frame that names their stacks) and behind whom (the holders they were charged to, summed the
//! same way, with the holds' own figures beside the wait they caused). Stacks that differ only
//! below their naming frame, or only by offsets in an unnamed object, sum into one line.

use std::collections::{BTreeSet, HashMap};

use super::cause::Cause;
use super::place::place;
use super::schema::{Answer, Entry, HolderGroup, Kind, Mode, OffCpuSplit, WaitGroup};

/// Groups shown of each part.
pub const ANSWER_ROWS: usize = 5;

/// Sums the entries into the answer.
pub fn answer(entries: &[Entry]) -> Answer {
    let waits: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::Wait).collect();
    let all_wait_ns: u64 = waits.iter().map(|e| e.total_ns).sum();
    let charged_ns: u64 = waits
        .iter()
        .flat_map(|e| &e.blocked_by)
        .map(|b| b.wait_ns)
        .sum();
    let mut who_waited = who_waited(&waits, all_wait_ns);
    who_waited.truncate(ANSWER_ROWS);
    let mut behind_whom = behind_whom(entries, &waits, charged_ns);
    behind_whom.truncate(ANSWER_ROWS);
    Answer {
        who_waited,
        behind_whom,
        wait_unattributed_ns: all_wait_ns.saturating_sub(charged_ns),
    }
}

/// Every holder group of the entries, largest wait caused first (the live view's "behind
/// whom" rows; the report keeps ANSWER_ROWS).
pub fn holder_groups(entries: &[Entry]) -> Vec<HolderGroup> {
    let waits: Vec<&Entry> = entries.iter().filter(|e| e.kind == Kind::Wait).collect();
    let charged_ns: u64 = waits
        .iter()
        .flat_map(|e| &e.blocked_by)
        .map(|b| b.wait_ns)
        .sum();
    behind_whom(entries, &waits, charged_ns)
}

type WaitKey = (Mode, Cause, String);

fn who_waited(waits: &[&Entry], all_wait_ns: u64) -> Vec<WaitGroup> {
    let mut groups: HashMap<WaitKey, WaitGroup> = HashMap::new();
    for e in waits {
        let at = place(&e.frames, e.stack_collected);
        let group = groups
            .entry((e.mode, e.cause, at.clone()))
            .or_insert_with(|| WaitGroup {
                mode: e.mode,
                cause: e.cause,
                place: at,
                waits: 0,
                wait_ns: 0,
                max_wait_ns: 0,
                share: 0.0,
                stacks: 0,
            });
        group.waits += e.count;
        group.wait_ns += e.total_ns;
        group.max_wait_ns = group.max_wait_ns.max(e.max_ns);
        group.stacks += 1;
    }
    let mut groups: Vec<WaitGroup> = groups.into_values().collect();
    for g in &mut groups {
        g.share = ratio(g.wait_ns, all_wait_ns);
    }
    largest_first(&mut groups, |g| (g.wait_ns, &g.place));
    groups
}

type HolderKey = (Mode, Cause, String, Option<String>);

fn behind_whom(entries: &[Entry], waits: &[&Entry], charged_ns: u64) -> Vec<HolderGroup> {
    let mut groups: HashMap<HolderKey, HolderGroup> = HashMap::new();
    let mut threads: HashMap<HolderKey, BTreeSet<u32>> = HashMap::new();
    for b in waits.iter().flat_map(|e| &e.blocked_by) {
        let outside = b.outside_locker.then(|| locker_name(b.locker.as_ref()));
        let key = (
            b.mode,
            b.cause,
            place(&b.frames, !b.frames.is_empty()),
            outside,
        );
        let group = groups
            .entry(key.clone())
            .or_insert_with(|| holder_group(&key));
        group.waits_caused += b.count;
        group.wait_caused_ns += b.wait_ns;
        threads.entry(key).or_default().extend(&b.tids);
    }
    for hold in entries.iter().filter(|e| e.kind == Kind::Hold) {
        let outside = hold
            .outside_locker
            .then(|| locker_name(hold.locker.as_ref()));
        let key = (
            hold.mode,
            hold.cause,
            place(&hold.frames, hold.stack_collected),
            outside,
        );
        if let Some(group) = groups.get_mut(&key) {
            group.holds += hold.count;
            group.hold_ns += hold.total_ns;
            group.max_hold_ns = group.max_hold_ns.max(hold.max_ns);
            if let Some(off) = &hold.offcpu {
                group.offcpu.running_ns += off.running_ns;
                group.offcpu.runnable_ns += off.runnable_ns;
                group.offcpu.sleeping_ns += off.sleeping_ns;
                group.offcpu.uninterruptible_ns += off.uninterruptible_ns;
            }
        }
    }
    let mut groups: Vec<HolderGroup> = groups
        .into_iter()
        .map(|(key, mut g)| {
            g.threads = threads
                .remove(&key)
                .unwrap_or_default()
                .into_iter()
                .collect();
            g.share = ratio(g.wait_caused_ns, charged_ns);
            g
        })
        .collect();
    largest_first(&mut groups, |g| (g.wait_caused_ns, &g.place));
    groups
}

fn holder_group((mode, cause, at, outside): &HolderKey) -> HolderGroup {
    HolderGroup {
        mode: *mode,
        cause: *cause,
        place: at.clone(),
        outside_locker: outside.clone(),
        waits_caused: 0,
        wait_caused_ns: 0,
        share: 0.0,
        holds: 0,
        hold_ns: 0,
        max_hold_ns: 0,
        offcpu: OffCpuSplit::default(),
        threads: Vec::new(),
    }
}

/// `cat (8029)`, or `cat (400 processes)` for processes of one name folded into one.
fn locker_name(locker: Option<&super::schema::Locker>) -> String {
    match locker {
        Some(l) if l.processes > 1 => format!(
            "{} ({} processes)",
            l.comm.as_deref().unwrap_or("?"),
            l.processes
        ),
        Some(l) => format!("{} ({})", l.comm.as_deref().unwrap_or("?"), l.pid),
        None => "?".into(),
    }
}

/// Largest first by the figure `by` gives (ties by name, so that the order does not depend on
/// hashing).
fn largest_first<T>(groups: &mut [T], by: impl Fn(&T) -> (u64, &String)) {
    groups.sort_by(|a, b| {
        let (an, ap) = by(a);
        let (bn, bp) = by(b);
        bn.cmp(&an).then_with(|| ap.cmp(bp))
    });
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::build_report;
    use crate::model::report::tests::{attributed, sample};

    fn answer_of(
        fixture: fn() -> (
            super::super::Harvest,
            super::super::Symbols,
            super::super::TraceMeta,
        ),
    ) -> Answer {
        let (harvest, symbols, meta) = fixture();
        build_report(&harvest, &symbols, &meta).answer
    }

    #[test]
    fn waits_are_summed_by_mode_cause_and_place_largest_first() {
        let a = answer_of(sample);
        let rows: Vec<(Mode, Cause, &str, u64, u64)> = a
            .who_waited
            .iter()
            .map(|g| (g.mode, g.cause, g.place.as_str(), g.waits, g.wait_ns))
            .collect();
        assert_eq!(
            rows,
            [
                (Mode::Write, Cause::Munmap, "munmap", 2, 8_000_000),
                (
                    Mode::Read,
                    Cause::PageFault,
                    "lock_mm_and_find_vma",
                    1,
                    1_000_000
                ),
            ]
        );
        let shares: f64 = a.who_waited.iter().map(|g| g.share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{shares}");
        // Nothing was charged to a holder: all of the wait is unattributed.
        assert!(a.behind_whom.is_empty());
        assert_eq!(a.wait_unattributed_ns, 9_000_000);
    }

    #[test]
    fn holders_carry_the_wait_they_caused_and_their_own_holds() {
        let a = answer_of(attributed);
        let first = &a.behind_whom[0];
        assert_eq!((first.mode, first.cause), (Mode::Write, Cause::Munmap));
        assert_eq!((first.waits_caused, first.wait_caused_ns), (2, 750_000));
        assert!((first.share - 0.75).abs() < 1e-9, "{}", first.share);
        // The munmap hold itself: one, 40 ms, off CPU as its entry says.
        assert_eq!((first.holds, first.max_hold_ns), (1, 40_000_000));
        assert_eq!(first.offcpu.sleeping_ns, 20_000_000);
        assert_eq!(first.offcpu.runnable_ns, 5_000_000);
        assert_eq!(first.threads, [7]);
        // The holder whose stacks were lost: its wait, no holds to show.
        let second = &a.behind_whom[1];
        assert_eq!(second.wait_caused_ns, 250_000);
        assert_eq!(second.holds, 0);
        assert_eq!(a.wait_unattributed_ns, 9_000_000 - 1_000_000);
    }
}
