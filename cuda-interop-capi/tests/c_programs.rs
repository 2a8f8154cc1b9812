//! The C ABI from C: programs in `tests/c/` compiled with the system C
//! compiler against `include/cuda_interop.h` and the crate's staticlib
//! (`libcuda_interop.a`, which cargo builds before these tests), run on
//! lavapipe (or whatever Vulkan driver is there).
//!
//! # Contract
//!
//! * `c_sender_and_c_receiver_by_name`: a C sender and a C receiver, two
//!   processes, find each other by name in a private directory
//!   (`XDG_RUNTIME_DIR`) and pass 30 frames losslessly; the receiver checks
//!   every word of every frame against the sender's fill value.
//! * `c_error_paths`: a C program calls every function with NULL pointers,
//!   freed handles, handles of another kind, values that never were
//!   handles, bad names and arguments, and provokes a timeout, a missing
//!   name and a taken name, checking each status and that the message is
//!   set. It is built with `-fsanitize=address,undefined` (errors fatal)
//!   where the compiler can link that; where it cannot, the test says what
//!   to install and runs it without the sanitizers.
//! * `c_handles_used_and_freed_concurrently`: threads call a sender's
//!   functions while the main thread frees it, and threads free one
//!   context at once: only `CI_OK` or `CI_WRONG_HANDLE`, exactly one free
//!   succeeds (sanitizers as above).
//! * `c_program_against_the_shared_library`: the error-path program linked
//!   against `libcuda_interop.so` runs where only `libcuda_interop.so.0`
//!   (the soname) is on the library path.
//! * `installed_with_pkg_config`: `cargo xtask install-capi` (the test's
//!   profile) into a fresh prefix; `frames.c` built with nothing but
//!   `pkg-config --cflags --libs cuda-interop` (`PKG_CONFIG_PATH` the
//!   prefix's) against the installed header and shared library, run as a
//!   C sender and a named C host receiver (every word of 30 frames
//!   checked) with only the prefix's `lib/` on the library path.
//! * `c_cuda_receiver_gpu` (ignored here; the GPU bundle runs it):
//!   `cuda_recv.c` receives 30 frames of `frames.c`'s sender through the
//!   CUDA receiver, waits on its own `CUstream`, copies the pitched rows
//!   with `cuMemcpy2DAsync` and checks every word; releasing twice is
//!   `CI_WRONG_HANDLE`. `c_cuda_receiver_compiles` keeps it building in CI.
//! * `cpp_app_publishes_its_own_vulkan_image`: `app_publish.cpp`, a C++17
//!   Vulkan application (`<vulkan/vulkan.h>`, `-lvulkan`: the test fails
//!   saying to install `libvulkan-dev` where they are missing), makes its
//!   own instance, device and RGBA8 render target (no external memory),
//!   renders each frame (a clear and a copied pattern) inside
//!   `ci_context_with_queue`, leaves it in `COLOR_ATTACHMENT_OPTIMAL` or
//!   `TRANSFER_SRC_OPTIMAL` (alternately, the layout passed in
//!   `ci_source_image`, a region at an offset), and publishes 64 frames
//!   through `ci_context_new_from_vulkan`, `ci_image_sender_new` and
//!   `ci_sender_present_copy`; a lossless Vulkan receiver in the test's
//!   process (the host receiver refuses image rings) checks every texel of
//!   every frame. The app runs under the sanitizers as above and with its
//!   own validation messenger where the layer is installed.
//! * `cpp_app_writes_opened_slots_in_its_own_submissions`: `app_open.cpp`
//!   writes slots opened with `ci_sender_open` in its own submissions
//!   (waiting for the ready value, signalling its `ci_timeline`) and
//!   presents them with `ci_sender_present_opened` (two open at once, a
//!   junk one abandoned); `vk_recv.c` checks every texel of 64 frames.
//! * `engine_plugin_publishes_the_render_texture`: the engine-plugin
//!   harness. `engine_host.cpp` plays a game engine's native-plugin
//!   Vulkan interface (`engine_harness.h`: each call and how it maps to
//!   Unity's) and loads `engine_plugin.c`, a C plugin (a shared object
//!   with the staticlib) that publishes the engine's render texture (no
//!   external memory) with the engine's command buffer open at the event
//!   (`ci_sender_record_copy`, `ci_sender_present_recorded` after the
//!   engine's fence) and closed (`ci_sender_present_copy` after the
//!   engine's submission): 600 frames at 1080p and 4K each, every texel of
//!   every frame checked by a lossless Vulkan receiver in this process.
//! * No program may cause a Vulkan validation error (the library's
//!   contexts enable the layer where it is installed; errors go to stderr).
//! * `header_compiles_as_cpp`: the header compiles as C++ (where `g++` is).
//! * Nothing depends on timing: the programs' waits are generous bounds,
//!   and a child that outlives [`CHILD_BOUND`] fails the test (killed)
//!   instead of hanging it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a C program may run before the test calls it hung.
const CHILD_BOUND: Duration = Duration::from_secs(300);

/// The crate's directory: where it was built, else `cuda-interop-capi/`
/// of the working directory (the GPU bundle runs from the repository root
/// of another checkout).
fn crate_dir() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("tests/c").is_dir() {
        built
    } else {
        PathBuf::from("cuda-interop-capi")
    }
}

/// `target/<profile>/`, where cargo puts the staticlib.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Builds the staticlib (cargo does not build a library without an rlib
/// before integration tests) with the test's cargo, profile and target
/// directory, once per test binary; its path. `CUDA_INTEROP_CAPI_STATICLIB`
/// names a built one instead (no cargo run).
fn staticlib() -> PathBuf {
    // A machine without cargo (the GPU bundle) names a built one.
    if let Some(lib) = std::env::var_os("CUDA_INTEROP_CAPI_STATICLIB") {
        return PathBuf::from(lib);
    }
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let profile = profile_dir();
    let built = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let target_dir = profile.parent().expect("target/<profile> has a parent");
        let name = profile
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a profile directory name");
        let profile_name = if name == "debug" { "dev" } else { name };
        let output = Command::new(&cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "cuda-interop-capi",
                "--lib",
                "--profile",
            ])
            .arg(profile_name)
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(crate_dir())
            .output()
            .map_err(|e| format!("cannot run {cargo}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`cargo build -p cuda-interop-capi --lib` failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    });
    if let Err(why) = built {
        panic!("{why}");
    }
    let lib = profile.join("libcuda_interop.a");
    assert!(
        lib.exists(),
        "{} is missing: run these tests with `cargo test -p cuda-interop-capi`, which builds it",
        lib.display()
    );
    lib
}

/// A test's scratch directory in CARGO_TARGET_TMPDIR: removed when the test
/// passes (the builds in it run to hundreds of MB, and CI's disk is small),
/// kept for a look when it fails.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("scratch directory kept: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("capi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory in CARGO_TARGET_TMPDIR");
    Scratch(dir)
}

/// A private runtime directory (mode 0700, as discovery wants).
fn runtime_dir(scratch: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch.join("runtime");
    std::fs::create_dir_all(&dir).expect("the runtime directory");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .expect("chmod 0700 the runtime directory");
    dir
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Compiles `tests/c/<source>` into `out` with `flags`, linked with the
/// staticlib; panics with the compiler's output on failure.
fn compile(source: &str, out: &Path, flags: &[&str]) {
    compile_linked(source, out, flags, &[staticlib().into_os_string()]);
}

/// Compiles `tests/c/<source>` into `out` with `flags` and `link`.
fn compile_linked(source: &str, out: &Path, flags: &[&str], link: &[std::ffi::OsString]) {
    let mut cmd = Command::new(cc());
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests/c").join(source))
        .args(link)
        .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lgcc_s", "-lutil"])
        .arg("-o")
        .arg(out);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): install gcc (or set CC)", cc()));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits for `child` within [`CHILD_BOUND`] (killing it past that).
fn finish(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("waitpid").is_some() {
            return child.wait_with_output().expect("the child's output");
        }
        if start.elapsed() > CHILD_BOUND {
            let _ = child.kill();
            let out = child.wait_with_output().expect("the child's output");
            panic!(
                "{what} ran past {CHILD_BOUND:?} (hung) and was killed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(exe: &Path, args: &[&str], runtime: &Path, env: &[(&str, &str)]) -> Child {
    Command::new(exe)
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()))
}

fn assert_success(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {what} stdout:\n{stdout}--- {what} stderr:\n{stderr}");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The contexts enable the validation layer where it is installed (CI's
    // lavapipe has it); its errors go to stderr.
    assert!(
        !stderr.contains("[vulkan validation error]"),
        "{what} caused Vulkan validation errors:\n{stderr}"
    );
}

#[test]
fn c_sender_and_c_receiver_by_name() {
    let dir = scratch("frames");
    let runtime = runtime_dir(&dir);
    let exe = dir.join("frames");
    compile("frames.c", &exe, &[]);
    let name = format!("capi-frames-{}", std::process::id());
    let sender = spawn(&exe, &["send", &name, "30"], &runtime, &[]);
    let receiver = spawn(&exe, &["recv", &name, "30"], &runtime, &[]);
    let received = finish(receiver, "the C receiver");
    let sent = finish(sender, "the C sender");
    assert_success(&received, "the C receiver");
    assert_success(&sent, "the C sender");
    assert!(String::from_utf8_lossy(&received.stdout).contains("30 frames checked"));
}

/// The sanitizer flags, if the compiler can build and run a program with
/// them; else why not.
fn sanitizers(dir: &Path) -> Result<Vec<&'static str>, String> {
    sanitizers_of(&cc(), dir, "probe.c")
}

/// [`sanitizers`] for `compiler`, probed with a program named `probe`
/// (its extension picks the language).
fn sanitizers_of(compiler: &str, dir: &Path, probe: &str) -> Result<Vec<&'static str>, String> {
    let flags = vec![
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
    ];
    let probe = dir.join(probe);
    std::fs::write(&probe, "int main(void) { return 0; }\n").expect("write the probe");
    let exe = dir.join("probe");
    let built = Command::new(compiler)
        .args(&flags)
        .arg(&probe)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "{compiler} cannot link -fsanitize=address,undefined ({}): install libasan and \
             libubsan for it (Debian: `apt-get install libasan8 libubsan1`)",
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    let ran = Command::new(&exe)
        .output()
        .map_err(|e| format!("cannot run the sanitizer probe: {e}"))?;
    if !ran.status.success() {
        return Err(format!(
            "a program built with the sanitizers does not run here ({}): {}",
            ran.status,
            String::from_utf8_lossy(&ran.stderr).trim()
        ));
    }
    Ok(flags)
}

#[test]
fn c_error_paths() {
    let dir = scratch("errors");
    let runtime = runtime_dir(&dir);
    let exe = dir.join("errors");
    let flags = match sanitizers(&dir) {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the error-path program runs WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    compile("errors.c", &exe, &flags);
    let name = format!("capi-errors-{}", std::process::id());
    // The library (Rust) and the Vulkan driver are not instrumented; leak
    // reports would be about the driver's allocations, not the C side's.
    let env = [
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0"),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let out = finish(
        spawn(&exe, &[&name], &runtime, &env),
        "the C error-path program",
    );
    assert_success(&out, "the C error-path program");
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 failures"));
}

#[test]
fn c_handles_used_and_freed_concurrently() {
    let dir = scratch("races");
    let runtime = runtime_dir(&dir);
    let exe = dir.join("races");
    let flags = match sanitizers(&dir) {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the race program runs WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    compile("races.c", &exe, &flags);
    let name = format!("capi-races-{}", std::process::id());
    let env = [
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0"),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let out = finish(spawn(&exe, &[&name], &runtime, &env), "the C race program");
    assert_success(&out, "the C race program");
    assert!(String::from_utf8_lossy(&out.stdout).contains("all held"));
}

#[test]
fn c_program_against_the_shared_library() {
    let dir = scratch("shared");
    let runtime = runtime_dir(&dir);
    staticlib(); // builds the shared library too
    let so = profile_dir().join("libcuda_interop.so");
    // Linked against `libcuda_interop.so`, loadable only as the soname
    // `libcuda_interop.so.0`: running proves the program asks for that.
    let (link_dir, run_dir) = (dir.join("link"), dir.join("run"));
    for (d, file) in [
        (&link_dir, "libcuda_interop.so"),
        (&run_dir, "libcuda_interop.so.0"),
    ] {
        std::fs::create_dir_all(d).expect("a library directory");
        std::os::unix::fs::symlink(&so, d.join(file)).expect("a library symlink");
    }
    let exe = dir.join("errors-shared");
    let link = [
        format!("-L{}", link_dir.display()).into(),
        "-lcuda_interop".into(),
    ];
    compile_linked("errors.c", &exe, &[], &link);
    let name = format!("capi-shared-{}", std::process::id());
    let run_path = run_dir.display().to_string();
    let env = [("LD_LIBRARY_PATH", run_path.as_str())];
    let out = finish(
        spawn(&exe, &[&name], &runtime, &env),
        "the C error-path program (shared library)",
    );
    assert_success(&out, "the C error-path program (shared library)");
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 failures"));
}

#[test]
fn header_compiles_as_cpp() {
    let dir = scratch("cpp");
    let source = dir.join("header.cpp");
    std::fs::write(
        &source,
        "#include \"cuda_interop.h\"\nint main() { return ci_last_error_message() ? 0 : 1; }\n",
    )
    .expect("write the C++ source");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let output = match Command::new(&cxx)
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(crate_dir().join("include"))
        .arg(&source)
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            eprintln!(
                "WARNING: the header was not compiled as C++: cannot run {cxx} ({e}); install g++"
            );
            return;
        }
    };
    assert!(
        output.status.success(),
        "the header does not compile as C++:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn installed_with_pkg_config() {
    let dir = scratch("install");
    let runtime = runtime_dir(&dir);
    let prefix = dir.join("prefix");
    let profile = profile_dir();
    let target_dir = profile.parent().expect("target/<profile> has a parent");
    let profile_name = match profile.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("a profile directory name"),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let installed = Command::new(&cargo)
        .args([
            "run",
            "--quiet",
            "-p",
            "xtask",
            "--",
            "install-capi",
            "--profile",
        ])
        .arg(&profile_name)
        .arg("--prefix")
        .arg(&prefix)
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(crate_dir())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        installed.status.success(),
        "cargo xtask install-capi failed:\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    for file in [
        "lib/libcuda_interop.so.0",
        "lib/libcuda_interop.so",
        "lib/libcuda_interop.a",
        "include/cuda_interop.h",
        "lib/pkgconfig/cuda-interop.pc",
    ] {
        assert!(prefix.join(file).exists(), "{file} was not installed");
    }
    let pkgconfig = prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "cuda-interop"])
        .env("PKG_CONFIG_PATH", &pkgconfig)
        .output();
    let flags = match flags {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout).expect("UTF-8 flags"),
        Ok(out) => panic!(
            "pkg-config --cflags --libs cuda-interop failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("cannot run pkg-config ({e}): install pkg-config"),
    };
    assert!(flags.contains("-lcuda_interop"), "pkg-config said {flags}");
    // Only the installed files: the source's include directory is not on
    // the command line.
    let exe = dir.join("frames-installed");
    let mut cc_cmd = Command::new(cc());
    cc_cmd
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .arg(crate_dir().join("tests/c/frames.c"))
        .args(flags.split_whitespace())
        .arg("-ldl")
        .arg("-o")
        .arg(&exe);
    let built = cc_cmd.output().expect("the C compiler");
    assert!(
        built.status.success(),
        "{cc_cmd:?} failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let lib = prefix.join("lib").display().to_string();
    let env = [("LD_LIBRARY_PATH", lib.as_str())];
    let name = format!("capi-installed-{}", std::process::id());
    let sender = spawn(&exe, &["send", &name, "30"], &runtime, &env);
    let receiver = spawn(&exe, &["recv", &name, "30"], &runtime, &env);
    let received = finish(receiver, "the installed C receiver");
    let sent = finish(sender, "the installed C sender");
    assert_success(&received, "the installed C receiver");
    assert_success(&sent, "the installed C sender");
    assert!(String::from_utf8_lossy(&received.stdout).contains("30 frames checked"));
}

/// The GPU machine's C CUDA receiver: `cuda_recv.c` (libcuda by dlopen)
/// receives 30 frames of `frames.c`'s C sender through
/// `ci_cuda_receiver_*`, waits on its own stream, copies the pitched rows
/// with `cuMemcpy2DAsync` and checks every word; built with the sanitizers
/// where they link (LeakSanitizer off: the CUDA driver's allocations).
#[test]
#[ignore = "needs an NVIDIA GPU whose Vulkan driver exports memory and semaphores (the GPU bundle)"]
fn c_cuda_receiver_gpu() {
    let dir = scratch("cuda-recv");
    let runtime = runtime_dir(&dir);
    let flags = sanitizers(&dir).unwrap_or_default();
    let (sender_exe, receiver_exe) = (dir.join("frames"), dir.join("cuda_recv"));
    compile("frames.c", &sender_exe, &[]);
    compile("cuda_recv.c", &receiver_exe, &flags);
    let name = format!("capi-cuda-{}", std::process::id());
    let env = [
        (
            "ASAN_OPTIONS",
            "detect_leaks=0:abort_on_error=0:protect_shadow_gap=0",
        ),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let sender = spawn(&sender_exe, &["send", &name, "30"], &runtime, &[]);
    let receiver = spawn(&receiver_exe, &[&name, "30"], &runtime, &env);
    let received = finish(receiver, "the C CUDA receiver");
    let sent = finish(sender, "the C sender");
    assert_success(&received, "the C CUDA receiver");
    assert_success(&sent, "the C sender");
    assert!(String::from_utf8_lossy(&received.stdout).contains("30 frames checked"));
}

/// `cuda_recv.c` and `cuda_handoff.c` (the C ABI's CUDA hand-off, timed
/// as `frame_client` times the Rust receiver's, on the GPU machine)
/// compile (sanitizers included) where there is no GPU: the GPU runs'
/// programs are kept building in CI.
#[test]
fn c_cuda_receiver_compiles() {
    let dir = scratch("cuda-recv-build");
    let flags = sanitizers(&dir).unwrap_or_default();
    compile("cuda_recv.c", &dir.join("cuda_recv"), &flags);
    compile("cuda_handoff.c", &dir.join("cuda_handoff"), &flags);
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".into())
}

/// Compiles the C++ program `tests/c/<source>` (C++17) into `out` with
/// `flags`, linked with the staticlib and the Vulkan loader (`-lvulkan`).
/// Fails saying what to install where the C++ compiler, the Vulkan headers
/// or the loader's link library are missing.
fn compile_cxx_vulkan(source: &str, out: &Path, flags: &[&str]) {
    require_vulkan_headers(out.parent().expect("an output directory"));
    let mut cmd = Command::new(cxx());
    cmd.args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests/c").join(source))
        .arg(staticlib())
        .args([
            "-lvulkan",
            "-lpthread",
            "-ldl",
            "-lm",
            "-lrt",
            "-lgcc_s",
            "-lutil",
        ])
        .arg("-o")
        .arg(out);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}): install g++ (or set CXX)", cxx()));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Fails saying what to install where the C++ compiler, the Vulkan headers
/// or the loader's link library are missing (a probe built in `dir`).
fn require_vulkan_headers(dir: &Path) {
    let probe = dir.join("vulkan_probe.cpp");
    std::fs::write(
        &probe,
        "#include <vulkan/vulkan.h>\nint main() { return vkGetInstanceProcAddr ? 0 : 1; }\n",
    )
    .expect("write the Vulkan probe");
    let probed = Command::new(cxx())
        .args(["-std=c++17"])
        .arg(&probe)
        .arg("-lvulkan")
        .arg("-o")
        .arg(dir.join("vulkan_probe"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): install g++ (Debian/Ubuntu: `apt-get install g++`) or set CXX",
                cxx()
            )
        });
    assert!(
        probed.status.success(),
        "the Vulkan headers or the loader's link library are missing ({} cannot build \
         `#include <vulkan/vulkan.h>` with -lvulkan): install libvulkan-dev (Debian/Ubuntu: \
         `apt-get install libvulkan-dev`; `cargo xtask test` installs it)\n{}",
        cxx(),
        String::from_utf8_lossy(&probed.stderr)
    );
}

/// `app_publish.cpp`'s ring and render target (the same constants).
mod app {
    pub const RING_W: u32 = 96;
    pub const RING_H: u32 = 56;
    pub const OFF_X: u32 = 5;
    pub const OFF_Y: u32 = 3;
    pub const SRC_H: u32 = 64;
    pub const PATTERN_ROWS: u32 = SRC_H / 2;
    pub const SLOTS: u32 = 3;
    pub const FRAMES: u64 = 64;

    /// The ring as the receiver checks it.
    pub const RING: super::Ring = super::Ring {
        width: RING_W,
        height: RING_H,
        offset: [OFF_X, OFF_Y],
        pattern_rows: PATTERN_ROWS,
        slots: SLOTS,
    };
}

/// An image ring of RGBA8 frames published by the C++ programs: the
/// region at `offset` of a render target whose rows `[0, pattern_rows)`
/// hold frame `f`'s pattern and the rest its clear colour (`vk_app.hpp`'s
/// `texel`).
#[derive(Clone, Copy, Debug)]
struct Ring {
    width: u32,
    height: u32,
    offset: [u32; 2],
    pattern_rows: u32,
    slots: u32,
}

/// Frame `f`'s texel at `(x, y)` of a render target whose first
/// `pattern_rows` rows hold the pattern (as `vk_app::texel`).
fn texel(f: u64, x: u32, y: u32, pattern_rows: u32) -> [u8; 4] {
    if y < pattern_rows {
        [
            (u64::from(x) * 3 + f) as u8,
            (u64::from(y) * 5 + 2 * f) as u8,
            (x ^ y) as u8,
            (7 * f + 1) as u8,
        ]
    } else {
        // As the C++ programs compute it: modulo 256.
        [
            (f * 11) as u8,
            255u64.wrapping_sub(f) as u8,
            (f * 29 + 3) as u8,
            255,
        ]
    }
}

/// A wrong texel: `(x, y, got, want)`.
type WrongTexel = (u32, u32, [u8; 4], [u8; 4]);

/// The texels of frame `f`'s read-back (the ring's extent, tightly packed)
/// that are not the render target's region: how many, and the first few.
fn wrong_texels(ring: &Ring, pixels: &[u8], f: u64) -> (usize, Vec<WrongTexel>) {
    let mut wrong = (0, Vec::new());
    for y in 0..ring.height {
        for x in 0..ring.width {
            let at = ((y * ring.width + x) * 4) as usize;
            let got: [u8; 4] = pixels[at..at + 4].try_into().expect("4 bytes");
            let want = texel(f, x + ring.offset[0], y + ring.offset[1], ring.pattern_rows);
            if got != want {
                wrong.0 += 1;
                if wrong.1.len() < 8 {
                    wrong.1.push((x, y, got, want));
                }
            }
        }
    }
    wrong
}

/// A Vulkan receiver (a device of its own, the validation layer required
/// unless `CUDA_INTEROP_VALIDATION=off`) of `frames` frames of the image
/// ring `name` in `runtime`'s default directory, lossless: checks every
/// texel of every frame; a summary line.
fn receive_app_frames(runtime: &Path, name: &str, frames: u64, ring: Ring) -> String {
    use cuda_interop_frames::discovery::{Directory, SlotKind};
    use cuda_interop_frames::protocol::Delivery;
    use cuda_interop_frames::session::Session;
    use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
    use vk_export::format::Rgba8Unorm;

    let directory = Directory::new(runtime.join(cuda_interop_frames::discovery::DIRECTORY_NAME))
        .expect("the runtime directory's sender directory");
    // The app builds under the sanitizers and starts its device first.
    let (session, setup) =
        Session::connect_named(&directory, name, Delivery::Lossless, CHILD_BOUND / 2)
            .unwrap_or_else(|e| panic!("the app's sender {name} never answered: {e}"));
    let info = directory.find(name).expect("the app's sender is listed");
    assert_eq!(
        (
            info.kind,
            info.format.as_str(),
            info.width,
            info.height,
            info.slots
        ),
        (
            SlotKind::Image,
            "r8g8b8a8_unorm",
            ring.width,
            ring.height,
            ring.slots
        ),
        "the app's ring as listed"
    );
    let ctx = cuda_interop_testkit::vulkan(None);
    let vrx = VulkanReceiver::<Rgba8Unorm, cuda_interop_testkit::Mem>::new(&ctx, session, setup)
        .expect("the app's image ring imported");
    let mut slots = std::collections::BTreeSet::new();
    for n in 1..=frames {
        let frame = vrx
            .next(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("frame {n}: {e}"));
        assert_eq!(frame.sequence(), n, "lossless: every frame in order");
        let pixels = vrx
            .read_pixels(&frame, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("frame {n}'s read-back: {e}"));
        assert_eq!(
            pixels.len(),
            (ring.width * ring.height * 4) as usize,
            "frame {n}'s bytes"
        );
        let (count, first) = wrong_texels(&ring, &pixels, n);
        assert_eq!(
            count,
            0,
            "frame {n} (slot {}): {count} texels are not the app's; the first \
             (x, y, got, want): {first:?}",
            frame.slot()
        );
        slots.insert(frame.slot());
        vrx.release(frame)
            .unwrap_or_else(|e| panic!("frame {n}'s release: {e}"));
    }
    assert_eq!(
        vrx.session().stats().dropped,
        0,
        "lossless: nothing dropped"
    );
    drop(vrx);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    format!(
        "receiver: {frames} frames of {}x{} checked texel for texel, {} slots seen, \
         no validation error",
        ring.width,
        ring.height,
        slots.len()
    )
}

/// Issue 33's success path: `app_publish.cpp`, a C++17 Vulkan application
/// with its own instance, physical device, device and render target (no
/// external memory), publishes [`app::FRAMES`] frames by name through
/// `ci_context_new_from_vulkan`, `ci_image_sender_new` and
/// `ci_sender_present_copy` (its rendering submitted inside
/// `ci_context_with_queue`; the target left in `COLOR_ATTACHMENT_OPTIMAL`
/// or `TRANSFER_SRC_OPTIMAL`, frame by frame; a region at an offset);
/// a lossless Vulkan receiver in this process checks every texel of every
/// frame. The app runs under ASan/UBSan where they link, with the
/// validation layer where installed (and none of its errors); the receiver
/// with the layer required.
#[test]
fn cpp_app_publishes_its_own_vulkan_image() {
    let dir = scratch("app-publish");
    let runtime = runtime_dir(&dir);
    let exe = dir.join("app_publish");
    let flags = match sanitizers_of(&cxx(), &dir, "probe.cpp") {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the C++ application runs WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    compile_cxx_vulkan("app_publish.cpp", &exe, &flags);
    let name = format!("capi-app-{}", std::process::id());
    let env = [
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0"),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let frames = app::FRAMES.to_string();
    let mut app = Some(spawn(&exe, &[&name, &frames], &runtime, &env));
    let received = {
        let runtime = runtime.clone();
        let name = name.clone();
        std::thread::spawn(move || receive_app_frames(&runtime, &name, app::FRAMES, app::RING))
            .join()
    };
    let summary = match received {
        Ok(summary) => summary,
        Err(panic) => {
            // The app's output says why, where it was the app's fault.
            let mut child = app.take().expect("the app");
            let _ = child.kill();
            let out = child.wait_with_output().expect("the app's output");
            eprintln!(
                "--- the C++ app (killed) stdout:\n{}--- stderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::panic::resume_unwind(panic);
        }
    };
    let out = finish(app.take().expect("the app"), "the C++ app");
    assert_success(&out, "the C++ app");
    println!("{summary}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "app: {} frames published, 0 validation errors",
            app::FRAMES
        )),
        "{stdout}"
    );
}

/// `app_publish.cpp` (C++) publishes its image ring as `capi-TAG-PID`
/// while the C receiver `tests/c/RECEIVER.c` takes and checks
/// `app::FRAMES` frames in a second process, both under ASan/UBSan where
/// they link (a warning says when not); both must succeed. The receiver's
/// output, and the app's.
fn app_and_c_receiver(tag: &str, receiver: &str) -> (Output, Output) {
    app_of_and_c_receiver(tag, "app_publish", receiver, &[])
}

/// As [`app_and_c_receiver`] with the C++ application `tests/c/APP.cpp`
/// and `receiver_ring`, the receiver's arguments after `NAME FRAMES` (its
/// ring when not `app_publish.cpp`'s).
fn app_of_and_c_receiver(
    tag: &str,
    app: &str,
    receiver: &str,
    receiver_ring: &[&str],
) -> (Output, Output) {
    let dir = scratch(tag);
    let runtime = runtime_dir(&dir);
    let app_exe = dir.join(app);
    let recv_exe = dir.join(receiver);
    let cxx_flags = match sanitizers_of(&cxx(), &dir, "probe.cpp") {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the C++ application runs WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    let c_flags = match sanitizers(&dir) {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the C receiver runs WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    compile_cxx_vulkan(&format!("{app}.cpp"), &app_exe, &cxx_flags);
    compile(&format!("{receiver}.c"), &recv_exe, &c_flags);
    let name = format!("capi-{tag}-{}", std::process::id());
    let env = [
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0"),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let frames = app::FRAMES.to_string();
    let app = spawn(&app_exe, &[&name, &frames], &runtime, &env);
    let mut recv_args = vec![name.as_str(), frames.as_str()];
    recv_args.extend_from_slice(receiver_ring);
    let recv = spawn(&recv_exe, &recv_args, &runtime, &env);
    let received = finish(recv, receiver);
    let published = finish(app, "the C++ app");
    assert_success(&received, receiver);
    assert_success(&published, "the C++ app");
    (received, published)
}

/// Issue 33 item 1 from C: `vk_recv.c`, a Vulkan receiver written in C
/// (`ci_vulkan_receiver_*` on a headless context, a second process),
/// receives `app_publish.cpp`'s image ring (a C++ sender through
/// `ci_image_sender_new` and `ci_sender_present_copy`), lossless, and
/// checks every texel of every frame through `ci_vulkan_receiver_read`,
/// each frame's image through `ci_vulkan_receiver_image` (`GENERAL`, owned
/// by `VK_QUEUE_FAMILY_EXTERNAL`, one `VkImage` per slot), and the error
/// paths that need a live receiver and frame (a too-small buffer, a short
/// struct, a released frame, other kinds' handles, a freed receiver). Both
/// under ASan/UBSan where they link, with the validation layer where
/// installed (and none of its errors).
#[test]
fn c_vulkan_receiver_checks_every_texel() {
    let (received, published) = app_and_c_receiver("vk-recv", "vk_recv");
    let stdout = String::from_utf8_lossy(&received.stdout);
    assert!(
        stdout.contains(&format!(
            "vk_recv: {} frames of {}x{} checked texel for texel (0 wrong)",
            app::FRAMES,
            app::RING_W,
            app::RING_H
        )),
        "{stdout}"
    );
    assert!(stdout.contains(" 0 failures"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&published.stdout).contains(&format!(
            "app: {} frames published, 0 validation errors",
            app::FRAMES
        )),
        "the app's summary"
    );
}

/// Issue 33's "a slot written by the application's own submission":
/// `app_open.cpp`, a C++17 Vulkan application with its own device, opens
/// slots of an image ring (`ci_sender_open`: the slot's `VkImage` and the
/// ready semaphore and value), writes each in its own command buffer
/// submitted inside `ci_context_with_queue` (waiting for the ready value,
/// signalling its `ci_timeline`), and publishes it with
/// `ci_sender_present_opened` after that value; two slots open at once
/// every fourth frame (written in reverse, presented in order), a junk
/// slot abandoned every fifth iteration (`ci_sender_abandon_opened`,
/// numbering nothing). `vk_recv.c` (a second process, lossless) checks
/// every texel of every frame. Both under ASan/UBSan where they link, with
/// the validation layer where installed (and none of its errors).
#[test]
fn cpp_app_writes_opened_slots_in_its_own_submissions() {
    let ring = ["96", "56", "0", "0", "28", "3"];
    let (received, published) = app_of_and_c_receiver("app-open", "app_open", "vk_recv", &ring);
    let stdout = String::from_utf8_lossy(&received.stdout);
    print!("{stdout}");
    assert!(
        stdout.contains(&format!(
            "vk_recv: {} frames of 96x56 checked texel for texel (0 wrong)",
            app::FRAMES
        )),
        "{stdout}"
    );
    assert!(stdout.contains(" 0 failures"), "{stdout}");
    let published = String::from_utf8_lossy(&published.stdout);
    print!("{published}");
    assert!(
        published.contains(&format!(
            "app: {} frames written in the app's own submissions, 0 validation errors",
            app::FRAMES
        )),
        "{published}"
    );
}

/// Issue 33 item 4 from C: `gl_recv.c`, an OpenGL receiver written in C (a
/// windowless EGL context of its own, `ci_gl_receiver_*`, a second
/// process), receives `app_publish.cpp`'s image ring, lossless, and checks
/// every texel of every frame's GL texture (read back with
/// `glGetTextureImage`), and the error paths: every call from another
/// thread refused, a NULL loader, a released frame, other kinds' handles,
/// a freed receiver; it prints its wait mode (`ci_gl_receiver_get_wait_mode`,
/// one of the three). Both under ASan/UBSan where they link.
#[test]
fn c_gl_receiver_checks_every_texel() {
    let (received, _) = app_and_c_receiver("gl-recv", "gl_recv");
    let stdout = String::from_utf8_lossy(&received.stdout);
    assert!(
        ["GPU-side wait", "host wait", "frame message"]
            .iter()
            .any(|m| stdout.contains(&format!("gl_recv: wait: {m}\n"))),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "gl_recv: {} frames of {}x{} checked texel for texel through GL textures (0 wrong), \
             0 failures",
            app::FRAMES,
            app::RING_W,
            app::RING_H
        )),
        "{stdout}"
    );
}

/// Builds the engine-plugin harness in `dir`: `engine_host.cpp` (C++17,
/// the Vulkan loader and `dlopen`, not the library) and
/// `engine_plugin.c` as a shared object with the staticlib linked in, both
/// with `flags` (the sanitizers where they link). Their paths.
fn build_engine_harness(dir: &Path, flags: &[&str]) -> (PathBuf, PathBuf) {
    let host = dir.join("engine_host");
    let plugin = dir.join("libengine_plugin.so");
    require_vulkan_headers(dir);
    let tests_c = crate_dir().join("tests/c");
    let mut cmd = Command::new(cxx());
    cmd.args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(tests_c.join("engine_host.cpp"))
        .args(["-lvulkan", "-ldl"])
        .arg("-o")
        .arg(&host);
    let out = cmd.output().expect("the C++ compiler");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new(cc());
    cmd.args([
        "-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-shared", "-fPIC",
    ])
    .args(flags)
    .arg("-I")
    .arg(crate_dir().join("include"))
    .arg(tests_c.join("engine_plugin.c"))
    .arg(staticlib())
    .args(["-lpthread", "-ldl", "-lm", "-lrt", "-lgcc_s", "-lutil"])
    .arg("-o")
    .arg(&plugin);
    let out = cmd.output().expect("the C compiler");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (host, plugin)
}

/// One run of the harness: the engine renders `frames` frames of
/// `width` x `height` and its plugin publishes each (`mode`: `record` into
/// the engine's open command buffer, or `submit` after the engine flushed
/// it); a lossless Vulkan receiver in this process checks every texel of
/// every frame. Returns the receiver's summary and the engine's output.
fn engine_run(
    host: &Path,
    plugin: &Path,
    runtime: &Path,
    (width, height): (u32, u32),
    frames: u64,
    mode: &str,
) -> (String, String) {
    let name = format!("capi-engine-{mode}-{width}-{}", std::process::id());
    let env = [
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0"),
        ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
    ];
    let args = [
        plugin.to_str().expect("a UTF-8 path"),
        &name,
        &width.to_string(),
        &height.to_string(),
        &frames.to_string(),
        mode,
    ];
    let mut engine = Some(spawn(host, &args, runtime, &env));
    let ring = Ring {
        width,
        height,
        offset: [0, 0],
        pattern_rows: height / 2,
        slots: 4,
    };
    let received = {
        let runtime = runtime.to_path_buf();
        std::thread::spawn(move || receive_app_frames(&runtime, &name, frames, ring)).join()
    };
    let summary = match received {
        Ok(summary) => summary,
        Err(panic) => {
            let mut child = engine.take().expect("the engine");
            let _ = child.kill();
            let out = child.wait_with_output().expect("the engine's output");
            eprintln!(
                "--- the engine (killed) stdout:\n{}--- stderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::panic::resume_unwind(panic);
        }
    };
    let out = finish(engine.take().expect("the engine"), "the engine");
    assert_success(&out, "the engine");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains(&format!(
            "engine_host: {frames} frames rendered, 0 validation errors"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("engine_plugin: presented {frames} (")),
        "{stdout}"
    );
    (summary, stdout)
}

/// Frames per run of the harness (the 600).
const ENGINE_FRAMES: u64 = 600;

/// Issue 33 item 3, the engine path: `engine_host.cpp` plays a game
/// engine's native-plugin Vulkan interface (`engine_harness.h`: its own
/// instance, device, queue and frame command buffers, a render texture
/// made without external memory, a publish event at the end of each
/// frame) and loads `engine_plugin.c`, a C plugin that publishes the
/// render texture through the C ABI. With the engine's command buffer open
/// at the event (`record`: `ci_sender_record_copy` into it, frames
/// presented with `ci_sender_present_recorded` once the engine's fence says
/// they ran) and closed (`submit`: the engine flushed it,
/// `ci_sender_present_copy` on its queue), at 1080p and 4K, 600 frames
/// each; and with the plugin's own commands writing the slot in the open
/// command buffer (`own`: `ci_sender_record_into`) at 1080p: a lossless Vulkan receiver in this process checks every texel of
/// every frame; the engine and the plugin under ASan/UBSan where they link,
/// with the validation layer where installed and none of its errors.
#[test]
fn engine_plugin_publishes_the_render_texture() {
    let dir = scratch("engine");
    let runtime = runtime_dir(&dir);
    let flags = match sanitizers_of(&cxx(), &dir, "probe.cpp") {
        Ok(flags) => flags,
        Err(why) => {
            eprintln!("WARNING: the engine and its plugin run WITHOUT sanitizers: {why}");
            Vec::new()
        }
    };
    let (host, plugin) = build_engine_harness(&dir, &flags);
    // `own`: the plugin's own commands write the slot
    // (`ci_sender_record_into`), in the open command buffer, at 1080p.
    let runs = [(1920, 1080), (3840, 2160)]
        .into_iter()
        .flat_map(|size| [(size, "record"), (size, "submit")])
        .chain([((1920, 1080), "own")]);
    for (size, mode) in runs {
        {
            let start = Instant::now();
            let (summary, stdout) = engine_run(&host, &plugin, &runtime, size, ENGINE_FRAMES, mode);
            let plugin_line = stdout
                .lines()
                .find(|l| l.starts_with("engine_plugin: presented"))
                .unwrap_or_default();
            println!(
                "engine {mode} {}x{}: {summary}; {plugin_line} ({:.1} s)",
                size.0,
                size.1,
                start.elapsed().as_secs_f64()
            );
        }
    }
}
