//! Generated code, checked in: do not edit anything under this directory by
//! hand. `copy_ptx.rs` and `convert_ptx.rs` are the PTX of `kernels/copy.cu`
//! and `kernels/convert.cu`, written by `cargo xtask codegen ptx` (each
//! header names the source hash and the compiler); `cargo xtask codegen`
//! checks they are current.

pub(crate) mod convert_ptx;
pub(crate) mod copy_ptx;
