//! The examples' command lines (issue 21): each answers `--help` with its
//! usage (exit 0, before doing anything else) and refuses a misspelt flag
//! with the usage on stderr (exit 2), instead of ignoring it.
//!
//! The examples are looked for next to this test binary (`target/<profile>/
//! examples/`): `cargo test --workspace` (what `cargo xtask test` runs) builds
//! every package's examples before the tests run; one not built is named in
//! the output as NOT CHECKED (this package's own must be there). A run
//! filtered with `--test examples_cli` builds no example: it checks the ones
//! built last.

use std::path::PathBuf;
use std::process::Command;

/// (example, the package that builds it, a misspelt flag).
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("wire_seeds", "cuda-interop-tests", "--corpsu"),
    ("wire_reach", "cuda-interop-tests", "--recieve"),
    ("round_trip", "cuda-interop", "--bnech"),
    ("driver_info", "cuda-interop-sys", "--verbose"),
    ("frame_server", "cuda-interop-frames", "--slot"),
    ("frame_client", "cuda-interop-frames", "--frame"),
];

fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/examples_cli-HASH -> target/<profile>/examples
    exe.parent().unwrap().parent().unwrap().join("examples")
}

#[test]
fn every_example_answers_help_and_refuses_a_misspelt_flag() {
    let dir = examples_dir();
    let mut not_built = Vec::new();
    for (name, package, typo) in EXAMPLES {
        let path = dir.join(name);
        if !path.is_file() {
            assert_ne!(
                *package, "cuda-interop-tests",
                "{name} is built with these tests"
            );
            not_built.push(format!("{name} ({package})"));
            continue;
        }
        let help = Command::new(&path).arg("--help").output().unwrap();
        let out = String::from_utf8_lossy(&help.stdout);
        assert_eq!(help.status.code(), Some(0), "{name} --help: {out}");
        assert!(
            out.starts_with(&format!("usage: {name}")),
            "{name} --help: {out}"
        );
        let wrong = Command::new(&path).arg(typo).output().unwrap();
        let err = String::from_utf8_lossy(&wrong.stderr);
        assert_eq!(wrong.status.code(), Some(2), "{name} {typo}: {err}");
        assert!(
            err.contains(&format!("unknown argument {typo:?}")) && err.contains("usage: "),
            "{name} {typo}: {err}"
        );
        assert!(
            wrong.stdout.is_empty(),
            "{name} {typo} ran: {}",
            String::from_utf8_lossy(&wrong.stdout)
        );
        println!("{name}: --help and {typo} answered");
    }
    if !not_built.is_empty() {
        println!(
            "NOT CHECKED (not built next to this test; cargo test --workspace builds them): {}",
            not_built.join(", ")
        );
    }
}
