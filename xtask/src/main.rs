//! Developer tasks for the cuda-interop workspace.
//!
//! ```text
//! cargo xtask codegen [--check] [--cuda-include DIR]   regenerate (or check) the driver bindings
//! ```
//!
//! Only `codegen` needs libclang; nothing else in the workspace does.

mod codegen;
mod functions;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("codegen") => codegen::run(&args[1..]),
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
  codegen [--check] [--cuda-include DIR]
      Regenerate cuda-interop-sys/src/generated/ from the pinned cuda.h.
      --check writes nothing and fails, showing the difference, if the
      checked-in files are stale. The header is taken from --cuda-include,
      $CUDA_PATH/include, pkg-config (cuda-12.9), /usr/local/cuda/include,
      or fetched from PyPI (see xtask/cuda-header.lock); its sha256 must
      match the lock.

The GPU tests are built and packaged by scripts/gpu-bundle.sh.";
