//! S7: the S3 hand-off at 4K RGBA8 between two processes.
//!
//! The producer is this binary started again with `--s7-producer`; it gets
//! one end of a socket pair (its number in `BENCH_S7_FD`), creates the three
//! slot images and the two timelines and sends them with `send_exported`.
//! Control words (u64, little-endian) travel on a second socket pair
//! (`BENCH_S7_CONTROL_FD`; the crate's wire format carries resources, not
//! bare words): for each run word (`frames << 8 | in_flight`) it runs the
//! same Vulkan loop as S3 and answers 1 once its last frame was consumed.
//! Word 0 ends it. The consumer (this process) imports what it
//! received through the checked receive path and runs the CUDA side of S3.
//! Every receive has a timeout; the child is killed if it outlives the run.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cuda_interop::{CopyEngine, CudaDevice, Event, PitchedMut, Stream};
use vk_export::ash::vk;
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::semaphore_kinds::Timeline;
use vk_export::socket::Connection;
use vk_export::{Context, HeadlessOptions, ImageDesc, TimelineSemaphore};

use crate::common::{Img, SPIN, WAIT_LIMIT};
use crate::producer::{After, Producer, Variant};
use crate::report::Report;
use crate::Res;

const ENV: &str = "BENCH_S7_FD";
const CONTROL_ENV: &str = "BENCH_S7_CONTROL_FD";

/// Sends one control word.
fn send_word(control: &mut UnixStream, word: u64) -> Res<()> {
    control.write_all(&word.to_le_bytes())?;
    Ok(())
}

/// Receives one control word (bounded by the stream's read timeout).
fn recv_word(control: &mut UnixStream) -> Res<u64> {
    let mut bytes = [0u8; 8];
    control.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}
const SLOTS: usize = 3;
const WIDTH: u32 = 3840;
const HEIGHT: u32 = 2160;
const RECV: Duration = Duration::from_secs(20);

/// The producer process's main.
pub fn producer_main() -> Res<()> {
    let fd: i32 = std::env::var(ENV)?.parse()?;
    // SAFETY: the parent passed this connected socket's number, inherited
    // open by this process; nothing else here owns it.
    let socket = Connection::from_fd(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })?;
    let control_fd: i32 = std::env::var(CONTROL_ENV)?.parse()?;
    // SAFETY: as above, the control socket's number, inherited open.
    let mut control = unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(control_fd) };
    control.set_read_timeout(Some(RECV))?;
    let ctx = Context::headless(&HeadlessOptions::default())?;
    let images = (0..SLOTS)
        .map(|_| Img::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(WIDTH, HEIGHT)))
        .collect::<Result<Vec<_>, _>>()?;
    let produced = TimelineSemaphore::new(&ctx)?;
    let consumed = TimelineSemaphore::new(&ctx)?;
    socket.send_exported(
        0,
        &[&images[0], &images[1], &images[2], &produced, &consumed],
    )?;
    let extent = vk::Extent2D {
        width: WIDTH,
        height: HEIGHT,
    };
    let raw: Vec<_> = images.iter().map(|i| (i.raw(), extent)).collect();
    let release: Vec<_> = (0..SLOTS).map(|_| After::Release).collect();
    let mut producer = Producer::new(
        &ctx,
        Variant::Render,
        4,
        &raw,
        &release,
        Some(consumed.raw()),
        produced.raw(),
    )?;
    let mut n = 0u64;
    loop {
        let tag = recv_word(&mut control)?;
        if tag == 0 {
            return Ok(());
        }
        let (frames, in_flight) = (tag >> 8, tag & 0xff);
        for _ in 0..frames {
            if n + 1 > in_flight {
                consumed.wait(n + 1 - in_flight, WAIT_LIMIT, SPIN)?;
            }
            producer.submit(
                (n % SLOTS as u64) as usize,
                (n + 1).saturating_sub(SLOTS as u64),
                n + 1,
            )?;
            n += 1;
        }
        consumed.wait(n, WAIT_LIMIT, SPIN)?;
        send_word(&mut control, 1)?;
    }
}

/// Kills the child if it is still there when the run ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The consumer side, measured against S3's same-process rows of this run.
pub fn s7(cuda: &CudaDevice, report: &mut Report, frames: u32) -> Res<()> {
    let (mine, theirs) = Connection::pair()?;
    let theirs = theirs.into_fd();
    let (mut control, control_theirs) = UnixStream::pair()?;
    control.set_read_timeout(Some(RECV))?;
    for fd in [theirs.as_raw_fd(), control_theirs.as_raw_fd()] {
        // SAFETY: clears FD_CLOEXEC on an fd this function owns, so the
        // child inherits it; no other thread relies on that flag.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err("fcntl(F_SETFD) on the child's socket failed".into());
        }
    }
    let child = Command::new(std::env::current_exe()?)
        .arg("--s7-producer")
        .env(ENV, theirs.as_raw_fd().to_string())
        .env(CONTROL_ENV, control_theirs.as_raw_fd().to_string())
        .spawn()?;
    let _child = Reaped(child);
    drop(theirs);
    drop(control_theirs);

    let mut received = mine.recv(RECV)?;
    let received_images = (0..SLOTS)
        .map(|i| received.take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(i))
        .collect::<Result<Vec<_>, _>>()?;
    let produced = received.take_semaphore::<Timeline>(SLOTS)?;
    let consumed = received.take_semaphore::<Timeline>(SLOTS + 1)?;
    let imports = received_images
        .into_iter()
        .map(|r| cuda.import_received_image(r).map_err(|e| e.error))
        .collect::<Result<Vec<_>, _>>()?;
    let cu_produced = cuda
        .import_received_semaphore(produced)
        .map_err(|e| e.error)?;
    let cu_consumed = cuda
        .import_received_semaphore(consumed)
        .map_err(|e| e.error)?;
    let arrays = imports
        .iter()
        .map(|i| i.map_array())
        .collect::<Result<Vec<_>, _>>()?;
    let levels = arrays
        .iter()
        .map(|a| a.level(0))
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = (WIDTH * HEIGHT * 4) as usize;
    let mut dsts = (0..SLOTS)
        .map(|_| cuda_interop::DeviceBuffer::new(cuda, bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let stream = Stream::new(cuda)?;
    let events = (0..4)
        .map(|_| Event::new(cuda))
        .collect::<Result<Vec<_>, _>>()?;
    let mut n = 0u64;
    for in_flight in [1u64, 3] {
        let mut run = |count: u32| -> Res<Duration> {
            send_word(&mut control, (u64::from(count) << 8) | in_flight)?;
            let start = Instant::now();
            for _ in 0..count {
                // At most `in_flight` frames enqueued ahead of the GPU.
                if n >= in_flight {
                    events[((n - in_flight) % 4) as usize].synchronize(WAIT_LIMIT)?;
                }
                let s = (n % SLOTS as u64) as usize;
                cu_produced.wait(&stream, n + 1)?;
                levels[s].enqueue_copy_to_with(
                    &stream,
                    PitchedMut::buffer(&mut dsts[s]),
                    CopyEngine::Kernel,
                )?;
                cu_consumed.signal(&stream, n + 1)?;
                stream.record(&events[(n % 4) as usize])?;
                n += 1;
            }
            let done = recv_word(&mut control)?;
            if done != 1 {
                return Err(format!("the producer answered {done}, not 1").into());
            }
            Ok(start.elapsed())
        };
        run(10)?;
        let t = run(frames)?;
        let per_frame = t.as_secs_f64() * 1e3 / f64::from(frames);
        let same =
            format!("4K RGBA8, {in_flight} in flight: zero-copy through the safe API, per frame");
        let baseline = report
            .rows
            .iter()
            .find(|r| r.scenario == "S3" && r.case == same)
            .map(|r| r.value);
        let case =
            format!("4K RGBA8, {in_flight} in flight: producer in another process, per frame");
        match baseline {
            Some(b) => report.add_vs("S7", case, per_frame, "ms", ("same process (S3)", b)),
            None => report.add("S7", case, per_frame, "ms"),
        }
    }
    send_word(&mut control, 0)?;
    stream.synchronize(WAIT_LIMIT)?;
    Ok(())
}
