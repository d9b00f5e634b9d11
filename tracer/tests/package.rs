//! The Debian package as a user gets it: `cargo xtask package` builds it and `cargo xtask test`
//! hands it over in MMAPSEM_PACKAGE. In the Debian 12 guest (`cargo xtask vm`: Debian's 6.1,
//! this machine's root under a throwaway overlay, MMAPSEM_GUEST=1) it is installed with dpkg and
//! removed again; on the host it is only unpacked, so that the tests leave the system alone.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::http::{http_get, serving_address};
use common::{bpf_available, Tracer};

/// The .deb under test, or None (skipped, with the reason) when not run by `cargo xtask test`.
fn package(test: &str) -> Option<PathBuf> {
    match std::env::var_os("MMAPSEM_PACKAGE") {
        Some(path) => Some(PathBuf::from(path)),
        None if std::env::var("MMAPSEM_REQUIRE_BPF").as_deref() == Ok("1") => {
            panic!("{test}: MMAPSEM_PACKAGE not set: run through cargo xtask test")
        }
        None => {
            eprintln!("skipped {test}: MMAPSEM_PACKAGE not set (cargo xtask test sets it)");
            None
        }
    }
}

fn in_guest() -> bool {
    std::env::var("MMAPSEM_GUEST").as_deref() == Ok("1")
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package installed (guest) or unpacked into `scratch` (host); returns the root its files
/// are under.
struct Installed {
    root: PathBuf,
    installed: bool,
}

impl Installed {
    fn new(deb: &Path, scratch: &Path) -> Self {
        if in_guest() {
            // Without triggers: man-db's index rebuild takes minutes under emulation, and man
            // finds the page without it.
            run(Command::new("dpkg").args(["-i", "--no-triggers"]).arg(deb));
            Self {
                root: PathBuf::from("/"),
                installed: true,
            }
        } else {
            Self::unpacked(deb, scratch)
        }
    }

    /// The package's files under `scratch`, not installed: what a test of the files alone
    /// needs (dpkg's install and removal take a minute each under emulation).
    fn unpacked(deb: &Path, scratch: &Path) -> Self {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(scratch));
        Self {
            root: scratch.to_path_buf(),
            installed: false,
        }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.installed {
            let _ = Command::new("dpkg").args(["-r", "mmapsem-trace"]).output();
        }
    }
}

#[test]
fn the_package_installs_the_binary_its_man_pages_completions_and_unit() {
    let test = "the_package_installs_the_binary_its_man_pages_completions_and_unit";
    let Some(deb) = package(test) else { return };
    let info = stdout(&run(Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .args(["Package", "Version", "Depends"])));
    assert!(info.contains("Package: mmapsem-trace"), "{info}");
    assert!(
        info.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    let scratch = tempfile::tempdir().unwrap();
    let installed = Installed::new(&deb, scratch.path());

    let binary = installed.path("usr/bin/mmapsem-trace");
    let version = stdout(&run(Command::new(&binary).arg("--version")));
    assert_eq!(
        version.trim(),
        format!("mmapsem-trace {}", env!("CARGO_PKG_VERSION"))
    );

    // The man pages, rendered by man: by name once installed, from the file otherwise.
    for (page, wants) in [
        ("mmapsem-trace", ["--pid", "serve"]),
        ("mmapsem-trace-serve", ["--listen", "--label-pid"]),
    ] {
        let mut man = Command::new("man");
        man.env("MANPAGER", "cat").env("MANWIDTH", "100");
        if installed.installed {
            man.arg(page);
        } else {
            man.arg("-l")
                .arg(installed.path(&format!("usr/share/man/man1/{page}.1.gz")));
        }
        let text = stdout(&run(&mut man));
        for want in wants {
            assert!(text.contains(want), "man {page} lacks {want}:\n{text}");
        }
    }

    // bash loads its completion and completes the subcommand.
    let bash = installed.path("usr/share/bash-completion/completions/mmapsem-trace");
    let script = format!(
        "source '{}' && f=$(complete -p mmapsem-trace | sed -E 's/.*-F ([^ ]+).*/\\1/') && \
         COMP_WORDS=(mmapsem-trace se) COMP_CWORD=1 && $f mmapsem-trace se mmapsem-trace && \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bash.display()
    );
    let completed = stdout(&run(Command::new("bash").args(["-c", &script])));
    assert!(completed.lines().any(|l| l == "serve"), "{completed}");
    for shell in [
        "usr/share/zsh/vendor-completions/_mmapsem-trace",
        "usr/share/fish/vendor_completions.d/mmapsem-trace.fish",
    ] {
        let text = std::fs::read_to_string(installed.path(shell)).unwrap();
        assert!(text.contains("serve"), "{shell}");
    }

    // The unit: systemd's own checker once its ExecStart exists (installed).
    let unit = installed.path("lib/systemd/system/mmapsem-trace.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains("ExecStart=/usr/bin/mmapsem-trace serve"),
        "{text}"
    );
    if installed.installed {
        run(Command::new("systemd-analyze").arg("verify").arg(&unit));
    }
}

/// The capabilities the unit gives `serve` (AmbientCapabilities), in setpriv's syntax.
fn unit_capabilities(unit: &str) -> String {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("the unit names its capabilities");
    line.split_whitespace()
        .map(|cap| format!("+{}", cap.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// `serve` as the unit runs it: not root, with only the unit's capabilities (and none in its
/// bounding set beyond them), answers /metrics.
#[test]
fn the_units_capabilities_are_enough_for_serve() {
    let test = "the_units_capabilities_are_enough_for_serve";
    if !bpf_available(test) {
        return;
    }
    let Some(deb) = package(test) else { return };
    let scratch = tempfile::tempdir().unwrap();
    let installed = Installed::unpacked(&deb, scratch.path());
    let unit = std::fs::read_to_string(installed.path("lib/systemd/system/mmapsem-trace.service"))
        .unwrap();
    let caps = unit_capabilities(&unit);
    assert_eq!(caps, "+bpf,+perfmon,+dac_read_search,+sys_ptrace");
    // Nobody must be able to reach the unpacked binary.
    let mut command = common::as_nobody(&installed.path("usr/bin/mmapsem-trace"), &caps);
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(scratch.path())
        .status();
    let mut daemon = Tracer::spawn_command(command);
    daemon.wait_attached();
    let line = daemon.wait_line("serving http://");
    let address = serving_address(&line);
    let (status, body) = http_get(address, "/metrics", None).unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("mmap_lock_acquisitions_total"), "{body}");
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let result = daemon.finish();
    assert!(result.status.success(), "{}", result.stderr);
}
