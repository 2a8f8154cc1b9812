//! The examples' command lines (issue 21): each answers `--help` with its
//! usage (exit 0, before doing anything else) and refuses a misspelt flag
//! with the usage on stderr (exit 2), instead of ignoring it.
//!
//! The examples are looked for next to this test binary (`target/<profile>/
//! examples/`): `cargo test --workspace` (what `cargo xtask test` runs) builds
//! every package's examples before the tests run; one not built is named in
//! the output as NOT CHECKED (this package's own must be there). A run
//! filtered with `--test examples_cli` builds no example: it checks the ones
//! built last.

use std::path::PathBuf;
use std::process::Command;

/// (example, the package that builds it, a misspelt flag).
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("wire_seeds", "cuda-interop-tests", "--corpsu"),
    ("wire_reach", "cuda-interop-tests", "--recieve"),
    ("round_trip", "cuda-interop", "--bnech"),
    ("driver_info", "cuda-interop-sys", "--verbose"),
    ("frame_server", "cuda-interop-frames", "--slot"),
    ("frame_client", "cuda-interop-frames", "--frame"),
    ("wgpu_to_cuda", "cuda-interop-wgpu", "--frmes"),
    ("own_device", "vk-export", "--devcie"),
    ("wgpu_frames", "cuda-interop-wgpu", "--frame"),
    ("renderer", "cuda-interop-frames", "--fromat"),
    ("vulkan_client", "cuda-interop-frames", "--loseless"),
];

fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/examples_cli-HASH -> target/<profile>/examples
    exe.parent().unwrap().parent().unwrap().join("examples")
}

#[test]
fn every_example_answers_help_and_refuses_a_misspelt_flag() {
    let dir = examples_dir();
    let mut not_built = Vec::new();
    for (name, package, typo) in EXAMPLES {
        let path = dir.join(name);
        if !path.is_file() {
            assert_ne!(
                *package, "cuda-interop-tests",
                "{name} is built with these tests"
            );
            not_built.push(format!("{name} ({package})"));
            continue;
        }
        let help = Command::new(&path).arg("--help").output().unwrap();
        let out = String::from_utf8_lossy(&help.stdout);
        assert_eq!(help.status.code(), Some(0), "{name} --help: {out}");
        assert!(
            out.starts_with(&format!("usage: {name}")),
            "{name} --help: {out}"
        );
        let wrong = Command::new(&path).arg(typo).output().unwrap();
        let err = String::from_utf8_lossy(&wrong.stderr);
        assert_eq!(wrong.status.code(), Some(2), "{name} {typo}: {err}");
        assert!(
            err.contains(&format!("unknown argument {typo:?}")) && err.contains("usage: "),
            "{name} {typo}: {err}"
        );
        assert!(
            wrong.stdout.is_empty(),
            "{name} {typo} ran: {}",
            String::from_utf8_lossy(&wrong.stdout)
        );
        println!("{name}: --help and {typo} answered");
    }
    if !not_built.is_empty() {
        println!(
            "NOT CHECKED (not built next to this test; cargo test --workspace builds them): {}",
            not_built.join(", ")
        );
    }
}

/// The flags an example's usage names, each with its value if it takes one:
/// `[--width 1920]` -> ("--width", Some("1920")), `[--image [--image-format
/// rgba8|rgba16f]]` -> ("--image", None), ("--image-format", Some(..)).
fn flags_of_usage(usage: &str) -> Vec<(String, Option<String>)> {
    let tokens: Vec<&str> = usage.split_whitespace().collect();
    let clean = |t: &str| t.trim_matches(|c| c == '[' || c == ']').to_string();
    let mut flags = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let flag = clean(token);
        if !flag.starts_with("--") || flag == "--help" {
            continue;
        }
        let value = tokens
            .get(i + 1)
            .filter(|next| !token.ends_with(']') && !next.starts_with(['[', '|', '-']))
            .map(|next| clean(next));
        flags.push((flag, value));
    }
    flags
}

/// Every flag an example's usage names is one its argument check accepts:
/// `EXAMPLE FLAG [VALUE] --help` answers the help (exit 0), where a flag
/// the check does not know would be refused first (exit 2). (Two merges
/// once left `--name`, `--list` and `--image` out of the frame examples'
/// checks while their usage and code used them.)
#[test]
fn every_flag_in_an_examples_usage_is_accepted() {
    let dir = examples_dir();
    assert_eq!(
        flags_of_usage("usage: x [--a 1] [--b] [--c [--d e|f]] [--g G | --h H]"),
        [
            ("--a".to_string(), Some("1".to_string())),
            ("--b".to_string(), None),
            ("--c".to_string(), None),
            ("--d".to_string(), Some("e|f".to_string())),
            ("--g".to_string(), Some("G".to_string())),
            ("--h".to_string(), Some("H".to_string())),
        ]
    );
    for (name, _, _) in EXAMPLES {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let help = Command::new(&path).arg("--help").output().unwrap();
        let usage = String::from_utf8_lossy(&help.stdout).into_owned();
        // The synopsis: the usage up to its first blank line.
        let synopsis = usage.split("\n\n").next().unwrap_or_default();
        let flags = flags_of_usage(synopsis);
        for (flag, value) in &flags {
            let mut run = Command::new(&path);
            run.arg(flag);
            if let Some(v) = value {
                run.arg(v);
            }
            let out = run.arg("--help").output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{name} {flag} {value:?} --help: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        println!("{name}: {} flags of its usage accepted", flags.len());
    }
}

/// Runs example `name` (built next to these tests) with `args` and the
/// environment `env`, requires exit 0, prints and returns its stdout;
/// `None` (said) where it is not built.
fn run_example(name: &str, args: &[&str], env: &[(&str, &std::path::Path)]) -> Option<String> {
    let path = examples_dir().join(name);
    if !path.is_file() {
        println!(
            "NOT CHECKED: {name} is not built next to this test (cargo test --workspace builds it)"
        );
        return None;
    }
    let mut command = Command::new(&path);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{name} {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{stdout}");
    Some(stdout)
}

/// The bring-your-own-device example runs whole here (lavapipe, validation
/// layer on the test's machine or not: the example asks for none): an ash
/// device wrapped by `Context::from_raw`, an image exported, cleared, read
/// and written, every texel checked, torn down in order.
#[test]
fn own_device_wraps_an_application_device_and_checks_every_texel() {
    if let Some(stdout) = run_example("own_device", &[], &[]) {
        assert!(stdout.contains("every texel checked"), "{stdout}");
        assert!(stdout.trim_end().ends_with("own_device: ok"), "{stdout}");
    }
}

/// wgpu writing a frame sender's slots (`WriteSlot::open` / `present`),
/// received by a Vulkan receiver on its own device, runs whole here
/// (lavapipe, small frames): every pixel of every frame checked, 0
/// validation errors.
#[test]
fn wgpu_frames_sends_wgpu_rendered_frames_every_pixel_checked() {
    let args = ["--frames", "12", "--width", "64", "--height", "48"];
    if let Some(stdout) = run_example("wgpu_frames", &args, &[]) {
        assert!(
            stdout.contains("PASS: 12 frames x 64x48 pixels"),
            "{stdout}"
        );
    }
}

/// The `from_raw` renderer (its own ash device, its own command buffers
/// writing the slots between `open` and `present`) publishes by name, and
/// the Vulkan receiver example on a device of its own checks every pixel
/// of every frame it takes, lossless and latest, in RGBA8, RGBA16F and
/// RGBA8 sRGB (a `usage::Sampled` ring: the encoded bytes, the RGBA8
/// pattern's) (lavapipe: host-visible slots, no semaphores).
#[test]
fn the_renderer_publishes_by_name_to_vulkan_receivers_every_pixel_checked() {
    let (renderer, client) = (
        examples_dir().join("renderer"),
        examples_dir().join("vulkan_client"),
    );
    if !renderer.is_file() || !client.is_file() {
        println!("NOT CHECKED: renderer or vulkan_client is not built next to this test (cargo test --workspace builds them)");
        return;
    }
    for format in ["rgba8", "rgba16f", "rgba8-srgb"] {
        let runtime =
            std::env::temp_dir().join(format!("cif-renderer-{}-{format}", std::process::id()));
        let _ = std::fs::remove_dir_all(&runtime);
        std::fs::create_dir_all(&runtime).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The renderer's own run time bounds it (and so every read of its
        // output below); announced, its socket listens (the line comes
        // after it does).
        let args = [
            "--width",
            "64",
            "--height",
            "48",
            "--format",
            format,
            "--seconds",
            "120",
        ];
        let (mut server, lines, mut log) = start_announcing(&renderer, &args, "renderer", &runtime);
        for mode in [&["--lossless"][..], &[][..]] {
            let mut args = vec!["--name", "renderer", "--frames", "15", "--host-visible"];
            args.extend(mode);
            let stdout = run_example("vulkan_client", &args, &[("XDG_RUNTIME_DIR", &runtime)])
                .expect("built: checked above");
            assert!(
                stdout.contains("15 frames (15 checked, every pixel, 0 bad)"),
                "{stdout}"
            );
        }
        let _ = server.kill();
        for line in lines {
            log += &line.unwrap();
            log.push('\n');
        }
        server.wait().unwrap();
        assert!(log.contains("(Context::from_raw)"), "{log}");
        assert_eq!(log.matches(" connected").count(), 2, "{log}");
        std::fs::remove_dir_all(&runtime).unwrap();
    }
}

/// A private runtime directory for one test's senders (their names are
/// then the test's own).
fn runtime_dir(tag: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let runtime = std::env::temp_dir().join(format!("cif-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime);
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    runtime
}

/// `frame_server` with `args` in `runtime`, once it announced `name`: the
/// process, the rest of its stdout, and what it printed so far. `None`
/// (said) where it is not built.
fn start_frame_server(
    name: &str,
    args: &[&str],
    runtime: &std::path::Path,
) -> Option<(
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    String,
)> {
    let path = examples_dir().join("frame_server");
    if !path.is_file() {
        println!("NOT CHECKED: frame_server is not built next to this test (cargo test --workspace builds it)");
        return None;
    }
    let mut named = vec!["--name", name];
    named.extend(args);
    Some(start_announcing(&path, &named, name, runtime))
}

/// `frame_server` `name` with `args` (which make it wait for its one
/// receiver) in `runtime`, and `vulkan_client` taking `frames` of it
/// lossless: what the server printed and how it exited, and the client's
/// output (`None`, said, where the client is not built). `None` (said)
/// where the server is not built.
fn frame_server_to_vulkan_client(
    name: &str,
    args: &[&str],
    runtime: &std::path::Path,
    frames: &str,
) -> Option<(
    String,
    std::process::ExitStatus,
    Option<std::process::Output>,
)> {
    let (mut server, lines, mut log) = start_frame_server(name, args, runtime)?;
    let client_path = examples_dir().join("vulkan_client");
    let client = match client_path.is_file() {
        true => Some(
            Command::new(&client_path)
                .args(["--name", name, "--frames", frames, "--lossless"])
                .env("XDG_RUNTIME_DIR", runtime)
                .output()
                .unwrap(),
        ),
        false => {
            println!("NOT CHECKED: vulkan_client is not built next to this test (cargo test --workspace builds it)");
            None
        }
    };
    for line in lines {
        log += &line.unwrap();
        log.push('\n');
    }
    let status = server.wait().unwrap();
    let _ = server.kill();
    print!("{log}");
    if let Some(client) = &client {
        print!("{}", String::from_utf8_lossy(&client.stdout));
    }
    Some((log, status, client))
}

/// The client's stdout, after requiring it exited 0.
fn succeeded(client: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&client.stdout).into_owned();
    assert_eq!(
        client.status.code(),
        Some(0),
        "vulkan_client: {stdout}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    stdout
}

/// The sender example `exe` (`frame_server`, `renderer`) with `args` in
/// `runtime`, once it announced `name`: the process, the rest of its
/// stdout, and what it printed so far. Its run time (an argument of every
/// caller) bounds the reads.
fn start_announcing(
    exe: &std::path::Path,
    args: &[&str],
    name: &str,
    runtime: &std::path::Path,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    String,
) {
    use std::io::BufRead;
    let mut server = Command::new(exe)
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let mut log = String::new();
    loop {
        let Some(line) = lines.next() else {
            let status = server.wait().unwrap();
            panic!("{exe:?} exited ({status}) before announcing itself: {log}");
        };
        let line = line.unwrap();
        log += &line;
        log.push('\n');
        if line.contains(&format!("announced as {name:?}")) {
            return (server, lines, log);
        }
    }
}

/// Runs example `name` with `args` in `runtime`, requires it to fail with
/// exit status `code`, and returns its stderr; `None` where it is not built
/// (said), or where it succeeded and `may_succeed` (a device that has what
/// the refusal is about).
fn run_refused(
    name: &str,
    args: &[&str],
    runtime: &std::path::Path,
    code: i32,
    may_succeed: bool,
) -> Option<String> {
    let path = examples_dir().join(name);
    if !path.is_file() {
        println!(
            "NOT CHECKED: {name} is not built next to this test (cargo test --workspace builds it)"
        );
        return None;
    }
    let out = Command::new(&path)
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if may_succeed && out.status.success() {
        println!("{name} {args:?} ran: this device has it");
        return None;
    }
    assert_eq!(out.status.code(), Some(code), "{name} {args:?}: {stderr}");
    println!("{name} {args:?} refused: {stderr}");
    Some(stderr)
}

/// The frame examples' `--help` gives every option of its synopsis one
/// line of its own (what it does and its default), after the synopsis.
#[test]
fn the_frame_examples_help_has_a_line_per_option() {
    for name in ["frame_server", "frame_client", "renderer", "vulkan_client"] {
        let path = examples_dir().join(name);
        if !path.is_file() {
            println!("NOT CHECKED: {name} is not built next to this test");
            continue;
        }
        let help = Command::new(&path).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let (synopsis, rest) = help.split_once("\n\n").unwrap_or((&help, ""));
        let flags = flags_of_usage(synopsis);
        assert!(flags.len() >= 5, "{name}: {help}");
        for (flag, _) in &flags {
            let lines: Vec<&str> = rest
                .lines()
                .filter(|l| {
                    let l = l.trim_start().trim_start_matches('[');
                    l.strip_prefix(flag.as_str())
                        .is_some_and(|after| after.starts_with([' ', ']']))
                })
                .collect();
            assert_eq!(lines.len(), 1, "{name} {flag}: {help}");
            assert!(
                lines[0]
                    .split("  ")
                    .filter(|s| !s.trim().is_empty())
                    .count()
                    >= 2,
                "{name} {flag} has no description: {help}"
            );
        }
        println!("{name}: {} options, one line each", flags.len());
    }
}

/// The lavapipe pair of `frame_server`'s docs: the sender waits for one
/// receiver, chooses memory and timelines from the device (and says so),
/// the Vulkan client takes 60 frames lossless with every pixel checked, and
/// the sender stops once it left.
#[test]
fn frame_server_waits_for_a_vulkan_client_that_checks_every_pixel() {
    let runtime = runtime_dir("pair");
    let args = [
        "--image",
        "rgba8",
        "--width",
        "64",
        "--height",
        "48",
        "--frames",
        "120",
        "--wait-for-receivers",
        "1",
        "--wait-timeout",
        "60",
        "--seconds",
        "60",
    ];
    let Some((mut server, lines, mut log)) = start_frame_server("cam", &args, &runtime) else {
        return;
    };
    assert!(log.contains("[frame_server] chose on "), "{log}");
    let client = ["--name", "cam", "--frames", "60", "--lossless"];
    let stdout = run_example("vulkan_client", &client, &[("XDG_RUNTIME_DIR", &runtime)]);
    for line in lines {
        log += &line.unwrap();
        log.push('\n');
    }
    let status = server.wait().unwrap();
    print!("{log}");
    if let Some(stdout) = stdout {
        assert!(
            stdout.contains("60 frames (60 checked, every pixel, 0 bad)"),
            "{stdout}"
        );
        assert!(status.success(), "{log}");
        assert!(
            log.contains("waiting up to 60.0 s for 1 receiver(s)"),
            "{log}"
        );
        assert!(
            log.contains(" left after ") && log.contains(" done: "),
            "{log}"
        );
    }
    let _ = server.kill();
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// `--with-depth --color-part-only`: the same renderer and copies for the
/// colour part alone (the baseline of issue 31's frame-rate goal), a ring
/// of one part, every texel checked by the Vulkan client.
#[test]
fn with_depth_color_part_only_is_a_one_part_ring() {
    let runtime = runtime_dir("depth-color");
    let args = [
        "--width",
        "64",
        "--height",
        "48",
        "--with-depth",
        "--color-part-only",
        "--frames",
        "60",
        "--wait-for-receivers",
        "1",
        "--seconds",
        "60",
    ];
    if let Some((log, status, client)) =
        frame_server_to_vulkan_client("color1", &args, &runtime, "20")
    {
        assert!(log.contains("3 slots of 64x48 color images each"), "{log}");
        if let Some(client) = client {
            let stdout = succeeded(&client);
            assert!(
                stdout.contains("20 frames (20 checked, every texel of every part, 0 bad)"),
                "{stdout}"
            );
            assert!(status.success(), "{log}");
        }
    }
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// `--with-depth --parts 2 --concurrent-targets --render-once`: a ring of
/// colour and depth, the application's images `CONCURRENT` where the
/// context has a transfer family of its own (lavapipe has one family: the
/// images stay `EXCLUSIVE`), every texel of both parts checked by the
/// Vulkan client; rendered once, so every frame carries frame 1's pattern,
/// which the client reports as wrong for every frame after the first.
/// `--render-clears` (clears and a band copy) and `--depth-through-buffer`
/// draw the same pattern: every texel checked too.
#[test]
fn with_depth_parts_and_measurement_knobs() {
    let runtime = runtime_dir("depth-parts");
    for (name, extra, frames_ok) in [
        ("parts2", &["--concurrent-targets"][..], true),
        ("once2", &["--render-once"][..], false),
        ("clears2", &["--render-clears"][..], true),
        ("buffer2", &["--depth-through-buffer"][..], true),
    ] {
        let mut args = vec![
            "--width",
            "64",
            "--height",
            "48",
            "--with-depth",
            "--parts",
            "2",
            "--frames",
            "60",
            "--wait-for-receivers",
            "1",
            "--seconds",
            "60",
        ];
        args.extend_from_slice(extra);
        let Some((log, _, client)) = frame_server_to_vulkan_client(name, &args, &runtime, "20")
        else {
            break;
        };
        assert!(
            log.contains("3 slots of 64x48 color + depth images each"),
            "{log}"
        );
        assert!(
            log.contains("per frame: waiting for a slot median"),
            "{log}"
        );
        let Some(client) = client else { continue };
        let stdout = String::from_utf8_lossy(&client.stdout);
        if frames_ok {
            assert!(
                stdout.contains("20 frames (20 checked, every texel of every part, 0 bad)"),
                "{stdout}"
            );
        } else {
            // Frame 1's pattern in every frame: the check sees it.
            assert!(!client.status.success(), "{stdout}");
            assert!(!stdout.contains(", 0 bad)"), "{stdout}");
        }
    }
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// The `--with-depth` knobs are refused without it, and `--parts` outside
/// 1 to 3, with what to pass.
#[test]
fn with_depth_knobs_are_refused_where_they_mean_nothing() {
    let path = examples_dir().join("frame_server");
    if !path.is_file() {
        println!("NOT CHECKED: frame_server is not built next to this test");
        return;
    }
    for (args, says) in [
        (&["--parts", "2"][..], "are --with-depth options"),
        (&["--render-once"][..], "are --with-depth options"),
        (&["--concurrent-targets"][..], "are --with-depth options"),
        (&["--depth-through-buffer"][..], "are --with-depth options"),
        (&["--render-clears"][..], "are --with-depth options"),
        (
            &["--with-depth", "--parts", "4"][..],
            "--parts 4: give 1, 2 or 3",
        ),
        (
            &["--with-depth", "--parts", "0"][..],
            "--parts 0: give 1, 2 or 3",
        ),
    ] {
        let out = Command::new(&path).args(args).output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?}: {said}");
        assert!(said.contains(says), "{args:?}: {said}");
    }
}

/// `--with-depth` (issue 31 item 5): `frame_server` and the `from_raw`
/// renderer each publish colour + depth + segmentation frames (a
/// multi-image ring; the depth a `D32_SFLOAT` attachment copied into an
/// `R32_SFLOAT` part), and the Vulkan client checks every texel of every
/// part of every frame it takes (lavapipe: host-visible, no semaphores).
#[test]
fn with_depth_senders_to_a_vulkan_client_every_texel_of_every_part_checked() {
    let size = ["--width", "64", "--height", "48", "--with-depth"];
    // frame_server, waiting for its one receiver.
    let runtime = runtime_dir("depth");
    let mut args = size.to_vec();
    args.extend([
        "--frames",
        "120",
        "--wait-for-receivers",
        "1",
        "--seconds",
        "60",
    ]);
    if let Some((log, status, client)) = frame_server_to_vulkan_client("sim", &args, &runtime, "40")
    {
        assert!(
            log.contains("3 slots of 64x48 color + depth + segmentation images each"),
            "{log}"
        );
        // Where the layer is installed (CI), the render and copies are clean.
        if log.contains("validation errors:") {
            assert!(log.contains("validation errors: 0 []"), "{log}");
        }
        if let Some(client) = client {
            let stdout = succeeded(&client);
            assert!(
                stdout.contains("40 frames (40 checked, every texel of every part, 0 bad)"),
                "{stdout}"
            );
            assert!(status.success(), "{log}");
        }
    }
    std::fs::remove_dir_all(&runtime).unwrap();
    // The renderer on its own device, its run time bounding it.
    let renderer = examples_dir().join("renderer");
    if !renderer.is_file() || !examples_dir().join("vulkan_client").is_file() {
        println!("NOT CHECKED: renderer or vulkan_client is not built next to this test");
        return;
    }
    let runtime = runtime_dir("depth-renderer");
    let mut args = size.to_vec();
    args.extend(["--seconds", "120"]);
    let (mut server, _lines, log) = start_announcing(&renderer, &args, "renderer", &runtime);
    for mode in [&["--lossless"][..], &[][..]] {
        let mut args = vec!["--name", "renderer", "--frames", "15"];
        args.extend(mode);
        let stdout = run_example("vulkan_client", &args, &[("XDG_RUNTIME_DIR", &runtime)])
            .expect("built: checked above");
        assert!(
            stdout.contains("15 frames (15 checked, every texel of every part, 0 bad)"),
            "{stdout}"
        );
    }
    let _ = server.kill();
    server.wait().unwrap();
    assert!(log.contains("(Context::from_raw)"), "{log}");
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// Refusals name the flag to pass: a buffer ring to the Vulkan client,
/// contradicting flags, and (on a device without them, lavapipe)
/// device-local memory or semaphores asked for.
#[test]
fn frame_examples_refusals_name_the_flag_to_pass() {
    let runtime = runtime_dir("refusals");
    let buffers = ["--width", "64", "--height", "48", "--seconds", "60"];
    if let Some((mut server, _lines, _)) = start_frame_server("buf", &buffers, &runtime) {
        let client = ["--name", "buf", "--frames", "1"];
        if let Some(err) = run_refused("vulkan_client", &client, &runtime, 1, false) {
            assert!(err.contains("run the sender with --image rgba8"), "{err}");
        }
        let _ = server.kill();
        let _ = server.wait();
    }
    let both = ["--host-visible", "--device-local", "--seconds", "1"];
    if let Some(err) = run_refused("frame_server", &both, &runtime, 2, false) {
        assert!(err.contains("pass one of them"), "{err}");
    }
    let asked = [
        "--name",
        "dl",
        "--device-local",
        "--frames",
        "1",
        "--seconds",
        "1",
    ];
    if let Some(err) = run_refused("frame_server", &asked, &runtime, 1, true) {
        assert!(err.contains("pass --host-visible"), "{err}");
    }
    let asked = [
        "--name",
        "sem",
        "--semaphores",
        "--frames",
        "1",
        "--seconds",
        "1",
    ];
    if let Some(err) = run_refused("frame_server", &asked, &runtime, 1, true) {
        assert!(err.contains("pass --no-semaphores"), "{err}");
    }
    std::fs::remove_dir_all(&runtime).unwrap();
}
