//! `cargo xtask test` and `cargo xtask demo`: the system packages first, then
//! the tests or the main job.
//!
//! # Contract
//!
//! * Each task needs a fixed list of Debian/Ubuntu packages ([`TEST_PACKAGES`],
//!   [`DEMO_PACKAGES`]); `test` also those of the Python tests when the
//!   `python3` on `PATH` is the distribution's (see `python_env.rs`).
//!   Detection needs no privileges: `dpkg-query -W -f='${Status}\n' PKG`; a
//!   package is present when a line of that reads `install ok installed`.
//! * Missing packages are installed with `apt-get update` and `apt-get install
//!   -y --no-install-recommends` only when that can run unattended: as root,
//!   or through `sudo -n` when `sudo -n true` succeeds. Otherwise the task
//!   stops at once, before building anything, printing the exact command to
//!   run. pip never installs into a system interpreter.
//! * `CUDA_INTEROP_XTASK_ASSUME_MISSING=PKG[,PKG...]` is a diagnostic dry run:
//!   those packages count as missing whatever dpkg says, nothing is installed,
//!   and the task stops after printing what it would run (with root or sudo)
//!   or the command to run (without). Only xtask reads it.
//! * Without `dpkg-query` (not Debian or Ubuntu) nothing is checked: the task
//!   names the packages and goes on; the tests and the demo say themselves
//!   what is missing.
//! * Each task first prints what it is about to do (before any build), and
//!   a line before each long build saying what it builds.
//! * The processes both tasks start get a private `XDG_RUNTIME_DIR` when
//!   none is set (`runtime_dir.rs`).
//! * Then, in the workspace root, `test` runs `cargo test [--workspace]
//!   --no-fail-fast ARGS` (see `cargo_args.rs`: `--workspace` only when ARGS
//!   name no package, so `-p X` tests X alone; every test binary runs even
//!   when one fails) and `demo` runs `cargo run --release -p cuda-interop
//!   --example round_trip -- ARGS`, with ARGS passed through unchanged (a
//!   leading `--` for `demo` is dropped); `demo` fails when its command
//!   fails.
//! * After the cargo tests, unless ARGS name packages and not
//!   `cuda-interop-py` (then it says it skips them, and the summary says so
//!   too), `test` runs the Python module's tests: it builds
//!   `cuda-interop-py` with the same profile and target directory, copies
//!   the library to `TARGET/python/cuda_interop.abi3.so`, and runs `python3
//!   -m pytest -q python/tests` (the interpreter `python_env.rs` chose) with
//!   `PYTHONPATH` naming that directory (and `CUDA_INTEROP_FRAME_SERVER`
//!   naming the `frame_server` example, built with the same profile, for
//!   the protocol tests). Any non-zero pytest status fails the task, 5 (no
//!   tests collected) included. That run leaves out `python/tests/test_ray.py`
//!   (`--ignore`): a second pytest run, with the same environment, runs it
//!   alone with the interpreter of `TARGET/xtask-ray`, which has Ray (see
//!   `ray_env.rs`; made before building).
//! * `test` shows all output as it comes and ends with a summary (see
//!   `summary.rs`): each binary's passed, failed and ignored counts, the
//!   failed tests, the ignored and skipped ones by reason, what was not
//!   run, and a last line `xtask test: N passed, N failed, N ignored, N
//!   skipped`. It fails if anything failed, crashed, or did not build,
//!   after running the rest.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

use crate::cargo_args::{BuildFlags, Selection};
use crate::python_env::{self, Interpreter};
use crate::ray_env::{self, RayPython};
use crate::runtime_dir::RuntimeDir;
use crate::summary::Summary;

/// What `cargo test --workspace` needs: the Vulkan loader, lavapipe, the
/// Khronos validation layer (every Vulkan test runs with it), a C compiler
/// for the loader tests' fixture libraries and the C ABI's C programs, a
/// C++ compiler with the Vulkan headers and link library for the C ABI's
/// C++ Vulkan application (`cuda-interop-capi/tests/c/app_publish.cpp`),
/// and for the GStreamer plugin (`cuda-interop-gst`) pkg-config and
/// GStreamer's development files (its build), the base and good plugins
/// (`appsrc`, `appsink`, `videotestsrc`, `videoconvert` in its tests) and
/// `gst-inspect-1.0` (its registration test), `ip` (iproute2: its
/// two-hosts test joins two network namespaces; without, it runs on
/// loopback and says so), and EGL with Mesa's OpenGL (`cuda-interop-gl`'s
/// tests: a headless llvmpipe context imports lavapipe's images).
pub const TEST_PACKAGES: &[&str] = &[
    "libvulkan1",
    "mesa-vulkan-drivers",
    "vulkan-validationlayers",
    "gcc",
    "g++",
    "libvulkan-dev",
    "pkg-config",
    "libgstreamer1.0-dev",
    "libgstreamer-plugins-base1.0-dev",
    "gstreamer1.0-plugins-base",
    "gstreamer1.0-plugins-good",
    "gstreamer1.0-tools",
    "iproute2",
    "libegl1",
    "libegl-mesa0",
    "libgl1-mesa-dri",
];

/// What the round-trip example needs: the loader, lavapipe (where there is no
/// GPU driver) and the validation layer (it runs with it when present).
pub const DEMO_PACKAGES: &[&str] = &[
    "libvulkan1",
    "mesa-vulkan-drivers",
    "vulkan-validationlayers",
];

const ASSUME_MISSING: &str = "CUDA_INTEROP_XTASK_ASSUME_MISSING";

/// `cargo xtask test [ARGS]`.
pub fn test(args: &[String]) -> Result<(), String> {
    let selection = Selection::of(args);
    // Ok: the plan for the Python tests; Err: why they do not run.
    let python = selection.pytest().map(|()| python_env::plan());
    let mut needed = TEST_PACKAGES.to_vec();
    if let Ok(plan) = &python {
        needed.extend(plan.apt_packages());
    }
    let command = selection.test_command(args);
    println!(
        "xtask test: system packages ({}), then cargo {}, then {}; a summary at the end",
        needed.join(", "),
        command.join(" "),
        match &python {
            Ok(plan) => format!(
                "pytest python/tests (python3: {}), then its Ray tests (Ray {} in {})",
                plan.describe(),
                ray_env::RAY_VERSION,
                ray_env::VENV_DIR
            ),
            Err(why) => format!("no pytest: {why}"),
        }
    );
    ensure_packages("test", &needed)?;
    let root = crate::workspace_root();
    let build = BuildFlags::of(args);
    let target = build.target(&root);
    // Before building, so that a Python set-up that cannot work stops the
    // task at once.
    let interpreter = match python {
        Ok(plan) => Ok(python_env::ready(&plan, &target)?),
        Err(why) => Err(why),
    };
    let runtime = RuntimeDir::new()?;
    let mut summary = Summary::default();
    // The Ray tests' interpreter, before building too.
    let ray = match &interpreter {
        Ok(_) => ray_env::ready(&target, &mut summary.not_run)?,
        Err(_) => None,
    };
    eprintln!(
        "xtask test: building and running the tests; on a cold machine the first build of \
         the workspace takes many minutes (cargo shows its progress)"
    );
    let mut cargo = cargo();
    cargo.args(&command);
    runtime.apply(&mut cargo);
    let status = stream(cargo, |line| summary.cargo_line(line))?;
    if !status.success() && !summary.failed() {
        summary
            .errors
            .push(format!("cargo test failed ({status}), see above"));
    }
    match interpreter {
        Ok(python) => {
            let ray = ray.as_ref();
            if let Err(e) = python_tests(&build, &target, &python, ray, &runtime, &mut summary) {
                summary.errors.push(e);
            }
        }
        Err(why) => {
            eprintln!("xtask test: not running pytest python/tests: {why}");
            summary.not_run.push(format!("pytest python/tests: {why}"));
        }
    }
    print!("{}", summary.render());
    if summary.failed() {
        Err("tests failed (the summary above says which)".into())
    } else {
        Ok(())
    }
}

/// Runs `command` with its stdout and stderr joined into one stream (so
/// that cargo's `Running ..` lines and the test binaries' results stay in
/// the order they were written), shows each line on stdout as it comes and
/// hands it to `each`.
fn stream(mut command: Command, mut each: impl FnMut(&str)) -> Result<ExitStatus, String> {
    let shown = format!("{command:?}");
    eprintln!("xtask: running {shown}");
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| format!("cannot make a socket pair: {e}"))?;
    let theirs_too = theirs
        .try_clone()
        .map_err(|e| format!("cannot duplicate a socket: {e}"))?;
    let mut child = command
        .stdout(Stdio::from(OwnedFd::from(theirs)))
        .stderr(Stdio::from(OwnedFd::from(theirs_too)))
        .spawn()
        .map_err(|e| format!("could not run {shown}: {e}"))?;
    // Our copies of the child's ends: gone, so the read ends when it does.
    drop(command);
    let mut out = std::io::stdout();
    for line in BufReader::new(ours).split(b'\n') {
        let Ok(line) = line else { break };
        let line = String::from_utf8_lossy(&line).into_owned();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        each(&line);
    }
    child
        .wait()
        .map_err(|e| format!("could not wait for {shown}: {e}"))
}

/// The Python module's tests: builds `cuda-interop-py` with the profile,
/// target directory and `--locked`/`--frozen`/`--offline` of `build`,
/// copies the library to `TARGET/python/cuda_interop.abi3.so`, and runs
/// `python -m pytest -q python/tests` with that directory on `PYTHONPATH`,
/// then the Ray tests with `ray`'s interpreter. Any non-zero pytest status
/// fails, including 5 (no tests collected).
fn python_tests(
    build: &BuildFlags,
    target: &Path,
    python: &Interpreter,
    ray: Option<&RayPython>,
    runtime: &RuntimeDir,
    summary: &mut Summary,
) -> Result<(), String> {
    eprintln!(
        "xtask test: building cuda-interop-py (test hooks) and the frame_server example for \
         pytest"
    );
    let mut cargo = cargo();
    cargo
        .args(["build", "-p", "cuda-interop-py", "--features", "test-hooks"])
        .args(&build.flags);
    run(cargo)?;
    // The frame producer, for the protocol tests against the real server.
    let mut server = self::cargo();
    server
        .args([
            "build",
            "-p",
            "cuda-interop-frames",
            "--example",
            "frame_server",
        ])
        .args(&build.flags);
    run(server)?;
    let root = crate::workspace_root();
    let built = target.join(&build.dir).join("libcuda_interop_py.so");
    let module_dir = target.join("python");
    let module = module_dir.join("cuda_interop.abi3.so");
    std::fs::create_dir_all(&module_dir)
        .map_err(|e| format!("cannot create {}: {e}", module_dir.display()))?;
    // Replace rather than overwrite: a running interpreter may map the old file.
    let _ = std::fs::remove_file(&module);
    std::fs::copy(&built, &module).map_err(|e| {
        format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            module.display()
        )
    })?;
    let pytest = |mut pytest: Command, paths: &[&str]| {
        pytest
            .args(["-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"])
            .args(paths)
            .current_dir(&root)
            .env("PYTHONPATH", &module_dir)
            .env(
                "CUDA_INTEROP_FRAME_SERVER",
                target
                    .join(&build.dir)
                    .join("examples")
                    .join("frame_server"),
            )
            .env("PYTHONDONTWRITEBYTECODE", "1");
        runtime.apply(&mut pytest);
        pytest
    };
    summary.pytest_start("pytest python/tests");
    let all = pytest(python.command(), &["python/tests", ray_env::IGNORE]);
    let status = stream(all, |line| summary.pytest_line(line))?;
    let mut failed = None;
    if !status.success() && !summary.failed() {
        failed = Some(format!("pytest failed ({status}), see above"));
    }
    if let Some(ray) = ray {
        summary.pytest_start(ray.describe());
        let status = stream(pytest(ray.command(), &[ray_env::TESTS]), |line| {
            summary.pytest_line(line)
        })?;
        if !status.success() && !summary.failed() {
            failed = Some(format!(
                "the Ray tests' pytest failed ({status}), see above"
            ));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// `cargo xtask demo [ARGS]`.
pub fn demo(args: &[String]) -> Result<(), String> {
    println!(
        "xtask demo: system packages ({}), then the round_trip example in release \
         (on a cold machine its first build takes minutes; cargo shows its progress)",
        DEMO_PACKAGES.join(", ")
    );
    ensure_packages("demo", DEMO_PACKAGES)?;
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let runtime = RuntimeDir::new()?;
    let mut cargo = cargo();
    cargo
        .args([
            "run",
            "--release",
            "-p",
            "cuda-interop",
            "--example",
            "round_trip",
            "--",
        ])
        .args(args);
    runtime.apply(&mut cargo);
    run(cargo)
}

pub(crate) fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.current_dir(crate::workspace_root());
    cargo
}

pub(crate) fn run(command: Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    run_described(command, &shown)
}

/// [`run`], announced and reported as `what` instead of the whole command
/// line (for one too long to read, such as an inline Python script).
pub(crate) fn run_described(mut command: Command, what: &str) -> Result<(), String> {
    let shown = what;
    eprintln!("xtask: running {shown}");
    let status = command
        .status()
        .map_err(|e| format!("could not run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed ({status})"))
    }
}

/// How packages could be installed from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Installer {
    Root,
    Sudo,
    /// Neither; whether there is a `sudo` to suggest.
    None {
        sudo: bool,
    },
}

impl Installer {
    fn detect() -> Installer {
        if effective_uid() == Some(0) {
            Installer::Root
        } else {
            match Command::new("sudo")
                .args(["-n", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
            {
                Ok(s) if s.success() => Installer::Sudo,
                Ok(_) => Installer::None { sudo: true },
                Err(_) => Installer::None { sudo: false },
            }
        }
    }

    /// The two commands that install `packages`.
    fn commands(self, packages: &[&str]) -> [Vec<String>; 2] {
        let prefix: &[&str] = match self {
            Installer::Root => &["apt-get"],
            Installer::Sudo => &[
                "sudo",
                "-n",
                "env",
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
            ],
            Installer::None { sudo: true } => &["sudo", "apt-get"],
            Installer::None { sudo: false } => &["apt-get"],
        };
        let with = |rest: &[&str]| -> Vec<String> {
            prefix.iter().chain(rest).map(|s| s.to_string()).collect()
        };
        let mut install = with(&["install", "-y", "--no-install-recommends"]);
        install.extend(packages.iter().map(|p| p.to_string()));
        [with(&["update", "-qq"]), install]
    }
}

/// The effective user id, from `/proc/self/status` (no libc needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `Some(true)` if dpkg knows `package` as installed, `Some(false)` if not,
/// `None` without `dpkg-query`.
fn installed(package: &str) -> Option<bool> {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}\n", package])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let status = String::from_utf8_lossy(&output.stdout);
    Some(output.status.success() && status.lines().any(|l| l.trim() == "install ok installed"))
}

fn ensure_packages(task: &str, needed: &[&str]) -> Result<(), String> {
    let assumed: Vec<String> = std::env::var(ASSUME_MISSING)
        .unwrap_or_default()
        .split([',', ' '])
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for unknown in assumed.iter().filter(|p| !needed.contains(&p.as_str())) {
        eprintln!(
            "xtask: {ASSUME_MISSING} names `{unknown}`, which `{task}` does not need; ignored"
        );
    }
    let mut missing = Vec::new();
    for &package in needed {
        if assumed.iter().any(|p| p == package) {
            missing.push(package);
            continue;
        }
        match installed(package) {
            Some(true) => {}
            Some(false) => missing.push(package),
            None => {
                eprintln!(
                    "xtask: no dpkg-query (not Debian/Ubuntu?): not checking system packages; \
                     `{task}` needs the equivalents of: {}",
                    needed.join(" ")
                );
                return Ok(());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let installer = Installer::detect();
    let commands = installer.commands(&missing);
    let shell = |c: &[String]| c.join(" ");
    let dry_run = !assumed.is_empty();
    eprintln!(
        "xtask: `{task}` needs these missing system packages: {}",
        missing.join(" ")
    );
    if let Installer::None { sudo } = installer {
        return Err(format!(
            "installing them needs root ({}); run{}:\n\n    {} && {}\n\nthen `cargo xtask {task}` again{}",
            if sudo {
                "not root, and `sudo -n` needs a password"
            } else {
                "not root, and no sudo"
            },
            if sudo { "" } else { " as root" },
            shell(&commands[0]),
            shell(&commands[1]),
            if dry_run {
                format!(" ({ASSUME_MISSING} is set: it made them count as missing)")
            } else {
                String::new()
            }
        ));
    }
    if dry_run {
        return Err(format!(
            "dry run ({ASSUME_MISSING} is set): would run\n\n    {}\n    {}\n\nand install nothing",
            shell(&commands[0]),
            shell(&commands[1])
        ));
    }
    for command in commands {
        eprintln!("xtask: {}", shell(&command));
        let mut c = Command::new(&command[0]);
        c.args(&command[1..])
            .env("DEBIAN_FRONTEND", "noninteractive");
        run(c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_commands_are_the_ones_that_would_run() {
        let pkgs = ["gcc", "libvulkan1"];
        let [update, install] = Installer::None { sudo: true }.commands(&pkgs);
        assert_eq!(update.join(" "), "sudo apt-get update -qq");
        assert_eq!(
            install.join(" "),
            "sudo apt-get install -y --no-install-recommends gcc libvulkan1"
        );
        let [_, install] = Installer::Root.commands(&pkgs);
        assert_eq!(
            install.join(" "),
            "apt-get install -y --no-install-recommends gcc libvulkan1"
        );
        let [_, install] = Installer::Sudo.commands(&pkgs);
        assert_eq!(
            install[..5].join(" "),
            "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get"
        );
    }

    #[test]
    fn detection_reads_this_process() {
        assert!(
            effective_uid().is_some(),
            "/proc/self/status has a Uid line"
        );
        // dpkg-query answers for a package that cannot exist (where there is one).
        assert_ne!(installed("cuda-interop-no-such-package"), Some(true));
    }
}
