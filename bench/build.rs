//! Builds the C frame loop (`src/frame_loop.c`): the baseline the safe API
//! is measured against. It includes no Vulkan or CUDA header; the Rust side
//! hands it function pointers and prepared parameter blocks.
fn main() {
    println!("cargo:rerun-if-changed=src/frame_loop.c");
    // The commit the figures come from, printed in the report.
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=BENCH_COMMIT={commit}{}",
        if dirty { " (dirty tree)" } else { "" }
    );
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/index");
    cc::Build::new()
        .file("src/frame_loop.c")
        .opt_level(3)
        .warnings(true)
        .compile("frame_loop");
}
