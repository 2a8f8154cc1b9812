//! Developer tasks for the cuda-interop workspace.
//!
//! ```text
//! cargo xtask demo [ARGS]                              system packages, then the main job (round_trip)
//! cargo xtask test [ARGS]                              system packages, cargo test (the workspace, or -p PKG), pytest
//! cargo xtask codegen [--check] [--cuda-include DIR]   regenerate (or check) the driver bindings and the C header (cuda-interop-capi); check the copy kernels' PTX against its source
//! cargo xtask codegen capi [--check]                   regenerate (or check) only the C ABI's header, cuda-interop-capi/include/cuda_interop.h
//! cargo xtask codegen ptx [--out FILE] [--ptx FILE]    regenerate the copy kernels' PTX (needs nvcc, or nvcc's output)
//! cargo xtask install-capi [--profile P] --prefix DIR   build the C ABI and install its library, header and pkg-config file under DIR
//! cargo xtask wheel [--out DIR]                        the Python wheel and the GPU demo folder
//! cargo xtask gpu-bundle                               the GPU machine's bundle (.gpu/, .gl/; run there: bash .gpu/bundle/run.sh)
//! cargo xtask modgraph                                 each crate's module graph; fails on a cycle
//! cargo xtask msrv [--deps-only]                      the stated rust-version is true for the locked dependencies and the code
//! cargo xtask doctor [ARGS]                            can this machine do Vulkan-CUDA interop, and what is missing
//! cargo xtask perf-table RUN_PREFIX [--note T] [--update FILE] [--array-copy FILE]   a GPU run's JSON as the README's tables
//! cargo xtask help                                     the tasks (also -h, --help)
//! ```
//!
//! Every task of the workspace is here (there is no `scripts/`); what runs
//! on the GPU machine, which has no Rust, is the data file `gpu/run.sh`.
//! Only `codegen` needs libclang; nothing else in the workspace does. `demo`
//! and `test` are the commands for a fresh Debian/Ubuntu machine (see
//! `fresh.rs` for what they check and install, and when they stop instead).
//!
//! xtask itself depends on little (serde_json), so that on a cold machine
//! its first line comes within seconds: `codegen` is the crate
//! `xtask-codegen` (bindgen, clang-sys, syn), which `cargo xtask codegen`
//! builds and runs when asked, with cargo's progress shown.

mod cargo_args;
mod fresh;
mod gpu_bundle;
mod install_capi;
mod modgraph;
mod msrv;
mod outdir;
mod perf_table;
mod python_env;
mod ray_env;
mod runtime_dir;
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
        Some("codegen") => codegen(&args[1..]),
        Some("test") => fresh::test(&args[1..]),
        Some("demo") => fresh::demo(&args[1..]),
        Some("install-capi") => install_capi::install_capi(&args[1..]),
        Some("wheel") => wheel::wheel(&args[1..]),
        Some("modgraph") => modgraph::run(&args[1..]),
        Some("gpu-bundle") => gpu_bundle::gpu_bundle(&args[1..]),
        Some("perf-table") => perf_table::run(&args[1..]),
        Some("doctor") => doctor(&args[1..]),
        Some("msrv") => msrv::run_msrv(&args[1..]),
        Some("help" | "-h" | "--help") | None => {
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

/// `cargo xtask codegen ARGS`: builds and runs the `xtask-codegen` binary
/// (bindgen, syn), which prints its own errors.
fn codegen(args: &[String]) -> Result<(), String> {
    eprintln!(
        "xtask codegen: building and running xtask-codegen (crate xtask-codegen/: bindgen, \
         clang-sys, syn); its first build takes a minute or more on a cold machine"
    );
    let mut codegen = fresh::cargo();
    codegen
        .args(["run", "-p", "xtask-codegen", "--"])
        .args(args);
    let status = codegen
        .status()
        .map_err(|e| format!("could not run {codegen:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("codegen failed ({status}); why is said above"))
    }
}

/// `cargo xtask doctor`: builds and runs the `cuda-interop-doctor` binary
/// (crate `doctor/`, which the GPU bundle carries too), whose exit status
/// says whether interop works here.
fn doctor(args: &[String]) -> Result<(), String> {
    eprintln!("xtask doctor: building and running cuda-interop-doctor (crate doctor/)");
    let mut doctor = fresh::cargo();
    doctor
        .args(["run", "--quiet", "-p", "cuda-interop-doctor", "--"])
        .args(args);
    let status = doctor
        .status()
        .map_err(|e| format!("could not run {doctor:?}: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(1) => {
            Err("the doctor found that interop does not work here (see MISSING above)".into())
        }
        _ => Err(format!("cuda-interop-doctor failed ({status})")),
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
      The tests: the same check for their packages (those above, gcc,
      and, with the distribution's python3 first on PATH or none,
      python3, python3-pytest, python3-numpy, mypy and python3-venv), then
      cargo test --workspace --no-fail-fast ARGS (e.g.
      `cargo xtask test --locked`); `-p PKG` tests only PKG (no
      --workspace), e.g.
      `cargo xtask test -p cuda-interop-tests --test wire -- --nocapture`.
      Then the Python module's tests, unless -p names only Rust packages
      (it says so): cuda-interop-py built with the same profile, copied to
      target/python/cuda_interop.abi3.so, and
      `python3 -m pytest -q python/tests` (any pytest failure, or no
      tests collected, fails the task). A python3 on PATH that is not the
      distribution's and lacks pytest or numpy is left alone: the tests
      use a virtual environment xtask makes in target/xtask-python (its
      pip installs pytest, numpy and mypy; needs the network). pip never
      installs into a system python3. python/tests/test_ray.py is left
      out of that run and runs after it in target/xtask-ray, a virtual
      environment where xtask pip-installs Ray 2.60.0, numpy and pytest
      (the package registry, once; it stops before building when that
      fails; CUDA_INTEROP_XTASK_NO_RAY=1 leaves the Ray tests out, said
      in the summary).
      Every test binary runs even when one fails; the task ends with a
      summary (each binary's passed/failed/ignored, the failures, the
      ignored and skipped tests by reason, what was not run, and
      `N passed, N failed, ..`) and fails if anything failed.
      Without XDG_RUNTIME_DIR (demo and test), the processes get a
      private one in /tmp, removed at the end (no libwayland errors).
      CUDA_INTEROP_XTASK_ASSUME_MISSING=PKG[,PKG] (demo and test): a dry
      run that treats those packages as missing and installs nothing.
  codegen [--check] [--cuda-include DIR]
      Regenerate cuda-interop-sys/src/generated/ from the pinned cuda.h.
      --check writes nothing and fails, showing the difference, if the
      checked-in files are stale. The header is taken from --cuda-include,
      $CUDA_PATH/include, pkg-config (cuda-12.9), /usr/local/cuda/include,
      or fetched from PyPI (see xtask/cuda-header.lock); its sha256 must
      match the lock. It first checks
      cuda-interop/src/generated/copy_ptx.rs: its DO NOT EDIT fence, and
      that its `source sha256` is that of cuda-interop/kernels/copy.cu.
      It also regenerates (or checks) the C ABI's header (below).
      codegen is the crate xtask-codegen (bindgen, syn, cbindgen), built
      on first use: a minute or more on a cold machine.
  codegen capi [--check]
      Regenerate (or check) only the C ABI's header,
      cuda-interop-capi/include/cuda_interop.h, with cbindgen from the
      crate's source.
  codegen ptx [--out FILE] [--ptx FILE]
      Regenerate cuda-interop/src/generated/copy_ptx.rs from copy.cu with
      nvcc (lowered to PTX ISA 7.0 / sm_75, checked with ptxas for sm_75
      and sm_90). Without nvcc it stops and says so; --ptx takes the output
      of `nvcc -ptx -arch=compute_75 -O3 copy.cu` made elsewhere.
  install-capi [--profile PROFILE] --prefix DIR
      The C ABI for C and C++ programs: builds cuda-interop-capi's
      libraries (release unless --profile) and installs, under DIR,
      lib/libcuda_interop.so.0 (the soname) with the lib/libcuda_interop.so
      link, lib/libcuda_interop.a, include/cuda_interop.h and
      lib/pkgconfig/cuda-interop.pc; then
      `PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs
      cuda-interop` builds against it. Overwrites only those files.
  wheel [--out DIR]
      The Python module in release (abi3, CPython >= 3.9, no test hooks)
      as target/gpu-demo/cuda_interop.abi3.so and a wheel next to it
      (written with python3's zipfile, no maturin or network), with the
      frame_server and frame_client examples (release), gpu_consumer.py
      and gpu_demo.sh: the folder the GPU demo runs from
      (`bash target/gpu-demo/gpu_demo.sh`). DIR must be new, empty, or
      one this task made (its .xtask-wheel marker): only the files it
      wrote there before are removed.
  gpu-bundle
      Builds the GPU test binaries of xtask/gpu/tests.txt (profiles gpu and
      gpu-debug), round_trip, driver_info, the bench binaries and cuda-interop-doctor, and
      packs them with xtask/gpu/run.sh, the Vulkan loader packages (.gl/)
      and the validation layer (.gpu/vvl/), at most 60 MiB; then, on the
      GPU machine, from the repository root: bash .gpu/bundle/run.sh
  modgraph
      Each workspace crate's module graph (references to crate::m,
      super::m, crate::{a, b}), its cycles, and the crate order; fails,
      naming the modules, if any crate has a cycle.
  msrv [--deps-only]
      Whether the stated rust-version is true: fails where a locked
      dependency (of a build or of the tests) states a higher one; then,
      with the stated toolchain installed, cargo +VERSION check --locked
      --workspace --all-targets into target/msrv (without it, it fails
      naming the rustup command, unless --deps-only).
  doctor [--help]
      Whether this machine can share memory and semaphores between Vulkan
      and CUDA: Vulkan loader, devices, drivers, queue families (and
      whether a transfer-only one exists), memory types, extensions,
      external memory per handle type and image format, external binary
      and timeline semaphores (OPAQUE_FD, SYNC_FD), the validation layer,
      the CUDA driver, its version and devices, their pairing by UUID; for
      each missing piece what to install or change. Runs the
      cuda-interop-doctor binary (crate doctor/, also in the GPU bundle);
      fails when interop does not work. Never needs a driver to run.
  perf-table RUN_PREFIX [--note TEXT] [--update FILE] [--array-copy FILE]
      The README's performance tables from RUN_PREFIX-{bench,host_wait,
      array_copy}.json (printed, or put between FILE's perf-table lines);
      --array-copy takes that JSON from another run's FILE.
  help
      This text (also -h, --help).";

#[cfg(test)]
mod tests {
    use super::USAGE;

    /// The tasks `--help` lists, in its order: each line indented by two
    /// spaces, up to its first argument (`codegen ptx` is a task).
    fn tasks() -> Vec<String> {
        USAGE
            .lines()
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .map(|l| {
                l.split_whitespace()
                    .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    /// The README's crate table names exactly these tasks, in this order:
    /// its `xtask` row's backticked words are the task names and nothing
    /// else.
    #[test]
    fn the_readme_lists_the_tasks_help_lists() {
        let tasks = tasks();
        assert!(tasks.len() >= 10 && tasks.contains(&"help".to_string()));
        let readme = std::fs::read_to_string(crate::workspace_root().join("README.md")).unwrap();
        let row = readme
            .lines()
            .find(|l| l.starts_with("| `xtask` |"))
            .expect("README.md has the xtask row in its crate table");
        let named: Vec<&str> = row
            .trim_start_matches("| `xtask` |")
            .split('`')
            .skip(1)
            .step_by(2)
            .collect();
        assert_eq!(
            named, tasks,
            "README.md's xtask row against `cargo xtask --help`"
        );
    }

    /// The module's own list (the `//!` block) names the same tasks.
    #[test]
    fn the_module_docs_list_the_tasks_help_lists() {
        let listed: Vec<String> = include_str!("main.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! cargo xtask "))
            .map(|l| {
                // The description starts after the first run of spaces.
                l.split("  ")
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        assert_eq!(listed, tasks());
    }
}
