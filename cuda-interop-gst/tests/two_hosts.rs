//! Frames across hosts (issue 32): two hosts on one machine, each a network
//! namespace with its own frame directory, joined by a veth pair.
//!
//! * Host A: a sender `cam` (the demo producer: every pixel's
//!   little-endian `u32` is the frame number, a band of rows holds its
//!   bits flipped) and `cudainteropsrc name=cam ! <payloader> ! udpsink`.
//! * Host B: `udpsrc ! <depayloader> ! cudainteropsink name=remote`, and a
//!   receiver (a process of its own, in B) that reads `remote` by name,
//!   lossless, and checks every pixel of every frame it gets.
//!
//! Raw RTP (`rtpvrawpay`) keeps the pixels exact: every frame must be the
//! demo frame its first pixel names. Through VP8 the frame is found as the
//! demo frame of highest PSNR near the one its first pixel names, and must
//! reach 30 dB. Where namespaces cannot be made (not root, no `ip`, no
//! veth), both hosts run on loopback with directories of their own, and
//! the test prints `LOOPBACK` with why. The frame rate at B is printed (a
//! figure, not a condition: tests never depend on timing), beside the
//! raw run's baseline measured in the same test between the same hosts:
//! GStreamer alone (`videotestsrc` on A, `appsink` on B, the same
//! payloader and transport), what the machine carries without
//! cuda-interop at either end.
//!
//! On the GPU machine (`--ignored`: an NVIDIA GPU and GStreamer's nvcodec
//! plugin) the raw run goes once more with CUDA memory at both ends: A's
//! sender a device-local ring, `cudainteropsrc ! video/x-raw(memory:CUDAMemory)
//! ! cudadownload ! <payloader>` (the caps filter fails negotiation unless
//! the source gives CUDA memory), and on B `<depayloader> ! cudaupload !
//! video/x-raw(memory:CUDAMemory) ! cudainteropsink`, whose device-local ring
//! the checker reads with a CUDA receiver (each frame copied to the host,
//! the same every-pixel check).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cuda_interop::Stream;
use cuda_interop_frames::cuda_receiver::{cuda_device_for, CudaReceiver};
use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::session::{Frame, Session};
use cuda_interop_frames::transport::ConsumerError;
use vk_export::wire::Received;

#[path = "../../cuda-interop-frames/examples/common/demo.rs"]
mod demo;

/// Bound on every wait of these tests.
const BOUND: Duration = Duration::from_secs(90);
/// How long a process is still waited for once another of the run failed.
const GRACE: Duration = Duration::from_secs(15);
const ROLE: &str = "CIG_TWO_HOSTS_ROLE";

/// Where each host's frame directory and logs live, and how a command runs
/// on it.
struct Host {
    /// The namespace, or `None` on loopback.
    netns: Option<String>,
    address: String,
    dir: PathBuf,
}

impl Host {
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // The plugin under test first, then what the environment adds (the
        // GPU run's nvcodec plugin, unpacked beside the bundle).
        let mut plugins = plugin_dir().into_os_string();
        if let Some(more) = std::env::var_os("GST_PLUGIN_PATH").filter(|p| !p.is_empty()) {
            plugins.push(":");
            plugins.push(more);
        }
        c.env("XDG_RUNTIME_DIR", &self.dir)
            .env("GST_PLUGIN_PATH", plugins)
            // The plugin registry of this run only.
            .env("GST_REGISTRY", self.dir.join("registry.bin"));
        c
    }

    fn frames_dir(&self) -> PathBuf {
        self.dir.join("cuda-interop-frames")
    }
}

/// Two hosts: two namespaces joined by a veth pair, or loopback.
struct Hosts {
    a: Host,
    b: Host,
    namespaces: Option<[String; 2]>,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Some(ns) = &self.namespaces {
            for n in ns {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.a.dir);
        let _ = std::fs::remove_dir_all(&self.b.dir);
    }
}

fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Namespaces `cig-a-PID-TAG` and `cig-b-PID-TAG`, addresses 10.213.N.1
/// and .2 on a veth pair with a 9000-byte MTU.
fn make_namespaces(tag: &str, subnet: u8) -> Result<[String; 2], String> {
    let pid = std::process::id();
    let (a, b) = (format!("cig-a-{pid}-{tag}"), format!("cig-b-{pid}-{tag}"));
    let (va, vb) = (
        format!("cga{}{tag}", pid % 100_000),
        format!("cgb{}{tag}", pid % 100_000),
    );
    let made = [a.clone(), b.clone()];
    let steps = || -> Result<(), String> {
        run_ip(&["netns", "add", &a])?;
        run_ip(&["netns", "add", &b])?;
        run_ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        run_ip(&["link", "set", &va, "netns", &a])?;
        run_ip(&["link", "set", &vb, "netns", &b])?;
        for (ns, dev, host) in [(&a, &va, 1), (&b, &vb, 2)] {
            let addr = format!("10.213.{subnet}.{host}/24");
            run_ip(&["-n", ns, "addr", "add", &addr, "dev", dev])?;
            run_ip(&["-n", ns, "link", "set", dev, "mtu", "9000", "up"])?;
            run_ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    };
    match steps() {
        Ok(()) => Ok(made),
        Err(e) => {
            for n in &made {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
            Err(e)
        }
    }
}

fn hosts(tag: &str, subnet: u8) -> Hosts {
    let base = std::env::temp_dir().join(format!("cig-hosts-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = |h: &str| {
        let d = base.join(h);
        std::fs::create_dir_all(&d).unwrap();
        // The frames directory refuses a runtime dir others can write.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    };
    let (da, db) = (dir("a"), dir("b"));
    match make_namespaces(tag, subnet) {
        Ok([a, b]) => {
            report(&format!("two hosts: network namespaces {a} (10.213.{subnet}.1) and {b} (10.213.{subnet}.2), veth, MTU 9000"));
            Hosts {
                a: Host {
                    netns: Some(a.clone()),
                    address: format!("10.213.{subnet}.1"),
                    dir: da,
                },
                b: Host {
                    netns: Some(b.clone()),
                    address: format!("10.213.{subnet}.2"),
                    dir: db,
                },
                namespaces: Some([a, b]),
            }
        }
        Err(why) => {
            report(&format!("LOOPBACK: no network namespaces ({why}); both hosts on 127.0.0.1, each with a frame directory of its own"));
            Hosts {
                a: Host {
                    netns: None,
                    address: "127.0.0.1".into(),
                    dir: da,
                },
                b: Host {
                    netns: None,
                    address: "127.0.0.1".into(),
                    dir: db,
                },
                namespaces: None,
            }
        }
    }
}

/// A directory holding only `libgstcudainterop.so`, made once: cargo puts
/// the package's cdylib beside the test binaries (`target/<profile>/deps/`,
/// and `target/<profile>/` after a `cargo build`), among other libraries
/// GStreamer's scanner would try to load.
fn plugin_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let candidates = [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()];
        let built = candidates
            .iter()
            .map(|d| d.join("libgstcudainterop.so"))
            .find(|p| p.exists())
            .unwrap_or_else(|| {
                panic!(
                    "no libgstcudainterop.so in {} or its parent: cargo test -p cuda-interop-gst \
                     builds it",
                    deps.display()
                )
            });
        let dir = std::env::temp_dir().join(format!("cig-plugin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A hard link where it can be (the debug build is some 80 MB, and a
        // copy per test run stays behind in the temporary directory).
        let plugin = dir.join("libgstcudainterop.so");
        let _ = std::fs::remove_file(&plugin);
        if std::fs::hard_link(&built, &plugin).is_err() {
            std::fs::copy(&built, &plugin).unwrap();
        }
        dir
    })
    .clone()
}

/// A child process killed when dropped (a test that fails never leaves one).
struct Running {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Running {
    fn spawn(what: &str, mut command: Command, log: PathBuf) -> Running {
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        Running {
            what: what.into(),
            child,
            log,
        }
    }

    /// Waits (bounded) for the process to exit; its output. Where one of
    /// `watched` exits unsuccessfully first (a pipeline that did not
    /// negotiate: its own log says why), it waits [`GRACE`] more at most,
    /// then stops the process and says so: such a run fails in seconds,
    /// not at the bound.
    fn wait(mut self, bound: Duration, watched: &mut [&mut Running]) -> (bool, String) {
        let start = Instant::now();
        let mut failed: Option<(String, Instant)> = None;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > bound {
                break None;
            }
            if failed.is_none() {
                for w in watched.iter_mut() {
                    if let Ok(Some(s)) = w.child.try_wait() {
                        if !s.success() {
                            failed =
                                Some((format!("{} exited first ({s})", w.what), Instant::now()));
                        }
                    }
                }
            }
            if let Some((why, since)) = &failed {
                if since.elapsed() > GRACE {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                    return (false, format!("{text}\n{} stopped: {why}", self.what));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        match status {
            Some(s) => (s.success(), text),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} ran past {bound:?}; its output:\n{text}", self.what)
            }
        }
    }

    /// Stops the process (SIGINT first: gst-launch -e then sends EOS).
    fn stop(mut self) -> String {
        // Our own child, not yet waited for: its pid cannot have been reused.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gst_launch(host: &Host, pipeline: &str) -> Command {
    let mut c = host.command("gst-launch-1.0");
    c.arg("-e")
        .args(pipeline.split_whitespace())
        // The source's count of buffers that were the slot itself, at stop.
        .env("GST_DEBUG", "cudainteropsrc:4");
    c
}

/// Host B's pipeline, ahead of every other process for the CPU where it
/// may be (root): on a machine of 2 busy cores, a receiving thread that
/// waits its turn overflows the socket's buffer and the kernel drops
/// datagrams (shown in `host B UDP: RcvbufErrors`).
fn receiving_gst_launch(host: &Host, pipeline: &str) -> Command {
    let mut c = host.command("nice");
    c.args(["-n", "-20", "gst-launch-1.0", "-e"])
        .args(pipeline.split_whitespace())
        // The sink's count of frames written in place, at its stop.
        .env("GST_DEBUG", "cudainteropsink:4");
    c
}

/// The number before `marker` on the last line of `log` that has it (an
/// element's count at stop).
fn count_before(log: &str, after: &str, marker: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains(after))?;
    let rest = line.split(after).nth(1)?;
    rest.split(marker).next()?.trim().parse().ok()
}

/// How many of its frames host B's sink presented in place (written into
/// its slots by the depayloader, no copy), from its log at stop.
fn in_place(b_log: &str) -> Option<u64> {
    count_before(b_log, "frames presented (", " in place")
}

fn role_command(host: &Host, role: &str, envs: &[(&str, String)]) -> Command {
    let mut c = host.command(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        role,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role);
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run by the parent test"))
}

/// The demo pattern's row `y` of frame `f`, `row` bytes of RGBA8.
fn demo_row(f: u64, y: u32, h: u32, row: usize) -> Vec<u8> {
    let (start, end) = demo::band_rows(f, h);
    let v = if (start..end).contains(&y) {
        demo::band_value(f)
    } else {
        demo::background(f)
    };
    v.to_le_bytes().repeat(row / 4)
}

/// Whether `rows` are frame `f` of the demo pattern, byte for byte (two
/// reference rows, each row compared whole: fast in a debug build too).
fn is_demo_frame(rows: &[&[u8]], f: u64) -> bool {
    let h = rows.len() as u32;
    let (start, end) = demo::band_rows(f, h);
    let row = rows[0].len();
    let (background, band) = (demo_row(f, h, h, row), demo_row(f, start, h, row));
    rows.iter().enumerate().all(|(y, r)| {
        let want = if (start..end).contains(&(y as u32)) {
            &band
        } else {
            &background
        };
        *r == want.as_slice()
    })
}

/// PSNR of the RGB channels of `rows` against frame `f` of the demo pattern
/// (alpha is not carried by a 4:2:0 codec).
fn psnr_rgb(rows: &[&[u8]], f: u64) -> f64 {
    let h = rows.len() as u32;
    let (mut sum, mut n) = (0f64, 0u64);
    for (y, r) in rows.iter().enumerate() {
        let want = demo_row(f, y as u32, h, 4);
        for p in r.chunks_exact(4) {
            for c in 0..3 {
                let d = f64::from(p[c]) - f64::from(want[c]);
                sum += d * d;
            }
            n += 3;
        }
    }
    let mse = sum / n as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

/// Host A's sender: the demo producer named `cam`, `CIG_FRAMES` frames at
/// `CIG_FPS`; host-visible with no semaphores (what lavapipe exports), or
/// with `CIG_MEMORY=cuda` device-local with its timelines (what a CUDA
/// reader, the source's CUDA memory, needs).
#[test]
#[ignore = "a child process of the two-hosts tests"]
fn child_sender() {
    assert_eq!(
        std::env::var(ROLE).as_deref(),
        Ok("child_sender"),
        "run by the parent test"
    );
    let cuda = env("CIG_MEMORY") == "cuda";
    let opts = demo::ProducerOptions {
        tag: "[host A sender]",
        name: Some("cam".into()),
        width: env("CIG_W").parse().unwrap(),
        height: env("CIG_H").parse().unwrap(),
        row_pitch: u64::from(env("CIG_W").parse::<u32>().unwrap()) * 4,
        slots: 4,
        seconds: BOUND.as_secs_f64(),
        frames: Some(env("CIG_FRAMES").parse().unwrap()),
        fps: env("CIG_FPS").parse().unwrap(),
        wait_for_receivers: 1,
        wait_timeout: BOUND,
        host_visible: !cuda,
        no_semaphores: !cuda,
        device_local: cuda,
        semaphores: cuda,
        ..demo::ProducerOptions::default()
    };
    demo::run(&opts).expect("the sender ran");
}

/// How host B's checker reads `remote`: a host-visible ring on the host,
/// or a device-local one (the sink's, in CUDA memory) through CUDA, each
/// frame copied to the host.
enum Reader {
    Host(HostReceiver),
    /// Boxed: the larger kind.
    Cuda(Box<CudaReceiver>, Stream),
}

impl Reader {
    fn new(cuda: bool, session: Session, setup: Received) -> Reader {
        if cuda {
            let rx = CudaReceiver::from_session(session, setup, cuda_device_for)
                .expect("a CUDA receiver takes `remote`'s ring");
            let stream = Stream::new(rx.cuda()).expect("a CUDA stream");
            Reader::Cuda(Box::new(rx), stream)
        } else {
            Reader::Host(HostReceiver::from_session(session, setup).unwrap())
        }
    }

    fn next(&self, timeout: Duration) -> Result<Frame, ConsumerError> {
        match self {
            Reader::Host(rx) => rx.next(timeout),
            Reader::Cuda(rx, _) => rx.next(timeout),
        }
    }

    /// Runs `check` on `frame`'s bytes (the layout's frame), then releases
    /// the frame: a host-visible ring's in place in this receiver's mapping
    /// (no copy: the checker's CPU competes with both pipelines on CI's 2
    /// cores), a device-local one's copied into `bytes` first.
    fn check<T>(&self, frame: Frame, bytes: &mut [u8], check: impl FnOnce(&[u8]) -> T) -> T {
        let timeout = Duration::from_secs(10);
        match self {
            Reader::Host(rx) => {
                let start = rx.read_in_place(&frame, timeout).expect("read");
                // SAFETY: `start` is the frame's first byte in this
                // receiver's mapping of its slot, `frame_bytes` of them,
                // mapped while `rx` lives; the frame is held until the
                // release below, so the sink (in another process) writes
                // the slot again only after it, or after dropping this
                // receiver for a hold timeout, which `check_held` below
                // turns into a failure; nothing in this process writes it.
                let in_place =
                    unsafe { std::slice::from_raw_parts(start, rx.frame_bytes() as usize) };
                let out = check(in_place);
                rx.session()
                    .check_held(&frame)
                    .expect("the frame stayed held while it was checked");
                rx.release(frame).expect("release");
                out
            }
            Reader::Cuda(rx, stream) => {
                rx.wait_on(&frame, stream).expect("wait for the frame");
                rx.copy_to_host(&frame, stream, 0, bytes, timeout)
                    .expect("copy to the host");
                rx.release_after(frame, stream).expect("release");
                check(bytes)
            }
        }
    }
}

/// Host B's receiver: reads `remote` (on the host, or with
/// `CIG_MEMORY=cuda` through CUDA) until `CIG_FRAMES` frames or the
/// sender's goodbye, checks every frame, prints RESULT lines.
#[test]
#[ignore = "a child process of the two-hosts tests"]
fn child_checker() {
    assert_eq!(
        std::env::var(ROLE).as_deref(),
        Ok("child_checker"),
        "run by the parent test"
    );
    let exact = env("CIG_MODE") == "exact";
    let want: u64 = env("CIG_FRAMES").parse().unwrap();
    let directory = Directory::from_env().unwrap();
    let start = Instant::now();
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "`remote` never appeared on host B");
        match Session::connect_named(
            &directory,
            "remote",
            // Latest: the checker never holds the sink back.
            Delivery::Latest,
            Duration::from_secs(5),
        ) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let layout = *session.layout();
    let rx = Reader::new(env("CIG_MEMORY") == "cuda", session, setup);
    let (w, h, pitch) = (layout.width, layout.height, layout.row_pitch as usize);
    // One allocation for every frame.
    let mut bytes = vec![0u8; layout.frame_bytes().unwrap() as usize];
    let row = (w * 4) as usize;
    println!("RESULT size={w}x{h}");
    let (mut checked, mut bad, mut worst_psnr) = (0u64, 0u64, f64::INFINITY);
    let mut numbers = Vec::new();
    let (mut first, mut last) = (None, None);
    let mut idle_since = Instant::now();
    // The first and last sequence numbers of the sink's frames this
    // checker took: how many frames the sink presented meanwhile.
    let mut sequences: Option<(u64, u64)> = None;
    // Frames are numbered from 0: the last one ends the run.
    while numbers.last().is_none_or(|&f| f + 1 < want) {
        assert!(start.elapsed() < BOUND, "the checker ran past its bound");
        let frame = match rx.next(Duration::from_secs(2)) {
            Ok(frame) => frame,
            Err(e) => {
                // Frames stop when host A's sender is done.
                if idle_since.elapsed() > Duration::from_secs(10) {
                    println!("RESULT end={e}");
                    break;
                }
                continue;
            }
        };
        idle_since = Instant::now();
        let sequence = frame.sequence();
        sequences.get_or_insert((sequence, sequence)).1 = sequence;
        rx.check(frame, &mut bytes, |bytes| {
            let now = Instant::now();
            first.get_or_insert(now);
            last = Some(now);
            let rows: Vec<&[u8]> = (0..h as usize)
                .map(|y| &bytes[y * pitch..][..row])
                .collect();
            let word = u32::from_le_bytes([rows[0][0], rows[0][1], rows[0][2], rows[0][3]]);
            if exact {
                // Row 0 is the background, or the band (its bits flipped).
                let f = [u64::from(word), u64::from(!word)]
                    .into_iter()
                    .find(|&f| is_demo_frame(&rows, f));
                match f {
                    Some(f) => numbers.push(f),
                    None => {
                        bad += 1;
                        let f = u64::from(word);
                        let (start, end) = demo::band_rows(f, h);
                        let wrong: Vec<(usize, u32)> = rows
                            .iter()
                            .enumerate()
                            .filter(|(y, r)| {
                                let y = *y as u32;
                                **r != demo_row(f, y, h, row).as_slice()
                            })
                            .map(|(y, r)| (y, u32::from_le_bytes([r[0], r[1], r[2], r[3]])))
                            .collect();
                        println!(
                            "bad frame: first word {word:#x} names no demo frame it equals; \
                             as frame {f} (band rows {start}..{end}): {} wrong rows, first {:?}, last {:?}",
                            wrong.len(),
                            wrong.first(),
                            wrong.last()
                        );
                    }
                }
            } else {
                // Lossy: the band (green 255, where the background's is 0 for
                // frames under 256) names the frame; a frame whose band starts
                // within 2 rows of it is a candidate, the closest by PSNR wins.
                let green =
                    |r: &[u8]| r.chunks_exact(4).map(|p| u64::from(p[1])).sum::<u64>() / u64::from(w);
                let band = rows.iter().position(|r| green(r) > 128).unwrap_or(0) as u32;
                let (f, p) = (0..256u64)
                    .filter(|&f| demo::band_rows(f, h).0.abs_diff(band) <= 2)
                    .map(|f| (f, psnr_rgb(&rows, f)))
                    .max_by(|x, y| x.1.total_cmp(&y.1))
                    .unwrap_or((0, 0.0));
                worst_psnr = worst_psnr.min(p);
                if p < 30.0 {
                    bad += 1;
                    let mid = rows[rows.len() / 2];
                    println!(
                        "bad frame: best match frame {f} at {p:.1} dB (first pixel {:?}, middle row's {:?})",
                        &rows[0][..4],
                        &mid[..4]
                    );
                } else {
                    numbers.push(f);
                }
            }
        });
        checked += 1;
    }
    let span = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let presented = sequences.map_or(0, |(a, b)| b - a);
    let rate = if span > 0.0 {
        presented as f64 / span
    } else {
        0.0
    };
    // Of the frames host A sent between the first and the last checked,
    // how many the sink presented (every one, unless the network lost one).
    let sent = match (numbers.iter().min(), numbers.iter().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    let distinct = {
        let mut n = numbers.clone();
        n.sort_unstable();
        n.dedup();
        n.len()
    };
    println!("RESULT checked={checked}");
    println!("RESULT bad={bad}");
    println!("RESULT distinct={distinct}");
    println!("RESULT fps={rate:.1}");
    println!("RESULT presented={presented}");
    println!("RESULT sent={sent}");
    if !exact {
        println!("RESULT worst_psnr={worst_psnr:.1}");
    }
}

fn result(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("RESULT {key}=")))
        .unwrap_or_else(|| panic!("no RESULT {key} in:\n{out}"))
        .to_string()
}

/// One run: B's pipeline and checker, A's sender and pipeline; the
/// checker's output.
/// How RTP travels from host A to host B: datagrams, or a TCP stream of
/// RTP packets (RFC 4571 framing: `rtpstreampay`, `rtpstreamdepay`), which
/// loses none however busy host B is.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Udp,
    Tcp,
}

/// Where the frames are at either end.
#[derive(Clone, Copy, PartialEq)]
enum Memory {
    /// Host-visible rings, GStreamer's system memory (what lavapipe does).
    System,
    /// Device-local rings, GStreamer's CUDA memory: host A's sender
    /// device-local, `cudainteropsrc ! CUDA memory ! cudadownload`; host B
    /// `cudaupload ! CUDA memory ! cudainteropsink`, read through CUDA.
    Cuda,
}

impl Memory {
    /// `CIG_MEMORY` for the sender and the checker.
    fn name(self) -> &'static str {
        match self {
            Memory::System => "system",
            Memory::Cuda => "cuda",
        }
    }

    /// Host A's elements between `cudainteropsrc` and the payloader: the
    /// caps filter fails negotiation unless the source gives CUDA memory.
    fn after_src(self) -> &'static str {
        match self {
            Memory::System => "",
            Memory::Cuda => "video/x-raw(memory:CUDAMemory) ! cudadownload ! ",
        }
    }

    /// Host B's elements between the depayloader and `cudainteropsink`.
    fn before_sink(self) -> &'static str {
        match self {
            Memory::System => "",
            Memory::Cuda => "cudaupload ! video/x-raw(memory:CUDAMemory) ! ",
        }
    }
}

/// What a run carries, how, and in which memory.
#[derive(Clone, Copy)]
struct Link {
    /// `raw` (every pixel exact) or `vp8` (close by PSNR).
    codec: &'static str,
    transport: Transport,
    memory: Memory,
}

/// Where `cudaupload` and `cudadownload` come from, and when they are there.
const NVCODEC: &str = "GStreamer's nvcodec plugin (libgstnvcodec.so, from \
    gstreamer1.0-plugins-bad; it registers cudaupload and cudadownload only where it \
    loads libcuda.so.1 and NVDEC or NVENC, libnvcuvid.so.1 or libnvidia-encode.so.1, \
    and finds a CUDA device)";

/// GStreamer's elements a run needs beyond the plugin under test: a test
/// without them fails, naming the plugin.
fn require_elements(host: &Host, elements: &[&str], plugin: &str) {
    for e in elements {
        let out = host
            .command("gst-inspect-1.0")
            .arg(e)
            .output()
            .unwrap_or_else(|err| panic!("gst-inspect-1.0 {e}: {err}"));
        assert!(
            out.status.success(),
            "no {e} element: {plugin} must be installed and load; gst-inspect-1.0 {e} said: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}

fn across(tag: &str, subnet: u8, size: (u32, u32), frames: u64, fps: u32, link: Link) -> String {
    let Link {
        codec,
        transport,
        memory,
    } = link;
    let hosts = hosts(tag, subnet);
    if memory == Memory::Cuda {
        require_elements(&hosts.a, &["cudadownload"], NVCODEC);
        require_elements(&hosts.b, &["cudaupload"], NVCODEC);
    }
    let (w, h) = size;
    let port = 5000 + u32::from(subnet);
    let exact = codec == "raw";
    let (pay, depay, caps) = if exact {
        (
            "rtpvrawpay mtu=8900".to_string(),
            "rtpvrawdepay".to_string(),
            format!(
                "application/x-rtp,media=video,clock-rate=90000,encoding-name=RAW,sampling=RGBA,\
                 depth=(string)8,width=(string){w},height=(string){h},colorimetry=(string)SMPTE240M,payload=96"
            ),
        )
    } else {
        (
            "videoconvert ! vp8enc deadline=1 target-bitrate=20000000 keyframe-max-dist=30 ! rtpvp8pay mtu=8900"
                .to_string(),
            "rtpvp8depay ! vp8dec ! videoconvert ! video/x-raw,format=RGBA".to_string(),
            "application/x-rtp,media=video,clock-rate=90000,encoding-name=VP8,payload=96".to_string(),
        )
    };
    let envs = |mode: &str| {
        vec![
            ("CIG_W", w.to_string()),
            ("CIG_H", h.to_string()),
            ("CIG_FRAMES", frames.to_string()),
            ("CIG_FPS", fps.to_string()),
            ("CIG_MODE", mode.to_string()),
            ("CIG_MEMORY", memory.name().to_string()),
        ]
    };
    let mode = if exact { "exact" } else { "psnr" };
    let logs = hosts.b.dir.clone();
    let to_sink = memory.before_sink();
    let b_pipe = match transport {
        Transport::Udp => format!(
            "udpsrc address={} port={port} buffer-size=67108864 caps={caps} ! queue max-size-buffers=0 max-size-time=0 max-size-bytes=268435456 ! {depay} ! {to_sink}cudainteropsink name=remote",
            hosts.b.address
        ),
        Transport::Tcp => format!(
            "tcpserversrc host={} port={port} ! {} ! rtpstreamdepay ! {depay} ! {to_sink}cudainteropsink name=remote",
            hosts.b.address,
            caps.replacen("application/x-rtp,", "application/x-rtp-stream,", 1)
        ),
    };
    println!("host B: gst-launch-1.0 {b_pipe}");
    let mut b_gst = Running::spawn(
        "host B's pipeline",
        receiving_gst_launch(&hosts.b, &b_pipe),
        logs.join("b-gst.log"),
    );
    // Host B listens before host A connects: gst-launch prints "Pipeline
    // is PREROLLING" (or "is live and does not need PREROLL") once its
    // sources started, the TCP server's socket bound.
    let start = Instant::now();
    while !std::fs::read_to_string(logs.join("b-gst.log"))
        .unwrap_or_default()
        .contains("PREROLL")
    {
        assert!(start.elapsed() < BOUND, "host B's pipeline never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let checker = Running::spawn(
        "host B's checker",
        role_command(&hosts.b, "child_checker", &envs(mode)),
        logs.join("checker.log"),
    );
    let sender = Running::spawn(
        "host A's sender",
        role_command(&hosts.a, "child_sender", &envs(mode)),
        hosts.a.dir.join("sender.log"),
    );
    let from_src = memory.after_src();
    // System memory from host A's host-visible ring: the slot itself goes
    // to the payloader (no copy at host A either).
    let zero_copy = if memory == Memory::System {
        " zero-copy=true"
    } else {
        ""
    };
    let a_pipe = match transport {
        Transport::Udp => format!(
            "cudainteropsrc name=cam delivery=lossless{zero_copy} ! {from_src}{pay} ! udpsink host={} port={port} sync=true",
            hosts.b.address
        ),
        Transport::Tcp => format!(
            "cudainteropsrc name=cam delivery=lossless{zero_copy} ! {from_src}{pay} ! rtpstreampay ! tcpclientsink host={} port={port} sync=true",
            hosts.b.address
        ),
    };
    println!("host A: gst-launch-1.0 {a_pipe}");
    let mut a_gst = Running::spawn(
        "host A's pipeline",
        gst_launch(&hosts.a, &a_pipe),
        hosts.a.dir.join("a-gst.log"),
    );
    let (ok, out) = checker.wait(BOUND, &mut [&mut a_gst, &mut b_gst]);
    // What host B's kernel says of the datagrams (loss shows here, as
    // RcvbufErrors, before any frame is wrong).
    if let Ok(o) = hosts.b.command("cat").arg("/proc/net/snmp").output() {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let udp: Vec<&str> = text.lines().filter(|l| l.starts_with("Udp:")).collect();
        if let [names, values] = udp.as_slice() {
            let pairs: Vec<String> = names
                .split_whitespace()
                .zip(values.split_whitespace())
                .skip(1)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            println!("host B UDP: {}", pairs.join(" "));
        }
    }
    let a_log = a_gst.stop();
    // A failed run's sender may wait for a receiver that never comes.
    let sender_log = if ok {
        sender.wait(BOUND, &mut []).1
    } else {
        sender.stop()
    };
    let b_log = b_gst.stop();
    println!("--- host A sender:\n{sender_log}\n--- host A pipeline:\n{a_log}\n--- host B pipeline:\n{b_log}\n--- host B checker:\n{out}");
    let out = match in_place(&b_log) {
        Some(n) => format!("{out}\nRESULT in_place={n}\n"),
        None => out,
    };
    let out = match count_before(&a_log, "frames received (", " the slot itself") {
        Some(n) => format!("{out}\nRESULT src_slots={n}\n"),
        None => out,
    };
    assert!(
        ok,
        "the checker failed (a pipeline's error, if any, is in its log above)"
    );
    assert!(
        !Directory::new(hosts.a.frames_dir())
            .unwrap()
            .list()
            .unwrap()
            .iter()
            .any(|s| s.name == "remote"),
        "host A's directory must not hold host B's sender"
    );
    out
}

/// Prints `line` where `cargo test` shows it for a passing test too (its
/// capture takes `print!`, not writes to the stderr handle): the figures
/// and how the hosts were made belong in every run's log.
fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// One run at a time: the two compete for the CPU (the VP8 encoder most),
/// and host B's socket would overflow.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Raw RTP over TCP (RFC 4571): nothing is lost, so every frame host A
/// sent reaches host B's sink and every pixel is exact, however busy the
/// machine (CI's 2 cores).
#[test]
fn raw_rtp_between_two_hosts_keeps_every_pixel() {
    raw_rtp("raw-tcp", 1, Transport::Tcp, Memory::System);
}

/// The same with CUDA memory at both ends (issue 32's GPU run): a
/// device-local ring on A, `cudainteropsrc ! CUDA memory ! cudadownload`;
/// on B `cudaupload ! CUDA memory ! cudainteropsink`, a device-local ring
/// the checker reads through CUDA. Without cudaupload or cudadownload the
/// test fails, naming the plugin.
#[test]
#[ignore = "needs an NVIDIA GPU and GStreamer's nvcodec plugin (cudadownload, cudaupload): the GPU machine's run"]
fn raw_rtp_in_cuda_memory_at_both_ends_keeps_every_pixel() {
    raw_rtp("cuda", 4, Transport::Tcp, Memory::Cuda);
}

/// Raw RTP over UDP (the issue's `udpsink`/`udpsrc`): exact where host B
/// keeps up; on 2 busy cores the kernel drops datagrams (the test prints
/// `RcvbufErrors`) and `rtpvrawdepay` passes on frames with rows of an older
/// one, so it is not part of `cargo test`'s default run: `--ignored`.
#[test]
#[ignore = "UDP loses datagrams on a loaded machine: run with --ignored (GPU run 27: 76 frames/s, exact)"]
fn raw_rtp_over_udp_between_two_hosts_keeps_every_pixel() {
    raw_rtp("raw", 3, Transport::Udp, Memory::System);
}

/// Host B's end of the baseline: `tcpserversrc ! rtpstreamdepay !
/// rtpvrawdepay ! appsink` (GStreamer alone), timing the frames it gets.
#[test]
#[ignore = "a child process of the two-hosts tests"]
fn child_baseline_receiver() {
    use gst::prelude::*;
    assert_eq!(
        std::env::var(ROLE).as_deref(),
        Ok("child_baseline_receiver"),
        "run by the parent test"
    );
    gst::init().unwrap();
    let want: u64 = env("CIG_FRAMES").parse().unwrap();
    let pipeline = gst::parse::launch(&env("CIG_PIPELINE"))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    println!("RESULT listening=1");
    let (mut first, mut last, mut n) = (None, None, 0u64);
    while n < want {
        match sink.try_pull_sample(gst::ClockTime::from_seconds(10)) {
            Some(_) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                n += 1;
            }
            None => break,
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let rate = match (first, last) {
        (Some(a), Some(b)) if n > 1 => (n - 1) as f64 / b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    println!("RESULT frames={n}");
    println!("RESULT fps={rate:.1}");
}

/// The baseline of a raw run: GStreamer alone between the same hosts,
/// `videotestsrc` at 75 frames/s on A, the same payloader and TCP
/// framing, `appsink` on B; the frame rate at B.
fn baseline(tag: &str, subnet: u8, size: (u32, u32), frames: u64) -> String {
    // A tag of its own, short: veth names hold 15 bytes.
    let hosts = hosts(&format!("{}b", &tag[..tag.len().min(6)]), subnet);
    let (w, h) = size;
    let port = 5100 + u32::from(subnet);
    let caps = format!(
        "application/x-rtp-stream,media=video,clock-rate=90000,encoding-name=RAW,sampling=RGBA,\
         depth=(string)8,width=(string){w},height=(string){h},colorimetry=(string)SMPTE240M,payload=96"
    );
    let b_pipe = format!(
        "tcpserversrc host={} port={port} ! {caps} ! rtpstreamdepay ! rtpvrawdepay ! appsink \
         name=sink sync=false max-buffers=4",
        hosts.b.address
    );
    let mut receiver = role_command(
        &hosts.b,
        "child_baseline_receiver",
        &[("CIG_FRAMES", frames.to_string()), ("CIG_PIPELINE", b_pipe)],
    );
    // As host B's pipeline in the raw run: first for the CPU.
    let mut niced = hosts.b.command("nice");
    niced.args(["-n", "-20"]).arg(receiver.get_program());
    niced.args(receiver.get_args()).envs(
        receiver
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
    );
    let _ = &mut receiver;
    let log = hosts.b.dir.join("baseline.log");
    let receiving = Running::spawn("host B's baseline receiver", niced, log.clone());
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("RESULT listening=1")
    {
        assert!(
            start.elapsed() < BOUND,
            "host B's baseline receiver never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let a_pipe = format!(
        "videotestsrc num-buffers={frames} is-live=true pattern=black ! \
         video/x-raw,format=RGBA,width={w},height={h},framerate=75/1 ! rtpvrawpay mtu=8900 ! \
         rtpstreampay ! tcpclientsink host={} port={port} sync=true",
        hosts.b.address
    );
    let sending = Running::spawn(
        "host A's baseline pipeline",
        gst_launch(&hosts.a, &a_pipe),
        hosts.a.dir.join("baseline-a.log"),
    );
    let (ok, out) = receiving.wait(BOUND, &mut []);
    let a_log = sending.stop();
    assert!(
        ok,
        "the baseline receiver failed:\n{out}\n--- host A:\n{a_log}"
    );
    out
}

fn raw_rtp(tag: &str, subnet: u8, transport: Transport, memory: Memory) {
    let _one = one_at_a_time();
    // Host A's sender offers 75 frames/s: a pipeline slower than 60 shows.
    let frames = 300;
    let base = (transport == Transport::Tcp).then(|| {
        let out = baseline(tag, subnet, (1920, 1080), frames);
        (result(&out, "fps"), result(&out, "frames"))
    });
    let link = Link {
        codec: "raw",
        transport,
        memory,
    };
    let out = across(tag, subnet, (1920, 1080), frames, 75, link);
    let checked: u64 = result(&out, "checked").parse().unwrap();
    let bad: u64 = result(&out, "bad").parse().unwrap();
    let distinct: u64 = result(&out, "distinct").parse().unwrap();
    let presented: u64 = result(&out, "presented").parse().unwrap();
    let sent: u64 = result(&out, "sent").parse().unwrap();
    let in_place = result(&out, "in_place");
    let src_slots = result(&out, "src_slots");
    report(&format!(
        "RTP raw 1920x1080 RGBA between two hosts over {}{}: {checked} frames checked at host B (every pixel), \
         {bad} bad; the sink presented {presented} frames of the {sent} host A sent meanwhile \
         ({in_place} of all it presented written in place by rtpvrawdepay; host A's source \
         handed out {src_slots} slots themselves), {} frames/s",
        if transport == Transport::Tcp { "TCP" } else { "UDP" },
        match memory {
            Memory::System => "",
            Memory::Cuda => ", CUDA memory at both ends (A: device-local ring -> cudainteropsrc -> \
                             CUDA memory -> cudadownload; B: cudaupload -> CUDA memory -> \
                             cudainteropsink -> device-local ring, read by CUDA)",
        },
        result(&out, "fps")
    ));
    if let Some((fps, n)) = &base {
        let ours: f64 = result(&out, "fps").parse().unwrap();
        let theirs: f64 = fps.parse().unwrap();
        report(&format!(
            "baseline, the same run and hosts: GStreamer alone (videotestsrc -> rtpvrawpay -> TCP -> \
             rtpvrawdepay -> appsink) carried {n} frames at {fps} frames/s; with cuda-interop at \
             both ends {ours:.1} frames/s ({:.2}x the baseline)",
            if theirs > 0.0 { ours / theirs } else { 0.0 }
        ));
    }
    assert_eq!(bad, 0, "every pixel of every frame exact");
    assert_eq!(distinct, checked, "no frame twice");
    assert!(checked >= 30, "only {checked} frames reached the checker");
    if memory == Memory::System {
        // The depayloader takes the sink's pool: its frames go into the
        // ring's slots without the sink's copy (a frame is copied only
        // where no slot was free to lend at once).
        assert!(
            in_place.parse::<u64>().is_ok_and(|n| n > 0),
            "host B's sink presented no frame in place ({in_place}): rtpvrawdepay did not \
             write into its pool"
        );
        assert!(
            src_slots.parse::<u64>().is_ok_and(|n| n > 0),
            "host A's source handed out no slot itself ({src_slots}) with zero-copy=true"
        );
    }
    assert_eq!(
        presented, sent,
        "every frame host A sent reached host B's sink"
    );
}

#[test]
fn vp8_rtp_between_two_hosts_is_close_by_psnr() {
    let _one = one_at_a_time();
    let frames = 90;
    let link = Link {
        codec: "vp8",
        transport: Transport::Udp,
        memory: Memory::System,
    };
    let out = across("vp8", 2, (640, 360), frames, 30, link);
    let checked: u64 = result(&out, "checked").parse().unwrap();
    let bad: u64 = result(&out, "bad").parse().unwrap();
    report(&format!(
        "RTP VP8 640x360 between two hosts: {checked} frames, {bad} under 30 dB, worst {} dB, {} frames/s at host B",
        result(&out, "worst_psnr"),
        result(&out, "fps")
    ));
    assert_eq!(bad, 0);
    assert!(checked >= 10, "only {checked} frames reached the checker");
}
