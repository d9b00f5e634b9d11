//! `cargo xtask package`: a Debian package of the tracer, built with dpkg-deb from a staged
//! tree: the release binary, its man pages and shell completions (generated from the clap
//! definition by the binary itself: `mmapsem-trace generate ...`), and a systemd unit that runs
//! `serve` with the capabilities tracing needs instead of root.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::cmd::Cmd;
use crate::paths;
use crate::workspace::{self, Profile};

/// The unit, kept in the repository so that it is reviewed like code.
const UNIT: &str = "packaging/mmapsem-trace.service";

/// Builds the package (after a release build when `build`); returns its path.
pub fn run(build: bool) -> Result<PathBuf> {
    if build {
        workspace::build(Profile::Release)?;
    }
    let version = env!("CARGO_PKG_VERSION");
    let arch = Cmd::new("dpkg")
        .args(&["--print-architecture"])
        .probe_ok()?
        .trim()
        .to_string();
    let out = paths::target_dir().join("package");
    let name = format!("mmapsem-trace_{version}_{arch}");
    let root = out.join(&name);
    if root.exists() {
        std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    stage(&root)?;
    let control = control(version, &arch, &root)?;
    write(&root.join("DEBIAN/control"), control.as_bytes(), 0o644)?;
    let deb = out.join(format!("{name}.deb"));
    Cmd::new("dpkg-deb")
        .args(&["--root-owner-group", "--build"])
        .arg(root.display().to_string())
        .arg(deb.display().to_string())
        .probe_ok()?;
    eprintln!("package: {}", deb.display());
    Ok(deb)
}

/// Lays out the installed files under `root`.
fn stage(root: &Path) -> Result<()> {
    let tracer = paths::binary("release", "mmapsem-trace");
    let binary = std::fs::read(&tracer).with_context(|| format!("reading {}", tracer.display()))?;
    write(&root.join("usr/bin/mmapsem-trace"), &binary, 0o755)?;
    let generated = |what: &str| -> Result<String> {
        Cmd::new(&tracer.display().to_string())
            .args(&["generate", what])
            .probe_ok()
    };
    for (what, page) in [
        ("man", "mmapsem-trace.1"),
        ("man-serve", "mmapsem-trace-serve.1"),
    ] {
        let path = root.join("usr/share/man/man1").join(page);
        write(&path, generated(what)?.as_bytes(), 0o644)?;
        // Debian's policy: man pages compressed, with no name or time in the gzip header.
        Cmd::new("gzip")
            .args(&["-9n", &path.display().to_string()])
            .probe_ok()?;
    }
    for (shell, path) in [
        (
            "bash",
            "usr/share/bash-completion/completions/mmapsem-trace",
        ),
        ("zsh", "usr/share/zsh/vendor-completions/_mmapsem-trace"),
        (
            "fish",
            "usr/share/fish/vendor_completions.d/mmapsem-trace.fish",
        ),
    ] {
        write(&root.join(path), generated(shell)?.as_bytes(), 0o644)?;
    }
    let unit = std::fs::read(paths::workspace_root().join(UNIT))
        .with_context(|| format!("reading {UNIT}"))?;
    write(
        &root.join("lib/systemd/system/mmapsem-trace.service"),
        &unit,
        0o644,
    )?;
    write(
        &root.join("usr/share/doc/mmapsem-trace/copyright"),
        COPYRIGHT.as_bytes(),
        0o644,
    )
}

const COPYRIGHT: &str = "\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: mmapsem-trace

Files: *
License: MIT or Apache-2.0
 The eBPF object inside the binary is Dual MIT/GPL. The SVG flamegraph code (inferno) is
 CDDL-1.0, used unmodified as a library.
";

fn control(version: &str, arch: &str, root: &Path) -> Result<String> {
    let kib = Cmd::new("du")
        .args(&["-sk", &root.display().to_string()])
        .probe_ok()?
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_string();
    Ok(format!(
        "Package: mmapsem-trace\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: mmapsem-trace developers <mmapsem-trace@users.noreply.github.com>\n\
         Installed-Size: {kib}\n\
         Depends: libc6 (>= 2.34), libgcc-s1\n\
         Section: utils\n\
         Priority: optional\n\
         Description: who waits on a process's mmap_lock, for how long, behind whom\n \
         eBPF tracer of the mmap_lock tracepoints: wait and hold time per call stack,\n \
         latencytop-style reports, a live view, flamegraphs and pprof profiles, and a\n \
         daemon (mmapsem-trace serve, as a systemd unit) with OpenMetrics metrics.\n"
    ))
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}
