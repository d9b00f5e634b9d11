//! Where the tracer writes, as root: regular files are replaced atomically (keeping their
//! mode), devices, FIFOs and its own stdout are written to and never replaced, symlinks left
//! by others are never followed, and two outputs to one file are refused before tracing.

mod common;

use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output};

use common::{bpf_available, serial, trace_workload, tracer};

/// The tracer on this test process for half a second, with `args`.
fn trace_self(args: &[&str], dir: &Path) -> Output {
    let me = std::process::id().to_string();
    Command::new(tracer())
        .current_dir(dir)
        .args(["-p", &me, "-d", "0.5"])
        .args(args)
        .output()
        .expect("running tracer")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn is_char_device(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

/// /dev/null's and /dev/full's device numbers.
const NULL: (u32, u32) = (1, 3);
const FULL: (u32, u32) = (1, 7);

/// A character device with the number `(major, minor)` at `path`, mode 0666.
fn mknod(path: &Path, (major, minor): (u32, u32)) {
    let name = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let made = unsafe {
        libc::mknod(
            name.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    // mknod's mode is cut by the umask.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

fn mknod_null(path: &Path) {
    mknod(path, NULL);
}

/// Fails if the machine's device at `path` is no longer one, after putting it back.
fn assert_machine_device_kept(path: &str, number: (u32, u32)) {
    let path = Path::new(path);
    if is_char_device(path) {
        return;
    }
    let _ = std::fs::remove_file(path);
    mknod(path, number);
    panic!("{} was replaced by the tracer (restored)", path.display());
}

/// First against a device of our own, so that a regression cannot break the machine's
/// /dev/null; only then against /dev/null itself.
#[test]
fn devices_are_written_to_never_replaced() {
    if !bpf_available("devices_are_written_to_never_replaced") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let null = dir.path().join("null");
    mknod_null(&null);
    let out = trace_self(
        &["-o", null.to_str().unwrap(), "--folded", "null"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        is_char_device(&null),
        "our null device was replaced: {:?}",
        std::fs::symlink_metadata(&null).map(|m| m.file_type())
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary left beside it"
    );

    let out = trace_self(&["-o", "/dev/null"], dir.path());
    assert_machine_device_kept("/dev/null", NULL);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// /dev/full refuses every write: the error says so (the report is salvaged on stdout), and
/// the device is still one. First on a device of our own, as above.
#[test]
fn a_full_device_fails_with_enospc() {
    if !bpf_available("a_full_device_fails_with_enospc") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    mknod(&full, FULL);
    let out = trace_self(&["-o", "full"], dir.path());
    assert!(is_char_device(&full), "our full device was replaced");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot write full: No space left on device"),
        "{err}"
    );

    let out = trace_self(&["-o", "/dev/full"], dir.path());
    assert_machine_device_kept("/dev/full", FULL);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot write /dev/full: No space left on device"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("mmapsem-trace: pid"),
        "report salvaged on stdout"
    );
}

/// `--folded /dev/stdout` writes the stacks into the tracer's stdout (here a pipe) and leaves
/// the /dev/stdout symlink alone.
#[test]
fn dev_stdout_is_written_through() {
    if !bpf_available("dev_stdout_is_written_through") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.txt");
    // First through a link of our own, as /dev/stdout is made, so that a regression cannot
    // replace the machine's.
    let own_link = dir.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &own_link).unwrap();
    let out = trace_self(&["--folded", "stdout", "-o", "report.txt"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        std::fs::symlink_metadata(&own_link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "our stdout link was replaced"
    );
    let (result, _) = trace_workload(
        &["churn", "--threads", "2", "--iterations", "200"],
        &[
            // Every acquisition counts, however short its wait.
            "--weight",
            "count",
            "--folded",
            "/dev/stdout",
            "-o",
            report.to_str().unwrap(),
        ],
    );
    let link = Path::new("/dev/stdout");
    if !std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink()) {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink("/proc/self/fd/1", link).unwrap();
        panic!("/dev/stdout was replaced by the tracer (restored)");
    }
    assert!(
        result
            .stdout
            .lines()
            .any(|l| l.starts_with("mmapsem-workloa;")),
        "no folded stacks on stdout:\n{}",
        result.stdout
    );
    assert!(std::fs::read_to_string(&report)
        .unwrap()
        .contains("mmapsem-trace: pid"));
}

#[test]
fn dash_is_stdout() {
    if !bpf_available("dash_is_stdout") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = trace_self(&["-o", "-", "--format", "json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    common::json(&String::from_utf8_lossy(&out.stdout));
    assert!(!dir.path().join("-").exists(), "a file named - was written");
}

#[test]
fn a_replaced_file_keeps_its_mode() {
    if !bpf_available("a_replaced_file_keeps_its_mode") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.txt");
    std::fs::write(&report, "old").unwrap();
    std::fs::set_permissions(&report, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = trace_self(&["-o", "report.txt"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let meta = std::fs::metadata(&report).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert!(std::fs::read_to_string(&report)
        .unwrap()
        .contains("mmapsem-trace: pid"));
}

/// In a sticky, world-writable directory (as /tmp), a symlink another user planted at the
/// output path is replaced, never followed, even to a device; root's own link to a device
/// there is written through (the /dev/stdout case).
#[test]
fn symlinks_are_followed_only_when_ours() {
    if !bpf_available("symlinks_are_followed_only_when_ours") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let device = dir.path().join("device");
    mknod_null(&device);
    let planted = dir.path().join("planted.folded");
    std::os::unix::fs::symlink(&device, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let ours = dir.path().join("ours.svg");
    std::os::unix::fs::symlink(&device, &ours).unwrap();
    let out = trace_self(
        &[
            "--folded",
            "planted.folded",
            "--svg",
            "ours.svg",
            "-o",
            "r.txt",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let kind = |p: &Path| std::fs::symlink_metadata(p).unwrap().file_type();
    assert!(kind(&planted).is_file(), "the planted link was followed");
    assert!(kind(&ours).is_symlink(), "root's own link was replaced");
    assert!(is_char_device(&device));
}

/// Two outputs to one file: the second would replace the first. Refused before tracing,
/// whatever the spelling. No BPF needed: the check comes first.
#[test]
fn one_file_for_two_outputs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), "").unwrap();
    std::fs::hard_link(dir.path().join("x"), dir.path().join("hard")).unwrap();
    std::os::unix::fs::symlink("x", dir.path().join("soft")).unwrap();
    for (report, svg) in [
        ("x", "x"),
        ("x", "./x"),
        ("new", "./new"),
        ("x", "hard"),
        ("soft", "x"),
    ] {
        let out = trace_self(&["-o", report, "--svg", svg], dir.path());
        assert!(
            !out.status.success(),
            "-o {report} --svg {svg} was accepted"
        );
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("-o and --svg name the same file"),
            "-o {report} --svg {svg}: {err}"
        );
    }
    let out = trace_self(&["--folded", "-", "--format", "json"], dir.path());
    assert!(
        stderr(&out).contains("the report and --folded would both go to standard output"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("x")).unwrap(), "");
}
