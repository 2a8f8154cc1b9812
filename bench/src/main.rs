//! The performance suite (issue 11; the scenarios of INTEROP-RULES B.3).
//!
//! ```text
//! bench [--quick] [--vulkan-only] [--s9-only] [--json PATH]
//! bench --drift-only [--cycles N] [--json PATH]
//! ```
//!
//! `--vulkan-only` runs only what needs no CUDA (as on a machine without
//! it): the Vulkan drift cycle and the producer variants' Vulkan half.
//!
//! Every figure is printed with its baseline from the same run:
//!
//! * **S1** one-time costs: export, import, map (one level and a full mip
//!   chain), semaphore export and import, destroy; the first call and the
//!   median of later ones.
//! * **S2** hand-off latency: Vulkan signals, CUDA waits, a trivial kernel,
//!   CUDA signals, the host sees it; against the CUDA-only floor (kernel,
//!   event record, event query until done, on one stream).
//!   S2 also runs with the two producers of issue 19 (`src/producer.rs`):
//!   a signal-only submit on the transfer queue, then a 256x256 frame of
//!   the copy producer (transfer queue) and of the render producer (main
//!   queue) before the CUDA side, and each producer alone.
//! * **S3** frame throughput at 1080p, 4K, 8K (RGBA8, RGBA16F), the render
//!   producer (clear + release on the main queue, own command buffers), and
//!   at 1080p and 4K RGBA8 the copy producer (a buffer-to-image copy +
//!   release on the transfer queue); CUDA waits and copies the frame into
//!   pitched linear memory, signals back; 1 and 3 frames in flight. Against
//!   the producer alone (so the hand-off cost is the difference) and host
//!   staging through pinned memory; and the same loop written with raw
//!   driver calls in C (`src/frame_loop.c`). The render producer's
//!   per-frame overhead is set against S8's two switches, also with batches
//!   of 3 and 6 frames per submit (CUDA waits and signals once a batch).
//! * **S4** kernel read cost by layout: the same 4K RGBA8 frame read (and
//!   written to linear memory) from cudaMalloc memory, a mapped Vulkan
//!   buffer, a mapped Vulkan image through a surface, and a native CUDA
//!   array through a surface.
//! * **S6** semaphore batching: 1, 4 and 16 timeline signals and waits per
//!   frame, one crate call each and one safe batch call
//!   (`Stream::signal_semaphores` / `wait_semaphores`), against one batched
//!   raw call.
//!
//! * **S7** the S3 hand-off at 4K RGBA8 with the producer in another
//!   process (this binary, `--s7-producer`), against S3's same-process rows.
//! * **S8** the graphics-engine switch between the Vulkan and CUDA contexts
//!   (issue 19): on every queue family, both directions, each leg against a
//!   CUDA-only floor, with `CUDA_DEVICE_MAX_CONNECTIONS` unset and `=1`
//!   (child processes of this binary, `--s8-child`; run first).
//! * **S9** (issue 30) the frame ring's hand-off against its CUDA-only
//!   peer, a ring of `cuMemAlloc` slots shared with CUDA IPC memory and
//!   event handles and the same 48-byte packets (`src/ipc_ring.rs`), with
//!   1 and 4 receiving processes, without and with CUDA MPS (a private
//!   daemon), and the latency by step (`src/s9.rs`; all in child
//!   processes of this binary, run right after S8). `bench --s9-only
//!   [--quick] [--json PATH]` runs it alone.
//! * **Drift** per-cycle cost of the Vulkan export/import cycle (also on
//!   lavapipe) and of the CUDA import cycle, the last 10% of the cycles
//!   against the first 10% (goal <= 1.2x), with each tenth's profile.
//!   `bench --drift-only [--cycles N]` runs the two cycles alone, 50,000
//!   times each by default (issue 30 item 6: growth or noise).
//!
//! S5 (array <-> linear copies) is this package's `array_copy` binary
//! (`src/bin/array_copy.rs`); how soon and at what CPU cost the host learns
//! that GPU work ended are its `host_wait` and `wait_mechanisms` binaries.
//!
//! Needs an NVIDIA GPU whose Vulkan driver offers device-local exportable
//! memory; elsewhere it runs what it can (the Vulkan drift cycle, the
//! producer variants' Vulkan half, untimed: `src/variants.rs`), says what
//! it skipped and why, and exits 0. Run it without the validation
//! layer: it measures.

mod common;
mod drift;
mod engine_switch;
mod frame_ring;
mod ipc_ring;
mod mps;
mod producer;
mod report;
mod s9;
mod s9_wire;
mod scenarios;
mod two_process;
mod variants;

use std::process::ExitCode;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;
/// A child process's entry point.
type ChildMain = fn() -> Res<()>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--s7-producer") {
        return match two_process::producer_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench S7 producer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // S9's child processes (src/s9.rs).
    let s9_child: Option<(&str, ChildMain)> = match args.first().map(String::as_str) {
        Some(ipc_ring::PRODUCER_FLAG) => Some(("S9 IPC producer", ipc_ring::producer_main)),
        Some(ipc_ring::CONSUMER_FLAG) => Some(("S9 IPC consumer", ipc_ring::consumer_main)),
        Some(frame_ring::SENDER_FLAG) => Some(("S9 frame sender", frame_ring::sender_main)),
        Some(frame_ring::RECEIVER_FLAG) => Some(("S9 frame receiver", frame_ring::receiver_main)),
        _ => None,
    };
    if let Some((what, child_main)) = s9_child {
        return match child_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench {what} (pid {}): {e}", std::process::id());
                ExitCode::FAILURE
            }
        };
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.first().map(String::as_str) == Some(engine_switch::CHILD_FLAG) {
        return match engine_switch::child_main(quick) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench S8 child: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let vulkan_only = args.iter().any(|a| a == "--vulkan-only");
    let s9_only = args.iter().any(|a| a == "--s9-only");
    let drift_only = args.iter().any(|a| a == "--drift-only");
    let cycles = match args.iter().position(|a| a == "--cycles") {
        None => 50_000,
        Some(i) => match args.get(i + 1).and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n >= 100 => n,
            _ => {
                eprintln!("bench: --cycles takes a number of cycles, at least 100");
                return ExitCode::FAILURE;
            }
        },
    };
    let run = if s9_only {
        scenarios::run_s9_only(quick, json.as_deref())
    } else if drift_only {
        scenarios::run_drift_only(cycles, json.as_deref())
    } else {
        scenarios::run(quick, vulkan_only, json.as_deref())
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}
