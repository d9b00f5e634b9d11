//! The per-process split: how long each process's threads waited for and held an mmap_lock,
//! summed over the report's entries. A process locking another's mm (a /proc reader,
//! khugepaged) is a row of its own: a row says who waited, not whose lock it was.

use std::collections::HashMap;

use super::schema::{Entry, Kind, ProcessRow};

/// The name shown for a process whose name is known nowhere (exited before it was seen).
pub const UNKNOWN_COMM: &str = "?";

/// Rows by locking process, most waiting first (then most holding, then pid). `name_of` names
/// a pid when it can; `groups` gives the pids an outside locker's row stands for when its
/// processes of one name were folded.
pub fn process_rows(
    entries: &[Entry],
    name_of: impl Fn(u32) -> Option<String>,
    groups: &HashMap<u32, Vec<u32>>,
) -> Vec<ProcessRow> {
    let mut rows: HashMap<u32, ProcessRow> = HashMap::new();
    for e in entries {
        let pid = locking_pid(e);
        let row = rows.entry(pid).or_insert_with(|| ProcessRow {
            pid,
            comm: String::new(),
            cgroup: locking_cgroup(e).map(str::to_string),
            waits: 0,
            wait_ns: 0,
            max_wait_ns: 0,
            holds: 0,
            hold_ns: 0,
            max_hold_ns: 0,
            wait_share: 0.0,
            processes: 1,
            pids: Vec::new(),
        });
        match e.kind {
            Kind::Wait => {
                row.waits += e.count;
                row.wait_ns += e.total_ns;
                row.max_wait_ns = row.max_wait_ns.max(e.max_ns);
            }
            Kind::Hold => {
                row.holds += e.count;
                row.hold_ns += e.total_ns;
                row.max_hold_ns = row.max_hold_ns.max(e.max_ns);
            }
        }
    }
    let all_wait_ns: u64 = rows.values().map(|r| r.wait_ns).sum();
    let mut rows: Vec<ProcessRow> = rows
        .into_values()
        .map(|mut row| {
            row.comm = name_of(row.pid).unwrap_or_else(|| UNKNOWN_COMM.to_string());
            if let Some(pids) = groups.get(&row.pid) {
                (row.processes, row.pids) = (pids.len(), pids.clone());
            }
            row.wait_share = if all_wait_ns == 0 {
                0.0
            } else {
                row.wait_ns as f64 / all_wait_ns as f64
            };
            row
        })
        .collect();
    rows.sort_by(|a, b| {
        b.wait_ns
            .cmp(&a.wait_ns)
            .then(b.hold_ns.cmp(&a.hold_ns))
            .then(a.pid.cmp(&b.pid))
    });
    rows
}

/// The cgroup of the process whose thread waited or held.
fn locking_cgroup(e: &Entry) -> Option<&str> {
    match &e.locker {
        Some(locker) => locker.cgroup.as_deref(),
        None => e.cgroup.as_deref(),
    }
}

/// The process whose thread waited or held: the outside locker, else the mm's owner.
pub fn locking_pid(e: &Entry) -> u32 {
    e.locker.as_ref().map_or(e.pid, |l| l.pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build_report, report::tests::sample};

    fn rows_of_sample() -> Vec<ProcessRow> {
        let (harvest, symbols, meta) = sample();
        build_report(&harvest, &symbols, &meta).processes
    }

    #[test]
    fn one_row_per_locking_process_most_waiting_first() {
        let rows = rows_of_sample();
        let pids: Vec<u32> = rows.iter().map(|r| r.pid).collect();
        assert_eq!(pids, [42, 9], "the target, then the /proc reader");
        let app = &rows[0];
        assert_eq!(
            (app.waits, app.wait_ns, app.max_wait_ns),
            (3, 9_000_000, 5_000_000)
        );
        assert_eq!(
            (app.holds, app.hold_ns, app.max_hold_ns),
            (3, 40_002_000, 40_000_000)
        );
        assert_eq!(app.comm, "app");
        assert_eq!(app.cgroup.as_deref(), Some("/system.slice/app.service"));
        assert!((app.wait_share - 1.0).abs() < 1e-12);
        let cat = &rows[1];
        assert_eq!((cat.comm.as_str(), cat.waits, cat.holds), ("cat", 0, 1));
        assert_eq!(cat.wait_share, 0.0);
        assert_eq!(
            cat.cgroup.as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope"),
            "an outside locker's own cgroup, not its target's"
        );
    }

    #[test]
    fn shares_sum_to_one_and_unknown_names_are_marked() {
        let (harvest, symbols, meta) = sample();
        let mut entries = build_report(&harvest, &symbols, &meta).entries;
        // A second process waiting 3 ms, name unknown.
        let mut other = entries[1].clone();
        assert_eq!(other.kind, Kind::Wait);
        other.pid = 77;
        other.total_ns = 3_000_000;
        other.count = 1;
        entries.push(other);
        let rows = process_rows(
            &entries,
            |pid| (pid == 42).then(|| "app".to_string()),
            &HashMap::new(),
        );
        assert_eq!(rows.iter().map(|r| r.pid).collect::<Vec<_>>(), [42, 77, 9]);
        assert_eq!(rows[1].comm, UNKNOWN_COMM);
        assert_eq!(rows[2].comm, UNKNOWN_COMM);
        let sum: f64 = rows.iter().map(|r| r.wait_share).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
        assert!((rows[1].wait_share - 0.25).abs() < 1e-12);
    }

    #[test]
    fn no_entries_no_rows() {
        assert!(process_rows(&[], |_| None, &HashMap::new()).is_empty());
    }
}
