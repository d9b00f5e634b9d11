// Empty library target: lets the tracer crate depend on this crate so cargo rebuilds it when
// the programs change (the programs themselves are the binary target, src/main.rs).
#![no_std]
