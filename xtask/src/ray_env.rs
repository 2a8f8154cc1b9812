//! The Ray tests of `cargo xtask test` (`python/tests/test_ray.py`, the
//! `python/examples/ray_pipeline.py` example) and the interpreter they run
//! with: a virtual environment of xtask's own with a pinned Ray.
//!
//! # Contract
//!
//! * Ray is not a Debian package and must not be pip-installed into a system
//!   interpreter (PEP 668), so the Ray tests always run with
//!   `TARGET/xtask-ray` ([`VENV_DIR`]): made with `python3 -m venv` from the
//!   `python3` on `PATH` (Debian/Ubuntu: the package `python3-venv`, which
//!   `python_env.rs` adds to the apt list), then its own pip installs
//!   `ray==`[`RAY_VERSION`], `numpy` and `pytest` (the package registry:
//!   about 70 MB the first time). The `python3` on `PATH` is never changed.
//! * One that already imports Ray [`RAY_VERSION`], numpy and pytest is
//!   reused without the network; one with another Ray is brought to the pin
//!   by the same pip command.
//! * When that fails (no registry, no wheel for the interpreter, no venv
//!   module), the task stops before building, saying what failed and what
//!   to do; it never counts the Ray tests as passed or skipped.
//!   `CUDA_INTEROP_XTASK_NO_RAY=1` ([`OPT_OUT`]) leaves them out on purpose:
//!   nothing is installed, and the summary's `not run:` line says so.
//! * The Ray tests are a pytest run of their own, after the other one
//!   (which is given [`IGNORE`] so that it never collects them), with the
//!   same `PYTHONPATH` (the built module) and frame_server, counted in the
//!   summary under [`RayPython::describe`].

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Ray release the tests run with: wheels for CPython 3.10 to 3.14 on
/// x86_64 Linux (Debian bookworm's python3 is 3.11, trixie's 3.13).
pub const RAY_VERSION: &str = "2.60.0";

/// xtask's virtual environment for the Ray tests, under the target directory.
pub const VENV_DIR: &str = "xtask-ray";

/// The tests that need Ray.
pub const TESTS: &str = "python/tests/test_ray.py";

/// What the other pytest run is given so that it leaves [`TESTS`] out.
pub const IGNORE: &str = "--ignore=python/tests/test_ray.py";

/// Set to `1` (or anything but `0` or empty): no Ray tests, said so.
pub const OPT_OUT: &str = "CUDA_INTEROP_XTASK_NO_RAY";

/// Prints Ray's version (or `-`), then `-MODULE` for each of numpy and
/// pytest it cannot import.
const PROBE: &str = "\
import importlib.util
try:
    import ray
    print(ray.__version__)
except Exception:
    print('-')
for m in ('numpy', 'pytest'):
    if importlib.util.find_spec(m) is None:
        print('-' + m)
";

/// The interpreter of `TARGET/xtask-ray`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayPython {
    python: PathBuf,
}

impl RayPython {
    /// `python ARGS`, with the environment's `bin/` first on `PATH`.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.python);
        if let Some(bin) = self.python.parent() {
            let mut path = bin.as_os_str().to_owned();
            if let Some(rest) = std::env::var_os("PATH") {
                path.push(":");
                path.push(rest);
            }
            command.env("PATH", path);
        }
        command
    }

    /// The summary's name for the run.
    pub fn describe(&self) -> String {
        format!("pytest {TESTS} (Ray {RAY_VERSION}, {VENV_DIR})")
    }
}

/// Whether `value` (of [`OPT_OUT`]) leaves the Ray tests out.
fn opted_out(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether [`PROBE`]'s output says the environment is ready.
fn probe_ready(output: &str) -> bool {
    let mut lines = output.lines();
    lines.next().map(str::trim) == Some(RAY_VERSION) && lines.all(|l| !l.starts_with('-'))
}

fn probe(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", PROBE])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && probe_ready(&String::from_utf8_lossy(&o.stdout)))
}

/// The Ray tests' interpreter (`Ok(Some)`), or `Ok(None)` when [`OPT_OUT`]
/// leaves them out (the reason pushed to `not_run`), or why there is none.
pub fn ready(target: &Path, not_run: &mut Vec<String>) -> Result<Option<RayPython>, String> {
    if opted_out(std::env::var(OPT_OUT).ok().as_deref()) {
        let why = format!("pytest {TESTS}: {OPT_OUT} is set (left out on purpose)");
        eprintln!("xtask test: not running {why}");
        not_run.push(why);
        return Ok(None);
    }
    let dir = target.join(VENV_DIR);
    let python = dir.join("bin").join("python3");
    if probe(&python) {
        eprintln!(
            "xtask: the Ray tests run with {} (Ray {RAY_VERSION}; remove {} to start it afresh)",
            python.display(),
            dir.display()
        );
        return Ok(Some(RayPython { python }));
    }
    let fail = |what: String| {
        format!(
            "{what}; so {TESTS} cannot run (Ray has no Debian package, and xtask never runs pip \
             on a system python3). Make the Python package registry reachable for pip (or name a \
             mirror in PIP_INDEX_URL) and run `cargo xtask test` again; or leave the Ray tests \
             out, which the summary then says: {OPT_OUT}=1 cargo xtask test"
        )
    };
    let quiet_ok = |command: &mut Command| {
        command
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !python.exists() {
        eprintln!(
            "xtask: making a virtual environment for the Ray tests in {} (python3 -m venv; the \
             python3 on PATH is not changed)",
            dir.display()
        );
        if !quiet_ok(
            Command::new("python3")
                .args(["-m", "venv", "--clear"])
                .arg(&dir),
        ) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(fail(format!(
                "`python3 -m venv {}` failed (Debian/Ubuntu: the venv module is the package \
                 python3-venv)",
                dir.display()
            )));
        }
    }
    let packages = [
        format!("ray=={RAY_VERSION}"),
        "numpy".into(),
        "pytest".into(),
    ];
    eprintln!(
        "xtask: installing {} into {} with its own pip (the package registry; about 70 MB \
         the first time)",
        packages.join(" "),
        dir.display()
    );
    let installed = quiet_ok(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "--only-binary=ray",
            ])
            .args(&packages),
    );
    if !installed {
        return Err(fail(format!(
            "`{} -m pip install {}` failed (no registry, or no Ray {RAY_VERSION} wheel for this \
             python3: there are wheels for CPython 3.10 to 3.14)",
            python.display(),
            packages.join(" ")
        )));
    }
    if !probe(&python) {
        return Err(fail(format!(
            "{} still cannot import Ray {RAY_VERSION}, numpy and pytest",
            python.display()
        )));
    }
    eprintln!(
        "xtask: the Ray tests run with {} (Ray {RAY_VERSION})",
        python.display()
    );
    Ok(Some(RayPython { python }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_ready_only_at_the_pinned_version_with_numpy_and_pytest() {
        assert!(probe_ready(&format!("{RAY_VERSION}\n")));
        assert!(!probe_ready("2.9.0\n"));
        assert!(!probe_ready("-\n"));
        assert!(!probe_ready(&format!("{RAY_VERSION}\n-numpy\n")));
        assert!(!probe_ready(""));
    }

    #[test]
    fn only_a_value_other_than_0_opts_out() {
        assert!(opted_out(Some("1")));
        assert!(opted_out(Some("yes")));
        assert!(!opted_out(Some("0")));
        assert!(!opted_out(Some("")));
        assert!(!opted_out(None));
    }

    #[test]
    fn the_other_run_ignores_exactly_the_ray_tests() {
        assert_eq!(IGNORE, format!("--ignore={TESTS}"));
        assert!(Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(TESTS)
            .exists());
    }

    #[test]
    fn the_probe_script_runs_where_python3_does() {
        // Valid Python wherever there is a python3: it says something.
        if let Ok(o) = Command::new("python3").args(["-c", PROBE]).output() {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(!String::from_utf8_lossy(&o.stdout).is_empty());
        }
    }
}
