//! Code the host-wait benchmark binaries share (each `src/bin/*.rs` declares
//! `mod common;`; a folder without `main.rs` is no binary of its own).

pub mod wait_timing;
