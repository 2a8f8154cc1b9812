//! Benchmark: how fast does a host thread see a value that a CUDA stream
//! signals on a Vulkan timeline semaphore?
//!
//! Each iteration enqueues a short kernel and a timeline signal on a CUDA
//! stream, then waits on the host. Measured in the same run:
//! * baseline: `Stream::synchronize`, CUDA's own view of the same work (it
//!   polls `cuStreamQuery`: spin, yield, then short sleeps);
//! * `WaitStrategy::Block`: `vkWaitSemaphores`;
//! * `WaitStrategy::ADAPTIVE`: spin, yield, then poll `vkGetSemaphoreCounterValue`.
//!
//! ```text
//! cargo run --release -p cuda-interop --example host_wait -- [ITERATIONS]
//! ```

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cuda_interop::{kernels, CudaDevice, DeviceBuffer, Module, Stream};
use vk_export::{Context, HeadlessOptions, TimelineSemaphore, Validation, WaitStrategy};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let ctx = Context::headless(&HeadlessOptions {
        validation: Validation::Off, // measure the driver, not the layer
        ..Default::default()
    })?;
    let cuda = CudaDevice::for_vulkan(&ctx)?;
    println!(
        "{} / CUDA [{}] {}",
        ctx.identity().name,
        cuda.ordinal(),
        cuda.name()
    );
    let timeline = TimelineSemaphore::new(&ctx)?;
    let cuda_timeline = cuda.import_semaphore(&timeline)?;
    let module = Module::load_ptx(&cuda, kernels::PTX)?;
    let xor = module.function("xor_bytes")?;
    let stream = Stream::new(&cuda)?;
    let len = 1usize << 20;
    let buffer = DeviceBuffer::new(&cuda, len)?;
    let mut value = 0u64;

    let mut enqueue = || -> Res<u64> {
        let (mut ptr, mut n, mut key) = (buffer.device_ptr(), len as u64, 1u32);
        let mut args: [*mut c_void; 3] = [
            (&mut ptr as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut key as *mut u32).cast(),
        ];
        // SAFETY: xor_bytes(u64, u64, u32) over the buffer's `len` bytes.
        unsafe {
            stream.launch(
                &xor,
                [(len as u32).div_ceil(256), 1, 1],
                [256, 1, 1],
                0,
                &mut args,
            )
        }?;
        value += 1;
        cuda_timeline.signal(&stream, value)?;
        Ok(value)
    };

    let measure = |wait: &mut dyn FnMut(u64) -> Res<()>,
                   enqueue: &mut dyn FnMut() -> Res<u64>|
     -> Res<Vec<Duration>> {
        let mut t = Vec::with_capacity(iterations);
        for i in 0..iterations + 30 {
            let v = enqueue()?;
            let start = Instant::now();
            wait(v)?;
            if i >= 30 {
                t.push(start.elapsed());
            }
        }
        Ok(t)
    };

    let mut baseline = measure(
        &mut |_| Ok(stream.synchronize(stream.timeout())?),
        &mut enqueue,
    )?;
    let timeout = Duration::from_secs(10);
    let mut block = measure(
        &mut |v| Ok(timeline.wait(v, timeout, WaitStrategy::Block)?),
        &mut enqueue,
    )?;
    let mut poll = measure(
        &mut |v| Ok(timeline.wait(v, timeout, WaitStrategy::ADAPTIVE)?),
        &mut enqueue,
    )?;
    stream.synchronize(stream.timeout())?;

    let med = |t: &mut Vec<Duration>| {
        t.sort();
        t[t.len() / 2].as_secs_f64()
    };
    let (b0, b1, b2) = (med(&mut baseline), med(&mut block), med(&mut poll));
    println!("host wake-up after a CUDA signal, {iterations} iterations after 30 warm-up (1 MiB kernel + signal each):");
    for (name, t) in [
        ("Stream::synchronize (baseline)", &mut baseline),
        ("vkWaitSemaphores (Block)", &mut block),
        ("counter poll (ADAPTIVE)", &mut poll),
    ] {
        let q = |f: f64| t[((t.len() as f64 - 1.0) * f) as usize].as_secs_f64() * 1e6;
        println!(
            "  {name:32} p50 {:9.1} us  p90 {:9.1} us  p99 {:9.1} us",
            q(0.5),
            q(0.9),
            q(0.99)
        );
    }
    println!(
        "ratios (median): Block / baseline = {:.2}, ADAPTIVE / baseline = {:.2}, Block / ADAPTIVE = {:.1}",
        b1 / b0,
        b2 / b0,
        b1 / b2
    );
    Ok(())
}
