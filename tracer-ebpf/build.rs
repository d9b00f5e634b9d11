use which::which;

/// Rebuild when bpf-linker changes: cargo does not track linkers on its own.
fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not on PATH: run `cargo xtask setup`");
    println!(
        "cargo:rerun-if-changed={}",
        bpf_linker.to_str().expect("bpf-linker path is UTF-8")
    );
}
