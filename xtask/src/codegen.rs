//! `cargo xtask codegen`: bindgen over the pinned `cuda.h`, split into
//! `types.rs` (bindgen's types, constants and layout tests) and `fns.rs` (the
//! function table the loader fills), both formatted with rustfmt.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use quote::{format_ident, quote};
use sha2::{Digest, Sha256};

use crate::functions::{CONSTANTS, FUNCTIONS, TYPES};

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

pub fn run(args: &[String]) -> Result<(), String> {
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
    let root = crate::workspace_root();
    let lock = read_lock(&root.join("xtask/cuda-header.lock"))?;
    let header = find_header(&root, &lock, include_dir)?;
    let files = generate(&header, &lock)?;
    ensure_files(&root.join(GENERATED_DIR), &files, check)
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
    let bindings = builder
        .generate()
        .map_err(|e| format!("bindgen failed on {}: {e}", header.display()))?
        .to_string();

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
