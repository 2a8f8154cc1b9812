//! The shared library's soname: `libcuda_interop.so.<ABI major>` (the
//! README's stability rules), so that programs linked against it load
//! only an ABI-compatible library. Keep the number equal to
//! `CI_ABI_VERSION_MAJOR` in `src/lib.rs` (a test checks both).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda_interop.so.0");
    println!("cargo:rerun-if-changed=build.rs");
}
