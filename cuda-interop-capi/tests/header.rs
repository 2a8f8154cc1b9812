//! The header against the Rust source: every exported function, `CI_*`
//! constant, `ci_status` value and field of a `#[repr(C)]` struct in `src/`
//! appears in `include/cuda_interop.h` (and the header declares no
//! function the source lacks). `cargo xtask codegen --check` proves the
//! header is cbindgen's current output; this test proves that output is
//! complete (cbindgen skips, with only a warning, an item whose type it
//! cannot translate), and runs with the crate's tests.
//!
//! # Contract
//!
//! * A plain text check (no C parser): functions by `NAME(` in the header,
//!   constants by `#define NAME VALUE`, status values by `CI_NAME = N`,
//!   struct fields by name within the struct's `typedef struct NAME {..}`.

use std::path::PathBuf;

fn read(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn source() -> String {
    [
        "src/lib.rs",
        "src/ffi.rs",
        "src/gl_receive.rs",
        "src/handles.rs",
        "src/opened.rs",
        "src/receive.rs",
        "src/vulkan.rs",
        "src/vulkan_receive.rs",
    ]
    .iter()
    .map(|p| read(p))
    .collect::<Vec<_>>()
    .join("\n")
}

/// The names of the `extern "C" fn`s after `#[no_mangle]`.
fn exported_functions(src: &str) -> Vec<String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut names = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != "#[no_mangle]" {
            continue;
        }
        let next = lines.get(i + 1).expect("an item after #[no_mangle]");
        let after = next
            .split("extern \"C\" fn ")
            .nth(1)
            .unwrap_or_else(|| panic!("#[no_mangle] on something else: {next}"));
        names.push(after.split('(').next().unwrap().trim().to_owned());
    }
    names
}

#[test]
fn header_matches_source() {
    let src = source();
    let header = read("include/cuda_interop.h");
    let compact: String = header.split_whitespace().collect::<Vec<_>>().join(" ");

    let functions = exported_functions(&src);
    assert!(functions.len() >= 15, "found only {functions:?}");
    for f in &functions {
        assert!(
            compact.contains(&format!(" {f}(")) || compact.contains(&format!("*{f}(")),
            "{f} is exported but not declared in include/cuda_interop.h: add it"
        );
    }
    // And no declaration without a definition.
    for line in header.lines() {
        if let Some(rest) = line.strip_prefix("enum ci_status ").or_else(|| {
            line.strip_prefix("const char *")
                .or_else(|| line.strip_prefix("uint64_t "))
        }) {
            let name = rest.split('(').next().unwrap().trim();
            assert!(
                functions.iter().any(|f| f == name),
                "the header declares {name}, which src/ does not export: remove it or export it"
            );
        }
    }

    for line in src.lines() {
        let Some(rest) = line.strip_prefix("pub const CI_") else {
            continue;
        };
        let name = format!("CI_{}", rest.split(':').next().unwrap());
        let value = rest.split('=').nth(1).unwrap().trim().trim_end_matches(';');
        assert!(
            compact.contains(&format!("#define {name} {value}u"))
                || compact.contains(&format!("#define {name} {value}")),
            "{name} = {value} is not #defined as that in the header"
        );
    }

    let status = src
        .split("pub enum ci_status {")
        .nth(1)
        .expect("the ci_status enum")
        .split('}')
        .next()
        .unwrap();
    let mut values = 0;
    for line in status.lines().map(str::trim) {
        if line.starts_with("///") || !line.contains(" = ") {
            continue;
        }
        let (variant, n) = line.trim_end_matches(',').split_once(" = ").unwrap();
        let c = format!("{variant} = {n}");
        assert!(compact.contains(&c), "the header's ci_status lacks `{c}`");
        values += 1;
    }
    assert!(values >= 17);

    // #[repr(C)] structs: the same fields, in the same order.
    let mut rest = src.as_str();
    while let Some(at) = rest.find("#[repr(C)]") {
        rest = &rest[at..];
        let Some(decl) = rest.find("pub struct ") else {
            break;
        };
        let after = &rest[decl + "pub struct ".len()..];
        let name = after.split_whitespace().next().unwrap();
        let body = after.split('{').nth(1).unwrap().split('}').next().unwrap();
        let fields: Vec<&str> = body
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("pub "))
            .map(|l| l.split(':').next().unwrap().trim())
            .collect();
        let c_body = header
            .split(&format!("typedef struct {name} {{"))
            .nth(1)
            .unwrap_or_else(|| panic!("the header has no `typedef struct {name} {{`"))
            .split('}')
            .next()
            .unwrap();
        let c_fields: Vec<&str> = c_body
            .lines()
            .map(str::trim)
            .filter(|l| l.ends_with(';'))
            .map(|l| {
                let decl = l.trim_end_matches(';');
                let last = decl.split_whitespace().last().unwrap();
                last.split('[').next().unwrap().trim_start_matches('*')
            })
            .collect();
        assert_eq!(
            fields, c_fields,
            "struct {name}: the header's fields differ"
        );
        rest = &after[1..];
    }
}

#[test]
fn soname_is_the_abi_major_version() {
    let src = source();
    let major = src
        .lines()
        .find_map(|l| l.strip_prefix("pub const CI_ABI_VERSION_MAJOR: u32 = "))
        .expect("CI_ABI_VERSION_MAJOR in src/lib.rs")
        .trim_end_matches(';');
    let build = read("build.rs");
    assert!(
        build.contains(&format!("-soname,libcuda_interop.so.{major}\"")),
        "build.rs's soname is not libcuda_interop.so.{major} (CI_ABI_VERSION_MAJOR): change both \
         together"
    );
}
