//! `cargo xtask setup`: makes a Debian 12 machine ready to build and run mmapsem-trace. Each
//! step checks first and acts only when needed, so a second run takes well under a second.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cmd::Cmd;
use crate::parse::{self, LinkedLlvm};
use crate::paths;

/// bpf-linker releases with `llvm-21`/`llvm-22`/`llvm-23` features; a later release may drop
/// LLVM 22, which nightly 1.97 uses, so stay on this series until nightly moves.
const BPF_LINKER_VERSION: &str = "~0.13";
const TRACEFS: &str = "/sys/kernel/tracing";

/// What to do when tracefs needs mounting and we are not root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracefs {
    /// Not needed (plain builds).
    Skip,
    /// Warn: the caller can do useful work without it (unit tests as a normal user).
    WarnIfNotRoot,
    /// Fail: the caller is about to load eBPF programs, or was asked to set everything up.
    Require,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub dry_run: bool,
    pub tracefs: Tracefs,
}

pub fn run(options: Options) -> Result<()> {
    let mut setup = Setup {
        options,
        root: is_root(),
        apt_updated: false,
    };
    check_nightly_toolchain()?;
    setup.ensure_rust_src()?;
    let llvm_major = nightly_llvm_major()?;
    setup.ensure_bpf_linker(llvm_major)?;
    setup.ensure_tracefs()
}

/// What every command that loads eBPF programs (demo, bench, soak) does first: check for
/// root, set up, and build the release binaries unless told not to.
pub fn for_tracing(command: &str, build: bool) -> Result<()> {
    if !is_root() {
        bail!(
            "the {command} loads eBPF programs and needs root: run `cargo xtask {command}` as root"
        );
    }
    run(Options {
        dry_run: false,
        tracefs: Tracefs::Require,
    })?;
    if build {
        crate::workspace::build(crate::workspace::Profile::Release)?;
    }
    Ok(())
}

/// Installs what `cargo xtask test` needs beyond building when it runs as root: Debian's perf,
/// which the coexistence tests run beside the tracer, tmux, the terminal in which the live
/// view's tests run it, and the consumers of the exports (go tool pprof, Prometheus's parser
/// and server).
pub fn for_tests() -> Result<()> {
    if !is_root() {
        return Ok(());
    }
    let mut setup = packages_only();
    setup.ensure_apt_package("linux-perf")?;
    // go tool pprof reads the --pprof profiles in the exports test.
    setup.ensure_apt_package("golang-go")?;
    // The Prometheus project's parsers read serve's /metrics in the serve test.
    setup.ensure_apt_package("python3-prometheus-client")?;
    // Debian's Prometheus server scrapes serve in the serve test (its package's service is not
    // started: the test runs the binary with its own config on a loopback port).
    setup.ensure_apt_package("prometheus")?;
    setup.ensure_apt_package("tmux")
}

/// Installs what `cargo xtask vm` needs: QEMU, busybox for the guest's initramfs, and the
/// decompressors of Debian's module files.
pub fn for_vm() -> Result<()> {
    let mut setup = packages_only();
    // e2fsprogs: mkfs.ext4 for the guests' scratch disk.
    for package in [
        "qemu-system-x86",
        "busybox-static",
        "xz-utils",
        "zstd",
        "e2fsprogs",
    ] {
        setup.ensure_apt_package(package)?;
    }
    Ok(())
}

/// A setup that only installs Debian packages.
fn packages_only() -> Setup {
    Setup {
        options: Options {
            dry_run: false,
            tracefs: Tracefs::Skip,
        },
        root: is_root(),
        apt_updated: false,
    }
}

/// Installs what `cargo xtask bench` needs beyond tracing when missing: Debian's bpftrace,
/// which it compares against, bpftool, which names the programs whose bpf_stats it reads, and
/// clamd with clamdscan, the real program it times (run with the bench's own config and
/// database; the package's own service, where systemd starts it, is not used). Only the bench
/// needs them, so neither `setup` nor `test` installs them.
pub fn ensure_bench_packages() -> Result<()> {
    let mut setup = packages_only();
    setup.ensure_apt_package("bpftrace")?;
    setup.ensure_apt_package("clamav-daemon")?;
    setup.ensure_apt_package("clamdscan")?;
    setup.ensure_apt_package("bpftool")
}

/// Whether we run as root, from the effective uid (no libc needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| parse::effective_uid(&status))
        == Some(0)
}

fn report(step: &str, outcome: &str) {
    eprintln!("setup: {step} ... {outcome}");
}

fn rustc_nightly(args: &[&str]) -> Cmd {
    Cmd::new("rustc")
        .arg("+nightly")
        .args(args)
        // A missing toolchain must be an error here, never a download (no network for it).
        .env("RUSTUP_AUTO_INSTALL", "0")
}

fn check_nightly_toolchain() -> Result<()> {
    let list = Cmd::new("rustup").args(&["toolchain", "list"]).probe_ok()?;
    if !parse::has_nightly_toolchain(&list) {
        bail!(
            "no `nightly` toolchain in `rustup toolchain list`; the eBPF crate needs one \
             (nightly 1.97 with LLVM 22 is known to work). It cannot be downloaded from this \
             network: install it with `rustup toolchain install nightly --profile minimal \
             --component rust-src` where rustup can reach static.rust-lang.org"
        );
    }
    report("nightly toolchain", "ok");
    Ok(())
}

fn nightly_llvm_major() -> Result<u32> {
    let vv = rustc_nightly(&["-vV"]).probe_ok()?;
    let (major, version) = parse::rustc_llvm_version(&vv)
        .with_context(|| format!("no `LLVM version:` line in `rustc +nightly -vV`:\n{vv}"))?;
    report("nightly's LLVM", &format!("{version} (major {major})"));
    Ok(major)
}

/// What the bpf-linker that a build would run looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Linker {
    Missing,
    Matches { path: PathBuf, evidence: String },
    Wrong { path: PathBuf, problem: String },
}

struct Setup {
    options: Options,
    root: bool,
    apt_updated: bool,
}

impl Setup {
    /// Runs a command that changes the machine, or only prints it under `--dry-run`.
    fn act(&self, cmd: &Cmd) -> Result<()> {
        if self.options.dry_run {
            eprintln!("(dry run) + {cmd}");
            Ok(())
        } else {
            cmd.run()
        }
    }

    fn need_root(&self, what: &str, cmd: &Cmd) -> Result<()> {
        if self.root {
            return Ok(());
        }
        self.fail(format!(
            "{what} needs root: run `cargo xtask setup` as root, or run as root: {cmd}"
        ))
    }

    /// Fails, except under `--dry-run`, which reports the problem and goes on to show the
    /// remaining steps.
    fn fail(&self, problem: String) -> Result<()> {
        if self.options.dry_run {
            eprintln!("(dry run) would fail: {problem}");
            Ok(())
        } else {
            bail!("{problem}")
        }
    }

    fn ensure_rust_src(&self) -> Result<()> {
        let sysroot = rustc_nightly(&["--print", "sysroot"]).probe_ok()?;
        let library = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library");
        if library.is_dir() {
            report("rust-src for nightly", "ok");
            return Ok(());
        }
        report("rust-src for nightly", "missing, installing");
        self.act(&Cmd::new("rustup").args(&[
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
        if !self.options.dry_run && !library.is_dir() {
            bail!(
                "rust-src was added but {} is still missing; check `rustup component list \
                 --toolchain nightly`",
                library.display()
            );
        }
        Ok(())
    }

    fn ensure_bpf_linker(&mut self, llvm_major: u32) -> Result<()> {
        let step = format!("bpf-linker for LLVM {llvm_major}");
        let found = inspect_bpf_linker(llvm_major)?;
        let replace = match &found {
            Linker::Matches { path, evidence } => {
                report(&step, &format!("ok ({}, {evidence})", path.display()));
                return Ok(());
            }
            Linker::Missing => {
                report(&step, "missing, installing");
                false
            }
            Linker::Wrong { path, problem } => {
                report(
                    &step,
                    &format!("{} {problem}, reinstalling", path.display()),
                );
                true
            }
        };
        self.ensure_llvm_dev(llvm_major)?;
        // Replacing: `cargo install` refuses to overwrite a binary it would otherwise keep.
        let force = replace || paths::cargo_bin().join("bpf-linker").exists();
        self.act(&bpf_linker_install(llvm_major, force))?;
        if self.options.dry_run {
            return Ok(());
        }
        match inspect_bpf_linker(llvm_major)? {
            Linker::Matches { path, evidence } => {
                report(
                    &step,
                    &format!("installed ({}, {evidence})", path.display()),
                );
                Ok(())
            }
            Linker::Missing => bail!(
                "bpf-linker was installed but is not in {}; check CARGO_HOME and run `{}`",
                paths::cargo_bin().display(),
                bpf_linker_install(llvm_major, true)
            ),
            Linker::Wrong { path, problem } => bail!(
                "bpf-linker was installed but {} {problem}. Remove it, make sure \
                 /usr/lib/llvm-{llvm_major}/lib/libLLVM.so.{llvm_major}* exists (package \
                 llvm-{llvm_major}-dev), then run `{}`",
                path.display(),
                bpf_linker_install(llvm_major, true)
            ),
        }
    }

    /// Installs a Debian package unless dpkg says it is installed.
    fn ensure_apt_package(&mut self, package: &str) -> Result<()> {
        let status = Cmd::new("dpkg").args(&["-s", package]).probe()?;
        if parse::dpkg_says_installed(&status.stdout) {
            report(package, "ok");
            return Ok(());
        }
        report(package, "missing, installing");
        let install = apt_install(package);
        self.need_root(&format!("installing {package}"), &install)?;
        self.apt_update()?;
        self.act(&install)
    }

    /// llvm-sys needs `llvm-config` and libLLVM of the same major as nightly's LLVM.
    fn ensure_llvm_dev(&mut self, llvm_major: u32) -> Result<()> {
        let package = format!("llvm-{llvm_major}-dev");
        let status = Cmd::new("dpkg").args(&["-s", &package]).probe()?;
        if parse::dpkg_says_installed(&status.stdout) {
            report(&package, "ok");
            return Ok(());
        }
        report(&package, "missing, installing");
        let install = apt_install(&package);
        self.need_root(&format!("installing {package}"), &install)?;
        self.apt_update()?;
        if !self.options.dry_run && !apt_knows(&package)? {
            bail!(
                "Debian has no package {package}, which bpf-linker needs to match nightly's \
                 LLVM {llvm_major}. Install LLVM {llvm_major}'s development files (llvm-config \
                 and libLLVM.so.{llvm_major}), e.g. add apt.llvm.org's \
                 `deb http://apt.llvm.org/bookworm/ llvm-toolchain-bookworm-{llvm_major} main` \
                 and run `{install}`, then run `cargo xtask setup` again"
            );
        }
        self.act(&install)
    }

    fn apt_update(&mut self) -> Result<()> {
        if !self.apt_updated {
            self.act(
                &Cmd::new("apt-get")
                    .arg("update")
                    .env("DEBIAN_FRONTEND", "noninteractive"),
            )?;
            self.apt_updated = true;
        }
        Ok(())
    }

    fn ensure_tracefs(&self) -> Result<()> {
        if self.options.tracefs == Tracefs::Skip {
            return Ok(());
        }
        let step = "tracefs mmap_lock events";
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if parse::tracefs_mounted_at(&mounts, TRACEFS) {
            if !self.root {
                // /sys/kernel/tracing is 0700: a normal user cannot look for the events.
                report(step, "tracefs mounted (events not readable without root)");
            } else {
                report_tracepoints(step);
            }
            return Ok(());
        }
        let mount = Cmd::new("mount").args(&["-t", "tracefs", "nodev", TRACEFS]);
        if !self.root {
            let problem = format!("tracefs is not mounted; run as root (sudo): {mount}");
            if self.options.tracefs == Tracefs::WarnIfNotRoot {
                report(step, &format!("warning: {problem}"));
                return Ok(());
            }
            return self.fail(problem);
        }
        report(step, "tracefs not mounted, mounting");
        self.act(&mount)?;
        if !self.options.dry_run {
            report_tracepoints(step);
        }
        Ok(())
    }
}

/// Reports whether the kernel has the mmap_lock tracepoints; their absence is a warning only,
/// since building and unit tests still work.
fn report_tracepoints(step: &str) {
    let events = Path::new(TRACEFS).join("events");
    if events.join("mmap_lock").is_dir() {
        report(step, "ok");
    } else if events.is_dir() {
        report(
            step,
            "warning: this kernel has no mmap_lock tracepoints (Linux >= 5.10 with \
             CONFIG_TRACING needed); mmapsem-trace cannot attach here",
        );
    } else {
        report(
            step,
            &format!(
                "warning: tracefs is mounted but {} is missing",
                events.display()
            ),
        );
    }
}

/// The bpf-linker a build would use: aya-build runs `bpf-linker` from PATH, and children get
/// `$CARGO_HOME/bin` first on PATH (see `paths::child_path_dirs`).
fn inspect_bpf_linker(llvm_major: u32) -> Result<Linker> {
    let Some(path) = paths::find_executable("bpf-linker", &paths::child_path_dirs()) else {
        return Ok(Linker::Missing);
    };
    let ldd = Cmd::new("ldd").arg(path.display().to_string()).probe()?;
    let linked = parse::ldd_linked_llvm(&ldd.stdout);
    let recorded = recorded_llvm_major(&path);
    Ok(judge_bpf_linker(path, llvm_major, &linked, recorded))
}

/// The LLVM major cargo recorded when it installed this binary, if it did.
fn recorded_llvm_major(path: &Path) -> Option<u32> {
    if path != paths::cargo_bin().join("bpf-linker") {
        return None;
    }
    let crates2 = std::fs::read_to_string(paths::cargo_home().join(".crates2.json")).ok()?;
    parse::crates2_bpf_linker_llvm_major(&crates2)
}

/// Decides whether an installed bpf-linker fits. The libLLVM it links (ldd) is the evidence;
/// for a statically linked one, the `llvm-N` feature cargo recorded at install time. With
/// neither, it is replaced: a one-off cost, since ours links libLLVM dynamically.
fn judge_bpf_linker(
    path: PathBuf,
    llvm_major: u32,
    linked: &LinkedLlvm,
    recorded: Option<u32>,
) -> Linker {
    let wrong = |problem: String| Linker::Wrong {
        path: path.clone(),
        problem,
    };
    match (linked, recorded) {
        (
            LinkedLlvm::Dynamic {
                soname,
                resolved: false,
                ..
            },
            _,
        ) => wrong(format!("cannot run: {soname} is not found")),
        (
            LinkedLlvm::Dynamic {
                soname,
                major: Some(major),
                ..
            },
            _,
        ) if *major == llvm_major => Linker::Matches {
            path: path.clone(),
            evidence: format!("links {soname}"),
        },
        (LinkedLlvm::Dynamic { soname, .. }, _) => wrong(format!("links {soname}")),
        (LinkedLlvm::NotDynamic, Some(major)) if major == llvm_major => Linker::Matches {
            path: path.clone(),
            evidence: format!("installed with feature llvm-{major}"),
        },
        (LinkedLlvm::NotDynamic, Some(major)) => {
            wrong(format!("was installed with feature llvm-{major}"))
        }
        (LinkedLlvm::NotDynamic, None) => {
            wrong("has an unknown LLVM (no libLLVM in ldd, no llvm-N install feature)".to_owned())
        }
    }
}

/// `cargo install bpf-linker` built against Debian's LLVM of nightly's major. The default
/// feature wants another LLVM, and llvm-sys finds `llvm-config` on PATH, hence the LLVM bin
/// directory first on PATH.
fn bpf_linker_install(llvm_major: u32, force: bool) -> Cmd {
    let cmd = Cmd::new("cargo")
        .args(&["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
        .args(&["--no-default-features", "--features"])
        .arg(format!("llvm-{llvm_major}"))
        .prepend_path(&PathBuf::from(format!("/usr/lib/llvm-{llvm_major}/bin")));
    if force {
        cmd.arg("--force")
    } else {
        cmd
    }
}

fn apt_install(package: &str) -> Cmd {
    Cmd::new("apt-get")
        .args(&["install", "-y", "--no-install-recommends", package])
        // CI runs without a terminal: never stop for a debconf question.
        .env("DEBIAN_FRONTEND", "noninteractive")
}

/// Whether apt's package lists have the package at all (`apt-cache show` exits 100 if not).
fn apt_knows(package: &str) -> Result<bool> {
    let probe = Cmd::new("apt-cache")
        .args(&["show", "--no-all-versions", package])
        .probe()?;
    Ok(probe.success && !probe.stdout.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(soname: &str, major: Option<u32>, resolved: bool) -> LinkedLlvm {
        LinkedLlvm::Dynamic {
            soname: soname.to_owned(),
            major,
            resolved,
        }
    }

    #[test]
    fn install_command_matches_nightly_llvm() {
        let cmd = bpf_linker_install(22, false);
        assert_eq!(cmd.program(), "cargo");
        assert_eq!(
            cmd.arguments(),
            [
                "install",
                "bpf-linker",
                "--version",
                "~0.13",
                "--no-default-features",
                "--features",
                "llvm-22"
            ]
        );
        assert_eq!(cmd.path_prefix(), [PathBuf::from("/usr/lib/llvm-22/bin")]);
        assert_eq!(
            cmd.to_string(),
            "PATH=/usr/lib/llvm-22/bin:$PATH cargo install bpf-linker --version '~0.13' \
             --no-default-features --features llvm-22"
        );
    }

    #[test]
    fn replacing_install_forces() {
        let cmd = bpf_linker_install(23, true);
        assert_eq!(cmd.arguments().last().map(String::as_str), Some("--force"));
        assert!(cmd.arguments().contains(&"llvm-23".to_owned()));
    }

    #[test]
    fn apt_install_is_noninteractive_without_recommends() {
        let cmd = apt_install("llvm-22-dev");
        assert_eq!(cmd.env_value("DEBIAN_FRONTEND"), Some("noninteractive"));
        assert_eq!(
            cmd.to_string(),
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends llvm-22-dev"
        );
    }

    #[test]
    fn dynamic_linker_with_matching_major_fits() {
        let path = PathBuf::from("/root/.cargo/bin/bpf-linker");
        let linked = dynamic("libLLVM.so.22.1", Some(22), true);
        assert_eq!(
            judge_bpf_linker(path.clone(), 22, &linked, Some(21)),
            Linker::Matches {
                path,
                evidence: "links libLLVM.so.22.1".to_owned()
            }
        );
    }

    #[test]
    fn dynamic_linker_with_other_major_or_missing_library_is_wrong() {
        let path = PathBuf::from("/usr/local/bin/bpf-linker");
        let other = dynamic("libLLVM-14.so.1", Some(14), true);
        assert!(matches!(
            judge_bpf_linker(path.clone(), 22, &other, None),
            Linker::Wrong { problem, .. } if problem == "links libLLVM-14.so.1"
        ));
        let missing = dynamic("libLLVM.so.22.1", Some(22), false);
        assert!(matches!(
            judge_bpf_linker(path, 22, &missing, None),
            Linker::Wrong { problem, .. } if problem.contains("not found")
        ));
    }

    #[test]
    fn static_linker_is_judged_by_recorded_feature() {
        let path = PathBuf::from("/root/.cargo/bin/bpf-linker");
        let fits = judge_bpf_linker(path.clone(), 22, &LinkedLlvm::NotDynamic, Some(22));
        assert!(matches!(fits, Linker::Matches { .. }));
        let other = judge_bpf_linker(path.clone(), 22, &LinkedLlvm::NotDynamic, Some(23));
        assert!(matches!(other, Linker::Wrong { .. }));
        let unknown = judge_bpf_linker(path, 22, &LinkedLlvm::NotDynamic, None);
        assert!(matches!(unknown, Linker::Wrong { .. }));
    }
}
