//! Hostile targets (issue 11): a traced process that turns the files it maps against the tracer,
//! which runs as root, still gets a full report, in bounded time, with nothing read from the
//! wrong file and nothing it named printed raw. The targets are copies of the bundled workload
//! (`mmapsem-workload hostile --kind ...`) that abuse their own executable while they map and
//! unmap from its code, so that their stacks point into the abused file.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bpf_available, json, serial, tracer, workload_path, Workload};
use serde_json::Value;

/// "Does not hang": far above the few seconds each trace takes.
const BOUND: Duration = Duration::from_secs(60);

/// A copy of the workload at `dir/name`, for a target that abuses its own file.
fn workload_copy(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    fs::copy(workload_path(), &path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A target started idle: its pid, once it has done its hostile deed.
struct Target {
    child: Child,
    pid: u32,
}

fn spawn_target(exe: &Path, args: &[&str]) -> Target {
    let mut child = Command::new(exe)
        .arg("--wait-signal")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the target");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut pid = None;
    // `ready pid=N`, then (hostile mode) the line saying what was done, before the gate.
    for _ in 0..2 {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        if let Some(n) = line.trim().strip_prefix("ready pid=") {
            pid = Some(n.parse().unwrap());
        }
        if args.first() != Some(&"hostile") {
            break;
        }
    }
    // The rest of its output is not needed: let it go to a thread that drains it.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Target {
        child,
        pid: pid.expect("ready line"),
    }
}

/// What a tracer run gave: exit status (None if it did not exit within `BOUND` and was
/// killed), report, stderr.
struct Run {
    status: Option<std::process::ExitStatus>,
    report: String,
    stderr: String,
    took: Duration,
}

/// Traces `target` with `args` until it exits (or the trace's own end), bounded by `BOUND`.
fn trace(dir: &Path, target: &mut Target, args: &[&str]) -> Run {
    let report_path = dir.join(format!("report-{}", target.pid));
    let stderr_path = dir.join(format!("stderr-{}", target.pid));
    let mut tracer = Command::new(tracer())
        .args(["-p", &target.pid.to_string(), "-o"])
        .arg(&report_path)
        .args(args)
        .stdout(Stdio::null())
        .stderr(File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let read = |p: &Path| fs::read_to_string(p).unwrap_or_default();
    while !read(&stderr_path).contains("attached") {
        if started.elapsed() > BOUND || tracer.try_wait().unwrap().is_some() {
            let _ = tracer.kill();
            panic!("tracer never attached:\n{}", read(&stderr_path));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(target.pid as i32, libc::SIGUSR1) };
    let status = loop {
        if let Some(status) = tracer.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > BOUND {
            let _ = tracer.kill();
            let _ = tracer.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    let _ = target.child.kill();
    let _ = target.child.wait();
    Run {
        status,
        report: read(&report_path),
        stderr: read(&stderr_path),
        took,
    }
}

/// The tracer exited 0 within the bound and wrote a whole text report with the target's
/// stacks in it.
fn assert_full_text_report(run: &Run, module: &str) {
    assert!(
        run.status.is_some(),
        "tracer still running after {BOUND:?} (killed); report:\n{}\nstderr:\n{}",
        run.report,
        run.stderr
    );
    assert!(
        run.status.unwrap().success(),
        "{:?}\nstderr:\n{}",
        run.status,
        run.stderr
    );
    assert!(run.report.contains("mmap_lock"), "{}", run.report);
    assert!(
        run.report
            .lines()
            .any(|l| l.starts_with("=== ") && l.contains(module)),
        "no frame in {module}:\n{}\nstderr:\n{}",
        run.report,
        run.stderr
    );
    eprintln!("traced in {:?}", run.took);
}

#[test]
fn a_target_whose_executable_became_a_fifo_is_reported_without_hanging() {
    if !bpf_available("a_target_whose_executable_became_a_fifo_is_reported_without_hanging") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = workload_copy(dir.path(), "hostile-fifo");
    let mut target = spawn_target(&exe, &["hostile", "--kind", "fifo", "--seconds", "3"]);
    // Default mode: frame-pointer stacks, symbolized after the target exited.
    let run = trace(dir.path(), &mut target, &[]);
    assert_became_fifo(&exe);
    assert_full_text_report(&run, "hostile-fifo");
}

#[test]
fn a_target_mapping_a_sparse_terabyte_executable_is_reported() {
    if !bpf_available("a_target_mapping_a_sparse_terabyte_executable_is_reported") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = workload_copy(dir.path(), "hostile-sparse");
    let dir_arg = dir.path().display().to_string();
    let mut target = spawn_target(
        &exe,
        &[
            "hostile",
            "--kind",
            "sparse",
            "--seconds",
            "3",
            "--dir",
            &dir_arg,
        ],
    );
    // The unwinder looks at every executable mapping, the 1 TiB one included.
    let run = trace(dir.path(), &mut target, &["--user-stack", "dwarf"]);
    assert_full_text_report(&run, "hostile-sparse");
}

/// The frames of `report` (JSON) in `module`.
fn frames_in<'a>(report: &'a Value, module: &str) -> Vec<&'a Value> {
    report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["frames"].as_array().unwrap())
        .filter(|f| f["module"].as_str().is_some_and(|m| m.ends_with(module)))
        .collect()
}

/// The executable is replaced by another ELF object (the tracer binary: big, full of
/// symbols). Symbolizing by path would name functions of the decoy.
fn trace_replaced(exe_name: &str, workload_seconds: &str, tracer_args: &[&str]) -> (Run, Value) {
    let dir = tempfile::tempdir().unwrap();
    let exe = workload_copy(dir.path(), exe_name);
    let mut target = spawn_target(
        &exe,
        &[
            "hostile",
            "--kind",
            "replaced",
            "--decoy",
            tracer(),
            "--seconds",
            workload_seconds,
        ],
    );
    // Every operation's stacks: names of the workload's own code whatever the sampler picks.
    let mut args = vec!["--format", "json", "--stack-threshold", "0"];
    args.extend(tracer_args);
    let run = trace(dir.path(), &mut target, &args);
    assert_eq!(
        run.status.map(|s| s.success()),
        Some(true),
        "{}",
        run.stderr
    );
    let report = json(&run.report);
    (run, report)
}

/// Symbolized after the target exited: map_files is gone and the path holds the decoy, but the
/// tracer kept the file it mapped open from its first look at the process, so its frames name
/// the workload's own functions, never the decoy's.
#[test]
fn a_replaced_executable_of_an_exited_target_is_symbolized_from_the_file_it_mapped() {
    if !bpf_available(
        "a_replaced_executable_of_an_exited_target_is_symbolized_from_the_file_it_mapped",
    ) {
        return;
    }
    let _serial = serial();
    let (run, report) = trace_replaced("hostile-replaced-exited", "3", &[]);
    let frames = frames_in(&report, "hostile-replaced-exited");
    assert!(
        !frames.is_empty(),
        "no frames in the executable:\n{}",
        run.report
    );
    let symbols: Vec<&str> = frames.iter().filter_map(|f| f["symbol"].as_str()).collect();
    assert!(
        symbols.iter().any(|s| s.starts_with("mmapsem_workload::")),
        "no workload function among {symbols:?}"
    );
    assert!(
        !symbols.iter().any(|s| s.contains("tracer::")),
        "a symbol of the replacing file (the tracer) among {symbols:?}"
    );
}

#[test]
fn a_replaced_executable_of_a_live_target_is_symbolized_from_the_mapped_file() {
    if !bpf_available("a_replaced_executable_of_a_live_target_is_symbolized_from_the_mapped_file") {
        return;
    }
    let _serial = serial();
    // The trace ends while the target still runs: its mappings are read through map_files.
    let (run, report) = trace_replaced("hostile-replaced-live", "20", &["-d", "3"]);
    let frames = frames_in(&report, "hostile-replaced-live");
    let symbols: Vec<&str> = frames.iter().filter_map(|f| f["symbol"].as_str()).collect();
    assert!(
        symbols.iter().any(|s| s.contains("churn")),
        "no workload function among {symbols:?}:\n{}",
        run.report
    );
    assert!(
        !symbols.iter().any(|s| s.contains("tracer::")),
        "a function of the replacing file: {symbols:?}"
    );
}

#[test]
fn names_the_target_controls_are_printed_escaped() {
    if !bpf_available("names_the_target_controls_are_printed_escaped") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A path with an escape sequence and a newline; the target also renames itself (comm).
    let exe = workload_copy(dir.path(), "hostile-\x1b[2Jwork\nload");
    let mut target = spawn_target(&exe, &["hostile", "--kind", "names", "--seconds", "3"]);
    // -vv: the log lines that name the target's files must be escaped as well.
    let run = trace(dir.path(), &mut target, &["-vv"]);
    assert_full_text_report(&run, "work");
    assert!(!run.report.contains('\x1b'), "raw escape:\n{}", run.report);
    // The "attached ... tracing pid N (comm)" line and the log too.
    assert!(!run.stderr.contains('\x1b'), "raw escape:\n{}", run.stderr);
    assert!(
        run.report.contains("(\\x1b[31mred\\nfake)"),
        "comm not escaped:\n{}",
        run.report
    );
    assert!(
        run.report.contains("hostile-\\x1b[2Jwork"),
        "path not escaped:\n{}",
        run.report
    );
    assert!(
        !run.report
            .lines()
            .any(|l| l.starts_with("load") || l.starts_with("fake")),
        "a name broke a line:\n{}",
        run.report
    );
}

/// A debug link naming a FIFO next to the object: a symbolizer that looks for debug files in
/// the object's directory (where the target writes) opens it and blocks.
#[test]
fn a_debug_link_to_a_fifo_beside_the_object_is_not_followed() {
    if !bpf_available("a_debug_link_to_a_fifo_beside_the_object_is_not_followed") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = workload_copy(dir.path(), "hostile-debuglink");
    let debug = dir.path().join("hostile-debuglink.debug");
    fs::write(&debug, b"not debug info").unwrap();
    let status = Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&exe)
        .status()
        .expect("objcopy (binutils)");
    assert!(status.success());
    fs::remove_file(&debug).unwrap();
    let c_path = std::ffi::CString::new(debug.display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let mut target = spawn_target(&exe, &["churn", "--threads", "1", "--seconds", "2"]);
    // Every operation's stacks: names of the workload's own code whatever the sampler picks.
    let run = trace(dir.path(), &mut target, &["--stack-threshold", "0"]);
    assert_full_text_report(&run, "hostile-debuglink");
    assert!(
        run.report.contains("churn"),
        "workload functions from the symbol table:\n{}",
        run.report
    );
}

/// A stripped object (no symbol table) whose debug file lies in a directory given with
/// `--debug-dir`, in the build-id layout: its frames are named from that file.
#[test]
fn a_stripped_object_is_named_from_a_debug_dir_by_its_build_id() {
    if !bpf_available("a_stripped_object_is_named_from_a_debug_dir_by_its_build_id") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = workload_copy(dir.path(), "stripped-workload");
    let run = |args: &[&str], file: &Path| {
        let status = Command::new(args[0]).args(&args[1..]).arg(file).status();
        assert!(status.expect("binutils").success(), "{args:?}");
    };
    let debug = dir.path().join("stripped-workload.debug");
    run(
        &["objcopy", "--only-keep-debug", &exe.display().to_string()],
        &debug,
    );
    run(&["strip", "--strip-all"], &exe);
    let sections = Command::new("readelf")
        .arg("-S")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&sections.stdout).contains(".symtab"),
        "strip left a symbol table"
    );
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(&exe)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the workload has a build id")
        .to_string();
    let debug_dir = dir.path().join("debug");
    let by_id = debug_dir.join(".build-id").join(&id[..2]);
    fs::create_dir_all(&by_id).unwrap();
    fs::rename(&debug, by_id.join(format!("{}.debug", &id[2..]))).unwrap();
    let mut target = spawn_target(&exe, &["churn", "--threads", "1", "--seconds", "2"]);
    let debug_arg = debug_dir.display().to_string();
    let run = trace(
        dir.path(),
        &mut target,
        &["--debug-dir", &debug_arg, "--stack-threshold", "0"],
    );
    assert_full_text_report(&run, "stripped-workload");
    assert!(
        run.report.contains("churn_once"),
        "the stripped workload's functions, from its debug file:\n{}",
        run.report
    );
}

/// With file capabilities (AT_SECURE), the environment belongs to the unprivileged caller:
/// MMAPSEM_TRACEFS must not make the tool read another tree.
#[test]
fn settings_from_the_environment_are_ignored_with_file_capabilities() {
    if !bpf_available("settings_from_the_environment_are_ignored_with_file_capabilities") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let capable = dir.path().join("mmapsem-trace");
    fs::copy(tracer(), &capable).unwrap();
    fs::set_permissions(&capable, fs::Permissions::from_mode(0o755)).unwrap();
    let setcap = Command::new("setcap")
        .arg("cap_bpf,cap_perfmon,cap_dac_read_search+ep")
        .arg(&capable)
        .status()
        .expect("setcap");
    assert!(setcap.success());
    // A tree without tracepoints: honoured, it makes the tool fail to find mmap_lock ones.
    let fake = dir.path().join("fake-tracefs");
    fs::create_dir(&fake).unwrap();
    let target = Workload::spawn(&["idle", "--seconds", "30", "--threads", "0"]);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&capable)
        .args(["-p", &target.pid.to_string(), "-d", "0.5"])
        .env("MMAPSEM_TRACEFS", &fake)
        .output()
        .unwrap();
    let mut child = target.child;
    let _ = child.kill();
    let _ = child.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(stderr.contains("ignoring MMAPSEM_TRACEFS"), "{stderr}");
    assert!(!stderr.contains("fake-tracefs"), "{stderr}");
}

/// A library the target dlopens and maps and unmaps from: its frames are in the target's
/// stacks, its path is the one the target then turns into a FIFO.
const CHURN_LIBRARY: &str = r#"
#include <sys/mman.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) static void map_once(void) {
    volatile char *p = mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) { p[0] = 1; munmap((void *)p, 1 << 16); }
}
void churn_lib(double seconds) {
    double end = now() + seconds;
    while (now() < end) map_once();
}
"#;

#[test]
fn a_dlopened_library_replaced_by_a_fifo_is_reported_without_hanging() {
    if !bpf_available("a_dlopened_library_replaced_by_a_fifo_is_reported_without_hanging") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("churn.c");
    fs::write(&source, CHURN_LIBRARY).unwrap();
    let library = dir.path().join("libchurn.so");
    let flags = ["-O1", "-fPIC", "-shared", "-fno-omit-frame-pointer"];
    common::compile_c(&source, &flags, &library);
    let library_arg = library.display().to_string();
    let mut target = spawn_target(
        &workload_path(),
        &[
            "hostile",
            "--kind",
            "library-fifo",
            "--library",
            &library_arg,
            "--seconds",
            "3",
        ],
    );
    let run = trace(dir.path(), &mut target, &[]);
    assert_became_fifo(&library);
    assert_full_text_report(&run, "libchurn");
}

/// A target in another mount namespace (a container's view): the path it maps holds, in the
/// tracer's namespace, a different file (the decoy). The tracer symbolizes what the target
/// mapped, through /proc/PID/map_files, never the decoy's symbols.
#[test]
fn a_target_in_another_mount_namespace_is_symbolized_from_its_own_files() {
    if !bpf_available("a_target_in_another_mount_namespace_is_symbolized_from_its_own_files") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (real, shown) = (dir.path().join("real"), dir.path().join("bin"));
    fs::create_dir(&real).unwrap();
    fs::create_dir(&shown).unwrap();
    workload_copy(&real, "hostile-ns");
    // What the tracer's namespace sees at the path: another ELF object entirely.
    fs::copy(tracer(), shown.join("hostile-ns")).unwrap();
    let script = format!(
        "mount --bind {real} {shown} && exec {shown}/hostile-ns --wait-signal churn \
         --threads 2 --seconds 20",
        real = real.display(),
        shown = shown.display()
    );
    // unshare and sh exec into the target: one process, whose pid it prints.
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running unshare (util-linux)");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let pid: u32 = line
        .trim()
        .strip_prefix("ready pid=")
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    assert_eq!(pid, child.id(), "the target is the process unshare became");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let mut target = Target { child, pid };
    // Ends while the target runs (then killed): its mappings are read through map_files.
    let run = trace(
        dir.path(),
        &mut target,
        &["--format", "json", "-d", "3", "--stack-threshold", "0"],
    );
    assert_eq!(
        run.status.map(|s| s.success()),
        Some(true),
        "{}",
        run.stderr
    );
    let report = json(&run.report);
    let symbols: Vec<String> = frames_in(&report, "hostile-ns")
        .iter()
        .filter_map(|f| f["symbol"].as_str().map(str::to_owned))
        .collect();
    assert!(
        symbols.iter().any(|s| s.contains("churn")),
        "no workload function among {symbols:?}:\n{}",
        run.report
    );
    assert!(
        symbols
            .iter()
            .all(|s| !s.contains("mmapsem_trace::") && !s.contains("tracer::")),
        "symbols of the file at the path in the tracer's namespace: {symbols:?}"
    );
}

/// The target turned `path` into a FIFO, as its hostile mode promises.
fn assert_became_fifo(path: &std::path::Path) {
    assert!(
        fs::symlink_metadata(path).unwrap().file_type().is_fifo(),
        "the target did not leave a FIFO at {}",
        path.display()
    );
}
