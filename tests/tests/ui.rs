//! Compile-fail tests: each rule the types enforce, as a program that must
//! not compile (with the message we wrote), next to a twin that compiles.
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test --test ui`
//! and review the `.stderr` diff like code.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
