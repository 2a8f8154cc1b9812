//! The Python interpreter `cargo xtask test` runs pytest with, and how it
//! gets pytest, NumPy and mypy without `pip install` into a system
//! interpreter.
//!
//! # Contract
//!
//! * The interpreter is the `python3` first on `PATH`. It is *the
//!   distribution's* when its `sys.prefix` and `sys.base_prefix` are both
//!   `/usr` (Debian's and Ubuntu's `/usr/bin/python3`, outside a virtual
//!   environment), or when there is no `python3` at all ([`plan`]).
//! * With the distribution's interpreter, the modules the tests import are
//!   system packages: [`Plan::apt_packages`] (`python3`, `python3-pytest`,
//!   `python3-numpy`, `mypy` for the stubs' type check, and `python3-venv`
//!   for the Ray tests' virtual environment, see `ray_env.rs`) join the
//!   task's `dpkg-query` check and are installed with apt like the others,
//!   or printed as the command to run. pip never runs on that interpreter
//!   (PEP 668 marks it externally managed, and root's pip would overwrite
//!   apt's files).
//! * Any interpreter that imports `pytest` and `numpy` is used as it is
//!   ([`ready`]); without mypy the stubs' type check is skipped and says so.
//! * Otherwise (pyenv, conda, a virtual environment, a distribution without
//!   dpkg, or apt's packages not importable) xtask uses a virtual
//!   environment of its own, `TARGET/xtask-python` ([`VENV_DIR`]), and says
//!   so first: made with `python3 -m venv`, then that environment's pip
//!   installs pytest and numpy (and mypy, whose failure only skips the type
//!   check), which needs the network. One that already imports them is
//!   reused without the network. The `python3` on `PATH` is never changed.
//!   When that fails, the error names the ways out.
//! * pytest runs with [`Interpreter::command`]: the chosen interpreter,
//!   with the virtual environment's `bin/` first on `PATH` when it is
//!   xtask's (so `mypy` is its mypy).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the distribution's interpreter needs from apt for the tests.
const APT_PACKAGES: &[&str] = &[
    "python3",
    "python3-pytest",
    "python3-numpy",
    "mypy",
    "python3-venv",
];

/// The modules the tests cannot run without.
const REQUIRED: &[&str] = &["pytest", "numpy"];

/// xtask's own virtual environment, under the target directory.
pub const VENV_DIR: &str = "xtask-python";

/// Prints the interpreter, whether it is the distribution's, and each of
/// pytest, numpy and mypy, prefixed with `-` where it cannot be imported.
const PROBE: &str = "\
import importlib.util, sys
print(sys.executable)
print(sys.prefix == sys.base_prefix == '/usr')
for m in ('pytest', 'numpy', 'mypy'):
    print(m if importlib.util.find_spec(m) else '-' + m)
";

/// What [`PROBE`] found out about an interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `sys.executable`.
    pub executable: String,
    /// Outside a virtual environment, with the prefix `/usr`.
    pub distribution: bool,
    /// Of pytest, numpy and mypy, those it cannot import.
    pub missing: Vec<String>,
}

impl Probe {
    /// Runs [`PROBE`] with `python`; `None` when it cannot run.
    fn of(python: impl AsRef<std::ffi::OsStr>) -> Option<Probe> {
        let output = Command::new(python)
            .args(["-c", PROBE])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !output.status.success() {
            return None;
        }
        Probe::parse(&String::from_utf8_lossy(&output.stdout))
    }

    fn parse(text: &str) -> Option<Probe> {
        let mut lines = text.lines();
        let executable = lines.next()?.to_string();
        let distribution = lines.next()? == "True";
        let missing = lines
            .filter_map(|l| l.strip_prefix('-'))
            .map(str::to_string)
            .collect();
        Some(Probe {
            executable,
            distribution,
            missing,
        })
    }

    /// The required modules it cannot import.
    fn missing_required(&self) -> Vec<&str> {
        self.missing
            .iter()
            .map(String::as_str)
            .filter(|m| REQUIRED.contains(m))
            .collect()
    }
}

/// The interpreter found on `PATH` before anything is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The distribution's `python3` (`Some`), or none at all: apt provides.
    Distribution(Option<Probe>),
    /// Another interpreter: used as it is, or xtask's virtual environment.
    Other(Probe),
}

/// Looks at the `python3` on `PATH`.
pub fn plan() -> Plan {
    match Probe::of("python3") {
        Some(p) if p.distribution => Plan::Distribution(Some(p)),
        Some(p) => Plan::Other(p),
        None => Plan::Distribution(None),
    }
}

impl Plan {
    /// The Debian/Ubuntu packages to check (and install) with the rest.
    pub fn apt_packages(&self) -> &'static [&'static str] {
        match self {
            Plan::Distribution(_) => APT_PACKAGES,
            Plan::Other(_) => &[],
        }
    }

    /// One line for the task's opening message.
    pub fn describe(&self) -> String {
        match self {
            Plan::Distribution(None) => "no python3 yet: apt's".into(),
            Plan::Distribution(Some(p)) => format!("{} (the distribution's)", p.executable),
            Plan::Other(p) => p.executable.clone(),
        }
    }
}

/// The interpreter pytest runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    program: PathBuf,
    /// xtask's virtual environment's `bin/`, put first on `PATH`.
    venv_bin: Option<PathBuf>,
}

impl Interpreter {
    /// `python ARGS`, ready for the caller's arguments.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        if let Some(bin) = &self.venv_bin {
            let mut path = OsString::from(bin.as_os_str());
            if let Some(rest) = std::env::var_os("PATH") {
                path.push(":");
                path.push(rest);
            }
            command.env("PATH", path);
        }
        command
    }
}

/// After the system packages: the interpreter that imports pytest and
/// numpy, or xtask's virtual environment under `target`, or why neither.
pub fn ready(plan: &Plan, target: &Path) -> Result<Interpreter, String> {
    let Some(probe) = Probe::of("python3") else {
        return Err(match plan {
            Plan::Distribution(_) => "the Python tests need python3, and there is none on PATH; \
                 install python3, pytest and numpy (Debian/Ubuntu: apt-get install python3 \
                 python3-pytest python3-numpy mypy), or leave them out with \
                 `cargo xtask test -p PACKAGE` for Rust packages only"
                .into(),
            Plan::Other(p) => format!(
                "python3 ({}) stopped working; install pytest and numpy for it, or leave the \
                 Python tests out with `cargo xtask test -p PACKAGE`",
                p.executable
            ),
        });
    };
    let missing = probe.missing_required();
    if missing.is_empty() {
        if probe.missing.iter().any(|m| m == "mypy") {
            eprintln!(
                "xtask: {} has no mypy: test_stubs.py's type check is skipped ({})",
                probe.executable,
                if probe.distribution {
                    "apt-get install mypy runs it".to_string()
                } else {
                    format!("{} -m pip install mypy runs it", probe.executable)
                }
            );
        }
        eprintln!("xtask: pytest runs with {}", probe.executable);
        return Ok(Interpreter {
            program: "python3".into(),
            venv_bin: None,
        });
    }
    venv(&probe, &missing, &target.join(VENV_DIR))
}

/// xtask's virtual environment in `dir`: reused when it imports the
/// required modules, otherwise made (or repaired) from `base`.
fn venv(base: &Probe, missing: &[&str], dir: &Path) -> Result<Interpreter, String> {
    let bin = dir.join("bin");
    let python = bin.join("python3");
    let usable = |p: &Option<Probe>| p.as_ref().is_some_and(|p| p.missing_required().is_empty());
    let found = Probe::of(&python);
    if !usable(&found) {
        eprintln!(
            "xtask: {} (the python3 on PATH) cannot import {}; making a virtual environment \
             for the tests in {} and installing pytest, numpy and mypy there with its own pip \
             (needs the network; {} itself is not changed)",
            base.executable,
            missing.join(", "),
            dir.display(),
            base.executable
        );
        let fail = |what: String| {
            format!(
                "{what}; so the Python tests have no pytest and numpy. Either install them for \
                 the python3 on PATH ({exe} -m pip install pytest numpy mypy), or put the \
                 distribution's python3 first on PATH (Debian/Ubuntu: apt-get install \
                 python3-pytest python3-numpy mypy; PATH=/usr/bin:$PATH), or leave them out \
                 with `cargo xtask test -p PACKAGE` for Rust packages only",
                exe = base.executable
            )
        };
        let quiet_ok = |command: &mut Command| {
            command
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !quiet_ok(Command::new(&base.executable).args(["-m", "venv"]).arg(dir)) {
            return Err(fail(format!(
                "`{} -m venv {}` failed (Debian/Ubuntu: the venv module is the package \
                 python3-venv)",
                base.executable,
                dir.display()
            )));
        }
        let pip = |packages: &[&str]| {
            quiet_ok(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                    ])
                    .args(packages),
            )
        };
        if !pip(REQUIRED) {
            return Err(fail(format!(
                "{} -m pip install pytest numpy failed",
                python.display()
            )));
        }
        if !pip(&["mypy"]) {
            eprintln!(
                "xtask: mypy could not be installed in {}: test_stubs.py's type check is skipped",
                dir.display()
            );
        }
        if !usable(&Probe::of(&python)) {
            return Err(fail(format!(
                "{} still cannot import pytest and numpy",
                python.display()
            )));
        }
    }
    eprintln!(
        "xtask: pytest runs with {} (xtask's virtual environment; remove {} to start it afresh)",
        python.display(),
        dir.display()
    );
    Ok(Interpreter {
        program: python,
        venv_bin: Some(bin),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_read_line_by_line() {
        let p = Probe::parse("/usr/bin/python3\nTrue\npytest\n-numpy\n-mypy\n").unwrap();
        assert_eq!(p.executable, "/usr/bin/python3");
        assert!(p.distribution);
        assert_eq!(p.missing, ["numpy", "mypy"]);
        assert_eq!(p.missing_required(), ["numpy"]);
        let venv = Probe::parse("/v/bin/python3\nFalse\npytest\nnumpy\n-mypy\n").unwrap();
        assert!(!venv.distribution && venv.missing_required().is_empty());
        assert_eq!(Probe::parse(""), None);
    }

    #[test]
    fn only_the_distributions_interpreter_gets_apt_packages() {
        let probe = Probe::parse("/usr/bin/python3\nTrue\n").unwrap();
        assert_eq!(
            Plan::Distribution(Some(probe.clone())).apt_packages(),
            [
                "python3",
                "python3-pytest",
                "python3-numpy",
                "mypy",
                "python3-venv"
            ]
        );
        assert_eq!(Plan::Distribution(None).apt_packages(), APT_PACKAGES);
        assert!(Plan::Other(probe).apt_packages().is_empty());
    }

    #[test]
    fn the_probe_script_runs_where_python3_does() {
        // Where there is a python3, the script is valid Python and says
        // something about each module; where there is none, nothing to check.
        if let Some(p) = Probe::of("python3") {
            assert!(!p.executable.is_empty());
            assert!(p
                .missing
                .iter()
                .all(|m| ["pytest", "numpy", "mypy"].contains(&m.as_str())));
        }
    }
}
