//! Builds the fake `libcuda.so.1` (`fake_cuda/fake_cuda.c`) in its three
//! variants, each in a directory of its own under `OUT_DIR`, with the `cc`
//! crate's compiler detection; `src/fake.rs` finds them through
//! `FAKE_CUDA_DIR_*`.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = "fake_cuda/fake_cuda.c";
    println!("cargo:rerun-if-changed={source}");
    for (name, defines) in [
        ("FULL", &[][..]),
        ("WITHOUT_UUID_V2", &["-DFAKE_OMIT_UUID_V2"][..]),
        ("WITHOUT_MIPMAPPED", &["-DFAKE_OMIT_MIPMAPPED"][..]),
    ] {
        let dir = out.join(format!("fake-libcuda-{}", name.to_lowercase()));
        std::fs::create_dir_all(&dir).expect("create the fake's directory");
        let status = cc::Build::new()
            .cargo_metadata(false)
            .get_compiler()
            .to_command()
            .args(["-shared", "-fPIC", "-O1", "-Wall"])
            .args(defines)
            .arg("-o")
            .arg(dir.join("libcuda.so.1"))
            .arg(source)
            .arg("-lpthread")
            .status()
            .expect("run the C compiler");
        assert!(status.success(), "building {source} ({name}) failed");
        println!("cargo:rustc-env=FAKE_CUDA_DIR_{name}={}", dir.display());
    }
}
