//! `cargo xtask codegen`: bindgen over the pinned `cuda.h`, split into
//! `types.rs` (bindgen's types, constants and layout tests) and `fns.rs` (the
//! function table the loader fills), both formatted with rustfmt; and
//! `cargo xtask codegen ptx`, the copy kernels' PTX.
//!
//! # Contract
//!
//! * A binary of its own, which `cargo xtask codegen ARGS` builds and runs
//!   as `cargo run -p xtask-codegen -- ARGS`: bindgen, clang-sys and syn are
//!   compiled only for this task, never before `cargo xtask`'s first line.
//!   It exits 0 on success and 1 after printing `error: ` and what to do.
//! * `codegen [--check] [--cuda-include DIR]` writes (or, with `--check`,
//!   compares and writes nothing) `cuda-interop-sys/src/generated/`, then
//!   checks the PTX files: one per kernel source ([`KERNEL_SOURCES`]:
//!   `cuda-interop/kernels/copy.cu` -> `cuda-interop/src/generated/copy_ptx.rs`,
//!   `convert.cu` -> `convert_ptx.rs`), each with the `// @generated .. DO NOT
//!   EDIT.` fence as its first line and a `// source sha256:` line that is the
//!   SHA-256 of its `.cu`. A `.cu` edited without regenerating fails, saying
//!   to run `cargo xtask codegen ptx --kernel NAME` where nvcc is.
//! * `codegen ptx [--kernel NAME] [--out FILE] [--ptx FILE]` writes the
//!   generated file of every kernel source (or of the one named; `--out`
//!   writes it elsewhere) from its `.cu`: `nvcc -ptx -arch=compute_75 -O3`,
//!   lowered to `.version 7.0` / `.target sm_75` (every instruction the
//!   kernels use is that old, so drivers from CUDA 11.0 on can JIT it),
//!   assembled with `ptxas` for sm_75 and sm_90 to prove the lowered text
//!   valid. Without nvcc it stops and says so. `--ptx FILE` (with
//!   `--kernel`) takes the output of that nvcc command made elsewhere (the
//!   GPU machine has nvcc but no Rust) instead of running nvcc; `ptxas` then
//!   runs only if present, and the output says when it did not. nvcc need
//!   not be a whole toolkit: PyPI's `nvidia-cuda-nvcc`, `nvidia-nvvm`,
//!   `nvidia-cuda-crt` and `nvidia-cuda-runtime` wheels (CUDA 13) in a
//!   virtual environment are enough, with their `nvidia/cu13/bin` on PATH.
//! * `codegen` (and `codegen --check`) also writes (or compares) the C
//!   header of `libcuda_interop`, `cuda-interop-capi/include/cuda_interop.h`,
//!   generated with cbindgen from that crate's source (see `c_header`);
//!   `codegen capi [--check]` does only that.
//! * The list of functions, types and constants stays in
//!   `xtask/src/functions.rs`, the path the generated files name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use quote::{format_ident, quote};
use sha2::{Digest, Sha256};

use crate::functions::{CONSTANTS, FUNCTIONS, TYPES};

mod c_header;

// Kept where it was before this crate existed: the checked-in bindings'
// header tells readers to edit `xtask/src/functions.rs`.
#[path = "../../xtask/src/functions.rs"]
mod functions;

/// The workspace root (this crate lives one level below it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask-codegen lives one level below the workspace root")
        .to_path_buf()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `command`, failing with its exit status.
fn run_command(mut command: Command) -> Result<(), String> {
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

const BINDGEN_VERSION: &str = "0.73.2";
const GENERATED_DIR: &str = "cuda-interop-sys/src/generated";
const GENERATED_FILES: &[&str] = &["fns.rs", "types.rs"];

struct Lock {
    cuda_version: String,
    sha256: String,
    pypi_package: String,
    pypi_version: String,
    wheel_member: String,
}

fn run(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some("ptx") {
        return generate_ptx(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("capi") {
        let check = match &args[1..] {
            [] => false,
            [flag] if flag == "--check" => true,
            other => return Err(format!("codegen capi: unknown arguments {other:?}")),
        };
        return c_header::ensure(&workspace_root(), check);
    }
    let mut check = false;
    let mut include_dir: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--cuda-include" => {
                let dir = it.next().ok_or("--cuda-include needs a directory")?;
                include_dir = Some(PathBuf::from(dir));
            }
            other => return Err(format!("codegen: unknown argument `{other}`")),
        }
    }
    let root = workspace_root();
    // The PTX first: it needs neither the header nor libclang.
    check_kernels_ptx(&root)?;
    // The C header needs neither the CUDA header nor libclang either.
    c_header::ensure(&root, check)?;
    let lock = read_lock(&root.join("xtask/cuda-header.lock"))?;
    let header = find_header(&root, &lock, include_dir)?;
    let files = generate(&header, &lock)?;
    ensure_files(&root.join(GENERATED_DIR), &files, check)
}

/// A CUDA source of the crate's kernels and the checked-in Rust file holding
/// its PTX (one generated file per source).
#[derive(Clone, Copy, Debug)]
struct KernelSource {
    /// What `--kernel` names.
    name: &'static str,
    /// The CUDA source.
    source: &'static str,
    /// Its PTX, generated by `cargo xtask codegen ptx` and checked in.
    generated: &'static str,
    /// The Rust constant holding the PTX.
    constant: &'static str,
    /// The constant's doc line.
    doc: &'static str,
}

/// Every kernel source, in the order `codegen ptx` generates them.
const KERNEL_SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "copy",
        source: "cuda-interop/kernels/copy.cu",
        generated: "cuda-interop/src/generated/copy_ptx.rs",
        constant: "COPY_PTX",
        doc: "PTX of the array <-> linear copy kernels (see `kernels/copy.cu`).",
    },
    KernelSource {
        name: "convert",
        source: "cuda-interop/kernels/convert.cu",
        generated: "cuda-interop/src/generated/convert_ptx.rs",
        constant: "CONVERT_PTX",
        doc: "PTX of the RGBA <-> NV12/P010 colour conversion kernels (see `kernels/convert.cu`).",
    },
];

/// Each kernel source's PTX is generated on a machine with nvcc (none is
/// needed to build) and records the SHA-256 of the source it came from: it
/// is stale when the `.cu` no longer has that hash.
fn check_kernels_ptx(root: &Path) -> Result<(), String> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    for kernel in KERNEL_SOURCES {
        let source = read(&root.join(kernel.source))?;
        let text = String::from_utf8_lossy(&read(&root.join(kernel.generated))?).into_owned();
        check_ptx_text(kernel, &text, &source)?;
        println!(
            "xtask: codegen: {} is fenced and matches {}",
            kernel.generated, kernel.source
        );
    }
    Ok(())
}

/// [`check_kernels_ptx`] on one generated file's `text` and the `source` bytes.
fn check_ptx_text(kernel: &KernelSource, text: &str, source: &[u8]) -> Result<(), String> {
    let generated = kernel.generated;
    let first = text.lines().next().unwrap_or_default();
    if !(first.starts_with("// @generated by ") && first.contains("DO NOT EDIT")) {
        return Err(format!(
            "{generated}: the first line is not the `// @generated by .. DO NOT EDIT.` fence \
             (found `{first}`); run `cargo xtask codegen ptx --kernel {}` on a machine with nvcc \
             instead of editing it",
            kernel.name
        ));
    }
    let hash = sha256_hex(source);
    let recorded = text
        .lines()
        .find_map(|l| l.strip_prefix("// source sha256: "))
        .ok_or_else(|| format!("{generated}: no `// source sha256:` line"))?;
    if recorded.trim() != hash {
        return Err(format!(
            "{generated} is stale: generated from a {} with SHA-256 {}, but it now has {hash}; \
             run `cargo xtask codegen ptx --kernel {}` on a machine with nvcc (or `--ptx FILE` \
             with nvcc's output from one) and commit the result",
            kernel.source,
            recorded.trim(),
            kernel.name,
        ));
    }
    Ok(())
}

/// `cargo xtask codegen ptx [--kernel NAME] [--out FILE] [--ptx FILE]`:
/// every kernel source, or the one named (`--out` and `--ptx` need one).
fn generate_ptx(args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let mut out: Option<PathBuf> = None;
    let mut given: Option<PathBuf> = None;
    let mut named: Option<&KernelSource> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => out = Some(PathBuf::from(it.next().ok_or("--out needs a file")?)),
            "--ptx" => given = Some(PathBuf::from(it.next().ok_or("--ptx needs a file")?)),
            "--kernel" => {
                let name = it.next().ok_or("--kernel needs a name")?;
                named = Some(
                    KERNEL_SOURCES
                        .iter()
                        .find(|k| k.name == name)
                        .ok_or_else(|| {
                            let names: Vec<&str> = KERNEL_SOURCES.iter().map(|k| k.name).collect();
                            format!("codegen ptx: no kernel source `{name}` (one of {names:?})")
                        })?,
                );
            }
            other => return Err(format!("codegen ptx: unknown argument `{other}`")),
        }
    }
    match named {
        Some(kernel) => generate_kernel_ptx(&root, kernel, out, given),
        None if out.is_some() || given.is_some() => {
            Err("codegen ptx: --out and --ptx are for one kernel source: add --kernel NAME".into())
        }
        None => KERNEL_SOURCES
            .iter()
            .try_for_each(|kernel| generate_kernel_ptx(&root, kernel, None, None)),
    }
}

/// Writes `kernel`'s generated file (or `out`) from nvcc's PTX of its
/// source, or from `given` (that PTX made elsewhere).
fn generate_kernel_ptx(
    root: &Path,
    kernel: &KernelSource,
    out: Option<PathBuf>,
    given: Option<PathBuf>,
) -> Result<(), String> {
    let out = out.unwrap_or_else(|| root.join(kernel.generated));
    let source = root.join(kernel.source);
    let source_name = kernel.source;
    let tmp = std::env::temp_dir().join(format!("xtask-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let raw = tmp.join(format!("{}.ptx", kernel.name));
    let nvcc = find_cuda_tool("nvcc");
    let mut version = None;
    match (&given, &nvcc) {
        (Some(ptx), _) => {
            println!(
                "xtask: codegen ptx: taking nvcc's output from {}",
                ptx.display()
            );
            std::fs::copy(ptx, &raw).map_err(|e| format!("cannot read {}: {e}", ptx.display()))?;
        }
        (None, Some(nvcc)) => {
            println!(
                "xtask: codegen ptx: {} -ptx -arch=compute_75 -O3 {source_name}",
                nvcc.display()
            );
            let mut command = Command::new(nvcc);
            command
                .args(["-ptx", "-arch=compute_75", "-O3", "-o"])
                .arg(&raw)
                .arg(&source);
            run_command(command)?;
            let output = Command::new(nvcc)
                .arg("--version")
                .output()
                .map_err(|e| format!("cannot run nvcc --version: {e}"))?;
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            let lines: Vec<&str> = text.lines().collect();
            version = lines.len().checked_sub(2).map(|i| lines[i].to_string());
        }
        (None, None) => {
            return Err(format!(
                "codegen ptx needs nvcc (CUDA 12 or later), and there is none here \
                 (PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin). Run it on a \
                 machine with nvcc, or run `nvcc -ptx -arch=compute_75 -O3 -o {name}.ptx \
                 {source_name}` on one (the GPU machine has nvcc) and then \
                 `cargo xtask codegen ptx --kernel {name} --ptx {name}.ptx` here",
                name = kernel.name
            ))
        }
    }
    let ptx =
        std::fs::read_to_string(&raw).map_err(|e| format!("cannot read {}: {e}", raw.display()))?;
    let lowered = lower_ptx(&ptx);
    std::fs::write(&raw, &lowered).map_err(|e| format!("cannot write {}: {e}", raw.display()))?;
    match find_cuda_tool("ptxas") {
        Some(ptxas) => {
            for arch in ["sm_75", "sm_90"] {
                let mut command = Command::new(&ptxas);
                command
                    .arg(format!("-arch={arch}"))
                    .args(["-o", "/dev/null"])
                    .arg(&raw);
                run_command(command)?;
            }
            println!("xtask: codegen ptx: ptxas accepts the lowered PTX for sm_75 and sm_90");
        }
        None if given.is_some() => {
            println!("xtask: codegen ptx: NOT assembled (no ptxas here): run ptxas -arch=sm_75 and sm_90 on it where CUDA is")
        }
        None => return Err("codegen ptx: nvcc is here but ptxas is not".into()),
    }
    let version = ptx
        .lines()
        .find(|l| l.starts_with("// Cuda compilation tools"))
        .map(|l| l.trim_start_matches("// ").to_string())
        .or(version)
        .unwrap_or_else(|| "nvcc version unknown".into());
    let hash = sha256_hex(
        &std::fs::read(&source).map_err(|e| format!("cannot read {}: {e}", source.display()))?,
    );
    let text = ptx_file(kernel, &lowered, &hash, &version);
    let _ = std::fs::remove_dir_all(&tmp);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::write(&out, &text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("wrote {} ({} bytes)", out.display(), text.len());
    Ok(())
}

/// nvcc's PTX with its `.version` and `.target` lines set to ISA 7.0, sm_75.
fn lower_ptx(ptx: &str) -> String {
    let mut out = String::new();
    for line in ptx.lines() {
        let line = if line.starts_with(".version ") {
            ".version 7.0"
        } else if line.starts_with(".target sm_") {
            ".target sm_75"
        } else {
            line
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The generated Rust file: the fence, the source's hash, the compiler, and
/// the PTX without its comment lines and with no two blank lines in a row.
fn ptx_file(kernel: &KernelSource, ptx: &str, source_sha256: &str, compiler: &str) -> String {
    let mut text = format!(
        "// @generated by `cargo xtask codegen ptx` from {}. DO NOT EDIT.\n\
         // source sha256: {source_sha256}\n\
         // {compiler}\n\
         \n\
         /// {}\n\
         pub(crate) const {}: &str = r#\"\n",
        kernel.source, kernel.doc, kernel.constant
    );
    let mut blank = false;
    for line in ptx.lines().filter(|l| !l.starts_with("//")) {
        if line.is_empty() && blank {
            continue;
        }
        blank = line.is_empty();
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("\"#;\n");
    text
}

/// A CUDA tool from PATH, $CUDA_HOME/bin, $CUDA_PATH/bin or
/// /usr/local/cuda/bin.
fn find_cuda_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(dir) = std::env::var_os(var) {
            dirs.push(PathBuf::from(dir).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn read_lock(path: &Path) -> Result<Lock, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("{}: malformed line `{line}`", path.display()))?;
        map.insert(k.trim().to_string(), v.trim().to_string());
    }
    let mut take = |k: &str| {
        map.remove(k)
            .ok_or_else(|| format!("{}: missing key `{k}`", path.display()))
    };
    Ok(Lock {
        cuda_version: take("cuda_version")?,
        sha256: take("sha256")?,
        pypi_package: take("pypi_package")?,
        pypi_version: take("pypi_version")?,
        wheel_member: take("wheel_member")?,
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A header that matches the lock, or why none was found.
fn find_header(root: &Path, lock: &Lock, explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(dir) = explicit {
        let header = dir.join("cuda.h");
        return verify(&header, lock).map(|()| header);
    }
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    if let Ok(cuda_path) = std::env::var("CUDA_PATH") {
        candidates.push((
            "$CUDA_PATH/include".into(),
            Path::new(&cuda_path).join("include"),
        ));
    }
    let major_minor = {
        let v: u32 = lock.cuda_version.parse().unwrap_or(0);
        format!("cuda-{}.{}", v / 1000, (v % 1000) / 10)
    };
    if let Ok(lib) = pkg_config::Config::new()
        .cargo_metadata(false)
        .env_metadata(false)
        .probe(&major_minor)
    {
        for dir in lib.include_paths {
            candidates.push((format!("pkg-config {major_minor}"), dir));
        }
    }
    candidates.push((
        "/usr/local/cuda/include".into(),
        "/usr/local/cuda/include".into(),
    ));
    for (origin, dir) in candidates {
        let header = dir.join("cuda.h");
        if !header.exists() {
            continue;
        }
        match verify(&header, lock) {
            Ok(()) => {
                eprintln!("codegen: using {} (from {origin})", header.display());
                return Ok(header);
            }
            Err(e) => eprintln!("codegen: skipping {origin}: {e}"),
        }
    }
    fetch_header(root, lock)
}

fn verify(header: &Path, lock: &Lock) -> Result<(), String> {
    let bytes =
        std::fs::read(header).map_err(|e| format!("cannot read {}: {e}", header.display()))?;
    let found = sha256_hex(&bytes);
    if found != lock.sha256 {
        return Err(format!(
            "{} has sha256 {found}, but xtask/cuda-header.lock pins {} (CUDA_VERSION {}); \
             pass the pinned header with --cuda-include, or update the lock deliberately",
            header.display(),
            lock.sha256,
            lock.cuda_version
        ));
    }
    Ok(())
}

/// Downloads the pinned wheel with pip and extracts `cuda.h` from it
/// (a wheel is a zip; Python's zipfile reads it, so no unzip tool is needed).
fn fetch_header(root: &Path, lock: &Lock) -> Result<PathBuf, String> {
    let cache = root.join("target/xtask-cuda-header");
    let header = cache.join("cuda.h");
    if header.exists() && verify(&header, lock).is_ok() {
        return Ok(header);
    }
    std::fs::create_dir_all(&cache)
        .map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    eprintln!(
        "codegen: fetching {}=={} from PyPI for cuda.h",
        lock.pypi_package, lock.pypi_version
    );
    let spec = format!("{}=={}", lock.pypi_package, lock.pypi_version);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args([
            "--platform",
            "manylinux2014_x86_64",
            "--python-version",
            "3.12",
        ])
        .arg("-d")
        .arg(&cache)
        .arg(&spec)
        .status()
        .map_err(|e| format!("cannot run `python3 -m pip` to fetch {spec}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "pip could not download {spec}; pass a directory holding the pinned cuda.h with --cuda-include"
        ));
    }
    let script = format!(
        "import glob,sys,zipfile\n\
         w=sorted(glob.glob(sys.argv[1]+'/*.whl'))[-1]\n\
         open(sys.argv[1]+'/cuda.h','wb').write(zipfile.ZipFile(w).read('{}'))",
        lock.wheel_member
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(&cache)
        .status()
        .map_err(|e| format!("cannot run python3 to unpack the wheel: {e}"))?;
    if !status.success() {
        return Err(format!(
            "could not extract {} from the wheel",
            lock.wheel_member
        ));
    }
    verify(&header, lock)?;
    Ok(header)
}

/// API name -> exported symbol, from `#define cuX cuX_v2` (and the
/// `__CUDA_API_PTDS(cuX_v2)` forms, which expand to the plain name unless
/// per-thread default streams are requested; the first definition is that one).
fn versioned_symbols(header_text: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in header_text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(target), None) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        if !name.starts_with("cu") {
            continue;
        }
        let target = target
            .strip_prefix("__CUDA_API_PTDS(")
            .or_else(|| target.strip_prefix("__CUDA_API_PTSZ("))
            .map(|t| t.trim_end_matches(')'))
            .unwrap_or(target);
        if target.starts_with("cu") && target.chars().all(|c| c.is_alphanumeric() || c == '_') {
            map.entry(name.to_string())
                .or_insert_with(|| target.to_string());
        }
    }
    map
}

fn generate(header: &Path, lock: &Lock) -> Result<Vec<(&'static str, String)>, String> {
    let header_text = std::fs::read_to_string(header)
        .map_err(|e| format!("cannot read {}: {e}", header.display()))?;
    let defines = versioned_symbols(&header_text);
    let symbols: Vec<(&str, String)> = FUNCTIONS
        .iter()
        .map(|api| {
            (
                *api,
                defines
                    .get(*api)
                    .cloned()
                    .unwrap_or_else(|| api.to_string()),
            )
        })
        .collect();

    let mut builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(true)
        .derive_eq(true)
        .generate_comments(false)
        .layout_tests(true)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .rust_target(bindgen::RustTarget::stable(80, 0).map_err(|e| e.to_string())?)
        .formatter(bindgen::Formatter::None);
    for (_, symbol) in &symbols {
        builder = builder.allowlist_function(format!("^{symbol}$"));
    }
    for ty in TYPES {
        builder = builder.allowlist_type(format!("^{ty}$"));
    }
    for c in CONSTANTS {
        builder = builder.allowlist_var(format!("^{c}$"));
    }
    let bindings = generate_naming_libclang(|| {
        builder
            .generate()
            .map(|b| b.to_string())
            .map_err(|e| format!("bindgen failed on {}: {e}", header.display()))
    })?;

    let file: syn::File =
        syn::parse_str(&bindings).map_err(|e| format!("cannot parse bindgen output: {e}"))?;
    let mut type_items = Vec::new();
    let mut fns: BTreeMap<String, syn::ForeignItemFn> = BTreeMap::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(m) => {
                for f in m.items {
                    if let syn::ForeignItem::Fn(f) = f {
                        fns.insert(f.sig.ident.to_string(), f);
                    }
                }
            }
            other => type_items.push(other),
        }
    }

    let preamble = format!(
        "//! @generated by `cargo xtask codegen` from cuda.h (CUDA_VERSION {}, sha256 {}) \
         with bindgen {BINDGEN_VERSION}.\n//! Do not edit by hand: change xtask/src/functions.rs \
         and run `cargo xtask codegen`.\n\n",
        lock.cuda_version, lock.sha256
    );

    let types_tokens = quote! { #(#type_items)* };
    let types_rs = format!("{preamble}{}", rustfmt(&types_tokens.to_string())?);

    let mut fields = Vec::new();
    let mut loads = Vec::new();
    let mut table = Vec::new();
    let mut presence = Vec::new();
    for (api, symbol) in &symbols {
        let f = fns.get(symbol).ok_or_else(|| {
            format!("`{api}` (symbol `{symbol}`) is not declared in the pinned cuda.h")
        })?;
        let field = format_ident!("{}", api);
        let inputs = &f.sig.inputs;
        let output = &f.sig.output;
        let pfn = quote! { Option<unsafe extern "C" fn(#inputs) #output> };
        let doc = format!("`{api}`, resolved as the symbol `{symbol}`.");
        fields.push(quote! { #[doc = #doc] pub #field: #pfn });
        let cstr = proc_macro2::Literal::c_string(
            &std::ffi::CString::new(symbol.as_str()).expect("symbol has no NUL"),
        );
        loads.push(quote! {
            #field: unsafe { core::mem::transmute::<*mut core::ffi::c_void, #pfn>(load(#cstr)) }
        });
        table.push(quote! { (#api, #symbol) });
        presence.push(quote! { (#api, #symbol, self.#field.is_some()) });
    }
    let count = symbols.len();
    let fns_tokens = quote! {
        use crate::types::*;

        /// Every driver function the bindings cover; `None` where the loaded
        /// driver does not export the symbol.
        #[derive(Clone, Copy)]
        pub struct DriverFns { #(#fields,)* }

        /// `(API name, exported symbol)` for every function in [`DriverFns`].
        pub const SYMBOLS: [(&str, &str); #count] = [#(#table,)*];

        impl DriverFns {
            /// Fills the table by asking `load` for each exported symbol.
            ///
            /// # Safety
            /// For each name, `load` must return null or the address of a
            /// function with exactly the C signature `cuda.h` declares for it.
            pub unsafe fn load_with(mut load: impl FnMut(&core::ffi::CStr) -> *mut core::ffi::c_void) -> Self {
                Self { #(#loads,)* }
            }

            /// `(API name, symbol, resolved)` for every function in the table.
            pub fn presence(&self) -> [(&'static str, &'static str, bool); #count] {
                [#(#presence,)*]
            }
        }
    };
    let fns_rs = format!(
        "{preamble}{}",
        add_safety_comments(&rustfmt(&fns_tokens.to_string())?)
    );
    Ok(vec![("fns.rs", fns_rs), ("types.rs", types_rs)])
}

/// `quote!` drops comments, so the `// SAFETY:` line for each transmute in
/// `load_with` is added to the formatted text.
fn add_safety_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 16 * 1024);
    for line in source.lines() {
        let trimmed = line.trim_start();
        if trimmed.ends_with(": unsafe {") && trimmed.starts_with("cu") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push_str(indent);
            out.push_str(
                "// SAFETY: `load` returns null or the address of this symbol, whose C signature the \
                 field spells out; `Option<fn>` uses null as `None`.\n",
            );
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn rustfmt(source: &str) -> Result<String, String> {
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2021", "--emit", "stdout"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run rustfmt (rustup component add rustfmt): {e}"))?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin was piped");
        stdin
            .write_all(source.as_bytes())
            .map_err(|e| format!("cannot feed rustfmt: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("rustfmt failed: {e}"))?;
    if !out.status.success() {
        return Err("rustfmt rejected the generated code".into());
    }
    String::from_utf8(out.stdout).map_err(|e| format!("rustfmt output is not UTF-8: {e}"))
}

/// Writes (or, with `check`, compares) the generated files; also catches
/// stray files in the generated directory.
fn ensure_files(dir: &Path, files: &[(&str, String)], check: bool) -> Result<(), String> {
    let mut stale = Vec::new();
    for (name, contents) in files {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk == *contents {
            continue;
        }
        if check {
            stale.push(format!(
                "{}:\n{}",
                path.display(),
                first_difference(&on_disk, contents)
            ));
        } else {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            std::fs::write(&path, contents)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            eprintln!("codegen: wrote {}", path.display());
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !GENERATED_FILES.contains(&name.as_str()) {
                stale.push(format!(
                    "{}/{name}: not produced by codegen; remove it",
                    dir.display()
                ));
            }
        }
    }
    if stale.is_empty() {
        if check {
            eprintln!("codegen --check: {} is up to date", dir.display());
        }
        Ok(())
    } else {
        Err(format!(
            "generated bindings are stale; run `cargo xtask codegen` and commit:\n\n{}",
            stale.join("\n\n")
        ))
    }
}

fn first_difference(old: &str, new: &str) -> String {
    let old_lines: Vec<&str> = old.lines().collect();
    let new_lines: Vec<&str> = new.lines().collect();
    let n = old_lines.len().max(new_lines.len());
    let mut out = String::new();
    let mut shown = 0;
    for i in 0..n {
        let (a, b) = (old_lines.get(i), new_lines.get(i));
        if a != b {
            let _ = writeln!(out, "  line {}:", i + 1);
            let _ = writeln!(out, "  - {}", a.unwrap_or(&"<missing>"));
            let _ = writeln!(out, "  + {}", b.unwrap_or(&"<missing>"));
            shown += 1;
            if shown == 10 {
                let _ = writeln!(out, "  …");
                break;
            }
        }
    }
    out
}

/// What to do when bindgen cannot load libclang.
const LIBCLANG_FIX: &str = "codegen needs libclang (bindgen loads it at run time): install it \
     (Debian/Ubuntu: apt-get install libclang-dev; Fedora: dnf install clang-devel; macOS: \
     brew install llvm) or set LIBCLANG_PATH to the directory holding libclang.so. Only \
     `cargo xtask codegen` needs it: building and testing the crates does not";

/// Runs bindgen's `generate`, which panics (bindgen's
/// `ensure_libclang_is_loaded`) when libclang cannot be loaded: that panic
/// becomes an error naming what to install, with no backtrace; any other
/// panic is resumed.
fn generate_naming_libclang(
    generate: impl FnOnce() -> Result<String, String>,
) -> Result<String, String> {
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(generate));
    std::panic::set_hook(quiet);
    match result {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if message.contains("libclang") {
                Err(format!("{LIBCLANG_FIX}\n(bindgen: {message})"))
            } else {
                std::panic::resume_unwind(panic)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A bindgen that cannot load libclang panics; codegen answers with what
    /// to install instead of a backtrace, and leaves other panics alone.
    #[test]
    fn a_missing_libclang_is_named_with_what_to_install() {
        let err = super::generate_naming_libclang(|| {
            panic!("Unable to find libclang: \"couldn't find any valid shared libraries\"")
        })
        .unwrap_err();
        assert!(
            err.contains("apt-get install libclang-dev") && err.contains("LIBCLANG_PATH"),
            "{err}"
        );
        assert_eq!(
            super::generate_naming_libclang(|| Ok("x".into())),
            Ok("x".into())
        );
        let other = std::panic::catch_unwind(|| {
            super::generate_naming_libclang(|| panic!("something else"))
        });
        assert!(
            other.is_err(),
            "another panic is not turned into this error"
        );
    }

    use super::*;

    const SOURCE: &[u8] = b"extern \"C\" __global__ void k() {}\n";

    const COPY: &KernelSource = &KERNEL_SOURCES[0];

    fn generated(source: &[u8]) -> String {
        ptx_file(
            COPY,
            &lower_ptx(".version 9.0\n.target sm_90\n\n\n.entry k()\n{\n\tret;\n}\n"),
            &sha256_hex(source),
            "Cuda compilation tools, release 13.0, V13.0.88",
        )
    }

    #[test]
    fn the_ptx_check_accepts_a_file_made_from_this_source() {
        check_ptx_text(COPY, &generated(SOURCE), SOURCE).unwrap();
    }

    #[test]
    fn the_ptx_check_fails_when_the_source_changed() {
        let edited = b"extern \"C\" __global__ void k() { /* edited */ }\n";
        let err = check_ptx_text(COPY, &generated(SOURCE), edited).unwrap_err();
        assert!(err.contains("is stale"), "{err}");
        assert!(err.contains("cargo xtask codegen ptx"), "{err}");
        assert!(err.contains(&sha256_hex(edited)), "{err}");
    }

    #[test]
    fn the_ptx_check_fails_without_the_fence_or_the_hash() {
        let text = generated(SOURCE);
        let unfenced: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
        assert!(check_ptx_text(COPY, &unfenced, SOURCE)
            .unwrap_err()
            .contains("DO NOT EDIT"));
        let unhashed = text.replace("// source sha256:", "// source:");
        assert!(check_ptx_text(COPY, &unhashed, SOURCE)
            .unwrap_err()
            .contains("no `// source sha256:` line"));
    }

    /// Every kernel source has a generated file and a constant of its own.
    #[test]
    fn each_kernel_source_has_its_own_generated_file() {
        for (i, a) in KERNEL_SOURCES.iter().enumerate() {
            assert!(a.source.ends_with(".cu") && a.generated.ends_with("_ptx.rs"));
            for b in &KERNEL_SOURCES[i + 1..] {
                assert!(a.name != b.name && a.source != b.source);
                assert!(a.generated != b.generated && a.constant != b.constant);
            }
        }
        let convert = KERNEL_SOURCES.iter().find(|k| k.name == "convert").unwrap();
        let text = ptx_file(convert, ".version 9.0\n", "00", "nvcc");
        assert!(text.contains("from cuda-interop/kernels/convert.cu. DO NOT EDIT."));
        assert!(text.contains("pub(crate) const CONVERT_PTX: &str"));
        let err = check_ptx_text(convert, &text, SOURCE).unwrap_err();
        assert!(err.contains("--kernel convert"), "{err}");
    }

    #[test]
    fn the_generated_ptx_is_lowered_and_squeezed() {
        let text = generated(SOURCE);
        assert!(text.starts_with("// @generated by `cargo xtask codegen ptx` from cuda-interop/kernels/copy.cu. DO NOT EDIT.\n"));
        assert!(
            text.contains("\n.version 7.0\n.target sm_75\n\n.entry k()\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n\"#;\n"), "{text}");
    }
}
