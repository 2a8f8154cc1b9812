//! Async waits on one tokio runtime (feature `tokio`): a listener accepts a
//! connection and receives an exported buffer with its fd
//! (`accept_async`, `recv_async`), a Vulkan timeline value is awaited while
//! another thread signals it (`wait_async`), and, where a CUDA driver and a
//! matching GPU are present, a kernel's completion is awaited
//! (`Completion::wait_async`). Each wait is bounded; a second receive shows
//! a timeout as a typed error.
//!
//! ```text
//! cargo run -p cuda-interop --features tokio --example async_wait [-- --help]
//! ```
//!
//! On a machine without CUDA (lavapipe in CI) it runs the socket and timeline
//! parts and says that the CUDA part did not run, and why.

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_interop::{kernels, CudaDevice, Module, Stream};
use vk_export::markers::HostVisible;
use vk_export::socket::{Connection, Listener};
use vk_export::{Context, ExportableBuffer, HeadlessOptions, TimelineSemaphore};

const USAGE: &str = "usage: async_wait [--help]

Awaits a socket accept and receive, a Vulkan timeline value and (with CUDA) a
kernel's completion on one tokio runtime, each bounded.";

const BOUND: Duration = Duration::from_secs(10);

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("async_wait: unknown argument {other:?}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("async_wait FAILED: no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_wait FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Res<()> {
    let ctx = Context::headless(&HeadlessOptions::default())?;
    println!("Vulkan device: {}", ctx.identity().name);
    socket(&ctx).await?;
    timeline(&ctx).await?;
    match CudaDevice::for_vulkan(&ctx) {
        Ok(cuda) => completion(&cuda).await?,
        Err(e) => println!("CUDA part NOT RUN: {e}"),
    }
    Ok(())
}

/// Accept and receive, as futures: another thread connects and sends an
/// exported buffer; then a receive with nothing coming times out, typed.
async fn socket(ctx: &Context) -> Res<()> {
    let dir = std::env::temp_dir().join(format!("async-wait-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let listener = Listener::bind(dir.join("socket"))?;
    let buffer = ExportableBuffer::<HostVisible>::new(ctx, 1 << 20)?;
    let path = listener.path().to_path_buf();
    let start = Instant::now();
    // The sender keeps its end (and the buffer) until it is joined.
    let sender = std::thread::spawn(move || -> vk_export::Result<_> {
        let connection = Connection::connect(&path)?;
        connection.send_exported(7, &[&buffer])?;
        Ok((connection, buffer))
    });
    let connection = listener.accept_async(BOUND).await?;
    let mut received = connection.recv_async(BOUND).await?;
    let imported = ExportableBuffer::import_received(ctx, received.take_buffer::<HostVisible>(0)?)
        .map_err(|e| e.error)?;
    println!(
        "socket: accepted and received message {} (a {} byte buffer with its fd, imported) in {:?}",
        received.message().tag,
        imported.size(),
        start.elapsed()
    );
    let bound = Duration::from_millis(50);
    match connection.recv_async(bound).await {
        Err(vk_export::Error::Timeout(after)) => {
            println!("socket: a receive with nothing coming: Error::Timeout({after:?})")
        }
        other => return Err(format!("expected a timeout, got {other:?}").into()),
    }
    drop(sender.join().expect("the sending thread")?);
    drop(listener);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A timeline value, awaited while another thread signals it.
async fn timeline(ctx: &Context) -> Res<()> {
    // Exportable where the driver can (NVIDIA), local otherwise (lavapipe):
    // the wait is the same.
    let timeline = Arc::new(match TimelineSemaphore::new(ctx) {
        Ok(exportable) => exportable,
        Err(_) => TimelineSemaphore::new_local(ctx)?,
    });
    let start = Instant::now();
    let signaller = {
        let timeline = Arc::clone(&timeline);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            timeline.signal(1)
        })
    };
    timeline.wait_async(1, BOUND).await?;
    signaller.join().expect("the signalling thread")?;
    println!(
        "timeline: value {} reached, awaited for {:?}",
        timeline.value()?,
        start.elapsed()
    );
    Ok(())
}

/// A kernel's completion as a future.
async fn completion(cuda: &CudaDevice) -> Res<()> {
    let module = Module::load_ptx(cuda, kernels::PTX)?;
    let spin = module.function("spin_ns")?;
    let stream = Stream::new(cuda)?;
    let (mut ns, mut out) = (20_000_000u64, 0u64);
    let mut args: [*mut c_void; 2] = [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
    let start = Instant::now();
    // SAFETY: spin_ns(u64 ns, u64 out) with out = 0 touches no memory.
    unsafe { stream.launch(&spin, [1, 1, 1], [1, 1, 1], 0, &mut args) }?;
    stream.completion()?.wait_async(BOUND).await?;
    println!(
        "CUDA: a 20 ms kernel's completion awaited, ready after {:?}",
        start.elapsed()
    );
    Ok(())
}
