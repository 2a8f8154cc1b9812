//! The bench's Vulkan-only run (`bench --quick --vulkan-only`, what a
//! machine without CUDA runs): both producer variants record and submit
//! their frames under the validation layer (CI: lavapipe, where the copy
//! producer's transfer role is the main family) with 0 errors, and their
//! staged frames hold what each variant writes.
//!
//! Needs a Vulkan device with external memory and the Khronos validation
//! layer (CI has both); without them it fails and says so.

use std::process::Command;

#[test]
fn both_producer_variants_run_under_the_layer_without_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--vulkan-only"])
        .output()
        .expect("the bench binary starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench --quick --vulkan-only failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains("no Vulkan device"),
        "no Vulkan device with external memory here (CI runs this on lavapipe):\n{stdout}"
    );
    assert!(
        stdout.contains("producer variants, Vulkan only: validation layer on, 0 validation errors"),
        "the validation layer must be on and report nothing (install the Khronos validation layer):\n{stdout}"
    );
    for variant in [
        "render producer (clear on the main queue",
        "copy producer (buffer-to-image copy on the",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("producer variants, Vulkan only: {variant}")))
            .unwrap_or_else(|| panic!("no line for the {variant}:\n{stdout}"));
        assert!(line.ends_with("as written: ok"), "{line}");
    }
}
