//! `cargo xtask wheel`: the Python extension as an abi3 wheel, and the folder
//! the GPU demo runs from.
//!
//! # Contract
//!
//! * Builds `cuda-interop-py` in release (abi3, CPython 3.9 and later; no
//!   test hooks) and the frame examples (`EXAMPLES`: `frame_server`,
//!   `frame_client`, `renderer`, `vulkan_client`) in release, then fills
//!   `OUT` (default `target/gpu-demo`) with `cuda_interop.abi3.so`, a wheel
//!   `cuda_interop-VERSION-cp39-abi3-linux_ARCH.whl` holding it, the
//!   binaries, the scripts of `python/examples` (`SCRIPTS`: the consumer,
//!   the demo and the two measurement scripts) and `BUILD`
//!   (the commit it was built from, and whether the tree was dirty, which
//!   `gpu_demo.sh` prints first).
//! * The wheel is written without maturin: a zip with the package
//!   `cuda_interop/` (the module as `cuda_interop.abi3.so`, an `__init__.py`
//!   re-exporting it, the stubs `cuda-interop-py/cuda_interop.pyi` as
//!   `__init__.pyi`, and `py.typed`) and
//!   `cuda_interop-VERSION.dist-info/{METADATA,WHEEL,RECORD}` (RECORD with
//!   each file's urlsafe-base64 SHA-256 and size), made by `python3`'s
//!   `zipfile`. `pip install` accepts it on Linux of this architecture with
//!   a glibc at least as new as this machine's.
//! * Deletes only what it made: `OUT` must be missing, empty, or hold the
//!   marker file `.xtask-wheel` this task writes there, which lists the
//!   files it wrote last time; those (and only those) are removed before
//!   the new ones are written. A non-empty `OUT` without the marker is
//!   refused, and nothing in it is touched.
//! * Nothing needs the network.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fresh::{cargo, run, run_described};

/// The Python script that writes the wheel: argv = wheel path, module path,
/// version, tag, stub path. The wheel holds the package `cuda_interop` (as
/// maturin lays out a Rust module with stubs): the extension as
/// `cuda_interop/cuda_interop.abi3.so`, an `__init__.py` re-exporting it,
/// the stubs as `__init__.pyi` and the PEP 561 marker `py.typed`.
const MAKE_WHEEL: &str = r#"
import base64, hashlib, sys, zipfile
wheel, module, version, tag, stub = sys.argv[1:6]
dist = f"cuda_interop-{version}.dist-info"
init = (
    '"""Vulkan buffers shared by another process, in CUDA, as DLPack tensors."""\n'
    "from .cuda_interop import *  # noqa: F401,F403\n"
    "from .cuda_interop import __doc__, __version__, PROTOCOL_VERSION  # noqa: F401\n"
)
files = {
    "cuda_interop/cuda_interop.abi3.so": open(module, "rb").read(),
    "cuda_interop/__init__.py": init.encode(),
    "cuda_interop/__init__.pyi": open(stub, "rb").read(),
    "cuda_interop/py.typed": b"",
    f"{dist}/METADATA": (
        "Metadata-Version: 2.1\nName: cuda-interop\nVersion: " + version + "\n"
        "Summary: Receive Vulkan buffers shared by another process into CUDA, as DLPack tensors\n"
        "License: MIT OR Apache-2.0\nRequires-Python: >=3.9\n"
    ).encode(),
    f"{dist}/WHEEL": (
        "Wheel-Version: 1.0\nGenerator: cargo-xtask-wheel\nRoot-Is-Purelib: false\nTag: " + tag + "\n"
    ).encode(),
}
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in files.items())
record += f"{dist}/RECORD,,\n"
files[f"{dist}/RECORD"] = record.encode()
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in files.items():
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data)
"#;

/// The files every run writes into `OUT`, besides the wheel (whose name
/// holds the version) and the marker.
const OUTPUTS: &[&str] = &[
    "cuda_interop.abi3.so",
    "frame_server",
    "frame_client",
    "renderer",
    "vulkan_client",
    "gpu_consumer.py",
    "gpu_demo.sh",
    "frames_measure.sh",
    "frames_matrix.sh",
    "BUILD",
];

/// The `cuda-interop-frames` examples the demo folder holds.
const EXAMPLES: &[&str] = &["frame_server", "frame_client", "renderer", "vulkan_client"];

/// The scripts of `python/examples` the demo folder holds.
const SCRIPTS: &[&str] = &[
    "gpu_consumer.py",
    "gpu_demo.sh",
    "frames_measure.sh",
    "frames_matrix.sh",
];

/// The marker file: this task's, listing what it wrote, one name a line.
const MARKER: &str = ".xtask-wheel";

fn clear_previous(out: &Path) -> Result<(), String> {
    crate::outdir::clear_previous(out, MARKER, "cargo xtask wheel")
}

fn write_marker(out: &Path, names: &[&str]) -> Result<(), String> {
    crate::outdir::write_marker(out, MARKER, names)
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

/// `cargo xtask wheel [--out DIR]`.
pub fn wheel(args: &[String]) -> Result<(), String> {
    let root = crate::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"));
    let out = match args {
        [] => target.join("gpu-demo"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => return Err("usage: cargo xtask wheel [--out DIR]".into()),
    };
    // Refuse a folder this task did not make before building anything.
    clear_previous(&out)?;
    eprintln!(
        "xtask wheel: building cuda-interop-py and the frame examples in release (minutes on \
         a cold machine; cargo shows its progress), then writing {}",
        out.display()
    );
    let mut build = cargo();
    build.args(["build", "--release", "-p", "cuda-interop-py"]);
    run(build)?;
    let mut build = cargo();
    build.args(["build", "--release", "-p", "cuda-interop-frames"]);
    for example in EXAMPLES {
        build.args(["--example", example]);
    }
    run(build)?;

    let version = env!("CARGO_PKG_VERSION");
    let tag = format!("cp39-abi3-linux_{}", std::env::consts::ARCH);
    let wheel_name = format!("cuda_interop-{version}-{tag}.whl");
    let wheel = out.join(&wheel_name);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    // The marker goes first, so a failure below still leaves it listing
    // everything that may have been written.
    let mut written = OUTPUTS.to_vec();
    written.push(&wheel_name);
    write_marker(&out, &written)?;
    let release = target.join("release");
    let module = out.join("cuda_interop.abi3.so");
    copy(&release.join("libcuda_interop_py.so"), &module)?;
    for example in EXAMPLES {
        copy(&release.join("examples").join(example), &out.join(example))?;
    }
    for script in SCRIPTS {
        copy(
            &root.join("python").join("examples").join(script),
            &out.join(script),
        )?;
    }
    std::fs::write(out.join("BUILD"), build_stamp(&root))
        .map_err(|e| format!("cannot write {}: {e}", out.join("BUILD").display()))?;
    let mut python = Command::new("python3");
    python
        .args(["-c", MAKE_WHEEL])
        .arg(&wheel)
        .arg(&module)
        .args([version, tag.as_str()])
        .arg(root.join("cuda-interop-py").join("cuda_interop.pyi"));
    // The script itself is 2,000 characters: name what it does instead.
    run_described(
        python,
        &format!("python3 -c MAKE_WHEEL (xtask/src/wheel.rs): writing {wheel_name} with zipfile"),
    )?;
    println!(
        "xtask: {} is ready; on the GPU machine: bash {}/gpu_demo.sh \
         (or pip install {})",
        out.display(),
        out.display(),
        wheel.display()
    );
    Ok(())
}

/// What the demo folder was built from: the commit, and the changes not
/// committed (or why that is unknown).
fn build_stamp(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match (git(&["rev-parse", "HEAD"]), git(&["status", "--porcelain"])) {
        (Some(commit), Some(changes)) if changes.is_empty() => {
            format!("commit {commit} (clean tree)\n")
        }
        (Some(commit), Some(changes)) => {
            format!("commit {commit} DIRTY (built with these uncommitted changes)\n{changes}\n")
        }
        _ => "commit unknown (no git here)\n".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-wheel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn every_example_and_script_it_copies_is_listed_and_exists() {
        // The marker lists OUTPUTS: a copied file missing there would never
        // be cleared by the next run.
        for name in EXAMPLES.iter().chain(SCRIPTS) {
            assert!(
                OUTPUTS.contains(name),
                "{name} is copied but not in OUTPUTS"
            );
        }
        let root = crate::workspace_root();
        for script in SCRIPTS {
            let path = root.join("python").join("examples").join(script);
            assert!(path.is_file(), "{} is missing", path.display());
        }
        for example in EXAMPLES {
            let path = root
                .join("cuda-interop-frames")
                .join("examples")
                .join(format!("{example}.rs"));
            assert!(path.is_file(), "{} is missing", path.display());
        }
    }

    #[test]
    fn a_folder_it_did_not_make_is_refused_and_kept() {
        let dir = scratch("foreign");
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let err = clear_previous(&dir).unwrap_err();
        assert!(err.contains("nothing was deleted"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
            "mine"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_previous_output_loses_only_the_files_it_listed() {
        let dir = scratch("previous");
        write_marker(&dir, &["BUILD", "cuda_interop-0.0.1-x.whl"]).unwrap();
        std::fs::write(dir.join("BUILD"), "old").unwrap();
        std::fs::write(dir.join("cuda_interop-0.0.1-x.whl"), "old").unwrap();
        std::fs::write(dir.join("added-by-hand.log"), "keep").unwrap();
        clear_previous(&dir).unwrap();
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["added-by-hand.log"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_or_empty_folder_is_fine() {
        let dir = scratch("empty");
        clear_previous(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        clear_previous(&dir).unwrap();
    }

    #[test]
    fn a_marker_naming_a_path_is_refused() {
        let dir = scratch("path");
        write_marker(&dir, &["../elsewhere"]).unwrap();
        assert!(clear_previous(&dir)
            .unwrap_err()
            .contains("unexpected entry"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
