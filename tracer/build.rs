//! Builds the eBPF programs (tracer-ebpf, with nightly and bpf-linker) and puts the object in
//! OUT_DIR, where src/probes embeds it.
//!
//! Two things aya-build does are changed around it:
//! - It builds in a target directory under OUT_DIR, which differs per profile, so the debug
//!   build (tests) and the release build (demo) each rebuilt the same object (aya-build always
//!   builds it --release). It is given one OUT_DIR beside the profiles instead, so the object
//!   is built once, and copied from there into this profile's OUT_DIR.
//! - It relays every line its inner cargo prints on stderr as a `cargo:warning`, so each build
//!   showed dozens of fake warnings (`Compiling core ...`). The inner cargo runs quiet
//!   (CARGO_TERM_QUIET): only compiler warnings and errors are relayed.
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

/// The eBPF crate's binary target: aya-build copies it to OUT_DIR under this name, and
/// src/probes embeds `OUT_DIR/tracer`.
const OBJECT: &str = "tracer";

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tracer crate has no parent directory"))?
        .join("tracer-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    let shared = shared_dir(&out_dir);
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    // Two profiles building at once take turns: the inner cargo locks its target directory,
    // but not the copy aya-build makes after it.
    let lock = File::create(shared.join(".lock")).context("creating the eBPF build lock")?;
    lock.lock().context("locking the eBPF build")?;

    // aya-build reads both from this process's environment, and its inner cargo inherits it.
    std::env::set_var("OUT_DIR", &shared);
    std::env::set_var("CARGO_TERM_QUIET", "true");
    let built = aya_build::build_ebpf(
        [Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    );
    std::env::set_var("OUT_DIR", &out_dir);
    built?;
    let from = shared.join(OBJECT);
    let to = out_dir.join(OBJECT);
    std::fs::copy(&from, &to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// `<target>/aya-build-shared` for an OUT_DIR of `<target>/<profile>/build/<pkg>-<hash>/out`;
/// OUT_DIR itself (one build per profile, as aya-build does) for any other layout.
fn shared_dir(out_dir: &Path) -> PathBuf {
    let build = out_dir.ancestors().nth(2);
    match (build, out_dir.ancestors().nth(4)) {
        (Some(build), Some(target)) if build.file_name() == Some("build".as_ref()) => {
            target.join("aya-build-shared")
        }
        _ => out_dir.to_path_buf(),
    }
}
