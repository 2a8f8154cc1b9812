//! `cargo xtask install-capi --prefix DIR`: the C ABI (`cuda-interop-capi`)
//! built and installed for C and C++ programs.
//!
//! # Contract
//!
//! * Builds `cuda-interop-capi`'s libraries (`cargo build -p
//!   cuda-interop-capi --lib`, release unless `--profile` names another)
//!   and installs, under `DIR` (made if missing):
//!   `lib/libcuda_interop.so.0` (the soname, [`SONAME`]),
//!   `lib/libcuda_interop.so` (a relative symlink to it, for `-lcuda_interop`),
//!   `lib/libcuda_interop.a`, `include/cuda_interop.h` and
//!   `lib/pkgconfig/cuda-interop.pc` (`prefix=DIR`, absolute; `Libs`
//!   the shared library, `Libs.private` what the static one needs).
//! * Overwrites only those files; nothing else under `DIR` is touched.
//! * The target directory is `$CARGO_TARGET_DIR`, else the workspace's
//!   `target/`.

use std::path::{Path, PathBuf};

use crate::fresh::{cargo, run_described};

/// The soname the shared library is installed as (`build.rs` of the crate
/// sets it; the crate's tests check it against `CI_ABI_VERSION_MAJOR`).
pub const SONAME: &str = "libcuda_interop.so.0";

/// What the static library needs besides itself (Rust's std on Linux).
const STATIC_LIBS: &str = "-lpthread -ldl -lm -lrt -lgcc_s -lutil";

/// The pkg-config file for an installation under `prefix`.
pub fn pc_file(prefix: &Path, version: &str) -> String {
    format!(
        "prefix={}\n\
         exec_prefix=${{prefix}}\n\
         libdir=${{exec_prefix}}/lib\n\
         includedir=${{prefix}}/include\n\
         \n\
         Name: cuda-interop\n\
         Description: Vulkan<->CUDA zero-copy interop and cross-process frame sharing (the C ABI, libcuda_interop)\n\
         Version: {version}\n\
         Cflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -lcuda_interop\n\
         Libs.private: {STATIC_LIBS}\n",
        prefix.display()
    )
}

fn usage() -> String {
    "usage: cargo xtask install-capi --prefix DIR [--profile PROFILE]".into()
}

pub fn install_capi(args: &[String]) -> Result<(), String> {
    let mut prefix = None;
    let mut profile = "release".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = it.next().map(PathBuf::from),
            "--profile" => profile = it.next().cloned().ok_or_else(usage)?,
            other => return Err(format!("unknown argument `{other}`\n{}", usage())),
        }
    }
    let prefix = prefix.ok_or_else(usage)?;
    std::fs::create_dir_all(&prefix)
        .map_err(|e| format!("cannot make {}: {e}", prefix.display()))?;
    let prefix = prefix
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", prefix.display()))?;

    let root = crate::workspace_root();
    let mut build = cargo();
    build
        .current_dir(&root)
        .args(["build", "-p", "cuda-interop-capi", "--lib", "--profile"])
        .arg(&profile);
    run_described(
        build,
        &format!("cargo build -p cuda-interop-capi --lib --profile {profile}"),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { root.join(t) } else { t })
        .unwrap_or_else(|| root.join("target"));
    let built = target.join(if profile == "dev" { "debug" } else { &profile });

    let (lib, include, pkgconfig) = (
        prefix.join("lib"),
        prefix.join("include"),
        prefix.join("lib/pkgconfig"),
    );
    for d in [&lib, &include, &pkgconfig] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot make {}: {e}", d.display()))?;
    }
    copy(&built.join("libcuda_interop.so"), &lib.join(SONAME))?;
    let link = lib.join("libcuda_interop.so");
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(&link)
            .map_err(|e| format!("cannot replace {}: {e}", link.display()))?;
    }
    std::os::unix::fs::symlink(SONAME, &link)
        .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
    copy(
        &built.join("libcuda_interop.a"),
        &lib.join("libcuda_interop.a"),
    )?;
    copy(
        &root.join("cuda-interop-capi/include/cuda_interop.h"),
        &include.join("cuda_interop.h"),
    )?;
    let pc = pkgconfig.join("cuda-interop.pc");
    std::fs::write(&pc, pc_file(&prefix, env!("CARGO_PKG_VERSION")))
        .map_err(|e| format!("cannot write {}: {e}", pc.display()))?;
    eprintln!(
        "install-capi: installed into {} (PKG_CONFIG_PATH={} pkg-config --cflags --libs \
         cuda-interop)",
        prefix.display(),
        pkgconfig.display()
    );
    Ok(())
}

/// Copies `from` to `to`, replacing `to` (a running program may map the
/// old file: it is unlinked first, never written in place).
fn copy(from: &Path, to: &Path) -> Result<(), String> {
    if to.symlink_metadata().is_ok() {
        std::fs::remove_file(to).map_err(|e| format!("cannot replace {}: {e}", to.display()))?;
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pc_file_names_the_prefix_and_the_library() {
        let pc = super::pc_file(std::path::Path::new("/opt/ci"), "0.1.0");
        assert!(pc.starts_with("prefix=/opt/ci\n"));
        assert!(pc.contains("Libs: -L${libdir} -lcuda_interop\n"));
        assert!(pc.contains("Cflags: -I${includedir}\n"));
        assert!(pc.contains("Version: 0.1.0\n"));
    }
}
