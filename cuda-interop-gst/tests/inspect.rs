//! `gst-inspect-1.0` finds the plugin file cargo built
//! (`libgstcudainterop.so`, beside this test binary in the target
//! directory's `deps/`) and lists both elements with their caps and
//! properties. Without `gst-inspect-1.0` (package gstreamer1.0-tools) the
//! test fails, saying so.

use std::path::PathBuf;
use std::process::Command;

/// The plugin file cargo built for this test run, copied alone into a
/// fresh directory (a plugin path is scanned whole).
fn plugin_dir() -> tempdir::Dir {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let candidates = [
        deps.join("libgstcudainterop.so"),
        deps.parent().unwrap().join("libgstcudainterop.so"),
    ];
    let built = candidates.iter().find(|p| p.exists()).unwrap_or_else(|| {
        panic!(
            "no libgstcudainterop.so at {candidates:?}: cargo builds it with the tests \
                 (crate-type cdylib); run `cargo build -p cuda-interop-gst`"
        )
    });
    let dir = tempdir::Dir::new("gst-inspect");
    std::fs::copy(built, dir.path.join("libgstcudainterop.so")).expect("copy the plugin");
    dir
}

mod tempdir {
    //! A directory removed on drop.
    use std::path::PathBuf;

    pub struct Dir {
        pub path: PathBuf,
    }

    impl Dir {
        pub fn new(what: &str) -> Dir {
            let path = std::env::temp_dir().join(format!("cif-{what}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("a temporary directory");
            Dir { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `gst-inspect-1.0 --gst-plugin-path=DIR ARGS` with a registry of its own;
/// its stdout.
fn inspect(dir: &tempdir::Dir, what: &str) -> String {
    let registry: PathBuf = dir.path.join("registry.bin");
    let out = Command::new("gst-inspect-1.0")
        .arg(format!("--gst-plugin-path={}", dir.path.display()))
        .arg(what)
        .env("GST_REGISTRY", &registry)
        .env("GST_REGISTRY_FORK", "no")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "gst-inspect-1.0 does not run ({e}): install gstreamer1.0-tools (cargo xtask test \
                 installs it)"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "gst-inspect-1.0 {what}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    stdout
}

#[test]
fn gst_inspect_lists_the_plugin_and_both_elements() {
    let dir = plugin_dir();
    let plugin = inspect(&dir, "cudainterop");
    assert!(plugin.contains("cudainteropsrc"), "{plugin}");
    assert!(plugin.contains("cudainteropsink"), "{plugin}");

    let src = inspect(&dir, "cudainteropsrc");
    for want in [
        "GstPushSrc",
        "SRC template: 'src'",
        "RGBA",
        "BGRA",
        "RGB10A2_LE",
        "GRAY16_LE",
        "NV12",
        "P010_10LE",
        "framerate: 0/1",
        "sender-name",
        "socket",
        "delivery",
        "lossless",
        "timeout",
        "frames-dropped",
        "device-copies",
    ] {
        assert!(src.contains(want), "cudainteropsrc: no {want:?} in\n{src}");
    }

    let sink = inspect(&dir, "cudainteropsink");
    for want in [
        "GstBaseSink",
        "SINK template: 'sink'",
        "RGBA",
        "NV12",
        "P010_10LE",
        "sender-name",
        "timeout",
        "frames-skipped",
        "receivers",
    ] {
        assert!(
            sink.contains(want),
            "cudainteropsink: no {want:?} in\n{sink}"
        );
    }
    assert!(
        !sink.contains("BGRA"),
        "the sink takes buffer rings' formats only:\n{sink}"
    );
}
