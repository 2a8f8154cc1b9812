//! Builds the loader-test fixture libraries (see `fixtures/*.c`) as shared
//! objects with the `cc` crate's compiler detection.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in ["partial_driver", "not_a_driver"] {
        let source = format!("fixtures/{name}.c");
        println!("cargo:rerun-if-changed={source}");
        let library = out.join(format!("lib{name}.so"));
        let status = cc::Build::new()
            .cargo_metadata(false)
            .get_compiler()
            .to_command()
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&library)
            .arg(&source)
            .status()
            .expect("run the C compiler");
        assert!(status.success(), "building {source} failed");
        println!(
            "cargo:rustc-env=FIXTURE_{}={}",
            name.to_uppercase(),
            library.display()
        );
    }
}
