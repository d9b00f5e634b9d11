//! Why threads waited: the scenarios of the 2008-2018 LKML threads on mmap_sem, each traced by
//! the real tracer on the real kernel, asserting the attribution (who waited behind whom, what
//! the holder was doing), not just that numbers exist.

mod common;

use common::{bpf_available, entries, json, serial, trace_workload, u, value_of};
use serde_json::Value;

fn symbols_of(frames: &Value) -> Vec<&str> {
    frames
        .as_array()
        .map(|f| f.iter().filter_map(|f| f["symbol"].as_str()).collect())
        .unwrap_or_default()
}

fn has_symbol(frames: &Value, needle: &str) -> bool {
    symbols_of(frames).iter().any(|s| s.contains(needle))
}

/// Ying Han's case: writers looping mmap/munmap (one with MAP_POPULATE) beside faulting
/// threads. The faults' waits must be charged to the mmap/munmap writers, and the populate
/// path, which holds the lock for read while it faults 64 MiB in, must show whom it blocked.
#[test]
fn waits_are_charged_to_the_populating_writer() {
    if !bpf_available("waits_are_charged_to_the_populating_writer") {
        return;
    }
    let _serial = serial();
    charge_waits_to_the_populating_writer(&[], "tp_btf");
}

/// The same attribution from the classic tracepoints, the fallback of kernels whose BTF lacks
/// the mmap_lock trace calls.
#[test]
fn classic_tracepoints_charge_waits_to_the_populating_writer() {
    if !bpf_available("classic_tracepoints_charge_waits_to_the_populating_writer") {
        return;
    }
    let _serial = serial();
    charge_waits_to_the_populating_writer(&["--classic-tracepoints"], "classic");
}

fn charge_waits_to_the_populating_writer(tracer_args: &[&str], tracepoints: &str) {
    let mut args = vec!["--format", "json", "--syscall-times"];
    args.extend_from_slice(tracer_args);
    // Only waits that go to sleep are charged to holders: under emulation 3 s held too few of
    // the faults' (on 6.12, once none was charged, once no populate hold was seen).
    let seconds = if common::slowdown() > 1 { "8" } else { "3" };
    let (result, workload_out) = trace_workload(
        &["churn", "--threads", "3", "--writer", "--seconds", seconds],
        &args,
    );
    let report = json(&result.stdout);
    let features = &report["features"];
    for f in ["contention", "faults", "syscalls", "offcpu"] {
        assert_eq!(features[f], true, "feature {f} not attached: {features}");
    }
    assert_eq!(features["lock_tracepoints"], tracepoints, "{features}");

    // Faults that fall back to mmap_lock (readers) wait behind mmap/munmap (writers): held, or
    // queued ahead of them.
    let (to_writers, charged) = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "wait" && e["cause"] == "page_fault")
        .flat_map(|e| e["blocked_by"].as_array().unwrap())
        .fold((0, 0), |(w, all), b| {
            let writer = ["mmap", "munmap"].contains(&b["cause"].as_str().unwrap());
            (
                w + if writer { u(&b["wait_ns"]) } else { 0 },
                all + u(&b["wait_ns"]),
            )
        });
    assert!(charged > 0, "no fault wait was charged to anyone");
    // Most of them here (63-93% on this machine). Under emulation a guest's vCPUs share one
    // host thread and lose it for whole host time slices, so the faults' own read holds are
    // often preempted while a writer queues: the waits behind those holds are rightly theirs
    // (47% went to writers once on 6.12, with the host's tests running beside the guest).
    let writers_at_least = if common::slowdown() > 1 { 3 } else { 2 };
    assert!(
        to_writers * writers_at_least > charged,
        "only {to_writers} of {charged} ns of fault waits charged to mmap/munmap"
    );

    let writer_hold = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "hold" && has_symbol(&e["frames"], "__mm_populate"))
        .max_by_key(|e| u(&e["total_ns"]))
        .unwrap_or_else(|| {
            let holds: Vec<String> = entries(&report)
                .iter()
                .filter(|e| e["kind"] == "hold")
                .map(|e| {
                    format!(
                        "{} {} x{} max {} stack {} {:?}",
                        e["mode"],
                        e["cause"],
                        e["count"],
                        e["max_ns"],
                        e["stack_collected"],
                        symbols_of(&e["frames"])
                    )
                })
                .collect();
            panic!(
                "no hold under __mm_populate; lost {}; holds:\n{}",
                report["lost"],
                holds.join("\n")
            )
        });
    assert_eq!(writer_hold["cause"], "mmap");
    assert!(
        u(&writer_hold["blocked_others"]["wait_ns"]) > 0,
        "the writer's hold blocked nobody: {}",
        writer_hold["blocked_others"]
    );
    assert!(
        has_symbol(&writer_hold["frames"], "populate_writer")
            || has_symbol(&writer_hold["frames"], "map_populated")
    );

    // Most of a munmap's wait behind a 20 ms populate is spent asleep in the slow path.
    let (contended, waited) = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "wait" && e["cause"] == "munmap")
        .fold((0, 0), |(c, w), e| {
            (c + u(&e["contended_ns"]), w + u(&e["total_ns"]))
        });
    assert!(
        contended > 0 && contended <= waited,
        "contended {contended} of {waited}"
    );

    let iterations = value_of(&workload_out, "iterations");
    let munmap = &report["syscalls"]["munmap"];
    assert!(
        u(&munmap["count"]) >= iterations,
        "{munmap} vs {iterations} iterations"
    );
    assert!(u(&munmap["lock_wait_ns"]) > 0 && u(&munmap["lock_wait_ns"]) <= u(&munmap["total_ns"]));
    let faults = &report["faults"];
    assert!(
        u(&faults["took_mmap_lock"]) > 0,
        "anonymous first faults fall back: {faults}"
    );
    assert!(u(&faults["took_mmap_lock"]) <= u(&faults["total"]));
}

/// Without --syscall-times no syscall tracepoint is attached (each would slow every syscall on
/// the machine), yet lock operations are still named after their mm syscall, from the
/// registers the thread saved entering the kernel: as many munmap write locks as the
/// workload's iterations (each unmaps once, besides a few of libc's), on the classic fallback
/// too.
#[test]
fn syscall_causes_come_without_syscall_tracepoints() {
    if !bpf_available("syscall_causes_come_without_syscall_tracepoints") {
        return;
    }
    let _serial = serial();
    for extra in [&[][..], &["--classic-tracepoints"][..]] {
        let mut args = vec!["--format", "json"];
        args.extend_from_slice(extra);
        let (result, workload_out) =
            trace_workload(&["churn", "--threads", "2", "--seconds", "2"], &args);
        let report = json(&result.stdout);
        assert_eq!(
            report["features"]["syscalls"], false,
            "{}",
            report["features"]
        );
        assert!(
            report["syscalls"]["munmap"]["count"] == 0,
            "{}",
            report["syscalls"]
        );
        let iterations = value_of(&workload_out, "iterations");
        let munmap_waits: u64 = entries(&report)
            .iter()
            .filter(|e| e["kind"] == "wait" && e["mode"] == "write" && e["cause"] == "munmap")
            .map(|e| u(&e["count"]))
            .sum();
        // A few more: the threads' ends and libc's arenas unmap too.
        assert!(
            munmap_waits >= iterations && munmap_waits <= iterations + 16,
            "{munmap_waits} munmap write locks for {iterations} iterations ({extra:?})"
        );
    }
}

/// A lock taken inside a syscall that is not an mm syscall is named by it without a stack:
/// pread() into a fresh buffer faults its pages in from the kernel (copy_to_user), under
/// mmap_lock and without the per-VMA lock, one lock per page (two threads' 1 MiB buffers: up
/// to 512), all `in read()`; and with no stack taken, no operation of the target's own is left
/// `no stack (short)`. On the classic fallback too.
#[test]
fn locks_inside_other_syscalls_are_named_by_them_without_stacks() {
    if !bpf_available("locks_inside_other_syscalls_are_named_by_them_without_stacks") {
        return;
    }
    let _serial = serial();
    for extra in [&[][..], &["--classic-tracepoints"][..]] {
        let mut args = vec!["--stack-threshold", "10s"];
        args.extend_from_slice(extra);
        let report = pread_into_fresh_buffers(&args);
        let own = entries(&report)
            .iter()
            .filter(|e| e["outside_locker"] == false)
            .collect::<Vec<_>>();
        let in_read: u64 = own
            .iter()
            .filter(|e| e["kind"] == "hold" && e["cause"] == "in_read")
            .map(|e| u(&e["count"]))
            .sum();
        assert!(
            (128..=512 + 64).contains(&in_read),
            "{in_read} holds in read() for two 1 MiB buffers ({extra:?}): {}",
            report["causes"]
        );
        let unknown: Vec<_> = own.iter().filter(|e| e["cause"] == "no_stack").collect();
        assert!(unknown.is_empty(), "{extra:?}: {unknown:#?}");
    }
}

/// Yang Shi's case: one huge mprotect holds the lock for write for milliseconds; the readers
/// it blocked wait behind it, and the hold's "blocked others" says how much waiting it caused.
#[test]
fn one_long_write_hold_names_the_readers_it_blocked() {
    if !bpf_available("one_long_write_hold_names_the_readers_it_blocked") {
        return;
    }
    let _serial = serial();
    let (result, workload_out) = trace_workload(
        &[
            "hold",
            "--size-mib",
            "256",
            "--repeat",
            "3",
            "--readers",
            "2",
        ],
        &["--format", "json"],
    );
    assert!(value_of(&workload_out, "reader_calls") > 0);
    let report = json(&result.stdout);
    // The longest mprotect hold, against the workload's own timing of its longest call: the
    // hold is inside the call, and most of it (the rest is the wait behind the readers and
    // the tracer's work at start_locking). Had the hold been charged to another cause, the
    // mprotect entries would hold only the short mprotects of thread stacks. Not "the longest
    // write hold of all": a guest descheduled for a moment while another call holds the lock
    // (seen once under emulation, two guests on two CPUs) makes any short hold long.
    let hold = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "hold" && e["mode"] == "write" && e["cause"] == "mprotect")
        .max_by_key(|e| u(&e["max_ns"]))
        .expect("no mprotect write hold");
    let (traced, timed) = (
        u(&hold["max_ns"]),
        value_of(&workload_out, "max_mprotect_ns"),
    );
    assert!(
        traced <= timed && traced * 10 >= timed,
        "longest mprotect hold {traced} ns against the workload's longest call {timed} ns"
    );
    let caused = &hold["blocked_others"];
    assert!(
        u(&caused["count"]) > 0 && u(&caused["wait_ns"]) > 0,
        "{caused}"
    );
    // The readers (mincore) spent most of their waiting behind it.
    let reader_waits: Vec<&Value> = entries(&report)
        .iter()
        .filter(|e| {
            e["kind"] == "wait" && e["mode"] == "read" && has_symbol(&e["frames"], "mincore")
        })
        .collect();
    assert!(!reader_waits.is_empty(), "no mincore wait with a stack");
    let (behind_mprotect, charged) = reader_waits
        .iter()
        .flat_map(|e| e["blocked_by"].as_array().unwrap())
        .fold((0, 0), |(m, all), b| {
            let w = u(&b["wait_ns"]);
            (m + if b["cause"] == "mprotect" { w } else { 0 }, all + w)
        });
    assert!(
        behind_mprotect * 2 > charged,
        "{behind_mprotect} of {charged} ns of reader waits behind the mprotect"
    );
}

/// Edwin's case: the same files read by threads with pread, then with mmap+touch+munmap. Only
/// the mmap variant takes the lock, for write twice per file, and its waits are mmap/munmap
/// waiting behind each other and faults.
#[test]
fn mmap_reads_contend_where_pread_does_not() {
    if !bpf_available("mmap_reads_contend_where_pread_does_not") {
        return;
    }
    let _serial = serial();
    // pread's threads still take the lock a few dozen times (their stacks, exit): the run must
    // read enough files for those to be under a tenth of them, so under emulation it is longer
    // (2 s there read 296 files against 31 such locks).
    let seconds = (2 * common::slowdown()).to_string();
    let args = |method| {
        [
            "files",
            "--method",
            method,
            "--threads",
            "3",
            "--files",
            "6",
            "--file-size",
            "1M",
            "--seconds",
            &seconds,
        ]
    };
    let (pread, pread_out) = trace_workload(&args("pread"), &["--format", "json"]);
    let (mmap, mmap_out) = trace_workload(&args("mmap"), &["--format", "json", "--syscall-times"]);
    let (pread, mmap) = (json(&pread.stdout), json(&mmap.stdout));
    let pread_files = value_of(&pread_out, "files_read");
    let mmap_files = value_of(&mmap_out, "files_read");
    let writes = |r: &Value| u(&r["totals"]["write"]["acquisitions"]);
    assert!(
        writes(&mmap) >= 2 * mmap_files,
        "{} writes for {mmap_files} files",
        writes(&mmap)
    );
    assert!(
        writes(&pread) * 10 < pread_files,
        "pread took the lock {} times for {pread_files} files",
        writes(&pread)
    );
    let mm_waits: u64 = entries(&mmap)
        .iter()
        .filter(|e| {
            e["kind"] == "wait" && ["mmap", "munmap"].contains(&e["cause"].as_str().unwrap())
        })
        .map(|e| u(&e["total_ns"]))
        .sum();
    assert!(mm_waits > 0);
    let behind_mm: u64 = entries(&mmap)
        .iter()
        .filter(|e| e["kind"] == "wait")
        .flat_map(|e| e["blocked_by"].as_array().unwrap())
        .filter(|b| ["mmap", "munmap", "page_fault"].contains(&b["cause"].as_str().unwrap()))
        .map(|b| u(&b["wait_ns"]))
        .sum();
    assert!(
        behind_mm > 0,
        "no wait charged to mmap/munmap/fault holders"
    );
    for call in ["mmap", "munmap"] {
        let count = u(&mmap["syscalls"][call]["count"]);
        assert!(
            count >= mmap_files,
            "{count} {call} calls for {mmap_files} files"
        );
    }
}

/// A holder asleep on disk I/O: another process reads the target's file mapping through
/// /proc/PID/mem with the pages out of the cache, holding the target's lock in D state. The
/// report must name that outside locker, its uninterruptible sleep and its I/O stack, and the
/// target's threads that waited behind it.
#[test]
fn outside_reader_asleep_on_io_while_holding() {
    if !bpf_available("outside_reader_asleep_on_io_while_holding") {
        return;
    }
    let _serial = serial();
    // The target keeps its mapping, and its threads keep churning, until the reader is done
    // (a reader that outlived the mapping would get EIO from /proc/PID/mem). Under emulation
    // a smaller file still makes holds of seconds: every read is slower, and the target's
    // churning threads share the reader's CPU.
    let (file_size, rounds) = if common::slowdown() > 1 {
        ("32M", "2")
    } else {
        ("128M", "4")
    };
    let mut target = common::Workload::spawn_stoppable(&[
        "filemap",
        "--file-size",
        file_size,
        "--threads",
        "2",
        "--seconds",
        "600",
    ]);
    let mapped = target.read_line();
    let field = |key: &str| {
        mapped
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in {mapped:?}"))
            .to_string()
    };
    let (addr, len, file) = (field("addr"), field("len"), field("file"));
    let mut tracer = common::Tracer::spawn(&[
        "-p".into(),
        target.pid.to_string(),
        "--format".into(),
        "json".into(),
    ]);
    tracer.wait_attached();
    target.start();
    let reader = std::process::Command::new(common::workload_path())
        .args([
            "proc-mem-read",
            "--pid",
            &target.pid.to_string(),
            "--addr",
            &addr,
            "--len",
            &len,
            "--file",
            &file,
            "--rounds",
            rounds,
        ])
        .output()
        .unwrap();
    assert!(
        reader.status.success(),
        "{}",
        String::from_utf8_lossy(&reader.stderr)
    );
    let reader_pid: u64 = String::from_utf8_lossy(&reader.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("ready pid="))
        .unwrap()
        .parse()
        .unwrap();
    target.stop();
    target.finish();
    let result = tracer.finish();
    assert!(result.status.success(), "{}", result.stderr);
    let report = json(&result.stdout);

    let io_hold = entries(&report)
        .iter()
        .filter(|e| {
            e["kind"] == "hold"
                && e["outside_locker"] == true
                && u(&e["locker"]["pid"]) == reader_pid
        })
        .filter(|e| e["cause"] == "proc_reader")
        .max_by_key(|e| u(&e["offcpu"]["uninterruptible_ns"]))
        .expect("the reader's /proc holds with a stack");
    assert!(
        u(&io_hold["offcpu"]["uninterruptible_ns"]) > 0,
        "no D sleep while holding: {}",
        io_hold["offcpu"]
    );
    let sleep = &io_hold["sleep_frames"];
    assert!(
        [
            "filemap_fault",
            "io_schedule",
            "folio_wait",
            "filemap_get_pages",
            "page_cache_ra"
        ]
        .iter()
        .any(|f| has_symbol(sleep, f)),
        "sleep stack names no I/O: {:?}",
        symbols_of(sleep)
    );
    let behind_reader: u64 = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "wait" && e["outside_locker"] == false)
        .flat_map(|e| e["blocked_by"].as_array().unwrap())
        .filter(|b| b["outside_locker"] == true && u(&b["locker"]["pid"]) == reader_pid)
        .map(|b| u(&b["wait_ns"]))
        .sum();
    assert!(
        behind_reader > 0,
        "no target thread waited behind the /proc/PID/mem reader"
    );
}

/// Lock-holder preemption: more runnable threads than CPUs, so holders are descheduled while
/// holding; their holds show runnable time.
#[test]
fn preempted_holders_show_runnable_time() {
    if !bpf_available("preempted_holders_show_runnable_time") {
        return;
    }
    let _serial = serial();
    let (result, _) = trace_workload(
        &["churn", "--threads", "3", "--hogs", "4", "--seconds", "3"],
        &["--format", "json"],
    );
    let report = json(&result.stdout);
    let (runnable, held) = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "hold")
        .fold((0, 0), |(r, h), e| {
            (r + u(&e["offcpu"]["runnable_ns"]), h + u(&e["total_ns"]))
        });
    assert!(
        runnable > 0,
        "no hold was preempted with 4 CPU hogs on this machine"
    );
    assert!(runnable <= held);
    let preempted_stack = entries(&report)
        .iter()
        .filter(|e| e["kind"] == "hold" && e["stack_collected"] == true)
        .any(|e| u(&e["offcpu"]["runnable_ns"]) > 0);
    assert!(preempted_stack, "runnable time on no stacked hold");
}

/// The JSON report of two threads pread()ing 1 MiB files into buffers of their own that
/// nothing touched before: each page of the buffers is first written by copy_to_user.
fn pread_into_fresh_buffers(tracer_args: &[&str]) -> Value {
    let mut args = vec!["--format", "json"];
    args.extend_from_slice(tracer_args);
    let (result, _) = trace_workload(
        &[
            "files",
            "--method",
            "pread",
            "--threads",
            "2",
            "--files",
            "4",
            "--file-size",
            "1M",
            "--seconds",
            "1",
        ],
        &args,
    );
    assert!(result.status.success(), "{}", result.stderr);
    json(&result.stdout)
}

/// clamd's case, issue 11: pread() into a buffer calloc() left untouched faults in the kernel
/// (copy_to_user), and on x86 those faults take mmap_lock without trying the per-VMA lock; the
/// kernel's counter of user-mode faults that took the lock does not see them. The report must
/// say which faults each figure counts: the page-fault holds split into user-mode and
/// kernel-mode ones, adding up to the "page fault" cause rows.
#[test]
fn kernel_mode_faults_are_told_apart_from_user_mode_ones() {
    if !bpf_available("kernel_mode_faults_are_told_apart_from_user_mode_ones") {
        return;
    }
    let _serial = serial();
    // Every lock with its kernel stack: kernel-mode faults are told by it.
    let report = pread_into_fresh_buffers(&["--stack-threshold", "0"]);
    let faults = &report["faults"];
    let (user_mode, kernel_mode) = (
        u(&faults["user_mode_holds"]),
        u(&faults["kernel_mode_holds"]),
    );
    assert!(
        kernel_mode > 0,
        "pread into untouched memory faults in the kernel: {faults}"
    );
    let fault_holds: u64 = entries(&report)
        .iter()
        .filter(|e| {
            e["kind"] == "hold" && e["cause"] == "page_fault" && e["outside_locker"] == false
        })
        .map(|e| u(&e["count"]))
        .sum();
    assert_eq!(
        user_mode + kernel_mode,
        fault_holds,
        "the page-fault holds are user-mode or kernel-mode ones: {faults}"
    );
    let in_copy_to_user = entries(&report).iter().any(|e| {
        e["kind"] == "hold"
            && e["cause"] == "page_fault"
            && has_symbol(&e["frames"], "copy")
            && has_symbol(&e["frames"], "read")
    });
    assert!(
        in_copy_to_user,
        "no page-fault hold inside a read's copy to user memory"
    );
}

/// A writer that holds mmap_lock for write while it waits for a VMA's readers (the per-VMA
/// lock, Linux 6.4 on): mprotect() splitting and merging the VMA that threads fault pages in
/// and out of. The report names those sleeps of the write holds and the threads that ended
/// them, a VMA's readers, with their stacks. Without per-VMA locks (6.1) it says so.
#[test]
fn write_holds_waiting_for_per_vma_lock_readers_name_the_readers() {
    if !bpf_available("write_holds_waiting_for_per_vma_lock_readers_name_the_readers") {
        return;
    }
    let _serial = serial();
    let seconds = if common::slowdown() > 1 { "6" } else { "2" };
    let workload = ["vma-lock", "--threads", "4", "--seconds", seconds];
    let (result, _) = trace_workload(&workload, &["--format", "json"]);
    let report = json(&result.stdout);
    assert_eq!(report["features"]["wakers"], true, "{}", report["features"]);
    let pid = u(&report["target"]["pids"][0]);
    let sleeps = report["wakers"].as_array().expect("wakers array");
    if report["features"]["per_vma_locks"] == false {
        assert!(
            sleeps.iter().all(|s| s["per_vma_lock"] == false),
            "per-VMA lock waits on a kernel without them: {sleeps:#?}"
        );
        let (text, _) = trace_workload(&workload, &[]);
        assert!(
            text.stdout.contains("Per-VMA locks: none in this kernel"),
            "{}",
            text.stdout
        );
        return;
    }
    let vma: Vec<&Value> = sleeps
        .iter()
        .filter(|s| s["per_vma_lock"] == true)
        .collect();
    assert!(!vma.is_empty(), "no per-VMA lock wait: {sleeps:#?}");
    for sleep in &vma {
        assert_eq!(sleep["mode"], "write", "{sleep}");
        assert_eq!(u(&sleep["pid"]), pid, "{sleep}");
        // Asleep in the mprotect() that splits or merges the VMA.
        assert!(has_symbol(&sleep["sleep_frames"], "mprotect"), "{sleep}");
    }
    // Woken by the workload's own threads leaving the VMA's lock, their stacks shown: the
    // faulting loop or its madvise (which takes the per-VMA lock too from 6.17).
    let readers: Vec<&Value> = vma
        .iter()
        .flat_map(|s| s["woken_by"].as_array().into_iter().flatten())
        .filter(|w| w["vma_reader"] == true)
        .collect();
    assert!(!readers.is_empty(), "no reader among the wakers: {vma:#?}");
    let named_by_its_loop = |reader: &&Value| {
        has_symbol(&reader["frames"], "refault_slice") || has_symbol(&reader["frames"], "madvise")
    };
    for reader in &readers {
        assert_eq!(u(&reader["pid"]), pid, "{reader}");
        assert_ne!(
            u(&reader["tid"]),
            pid,
            "the writer is the main thread: {reader}"
        );
        // A waker's user stack is walked by frame pointers in its own context; one caught
        // where the walk fails (seen once: `clone3` alone) still shows its fault in the kernel.
        assert!(
            named_by_its_loop(reader) || has_symbol(&reader["frames"], "exc_page_fault"),
            "{reader}"
        );
    }
    assert!(
        readers.iter().any(named_by_its_loop),
        "no reader's stack names the loop: {readers:#?}"
    );
    let asleep: u64 = vma.iter().map(|s| u(&s["asleep_ns"])).sum();
    assert!(
        asleep <= u(&report["totals"]["write"]["hold_ns"]),
        "{asleep}"
    );
}
