//! A Rust consumer of `frame_server`: the baseline for the Python consumers.
//! It imports the ring into CUDA once, then for each frame waits on the GPU
//! for the producer's "produced" value, copies five sampled rows (the first,
//! the band's first and last, the row after the band, the last) back, checks
//! every pixel of them against the frame number, and releases the slot with
//! a GPU signal of its "released" timeline.
//!
//! ```text
//! cargo run --release -p cuda-interop-frames --example frame_client -- [--socket PATH] [--frames 300] [--timeout 10]
//! ```
//!
//! Packets go through `cuda_interop_frames::consumer` (bounded reads and
//! sends); the ring is imported here with `ImportedBuffer::map`, whose
//! slices the row copies take.
//!
//! Prints the frames checked, the bad ones (the exit status is non-zero if
//! any) and the milliseconds per frame. Every wait is bounded by `--timeout`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop::{DeviceBuffer, Stream};
use cuda_interop_frames::consumer::{self, deadline_after};
use cuda_interop_frames::protocol::{self, Kind, Packet};
use vk_export::markers::DeviceLocal;
use vk_export::semaphore_kinds::Timeline;
use vk_export::socket::Connection;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(&args, &[], &["--socket", "--frames", "--timeout"], |_| {
        false
    });
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let socket = value("--socket").unwrap_or_else(|| "/tmp/cuda-interop-frames.sock".into());
    let frames: u64 = value("--frames")
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let timeout = Duration::from_secs_f64(
        value("--timeout")
            .and_then(|v| v.parse().ok())
            .unwrap_or(10.0),
    );
    match run(&socket, frames, timeout) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(bad) => {
            eprintln!("frame_client: {bad} bad frames");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("frame_client FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads one packet, waiting at most `timeout`.
fn read_packet(conn: &Connection, timeout: Duration) -> Res<Packet> {
    Ok(consumer::recv_packet(
        conn,
        deadline_after(timeout),
        timeout,
    )?)
}

fn run(socket: &str, frames: u64, timeout: Duration) -> Res<u64> {
    let conn = Connection::connect(socket)?;
    let hello = read_packet(&conn, timeout)?;
    if hello.kind != Kind::Hello {
        return Err(format!("expected a hello, got {:?}", hello.kind).into());
    }
    let n = hello.slot as usize;
    let mut setup = conn.recv(timeout)?;
    if consumer::check_setup(&hello, &setup).is_err() {
        return Err("the setup message is not a ring with semaphores (is the server running with --no-semaphores?)".into());
    }
    let first = setup.take_buffer::<DeviceLocal>(0)?;
    let cuda = consumer::cuda_device_for(first.record().info().device_uuid())?;
    let mut imports = vec![cuda
        .import_received_buffer(first)
        .map_err(|e| e.into_error())?];
    for i in 1..n {
        let buffer = setup.take_buffer::<DeviceLocal>(i)?;
        imports.push(
            cuda.import_received_buffer(buffer)
                .map_err(|e| e.into_error())?,
        );
    }
    let mut semaphore = |i: usize| -> Res<_> {
        let received = setup.take_semaphore::<Timeline>(i)?;
        Ok(cuda
            .import_received_semaphore(received)
            .map_err(|e| e.into_error())?)
    };
    let produced = semaphore(n)?;
    let released = (0..n)
        .map(|i| semaphore(n + 1 + i))
        .collect::<Res<Vec<_>>>()?;
    let maps = imports
        .iter_mut()
        .map(|b| b.map())
        .collect::<cuda_interop::Result<Vec<_>>>()?;
    let mut stream = Stream::new(&cuda)?;
    stream.set_timeout(timeout);
    let row = u64::from(hello.width) * 4;
    let mut rows: Vec<DeviceBuffer> = (0..5)
        .map(|_| DeviceBuffer::new(&cuda, row as usize))
        .collect::<cuda_interop::Result<_>>()?;
    let mut host = vec![0u8; row as usize];
    println!(
        "[frame_client] {} on CUDA device {}: {n} slots of {}x{}, row pitch {}",
        cuda.name(),
        cuda.ordinal(),
        hello.width,
        hello.height,
        hello.row_pitch
    );

    let mut bad = 0u64;
    let mut start = None;
    for i in 0..frames {
        let packet = read_packet(&conn, timeout)?;
        if packet.kind != Kind::Frame || packet.slot as usize >= n {
            return Err(format!("unexpected packet {packet:?}").into());
        }
        // Timing starts after the first frame (ring import and warm-up).
        if i == 1 {
            start = Some(Instant::now());
        }
        let (slot, f) = (packet.slot as usize, packet.frame);
        produced.wait(&stream, f)?;
        let (band_start, band_end) = protocol::band_rows(f, hello.height);
        let last = hello.height - 1;
        let sampled = [0, band_start, band_end - 1, band_end.min(last), last];
        for (dst, &y) in rows.iter_mut().zip(&sampled) {
            let slice = maps[slot].slice(u64::from(y) * hello.row_pitch, row)?;
            stream.copy_device(&slice, dst)?;
        }
        let mut ok = true;
        for (src, &y) in rows.iter().zip(&sampled) {
            stream.copy_to_host(src, &mut host)?;
            let want = if (band_start..band_end).contains(&y) {
                protocol::band_value(f)
            } else {
                protocol::background(f)
            };
            ok &= host
                .chunks_exact(4)
                .all(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]) == want);
        }
        if !ok {
            bad += 1;
            if bad <= 5 {
                eprintln!("[frame_client] frame {f} (slot {slot}) is wrong");
            }
        }
        released[slot].signal(&stream, f)?;
        consumer::send_packet(&conn, &Packet::release(packet.slot, f, true))?;
    }
    stream.synchronize(timeout)?;
    if let Some(start) = start.filter(|_| frames > 1) {
        let ms = start.elapsed().as_secs_f64() * 1e3 / (frames - 1) as f64;
        println!("[frame_client] {frames} frames, {bad} bad, {ms:.3} ms/frame (sampled rows copied back and checked)");
    }
    Ok(bad)
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: frame_client [--socket PATH] [--frames 300] [--timeout 10]";

/// Answers `-h`/`--help` with [`USAGE`] (exit 0) and refuses, with it
/// (exit 2), an argument that is none of `flags`, not the value after one of
/// `valued`, and not a positional argument `positional` accepts: a misspelt
/// flag is an error, never silently ignored.
fn check_args(args: &[String], flags: &[&str], valued: &[&str], positional: fn(&str) -> bool) {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.as_str();
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if valued.contains(&arg) {
            rest.next();
        } else if !flags.contains(&arg) && (arg.starts_with('-') || !positional(arg)) {
            eprintln!("unknown argument {arg:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
