//! Developer tasks for the cuda-interop workspace.
//!
//! ```text
//! cargo xtask demo [ARGS]                              system packages, then the main job (round_trip)
//! cargo xtask test [ARGS]                              system packages, cargo test --workspace, pytest
//! cargo xtask codegen [--check] [--cuda-include DIR]   regenerate (or check) the driver bindings (and check the copy kernels' PTX against its source)
//! cargo xtask wheel [--out DIR]                        the Python wheel and the GPU demo folder
//! ```
//!
//! Only `codegen` needs libclang; nothing else in the workspace does. `demo`
//! and `test` are the commands for a fresh Debian/Ubuntu machine (see
//! `fresh.rs` for what they check and install, and when they stop instead).

mod codegen;
mod fresh;
mod functions;
mod modgraph;
mod summary;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("codegen") => codegen::run(&args[1..]),
        Some("test") => fresh::test(&args[1..]),
        Some("demo") => fresh::demo(&args[1..]),
        Some("wheel") => wheel::wheel(&args[1..]),
        Some("modgraph") => modgraph::run(&args[1..]),
        Some("-h" | "--help") | None => {
            println!("{}", USAGE);
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  demo [ARGS]
      The main job: checks the system packages it needs (libvulkan1,
      mesa-vulkan-drivers, vulkan-validationlayers), installs the missing
      ones with apt-get when root or `sudo -n` can, otherwise stops and
      prints the command to run; then
      cargo run --release -p cuda-interop --example round_trip -- ARGS
      (e.g. `cargo xtask demo 120 --bench`).
  test [ARGS]
      The tests: the same check for their packages (those above and gcc),
      then cargo test --workspace ARGS (e.g. `cargo xtask test --locked`,
      `cargo xtask test -p cuda-interop-tests --test wire -- --nocapture`);
      then the Python module's tests: cuda-interop-py built with the same
      profile, copied to target/python/cuda_interop.abi3.so, and
      `python3 -m pytest -q python/tests` (pytest installed with pip if
      missing; any pytest failure, or no tests collected, fails the task).
      CUDA_INTEROP_XTASK_ASSUME_MISSING=PKG[,PKG] (demo and test): a dry
      run that treats those packages as missing and installs nothing.
  codegen [--check] [--cuda-include DIR]
      Regenerate cuda-interop-sys/src/generated/ from the pinned cuda.h.
      --check writes nothing and fails, showing the difference, if the
      checked-in files are stale. The header is taken from --cuda-include,
      $CUDA_PATH/include, pkg-config (cuda-12.9), /usr/local/cuda/include,
      or fetched from PyPI (see xtask/cuda-header.lock); its sha256 must
      match the lock.
  wheel [--out DIR]
      The Python module in release (abi3, CPython >= 3.9, no test hooks)
      as target/gpu-demo/cuda_interop.abi3.so and a wheel next to it
      (written with python3's zipfile, no maturin or network), with the
      frame_server and frame_client examples (release), gpu_consumer.py
      and gpu_demo.sh: the folder the GPU demo runs from
      (`bash target/gpu-demo/gpu_demo.sh`).

The GPU tests are built and packaged by scripts/gpu-bundle.sh.";
