//! The Python module `cuda_interop`: receive buffers a Vulkan producer in
//! another process shares over a Unix socket (the `vk-export` wire format),
//! import them into CUDA, and hand them to DLPack consumers (PyTorch, CuPy,
//! JAX) without copying.
//!
//! # Contract
//!
//! * `connect(socket_path, timeout, delivery="latest") -> Receiver` connects
//!   to a `vk_export::socket::Listener` (a `SOCK_SEQPACKET` Unix socket whose
//!   listening process runs as this user) and subscribes in `delivery`
//!   (`"latest"` or `"lossless"`, else `ValueError`; a producer of one buffer
//!   per message ignores it). A full backlog is waited on for at most
//!   `timeout` seconds. `connect_named(name, timeout, delivery="latest")`
//!   finds the sender by name (`cuda_interop_frames::discovery`, under
//!   `$XDG_RUNTIME_DIR`). Latest: each `next()` on a ring asks for the
//!   newest frame once (a request whose call timed out stays asked), hands
//!   out the newest of the frames queued and gives the older ones back
//!   unseen; `Receiver.dropped` counts the frames it did not get (gaps
//!   between received frame numbers, and those given back). Lossless:
//!   every frame, in order.
//! * `Receiver.next(timeout) -> Frame` waits at most `timeout` seconds, with
//!   the GIL released for the whole call. The producer's first message
//!   decides what it speaks:
//!   - **a frame ring** (`cuda_interop_frames::protocol`, served by the
//!     `frame_server` example of `cuda-interop-frames`):
//!     a hello packet and one setup message; the first call imports the
//!     ring's buffers (mapped once) and semaphores into CUDA, and every call
//!     returns the next frame: a `(height, width, 4)` `uint8` tensor with
//!     strides `(row_pitch, 4, 1)` elements, `tag` = the frame number.
//!   - **one buffer per message** (anything else): resource 0 must be a
//!     device-local buffer, handed out whole as a 1-D `uint8` tensor; the
//!     other resources are dropped (their fds closed).
//!
//!   The first frame creates one headless Vulkan context on the device whose
//!   `deviceUUID` the record names, and the CUDA device paired with it by
//!   UUID; records are verified on that Vulkan device before CUDA imports.
//! * `Frame.__dlpack__(stream=None, max_version=None, dl_device=None,
//!   copy=None)` hands the frame out once, on `(kDLCUDA, ordinal)`
//!   (`Frame.__dlpack_device__()`). With `max_version` of major 1 or more the
//!   capsule is a DLPack 1.0 `"dltensor_versioned"`, with `None` a legacy
//!   `"dltensor"`. The capsule's destructor calls the deleter only if no
//!   consumer took it (`"used_dltensor_versioned"` / `"used_dltensor"`), so
//!   what it keeps alive (a ring slot's mapping, or an import) is freed
//!   exactly once. **Stream ordering** (ring frames): the consumer's `stream`
//!   (a `CUstream` handle; `1` legacy default, `2` per-thread default, `None`
//!   the legacy default as the DLPack protocol says for CUDA, `-1` no
//!   ordering, `0` refused) waits on the GPU for the "produced" timeline at
//!   the frame's number before anything enqueued on it later. As DLPack
//!   has it, the consumer vouches that its handle is a live stream of the
//!   frame's device (asking the driver about a garbage pointer is itself
//!   undefined behaviour); a handle that cannot be a stream is refused with
//!   `ValueError` before any driver call, here and in `release`: negative
//!   ints other than `-1`, other ints below 4096, and addresses with nothing
//!   readable mapped (`process_vm_readv` on this process; skipped where a
//!   seccomp filter forbids it).
//! * `Frame.__cuda_array_interface__` (ring frames on CUDA): version 3,
//!   `data`, `shape`, `strides` in bytes, `typestr` `"|u1"`, and `stream`: a
//!   stream of this module on which the "produced" wait is enqueued, which
//!   the consumer must order its work after (CuPy does). It does not say the
//!   consumer's stream, so such a frame's release must name it (as after a
//!   bare handle, below). A frame has one consumer protocol: after
//!   `__dlpack__` the interface raises `BufferError`, and the other way
//!   round.
//! * `Frame.release(stream=None)` (and leaving `with frame:`) gives a ring
//!   slot back: with a CUDA stream (`-1` none) the slot's "released"
//!   timeline is signalled with the frame number after the work enqueued on
//!   it so far, and the producer's next write to the slot waits for it; then
//!   the release message is sent. Without a stream the caller's reads must
//!   have completed. The default is the stream given to `__dlpack__` where
//!   it can still be named: the legacy default (`None` or `1`) or a stream
//!   object, which the frame keeps a reference to until the release (so its
//!   stream lives; not so for an `ExternalStream`, whose owner destroys the
//!   stream). A bare handle is the consumer's to keep alive only during
//!   `__dlpack__`, and `2` (also as an object, CuPy's `Stream.ptds`) names
//!   the calling thread's stream, so neither is used again: `release()`
//!   then raises `ValueError` asking for the stream, and so does leaving
//!   `with frame:` (unless the block raised: its exception wins, and the
//!   frame is given back as a drop would). A release whose signal was
//!   enqueued but whose message failed can be retried (the signal is not
//!   repeated). Idempotent; a ring frame dropped unreleased is released the
//!   same way, with the GIL released (after a bare handle: without
//!   ordering, and a `RuntimeWarning`); if that release fails, the
//!   connection is given up (the producer takes the slots back) and the
//!   next call raises `ConnectionError` with the reason. A reference cycle
//!   through a frame and its stream object is not collected (the collector
//!   would run the stream's `__del__`, which destroys it, first). A frame is
//!   used by one thread at a time: a call while another thread's call on
//!   the same frame runs raises `RuntimeError` (nothing is released twice).
//!   Tensors handed out
//!   keep the memory mapped after a release, but its contents are the
//!   producer's again. Handing out after a release, or twice, raises
//!   `BufferError`. A consumer holding every slot stalls the producer (which
//!   drops it after its hold timeout): hold at most `slots - 1` frames.
//! * `Receiver.close()` (and leaving `with receiver:`) shuts the connection
//!   down: the producer takes back the slots this consumer held, so the
//!   releases of frames still out do nothing (no signal, no message, no
//!   error), and a frame received but not yet handed out when it closes is
//!   not handed out. `next()` on several threads at once is allowed: frames
//!   are accepted in the order they arrive, and each call keeps its own
//!   timeout while another receives; a release on one thread and `next()`
//!   on another do not race (the slot is free before its release is sent).
//!   A receiver, a frame and an unconsumed capsule let go of the GIL while
//!   their CUDA resources are torn down (bounded waits for the GPU); a
//!   capsule destroyed while the interpreter shuts down is freed in place.
//! * Errors carry the crates' messages: `TimeoutError` for a timeout,
//!   `ConnectionError` for socket errors and a peer that closed or was
//!   refused, `ValueError` for a malformed message, record or packet and for
//!   bad arguments, `RuntimeError` for CUDA and Vulkan errors (no CUDA
//!   driver, no matching device). No call waits without a bound (packet
//!   sends: the socket's 10 s send timeout).
//! * Built with the `test-hooks` feature (only `cargo xtask test` does, for
//!   pytest), the module also has `_host_frame(n)`, `_host_frames_alive()`,
//!   `_connect_host_ring(path, timeout, record_signals=False,
//!   accept_delay=0.0, delivery=None)` (ring frames over host memory,
//!   `kDLCPU`, no CUDA; a real producer's setup message is dropped; without
//!   `delivery` it never subscribes, as a protocol v1 receiver; with
//!   `record_signals` the frames take streams as CUDA frames do, and `_signals(receiver)` lists the "released" signals that would
//!   have been enqueued; `accept_delay` pauses between receiving a frame
//!   packet and accepting it) and `_interface_dict(frame)`, to test the protocols
//!   without a GPU. The wheel (`cargo xtask wheel`) has no such hooks.
//!
//! # Modules
//!
//! The protocol, the ring's import and which slots are held are
//! `cuda_interop_frames::consumer`'s; this crate is the Python face.
//! `errors` (exceptions) and `host` (test-hook host memory) use no other
//! module; `ring` uses `errors`; `frame` uses `errors`, `ring`, `host`;
//! `receiver` uses those and `frame`; `hooks` (test hooks) uses `frame`,
//! `host`, `receiver`. No module uses one that uses it.

use pyo3::prelude::*;

mod errors;
mod frame;
#[cfg(feature = "test-hooks")]
mod hooks;
#[cfg(feature = "test-hooks")]
mod host;
mod receiver;
mod ring;

/// The `cuda_interop` module.
#[pymodule(name = "cuda_interop")]
fn cuda_interop_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(receiver::connect, m)?)?;
    m.add_function(wrap_pyfunction!(receiver::connect_named, m)?)?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(hooks::_host_frame, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_host_frames_alive, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_connect_host_ring, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_signals, m)?)?;
        m.add_function(wrap_pyfunction!(hooks::_interface_dict, m)?)?;
    }
    m.add_class::<receiver::Receiver>()?;
    m.add_class::<frame::Frame>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", cuda_interop_frames::protocol::VERSION)?;
    Ok(())
}
