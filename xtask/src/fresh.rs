//! `cargo xtask test` and `cargo xtask demo`: the system packages first, then
//! the tests or the main job.
//!
//! # Contract
//!
//! * Each task needs a fixed list of Debian/Ubuntu packages ([`TEST_PACKAGES`],
//!   [`DEMO_PACKAGES`]). Detection needs no privileges: `dpkg-query -W
//!   -f='${Status}\n' PKG`; a package is present when a line of that reads
//!   `install ok installed`.
//! * Missing packages are installed with `apt-get update` and `apt-get install
//!   -y --no-install-recommends` only when that can run unattended: as root,
//!   or through `sudo -n` when `sudo -n true` succeeds. Otherwise the task
//!   stops at once, before building anything, printing the exact command to
//!   run.
//! * `CUDA_INTEROP_XTASK_ASSUME_MISSING=PKG[,PKG...]` is a diagnostic dry run:
//!   those packages count as missing whatever dpkg says, nothing is installed,
//!   and the task stops after printing what it would run (with root or sudo)
//!   or the command to run (without). Only xtask reads it.
//! * Without `dpkg-query` (not Debian or Ubuntu) nothing is checked: the task
//!   names the packages and goes on; the tests and the demo say themselves
//!   what is missing.
//! * Each task first prints what it is about to do (before any build).
//! * Then, in the workspace root, `test` runs `cargo test --workspace
//!   --no-fail-fast ARGS` (every test binary runs even when one fails)
//!   and `demo` runs `cargo run --release -p cuda-interop --example
//!   round_trip -- ARGS`, with ARGS passed through unchanged (a leading `--`
//!   for `demo` is dropped); `demo` fails when its command fails.
//! * After the cargo tests, `test` runs the Python module's tests: it builds
//!   `cuda-interop-py` with the same profile, copies the library to
//!   `target/python/cuda_interop.abi3.so`, installs pytest with `python3 -m
//!   pip install --quiet pytest` if `python3 -m pytest --version` fails (or
//!   stops, printing the command), and mypy the same way (for the stubs'
//!   type check; if pip cannot install it, that test is skipped and says
//!   so), and runs `python3 -m pytest -q
//!   python/tests` with `PYTHONPATH=target/python` (and
//!   `CUDA_INTEROP_FRAME_SERVER` naming the `frame_server` example, built
//!   with the same profile, for the protocol tests). Any non-zero pytest
//!   status fails the task, 5 (no tests collected) included.
//! * `test` shows all output as it comes and ends with a summary (see
//!   `summary.rs`): each binary's passed, failed and ignored counts, the
//!   failed tests, the ignored and skipped ones by reason, and a last line
//!   `xtask test: N passed, N failed, N ignored, N skipped`. It fails if
//!   anything failed, crashed, or did not build, after running the rest.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitStatus, Stdio};

use crate::summary::Summary;

/// What `cargo test --workspace` needs: the Vulkan loader, lavapipe, the
/// Khronos validation layer (every Vulkan test runs with it), and a C
/// compiler for the loader tests' fixture libraries.
pub const TEST_PACKAGES: &[&str] = &[
    "libvulkan1",
    "mesa-vulkan-drivers",
    "vulkan-validationlayers",
    "gcc",
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
    println!(
        "xtask test: system packages ({}), then cargo test --workspace --no-fail-fast{}, \
         then pytest python/tests; a summary at the end",
        TEST_PACKAGES.join(", "),
        args.iter().map(|a| format!(" {a}")).collect::<String>()
    );
    ensure_packages("test", TEST_PACKAGES)?;
    let mut summary = Summary::default();
    let mut cargo = cargo();
    cargo.args(["test", "--workspace"]);
    if !args
        .iter()
        .take_while(|a| a.as_str() != "--")
        .any(|a| a == "--no-fail-fast")
    {
        cargo.arg("--no-fail-fast");
    }
    cargo.args(args);
    let status = stream(cargo, |line| summary.cargo_line(line))?;
    if !status.success() && !summary.failed() {
        summary
            .errors
            .push(format!("cargo test failed ({status}), see above"));
    }
    if let Err(e) = python_tests(args, &mut summary) {
        summary.errors.push(e);
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

/// The Python module's tests: builds `cuda-interop-py` with the profile (and
/// `--locked`/`--frozen`/`--offline`) of `args`, copies the library to
/// `target/python/cuda_interop.abi3.so`, makes sure pytest is there, and runs
/// `python3 -m pytest -q python/tests` with that directory on `PYTHONPATH`.
/// Any non-zero pytest status fails, including 5 (no tests collected).
fn python_tests(args: &[String], summary: &mut Summary) -> Result<(), String> {
    let build = BuildFlags::of(args);
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
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
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
    ensure_pytest()?;
    ensure_python_module("mypy", "the stubs' type check (test_stubs.py)");
    ensure_python_module("numpy", "the NumPy reads of host rings (test_frames.py)");
    let mut pytest = Command::new("python3");
    pytest
        .args([
            "-m",
            "pytest",
            "-q",
            "-rfEs",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
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
    let status = stream(pytest, |line| summary.pytest_line(line))?;
    if !status.success() && !summary.failed() {
        return Err(format!("pytest failed ({status}), see above"));
    }
    Ok(())
}

/// `python3 -m pytest` works, or is made to with pip, or the error says how.
fn ensure_pytest() -> Result<(), String> {
    let quiet = |args: &[&str]| {
        Command::new("python3")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
    };
    match quiet(&["-m", "pytest", "--version"]) {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(e) => {
            return Err(format!(
                "the Python tests need python3, which could not run ({e}); install python3 \
                 and pytest (Debian/Ubuntu: apt-get install python3 python3-pytest)"
            ))
        }
    }
    eprintln!("xtask: pytest is missing; running `python3 -m pip install --quiet pytest`");
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "pytest"])
        .status();
    if matches!(status, Ok(s) if s.success())
        && matches!(quiet(&["-m", "pytest", "--version"]), Ok(true))
    {
        return Ok(());
    }
    Err(
        "the Python tests need pytest, and pip could not install it; run\n\n    \
         python3 -m pip install pytest\n\n(or, for Debian's python3: apt-get install \
         python3-pytest), then `cargo xtask test` again"
            .to_string(),
    )
}

/// The Python module `module` imports (mypy: `test_stubs.py`'s type check
/// of the stubs; numpy: the host-read frames of `test_frames.py`), or is
/// made to with pip; where it cannot be, the tests that need it are skipped
/// and say so (in the summary's skipped tests), and this says why now.
fn ensure_python_module(module: &str, what: &str) {
    let works = || {
        Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works() {
        return;
    }
    eprintln!("xtask: {module} is missing; running `python3 -m pip install --quiet {module}`");
    let installed = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", module])
        .status()
        .is_ok_and(|s| s.success());
    if !installed || !works() {
        eprintln!(
            "xtask: {module} could not be installed: {what} will be skipped; python3 -m pip \
             install {module} (Debian: apt-get install python3-{module}) to run it"
        );
    }
}

/// The profile flags of a `cargo test` command line, and the directory
/// under the target directory its artifacts go to.
#[derive(Debug, PartialEq, Eq)]
struct BuildFlags {
    flags: Vec<String>,
    dir: String,
}

impl BuildFlags {
    fn of(args: &[String]) -> BuildFlags {
        let mut flags = Vec::new();
        let mut dir = "debug".to_string();
        let mut it = args.iter().take_while(|a| a.as_str() != "--");
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--release" | "-r" => {
                    flags.push("--release".to_string());
                    dir = "release".into();
                }
                "--locked" | "--frozen" | "--offline" => flags.push(arg.clone()),
                "--profile" => {
                    if let Some(name) = it.next() {
                        flags.extend(["--profile".to_string(), name.clone()]);
                        dir = name.clone();
                    }
                }
                other => {
                    if let Some(name) = other.strip_prefix("--profile=") {
                        flags.push(other.to_string());
                        dir = name.to_string();
                    }
                }
            }
        }
        if dir == "dev" || dir == "test" {
            dir = "debug".into();
        } else if dir == "bench" {
            dir = "release".into();
        }
        BuildFlags { flags, dir }
    }
}

/// `cargo xtask demo [ARGS]`.
pub fn demo(args: &[String]) -> Result<(), String> {
    println!(
        "xtask demo: system packages ({}), then the round_trip example in release \
         (the first build takes minutes)",
        DEMO_PACKAGES.join(", ")
    );
    ensure_packages("demo", DEMO_PACKAGES)?;
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
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
    run(cargo)
}

pub(crate) fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.current_dir(crate::workspace_root());
    cargo
}

pub(crate) fn run(mut command: Command) -> Result<(), String> {
    let shown = format!("{command:?}");
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
    fn the_python_module_is_built_with_the_tests_profile() {
        let of = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let b = BuildFlags::of(&args);
            (b.flags.join(" "), b.dir)
        };
        assert_eq!(of(&[]), (String::new(), "debug".into()));
        assert_eq!(
            of(&["--locked", "--release"]),
            ("--locked --release".into(), "release".into())
        );
        assert_eq!(
            of(&["--profile", "gpu", "-p", "x"]),
            ("--profile gpu".into(), "gpu".into())
        );
        assert_eq!(
            of(&["--profile=dev"]),
            ("--profile=dev".into(), "debug".into())
        );
        // After `--` the arguments are the test binaries', not cargo's.
        assert_eq!(of(&["--", "--release"]), (String::new(), "debug".into()));
    }

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
