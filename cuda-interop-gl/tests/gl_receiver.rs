//! An OpenGL receiver on the CPU (issue 33 item 4): an image sender on
//! lavapipe, and in the same process a headless GL 4.5 context on llvmpipe
//! (Mesa's surfaceless EGL) whose `GlReceiver` imports the ring's slots as
//! textures (`GL_EXT_memory_object_fd`, matched by device and driver
//! UUID); every texel of every frame GL reads back is the demo pattern of
//! the frame's own number. lavapipe's rings have no semaphores: the frame
//! message orders the reads ([`WaitMode::FrameMessage`], asserted); on an
//! NVIDIA GPU (built with the testkit's `device-local` feature) the ring
//! shares its timelines and the receiver waits for "produced" on the GPU
//! ([`WaitMode::Gpu`], where the context has `GL_EXT_semaphore_fd` and
//! `GL_NV_timeline_semaphore`) or on the host. The `#[ignore]`d
//! `gpu_side_wait_*` tests are the GPU machine's (`.gpu-run/gl_wait.sh`):
//! they assert the GPU-side wait.
//! Buffer rings are refused with the receiver that takes them.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{self, Address, ImageSender, Sender, SenderOptions};
use cuda_interop_frames::session::Session;
use cuda_interop_gl::{Error, GlReceiver, HeadlessGl, WaitMode};
use cuda_interop_testkit::{assert_no_validation_errors, vulkan, Mem};
use vk_export::format::{Bgra8Unorm, Format, Rg16Unorm, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::MemoryLocation;
use vk_export::ExportableBuffer;

#[path = "../../cuda-interop-frames/examples/common/demo.rs"]
mod demo;

const W: u32 = 64;
const H: u32 = 48;
const FRAMES: u64 = 12;
const BOUND: Duration = Duration::from_secs(60);

/// Connects to `name` (lossless) while `serve` answers the subscribe.
fn connect(
    directory: &Directory,
    name: &str,
    mut serve: impl FnMut(),
) -> (Session, vk_export::wire::Received) {
    let (dir, name) = (directory.clone(), name.to_string());
    let t = std::thread::spawn(move || {
        Session::connect_named(&dir, &name, Delivery::Lossless, Duration::from_secs(10))
    });
    let start = Instant::now();
    while !t.is_finished() {
        assert!(start.elapsed() < BOUND);
        serve();
    }
    t.join().unwrap().expect("connected")
}

/// Presents frame `f` of the demo pattern into a free slot.
fn present<F: Format, M: MemoryLocation>(
    sender: &mut ImageSender<F, M>,
    scratch: &ExportableBuffer<M>,
) -> u64 {
    let slot = sender.acquire(BOUND).expect("a free slot");
    let f = slot.sequence();
    slot.present_with(sender::monotonic_ns(), |device, cmd, target| {
        // SAFETY: the sender's recording command buffer and its W x H slot
        // of F; the scratch buffer holds W * H texels of F (transfer usage)
        // and each present waits for its commands, so no earlier copy still
        // reads it; it outlives the sender's submissions (dropped after).
        unsafe {
            demo::record_demo_pattern_image::<F>(device, cmd, scratch.raw(), target, (W, H), f)
        }
    })
    .expect("present")
}

/// A sender of `F` images named `name` in a fresh directory, and a
/// scratch buffer for the demo pattern.
fn image_sender<F: Format>(
    ctx: &vk_export::Context,
    tag: &str,
) -> (
    Directory,
    std::path::PathBuf,
    ImageSender<F, Mem>,
    ExportableBuffer<Mem>,
) {
    let dir = std::env::temp_dir().join(format!("cig-gl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let opts = SenderOptions {
        // lavapipe: none (the frame message orders the reads); NVIDIA: the
        // "produced" timeline, waited for by the receiver.
        semaphores: ctx.supports_semaphore_fds(),
        queue: vk_export::QueueRole::Transfer,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "gl".into(),
            },
            W,
            H,
            3,
        )
    };
    let sender = ImageSender::<F, Mem>::new(ctx, opts).unwrap();
    let scratch = ExportableBuffer::<Mem>::new(ctx, u64::from(W * H * F::TEXEL_BYTES)).unwrap();
    (directory, dir, sender, scratch)
}

/// `FRAMES` frames of `F` through GL textures, every texel checked as GL
/// reads it back; the wait is the one this device's ring and GL give (the
/// frame message without exportable semaphores, as on lavapipe).
fn every_texel<F: Format>(tag: &str) {
    let ctx = vulkan(None);
    let mode = frames_through_gl::<F>(&ctx, tag, FRAMES);
    if ctx.supports_semaphore_fds() {
        assert_ne!(mode, WaitMode::FrameMessage);
    } else {
        assert_eq!(mode, WaitMode::FrameMessage);
    }
}

/// `frames` frames of `F` through GL textures, every texel checked as GL
/// reads it back; the receiver's wait mode.
fn frames_through_gl<F: Format>(ctx: &vk_export::Context, tag: &str, frames: u64) -> WaitMode {
    let gl = HeadlessGl::on_device(ctx.identity().device_uuid).expect(
        "a headless GL context on the sender's device (cargo xtask test installs Mesa's EGL)",
    );
    let (directory, dir, mut sender, scratch) = image_sender::<F>(ctx, tag);
    let (session, setup) = connect(&directory, "gl", || sender.serve(Duration::from_millis(5)));
    // SAFETY: `gl` made its context current on this thread, and nothing
    // else here makes another one current; the receiver is dropped before
    // `gl`.
    let rx = unsafe { GlReceiver::new(gl.gl(), session, setup) }.expect("the slots import into GL");
    assert_eq!(rx.textures().len(), 3);
    let mode = rx.wait_mode();
    let start = Instant::now();
    for _ in 0..frames {
        assert!(start.elapsed() < BOUND);
        let f = present(&mut sender, &scratch);
        let frame = next_frame(&rx, &mut sender, start, f);
        assert_eq!(frame.sequence(), f);
        let pixels = rx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
        let row = (W * F::TEXEL_BYTES) as usize;
        let bad: Vec<u32> = (0..H)
            .filter(|&y| !demo::check_demo_row(&pixels[y as usize * row..][..row], f, y, H))
            .collect();
        assert!(
            bad.is_empty(),
            "{}: frame {f}: rows {bad:?} are not the frame's",
            F::NAME
        );
        rx.release(frame, Duration::from_secs(10)).unwrap();
        sender.serve(Duration::ZERO);
    }
    println!(
        "{}: {frames} frames through OpenGL textures, every texel exact ({gl:?}, {rx:?})",
        F::NAME
    );
    drop(rx);
    drop(gl);
    drop(sender);
    drop(scratch);
    assert_no_validation_errors(ctx);
    std::fs::remove_dir_all(&dir).unwrap();
    mode
}

/// The GPU machine's (run with `--ignored`, `.gpu-run/gl_wait.sh`): on a
/// device with exportable timelines and a GL context with
/// `GL_EXT_semaphore_fd` and `GL_NV_timeline_semaphore` (NVIDIA's EGL),
/// every texel of 240 frames of `F` is exact with the GPU-side wait, and
/// that wait is the one used. Fails (never skips) anywhere else.
fn gpu_side_wait<F: Format>(tag: &str) {
    let ctx = vulkan(None);
    assert!(
        ctx.supports_semaphore_fds(),
        "{}: no exportable timeline semaphores: this test is for the GPU machine",
        ctx.identity().name
    );
    assert!(
        std::env::var_os(cuda_interop_gl::WAIT_ENV).is_none_or(|v| v != "host"),
        "{}=host turns the GPU-side wait off",
        cuda_interop_gl::WAIT_ENV
    );
    let mode = frames_through_gl::<F>(&ctx, tag, 240);
    assert_eq!(mode, WaitMode::Gpu, "the GPU-side wait was not used");
}

#[test]
#[ignore = "the GPU machine's: NVIDIA's EGL with GL_NV_timeline_semaphore (.gpu-run/gl_wait.sh)"]
fn gpu_side_wait_every_texel_of_rgba8_frames() {
    gpu_side_wait::<Rgba8Unorm>("gpu-rgba8");
}

#[test]
#[ignore = "the GPU machine's: NVIDIA's EGL with GL_NV_timeline_semaphore (.gpu-run/gl_wait.sh)"]
fn gpu_side_wait_every_texel_of_bgra8_frames() {
    gpu_side_wait::<Bgra8Unorm>("gpu-bgra8");
}

#[test]
#[ignore = "the GPU machine's: NVIDIA's EGL with GL_NV_timeline_semaphore (.gpu-run/gl_wait.sh)"]
fn gpu_side_wait_every_texel_of_rgba16f_frames() {
    gpu_side_wait::<Rgba16Sfloat>("gpu-rgba16f");
}

/// The receiver's next frame (frame `f`, just presented), the sender
/// serving meanwhile; bounded by [`BOUND`] from `start`.
fn next_frame<F: Format, M: MemoryLocation>(
    rx: &GlReceiver,
    sender: &mut ImageSender<F, M>,
    start: Instant,
    f: u64,
) -> cuda_interop_frames::session::Frame {
    loop {
        sender.serve(Duration::ZERO);
        match rx.next(Duration::from_millis(50)) {
            Ok(frame) => return frame,
            Err(Error::Consumer(cuda_interop_frames::transport::ConsumerError::Timeout(_))) => {
                assert!(start.elapsed() < BOUND, "frame {f} never came")
            }
            Err(e) => panic!("frame {f}: {e}"),
        }
    }
}

#[test]
fn every_texel_of_every_rgba8_frame_reaches_an_opengl_texture() {
    every_texel::<Rgba8Unorm>("rgba8");
}

/// BGRA8: the texture holds the ring's bytes (B, G, R, A), read back as
/// they are; sampling swizzles them to R, G, B, A.
#[test]
fn every_texel_of_every_bgra8_frame_reaches_an_opengl_texture() {
    every_texel::<Bgra8Unorm>("bgra8");
}

#[test]
fn every_texel_of_every_rgba16f_frame_reaches_an_opengl_texture() {
    every_texel::<Rgba16Sfloat>("rgba16f");
}

/// A context asked for on a device EGL has none of is a mismatch naming
/// the device (the tests above are its twin: the sender's device).
#[test]
fn a_context_on_a_device_egl_lacks_is_refused() {
    let e = HeadlessGl::on_device(vk_export::DeviceUuid::from_bytes([0xab; 16])).unwrap_err();
    assert!(
        matches!(&e, Error::Mismatch(why) if why.contains("abababab")),
        "{e}"
    );
}

/// An image ring of a format GL is not given (RG16) is refused, naming
/// the ones it takes.
#[test]
fn an_image_ring_of_another_format_is_refused_with_the_formats_it_takes() {
    let ctx = vulkan(None);
    let gl = HeadlessGl::on_device(ctx.identity().device_uuid).expect("a headless GL context");
    let (directory, dir, mut sender, _scratch) = image_sender::<Rg16Unorm>(&ctx, "rg16");
    let (session, setup) = connect(&directory, "gl", || sender.serve(Duration::from_millis(5)));
    // SAFETY: as above.
    let e = unsafe { GlReceiver::new(gl.gl(), session, setup) }.unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported(why) if why.contains("R8G8B8A8_UNORM")),
        "{e}"
    );
    drop(sender);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A buffer ring is refused, naming the receivers that read one.
#[test]
fn a_buffer_ring_is_refused_with_the_receiver_that_takes_it() {
    let gl = HeadlessGl::new().expect("a headless GL context");
    let dir = std::env::temp_dir().join(format!("cig-gl-buf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let opts = SenderOptions {
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "buffers".into(),
            },
            W,
            H,
            2,
        )
    };
    let mut sender = Sender::<vk_export::markers::HostVisible>::new(&ctx, opts).unwrap();
    let (session, setup) = connect(&directory, "buffers", || {
        sender.serve(Duration::from_millis(5))
    });
    // SAFETY: as above.
    let e = unsafe { GlReceiver::new(gl.gl(), session, setup) }.unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported(why) if why.contains("HostReceiver")),
        "{e}"
    );
    drop(sender);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Another `HeadlessGl` dropped while not current, and a failed
/// `on_device` (each candidate made current, then dropped), leave the
/// receiver's context current: its frames still read back exact. Without
/// that, GL would run these calls with no context (llvmpipe reads zeros).
#[test]
fn contexts_made_or_dropped_meanwhile_leave_the_receivers_current() {
    let ctx = vulkan(None);
    let other = HeadlessGl::new().expect("a headless GL context");
    let gl = HeadlessGl::on_device(ctx.identity().device_uuid).expect("a headless GL context");
    let (directory, dir, mut sender, scratch) = image_sender::<Rgba8Unorm>(&ctx, "current");
    let (session, setup) = connect(&directory, "gl", || sender.serve(Duration::from_millis(5)));
    // SAFETY: `gl` is current on this thread (made last); the calls below
    // keep it current (what this test checks); the receiver is dropped
    // before `gl`.
    let rx = unsafe { GlReceiver::new(gl.gl(), session, setup) }.expect("the slots import into GL");
    drop(other);
    let e = HeadlessGl::on_device(vk_export::DeviceUuid::from_bytes([0xcd; 16])).unwrap_err();
    assert!(matches!(e, Error::Mismatch(_)), "{e}");
    let start = Instant::now();
    let f = present(&mut sender, &scratch);
    let frame = next_frame(&rx, &mut sender, start, f);
    let pixels = rx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
    let row = (W * 4) as usize;
    assert!(
        (0..H).all(|y| demo::check_demo_row(&pixels[y as usize * row..][..row], f, y, H)),
        "frame {f} read back wrong: the receiver's context was not current"
    );
    rx.release(frame, Duration::from_secs(10)).unwrap();
    drop(rx);
    drop(gl);
    drop(sender);
    drop(scratch);
    std::fs::remove_dir_all(&dir).unwrap();
}
