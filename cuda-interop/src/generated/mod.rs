//! Generated code, checked in: do not edit anything under this directory by
//! hand. `copy_ptx.rs` is the PTX of `kernels/copy.cu`, written by
//! `cargo xtask codegen ptx` (its header names the source hash and the compiler);
//! `cargo xtask codegen` checks it is current.

pub(crate) mod copy_ptx;
