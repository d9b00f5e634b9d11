//! What no report may show: a maximum above its total, an average above its maximum, a share
//! over 100%, parts that do not add up to their whole, more operations in the entries than the
//! kernel's totals counted. The checks read the report as its JSON schema shows it, so that
//! the same function checks a built `Report` (unit and property tests, the final report of
//! debug builds, which log what breaks) and a real trace's `--format json` output
//! (integration tests).

use serde_json::Value;

use super::histogram::slot_bounds;
use super::json_figures::{array, expect, f, n};
use super::Report;

/// Every broken invariant of `report`, one line each naming the figure; empty when none is.
pub fn check(report: &Report) -> Vec<String> {
    match serde_json::to_value(report) {
        Ok(json) => check_json(&json),
        Err(e) => vec![format!("report does not serialize: {e}")],
    }
}

/// `check` over a report in its JSON form (`--format json`).
pub fn check_json(report: &Value) -> Vec<String> {
    let mut broken = Vec::new();
    let entries = array(report, "entries");
    for (i, e) in entries.iter().enumerate() {
        check_entry(e, &format!("entries[{i}]"), &mut broken);
    }
    check_against_totals(report, entries, &mut broken);
    check_processes(report, entries, &mut broken);
    check_causes(report, entries, &mut broken);
    check_wait_share(report, &mut broken);
    check_answer(report, entries, &mut broken);
    super::sections::check(report, entries, &mut broken);
    broken
}

/// The answer sums what the entries hold: no group waited or caused more than every wait, no
/// maximum exceeds its group's total, shares stay within 0..1.
fn check_answer(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    let Some(answer) = report.get("answer") else {
        broken.push("no answer".into());
        return;
    };
    let all_wait: u64 = entries
        .iter()
        .filter(|e| e["kind"] == "wait")
        .map(|e| n(e, "total_ns"))
        .sum();
    let waited = array(answer, "who_waited");
    let behind = array(answer, "behind_whom");
    let sum = |rows: &[Value], key: &str| rows.iter().map(|r| n(r, key)).sum::<u64>();
    expect(broken, sum(waited, "wait_ns") <= all_wait, || {
        format!("answer: who_waited sums above every wait ({all_wait} ns)")
    });
    let charged = sum(behind, "wait_caused_ns") + n(answer, "wait_unattributed_ns");
    expect(broken, charged <= all_wait, || {
        format!("answer: behind_whom and unattributed sum to {charged} ns, above every wait ({all_wait} ns)")
    });
    for (i, g) in waited.iter().enumerate() {
        expect(broken, n(g, "max_wait_ns") <= n(g, "wait_ns"), || {
            format!("answer.who_waited[{i}]: max above total")
        });
    }
    for (i, g) in behind.iter().enumerate() {
        expect(broken, n(g, "max_hold_ns") <= n(g, "hold_ns"), || {
            format!("answer.behind_whom[{i}]: max hold above the holds' total")
        });
    }
    for (i, g) in waited.iter().chain(behind).enumerate() {
        let share = g["share"].as_f64().unwrap_or(-1.0);
        expect(broken, (0.0..=1.0 + EPSILON).contains(&share), || {
            format!("answer row {i}: share {share} outside 0..1")
        });
    }
}

/// Share comparisons allow for floating-point rounding only.
const EPSILON: f64 = 1e-9;

/// One entry: its count, total, average, percentiles and maximum agree with each other and
/// with its histogram; its parts (slow path, off-CPU split, holders waited behind) fit in it.
fn check_entry(e: &Value, at: &str, broken: &mut Vec<String>) {
    let (count, total, avg, max) = (
        n(e, "count"),
        n(e, "total_ns"),
        n(e, "avg_ns"),
        n(e, "max_ns"),
    );
    let (p50, p99) = (n(e, "p50_ns"), n(e, "p99_ns"));
    let say = |what: &str| {
        format!("{at}: {what} (count {count}, total {total} ns, avg {avg} ns, max {max} ns, p50 {p50} ns, p99 {p99} ns)")
    };
    expect(broken, count > 0, || say("no operation"));
    expect(broken, max <= total, || say("max above total"));
    expect(broken, avg <= max, || say("avg above max"));
    expect(broken, avg == total / count.max(1), || {
        say("avg is not total / count")
    });
    expect(broken, p50 <= p99 && p99 <= max, || {
        say("percentiles out of order")
    });
    let rows = array(e, "histogram");
    let held: u64 = rows.iter().map(|r| r[1].as_u64().unwrap_or(0)).sum();
    expect(broken, held == count, || {
        say(&format!("histogram holds {held} operations"))
    });
    let slot_of = |r: &Value| tracer_common::log2_slot(r[0].as_u64().unwrap_or(0));
    if let (Some(low), Some(high)) = (rows.first().map(slot_of), rows.last().map(slot_of)) {
        // Every operation lies in its slot: the average cannot be below the lowest slot, nor
        // the maximum below the highest one.
        let floor = slot_bounds(low).0;
        expect(broken, avg >= floor, || {
            say(&format!("avg below the lowest histogram slot ({floor} ns)"))
        });
        let top_floor = slot_bounds(high).0;
        expect(broken, max >= top_floor, || {
            say(&format!(
                "max below the highest histogram slot ({top_floor} ns)"
            ))
        });
    }
    if let Some(contended) = e["contended_ns"].as_u64() {
        expect(broken, contended <= total, || {
            say(&format!("slow path {contended} ns above total"))
        });
    }
    let off = &e["offcpu"];
    if off.is_object() {
        let parts = n(off, "running_ns") + n(off, "runnable_ns") + n(off, "sleeping_ns");
        expect(broken, parts == total, || {
            say(&format!("off-CPU split sums to {parts} ns"))
        });
        expect(
            broken,
            n(off, "uninterruptible_ns") <= n(off, "sleeping_ns"),
            || say("D-state sleep above the sleep"),
        );
    }
    let blockers = array(e, "blocked_by");
    let charged: u64 = blockers.iter().map(|b| n(b, "wait_ns")).sum();
    expect(broken, charged <= total, || {
        say(&format!("waits behind holders sum to {charged} ns"))
    });
    let share: f64 = blockers.iter().map(|b| f(b, "share")).sum();
    expect(broken, share <= 1.0 + EPSILON, || {
        say(&format!("holder shares sum to {share}"))
    });
}

/// The kernel counts every wait and hold in its totals, and adds it to an entry unless the
/// aggregation map is full: the entries of a (mode, outside or not) never hold more than the
/// totals counted, nor a maximum above theirs.
fn check_against_totals(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    for mode in ["read", "write"] {
        for (outside, totals) in [(false, "totals"), (true, "outside_totals")] {
            let t = &report[totals][mode];
            for (kind, count, time, max) in [
                ("wait", "waits", "wait_ns", "max_wait_ns"),
                ("hold", "holds", "hold_ns", "max_hold_ns"),
            ] {
                let of: Vec<&Value> = entries
                    .iter()
                    .filter(|e| e["kind"] == kind && e["mode"] == mode)
                    .filter(|e| !outside || e["outside_locker"] == true)
                    .collect();
                let ops: u64 = of.iter().map(|e| n(e, "count")).sum();
                let ns: u64 = of.iter().map(|e| n(e, "total_ns")).sum();
                let longest = of.iter().map(|e| n(e, "max_ns")).max().unwrap_or(0);
                let at = format!("{mode} {kind}s{}", if outside { " (outside)" } else { "" });
                expect(broken, ops <= n(t, count), || {
                    format!("{at}: entries hold {ops}, {totals} counted {}", n(t, count))
                });
                expect(broken, ns <= n(t, time), || {
                    format!("{at}: entries hold {ns} ns, {totals} {} ns", n(t, time))
                });
                expect(broken, longest <= n(t, max), || {
                    format!(
                        "{at}: an entry's max {longest} ns above {totals}' {} ns",
                        n(t, max)
                    )
                });
            }
        }
    }
}

/// The process of an entry, as `processes` rows it: the outside locker, else the mm's owner.
fn locking_pid(e: &Value) -> u64 {
    e["locker"]["pid"].as_u64().unwrap_or_else(|| n(e, "pid"))
}

/// Each process row is the sum of its entries.
fn check_processes(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    let rows = array(report, "processes");
    let mut share = 0.0;
    for row in rows {
        let pid = n(row, "pid");
        let of = |kind: &'static str| {
            entries
                .iter()
                .filter(move |e| locking_pid(e) == pid && e["kind"] == kind)
        };
        for (kind, count, time, max) in [
            ("wait", "waits", "wait_ns", "max_wait_ns"),
            ("hold", "holds", "hold_ns", "max_hold_ns"),
        ] {
            let ops: u64 = of(kind).map(|e| n(e, "count")).sum();
            let ns: u64 = of(kind).map(|e| n(e, "total_ns")).sum();
            expect(broken, ops == n(row, count) && ns == n(row, time), || {
                format!(
                    "process {pid}: {count} {} / {} ns, its entries {ops} / {ns} ns",
                    n(row, count),
                    n(row, time)
                )
            });
            expect(broken, n(row, max) <= n(row, time), || {
                format!("process {pid}: {max} above {time}")
            });
        }
        let s = f(row, "wait_share");
        expect(broken, (0.0..=1.0 + EPSILON).contains(&s), || {
            format!("process {pid}: wait share {s}")
        });
        share += s;
    }
    expect(broken, share <= 1.0 + 1e-6, || {
        format!("process wait shares sum to {share}")
    });
    let listed: u64 = rows.iter().map(|r| n(r, "waits") + n(r, "holds")).sum();
    let all: u64 = entries.iter().map(|e| n(e, "count")).sum();
    expect(broken, listed == all, || {
        format!("process rows hold {listed} operations, the entries {all}")
    });
}

/// The cause table regroups the entries: same operations, same time.
fn check_causes(report: &Value, entries: &[Value], broken: &mut Vec<String>) {
    for (i, c) in array(report, "causes").iter().enumerate() {
        let (count, total, avg, p99, max) = (
            n(c, "count"),
            n(c, "total_ns"),
            n(c, "avg_ns"),
            n(c, "p99_ns"),
            n(c, "max_ns"),
        );
        let at = format!("causes[{i}] ({})", c["cause"]);
        expect(broken, max <= total && avg <= max && p99 <= max, || {
            format!("{at}: total {total}, avg {avg}, p99 {p99}, max {max} ns")
        });
        let of = entries.iter().filter(|e| {
            e["cause"] == c["cause"] && e["kind"] == c["kind"] && e["mode"] == c["mode"]
        });
        let (ops, ns) = of.fold((0, 0), |(o, t), e| {
            (o + n(e, "count"), t + n(e, "total_ns"))
        });
        expect(broken, ops == count && ns == total, || {
            format!("{at}: {count} / {total} ns, its entries {ops} / {ns} ns")
        });
    }
}

/// The report-wide share of thread time spent waiting.
fn check_wait_share(report: &Value, broken: &mut Vec<String>) {
    let share = f(report, "wait_share");
    expect(broken, (0.0..=1.0 + EPSILON).contains(&share), || {
        format!("wait share {share} of thread time")
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        build_report,
        report::tests::{attributed, sample},
    };

    #[test]
    fn the_sample_reports_break_nothing() {
        for (harvest, symbols, meta) in [sample(), attributed()] {
            let report = build_report(&harvest, &symbols, &meta);
            assert_eq!(check(&report), Vec::<String>::new());
        }
    }

    /// Makes one figure of a report impossible.
    type Edit = dyn Fn(&mut Value);

    /// Each figure, made impossible, is named.
    #[test]
    fn every_impossible_figure_is_named() {
        let (harvest, symbols, meta) = attributed();
        let report = build_report(&harvest, &symbols, &meta);
        let json = serde_json::to_value(&report).unwrap();
        let broken = |edit: &Edit| {
            let mut v = json.clone();
            edit(&mut v);
            check_json(&v)
        };
        let cases: [(&str, &Edit); 14] = [
            ("max above total", &|v| {
                v["entries"][1]["max_ns"] = 10_000_000.into()
            }),
            ("avg above max", &|v| {
                v["entries"][1]["avg_ns"] = 6_000_000.into()
            }),
            ("percentiles out of order", &|v| {
                v["entries"][1]["p99_ns"] = 5_000_001.into()
            }),
            ("histogram holds", &|v| v["entries"][1]["count"] = 3.into()),
            ("off-CPU split", &|v| {
                v["entries"][0]["offcpu"]["running_ns"] = 0.into()
            }),
            ("holder shares", &|v| {
                v["entries"][2]["blocked_by"][0]["share"] = 0.9.into()
            }),
            ("totals counted", &|v| {
                v["totals"]["write"]["holds"] = 0.into()
            }),
            ("process 42", &|v| v["processes"][0]["waits"] = 4.into()),
            ("causes[", &|v| v["causes"][0]["count"] = 7.into()),
            ("wait share", &|v| v["wait_share"] = 1.5.into()),
            ("page-fault holds", &|v| {
                v["faults"]["kernel_mode_holds"] = 7.into()
            }),
            ("who_waited sums above", &|v| {
                v["answer"]["who_waited"][0]["wait_ns"] = 10_000_000.into()
            }),
            ("behind_whom and unattributed", &|v| {
                v["answer"]["wait_unattributed_ns"] = 9_000_000.into()
            }),
            ("max hold above", &|v| {
                v["answer"]["behind_whom"][0]["max_hold_ns"] = 50_000_000.into()
            }),
        ];
        for (what, edit) in cases {
            let found = broken(edit);
            assert!(
                found.iter().any(|line| line.contains(what)),
                "{what:?} not found in {found:#?}"
            );
        }
    }
}
