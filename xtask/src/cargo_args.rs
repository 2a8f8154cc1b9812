//! What the arguments of `cargo xtask test ARGS` ask of cargo: which
//! packages, which profile and target directory.
//!
//! # Contract
//!
//! * Only the arguments before a `--` are cargo's; after it they are the
//!   test binaries' and are never read here.
//! * [`Selection`]: the packages `-p`/`--package` name (`-p X`, `-pX`,
//!   `--package X`, `--package=X`, cargo's `*`/`?` patterns and `NAME@VER`
//!   specs), those `--exclude` names, and whether `--workspace`/`--all` is
//!   given. [`Selection::test_command`] is `test`, then `--workspace` only
//!   when no package is named and it is not given already (cargo tests
//!   every package with it, whatever `-p` says), then `--no-fail-fast`
//!   unless given, then ARGS unchanged.
//! * [`Selection::pytest`]: the Python tests (of `cuda-interop-py`) run
//!   unless packages are named and none of them is `cuda-interop-py`, or
//!   `--exclude` names it; the error says which, and how to run them.
//! * [`BuildFlags`]: the profile (`--release`, `-r`, `--profile P`), the
//!   target directory (`--target-dir D`) and `--locked`/`--frozen`/
//!   `--offline`, for building the Python module the same way, and the
//!   directory under the target directory the artifacts go to.

use std::path::{Path, PathBuf};

/// The package whose tests are Python's.
pub const PYTHON_PACKAGE: &str = "cuda-interop-py";

/// The cargo arguments of `args`: those before a `--`.
fn cargo_part(args: &[String]) -> impl Iterator<Item = &String> {
    args.iter().take_while(|a| a.as_str() != "--")
}

/// The packages a `cargo test` command line names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub packages: Vec<String>,
    pub excluded: Vec<String>,
    pub workspace: bool,
    no_fail_fast: bool,
}

impl Selection {
    pub fn of(args: &[String]) -> Selection {
        let mut selection = Selection::default();
        let mut it = cargo_part(args);
        while let Some(arg) = it.next() {
            let arg = arg.as_str();
            let mut value = |long: &str, short: Option<&str>| -> Option<String> {
                if arg == long || Some(arg) == short {
                    return it.next().cloned();
                }
                if let Some(v) = arg.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
                    return Some(v.to_string());
                }
                short
                    .and_then(|s| arg.strip_prefix(s))
                    .filter(|v| !v.is_empty())
                    .map(|v| v.trim_start_matches('=').to_string())
            };
            if let Some(p) = value("--package", Some("-p")) {
                selection.packages.push(p);
            } else if let Some(p) = value("--exclude", None) {
                selection.excluded.push(p);
            } else if arg == "--workspace" || arg == "--all" {
                selection.workspace = true;
            } else if arg == "--no-fail-fast" {
                selection.no_fail_fast = true;
            }
        }
        selection
    }

    /// The `cargo` arguments that run the tests `args` ask for.
    pub fn test_command(&self, args: &[String]) -> Vec<String> {
        let mut command = vec!["test".to_string()];
        if self.packages.is_empty() && !self.workspace {
            command.push("--workspace".into());
        }
        if !self.no_fail_fast {
            command.push("--no-fail-fast".into());
        }
        command.extend(args.iter().cloned());
        command
    }

    /// Whether the Python tests run, or why not.
    pub fn pytest(&self) -> Result<(), String> {
        let python = |spec: &String| matches_package(spec, PYTHON_PACKAGE);
        if let Some(spec) = self.excluded.iter().find(|s| python(s)) {
            return Err(format!(
                "`--exclude {spec}` leaves out {PYTHON_PACKAGE}, whose tests they are"
            ));
        }
        if !self.packages.is_empty() && !self.packages.iter().any(python) {
            return Err(format!(
                "-p names only Rust packages ({}); add `-p {PYTHON_PACKAGE}` to run them",
                self.packages.join(", ")
            ));
        }
        Ok(())
    }
}

/// Whether cargo's package spec `spec` (a name, `NAME@VERSION`, or a
/// pattern with `*` and `?`) picks the package `name`.
fn matches_package(spec: &str, name: &str) -> bool {
    let spec = spec.split('@').next().unwrap_or(spec);
    glob(spec.as_bytes(), name.as_bytes())
}

fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], text) || (!text.is_empty() && glob(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) if p == t => glob(&pattern[1..], &text[1..]),
        _ => false,
    }
}

/// The profile flags of a `cargo test` command line, and the directory
/// under the target directory its artifacts go to.
#[derive(Debug, PartialEq, Eq)]
pub struct BuildFlags {
    pub flags: Vec<String>,
    pub dir: String,
    /// `--target-dir`, as given.
    pub target_dir: Option<PathBuf>,
}

impl BuildFlags {
    pub fn of(args: &[String]) -> BuildFlags {
        let mut flags = Vec::new();
        let mut dir = "debug".to_string();
        let mut target_dir = None;
        let mut it = cargo_part(args);
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
                "--target-dir" => {
                    if let Some(path) = it.next() {
                        flags.extend(["--target-dir".to_string(), path.clone()]);
                        target_dir = Some(PathBuf::from(path));
                    }
                }
                other => {
                    if let Some(name) = other.strip_prefix("--profile=") {
                        flags.push(other.to_string());
                        dir = name.to_string();
                    } else if let Some(path) = other.strip_prefix("--target-dir=") {
                        flags.push(other.to_string());
                        target_dir = Some(PathBuf::from(path));
                    }
                }
            }
        }
        if dir == "dev" || dir == "test" {
            dir = "debug".into();
        } else if dir == "bench" {
            dir = "release".into();
        }
        BuildFlags {
            flags,
            dir,
            target_dir,
        }
    }

    /// The target directory cargo builds into from `root`: `--target-dir`,
    /// else `CARGO_TARGET_DIR`, else `root/target`.
    pub fn target(&self, root: &Path) -> PathBuf {
        self.target_dir
            .clone()
            .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
            .map(|t| if t.is_absolute() { t } else { root.join(t) })
            .unwrap_or_else(|| root.join("target"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn command(args: &[&str]) -> String {
        let args = strings(args);
        Selection::of(&args).test_command(&args).join(" ")
    }

    #[test]
    fn a_named_package_is_all_that_is_tested() {
        assert_eq!(command(&[]), "test --workspace --no-fail-fast");
        assert_eq!(
            command(&["-p", "interop-share"]),
            "test --no-fail-fast -p interop-share"
        );
        assert_eq!(
            command(&["--package=vk-export", "--no-fail-fast"]),
            "test --package=vk-export --no-fail-fast"
        );
        assert_eq!(
            command(&["--workspace", "--exclude", "bench"]),
            "test --no-fail-fast --workspace --exclude bench"
        );
        assert_eq!(
            command(&["--locked", "--", "-p", "x", "--no-fail-fast"]),
            "test --workspace --no-fail-fast --locked -- -p x --no-fail-fast"
        );
    }

    #[test]
    fn every_spelling_of_a_package_is_read() {
        let of = |args: &[&str]| Selection::of(&strings(args));
        assert_eq!(of(&["-p", "a"]).packages, ["a"]);
        assert_eq!(of(&["-pa"]).packages, ["a"]);
        assert_eq!(of(&["-p=a"]).packages, ["a"]);
        assert_eq!(of(&["--package", "a", "--package=b"]).packages, ["a", "b"]);
        assert_eq!(of(&["--exclude=c", "--all"]).excluded, ["c"]);
        assert!(of(&["--all"]).workspace);
        // Not a package flag: `--profile`, and anything after `--`.
        assert!(of(&["--profile", "gpu", "--", "-p", "a"])
            .packages
            .is_empty());
    }

    #[test]
    fn pytest_runs_unless_the_selection_leaves_the_python_package_out() {
        let of = |args: &[&str]| Selection::of(&strings(args)).pytest();
        assert_eq!(of(&[]), Ok(()));
        assert_eq!(of(&["--locked", "--release"]), Ok(()));
        assert_eq!(
            of(&["-p", "interop-share", "-p", "cuda-interop-py"]),
            Ok(())
        );
        assert_eq!(of(&["-p", "cuda-interop-*"]), Ok(()));
        assert_eq!(of(&["-p", "cuda-interop-py@0.1.0"]), Ok(()));
        let err = of(&["-p", "interop-share"]).unwrap_err();
        assert!(
            err.contains("only Rust packages (interop-share)")
                && err.contains("-p cuda-interop-py"),
            "{err}"
        );
        assert!(of(&["--exclude", "cuda-interop-py"]).is_err());
        assert!(of(&["-p", "vk-*"]).is_err());
    }

    #[test]
    fn the_python_module_is_built_with_the_tests_profile() {
        let of = |args: &[&str]| {
            let b = BuildFlags::of(&strings(args));
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
    fn the_target_directory_follows_the_command_line() {
        let root = Path::new("/repo");
        let b = BuildFlags::of(&strings(&["--target-dir", "elsewhere"]));
        assert_eq!(b.flags, ["--target-dir", "elsewhere"]);
        assert_eq!(b.target(root), Path::new("/repo/elsewhere"));
        let b = BuildFlags::of(&strings(&["--target-dir=/abs"]));
        assert_eq!(b.target(root), Path::new("/abs"));
    }
}
