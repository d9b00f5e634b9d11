use which::which;

/// Rebuild when bpf-linker changes: cargo does not track linkers on its own.
///
/// bpf-linker passes LLVM `--bpf-expand-memcpy-in-order` unless told not to, which also turns
/// off LLVM's inline expansion of memset: every zeroing of a few adjacent fields (a 16-byte
/// key, a pad) became a call to the exported byte-at-a-time `memset`, about 70 instructions
/// for 16 bytes, in the lock programs' hot paths and in the verifier's count of every path.
/// Without the flag LLVM stores the bytes inline, a few 8-byte stores.
fn main() {
    println!("cargo:rustc-link-arg=--disable-expand-memcpy-in-order");
    let bpf_linker = which("bpf-linker").expect("bpf-linker not on PATH: run `cargo xtask setup`");
    println!(
        "cargo:rerun-if-changed={}",
        bpf_linker.to_str().expect("bpf-linker path is UTF-8")
    );
}
