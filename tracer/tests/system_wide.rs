//! `-a`: every user process traced at once, split per process. Real tracer, real kernel, two
//! real workload processes. Needs root (common::bpf_available).

mod common;

use common::{bpf_available, entries, json, serial, u, Tracer, Workload};
use serde_json::Value;

#[test]
fn two_workloads_each_get_a_process_row_and_the_tracer_none() {
    if !bpf_available("two_workloads_each_get_a_process_row_and_the_tracer_none") {
        return;
    }
    let _serial = serial();
    let churn = Workload::spawn(&["churn", "--threads", "2", "--seconds", "2"]);
    let hold = Workload::spawn(&["hold", "--size-mib", "128", "--repeat", "5"]);
    // Ended by SIGINT once both workloads have exited, not by a duration: under emulation
    // hold's five mprotect() calls can end after any fixed one. --per-pid: hold may live under
    // a second (the tracer attaches in a few hundred ms here), and gone short-lived processes
    // are folded by name, the longer churn of the same name with them.
    let mut tracer = Tracer::spawn(&[
        "-a".into(),
        "--per-pid".into(),
        "--format".into(),
        "json".into(),
        "--no-live".into(),
    ]);
    tracer.wait_attached();
    let tracer_pid = tracer.pid();
    churn.start();
    hold.start();
    let (churn_pid, hold_pid) = (churn.pid, hold.pid);
    churn.finish();
    hold.finish();
    tracer.signal(libc::SIGINT);
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    assert!(
        result.stderr.contains("tracing all processes"),
        "{}",
        result.stderr
    );
    let report = json(&result.stdout);
    assert_eq!(report["target"]["system_wide"], true);
    assert_eq!(report["target"]["pids"], serde_json::json!([]));
    assert_eq!(
        report["target"]["exited"], false,
        "-a has no target to exit: only -d ends it"
    );

    let processes = report["processes"].as_array().expect("processes array");
    let row = |pid: u32| {
        processes
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} missing from processes: {processes:#?}"))
    };
    for pid in [churn_pid, hold_pid] {
        let p = row(pid);
        assert_eq!(p["comm"], "mmapsem-workloa", "{p}");
        // Every lock taken through start_locking is a (maybe very short) wait, then a hold.
        assert!(u(&p["waits"]) > 0 && u(&p["wait_ns"]) > 0, "{p}");
        assert!(u(&p["holds"]) > 0 && u(&p["hold_ns"]) > 0, "{p}");
    }
    // hold's five mprotect() calls each hold the lock for write.
    assert!(u(&row(hold_pid)["holds"]) >= 5, "{}", row(hold_pid));
    // The tracer's own mm is never traced; it may have a row as an outside locker of the
    // processes whose /proc files it read.
    let own = entries(&report)
        .iter()
        .filter(|e| e["pid"] == tracer_pid)
        .count();
    assert_eq!(own, 0, "the tracer traced itself: {processes:#?}");
    let waits: Vec<u64> = processes.iter().map(|p| u(&p["wait_ns"])).collect();
    assert!(
        waits.windows(2).all(|w| w[0] >= w[1]),
        "most waiting first: {waits:?}"
    );

    // Entries name the mm's process; every process row is some entry's owner or locker.
    let entries = entries(&report);
    for pid in [churn_pid, hold_pid] {
        let own: Vec<&Value> = entries.iter().filter(|e| e["pid"] == pid).collect();
        assert!(!own.is_empty(), "no entry for pid {pid}");
        assert!(
            own.iter().all(|e| e["comm"] == "mmapsem-workloa"),
            "{own:?}"
        );
    }
    for p in processes {
        assert!(
            entries
                .iter()
                .any(|e| e["pid"] == p["pid"] || e["locker"]["pid"] == p["pid"]),
            "process row without an entry: {p}"
        );
    }
    assert!(entries.iter().all(|e| e["pid"] != tracer_pid));
}

#[test]
fn system_wide_text_report_leads_with_the_process_table() {
    if !bpf_available("system_wide_text_report_leads_with_the_process_table") {
        return;
    }
    let _serial = serial();
    let churn = Workload::spawn(&["churn", "--threads", "2", "--seconds", "1"]);
    // -n: every process and stack, whatever else runs on the machine meanwhile.
    let mut tracer = Tracer::spawn(&[
        "-a".into(),
        "-d".into(),
        "2".into(),
        "--no-live".into(),
        "-n".into(),
        "100000".into(),
    ]);
    tracer.wait_attached();
    churn.start();
    let pid = churn.pid;
    churn.finish();
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let text = &result.stdout;
    assert!(text.starts_with("mmapsem-trace: all processes,"), "{text}");
    let table = text
        .find("processes by wait:")
        .unwrap_or_else(|| panic!("no process table:\n{text}"));
    assert!(table < text.find("By cause:").unwrap());
    assert!(
        text.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq([pid.to_string().as_str(), "mmapsem-workloa"])),
        "no row for pid {pid}:\n{text}"
    );
    assert!(
        text.contains(&format!("[pid {pid} (mmapsem-workloa), ")),
        "stack blocks name their process:\n{text}"
    );
}

/// A process exits and its freed mm_struct goes to the next processes forked on the same CPU:
/// the forks and execs that lock that reused mm are not the dead process's outside lockers.
#[test]
fn an_exited_processs_reused_mm_gets_no_outside_lockers() {
    if !bpf_available("an_exited_processs_reused_mm_gets_no_outside_lockers") {
        return;
    }
    let _serial = serial();
    let mut tracer = Tracer::spawn(&[
        "-a".into(),
        "-d".into(),
        "600".into(),
        "--format".into(),
        "json".into(),
        "--no-live".into(),
    ]);
    tracer.wait_attached();
    // Everything on one CPU, where the slab hands the freed mm_struct to the next allocation.
    let exited = Workload::spawn(&["churn", "--threads", "1", "--iterations", "200"]);
    let exited_pid = exited.pid;
    pin_to_cpu(exited_pid, 0);
    exited.start();
    exited.finish();
    // The next allocation on that CPU takes the freed mm_struct: the first forks are the ones
    // that matter, and under emulation (each fork and exec ten times slower) 250 of them do.
    let forks = if common::slowdown() > 1 { 250 } else { 1000 };
    let forks = std::process::Command::new("taskset")
        .args([
            "-c",
            "0",
            "sh",
            "-c",
            &format!("for i in $(seq {forks}); do /bin/true; done"),
        ])
        .status()
        .expect("running taskset (util-linux)");
    assert!(forks.success());
    let tracer_pid = tracer.pid();
    tracer.signal(libc::SIGTERM);
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = json(&result.stdout);
    // The processes forked after the exit, whose new mms may reuse its mm_struct: their locks
    // charged to it as an outside locker's would be the bug. (The tracer's own reads and
    // khugepaged's scans of the process while it lived are real outside lockers.)
    let reusers = ["taskset", "sh", "true"];
    let stray: Vec<&Value> = entries(&report)
        .iter()
        .filter(|e| e["pid"] == exited_pid && e["outside_locker"] == true)
        .filter(|e| e["locker"]["pid"] != tracer_pid)
        .filter(|e| reusers.iter().any(|r| e["locker"]["comm"] == *r))
        .collect();
    assert!(
        stray.is_empty(),
        "after pid {exited_pid} exited, its reused mm's lockers were charged to it: {stray:#?}"
    );
    let own = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == exited_pid)
        .unwrap_or_else(|| panic!("pid {exited_pid} has no process row"));
    assert!(
        u(&own["holds"]) >= 400,
        "two write locks an iteration: {own}"
    );
}

fn pin_to_cpu(pid: u32, cpu: usize) {
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let done = unsafe {
        libc::sched_setaffinity(pid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(done, 0, "sched_setaffinity({pid})");
}

/// Under `-a`, processes that come and go must not grow the tracer without bound: the
/// unwinders are capped, and the mapping lists of exited processes whose stacks nothing
/// collected refers to (here: past a tiny aggregation map) are let go during the trace.
#[test]
fn exited_processes_without_collected_stacks_are_let_go() {
    if !bpf_available("exited_processes_without_collected_stacks_are_let_go") {
        return;
    }
    let _serial = serial();
    let mut tracer = Tracer::spawn(&[
        "-a".into(),
        "--no-live".into(),
        "--max-entries".into(),
        "64".into(),
        "-v".into(),
        "-o".into(),
        "/dev/null".into(),
    ]);
    tracer.wait_attached();
    // Alive long enough for the tracer's once-a-second look to list them, gone well before
    // the two looks at dead processes (every 10 s) that let them go.
    const SPAWNED: usize = 100;
    let sleepers: Vec<_> = (0..SPAWNED)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("1.5")
                .spawn()
                .unwrap()
        })
        .collect();
    for mut sleeper in sleepers {
        assert!(sleeper.wait().unwrap().success());
    }
    // Then two looks at dead processes (every 10 s) after the last one exited, whatever the
    // hundred took to start and end (seconds under emulation), and a margin for the loop.
    std::thread::sleep(std::time::Duration::from_secs(22 + 2 * common::slowdown()));
    tracer.signal(libc::SIGINT);
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let line = result
        .stderr
        .lines()
        .find(|l| l.contains("memory: peak RSS"))
        .unwrap_or_else(|| panic!("no memory line under -v:\n{}", result.stderr));
    let number_before = |marker: &str| -> usize {
        let head = &line[..line
            .find(marker)
            .unwrap_or_else(|| panic!("{marker}: {line}"))];
        head.rsplit(|c: char| !c.is_ascii_digit())
            .find(|w| !w.is_empty())
            .unwrap()
            .parse()
            .unwrap()
    };
    let unwinders = number_before(" processes, mapping lists");
    let let_go = number_before(" more let go");
    assert!(unwinders <= 64, "unwinders beyond their cap: {line}");
    assert!(
        let_go >= SPAWNED / 2,
        "{SPAWNED} processes exited, at most 64 with entries, yet only {let_go} mapping lists \
         were let go: {line}"
    );
}

/// A busy machine's short-lived processes (300 `true`s, 150 a second) traced system-wide with
/// an aggregation map that cannot hold them all at once: they leave the maps as they exit, so
/// nothing is lost, and the report has one row for them, `true`, standing for every one of
/// them; of the processes gone, nothing is left "in progress".
#[test]
fn short_lived_processes_fold_into_one_row_and_fill_no_map() {
    if !bpf_available("short_lived_processes_fold_into_one_row_and_fill_no_map") {
        return;
    }
    let _serial = serial();
    // Under emulation (a minute for 300), half: still half again as many keys as the map holds.
    let count: u64 = if common::slowdown() > 1 { 150 } else { 300 };
    let spawner = Workload::spawn(&[
        "spawn",
        "--count",
        &count.to_string(),
        "--per-second",
        "150",
    ]);
    let mut tracer = Tracer::spawn(&[
        "-a".into(),
        "--max-entries".into(),
        "2048".into(),
        "--format".into(),
        "json".into(),
        "--no-live".into(),
    ]);
    tracer.wait_attached();
    spawner.start();
    let summary = spawner.finish();
    assert!(summary.contains(&format!("processes={count}")), "{summary}");
    tracer.signal(libc::SIGINT);
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = json(&result.stdout);

    for counter in [
        "aggregation_map_full",
        "blocked_map_full",
        "sleep_map_full",
        "name_map_full",
        "target_map_full",
        "state_map_full",
        "reader_overflow",
    ] {
        assert_eq!(
            u(&report["lost"][counter]),
            0,
            "{counter}: {}",
            report["lost"]
        );
    }
    let processes = report["processes"].as_array().expect("processes array");
    let trues: Vec<&Value> = processes.iter().filter(|p| p["comm"] == "true").collect();
    assert_eq!(trues.len(), 1, "one row for every `true`: {trues:#?}");
    let row = trues[0];
    assert_eq!(u(&row["processes"]), count, "{row}");
    assert_eq!(row["pids"].as_array().map(Vec::len), Some(count as usize));
    // Each locked its mm at exec, at its start and at its exit, and held it as often.
    assert!(u(&row["waits"]) >= 3 * count, "{row}");
    assert!(u(&row["holds"]) >= 3 * count, "{row}");
    // Threads alive at the end (the machine's few) may be mid-operation; the 300 are not.
    let in_flight = u(&report["in_flight"]["waits"]) + u(&report["in_flight"]["holds"]);
    assert!(in_flight <= 8, "{}", report["in_flight"]);
}

/// Two cgroups (v2) made for the test under the unified hierarchy, removed at the end: the
/// hierarchy's mount from /proc/self/mountinfo (beside v1 controllers, /sys/fs/cgroup/unified),
/// or mounted here where nothing mounts it (the CI guests' minimal init).
struct TestCgroups {
    mount: std::path::PathBuf,
    /// Mounted by the test, unmounted at the end.
    mounted: bool,
    top: String,
}

impl TestCgroups {
    fn new() -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let found = mountinfo.lines().find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            (fs.split_whitespace().next() == Some("cgroup2"))
                .then(|| {
                    mount
                        .split_whitespace()
                        .nth(4)
                        .map(std::path::PathBuf::from)
                })
                .flatten()
        });
        let (mount, mounted) = match found {
            Some(mount) => (mount, false),
            None => {
                let mount =
                    std::env::temp_dir().join(format!("mmapsem-cg2-{}", std::process::id()));
                std::fs::create_dir_all(&mount).unwrap();
                let status = std::process::Command::new("mount")
                    .args(["-t", "cgroup2", "none"])
                    .arg(&mount)
                    .status()
                    .unwrap();
                assert!(status.success(), "mounting cgroup2 at {}", mount.display());
                (mount, true)
            }
        };
        let top = format!("mmapsem-test-{}", std::process::id());
        for dir in ["a/inner", "b"] {
            std::fs::create_dir_all(mount.join(&top).join(dir)).unwrap();
        }
        Self {
            mount,
            mounted,
            top,
        }
    }

    /// The cgroup path (as /proc/PID/cgroup writes it) of `dir` below the test's own.
    fn path(&self, dir: &str) -> String {
        format!("/{}/{dir}", self.top)
    }

    fn enter(&self, pid: u32, dir: &str) {
        let procs = self.mount.join(&self.top).join(dir).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|err| panic!("moving {pid} into {}: {err}", procs.display()));
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for dir in ["a/inner", "a", "b", ""] {
            let _ = std::fs::remove_dir(self.mount.join(&self.top).join(dir));
        }
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(&self.mount)
                .status();
            let _ = std::fs::remove_dir(&self.mount);
        }
    }
}

#[test]
fn processes_carry_their_cgroups_and_a_cgroup_filter_keeps_its_subtree_only() {
    if !bpf_available("processes_carry_their_cgroups_and_a_cgroup_filter_keeps_its_subtree_only") {
        return;
    }
    let _serial = serial();
    let cgroups = TestCgroups::new();
    let in_a = Workload::spawn(&["churn", "--threads", "2", "--seconds", "1"]);
    let in_b = Workload::spawn(&["churn", "--threads", "2", "--seconds", "1"]);
    cgroups.enter(in_a.pid, "a/inner");
    cgroups.enter(in_b.pid, "b");
    // Both traces at once, over the same work: every process, and the subtree of `a` only.
    let json_args = |extra: &[String]| {
        let mut args: Vec<String> = ["-a", "--format", "json", "--no-live"]
            .map(String::from)
            .to_vec();
        args.extend_from_slice(extra);
        args
    };
    let mut everything = Tracer::spawn(&json_args(&[]));
    let mut only_a = Tracer::spawn(&json_args(&["--cgroup".into(), cgroups.path("a")]));
    everything.wait_attached();
    only_a.wait_attached();
    in_a.start();
    in_b.start();
    let (a_pid, b_pid) = (in_a.pid, in_b.pid);
    in_a.finish();
    in_b.finish();
    let reports: Vec<Value> = [everything, only_a]
        .into_iter()
        .map(|tracer| {
            tracer.signal(libc::SIGINT);
            let result = tracer.finish();
            assert!(result.status.success(), "{}", result.stderr);
            json(&result.stdout)
        })
        .collect();
    let row = |report: &Value, pid: u32| -> Option<Value> {
        report["processes"]
            .as_array()
            .expect("processes array")
            .iter()
            .find(|p| p["pid"] == pid)
            .cloned()
    };

    let all = &reports[0];
    for (pid, cgroup) in [(a_pid, cgroups.path("a/inner")), (b_pid, cgroups.path("b"))] {
        let p = row(all, pid).unwrap_or_else(|| panic!("{pid} missing: {}", all["processes"]));
        assert_eq!(p["cgroup"], cgroup.as_str(), "{p}");
        assert!(u(&p["holds"]) > 0, "{p}");
        for e in entries(all).iter().filter(|e| e["pid"] == pid) {
            assert_eq!(e["cgroup"], cgroup.as_str(), "{e}");
        }
    }

    let filtered = &reports[1];
    let a = row(filtered, a_pid).unwrap_or_else(|| panic!("{}", filtered["processes"]));
    assert_eq!(a["cgroup"], cgroups.path("a/inner").as_str(), "{a}");
    assert_eq!(
        (a["waits"].clone(), a["holds"].clone()),
        (
            row(all, a_pid).unwrap()["waits"].clone(),
            row(all, a_pid).unwrap()["holds"].clone()
        ),
        "the filter loses nothing of the processes it keeps"
    );
    assert!(row(filtered, b_pid).is_none(), "{}", filtered["processes"]);
    let owners: Vec<u64> = entries(filtered).iter().map(|e| u(&e["pid"])).collect();
    assert!(
        owners.iter().all(|&pid| pid == u64::from(a_pid)),
        "only the subtree's processes' own locks (and those of their outside lockers): \
         {owners:?}"
    );
    for counter in ["cgroup_map_full", "name_map_full", "target_map_full"] {
        assert_eq!(u(&filtered["lost"][counter]), 0, "{counter}");
    }
}
