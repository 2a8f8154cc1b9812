//! S9's frame ring: the same ring as the CUDA IPC peer (`ipc_ring`: 4 slots
//! of 1080p RGBA8, lossless, every receiver gets every frame) served by
//! `cuda_interop_frames`' sender to `CudaReceiver`s, with a timestamp at
//! each step the application can see.
//!
//! # Contract
//!
//! * The sender is a child process of the bench ([`SENDER_FLAG`]): a
//!   headless Vulkan context, a `Sender` of device-local buffers with
//!   timelines on the transfer queue, at the socket path in [`SOCKET_ENV`];
//!   it waits (bounded) for [`RECEIVERS_ENV`] receivers, then presents
//!   frames (a `vkCmdFillBuffer` of the whole slot) until every receiver
//!   has left, and prints one `s9_wire::SentLine` per frame: present called
//!   (the frame's timestamp) and present returned (its GPU work done,
//!   "produced" signalled and the packet sent: inside the library, one
//!   step). Its `present` blocks in `vkWaitForFences` (the default), or
//!   polls the fence where [`POLL_ENV`] is set.
//! * Each receiver is a child process ([`RECEIVER_FLAG`]): it connects
//!   lossless, and per frame records when `next` returned the frame
//!   (packet received) and when `wait_on` and a stream synchronisation
//!   returned (CUDA waited: the hand-off `frame_client --no-check` times),
//!   then releases it with a GPU signal (`release_after`). It prints one
//!   `s9_wire::FrameLine` per frame after the last.
//! * Every wait is bounded ([`TIMEOUT`]); a sender without exported
//!   semaphores (no CUDA receivers possible) is an error that says so.

use std::time::{Duration, Instant};

use cuda_interop::Stream;
use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{monotonic_ns, AcquireError, Address, Sender, SenderOptions};
use vk_export::markers::DeviceLocal;
use vk_export::{Context, HeadlessOptions, QueueRole, WaitStrategy};

use crate::ipc_ring::{HEIGHT, SLOTS, WIDTH};
use crate::s9_wire::{FrameLine, SentLine};
use crate::Res;

pub(crate) const SENDER_FLAG: &str = "--s9-frame-sender";
pub(crate) const RECEIVER_FLAG: &str = "--s9-frame-receiver";
pub(crate) const SOCKET_ENV: &str = "BENCH_S9_SOCKET";
pub(crate) const RECEIVERS_ENV: &str = "BENCH_S9_RECEIVERS";
/// Set (to anything) for a sender whose `present` polls its fence
/// (`WaitStrategy::ADAPTIVE`) instead of blocking in `vkWaitForFences`.
pub(crate) const POLL_ENV: &str = "BENCH_S9_POLL_FENCE";
const TIMEOUT: Duration = Duration::from_secs(20);
/// The longest a sender runs.
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The sender process's main.
pub(crate) fn sender_main() -> Res<()> {
    let socket = std::env::var(SOCKET_ENV)?;
    let receivers: usize = std::env::var(RECEIVERS_ENV)?.parse()?;
    let ctx = Context::headless(&HeadlessOptions::default())?;
    let host_wait = match std::env::var_os(POLL_ENV) {
        Some(_) => WaitStrategy::ADAPTIVE,
        None => WaitStrategy::Block,
    };
    let opts = SenderOptions {
        queue: QueueRole::Transfer,
        host_wait,
        ..SenderOptions::for_context(
            &ctx,
            Address::Path(socket.into()),
            WIDTH,
            HEIGHT,
            SLOTS as u32,
        )
    };
    if !opts.semaphores {
        return Err(format!(
            "{} exports no semaphores: CUDA receivers cannot take its ring",
            ctx.identity().name
        )
        .into());
    }
    let mut sender = Sender::<DeviceLocal>::new(&ctx, opts)?;
    if !sender.wait_for_receivers(receivers, TIMEOUT) {
        return Err(format!("{receivers} receivers did not subscribe within {TIMEOUT:?}").into());
    }
    let size = sender.buffers()[0].size();
    let start = Instant::now();
    let mut sent = Vec::new();
    while sender.stats().receivers > 0 {
        if start.elapsed() > RUN_LIMIT {
            return Err(format!("the receivers were still there after {RUN_LIMIT:?}").into());
        }
        let slot = match sender.acquire(Duration::from_millis(100)) {
            Ok(slot) => slot,
            Err(AcquireError::AllSlotsHeld | AcquireError::Timeout(_)) => continue,
        };
        let sequence = slot.sequence();
        let called = monotonic_ns();
        slot.present_with(called, |device, cmd, buffer| {
            // SAFETY: the sender's recording command buffer and its slot's
            // buffer of `size` bytes with transfer usage, kept alive past
            // the submission (present_with waits for it).
            unsafe { device.cmd_fill_buffer(cmd, buffer, 0, size & !3, sequence as u32) }
        })?;
        sent.push(SentLine {
            sequence,
            called,
            returned: monotonic_ns(),
        });
    }
    let mut out = String::with_capacity(sent.len() * 40);
    for l in &sent {
        out.push_str(&l.line());
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// A receiver process's main.
pub(crate) fn receiver_main() -> Res<()> {
    let socket = std::env::var(SOCKET_ENV)?;
    let frames: u64 = std::env::var(crate::ipc_ring::FRAMES_ENV)?.parse()?;
    let rx = CudaReceiver::connect(&socket, Delivery::Lossless, TIMEOUT)?;
    let mut stream = Stream::new(rx.cuda())?;
    stream.set_timeout(TIMEOUT);
    let mut lines = Vec::with_capacity(frames as usize);
    for _ in 0..frames {
        let frame = rx.next(TIMEOUT)?;
        let received = monotonic_ns();
        rx.wait_on(&frame, &stream)?;
        stream.synchronize(TIMEOUT)?;
        let waited = monotonic_ns();
        lines.push(FrameLine {
            sequence: frame.sequence(),
            called: frame.timestamp_ns(),
            gpu_done: 0,
            sent: 0,
            received,
            waited,
        });
        rx.release_after(frame, &stream)?;
    }
    stream.synchronize(TIMEOUT)?;
    let mut out = String::with_capacity(lines.len() * 64);
    for l in &lines {
        out.push_str(&l.line());
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}
