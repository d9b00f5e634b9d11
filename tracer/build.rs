//! Builds the eBPF programs (tracer-ebpf, with nightly and bpf-linker) and puts the object in
//! OUT_DIR, where src/probes embeds it.
use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tracer crate has no parent directory"))?
        .join("tracer-ebpf");
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
