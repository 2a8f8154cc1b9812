//! `cargo xtask gpu-bundle`: builds the GPU tests, examples and benchmarks
//! here (the GPU machine has no Rust) and packs them, with what the GPU
//! machine lacks (the Vulkan loader, the Khronos validation layer), into
//! `.gpu/` and `.gl/`. Then, on the GPU machine, from the repository root:
//! `bash .gpu/bundle/run.sh`.
//!
//! # Contract
//!
//! * `.gpu/bundle/` is refilled: it must be missing, empty, or this task's
//!   (marker `.xtask-gpu-bundle`, see `outdir.rs`); only the files listed
//!   there are removed first.
//! * `BUILD` records the commit and whether the tree was dirty (with the
//!   uncommitted changes), the time and `rustc --version`; `run.sh` prints
//!   it first.
//! * The test binaries are those of [`MANIFEST`] (`xtask/gpu/tests.txt`, the
//!   one list of binaries and of the test names `run.sh` skips): each
//!   `test` line's binary of `cuda-interop-tests` (feature `device-local`),
//!   `gpu` profile, as `test-NAME`; those marked `debug` also with
//!   `gpu-debug` as `test-NAME-debug`. Then the `round_trip`,
//!   `driver_info` and `wgpu_to_cuda` examples and the bench binaries `bench`, `host_wait` and
//!   `array_copy` and `cuda-interop-doctor` (crate `doctor/`) (`gpu`
//!   profile), [`RUN_SH`] as `run.sh` and the manifest
//!   as `tests.txt`.
//! * A compute-sanitizer is packed into `.gpu/compute-sanitizer` if one is
//!   here (`$COMPUTE_SANITIZER_DIR`, or `/usr/local/cuda/compute-sanitizer`);
//!   otherwise `run.sh` uses the GPU machine's, and says so if there is none.
//! * Debian's loader packages go to `.gl/` (downloaded with apt-get, amd64,
//!   once) and the validation layer to `.gpu/vvl/` (its `.so`, debug info
//!   stripped and xz-compressed, which `run.sh` unpacks, and its manifest
//!   pointing at `./`), once.
//! * `.gpu/` (and `target/gpu-demo/`, the Python demo, where `cargo xtask
//!   wheel` made it) is packed into `.gpu-pack/bundle.tar.xz`, which with
//!   `.gl/` must stay under [`LIMIT_MIB`] MiB (the carry limit of the GPU
//!   machine is 64 MiB), or the task fails. Carry `.gl` and `.gpu-pack`;
//!   unpack there with python3's tarfile (the command it prints).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fresh::{cargo, run};

/// The runner that executes on the GPU machine (a shell script: no Rust
/// there), copied into the bundle as `run.sh`.
pub const RUN_SH: &str = include_str!("../gpu/run.sh");
/// The test binaries and test names of the bundle: see its header.
pub const MANIFEST: &str = include_str!("../gpu/tests.txt");
/// The most `.gpu-pack/` and `.gl/` may hold together.
pub const LIMIT_MIB: u64 = 60;

const OUT: &str = ".gpu/bundle";
const MARKER: &str = ".xtask-gpu-bundle";

/// One `test` line of the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    pub name: String,
    pub debug: bool,
    /// The package whose test target it is (`package=`; default
    /// [`DEFAULT_PACKAGE`]).
    pub package: String,
}

/// The package of a `test` line without `package=`.
pub const DEFAULT_PACKAGE: &str = "cuda-interop-tests";

#[cfg(test)]
impl TestBinary {
    /// The directory of the package's integration tests, from the
    /// workspace root (`tests/tests`, `cuda-interop-frames/tests`).
    pub fn source_dir(&self) -> PathBuf {
        match self.package.as_str() {
            DEFAULT_PACKAGE => PathBuf::from("tests/tests"),
            other => PathBuf::from(other).join("tests"),
        }
    }
}

/// The manifest, read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub tests: Vec<TestBinary>,
    /// (kind, binary, test names) of each `children`, `no-sanitizer` and
    /// `leaks-on-purpose` line.
    pub names: Vec<(String, String, Vec<String>)>,
    /// Binaries with a `sanitizer` line.
    pub sanitized: Vec<String>,
}

/// Reads the manifest format (see `xtask/gpu/tests.txt`).
pub fn parse_manifest(text: &str) -> Result<Manifest, String> {
    let mut manifest = Manifest::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("xtask/gpu/tests.txt line {}: {why}: `{line}`", n + 1);
        let (head, words) = line.split_once(':').ok_or_else(|| bad("no `:`"))?;
        let mut head = head.split_whitespace();
        let (Some(kind), Some(binary)) = (head.next(), head.next()) else {
            return Err(bad("expected `KIND BINARY ... :`"));
        };
        let options: Vec<&str> = head.collect();
        let words: Vec<String> = words.split_whitespace().map(String::from).collect();
        match kind {
            "test" => {
                let mut debug = false;
                let mut package = DEFAULT_PACKAGE.to_string();
                for option in &options {
                    match *option {
                        "debug" => debug = true,
                        // Run after everything else (run.sh reads it).
                        "faults" => {}
                        o if o.starts_with("package=") => {
                            package = o["package=".len()..].to_string();
                        }
                        o if o
                            .strip_prefix("timeout=")
                            .is_some_and(|s| s.parse::<u32>().is_ok()) => {}
                        _ => return Err(bad("unknown option")),
                    }
                }
                manifest.tests.push(TestBinary {
                    name: binary.to_string(),
                    debug,
                    package,
                });
            }
            "children" | "no-sanitizer" | "leaks-on-purpose" if options.is_empty() => {
                if words.is_empty() {
                    return Err(bad("no test names"));
                }
                manifest
                    .names
                    .push((kind.to_string(), binary.to_string(), words));
            }
            "sanitizer" if options.is_empty() => manifest.sanitized.push(binary.to_string()),
            _ => return Err(bad("unknown line")),
        }
    }
    let binaries: BTreeSet<&str> = manifest.tests.iter().map(|t| t.name.as_str()).collect();
    for binary in manifest
        .names
        .iter()
        .map(|(_, b, _)| b)
        .chain(&manifest.sanitized)
    {
        if !binaries.contains(binary.as_str()) {
            return Err(format!(
                "xtask/gpu/tests.txt names {binary}, which has no `test {binary}` line"
            ));
        }
    }
    Ok(manifest)
}

/// `cargo xtask gpu-bundle`.
pub fn gpu_bundle(args: &[String]) -> Result<(), String> {
    if !args.is_empty() {
        return Err("usage: cargo xtask gpu-bundle".into());
    }
    let root = crate::workspace_root();
    let manifest = parse_manifest(MANIFEST)?;
    println!(
        "xtask gpu-bundle: test binaries {} (gpu profile; gpu-debug too: {}), examples, \
         bench, the Vulkan loader and validation layer, into .gpu/ and .gl/",
        names(manifest.tests.iter()),
        names(manifest.tests.iter().filter(|t| t.debug)),
    );
    let out = root.join(OUT);
    crate::outdir::clear_previous(&out, MARKER, "cargo xtask gpu-bundle")?;
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    std::fs::create_dir_all(root.join(".gpu/vvl")).map_err(|e| e.to_string())?;

    // What this bundle will hold, listed before any of it is written.
    let mut files: Vec<String> = vec![
        "BUILD".into(),
        "run.sh".into(),
        "tests.txt".into(),
        "fake".into(),
    ];
    for t in &manifest.tests {
        files.push(format!("test-{}", t.name));
        if t.debug {
            files.push(format!("test-{}-debug", t.name));
        }
    }
    let binaries = [
        ("examples", "round_trip"),
        ("examples", "driver_info"),
        ("examples", "wgpu_to_cuda"),
        ("examples", "own_device"),
        ("examples", "wgpu_frames"),
        ("", "bench"),
        ("", "host_wait"),
        ("", "array_copy"),
        ("", "cuda-interop-doctor"),
        // The C ABI's static library, for the C tests (c_programs), which
        // compile C against it where there is no cargo.
        ("", "libcuda_interop.a"),
    ];
    files.extend(binaries.iter().map(|(_, b)| b.to_string()));
    let listed: Vec<&str> = files.iter().map(String::as_str).collect();
    crate::outdir::write_marker(&out, MARKER, &listed)?;

    let stamp = build_stamp(&root);
    print!("{stamp}");
    write(&out.join("BUILD"), &stamp)?;

    let target = target_dir(&root);
    build_gpu(&["-p", "cuda-interop", "--example", "round_trip"])?;
    build_gpu(&["-p", "cuda-interop-sys", "--example", "driver_info"])?;
    // The wgpu adapter's example (issue 21): wgpu frames handed to CUDA.
    build_gpu(&["-p", "cuda-interop-wgpu", "--example", "wgpu_to_cuda"])?;
    // wgpu writing a frame sender's slots, received on another device.
    build_gpu(&["-p", "cuda-interop-wgpu", "--example", "wgpu_frames"])?;
    // Bring your own device (issue 21): an ash device wrapped by from_raw.
    build_gpu(&["-p", "vk-export", "--example", "own_device"])?;
    let packages: BTreeSet<&str> = manifest.tests.iter().map(|t| t.package.as_str()).collect();
    for package in packages {
        let of_package = |debug_only: bool| -> Vec<&str> {
            manifest
                .tests
                .iter()
                .filter(|t| t.package == package && (t.debug || !debug_only))
                .map(|t| t.name.as_str())
                .collect()
        };
        copy_tests(&out, package, "gpu", "", &of_package(false))?;
        copy_tests(&out, package, "gpu-debug", "-debug", &of_package(true))?;
    }
    // The performance suite (issue 11): run it on its own, without the layer.
    build_gpu(&["-p", "cuda-interop-bench", "--bins"])?;
    // The doctor (crate doctor/): what the machine can do, first in run.sh.
    build_gpu(&["-p", "cuda-interop-doctor", "--bin", "cuda-interop-doctor"])?;
    build_gpu(&["-p", "cuda-interop-capi", "--lib"])?;
    for (dir, name) in binaries {
        copy(&target.join("gpu").join(dir).join(name), &out.join(name))?;
    }
    write(&out.join("run.sh"), RUN_SH)?;
    write(&out.join("tests.txt"), MANIFEST)?;

    pack_sanitizer(&root)?;
    pack_loader(&root)?;
    pack_validation_layer(&root)?;

    let mut sizes: Vec<(u64, String)> = std::fs::read_dir(&out)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                size_of(&e.path()),
                format!("{OUT}/{}", e.file_name().to_string_lossy()),
            )
        })
        .chain([".gpu/vvl", ".gl"].map(|d| (size_of(&root.join(d)), d.to_string())))
        .collect();
    sizes.sort();
    for (bytes, name) in &sizes {
        println!("{:>8.1} MiB  {name}", *bytes as f64 / MIB as f64);
    }
    let unpacked = (size_of(&root.join(".gpu")) + size_of(&root.join(".gl"))).div_ceil(MIB);
    let pack = root.join(".gpu-pack");
    std::fs::create_dir_all(&pack).map_err(|e| format!("cannot create {}: {e}", pack.display()))?;
    let mut inputs = vec![".gpu"];
    if root.join("target/gpu-demo/gpu_demo.sh").exists() {
        inputs.push("target/gpu-demo");
    }
    let packed = pack.join("bundle.tar.xz");
    let script = format!(
        "tar cf - {} | xz -T2 -6 > {}",
        inputs.join(" "),
        packed.display()
    );
    let mut pack_cmd = Command::new("bash");
    pack_cmd.arg("-c").arg(&script).current_dir(&root);
    run(pack_cmd)?;
    let total = (size_of(&pack) + size_of(&root.join(".gl"))).div_ceil(MIB);
    println!(
        "bundle: {unpacked} MiB in .gpu and .gl; packed ({}): {total} MiB with .gl (limit {LIMIT_MIB} MiB)",
        inputs.join(" + ")
    );
    if total > LIMIT_MIB {
        return Err(format!("the packed bundle is over {LIMIT_MIB} MiB"));
    }
    println!(
        "carry: .gl .gpu-pack   command: python3 -c \"import tarfile; \
         tarfile.open('.gpu-pack/bundle.tar.xz').extractall('.')\" && bash .gpu/bundle/run.sh"
    );
    Ok(())
}

const MIB: u64 = 1024 * 1024;

/// `cargo build --profile gpu ARGS`.
fn build_gpu(args: &[&str]) -> Result<(), String> {
    let mut build = cargo();
    build.args(["build", "--profile", "gpu"]).args(args);
    run(build)
}

fn names<'a>(tests: impl Iterator<Item = &'a TestBinary>) -> String {
    tests.map(|t| t.name.as_str()).collect::<Vec<_>>().join(" ")
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

/// Bytes in the files below `path` (0 if missing).
fn size_of(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| size_of(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Builds the test targets `tests` of `package` with `profile` (the
/// testkit's `device-local` feature on: NVIDIA) and copies each as
/// `out/test-NAME{suffix}`; the fake drivers come with the default package's.
fn copy_tests(
    out: &Path,
    package: &str,
    profile: &str,
    suffix: &str,
    tests: &[&str],
) -> Result<(), String> {
    if tests.is_empty() {
        return Ok(());
    }
    let features = if package == DEFAULT_PACKAGE {
        "device-local"
    } else {
        "cuda-interop-testkit/device-local"
    };
    let mut build = cargo();
    build.args([
        "test",
        "--profile",
        profile,
        "-p",
        package,
        "--features",
        features,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for t in tests {
        build.args(["--test", t]);
    }
    eprintln!("xtask: running {build:?}");
    let output = build
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo test --no-run: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building the {profile} test binaries failed ({})",
            output.status
        ));
    }
    // cargo's messages, parsed once, newest first.
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for t in tests {
        let executable = messages
            .iter()
            .filter(|m| {
                m["reason"] == "compiler-artifact"
                    && m["target"]["name"] == *t
                    && m["target"]["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "test"))
            })
            .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
            .next()
            .ok_or_else(|| format!("gpu-bundle: no {profile} test binary for {t}"))?;
        copy(&executable, &out.join(format!("test-{t}{suffix}")))?;
    }
    if suffix.is_empty() && package == DEFAULT_PACKAGE {
        copy_fake_drivers(out, &messages)?;
    }
    Ok(())
}

/// The testkit's fake `libcuda.so.1` variants (built by its build script)
/// into `OUT/fake/`: the fake-driver parents find them there through
/// `CUDA_INTEROP_FAKE_CUDA_DIR`, which run.sh sets.
fn copy_fake_drivers(out: &Path, messages: &[serde_json::Value]) -> Result<(), String> {
    let out_dir = messages
        .iter()
        .find(|m| {
            m["reason"] == "build-script-executed"
                && m["package_id"]
                    .as_str()
                    .is_some_and(|p| p.contains("cuda-interop-testkit"))
        })
        .and_then(|m| m["out_dir"].as_str().map(PathBuf::from))
        .ok_or("gpu-bundle: cargo reported no build script run of cuda-interop-testkit")?;
    let fake = out.join("fake");
    let mut copied = 0;
    for entry in std::fs::read_dir(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("fake-libcuda-") {
            std::fs::create_dir_all(fake.join(&name)).map_err(|e| e.to_string())?;
            copy(
                &entry.path().join("libcuda.so.1"),
                &fake.join(&name).join("libcuda.so.1"),
            )?;
            copied += 1;
        }
    }
    if copied == 0 {
        return Err(format!(
            "gpu-bundle: no fake-libcuda-* in {}",
            out_dir.display()
        ));
    }
    Ok(())
}

/// What the bundle was built from: the commit, the uncommitted changes (or
/// the clean tree), the time and the compiler.
fn build_stamp(root: &Path) -> String {
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_string())
    };
    let mut stamp = match (
        output("git", &["rev-parse", "HEAD"]),
        output("git", &["status", "--porcelain"]),
    ) {
        (Some(commit), Some(changes)) if changes.is_empty() => {
            format!("commit {commit} (clean tree)\n")
        }
        (Some(commit), Some(changes)) => {
            let mut s = format!(
                "commit {commit} DIRTY (built with the uncommitted changes listed below)\n"
            );
            for line in changes.lines() {
                s.push_str(&format!("    {line}\n"));
            }
            s
        }
        _ => "commit unknown (no git here)\n".to_string(),
    };
    let date = output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_else(|| "?".into());
    let rustc = output("rustc", &["--version"]).unwrap_or_else(|| "rustc ?".into());
    stamp.push_str(&format!("built {date} with {rustc}\n"));
    stamp
}

/// Copies a compute-sanitizer into `.gpu/compute-sanitizer`, if one is here.
fn pack_sanitizer(root: &Path) -> Result<(), String> {
    let dir = std::env::var("COMPUTE_SANITIZER_DIR")
        .unwrap_or_else(|_| "/usr/local/cuda/compute-sanitizer".into());
    if !Path::new(&dir).join("compute-sanitizer").is_file() {
        println!("no compute-sanitizer here ({dir}): run.sh will use the GPU machine's");
        return Ok(());
    }
    let packed = root.join(".gpu/compute-sanitizer");
    if packed.exists() {
        // The copy a previous bundle packed: .gpu/ is this task's folder.
        std::fs::remove_dir_all(&packed)
            .map_err(|e| format!("cannot remove {}: {e}", packed.display()))?;
    }
    let mut cp = Command::new("cp");
    cp.arg("-r").arg(&dir).arg(&packed);
    run(cp)?;
    println!("packed compute-sanitizer from {dir}");
    Ok(())
}

/// Debian's Vulkan loader and GL packages (amd64) into `.gl/`, once.
fn pack_loader(root: &Path) -> Result<(), String> {
    let gl = root.join(".gl");
    let has_debs = std::fs::read_dir(&gl)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "deb"))
        })
        .unwrap_or(false);
    if has_debs {
        return Ok(());
    }
    std::fs::create_dir_all(&gl).map_err(|e| e.to_string())?;
    std::fs::create_dir_all("/tmp/amd64/partial").map_err(|e| e.to_string())?;
    let apt = |args: &[&str]| {
        let mut apt = Command::new("apt-get");
        apt.args([
            "-oAPT::Architecture=amd64",
            "-oAPT::Architectures=amd64",
            "-oDir::State::Lists=/tmp/amd64",
        ])
        .args(args)
        .current_dir(&gl);
        apt
    };
    run(apt(&["update", "-qq"]))?;
    run(apt(&[
        "download",
        "libvulkan1",
        "libegl1",
        "libglvnd0",
        "libopengl0",
        "libgl1",
        "libglx0",
        "libgles2",
    ]))
}

/// Debian's Khronos validation layer into `.gpu/vvl/`, once.
fn pack_validation_layer(root: &Path) -> Result<(), String> {
    let vvl = root.join(".gpu/vvl");
    let so_name = "libVkLayer_khronos_validation.so";
    let packed = vvl.join(format!("{so_name}.xz"));
    if packed.is_file() {
        return Ok(());
    }
    if !vvl.join(so_name).is_file() {
        download_validation_layer(&vvl, so_name)?;
    }
    // 21 MiB stripped, about a quarter of it compressed: the bundle has a
    // size limit, and run.sh unpacks it (python3's lzma) on the GPU machine.
    let mut xz = Command::new("python3");
    xz.args([
        "-c",
        "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb', preset=6))",
    ])
    .arg(vvl.join(so_name))
    .arg(&packed);
    run(xz)?;
    std::fs::remove_file(vvl.join(so_name)).map_err(|e| e.to_string())
}

/// Debian's layer and its manifest (pointing at the library beside it) into `vvl`.
fn download_validation_layer(vvl: &Path, so_name: &str) -> Result<(), String> {
    let tmp = std::env::temp_dir().join(format!("xtask-vvl-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let mut download = Command::new("apt-get");
    download
        .args(["download", "vulkan-validationlayers"])
        .current_dir(&tmp);
    run(download)?;
    let deb = std::fs::read_dir(&tmp)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download vulkan-validationlayers left no .deb")?;
    let mut unpack = Command::new("dpkg");
    unpack.arg("-x").arg(&deb).arg(tmp.join("x"));
    run(unpack)?;
    let find = |name: &str| {
        find_file(&tmp.join("x"), name).ok_or(format!("no {name} in {}", deb.display()))
    };
    let so = find(so_name)?;
    let json = find("VkLayer_khronos_validation.json")?;
    copy(&so, &vvl.join(so_name))?;
    let mut strip = Command::new("strip");
    strip.arg("--strip-debug").arg(vvl.join(so_name));
    if let Err(e) = run(strip) {
        println!("(not stripped: {e})");
    }
    let text = std::fs::read_to_string(&json).map_err(|e| e.to_string())?;
    write(
        &vvl.join("VkLayer_khronos_validation.json"),
        &point_library_here(&text, so_name),
    )?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// The layer manifest with its `"library_path"` set to `./SO_NAME`.
fn point_library_here(json: &str, so_name: &str) -> String {
    let key = "\"library_path\"";
    let Some(at) = json.find(key) else {
        return json.to_string();
    };
    let after = &json[at + key.len()..];
    let Some(open) = after.find('"') else {
        return json.to_string();
    };
    let Some(len) = after[open + 1..].find('"') else {
        return json.to_string();
    };
    let end = at + key.len() + open + 1 + len + 1;
    format!("{}{key}: \"./{so_name}\"{}", &json[..at], &json[end..])
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_parses_and_names_only_its_binaries() {
        let m = parse_manifest(MANIFEST).unwrap();
        for t in &m.tests {
            let source = t.source_dir().join(format!("{}.rs", t.name));
            assert!(
                crate::workspace_root().join(&source).is_file(),
                "tests.txt names test binary {} but {} does not exist",
                t.name,
                source.display()
            );
        }
        let frames = parse_manifest("test f package=cuda-interop-frames : --x\n").unwrap();
        assert_eq!(frames.tests[0].package, "cuda-interop-frames");
        assert_eq!(
            frames.tests[0].source_dir(),
            PathBuf::from("cuda-interop-frames/tests")
        );
        assert!(!m.sanitized.is_empty());
        assert!(parse_manifest("children nope : x\n")
            .unwrap_err()
            .contains("no `test nope` line"));
        assert!(parse_manifest("test a bogus : \n")
            .unwrap_err()
            .contains("unknown option"));
    }

    /// Every name the manifest skips is a test function somewhere under
    /// `tests/`: a renamed test fails here, before a GPU run.
    #[test]
    fn every_name_in_the_manifest_is_a_test_of_the_workspace() {
        let m = parse_manifest(MANIFEST).unwrap();
        let mut sources = String::new();
        fn read_all(dir: &Path, into: &mut String) {
            for e in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
                let p = e.path();
                if p.is_dir() {
                    read_all(&p, into);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    into.push_str(&std::fs::read_to_string(&p).unwrap());
                }
            }
        }
        read_all(&crate::workspace_root().join("tests"), &mut sources);
        for t in &m.tests {
            read_all(&crate::workspace_root().join(t.source_dir()), &mut sources);
        }
        for (kind, binary, names) in &m.names {
            for name in names {
                assert!(
                    sources.contains(&format!("fn {name}(")),
                    "xtask/gpu/tests.txt: `{kind} {binary}` names {name}, no test under tests/"
                );
            }
        }
    }

    /// Every child-process entry point (`#[test] fn child_*`) of a bundled
    /// test binary is listed as one of its children: an unlisted one runs
    /// on its own on the GPU machine and fails there (run 18b: import's
    /// `child_fake_not_exports`).
    #[test]
    fn every_child_entry_point_of_a_bundled_binary_is_listed() {
        let m = parse_manifest(MANIFEST).unwrap();
        for t in &m.tests {
            let source = std::fs::read_to_string(
                crate::workspace_root()
                    .join(t.source_dir())
                    .join(format!("{}.rs", t.name)),
            )
            .unwrap();
            let lines: Vec<&str> = source.lines().collect();
            let listed: Vec<&String> = m
                .names
                .iter()
                .filter(|(kind, binary, _)| kind == "children" && *binary == t.name)
                .flat_map(|(_, _, names)| names)
                .collect();
            for (i, line) in lines.iter().enumerate() {
                let Some(rest) = line.trim_start().strip_prefix("fn child_") else {
                    continue;
                };
                let is_test = lines[i.saturating_sub(3)..i]
                    .iter()
                    .any(|l| l.trim() == "#[test]");
                let name = format!("child_{}", rest.split('(').next().unwrap_or_default());
                assert!(
                    !is_test || listed.iter().any(|n| **n == name),
                    "xtask/gpu/tests.txt: {name} is a child entry point of {} but no `children {}` line lists it",
                    t.name,
                    t.name
                );
            }
        }
    }

    #[test]
    fn the_layer_manifest_points_at_the_bundled_library() {
        let json = r#"{ "layer": { "name": "V", "library_path": "libVkLayer_khronos_validation.so", "x": 1 } }"#;
        assert_eq!(
            point_library_here(json, "libVkLayer_khronos_validation.so"),
            r#"{ "layer": { "name": "V", "library_path": "./libVkLayer_khronos_validation.so", "x": 1 } }"#
        );
    }

    #[test]
    fn the_runner_reads_the_manifest_it_is_bundled_with() {
        assert!(RUN_SH.contains("manifest=$b/tests.txt"));
        assert!(!RUN_SH.contains("scripts/"));
    }
}
