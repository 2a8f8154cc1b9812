//! Compile-fail tests of the frames crate: a [`Frame`] is a value only a
//! session makes, released once (by value), never copied; a multi-image
//! present copies only the crate's own sources (`PartSource` is sealed:
//! `SourceImage` and `DepthSource`); each rule as a program that must not
//! compile, next to a twin that compiles.
//! Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p cuda-interop-frames --test ui` and
//! review the `.stderr` diff like code.
//!
//! [`Frame`]: cuda_interop_frames::session::Frame

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
